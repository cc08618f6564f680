/**
 * Issue 26: the admin port's one state-changing operation answers only its operator, and a seal
 * through it is kept on disk.
 * - the token (common/token.ts): read from a file, kept as a digest, compared in constant time;
 * - POST /admin/seal (admin.ts) on a real HTTP server from a loopback peer: refused 401 without the
 *   token, with a wrong one, another scheme, or when no token is configured (nothing sealed); the
 *   token seals; GET /metrics stays open;
 * - the seal marker (common/seal-file.ts): written durably (0600) and kept, read fail-closed.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { chmodSync, mkdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { tempDir } from '../../testkit/temp-dir.ts';
import { Writable } from 'node:stream';
import { Registry } from 'prom-client';
import { createAdminServer } from '../src/admin.ts';
import { ConfigError, configWarnings, loadConfig } from '../src/common/config.ts';
import { createLogger } from '../src/common/log.ts';
import { checkSealFileWritable, readSealFile, writeSealFile } from '../src/common/seal-file.ts';
import { readTokenFile, tokenCheck } from '../src/common/token.ts';
import { tokenFile } from './helpers.ts';

const dir = tempDir('edge-admin-test-');
after(() => rmSync(dir, { recursive: true, force: true }));

describe('admin token (AUTHZ_ADMIN_TOKEN_FILE, RATELIMIT_SERVICE_TOKEN_FILE)', () => {
  const TOKEN = 'a'.repeat(20) + randomBytes(16).toString('hex');
  const check = tokenCheck(createHash('sha256').update(TOKEN).digest());
  const cases: Record<string, [string | undefined, boolean]> = {
    'Bearer <token>': [`Bearer ${TOKEN}`, true],
    'the scheme in any case, spaces around': [`bearer  ${TOKEN} `, true],
    'no header': [undefined, false],
    'empty': ['', false],
    'the token without a scheme': [TOKEN, false],
    'another scheme': [`Basic ${TOKEN}`, false],
    'a prefix of the token': [`Bearer ${TOKEN.slice(0, -1)}`, false],
    'the token and more': [`Bearer ${TOKEN}0`, false],
    'the token twice': [`Bearer ${TOKEN} ${TOKEN}`, false],
    'Bearer alone': ['Bearer ', false],
  };
  for (const [name, [header, ok]] of Object.entries(cases)) {
    test(`token – ${name}: ${ok ? 'accepted' : 'refused'}`, () => assert.equal(check.accepts(header), ok));
  }

  test('token file – one trailing newline removed; missing, short, or with spaces/control characters: refused at start naming the setting', () => {
    const t = tokenFile();
    try {
      assert.equal(readTokenFile('AUTHZ_ADMIN_TOKEN_FILE', t.file).accepts(`Bearer ${t.token}`), true);
      writeFileSync(t.file, `${t.token}\r\n`);
      assert.equal(readTokenFile('AUTHZ_ADMIN_TOKEN_FILE', t.file).accepts(`Bearer ${t.token}`), true);
      const refused = (content: string | undefined, re: RegExp): void => {
        const f = join(t.dir, `bad-${randomBytes(4).toString('hex')}`);
        if (content !== undefined) writeFileSync(f, content);
        assert.throws(() => readTokenFile('RATELIMIT_SERVICE_TOKEN_FILE', f), (err: unknown) => {
          assert.ok(err instanceof ConfigError);
          assert.equal(err.variable, 'RATELIMIT_SERVICE_TOKEN_FILE');
          assert.match(err.message, re);
          return true;
        });
      };
      refused(undefined, /a readable file holding the token.*ENOENT/);
      refused('', /at least 32 visible ASCII characters/);
      refused('x'.repeat(31), /at least 32/);
      refused(`${'x'.repeat(20)} ${'y'.repeat(20)}`, /visible ASCII/);
      refused(`${'x'.repeat(40)}\n\n`, /visible ASCII/);
    } finally {
      t.remove();
    }
  });

  test('settings – AUTHZ_ADMIN_TOKEN_FILE needs AUTHZ_SEAL_FILE (an admin seal must outlive a restart); RATELIMIT_SERVICE_TOKEN_FILE needs RATELIMIT_SERVICE_ADDRESS', () => {
    assert.throws(() => loadConfig({ AUTHZ_ADMIN_TOKEN_FILE: '/x' }), /^ConfigError: AUTHZ_SEAL_FILE: expected a file path when AUTHZ_ADMIN_TOKEN_FILE is set/);
    const c = loadConfig({ AUTHZ_ADMIN_TOKEN_FILE: '/x', AUTHZ_SEAL_FILE: '/run/edge/sealed' });
    assert.deepEqual([c.adminTokenFile, c.sealFile], ['/x', '/run/edge/sealed']);
    assert.deepEqual([loadConfig({}).adminTokenFile, loadConfig({}).sealFile, loadConfig({}).rateLimitTokenFile], [undefined, undefined, undefined]);
    assert.throws(() => loadConfig({ RATELIMIT_SERVICE_TOKEN_FILE: '/x' }), /RATELIMIT_SERVICE_TOKEN_FILE: expected to be set only with RATELIMIT_SERVICE_ADDRESS/);
    assert.equal(loadConfig({ RATELIMIT_SERVICE_ADDRESS: '127.0.0.1:9191', RATELIMIT_SERVICE_TOKEN_FILE: '/x' }).rateLimitTokenFile, '/x');
    // An address without the token: said at start, since the service then serves no RateLimitService.
    const warned = (env: Record<string, string>): string[] => configWarnings(loadConfig(env)).filter((w) => w.startsWith('RATELIMIT_SERVICE_ADDRESS='));
    assert.match(warned({ RATELIMIT_SERVICE_ADDRESS: '127.0.0.1:9191' })[0] ?? '', /without RATELIMIT_SERVICE_TOKEN_FILE: this service serves no RateLimitService/);
    assert.deepEqual(warned({ RATELIMIT_SERVICE_ADDRESS: '127.0.0.1:9191', RATELIMIT_SERVICE_TOKEN_FILE: '/x' }), []);
  });
});

describe('POST /admin/seal from a loopback peer (issue 26)', () => {
  const t = tokenFile();
  const logs: string[] = [];
  const logger = createLogger('info', new Writable({ write(c, _e, cb) { logs.push(String(c)); cb(); } }));
  const seals: string[] = [];
  const registry = new Registry();
  const start = async (withToken: boolean): Promise<{ url: string; close: () => Promise<void> }> => {
    const server = createAdminServer({
      registry, logger, token: withToken ? readTokenFile('AUTHZ_ADMIN_TOKEN_FILE', t.file) : undefined,
      seal: (reason) => { seals.push(reason); return { persistent: true }; },
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, close: () => new Promise((resolve) => server.close(() => resolve())) };
  };
  let admin: { url: string; close: () => Promise<void> };
  before(async () => { admin = await start(true); });
  after(async () => {
    await admin.close();
    t.remove();
  });

  const seal = (headers: Record<string, string> = {}, url = admin.url): Promise<Response> => fetch(`${url}/admin/seal`, { method: 'POST', headers });

  test('no authorization, a wrong token, another scheme, the token in another header: 401 unauthorized JSON, WWW-Authenticate: Bearer, nothing sealed', async () => {
    for (const headers of [{}, { authorization: `Bearer ${'0'.repeat(64)}` }, { authorization: `Basic ${t.token}` }, { authorization: t.token }, { 'x-admin-token': t.token }] as Record<string, string>[]) {
      const r = await seal(headers);
      assert.equal(r.status, 401, JSON.stringify(headers));
      assert.equal(r.headers.get('www-authenticate'), 'Bearer');
      assert.equal(r.headers.get('content-type'), 'application/json');
      const body = (await r.json()) as { error: string; message: string };
      assert.equal(body.error, 'unauthorized');
      assert.ok(!JSON.stringify(body).includes(t.token), 'the answer never echoes a token');
    }
    assert.deepEqual(seals, []);
    const refusals = logs.filter((l) => l.includes('POST /admin/seal refused'));
    assert.equal(refusals.length, 1, 'refusals are logged, at most once per 10 s');
    assert.ok(!logs.join('').includes(t.token), 'no token in the log');
  });

  test('the token: 202 {"status":"sealing","persistent":true}, sealed once with reason admin', async () => {
    const r = await seal({ authorization: `Bearer ${t.token}` });
    assert.equal(r.status, 202);
    assert.deepEqual(await r.json(), { status: 'sealing', persistent: true });
    assert.deepEqual(seals, ['admin']);
  });

  test('GET /metrics stays open (no token); GET /admin/seal is 405; another path 404', async () => {
    assert.equal((await fetch(`${admin.url}/metrics`)).status, 200);
    assert.equal((await fetch(`${admin.url}/admin/seal`)).status, 405);
    assert.equal((await fetch(`${admin.url}/admin/unseal`, { method: 'POST' })).status, 404);
  });

  test('no AUTHZ_ADMIN_TOKEN_FILE: POST /admin/seal is refused to everyone, the right token included', async () => {
    const off = await start(false);
    try {
      const before = seals.length;
      const r = await seal({ authorization: `Bearer ${t.token}` }, off.url);
      assert.equal(r.status, 401);
      assert.match(((await r.json()) as { message: string }).message, /AUTHZ_ADMIN_TOKEN_FILE is not set/);
      assert.equal(seals.length, before);
    } finally {
      await off.close();
    }
  });
});

describe('seal marker (AUTHZ_SEAL_FILE)', () => {
  test('written 0600 with when, why and which process; a second seal keeps the first record; read back', () => {
    const file = join(dir, 'sealed');
    assert.equal(readSealFile(file), undefined, 'none yet');
    writeSealFile(file, { sealedAt: '2026-11-26T10:00:00.000Z', reason: 'admin', pid: 42 });
    assert.equal(statSync(file).mode & 0o777, 0o600);
    writeSealFile(file, { sealedAt: '2026-11-26T11:00:00.000Z', reason: 'admin', pid: 43 });
    assert.deepEqual(readSealFile(file), { record: { sealedAt: '2026-11-26T10:00:00.000Z', reason: 'admin', pid: 42 } });
    assert.deepEqual(JSON.parse(readFileSync(file, 'utf8')), { sealedAt: '2026-11-26T10:00:00.000Z', reason: 'admin', pid: 42 });
  });

  test('fail closed: an empty file, garbage, a directory, a dangling symlink all seal (no record); only an absent path does not', () => {
    const sub = join(dir, 'odd');
    mkdirSync(sub);
    writeFileSync(join(sub, 'empty'), '');
    writeFileSync(join(sub, 'garbage'), 'not json');
    mkdirSync(join(sub, 'dir'));
    symlinkSync(join(sub, 'nowhere'), join(sub, 'dangling'));
    for (const name of ['empty', 'garbage', 'dir', 'dangling']) assert.deepEqual(readSealFile(join(sub, name)), { record: undefined }, name);
    assert.equal(readSealFile(join(sub, 'absent')), undefined);
  });

  test('checked at start: a directory that does not exist or cannot be written stops start-up naming AUTHZ_SEAL_FILE', () => {
    assert.throws(() => checkSealFileWritable(join(dir, 'missing', 'sealed')), /AUTHZ_SEAL_FILE: expected a path in an existing directory this process can write.*ENOENT/);
    checkSealFileWritable(join(dir, 'sealed'));
    if (process.getuid?.() !== 0) {
      const ro = join(dir, 'ro');
      mkdirSync(ro);
      chmodSync(ro, 0o500);
      assert.throws(() => checkSealFileWritable(join(ro, 'sealed')), /AUTHZ_SEAL_FILE.*EACCES/);
    }
  });
});
