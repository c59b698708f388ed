// Who leads among the control planes on one PostgreSQL database
// (docs/design.md#several-control-planes-on-one-database). The leader holds a session-level advisory
// lock on a connection of its own, and on taking it raises the epoch in `tollgate_leader`, under both
// stores' write locks, so a former leader's transaction in flight ends first and every later one of
// it fails the fence (pg-locks.ts). The leader writes there the address it serves on; a standby reads
// it to name the leader in its refusals, and tries the lock again every `retryMs`. A leader whose lock
// connection ends is told at once (`onLost`): the lock went with it.
import pg from 'pg';
import { describeUrl, isRetriedConnectError } from './pg-db.js';
import { LEADER_LOCK, LEADER_TABLE_SQL, LOG_WRITE_LOCK, STATE_WRITE_LOCK } from './pg-locks.js';

export interface PgLeadershipOptions {
  log(line: string): void;
  /** How long a standby waits between two tries of the lock, and between connection attempts (ms). */
  retryMs: number;
}

export class PgLeadership {
  private client: pg.Client | null = null;
  private leading = false;
  private lostHandler: ((reason: string) => void) | null = null;
  private lostReason: string | null = null;
  private stopped = false;
  /** The leader's epoch once this control plane leads (0 before). */
  epoch = 0;
  /** The leader's address as last read (standby) or written (leader); '' when not known. */
  leaderAddress = '';
  /** The address this control plane serves on, once known: written with the epoch when it takes the lead. */
  ownAddress = '';

  constructor(
    private readonly url: string,
    private readonly opts: PgLeadershipOptions,
  ) {}

  /** Called once if the lead is lost (the lock connection ended or failed). */
  onLost(fn: (reason: string) => void): void {
    this.lostHandler = fn;
    // Lost before anyone listened (while the state was loading): told now.
    if (this.lostReason !== null) fn(this.lostReason);
  }

  private async connection(): Promise<pg.Client> {
    if (this.client) return this.client;
    const c = new pg.Client({ connectionString: this.url, application_name: 'tollgate-leader-lock', keepAlive: true });
    const gone = (why: string) => {
      if (this.client !== c) return;
      this.client = null;
      c.end().catch(() => undefined);
      if (this.leading && !this.stopped) {
        this.leading = false;
        this.lostReason = why;
        this.lostHandler?.(why);
      }
    };
    c.on('error', (err) => gone(`lock connection failed (${err.message})`));
    c.on('end', () => gone('lock connection ended'));
    try {
      await c.connect();
    } catch (err) {
      c.end().catch(() => undefined);
      throw err;
    }
    this.client = c;
    // The leader's row and fence, made under the state's write lock (two starting together make them once).
    await c.query('BEGIN');
    try {
      await c.query(`SELECT pg_advisory_xact_lock(${STATE_WRITE_LOCK})`);
      await c.query(LEADER_TABLE_SQL);
      await c.query('COMMIT');
    } catch (err) {
      await c.query('ROLLBACK').catch(() => undefined);
      throw err;
    }
    return c;
  }

  /** Tries the lock once; true when this control plane now leads (its epoch raised). */
  async tryLead(): Promise<boolean> {
    const c = await this.connection();
    const got = (await c.query<{ ok: boolean }>(`SELECT pg_try_advisory_lock(${LEADER_LOCK}) AS ok`)).rows[0].ok;
    if (!got) {
      this.leaderAddress = (await c.query<{ address: string }>('SELECT address FROM tollgate_leader WHERE id = 1')).rows[0]?.address ?? '';
      return false;
    }
    await c.query('BEGIN');
    try {
      // Both stores' write locks: a former leader's transaction still running ends before the epoch moves.
      await c.query(`SELECT pg_advisory_xact_lock(${STATE_WRITE_LOCK}), pg_advisory_xact_lock(${LOG_WRITE_LOCK})`);
      const r = await c.query<{ epoch: string }>('UPDATE tollgate_leader SET epoch = epoch + 1, address = $1, since = $2 WHERE id = 1 RETURNING epoch', [this.ownAddress, new Date().toISOString()]);
      await c.query('COMMIT');
      this.epoch = Number(r.rows[0].epoch);
    } catch (err) {
      await c.query('ROLLBACK').catch(() => undefined);
      await c.query(`SELECT pg_advisory_unlock(${LEADER_LOCK})`).catch(() => undefined);
      throw err;
    }
    this.leaderAddress = this.ownAddress;
    this.leading = true;
    return true;
  }

  /**
   * Tries the lock until this control plane leads (or `stop`): every `retryMs`, reading the leader's
   * address between tries for `onStandby`. A connection that fails is made again, with a logged line.
   */
  async waitToLead(onStandby: (leaderAddress: string) => void): Promise<boolean> {
    let logged = '';
    // A server not there yet is tried again as the stores do (250 ms doubling to 5 s); a refused login stops the start.
    let connectWait = 250;
    let failures = 0;
    while (!this.stopped) {
      let wait = this.opts.retryMs;
      try {
        const led = await this.tryLead();
        if (failures > 0) this.opts.log(`database: connected to ${describeUrl(this.url)} (leader lock) after ${failures} failed attempt(s)`);
        failures = 0;
        connectWait = 250;
        if (led) return true;
        onStandby(this.leaderAddress);
        if (logged !== this.leaderAddress) {
          logged = this.leaderAddress;
          this.opts.log(`standing by: another control plane leads${this.leaderAddress ? ` at ${this.leaderAddress}` : ''}; trying to take the lead every ${this.opts.retryMs} ms`);
        }
      } catch (err) {
        const e = err as Error & { code?: string };
        if (!isRetriedConnectError(e)) throw err;
        failures++;
        wait = connectWait;
        connectWait = Math.min(5_000, connectWait * 2);
        this.opts.log(`database: cannot reach ${describeUrl(this.url)} (${e.code ?? e.message}); trying again in ${wait} ms`);
      }
      await new Promise((resolve) => setTimeout(resolve, wait));
    }
    return false;
  }

  /** The leader writes the address it serves on (only while its epoch is the current one). */
  async advertise(address: string): Promise<void> {
    const c = await this.connection();
    await c.query('UPDATE tollgate_leader SET address = $1 WHERE id = 1 AND epoch = $2', [address, this.epoch]);
    this.leaderAddress = address;
  }

  /** Reads the current leader's address (a deposed leader names its successor). */
  async readLeaderAddress(): Promise<string> {
    const c = await this.connection();
    this.leaderAddress = (await c.query<{ address: string }>('SELECT address FROM tollgate_leader WHERE id = 1')).rows[0]?.address ?? '';
    return this.leaderAddress;
  }

  /** Ends the lock's connection (and so the lock): another control plane may lead at once. */
  async stop(): Promise<void> {
    this.stopped = true;
    const c = this.client;
    this.client = null;
    await c?.end().catch(() => undefined);
  }
}
