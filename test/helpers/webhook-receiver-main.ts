// A webhook destination as its own process (for tests whose own event loop blocks on a CLI call):
// prints `webhook receiver listening on URL` and answers 204 to every request.
import { startWebhookReceiver } from './webhook-receiver.js';

const recv = await startWebhookReceiver(process.env.WEBHOOK_SECRET);
console.log(`webhook receiver listening on ${recv.url}`);
process.on('SIGTERM', () => void recv.close().then(() => process.exit(0)));
