// Runs the demo tool backends as one process (started by `npm start`): the MCP server and the demo
// backend of the other tool families, on free loopback ports. Prints one line per backend:
//   demo backend mcp listening on http://127.0.0.1:PORT
//   demo backend tools listening on http://127.0.0.1:PORT
import { startDemoMcpServer } from './mcp-server.js';
import { startDemoToolBackend } from './tool-backend.js';

async function main(): Promise<void> {
  const host = process.env.TOLLGATE_DEMO_BACKENDS_HOST ?? '127.0.0.1';
  const [mcp, tools] = await Promise.all([startDemoMcpServer(host, 0), startDemoToolBackend(host, 0)]);
  console.log(`demo backend mcp listening on ${mcp.url}`);
  console.log(`demo backend tools listening on ${tools.url}`);
  const stop = () => {
    Promise.allSettled([mcp.close(), tools.close()]).finally(() => process.exit(0));
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}

main().catch((err: Error) => {
  console.error(`demo backends failed: ${err.message}`);
  process.exit(1);
});
