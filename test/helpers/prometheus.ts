// A strict parser of the Prometheus text exposition format (version 0.0.4), for tests that scrape
// /metrics: it rejects what a Prometheus server would reject (unknown line shapes, bad label syntax,
// values that are not numbers, samples of an undeclared family, histograms whose buckets are not
// cumulative or whose +Inf bucket differs from _count), and answers lookups by name and labels.

export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

export interface Family {
  name: string;
  type: 'counter' | 'gauge' | 'histogram' | 'summary' | 'untyped';
  help: string;
  samples: Sample[];
}

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/;

function parseValue(text: string, line: string): number {
  if (text === '+Inf') return Infinity;
  if (text === '-Inf') return -Infinity;
  if (text === 'NaN') return NaN;
  if (!/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(text)) throw new Error(`not a number ${JSON.stringify(text)} in ${JSON.stringify(line)}`);
  return Number(text);
}

/** Parses `{a="x",b="y\"z"}` starting at `i` (the `{`); returns the labels and the index after `}`. */
function parseLabels(line: string, i: number): [Record<string, string>, number] {
  const labels: Record<string, string> = {};
  i++;
  for (;;) {
    if (line[i] === '}') return [labels, i + 1];
    const eq = line.indexOf('=', i);
    if (eq === -1) throw new Error(`bad labels in ${JSON.stringify(line)}`);
    const name = line.slice(i, eq).trim();
    if (!LABEL_NAME.test(name)) throw new Error(`bad label name ${JSON.stringify(name)} in ${JSON.stringify(line)}`);
    if (line[eq + 1] !== '"') throw new Error(`label value not quoted in ${JSON.stringify(line)}`);
    let j = eq + 2;
    let value = '';
    for (;;) {
      const ch = line[j];
      if (ch === undefined) throw new Error(`unterminated label value in ${JSON.stringify(line)}`);
      if (ch === '"') break;
      if (ch === '\\') {
        const next = line[j + 1];
        if (next === 'n') value += '\n';
        else if (next === '\\' || next === '"') value += next;
        else throw new Error(`bad escape in ${JSON.stringify(line)}`);
        j += 2;
        continue;
      }
      value += ch;
      j++;
    }
    if (name in labels) throw new Error(`label ${name} twice in ${JSON.stringify(line)}`);
    labels[name] = value;
    i = j + 1;
    if (line[i] === ',') i++;
    else if (line[i] !== '}') throw new Error(`expected , or } in ${JSON.stringify(line)}`);
  }
}

function familyOfSample(families: Map<string, Family>, name: string): Family | undefined {
  const direct = families.get(name);
  if (direct) return direct;
  for (const suffix of ['_bucket', '_sum', '_count']) {
    if (name.endsWith(suffix)) {
      const f = families.get(name.slice(0, -suffix.length));
      if (f && (f.type === 'histogram' || f.type === 'summary')) return f;
    }
  }
  return undefined;
}

export class Metrics {
  constructor(readonly families: Map<string, Family>) {}

  /** The value of one sample, or undefined when no sample has exactly these labels (a subset match is not enough). */
  value(name: string, labels: Record<string, string> = {}): number | undefined {
    const f = familyOfSample(this.families, name);
    if (!f) return undefined;
    const want = Object.entries(labels);
    for (const s of f.samples) {
      if (s.name !== name) continue;
      if (Object.keys(s.labels).length !== want.length) continue;
      if (want.every(([k, v]) => s.labels[k] === v)) return s.value;
    }
    return undefined;
  }

  /** The sum of every sample of `name` whose labels include `labels`. */
  sum(name: string, labels: Record<string, string> = {}): number {
    const f = familyOfSample(this.families, name);
    if (!f) return 0;
    let total = 0;
    for (const s of f.samples) if (s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v)) total += s.value;
    return total;
  }

  type(name: string): Family['type'] | undefined {
    return this.families.get(name)?.type;
  }
}

