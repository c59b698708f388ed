// The `/v1/pdf*` guard (spec: "HTML containing a remote reference is rejected with 400"): finds the
// first reference in an HTML document that would make a renderer fetch something from elsewhere.
// Pure and I/O-free.
//
// What counts as a reference: URL attributes (src, href, srcset, data, poster, action, …, in any
// namespace such as xlink:href), `<meta http-equiv=refresh content="…; url=…">`, CSS in <style>
// elements and style attributes (unquoted `url(…)` and every quoted string that is a remote URL: what
// `@import`, `url()`, `image-set()` and `src()` take), `<iframe srcdoc>` (scanned as a document of its
// own), and absolute URLs in <script> text. A reference is remote when it is
// protocol-relative (`//host`, also written with backslashes) or has any scheme other than the local
// ones (data:, about:, mailto:, tel:, and fragments / relative paths, which have none); file: and
// javascript: are refused too, as a renderer may follow them. Attribute values are read as a browser
// reads them: character references decoded (`&#x68;ttp`, `&colon;`), names and schemes in any case,
// tabs and newlines inside a URL ignored. CSS is read with comments skipped and escapes decoded.
// HTML comments are not markup and are skipped. Every reader is one linear pass (bodies are up to
// 64 MiB and come from anyone).

import { GatewayError } from '../errors.js';

const LOCAL_SCHEMES = new Set(['data', 'about', 'mailto', 'tel']);

/** Attributes whose value is one URL. `srcset`-like lists are below. */
const URL_ATTRS = new Set([
  'src',
  'href',
  'data',
  'poster',
  'background',
  'action',
  'formaction',
  'codebase',
  'lowsrc',
  'dynsrc',
  'manifest',
  'archive',
  'classid',
  'code',
]);
const SRCSET_ATTRS = new Set(['srcset', 'imagesrcset']);

export interface RemoteReference {
  /** Where it was found, e.g. `img src` or `style url()`. */
  where: string;
  /** The reference as the document spells it after decoding, shortened. */
  url: string;
}

const NAMED_ENTITIES: Record<string, string> = {
  amp: '&',
  lt: '<',
  gt: '>',
  quot: '"',
  apos: "'",
  colon: ':',
  sol: '/',
  bsol: '\\',
  period: '.',
  tab: '\t',
  newline: '\n',
  nbsp: '\u00a0',
  lpar: '(',
  rpar: ')',
  commat: '@',
  num: '#',
  quest: '?',
  equals: '=',
  semi: ';',
  excl: '!',
  percnt: '%',
  plus: '+',
  comma: ',',
  hyphen: '-',
  dash: '-',
  lowbar: '_',
  ast: '*',
  midast: '*',
};

/** Decodes HTML character references (numeric with or without `;`, and the named ones that matter). */
export function decodeEntities(s: string): string {
  if (s.indexOf('&') === -1) return s;
  return s.replace(/&(?:#[xX]([0-9a-fA-F]+);?|#([0-9]+);?|([A-Za-z][A-Za-z0-9]*);?)/g, (m, hex: string | undefined, dec: string | undefined, name: string | undefined) => {
    if (hex !== undefined || dec !== undefined) {
      const cp = hex !== undefined ? parseInt(hex, 16) : parseInt(dec!, 10);
      if (!Number.isFinite(cp) || cp <= 0 || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return '\ufffd';
      return String.fromCodePoint(cp);
    }
    const v = NAMED_ENTITIES[name!.toLowerCase()];
    return v ?? m;
  });
}

/** Whether one URL, as written in an attribute (already entity-decoded), is remote. */
export function isRemoteUrl(raw: string): boolean {
  // As the URL parser does: leading C0 controls and spaces dropped, tabs and newlines removed. Only
  // the start decides (a scheme or `//`), so only the start is read.
  let start = 0;
  while (start < raw.length && isUrlSpace(raw.charCodeAt(start))) start++;
  let s = '';
  for (let i = start; i < raw.length && s.length < 64; i++) {
    const c = raw[i];
    if (c !== '\t' && c !== '\n' && c !== '\r') s += c;
  }
  if (s.length === 0) return false;
  // Protocol-relative, with either slash (browsers read `\` as `/` in http(s) URLs).
  if (/^[/\\]{2}/.test(s)) return true;
  const m = /^([A-Za-z][A-Za-z0-9+.-]*):/.exec(s);
  if (!m) return false;
  return !LOCAL_SCHEMES.has(m[1].toLowerCase());
}

function isUrlSpace(c: number): boolean {
  return c <= 0x20 || c === 0xa0 || c === 0xfeff;
}

function shorten(s: string): string {
  const t = s.trim().replace(/\s+/g, ' ');
  return t.length > 120 ? `${t.slice(0, 117)}...` : t;
}

/** Decodes CSS escapes (`\\72` → `r`, `\\"` → `"`). */
function decodeCssEscapes(text: string): string {
  if (text.indexOf('\\') === -1) return text;
  return text.replace(/\\([0-9a-fA-F]{1,6})[ \t\r\n\f]?|\\([^\r\n\f0-9a-fA-F])|\\\r?\n/g, (_m, hex: string | undefined, ch: string | undefined) => {
    if (hex !== undefined) {
      const cp = parseInt(hex, 16);
      return cp > 0 && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff) ? String.fromCodePoint(cp) : '\ufffd';
    }
    return ch ?? '';
  });
}

