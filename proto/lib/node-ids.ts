// The ids a node is known by in the sync protocol: its node id (`--node-id`) and its process's
// instance id. Both are keys of the control plane's cursors and appear in logs and the CLI, so they
// are plain: 1 to 128 characters of A-Z a-z 0-9 . _ : - (an instance id may be empty: nodes from
// before instance ids). Nothing in them can be cut short or read differently on the way into SQLite
// (a NUL ends a string there) or a log line.
export const NODE_ID_RE = /^[A-Za-z0-9._:-]{1,128}$/;
const INSTANCE_ID_RE = /^[A-Za-z0-9._:-]{0,128}$/;

export function isNodeId(s: string): boolean {
  return NODE_ID_RE.test(s);
}

export function isInstanceId(s: string): boolean {
  return INSTANCE_ID_RE.test(s);
}
