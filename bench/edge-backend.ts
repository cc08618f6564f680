/** Bench child: the demo mTLS order backend, recording nothing (a byte sink that answers 200). */
import { createOrderBackend } from '../scripts/dev/order-backend.ts';
import { serveParent } from './lib/serve-parent.ts';

const backend = createOrderBackend({ certFile: process.env['CERT'] ?? '', keyFile: process.env['KEY'] ?? '', clientCaFile: process.env['CLIENT_CA'] ?? '' });
const port = await backend.listen(Number(process.env['PORT'] ?? 0));
// Keep memory flat under load: drop the recorded deliveries as they come.
setInterval(() => { backend.deliveries.length = 0; }, 200).unref();
serveParent(port, { count: () => backend.deliveries.length }, () => backend.close());
