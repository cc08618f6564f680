/**
 * IPv6 addresses that embed an IPv4 (common/ip.ts; docs/api.md "Client address, geo and rate
 * limit"): each form of one US address (198.18.1.7 in the fixture City database) is judged as
 * that IPv4 by geo (whatever GEO_UNKNOWN says), the anonymizer rule, the global rate limit's
 * buckets and the pending-body bound, and the decision log names the form.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { canonicalAddress, embeddedIpv4, EMBEDDED_FORMS, ipv6Groups, normalizeIp, type EmbeddedForm } from '../src/common/ip.ts';
import { GeoDatabase } from '../src/common/adapters/geoip.ts';
import { createGeoClassifier } from '../src/authz/stages/geo.ts';
import { createAnonymizerCheck } from '../src/authz/stages/anonymizer.ts';
import { clientKeys, clientOf } from '../src/ratelimit/bucket.ts';
import { decisionLine } from '../src/authz/decision-log.ts';
import type { AuthzInput } from '../src/authz/codec/request.ts';
import { ALLOW } from '../src/authz/decision.ts';
import { geoFixtures } from '../../testkit/geo-fixtures.ts';

const US = '198.18.1.7';
/** Every form of US (hex c612:0107). Teredo: server 65.54.227.120, flags 0x8000, port 40000 obfuscated, client ~c612:0107. */
const FORMS: Record<EmbeddedForm, string[]> = {
  '6to4': ['2002:c612:107::1', '2002:C612:0107:ffff:1:2:3:4'],
  nat64: ['64:ff9b::c612:107', '64:ff9b::198.18.1.7', '0064:ff9b:0:0:0:0:c612:0107'],
  'nat64-local': ['64:ff9b:1:c612:1:700::', '64:ff9b:1:c612:1:7ab:cdef:1'],
  siit: ['::ffff:0:c612:107', '::ffff:0:198.18.1.7', '0:0:0:0:ffff:0:c612:107'],
  teredo: ['2001:0:4136:e378:8000:63bf:39ed:fef8', '2001::39ed:fef8'],
};

describe('embedded IPv4: parsing', () => {
  for (const [form, addresses] of Object.entries(FORMS)) {
    test(`${form}: every spelling carries ${US}`, () => {
      for (const a of addresses) {
        assert.deepEqual(embeddedIpv4(normalizeIp(a)), { form, ipv4: US }, a);
        assert.equal(canonicalAddress(a), US, a);
      }
    });
  }

  test('not embedded: other IPv6, the u octet of a /48 NAT64 address set, other 64:ff9b prefixes, IPv4, garbage', () => {
    for (const a of ['2001:db8::1', '2600::1', '2001:1::1', '64:ff9b:1:c612:ff01:700::', '64:ff9b:2::1', '64:ff9b::1:0:0:c612:107', '::1', '::', '198.18.1.7', 'junk', '', '2002::1::2']) {
      assert.equal(embeddedIpv4(a), undefined, a);
    }
    assert.equal(canonicalAddress('2001:db8::1'), '2001:db8::1');
    assert.equal(canonicalAddress('::ffff:198.18.1.7'), US, 'IPv4-mapped too');
    assert.equal(canonicalAddress(' 2002:c612:107::1'), ' 2002:c612:107::1', 'not an address as given: unchanged (no trimming)');
  });

  test('property: every IPv4 round-trips through each form', () => {
    const hex = (n: number): string => n.toString(16);
    fc.assert(fc.property(fc.nat(0xffffffff), fc.nat(0xffff), (v4, junk) => {
      const [a, b, c, d] = [v4 >>> 24, (v4 >>> 16) & 255, (v4 >>> 8) & 255, v4 & 255];
      const want = `${a}.${b}.${c}.${d}`;
      const hi = v4 >>> 16;
      const lo = v4 & 0xffff;
      const forms: [EmbeddedForm, string][] = [
        ['6to4', `2002:${hex(hi)}:${hex(lo)}:${hex(junk)}::1`],
        ['nat64', `64:ff9b::${hex(hi)}:${hex(lo)}`],
        ['nat64-local', `64:ff9b:1:${hex(hi)}:${hex(c)}:${hex((d << 8) | (junk & 255))}::`],
        ['siit', `::ffff:0:${hex(hi)}:${hex(lo)}`],
        ['teredo', `2001:0:${hex(junk)}:1:0:0:${hex(hi ^ 0xffff)}:${hex(lo ^ 0xffff)}`],
      ];
      for (const [form, addr] of forms) assert.deepEqual(embeddedIpv4(addr), { form, ipv4: want }, addr);
    }), { numRuns: 500 });
  });

  test('ipv6Groups: zone ids dropped, bad groups refused', () => {
    assert.deepEqual(ipv6Groups('2002:c612:107::1%eth0'), [0x2002, 0xc612, 0x107, 0, 0, 0, 0, 1]);
    for (const bad of ['2002:xyz::1', '1:2:3:4:5:6:7:8:9', '::1.2.3', '12345::1']) assert.equal(ipv6Groups(bad), undefined, bad);
  });

  test('EMBEDDED_FORMS lists every form', () => {
    assert.deepEqual([...EMBEDDED_FORMS].sort(), Object.keys(FORMS).sort());
  });
});