const CSS_IDENT = /[A-Za-z0-9_\-\u0080-\uffff]|\\/;

/** The index after a CSS escape starting at `i` (a backslash): up to 6 hex digits and one space, or one character. */
function afterEscape(css: string, i: number): number {
  let j = i + 1;
  while (j < css.length && j < i + 7 && /[0-9a-fA-F]/.test(css[j])) j++;
  if (j === i + 1) return i + 2;
  return /[ \t\r\n\f]/.test(css[j] ?? '') ? j + 1 : j;
}

/**
 * The first remote reference in CSS text (a <style> element or a style attribute), or null. One
 * linear pass over the text, skipping comments: every quoted string that is a remote URL (what
 * `@import "…"`, `image-set("…")`, `src("…")` and `url("…")` take) and every unquoted `url(…)`, with
 * escapes decoded in identifiers and values, so `u\72l(` and `"\68ttp://…"` are read as browsers do.
 */
export function findRemoteInCss(cssText: string, where: string): RemoteReference | null {
  const css = cssText;
  const n = css.length;
  // The identifier or at-keyword read last: names what a following string or parenthesis belongs to.
  let context = '';
  let i = 0;
  while (i < n) {
    const c = css[i];
    // A comment (outside strings only: `"/*"` is text), e.g. `@im/**/port`.
    if (c === '/' && css[i + 1] === '*') {
      const end = css.indexOf('*/', i + 2);
      i = end === -1 ? n : end + 2;
      continue;
    }
    if (c === '"' || c === "'") {
      let j = i + 1;
      while (j < n && css[j] !== c && css[j] !== '\n') j += css[j] === '\\' ? 2 : 1;
      const value = decodeCssEscapes(css.slice(i + 1, Math.min(j, n)));
      if (isRemoteUrl(value)) {
        const kind = context === '@import' ? '@import' : context === 'url' ? 'url()' : context.endsWith('image-set') ? 'image-set()' : context === 'src' ? 'src()' : 'string';
        return { where: `${where} ${kind}`, url: shorten(value) };
      }
      i = j + 1;
      continue;
    }
    if (c === '@' || CSS_IDENT.test(c)) {
      let j = c === '@' ? i + 1 : i;
      while (j < n && CSS_IDENT.test(css[j])) j = css[j] === '\\' ? afterEscape(css, j) : j + 1;
      const ident = decodeCssEscapes(css.slice(i, Math.min(j, n))).toLowerCase();
      if (ident === 'url' && css[j] === '(') {
        // url( value ): quoted values are read by the string branch; an unquoted one runs to `)`.
        let k = j + 1;
        while (k < n && /\s/.test(css[k])) k++;
        if (css[k] === '"' || css[k] === "'") {
          context = 'url';
          i = k;
          continue;
        }
        let e = k;
        while (e < n && css[e] !== ')') e += css[e] === '\\' ? 2 : 1;
        const value = decodeCssEscapes(css.slice(k, Math.min(e, n)));
        if (isRemoteUrl(value)) return { where: `${where} url()`, url: shorten(value) };
        i = e + 1;
        continue;
      }
      context = ident;
      i = Math.max(j, i + 1);
      continue;
    }
    // A string or an argument list ends what the last name governs, except inside image-set(…, …).
    if (c === ';' || c === '{' || c === '}') context = '';
    i++;
  }
  return null;
}

function checkSrcset(value: string): string | null {
  // Candidates are "url [descriptor]" separated by commas; a URL may itself contain commas (data:).
  for (const part of value.split(/,(?=\s*\S)/)) {
    const url = part.trim().split(/\s+/)[0] ?? '';
    if (isRemoteUrl(url)) return url;
  }
  return null;
}

/** `content="5; url=https://…"` of a meta refresh: the URL part, if any. */
function refreshUrl(content: string): string | null {
  const m = /^\s*[\d.]*\s*[;,]?\s*(?:url\s*=\s*)?(.*)$/is.exec(content);
  if (!m) return null;
  let u = m[1].trim();
  if ((u.startsWith('"') && u.endsWith('"')) || (u.startsWith("'") && u.endsWith("'"))) u = u.slice(1, -1);
  return u.length > 0 ? u : null;
}

