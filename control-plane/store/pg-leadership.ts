// Who leads among the control planes on one PostgreSQL database
// (docs/design.md#several-control-planes-on-one-database). The leader holds a session-level advisory
// lock on a connection of its own, and on taking it raises the epoch in `tollgate_leader`, under both
// stores' write locks, so a former leader's transaction in flight ends first and every later one of
// it fails the fence (pg-locks.ts). The leader writes there the address it serves on; a standby reads
// it to name the leader in its refusals, and tries the lock again every `retryMs`. A leader whose lock
// connection ends is told at once (`onLost`): the lock went with it.
import pg from 'pg';
import { describeUrl } from './pg-db.js';
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
  }

  private async connection(): Promise<pg.Client> {
    if (this.client) return this.client;
    const c = new pg.Client({ connectionString: this.url, application_name: 'tollgate-control-plane (leader lock)', keepAlive: true });
    const gone = (why: string) => {
      if (this.client !== c) return;
      this.client = null;
      c.end().catch(() => undefined);
      if (this.leading && !this.stopped) {
        this.leading = false;
        this.lostHandler?.(why);
      }
    };
    c.on('error', (err) => gone(`lock connection failed (${err.message})`));
    c.on('end', () => gone('lock connection ended'));
    await c.connect();
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
    while (!this.stopped) {
      try {
        if (await this.tryLead()) return true;
        onStandby(this.leaderAddress);
        if (logged !== this.leaderAddress) {
          logged = this.leaderAddress;
          this.opts.log(`standing by: another control plane leads${this.leaderAddress ? ` at ${this.leaderAddress}` : ''}; trying to take the lead every ${this.opts.retryMs} ms`);
        }
      } catch (err) {
        this.opts.log(`leader lock: cannot reach ${describeUrl(this.url)} (${(err as Error & { code?: string }).code ?? (err as Error).message}); trying again in ${this.opts.retryMs} ms`);
      }
      await new Promise((resolve) => setTimeout(resolve, this.opts.retryMs));
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
