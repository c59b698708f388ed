// Durations of the key-expiry flags: `45s`, `90m`, `12h`, `30d` → whole seconds; null when not understood.
const DURATION = /^(\d{1,7})([smhd])$/;
const UNIT_SEC: Record<string, number> = { s: 1, m: 60, h: 3_600, d: 86_400 };

export function parseDurationSec(text: string): number | null {
  const m = DURATION.exec(text.trim());
  if (!m) return null;
  const sec = Number(m[1]) * UNIT_SEC[m[2]];
  return sec > 0 && Number.isSafeInteger(sec) ? sec : null;
}

export const DURATION_HELP = 'a duration such as 45s, 90m, 12h or 30d';
