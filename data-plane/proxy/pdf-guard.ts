// The `/v1/pdf*` guard (spec: "HTML containing a remote reference is rejected with 400"): finds the
// first reference in an HTML document that would make a renderer fetch something from elsewhere.
// Pure and I/O-free.
//
// What counts as a reference: URL attributes (src, href, srcset, data, poster, action, …, in any
// namespace such as xlink:href), `<meta http-equiv=refresh content="…; url=…">`, CSS in <style>
// elements and style attributes (unquoted `url(…)` and every quoted string that is a remote URL: what
// `@import`, `url()`, `image-set()` and `src()` take), `<iframe srcdoc>` (scanned as a document of its
// own), `data:` documents a renderer would load (HTML, SVG, XML, CSS: decoded and scanned the same
// way, nested at most three deep), absolute URLs in <script> text and in `on*` handler attributes, and
// the values an SVG <set>/<animate> can put into an attribute. A reference is remote when it is
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
/** SVG animation elements and the attributes whose values they write into another attribute. */
const ANIMATION_TAGS = new Set(['set', 'animate', 'animatetransform', 'animatemotion']);
const ANIMATION_VALUE_ATTRS = new Set(['to', 'from', 'by', 'values']);

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
export function findRemoteInCss(cssText: string, where: string, depth = 0): RemoteReference | null {
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
      const kind = context === '@import' ? '@import' : context === 'url' ? 'url()' : context.endsWith('image-set') ? 'image-set()' : context === 'src' ? 'src()' : 'string';
      const found = checkUrl(value, `${where} ${kind}`, depth);
      if (found) return found;
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
        const found = checkUrl(value, `${where} url()`, depth);
        if (found) return found;
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

/**
 * A srcset list as the HTML parser reads it: a candidate's URL runs to the next whitespace (commas
 * inside it, as in data: URLs, belong to it; trailing ones end it), then its descriptors run to a
 * comma outside parentheses.
 */
function checkSrcset(value: string, where: string, depth: number): RemoteReference | null {
  const n = value.length;
  let i = 0;
  while (i < n) {
    while (i < n && (isHtmlSpace(value.charCodeAt(i)) || value[i] === ',')) i++;
    if (i >= n) break;
    const start = i;
    while (i < n && !isHtmlSpace(value.charCodeAt(i))) i++;
    let url = value.slice(start, i);
    if (url.endsWith(',')) url = url.replace(/,+$/, '');
    else {
      let inParens = false;
      for (; i < n; i++) {
        const c = value[i];
        if (c === '(') inParens = true;
        else if (c === ')') inParens = false;
        else if (c === ',' && !inParens) {
          i++;
          break;
        }
      }
    }
    const found = checkUrl(url, where, depth);
    if (found) return found;
  }
  return null;
}

function isHtmlSpace(c: number): boolean {
  return c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0c || c === 0x0d;
}

/** Media types of `data:` documents that a renderer parses and that can load more: read as HTML (and SVG/XML) or CSS. */
function dataDocumentKind(mediaType: string): 'html' | 'css' | null {
  if (mediaType === 'text/css') return 'css';
  if (mediaType === 'text/html' || mediaType === 'application/xhtml+xml' || mediaType === 'image/svg+xml' || mediaType === 'text/xml' || mediaType === 'application/xml' || mediaType.endsWith('+xml')) {
    return 'html';
  }
  return null;
}

/**
 * A `data:` URL's document, decoded as a browser does (tabs and newlines dropped, percent-escapes
 * decoded, then base64 when the type says so), when it is a document that can reference more; null
 * for other data: URLs (images, plain text) and for anything that is not a data: URL.
 */
export function dataUrlDocument(raw: string): { kind: 'html' | 'css'; texts: string[] } | null {
  let start = 0;
  while (start < raw.length && isUrlSpace(raw.charCodeAt(start))) start++;
  // The scheme, with tabs and newlines skipped as the URL parser does (however many there are).
  let scheme = '';
  for (let i = start; i < raw.length && scheme.length < 5; i++) {
    const c = raw[i];
    if (c !== '\t' && c !== '\n' && c !== '\r') scheme += c;
  }
  if (scheme.toLowerCase() !== 'data:') return null;
  const url = raw.slice(start).replace(/[\t\n\r]/g, '');
  const comma = url.indexOf(',');
  if (comma === -1) return null;
  const params = url.slice(5, comma).split(';').map((p) => p.trim().toLowerCase());
  const kind = dataDocumentKind(params[0] || 'text/plain');
  if (!kind) return null;
  let bytes = percentDecode(url.slice(comma + 1));
  if (params.slice(1).includes('base64')) bytes = Buffer.from(bytes.toString('latin1').replace(/[\s]/g, ''), 'base64');
  const charset = params.find((p) => p.startsWith('charset='));
  const contentType = `text/html${charset ? `; ${charset}` : ''}`;
  return { kind, texts: [bytes.toString('utf8'), ...otherReadings(bytes, contentType)] };
}

function percentDecode(s: string): Buffer {
  const src = Buffer.from(s, 'utf8');
  if (src.indexOf(0x25) === -1) return src;
  const out = Buffer.allocUnsafe(src.length);
  let o = 0;
  for (let i = 0; i < src.length; i++) {
    const c = src[i];
    const hi = c === 0x25 ? hexValue(src[i + 1]) : -1;
    const lo = hi === -1 ? -1 : hexValue(src[i + 2]);
    if (lo === -1) out[o++] = c;
    else {
      out[o++] = hi * 16 + lo;
      i += 2;
    }
  }
  return out.subarray(0, o);
}

function hexValue(c: number | undefined): number {
  if (c === undefined) return -1;
  if (c >= 0x30 && c <= 0x39) return c - 0x30;
  if (c >= 0x41 && c <= 0x46) return c - 0x37;
  if (c >= 0x61 && c <= 0x66) return c - 0x57;
  return -1;
}

/**
 * One URL as a renderer would follow it: remote, or a data: document that itself holds a remote
 * reference (its findings are named `… data: …`).
 */
function checkUrl(value: string, where: string, depth: number): RemoteReference | null {
  if (isRemoteUrl(value)) return { where, url: shorten(value) };
  const doc = dataUrlDocument(value);
  if (!doc) return null;
  if (depth >= MAX_NESTED_DEPTH) return { where: `${where} data: document nested more than ${MAX_NESTED_DEPTH} deep`, url: shorten(value) };
  for (const text of doc.texts) {
    const inner = doc.kind === 'css' ? findRemoteInCss(text, 'style', depth + 1) : findRemoteReference(text, depth + 1);
    if (inner) return { where: `${where} data: ${inner.where}`, url: inner.url };
  }
  return null;
}

/**
 * Absolute URLs in script text (<script> elements, `on*` handler attributes): a scheme with `//`, or
 * a quoted protocol-relative `//host`, after JavaScript's \x, \u and \u{…} escapes are decoded.
 */
function findRemoteInScript(text: string): string | null {
  const decoded = text.indexOf('\\') === -1 ? text : text.replace(/\\x([0-9a-fA-F]{2})|\\u\{([0-9a-fA-F]{1,6})\}|\\u([0-9a-fA-F]{4})/g, (m, x?: string, braced?: string, u?: string) => {
    const cp = parseInt((x ?? braced ?? u)!, 16);
    return cp <= 0x10ffff ? String.fromCodePoint(cp) : m;
  });
  const m = /\b(?:https?|ftps?|wss?|file):\s*[/\\]{2}[^\s"'`<>)]*|["'`]\s*[/\\]{2}[^\s/\\"'`<>)][^\s"'`<>)]*/i.exec(decoded);
  return m ? m[0] : null;
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

/** How deep srcdoc documents and data: documents may nest inside each other before a document is refused unread. */
const MAX_NESTED_DEPTH = 3;

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
        const css = findRemoteInCss(text, 'style', depth) ?? findRemoteInCss(decodeEntities(text), 'style', depth);
        if (css) return css;
      } else if (tag === 'script') {
        const url = findRemoteInScript(text);
        if (url) return { where: 'script', url: shorten(url) };
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
      const found = checkUrl(a.value, `${tag} ${a.name}`, depth);
      if (found) return found;
    } else if (SRCSET_ATTRS.has(local)) {
      const found = checkSrcset(a.value, `${tag} ${a.name}`, depth);
      if (found) return found;
    } else if (local === 'ping') {
      for (const u of a.value.split(/[\t\n\f\r ]+/)) if (isRemoteUrl(u)) return { where: `${tag} ${a.name}`, url: shorten(u) };
    } else if (local === 'style') {
      const css = findRemoteInCss(a.value, `${tag} style`, depth);
      if (css) return css;
    } else if (local.length > 2 && local.startsWith('on')) {
      // An event handler is script: held to the rule of <script> text.
      const url = findRemoteInScript(a.value);
      if (url) return { where: `${tag} ${a.name}`, url: shorten(url) };
    } else if (ANIMATION_TAGS.has(tag) && ANIMATION_VALUE_ATTRS.has(local)) {
      // <set to=…>, <animate values=…>: what the animation writes into an attribute (href, src, style).
      for (const v of a.value.split(';')) {
        const found = checkUrl(v, `${tag} ${a.name}`, depth) ?? findRemoteInCss(v, `${tag} ${a.name}`, depth);
        if (found) return found;
      }
    } else if (local === 'srcdoc') {
      // Deeper than anyone writes by hand: refused rather than passed unread.
      if (depth >= MAX_NESTED_DEPTH) return { where: `${tag} srcdoc nested more than ${MAX_NESTED_DEPTH} deep`, url: shorten(a.value) };
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
    const found = u ? checkUrl(u, 'meta refresh', depth) : null;
    if (found) return found;
  }
  return null;
}

