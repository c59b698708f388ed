// The demo backend `npm start` runs behind the other tool families (`/v1/files*`, `/v1/pdf*`,
// `/v1/skills*`, `/v1/vector_stores*`, `/v1/sandbox/*`, `/v1/route`): small, in memory, answering
// plausible JSON and FastAPI-style errors (`{"detail": "Not Found"}`, 405, 413, 422 with a list of
// field errors), so every tool endpoint answers offline. It runs no code and fetches nothing.
import { createHash, randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

const MAX_JSON_BYTES = 1024 * 1024;
/** Uploads are stored in memory up to this size; larger ones are counted and hashed, not kept. */
const MAX_STORED_FILE_BYTES = 8 * 1024 * 1024;
const MAX_FILES = 200;
/** All stored file contents together; the oldest files are forgotten to make room. */
const MAX_STORED_TOTAL_BYTES = 64 * 1024 * 1024;
const MAX_VECTOR_STORES = 200;

type Json = Record<string, unknown>;

class HttpError extends Error {
  constructor(
    readonly status: number,
    readonly detail: unknown,
    readonly allow?: string,
  ) {
    super(typeof detail === 'string' ? detail : 'error');
  }
}

const notFound = () => new HttpError(404, 'Not Found');
const notAllowed = (allow: string) => new HttpError(405, 'Method Not Allowed', allow);
const missing = (field: string, input: unknown) => new HttpError(422, [{ type: 'missing', loc: ['body', field], msg: 'Field required', input }]);
const wrongType = (field: string, type: string, input: unknown) =>
  new HttpError(422, [{ type: `${type}_type`, loc: ['body', field], msg: `Input should be a valid ${type}`, input }]);

function send(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), ...headers });
  res.end(text);
}

async function readBody(req: IncomingMessage, cap: number): Promise<Buffer> {
  const parts: Buffer[] = [];
  let size = 0;
  for await (const c of req) {
    size += (c as Buffer).length;
    if (size > cap) throw new HttpError(413, 'Request Entity Too Large');
    parts.push(c as Buffer);
  }
  return Buffer.concat(parts);
}

async function readJson(req: IncomingMessage): Promise<Json> {
  const raw = await readBody(req, MAX_JSON_BYTES);
  let doc: unknown;
  try {
    doc = JSON.parse(raw.toString('utf8'));
  } catch (err) {
    throw new HttpError(422, [{ type: 'json_invalid', loc: ['body', 0], msg: 'JSON decode error', input: {}, ctx: { error: (err as Error).message.split('\n')[0] } }]);
  }
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc)) throw new HttpError(422, [{ type: 'model_attributes_type', loc: ['body'], msg: 'Input should be a valid dictionary or object', input: doc }]);
  return doc as Json;
}

function str(body: Json, field: string, required = true): string | undefined {
  const v = body[field];
  if (v === undefined) {
    if (required) throw missing(field, body);
    return undefined;
  }
  if (typeof v !== 'string') throw wrongType(field, 'string', v);
  return v;
}

const nowSec = () => Math.floor(Date.now() / 1000);
const newId = (prefix: string) => `${prefix}-${randomBytes(9).toString('base64url')}`;

interface StoredFile {
  id: string;
  object: 'file';
  bytes: number;
  created_at: number;
  filename: string;
  purpose: string;
  sha256: string;
  content: Buffer | null;
}

interface VectorStore {
  id: string;
  object: 'vector_store';
  name: string;
  created_at: number;
  texts: string[];
}

const SKILLS = [
  { id: 'skill_summarise', object: 'skill', name: 'summarise', description: 'Summarises a text in three sentences.' },
  { id: 'skill_translate', object: 'skill', name: 'translate', description: 'Translates a text into another language.' },
  { id: 'skill_extract', object: 'skill', name: 'extract', description: 'Extracts named entities from a text.' },
];