describe('embedded IPv4: judged as the IPv4 everywhere', () => {
  const db = new GeoDatabase(geoFixtures().geoip2);
  after(() => db.close());
  const POLICY = { blockedCountries: new Set(['US']), blockedRegions: new Set<string>(), geoTrustedCidrs: ['127.0.0.0/8', '::1/128'] };

  for (const [form, addresses] of Object.entries(FORMS)) {
    test(`geo – ${form} of a US address is blocked with US blocked, whatever GEO_UNKNOWN says`, () => {
      for (const geoUnknown of ['allow', 'close-only', 'block'] as const) {
        const classify = createGeoClassifier({ ...POLICY, geoUnknown }, db);
        for (const a of addresses) assert.deepEqual([classify(a).verdict, classify(a).country], ['blocked_country', 'US'], `${a} GEO_UNKNOWN=${geoUnknown}`);
      }
    });

    test(`anonymizer – ${form} is looked up as its IPv4`, () => {
      const looked: string[] = [];
      const check = createAnonymizerCheck({ flagMask: 1, actions: { order: 'block', ingest: 'block', read: 'allow', geoblock: 'allow' } }, {
        flags: (ip) => { looked.push(ip); return ip === US ? 1 : 0; },
      });
      for (const a of addresses) assert.equal(check(a, 'order'), true, a);
      assert.deepEqual(new Set(looked), new Set([US]));
    });

    test(`rate limit – ${form} takes its IPv4's bucket (no prefix bucket), as the pending-body bound counts it`, () => {
      for (const a of addresses) {
        assert.deepEqual(clientKeys(48)(a), { client: US, prefix: undefined }, a);
        assert.equal(clientOf(a), US, a);
      }
    });

    test(`decision log – ${form} is named (embedded), the address is not`, () => {
      const input = { clientIp: addresses[0], requestId: 'r1', nonce: undefined } as unknown as AuthzInput;
      const line = decisionLine(input, ALLOW, 'read', 0.0001);
      assert.deepEqual([line.client, line.embedded], ['ipv6', form]);
      assert.ok(!JSON.stringify(line).includes(addresses[0]!) && !JSON.stringify(line).includes(US));
    });
  }

  test('trust is for the address as received: an embedded loopback is not trusted, looked up as 127.0.0.1 (KP in the fixture)', () => {
    const classify = createGeoClassifier({ ...POLICY, blockedCountries: new Set(['KP']), geoUnknown: 'allow' }, db);
    assert.equal(classify('127.0.0.1').verdict, 'trusted');
    assert.equal(classify('2002:7f00:1::1').verdict, 'blocked_country');
  });

  test('a plain IPv6 address has no `embedded` in its decision line', () => {
    const line = decisionLine({ clientIp: '2001:db8::1', requestId: 'r', nonce: undefined } as unknown as AuthzInput, ALLOW, 'read', 0);
    assert.equal('embedded' in line, false);
  });
});
