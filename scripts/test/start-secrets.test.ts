/**
 * npm start's development secrets (scripts/start/secrets.ts) on their own: dev.env generated once
 * and reused, ingest keys from a stale shell refused (by fingerprint, never the key), dev.env kept
 * current with a documented rotation, and secrets moved out of the TS service's environment.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createRunDir, devSecrets, fingerprint, keepDevEnvCurrent, secretsToFiles, staleKeysProblem, withoutSecrets } from '../start/secrets.ts';

const dir = mkdtempSync(join(tmpdir(), 'start-secrets-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const OLD = `hex:${'11'.repeat(32)}`;
const NEW = `hex:${'22'.repeat(32)}`;
const OTHER = `hex:${'33'.repeat(32)}`;

test('dev secrets – dev.env is generated once (0600, only once the start is not refused), then reused', () => {
  const run = join(dir, 'run');
  const first = devSecrets(run);
  assert.notEqual(first.fresh, undefined);
  assert.match(first.values['EDGE_INGEST_HMAC'] ?? '', /^hex:[0-9a-f]{64}$/);
  assert.match(first.values['EDGE_FEED_ED25519_PUBLIC_KEY'] ?? '', /^[0-9a-f]{64}$/);
  createRunDir(run, first);
  assert.equal(statSync(join(run, 'dev.env')).mode & 0o777, 0o600);
  const again = devSecrets(run);
  assert.equal(again.fresh, undefined);
  assert.deepEqual(again.values, first.values);
});

const stale: Record<string, { env: Record<string, string>; file: Record<string, string>; refused: RegExp | undefined }> = {
  'no key in the environment (dev.env\'s is used)': { env: {}, file: { EDGE_INGEST_HMAC: OLD }, refused: undefined },
  'the same key': { env: { EDGE_INGEST_HMAC: OLD }, file: { EDGE_INGEST_HMAC: OLD }, refused: undefined },
  'rotation step 1: a new key, dev.env\'s as previous': { env: { EDGE_INGEST_HMAC: NEW, EDGE_INGEST_HMAC_PREVIOUS: OLD }, file: { EDGE_INGEST_HMAC: OLD }, refused: undefined },
  'rotation step 3: the same key, previous emptied': { env: { EDGE_INGEST_HMAC: NEW, EDGE_INGEST_HMAC_PREVIOUS: '' }, file: { EDGE_INGEST_HMAC: NEW, EDGE_INGEST_HMAC_PREVIOUS: OLD }, refused: undefined },
  'a stale shell: the old key after a rotation': { env: { EDGE_INGEST_HMAC: OLD }, file: { EDGE_INGEST_HMAC: NEW }, refused: /^EDGE_INGEST_HMAC in your environment \(sha256:[0-9a-f]{8}\) is not the key this stack last ran with/ },
  'a retired previous key': { env: { EDGE_INGEST_HMAC: NEW, EDGE_INGEST_HMAC_PREVIOUS: OTHER }, file: { EDGE_INGEST_HMAC: NEW, EDGE_INGEST_HMAC_PREVIOUS: OLD }, refused: /^EDGE_INGEST_HMAC_PREVIOUS in your environment \(sha256:[0-9a-f]{8}\) is not the previous key/ },
  'dev.env edited into something that is no key': { env: { EDGE_INGEST_HMAC: NEW }, file: { EDGE_INGEST_HMAC: 'hex:zz' }, refused: undefined },
};
for (const [name, tc] of Object.entries(stale)) {
  test(`dev secrets – stale ingest keys: ${name}`, () => {
    const msg = staleKeysProblem(tc.env, tc.file, "'./dev.env'");
    if (tc.refused === undefined) assert.equal(msg, undefined);
    else {
      assert.match(msg ?? '', tc.refused);
      for (const key of [OLD, NEW, OTHER]) assert.ok(!(msg ?? '').includes(key.slice(4, 20)), 'no key in the message');
    }
  });
}

test('dev secrets – a rotation from the environment rewrites dev.env and says so by fingerprint; nothing to do says nothing', () => {
  const run = join(dir, 'rotate');
  createRunDir(run, { values: {}, fresh: `EDGE_INGEST_HMAC=${OLD}\nEDGE_FEED_ED25519_PUBLIC_KEY=ab\n` });
  assert.equal(keepDevEnvCurrent({ EDGE_INGEST_HMAC: OLD }, run, 'dev.env'), undefined);
  const said = keepDevEnvCurrent({ EDGE_INGEST_HMAC: NEW, EDGE_INGEST_HMAC_PREVIOUS: OLD }, run, 'dev.env');
  assert.equal(said, `dev.env now holds the ingest HMAC key(s) this stack runs with (from your environment): `
    + `EDGE_INGEST_HMAC ${fingerprint('EDGE_INGEST_HMAC', NEW)}, EDGE_INGEST_HMAC_PREVIOUS ${fingerprint('EDGE_INGEST_HMAC_PREVIOUS', OLD)}`);
  assert.equal(readFileSync(join(run, 'dev.env'), 'utf8'), `EDGE_INGEST_HMAC=${NEW}\nEDGE_INGEST_HMAC_PREVIOUS=${OLD}\nEDGE_FEED_ED25519_PUBLIC_KEY=ab\n`);
});

test('dev secrets – secrets move to 0600 files named by *_FILE; the other children get none of them nor REDIS_URL', () => {
  const run = join(dir, 'files');
  const env: Record<string, string | undefined> = { EDGE_INGEST_HMAC: NEW, EDGE_INGEST_HMAC_PREVIOUS: '', EDGE_FEED_ED25519_KEY: 'seed', REDIS_URL: 'redis://x', EDGE_PORT: '8080' };
  secretsToFiles(env, run);
  const file = join(run, 'secrets', 'edge_ingest_hmac');
  assert.deepEqual(env, {
    EDGE_INGEST_HMAC_FILE: file, EDGE_INGEST_HMAC_PREVIOUS: '', EDGE_FEED_ED25519_KEY_FILE: join(run, 'secrets', 'edge_feed_ed25519_key'),
    REDIS_URL: 'redis://x', EDGE_PORT: '8080',
  });
  assert.equal(readFileSync(file, 'utf8'), `${NEW}\n`);
  assert.equal(statSync(file).mode & 0o777, 0o600);
  assert.deepEqual(withoutSecrets(env), { EDGE_PORT: '8080' });
});