interface Attr {
  name: string;
  value: string;
}

// An attribute: a name, then optionally = and a quoted or unquoted value.
const ATTR = /([^\s"'>/=]+)(?:\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]*)))?/g;

function parseAttrs(text: string): Attr[] {
  const out: Attr[] = [];
  ATTR.lastIndex = 0;
  for (let m = ATTR.exec(text); m !== null; m = ATTR.exec(text)) {
    const raw = m[2] ?? m[3] ?? m[4] ?? '';
    out.push({ name: m[1].toLowerCase(), value: decodeEntities(raw) });
  }
  return out;
}

/** Elements whose content is raw text (not markup): scanned by their own rules, then skipped. */
const RAW_TEXT = new Set(['style', 'script', 'textarea', 'title', 'xmp', 'noembed', 'noframes', 'plaintext']);

const MAX_SRCDOC_DEPTH = 3;

/** The first remote reference in an HTML document, or null when it references nothing remote. */
export function findRemoteReference(html: string, depth = 0): RemoteReference | null {
  const n = html.length;
  let i = 0;
  while (i < n) {
    const lt = html.indexOf('<', i);
    if (lt === -1) break;
    // Comments, and `<!…>` / `<?…>` declarations: not markup that loads anything.
    if (html.startsWith('<!--', lt)) {
      const end = html.indexOf('-->', lt + 4);
      i = end === -1 ? n : end + 3;
      continue;
    }
    const c = html.charCodeAt(lt + 1);
    const isLetter = (c >= 65 && c <= 90) || (c >= 97 && c <= 122);
    if (!isLetter) {
      if (html[lt + 1] === '!' || html[lt + 1] === '?') {
        const end = html.indexOf('>', lt + 2);
        i = end === -1 ? n : end + 1;
      } else {
        i = lt + 1;
      }
      continue;
    }
    // The tag: name, then attributes up to the `>` that is outside quotes.
    let j = lt + 1;
    while (j < n && !/[\s/>]/.test(html[j])) j++;
    const tag = html.slice(lt + 1, j).toLowerCase();
    let quote = '';
    let k = j;
    for (; k < n; k++) {
      const ch = html[k];
      if (quote) {
        if (ch === quote) quote = '';
      } else if (ch === '"' || ch === "'") {
        // Only a quote that opens a value (after `=`) starts a quoted run.
        if (/=\s*$/.test(html.slice(Math.max(j, k - 16), k))) quote = ch;
      } else if (ch === '>') break;
    }
    const attrs = parseAttrs(html.slice(j, k));
    const found = checkTag(tag, attrs, depth);
    if (found) return found;
    i = k + 1;
    if (RAW_TEXT.has(tag)) {
      const closer = new RegExp(`</${tag}`, 'ig');
      closer.lastIndex = i;
      const close = closer.exec(html)?.index ?? -1;
      const text = html.slice(i, close === -1 ? n : close);
      if (tag === 'style') {
        // Raw text in HTML, but entity-decoded inside SVG: both readings are checked.
        const css = findRemoteInCss(text, 'style') ?? findRemoteInCss(decodeEntities(text), 'style');
        if (css) return css;
      } else if (tag === 'script') {
        const m = /\b(?:https?|ftps?|wss?|file):\s*[/\\]{2}[^\s"'`<>)]*/i.exec(text);
        if (m) return { where: 'script', url: shorten(m[0]) };
      }
      i = close === -1 ? n : close;
    }
  }
  return null;
}

function checkTag(tag: string, attrs: Attr[], depth: number): RemoteReference | null {
  let httpEquivRefresh = false;
  let content: string | null = null;
  for (const a of attrs) {
    // Namespaced forms (xlink:href) are the same attribute for this purpose.
    const local = a.name.includes(':') ? a.name.slice(a.name.lastIndexOf(':') + 1) : a.name;
    if (URL_ATTRS.has(local)) {
      if (isRemoteUrl(a.value)) return { where: `${tag} ${a.name}`, url: shorten(a.value) };
    } else if (SRCSET_ATTRS.has(local)) {
      const u = checkSrcset(a.value);
      if (u) return { where: `${tag} ${a.name}`, url: shorten(u) };
    } else if (local === 'style') {
      const css = findRemoteInCss(a.value, `${tag} style`);
      if (css) return css;
    } else if (local === 'srcdoc') {
      // Deeper than anyone writes by hand: refused rather than passed unread.
      if (depth >= MAX_SRCDOC_DEPTH) return { where: `${tag} srcdoc nested more than ${MAX_SRCDOC_DEPTH} deep`, url: shorten(a.value) };
      const inner = findRemoteReference(a.value, depth + 1);
      if (inner) return { where: `${tag} srcdoc: ${inner.where}`, url: inner.url };
    } else if (local === 'http-equiv' && a.value.trim().toLowerCase() === 'refresh') {
      httpEquivRefresh = true;
    } else if (local === 'content') {
      content = a.value;
    }
  }
  if (tag === 'meta' && httpEquivRefresh && content !== null) {
    const u = refreshUrl(content);
    if (u && isRemoteUrl(u)) return { where: 'meta refresh', url: shorten(u) };
  }
  return null;
}

/**
 * The HTML inside a PDF request body: JSON bodies are read field by field (every string value may be
 * HTML), anything else (text/html, multipart forms) as text: as UTF-8, and also in the encoding a
 * renderer would pick instead (a BOM, the Content-Type charset, a `<meta charset>`), since a document
 * in UTF-16 or ISO-2022-JP hides its markup from a UTF-8 reading. Returns the first remote reference.
 */
export function findRemoteInBody(body: Buffer, contentType: string): RemoteReference | null {
  const text = body.toString('utf8');
  if (/^\s*application\/(?:[\w.+-]*\+)?json\b/i.test(contentType)) {
    let doc: unknown;
    try {
      doc = JSON.parse(text);
    } catch {
      // Not JSON after all: read as text, so a malformed body cannot slip a reference past.
      return findRemoteReference(text);
    }
    return findInJson(doc);
  }
  const found = findRemoteReference(text);
  if (found) return found;
  for (const other of otherReadings(body, contentType)) {
    const r = findRemoteReference(other);
    if (r) return r;
  }
  return null;
}

/**
 * The encodings (WHATWG names) in which markup can show that a UTF-8 reading does not see: UTF-16, and
 * ISO-2022-JP, whose escape sequences vanish when decoded. In every other one ASCII bytes read as in
 * UTF-8 (a multi-byte character can swallow a letter, never produce one), so they are not read again:
 * at most three more readings, however many charsets a document declares.
 */
const HIDING_ENCODINGS = new Set(['utf-16le', 'utf-16be', 'iso-2022-jp']);

/** The body decoded as each encoding a renderer might choose other than UTF-8 (WHATWG labels). */
export function otherReadings(body: Buffer, contentType: string): string[] {
  const labels = new Set<string>();
  if (body[0] === 0xff && body[1] === 0xfe) labels.add('utf-16le');
  else if (body[0] === 0xfe && body[1] === 0xff) labels.add('utf-16be');
  const declared = /;\s*charset\s*=\s*"?([^";\s]+)/i.exec(contentType);
  if (declared) labels.add(declared[1]);
  // A <meta charset> or http-equiv Content-Type near the start (the HTML prescan reads 1024 bytes).
  const head = body.subarray(0, 1024).toString('latin1');
  for (const m of head.matchAll(/<meta\b[^>]*?charset\s*=\s*["']?\s*([^"'\s;>/]+)/gi)) labels.add(m[1]);
  const out: string[] = [];
  const seen = new Set<string>();
  for (const label of labels) {
    let decoder: TextDecoder;
    try {
      decoder = new TextDecoder(label.toLowerCase());
    } catch {
      // A label no renderer knows: it falls back to UTF-8 or windows-1252, already read.
      continue;
    }
    if (!HIDING_ENCODINGS.has(decoder.encoding) || seen.has(decoder.encoding)) continue;
    seen.add(decoder.encoding);
    out.push(decoder.decode(body));
  }
  return out;
}

/** Every string in a JSON document, however deep (an explicit stack: no depth limit, no recursion). */
function findInJson(root: unknown): RemoteReference | null {
  const stack: unknown[] = [root];
  while (stack.length > 0) {
    const v = stack.pop();
    // Without a `<` a string holds no markup.
    if (typeof v === 'string') {
      if (v.indexOf('<') === -1) continue;
      const r = findRemoteReference(v);
      if (r) return r;
    } else if (typeof v === 'object' && v !== null) {
      const children = Array.isArray(v) ? v : Object.values(v);
      for (let i = children.length - 1; i >= 0; i--) stack.push(children[i]);
    }
  }
  return null;
}

/**
 * A body sent with a Content-Encoding (gzip, …) cannot be read for references, and the backend might
 * inflate it: refused (400, Shape C) unless the encoding is `identity`.
 */
export function encodedBodyRefusal(headers: ReadonlyArray<readonly [string, string]>): GatewayError | null {
  for (const [k, v] of headers) {
    if (k !== 'content-encoding') continue;
    const encoding = v.trim().toLowerCase();
    if (encoding === '' || encoding === 'identity') continue;
    return new GatewayError('ENCODED_BODY', `Content-Encoding ${JSON.stringify(encoding.slice(0, 40))} is not accepted on /v1/pdf: send the HTML uncompressed, so that it can be checked for remote references.`);
  }
  return null;
}