/** A one-page PDF showing `line` (Helvetica, ASCII only). */
export function minimalPdf(line: string): Buffer {
  const safe = line.replace(/[^\x20-\x7e]/g, '?').replace(/[\\()]/g, (c) => `\\${c}`).slice(0, 90);
  const stream = `BT /F1 14 Tf 72 720 Td (${safe}) Tj ET`;
  const objects = [
    '<< /Type /Catalog /Pages 2 0 R >>',
    '<< /Type /Pages /Kids [3 0 R] /Count 1 >>',
    '<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>',
    `<< /Length ${stream.length} >>\nstream\n${stream}\nendstream`,
    '<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>',
  ];
  let out = '%PDF-1.4\n';
  const offsets: number[] = [];
  objects.forEach((o, i) => {
    offsets.push(out.length);
    out += `${i + 1} 0 obj\n${o}\nendobj\n`;
  });
  const xref = out.length;
  out += `xref\n0 ${objects.length + 1}\n0000000000 65535 f \n`;
  for (const off of offsets) out += `${String(off).padStart(10, '0')} 00000 n \n`;
  out += `trailer\n<< /Size ${objects.length + 1} /Root 1 0 R >>\nstartxref\n${xref}\n%%EOF\n`;
  return Buffer.from(out, 'latin1');
}

function textOfHtml(html: string): string {
  return html
    .replace(/<(script|style)[\s\S]*?<\/\1>/gi, ' ')
    .replace(/<[^>]*>/g, ' ')
    .replace(/\s+/g, ' ')
    .trim();
}

export interface DemoToolBackend {
  url: string;
  close(): Promise<void>;
}