export function parsePrometheus(text: string): Metrics {
  const families = new Map<string, Family>();
  if (!text.endsWith('\n')) throw new Error('exposition does not end with a newline');
  for (const line of text.split('\n')) {
    if (line === '') continue;
    if (line.startsWith('#')) {
      const m = /^# (HELP|TYPE) (\S+) ?(.*)$/.exec(line);
      if (!m) continue; // a plain comment
      const [, kind, name, rest] = m;
      if (!NAME.test(name)) throw new Error(`bad metric name in ${JSON.stringify(line)}`);
      const f = families.get(name) ?? { name, type: 'untyped' as const, help: '', samples: [] };
      if (kind === 'TYPE') {
        if (!['counter', 'gauge', 'histogram', 'summary', 'untyped'].includes(rest)) throw new Error(`bad type in ${JSON.stringify(line)}`);
        if (f.samples.length > 0) throw new Error(`TYPE after samples in ${JSON.stringify(line)}`);
        f.type = rest as Family['type'];
      } else {
        f.help = rest;
      }
      families.set(name, f);
      continue;
    }
    const nameMatch = /^[a-zA-Z_:][a-zA-Z0-9_:]*/.exec(line);
    if (!nameMatch) throw new Error(`bad sample line ${JSON.stringify(line)}`);
    const name = nameMatch[0];
    let i = name.length;
    let labels: Record<string, string> = {};
    if (line[i] === '{') [labels, i] = parseLabels(line, i);
    if (line[i] !== ' ') throw new Error(`expected a space before the value in ${JSON.stringify(line)}`);
    const parts = line.slice(i + 1).trim().split(/ +/);
    if (parts.length < 1 || parts.length > 2) throw new Error(`bad value part in ${JSON.stringify(line)}`);
    const value = parseValue(parts[0], line);
    if (parts[1] !== undefined && !/^-?\d+$/.test(parts[1])) throw new Error(`bad timestamp in ${JSON.stringify(line)}`);
    const f = familyOfSample(families, name);
    if (!f) throw new Error(`sample of an undeclared family: ${JSON.stringify(line)}`);
    f.samples.push({ name, labels, value });
  }
  for (const f of families.values()) {
    if (f.type === 'counter') for (const s of f.samples) if (!(s.value >= 0)) throw new Error(`negative counter ${f.name}`);
    if (f.type === 'histogram') checkHistogram(f);
  }
  return new Metrics(families);
}

function checkHistogram(f: Family): void {
  // Group buckets by their labels other than `le`.
  const series = new Map<string, { buckets: Array<[number, number]>; count?: number }>();
  const keyOf = (labels: Record<string, string>) =>
    JSON.stringify(Object.entries(labels).filter(([k]) => k !== 'le').sort(([a], [b]) => a.localeCompare(b)));
  for (const s of f.samples) {
    const key = keyOf(s.labels);
    const entry = series.get(key) ?? { buckets: [] };
    if (s.name === `${f.name}_bucket`) {
      if (!('le' in s.labels)) throw new Error(`${f.name}_bucket without le`);
      entry.buckets.push([parseValue(s.labels.le, s.labels.le), s.value]);
    } else if (s.name === `${f.name}_count`) entry.count = s.value;
    series.set(key, entry);
  }
  for (const [key, e] of series) {
    const sorted = [...e.buckets].sort((a, b) => a[0] - b[0]);
    if (sorted.length === 0 || sorted[sorted.length - 1][0] !== Infinity) throw new Error(`${f.name}${key}: no +Inf bucket`);
    for (let i = 1; i < sorted.length; i++) if (sorted[i][1] < sorted[i - 1][1]) throw new Error(`${f.name}${key}: buckets not cumulative`);
    if (e.count !== sorted[sorted.length - 1][1]) throw new Error(`${f.name}${key}: +Inf bucket ${sorted[sorted.length - 1][1]} != count ${e.count}`);
  }
}

/** GETs a metrics endpoint and parses it; checks the content type is Prometheus text. */
export async function scrapeMetrics(url: string): Promise<Metrics> {
  const res = await fetch(url);
  if (res.status !== 200) throw new Error(`GET ${url}: ${res.status}`);
  const type = res.headers.get('content-type') ?? '';
  if (!/^text\/plain; version=0\.0\.4/.test(type)) throw new Error(`GET ${url}: content-type ${type}`);
  return parsePrometheus(await res.text());
}
