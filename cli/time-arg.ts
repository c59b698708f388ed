// Time flags of the reading commands (`usage --since/--until`): an RFC 3339 timestamp
// (2025-01-31T12:00:00Z), a UTC date (2025-01-31, meaning its midnight), or a duration back from now
// (90m, 24h, 7d). Turned into the RFC 3339 string the console API takes; null when not understood.
const RFC3339 = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$/i;
const DATE = /^\d{4}-\d{2}-\d{2}$/;
const AGO = /^(\d{1,6})([smhd])$/;
const UNIT_MS: Record<string, number> = { s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

export function parseTimeArg(text: string, nowMs: number): string | null {
  const t = text.trim();
  let ms = NaN;
  if (RFC3339.test(t)) ms = Date.parse(t);
  else if (DATE.test(t)) {
    ms = Date.parse(`${t}T00:00:00Z`);
    // Date.parse rolls 2025-02-30 over to March: refuse dates that do not exist.
    if (Number.isFinite(ms) && new Date(ms).toISOString().slice(0, 10) !== t) ms = NaN;
  } else {
    const m = AGO.exec(t);
    if (m) ms = nowMs - Number(m[1]) * UNIT_MS[m[2]];
  }
  return Number.isFinite(ms) ? new Date(ms).toISOString() : null;
}

export const TIME_ARG_HELP = 'RFC 3339 (2025-01-31T12:00:00Z), a UTC date (2025-01-31) or a duration back from now (90m, 24h, 7d)';