/**
 * The HTML inside a PDF request body. A JSON body is read as the backend reads it (Python's
 * `json.loads` on the body's bytes, as FastAPI does for a JSON or missing Content-Type): decoded as
 * UTF-8, UTF-16 or UTF-32 by its BOM or its pattern of zero bytes, every string value read as HTML;
 * when it is not strict JSON (a BOM, `NaN`, a truncated body) every string literal in it is read
 * instead, and the text itself. Any other body (text/html, multipart forms) is read as text: as UTF-8,
 * and also in the encoding a renderer would pick instead (a BOM, the Content-Type charset, a
 * `<meta charset>`), since a document in UTF-16 or ISO-2022-JP hides its markup from a UTF-8 reading.
 * A body that starts as JSON does is read both ways. Returns the first remote reference.
 */
export function findRemoteInBody(body: Buffer, contentType: string): RemoteReference | null {
  const jsonType = /^\s*application\/(?:[\w.+-]*\+)?json\s*(?:;|$)/i.test(contentType);
  const jsonText = decodeJsonBytes(body);
  if (jsonType || contentType.trim() === '' || /^[ \t\r\n]*[[{"]/.test(jsonText.slice(0, 256))) {
    const found = findInJsonText(jsonText);
    if (found || jsonType) return found;
  }
  const text = body.toString('utf8');
  const found = findRemoteReference(text);
  if (found) return found;
  for (const other of otherReadings(body, contentType)) {
    const r = findRemoteReference(other);
    if (r) return r;
  }
  return null;
}

/** A JSON document's text, from bytes, as Python's `json.loads` decodes it (`json.detect_encoding`); without its BOM. */
export function decodeJsonBytes(b: Buffer): string {
  const [b0, b1, b2, b3] = [b[0], b[1], b[2], b[3]];
  let encoding: 'utf-8' | 'utf-16le' | 'utf-16be' | 'utf-32le' | 'utf-32be' = 'utf-8';
  let skip = 0;
  if ((b0 === 0 && b1 === 0 && b2 === 0xfe && b3 === 0xff) || (b0 === 0xff && b1 === 0xfe && b2 === 0 && b3 === 0)) {
    encoding = b0 === 0 ? 'utf-32be' : 'utf-32le';
    skip = 4;
  } else if ((b0 === 0xff && b1 === 0xfe) || (b0 === 0xfe && b1 === 0xff)) {
    encoding = b0 === 0xff ? 'utf-16le' : 'utf-16be';
    skip = 2;
  } else if (b0 === 0xef && b1 === 0xbb && b2 === 0xbf) {
    skip = 3;
  } else if (b.length >= 4) {
    if (b0 === 0) encoding = b1 ? 'utf-16be' : 'utf-32be';
    else if (b1 === 0) encoding = b2 || b3 ? 'utf-16le' : 'utf-32le';
  } else if (b.length === 2) {
    if (b0 === 0) encoding = 'utf-16be';
    else if (b1 === 0) encoding = 'utf-16le';
  }
  const rest = b.subarray(skip);
  if (encoding === 'utf-32le' || encoding === 'utf-32be') return decodeUtf32(rest, encoding === 'utf-32le');
  return new TextDecoder(encoding).decode(rest);
}

/** UTF-32 (which TextDecoder does not know): each 4-byte unit a code point, invalid ones U+FFFD. */
function decodeUtf32(b: Buffer, littleEndian: boolean): string {
  const parts: string[] = [];
  let chunk: number[] = [];
  for (let i = 0; i + 4 <= b.length; i += 4) {
    const cp = littleEndian ? b.readUInt32LE(i) : b.readUInt32BE(i);
    chunk.push(cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff) ? cp : 0xfffd);
    if (chunk.length === 8192) {
      parts.push(String.fromCodePoint(...chunk));
      chunk = [];
    }
  }
  parts.push(String.fromCodePoint(...chunk));
  return parts.join('');
}

/** A JSON text's string values read as HTML; when it is not strict JSON, every string literal in it and the text itself. */
function findInJsonText(text: string): RemoteReference | null {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    // Not JSON to JavaScript, but perhaps to the backend (Python accepts NaN and Infinity): read
    // every string literal, and the text as it is, so a malformed body cannot slip a reference past.
    return findRemoteReference(text) ?? findInStringLiterals(text);
  }
  return findInJson(doc);
}

/** Every JSON string literal in `text` (one linear pass), decoded and read as HTML. */
function findInStringLiterals(text: string): RemoteReference | null {
  const n = text.length;
  let i = text.indexOf('"');
  while (i !== -1 && i < n) {
    let j = i + 1;
    while (j < n && text[j] !== '"') j += text[j] === '\\' ? 2 : 1;
    const literal = text.slice(i, Math.min(j + 1, n));
    let value: unknown = null;
    // Markup needs a `<`, as itself or escaped: other literals are not decoded.
    if (literal.indexOf('<') !== -1 || /\\u003c/i.test(literal)) {
      try {
        value = JSON.parse(literal);
      } catch {
        // Not a literal Python would accept either.
      }
    }
    if (typeof value === 'string' && value.indexOf('<') !== -1) {
      const r = findRemoteReference(value);
      if (r) return r;
    }
    i = j + 1 < n ? text.indexOf('"', j + 1) : -1;
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
