/**
 * ListenError: the one line start-up prints for a port it cannot listen on (the process tests
 * cover address-in-use through the real entry point; these cover the other causes).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import { listenAs, ListenError } from '../src/common/listen-error.ts';

const errno = (code: string): NodeJS.ErrnoException => Object.assign(new Error(`listen ${code}`), { code });

test('listen error: names the setting and the address (IPv6 in brackets) and says why in words', () => {
  assert.equal(new ListenError('MARKET_PORT', '::1', 80, errno('EACCES')).message, 'MARKET_PORT: cannot listen on [::1]:80: permission denied (a port below 1024 needs privileges)');
  assert.equal(new ListenError('AUTHZ_GRPC_PORT', '203.0.113.9', 9191, errno('EADDRNOTAVAIL')).message, "AUTHZ_GRPC_PORT: cannot listen on 203.0.113.9:9191: the address is not one of this host's");
  assert.equal(new ListenError('AUTHZ_ADMIN_PORT', '127.0.0.1', 9464, new Error('something else')).message, 'AUTHZ_ADMIN_PORT: cannot listen on 127.0.0.1:9464: something else');
  assert.equal(new ListenError('AUTHZ_GRPC_PORT', '0.0.0.0', 9191, new Error('No address added out of total 1 resolved: bind EADDRINUSE')).name, 'ListenError');
});

test('listen error: listenAs passes a successful listen through and names a real failure (an address that is not this host\'s)', async () => {
  const server = createServer();
  const listen = (host: string): Promise<number> => new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, () => resolve((server.address() as { port: number }).port));
  });
  assert.ok((await listenAs('MARKET_PORT', '127.0.0.1', 0, () => listen('127.0.0.1'))) > 0);
  server.close();
  const other = createServer();
  await assert.rejects(listenAs('MARKET_PORT', '203.0.113.9', 0, () => new Promise((resolve, reject) => {
    other.once('error', reject);
    other.listen(0, '203.0.113.9', () => resolve(0));
  })), /^ListenError: MARKET_PORT: cannot listen on 203\.0\.113\.9:0: the address is not one of this host's$/);
});
