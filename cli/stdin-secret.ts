// Reads a secret (a leaked key value) from standard input rather than argv, so it never lands in shell
// history or a process list. Refuses a terminal with nothing piped: the value would echo on screen.
import { usageError } from './output.js';

/** More than one key value and its line ending; anything longer is not a key. */
const MAX_STDIN_BYTES = 4096;

export async function readKeyFromStdin(usage: string): Promise<string> {
  const stdin = process.stdin;
  if (stdin.isTTY) {
    throw usageError('key find reads the key value from standard input, and standard input is a terminal: pipe the value in, e.g. tollgate key find < leaked.txt', usage);
  }
  const chunks: Buffer[] = [];
  let size = 0;
  let tooLong = false;
  for await (const chunk of stdin as AsyncIterable<Buffer>) {
    chunks.push(chunk);
    size += chunk.length;
    // One line is all we need: stop at the first newline after some text, or at the cap.
    const text = Buffer.concat(chunks).toString('utf8');
    if (/\S[^\n]*\n/.test(text)) break;
    if (size > MAX_STDIN_BYTES) {
      tooLong = true;
      break;
    }
  }
  stdin.destroy();
  if (tooLong) throw usageError(`standard input is not one key value (more than ${MAX_STDIN_BYTES} bytes)`, usage);
  const line = Buffer.concat(chunks)
    .toString('utf8')
    .split(/\r?\n/)
    .map((l) => l.trim())
    .find((l) => l !== '');
  if (line === undefined) throw usageError('no key value on standard input: pipe it in, e.g. tollgate key find < leaked.txt', usage);
  return line;
}
