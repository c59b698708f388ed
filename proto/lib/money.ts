// Money is integer micro-dollars everywhere: 1 USD = 1_000_000 micros. Never floating point.
export const MICROS_PER_USD = 1_000_000;

/** Parses a decimal USD amount ("5", "5.00", "0.000001") exactly. Returns null for anything else. */
export function parseUsd(text: string): number | null {
  const m = /^(-?)(\d{1,12})(?:\.(\d{1,6}))?$/.exec(text.trim());
  if (!m) return null;
  const micros = Number(m[2]) * MICROS_PER_USD + Number((m[3] ?? '').padEnd(6, '0'));
  return m[1] === '-' ? -micros : micros;
}

/** Formats micros as USD with at least two decimals: 5000000 → "5.00", 1234567 → "1.234567". */
export function formatUsd(micros: number): string {
  const sign = micros < 0 ? '-' : '';
  const abs = Math.abs(micros);
  const whole = Math.floor(abs / MICROS_PER_USD);
  let frac = String(abs % MICROS_PER_USD).padStart(6, '0').replace(/0+$/, '');
  if (frac.length < 2) frac = frac.padEnd(2, '0');
  return `${sign}${whole}.${frac}`;
}

/** "YYYY-MM" of a UTC timestamp. */
export function monthOf(ms: number): string {
  return new Date(ms).toISOString().slice(0, 7);
}

/** Cost of a request: tokens × price per million tokens, rounded up to a whole micro. */
export function tokenCostMicros(promptTokens: number, completionTokens: number, inMicrosPerMtok: number, outMicrosPerMtok: number): number {
  return Math.ceil((promptTokens * inMicrosPerMtok + completionTokens * outMicrosPerMtok) / 1_000_000);
}
