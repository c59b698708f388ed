// Preloaded (`node --import`) into the processes `npm start` and `npm run cluster` launch: their stdin
// is a pipe from the launcher, and when it closes (the launcher exited or was killed, even with
// SIGKILL) the process sends itself one SIGTERM, so it shuts down as on Ctrl-C instead of living on
// as an orphan holding its port.
let sent = false;
const stop = () => {
  if (sent) return;
  sent = true;
  process.kill(process.pid, 'SIGTERM');
};
process.stdin.on('data', () => {});
process.stdin.on('error', stop);
process.stdin.on('end', stop);
process.stdin.on('close', stop);
