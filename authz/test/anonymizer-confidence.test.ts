/**
 * ANONYMIZER_MIN_CONFIDENCE and GeoIP Anonymous Plus (docs/api.md "Anonymizers"): which flagged
 * addresses count, the databases it accepts, and the provider name in the decision log, on the
 * Anonymous Plus-layout test database (testkit/fixtures/make-anonymizer-mmdb.py: 192.0.2.64/28 a VPN with
 * anonymizer_confidence 30 and provider_name "foo", 192.0.2.48/28 a residential proxy with 99).
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { AnonymizerDatabase } from '../src/common/adapters/anonymizer.ts';
import { GeoDatabase } from '../src/common/adapters/geoip.ts';
import { ConfigError, KNOWN_SETTINGS, loadConfig } from '../src/common/config.ts';
import { anonymizerFixtures } from '../../testkit/anonymizer-fixtures.ts';
import { geoFixtures } from '../../testkit/geo-fixtures.ts';
import { startFixture } from './server-fixture.ts';
import { fakeMarkets } from './helpers.ts';

const fx = anonymizerFixtures();
const opened: { close(): void }[] = [];
after(() => { for (const d of opened) d.close(); });
const open = (path: string, minConfidence?: number): AnonymizerDatabase => {
  const d = new AnonymizerDatabase(path, { minConfidence });
  opened.push(d);
  return d;
};
const VPN_30 = '192.0.2.65';
const RESIDENTIAL_99 = '192.0.2.49';

test('ANONYMIZER_MIN_CONFIDENCE: an integer 1–99, only with ANONYMIZER_DB; unset counts any confidence', () => {
  assert.ok(KNOWN_SETTINGS.has('ANONYMIZER_MIN_CONFIDENCE'));
  assert.equal(loadConfig({ ANONYMIZER_DB: '/x', ANONYMIZER_MIN_CONFIDENCE: '50' }).anonymizer?.minConfidence, 50);
  assert.equal(loadConfig({ ANONYMIZER_DB: '/x' }).anonymizer?.minConfidence, undefined);
  for (const bad of ['0', '100', '50.5', 'high', '-1']) {
    assert.throws(() => loadConfig({ ANONYMIZER_DB: '/x', ANONYMIZER_MIN_CONFIDENCE: bad }), (e: unknown) => e instanceof ConfigError && /ANONYMIZER_MIN_CONFIDENCE/.test(e.message), bad);
  }
  assert.throws(() => loadConfig({ ANONYMIZER_MIN_CONFIDENCE: '50' }), /ANONYMIZER_MIN_CONFIDENCE.*only with ANONYMIZER_DB/);
});

test('Anonymous Plus: a flagged record below ANONYMIZER_MIN_CONFIDENCE does not count, one at or above it does; unset, both count', () => {
  const any = open(fx.anonymizerPlus);
  assert.notEqual(any.flags(VPN_30), 0);
  assert.notEqual(any.flags(RESIDENTIAL_99), 0);
  const min50 = open(fx.anonymizerPlus, 50);
  assert.equal(min50.flags(VPN_30), 0, 'confidence 30 < 50');
  assert.notEqual(min50.flags(RESIDENTIAL_99), 0, 'confidence 99 ≥ 50');
  const min30 = open(fx.anonymizerPlus, 30);
  assert.notEqual(min30.flags(VPN_30), 0, 'the threshold itself counts');
  assert.equal(any.provider(VPN_30), 'foo');
  assert.equal(any.provider(RESIDENTIAL_99), undefined, 'no provider_name in that record');
  assert.equal(any.provider('192.0.2.1'), undefined, 'no record');
});

test('ANONYMIZER_MIN_CONFIDENCE with a database without confidences (GeoIP2 Anonymous IP) is refused, naming the setting and its type', () => {
  assert.throws(() => open(fx.anonymizer, 50), /ANONYMIZER_DB.*GeoIP Anonymous Plus.*ANONYMIZER_MIN_CONFIDENCE=50.*GeoIP2-Anonymous-IP/);
  assert.doesNotThrow(() => open(fx.anonymizer));
});

test('an Anonymous Plus file whose anonymizer_confidence is outside 1–99, or whose provider_name is not a string, is refused naming the field and the network', () => {
  assert.throws(() => open(fx.anonymizerPlusBadConfidence), /ANONYMIZER_DB.*anonymizer_confidence an integer from 1 to 99.*anonymizer_confidence = 0 for 192\.0\.2\.64\/28/);
  assert.throws(() => open(fx.anonymizerPlusBadProvider), /ANONYMIZER_DB.*provider_name a string.*number for 192\.0\.2\.64\/28/);
});

test('the decision log names the anonymizer\'s provider on its denial (over gRPC, the real core); a record without one has no field, and under the threshold it is not denied', async () => {
  const geo = new GeoDatabase(geoFixtures().geoip2);
  opened.push(geo);
  const env = { ANONYMIZER_DB: fx.anonymizerPlus, ANONYMIZER_FLAGS: 'is_anonymous_vpn,is_residential_proxy', ANONYMIZER_POLICY: 'read=block', GEO_TRUSTED_CIDRS: '', LOG_DECISIONS: 'denials' };
  const decisions = (logs: string[]): Record<string, unknown>[] => logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l['msg'] === 'decision');
  for (const [min, expectVpn] of [[undefined, 451], ['50', 200]] as const) {
    const f = await startFixture({ env: min === undefined ? env : { ...env, ANONYMIZER_MIN_CONFIDENCE: min }, geo, anonymizer: open(fx.anonymizerPlus, min === undefined ? undefined : Number(min)), markets: fakeMarkets([]), nonces: 'memory' });
    try {
      const vpn = await f.check({ headers: { 'x-edge-client-ip': VPN_30 }, contextExtensions: { route: 'read' } });
      const resi = await f.check({ headers: { 'x-edge-client-ip': RESIDENTIAL_99 }, contextExtensions: { route: 'read' } });
      // The 6to4 form of the VPN address is judged (and named) as the IPv4 it carries.
      const sixToFour = await f.check({ headers: { 'x-edge-client-ip': '2002:c000:241::1' }, contextExtensions: { route: 'read' } });
      assert.deepEqual([vpn.status, resi.status, sixToFour.status], [expectVpn, 451, expectVpn]);
      const lines = decisions(f.logs);
      const denied = lines.filter((l) => l['reason'] === 'restricted_jurisdiction:anonymizer');
      assert.deepEqual(denied.map((l) => l['anonymizerProvider'] ?? null), min === undefined ? ['foo', null, 'foo'] : [null]);
    } finally {
      await f.close();
    }
  }
});