export async function startDemoToolBackend(host = '127.0.0.1', port = 0): Promise<DemoToolBackend> {
  const files = new Map<string, StoredFile>();
  const stores = new Map<string, VectorStore>();

  const fileView = (f: StoredFile) => ({ id: f.id, object: f.object, bytes: f.bytes, created_at: f.created_at, filename: f.filename, purpose: f.purpose, sha256: f.sha256 });

  async function uploadFile(req: IncomingMessage, url: URL): Promise<StoredFile> {
    const hash = createHash('sha256');
    const kept: Buffer[] = [];
    let bytes = 0;
    for await (const c of req) {
      const chunk = c as Buffer;
      hash.update(chunk);
      bytes += chunk.length;
      if (bytes <= MAX_STORED_FILE_BYTES) kept.push(chunk);
    }
    const keep = bytes <= MAX_STORED_FILE_BYTES;
    let stored = 0;
    for (const x of files.values()) stored += x.content?.length ?? 0;
    for (const [id, x] of files) {
      if (files.size < MAX_FILES && (!keep || stored + bytes <= MAX_STORED_TOTAL_BYTES)) break;
      stored -= x.content?.length ?? 0;
      files.delete(id);
    }
    const f: StoredFile = {
      id: newId('file'),
      object: 'file',
      bytes,
      created_at: nowSec(),
      filename: url.searchParams.get('filename') ?? String(req.headers['x-filename'] ?? 'upload.bin'),
      purpose: url.searchParams.get('purpose') ?? 'assistants',
      sha256: hash.digest('hex'),
      content: keep ? Buffer.concat(kept, bytes) : null,
    };
    files.set(f.id, f);
    return f;
  }

  async function route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://demo');
    const seg = url.pathname.split('/').filter(Boolean);
    const method = req.method ?? 'GET';
    if (seg[0] !== 'v1') throw notFound();
    const family = seg[1];
    switch (family) {
      case 'files': {
        if (seg.length === 2) {
          if (method === 'GET') return send(res, 200, { object: 'list', data: [...files.values()].map(fileView) });
          if (method === 'POST') return send(res, 200, fileView(await uploadFile(req, url)));
          throw notAllowed('GET, POST');
        }
        const f = files.get(seg[2]);
        if (seg.length === 3) {
          if (method === 'GET') {
            if (!f) throw new HttpError(404, `No file with id ${seg[2]}`);
            return send(res, 200, fileView(f));
          }
          if (method === 'DELETE') {
            if (!f) throw new HttpError(404, `No file with id ${seg[2]}`);
            files.delete(f.id);
            return send(res, 200, { id: f.id, object: 'file', deleted: true });
          }
          throw notAllowed('GET, DELETE');
        }
        if (seg.length === 4 && seg[3] === 'content') {
          if (method !== 'GET') throw notAllowed('GET');
          if (!f) throw new HttpError(404, `No file with id ${seg[2]}`);
          if (!f.content) throw new HttpError(410, `The demo backend keeps the content of files up to ${MAX_STORED_FILE_BYTES} bytes; this one was ${f.bytes} bytes.`);
          res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': f.content.length });
          res.end(f.content);
          return;
        }
        throw notFound();
      }
      case 'pdf': {
        if (seg.length > 3 || (seg.length === 3 && seg[2] !== 'render')) throw notFound();
        if (method !== 'POST') throw notAllowed('POST');
        const type = String(req.headers['content-type'] ?? '');
        let html: string;
        if (type.startsWith('application/json')) {
          html = str(await readJson(req), 'html')!;
        } else {
          html = (await readBody(req, MAX_JSON_BYTES)).toString('utf8');
          if (html.trim() === '') throw missing('html', '');
        }
        const pdf = minimalPdf(textOfHtml(html) || '(empty document)');
        res.writeHead(200, { 'content-type': 'application/pdf', 'content-length': pdf.length, 'content-disposition': 'inline; filename="document.pdf"' });
        res.end(pdf);
        return;
      }
      case 'skills': {
        if (method !== 'GET') throw notAllowed('GET');
        if (seg.length === 2) return send(res, 200, { object: 'list', data: SKILLS });
        const s = seg.length === 3 ? SKILLS.find((x) => x.id === seg[2]) : undefined;
        if (!s) throw seg.length === 3 ? new HttpError(404, `No skill with id ${seg[2]}`) : notFound();
        return send(res, 200, s);
      }
      case 'vector_stores': {
        if (seg.length === 2) {
          if (method === 'GET') return send(res, 200, { object: 'list', data: [...stores.values()].map(({ texts, ...v }) => ({ ...v, file_counts: { total: texts.length } })) });
          if (method !== 'POST') throw notAllowed('GET, POST');
          const body = await readJson(req);
          const name = str(body, 'name')!;
          if (stores.size >= MAX_VECTOR_STORES) stores.delete(stores.keys().next().value as string);
          const v: VectorStore = { id: newId('vs'), object: 'vector_store', name, created_at: nowSec(), texts: [] };
          stores.set(v.id, v);
          return send(res, 200, { id: v.id, object: v.object, name, created_at: v.created_at, file_counts: { total: 0 } });
        }
        const v = stores.get(seg[2]);
        if (!v) throw new HttpError(404, `No vector store with id ${seg[2]}`);
        if (seg.length === 3 && method === 'GET') return send(res, 200, { id: v.id, object: v.object, name: v.name, created_at: v.created_at, file_counts: { total: v.texts.length } });
        if (seg.length === 4 && seg[3] === 'texts') {
          if (method !== 'POST') throw notAllowed('POST');
          const t = str(await readJson(req), 'text')!;
          if (v.texts.length < 1000) v.texts.push(t.slice(0, 10_000));
          return send(res, 200, { object: 'vector_store.text', index: v.texts.length - 1 });
        }
        if (seg.length === 4 && seg[3] === 'search') {
          if (method !== 'POST') throw notAllowed('POST');
          const q = str(await readJson(req), 'query')!.toLowerCase();
          const words = q.split(/\W+/).filter(Boolean);
          const data = v.texts
            .map((t, i) => ({ index: i, text: t, score: words.filter((w) => t.toLowerCase().includes(w)).length / Math.max(1, words.length) }))
            .filter((r) => r.score > 0)
            .sort((a, b) => b.score - a.score)
            .slice(0, 10);
          return send(res, 200, { object: 'vector_store.search_results.page', search_query: q, data });
        }
        throw notFound();
      }
      case 'sandbox': {
        if (seg.length !== 3 || seg[2] !== 'run') throw notFound();
        if (method !== 'POST') throw notAllowed('POST');
        const body = await readJson(req);
        const code = str(body, 'code')!;
        const language = str(body, 'language', false) ?? 'python';
        // A demo: the code is never run.
        return send(res, 200, { object: 'sandbox.run', language, status: 'completed', exit_code: 0, stdout: `(demo sandbox: ${code.length} characters of ${language} received, not executed)\n`, stderr: '' });
      }
      case 'route': {
        if (seg.length !== 2) throw notFound();
        if (method !== 'POST') throw notAllowed('POST');
        const input = str(await readJson(req), 'input')!;
        const model = input.length > 400 ? 'demo-chat-pro' : 'demo-chat';
        return send(res, 200, { object: 'route', model, reason: input.length > 400 ? 'long input' : 'short input' });
      }
      default:
        throw notFound();
    }
  }

  const server: Server = createServer((req, res) => {
    route(req, res).catch((err: unknown) => {
      if (res.headersSent) return void res.destroy();
      if (err instanceof HttpError) return send(res, err.status, { detail: err.detail }, err.allow ? { allow: err.allow } : {});
      // A client that went away mid-body, or a bug: FastAPI's plain answer, nothing more.
      send(res, 500, { detail: 'Internal Server Error' });
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
  const addr = server.address() as AddressInfo;
  return {
    url: `http://${host}:${addr.port}`,
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
