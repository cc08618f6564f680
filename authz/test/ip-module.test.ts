/**
 * The one `ip` module (common/ip.ts), property-tested against node:net (isIP, SocketAddress,
 * BlockList), and its users checked to agree on the same inputs: geo's lookup key, the anonymizer's,
 * the global rate limit's keys (from x-edge-client-ip in a Check, and from Envoy's descriptors in
 * the rate limit service), the pending-body bound's client, and the rule header_mutation applies to
 * the address Envoy prints (envoy/render/client-address.ts, ahead of the XFF guard and both limiters).
 * Envoy prints addresses with inet_ntop, as node:net's SocketAddress does, so SocketAddress stands
 * for Envoy's spelling here (e2e/xff.test.ts and e2e/embedded-ipv4.test.ts run the real one).
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { BlockList, isIP, SocketAddress } from 'node:net';
import fc from 'fast-check';
import { canonicalAddress, cidrMatcher, embeddedIpv4, ipv4ToInt, ipv6Groups, MAPPED_PREFIX, mappedIpv4, normalizeIp, prefixOf } from '../src/common/ip.ts';
import { createGeoClassifier } from '../src/authz/stages/geo.ts';
import { createAnonymizerCheck } from '../src/authz/stages/anonymizer.ts';
import { clientKeys, clientOf, descriptorKeys, descriptorPrefix, type Entry } from '../src/ratelimit/bucket.ts';
import { RATE_LIMIT } from '../src/common/contract.ts';
import { V4_MAPPED_AS_V4 } from '../../envoy/render/client-address.ts';

const RUNS = { numRuns: 400 };
const hex = (g: number): string => g.toString(16);
const dotted = (n: number): string => `${n >>> 24}.${(n >>> 16) & 255}.${(n >>> 8) & 255}.${n & 255}`;
/** How Envoy (inet_ntop) and node:net print an IPv6 address. */
const printed = (v6: string): string => SocketAddress.parse(`[${v6}]:1`)!.address;

const word = fc.nat(0xffff);
const words = (n: number): fc.Arbitrary<number[]> => fc.array(word, { minLength: n, maxLength: n });
const v4int = fc.nat(0xffffffff);
/** IPv6 groups: random, zero-heavy (every `::` placement), IPv4-mapped and each embedded form. */
const groupsArb: fc.Arbitrary<number[]> = fc.oneof(
  words(8),
  fc.array(fc.oneof(fc.constant(0), fc.constant(0), word), { minLength: 8, maxLength: 8 }),
  words(2).map(([a, b]) => [0, 0, 0, 0, 0, 0xffff, a!, b!]),
  words(7).map(([a, ...r]) => [0x2002, a!, ...r]),
  words(2).map(([a, b]) => [0x64, 0xff9b, 0, 0, 0, 0, a!, b!]),
  words(2).map(([a, b]) => [0, 0, 0, 0, 0xffff, 0, a!, b!]),
  words(6).map((r) => [0x2001, 0, ...r]),
);
/** One spelling of an address's groups: each one isIP accepts. */
function spell(g: readonly number[], style: number): string {
  const full = g.map(hex).join(':');
  switch (style) {
    case 0: return full;
    case 1: return g.map((x) => hex(x).padStart(4, '0').toUpperCase()).join(':');
    case 2: return printed(full);
    case 3: return `${g.slice(0, 6).map(hex).join(':')}:${dotted(((g[6]! << 16) | g[7]!) >>> 0)}`;
    default: {
      // The first run of zero groups (not necessarily the longest) as `::`.
      const i = g.indexOf(0);
      if (i === -1) return full;
      let j = i;
      while (j < 8 && g[j] === 0) j++;
      return `${g.slice(0, i).map(hex).join(':')}::${g.slice(j).map(hex).join(':')}`;
    }
  }
}
const spelled = fc.tuple(groupsArb, fc.nat(4)).map(([g, style]) => ({ g, s: spell(g, style) }));

describe('ip module against node:net', () => {
  test('every spelling of an IPv6 address is one node:net accepts, and ipv6Groups reads the groups node:net reads', () => {
    fc.assert(fc.property(spelled, ({ g, s }) => {
      assert.equal(isIP(s), 6, s);
      assert.deepEqual(ipv6Groups(s), g, s);
      assert.equal(printed(s), printed(g.map(hex).join(':')), s);
    }), RUNS);
  });

  test('normalizeIp: an address exactly when isIP says so, for any text of address characters (long ones too)', () => {
    const chars = fc.constantFrom(...'0123456789abcdefABCDEF:.:::..xg/');
    fc.assert(fc.property(fc.oneof(fc.string({ unit: chars, maxLength: 48, size: 'max' }), fc.string({ maxLength: 48, size: 'max' })), (s) => {
      fc.pre(!/[\s[\]%]/.test(s));
      assert.equal(normalizeIp(s) !== '', isIP(s) !== 0, JSON.stringify(s));
      if (isIP(s) === 4) assert.equal(normalizeIp(s), s);
    }), { numRuns: 2000 });
  });

  test('normalizeIp: every spelling of an IPv4-mapped address is its IPv4 (node:net prints it ::ffff:a.b.c.d), any other IPv6 address stays the same address', () => {
    fc.assert(fc.property(spelled, ({ g, s }) => {
      const n = normalizeIp(s);
      const p = printed(s);
      if (mappedIpv4(g) !== undefined) {
        assert.equal(`${MAPPED_PREFIX}${n}`, p, s);
        assert.equal(isIP(n), 4);
      } else {
        assert.equal(isIP(n), 6, s);
        assert.equal(printed(n), p, s);
      }
      assert.equal(normalizeIp(` [${s}%eth0] `), n, 'brackets, a zone id and blanks removed');
    }), RUNS);
  });

  test('prefixOf: the masked address as Envoy prints it, holding exactly the addresses BlockList puts in that subnet', () => {
    const sibling = fc.tuple(groupsArb, words(8), fc.nat(8)).map(([g, r, k]) => ({ g, other: [...g.slice(0, k), ...r.slice(k)] }));
    fc.assert(fc.property(sibling, fc.integer({ min: 32, max: 64 }), ({ g, other }, length) => {
      const p = prefixOf(g, length);
      const [address = '', bits] = p.split('/');
      assert.equal(bits, String(length));
      assert.equal(printed(address), address, `${p} is in inet_ntop's form`);
      const subnet = new BlockList();
      subnet.addSubnet(address, length, 'ipv6');
      assert.equal(subnet.check(g.map(hex).join(':'), 'ipv6'), true, p);
      assert.equal(prefixOf(other, length) === p, subnet.check(other.map(hex).join(':'), 'ipv6'), `${other.map(hex).join(':')} vs ${p}`);
    }), RUNS);
  });

  // For an address of one family, the blocks of that family (BlockList would also match an IPv4
  // address against an IPv6 block through ::ffff:0:0/96; cidrMatcher does not, and an
  // IPv4-mapped client has been made its IPv4 by normalizeIp before it is matched).
  test('cidrMatcher agrees with BlockList for IPv4 and IPv6 blocks of every length', () => {
    const v4Block = fc.tuple(v4int, fc.integer({ min: 0, max: 32 })).map(([n, len]) => `${dotted(n)}/${len}`);
    const v6Block = fc.tuple(groupsArb, fc.integer({ min: 0, max: 128 })).map(([g, len]) => `${g.map(hex).join(':')}/${len}`);
    const near = (blocks: string[], r: number, flip: number): string => {
      // An address inside or just outside one of the blocks (a random low bit flipped).
      const [net = '0.0.0.0', len = '0'] = blocks[r % blocks.length]!.split('/');
      if (isIP(net) === 4) return dotted((ipv4ToInt(net) ^ (2 ** (flip % 32))) >>> 0);
      const g = ipv6Groups(net)!;
      const bit = Math.max(0, 128 - Number(len) - 1 + (flip % 3)) % 128;
      const i = 7 - Math.floor(bit / 16);
      g[i] = g[i]! ^ (1 << (bit % 16));
      return g.map(hex).join(':');
    };
    fc.assert(fc.property(fc.array(fc.oneof(v4Block, v6Block), { minLength: 1, maxLength: 4 }), fc.nat(), fc.nat(), v4int, (blocks, r, flip, any) => {
      const match = cidrMatcher(blocks);
      for (const a of [near(blocks, r, flip), dotted(any)]) {
        const family = isIP(a);
        const list = new BlockList();
        for (const b of blocks) {
          const [net = '', len = ''] = b.split('/');
          if (isIP(net) === family) list.addSubnet(net, Number(len), family === 4 ? 'ipv4' : 'ipv6');
        }
        assert.equal(match(a, family), list.check(a, family === 4 ? 'ipv4' : 'ipv6'), `${a} in ${blocks.join(',')}`);
      }
    }), RUNS);
  });
});

/** The rule header_mutation applies to x-edge-client-ip (V4_MAPPED_AS_V4's CEL, in JS). */
function envoyClientHeader(p: string): string {
  return p.startsWith(MAPPED_PREFIX) && p.includes('.') ? p.substring(MAPPED_PREFIX.length) : p;
}

describe('geo, the anonymizer, both rate limits, the pending-body bound and Envoy\'s client-address rule agree', () => {
  test('the rendered header rule strips exactly MAPPED_PREFIX', () => {
    assert.ok(V4_MAPPED_AS_V4.includes(`startsWith('${MAPPED_PREFIX}')`) && V4_MAPPED_AS_V4.includes(`.contains('.')`));
    assert.ok(V4_MAPPED_AS_V4.includes(`substring(${MAPPED_PREFIX.length})`));
  });

  let looked = '';
  const geo = createGeoClassifier({ blockedCountries: new Set(), blockedRegions: new Set(), geoUnknown: 'allow', geoTrustedCidrs: [] }, {
    lookup: (ip) => { looked = ip; return null; },
  });
  const geoKey = (a: string): string => { looked = '<none>'; geo(a); return looked; };
  let flagged = '';
  const anonymizer = createAnonymizerCheck({ flagMask: 1, actions: { order: 'block', ingest: 'block', read: 'allow', geoblock: 'allow' } }, {
    flags: (ip) => { flagged = ip; return 0; },
  });
  const anonymizerKey = (a: string): string => { flagged = '<none>'; anonymizer(a, 'order'); return flagged; };
  const keys48 = clientKeys(48);
  const keys64 = clientKeys(64);
  /** The descriptors Envoy builds for an address it printed as `p` (envoy/render/rate-limit.ts clientRateLimits). */
  const descriptors = (p: string): { client: Entry[]; prefix: Entry[] | undefined } => {
    const header = envoyClientHeader(p);
    if (!header.includes(':')) return { client: [{ key: RATE_LIMIT.familyKey, value: RATE_LIMIT.v4 }, { key: RATE_LIMIT.v4AddressKey, value: header }], prefix: undefined };
    const g = ipv6Groups(p)!;
    return {
      client: [{ key: RATE_LIMIT.familyKey, value: RATE_LIMIT.v6 }, { key: RATE_LIMIT.v6AddressKey, value: prefixOf(g, 64) }],
      prefix: [{ key: RATE_LIMIT.prefixKey, value: RATE_LIMIT.v6 }, { key: RATE_LIMIT.v6AddressKey, value: prefixOf(g, 48) }],
    };
  };

  const address = fc.oneof(spelled.map(({ s }) => s), v4int.map(dotted));
  test('on every address: one lookup key, the bucket keys derived from it, and Envoy\'s descriptors the same keys but for embedded forms (its /64: docs/api.md)', () => {
    fc.assert(fc.property(address, (a) => {
      const key = geoKey(a);
      assert.equal(key, canonicalAddress(normalizeIp(a)), a);
      assert.equal(anonymizerKey(a), key, a);
      const k = keys48(a)!;
      if (isIP(key) === 4) {
        assert.deepEqual(k, { client: key, prefix: undefined }, a);
      } else {
        const g = ipv6Groups(key)!;
        assert.deepEqual(k, { client: prefixOf(g, 64), prefix: prefixOf(g, 48) }, a);
      }
      assert.deepEqual(keys64(a), { client: k.client, prefix: undefined }, a);
      assert.equal(clientOf(a), k.client, `${a}: the pending-body bound counts the bucket's client`);

      // Envoy's side: the address as Envoy prints it, the header it writes, its descriptors.
      const p = isIP(a) === 4 ? a : printed(a);
      const header = envoyClientHeader(p);
      const h = geoKey(header);
      assert.equal(isIP(h) === 4 ? h : printed(h), isIP(key) === 4 ? key : printed(key), `${a}: the header Envoy writes is judged as the address`);
      assert.deepEqual(keys48(header), k, `${a}: and counted as it`);
      const d = descriptors(p);
      const fromEnvoy = descriptorKeys(d.client, 48);
      const embedded = isIP(key) === 4 && normalizeIp(a).includes(':') ? embeddedIpv4(normalizeIp(a)) : undefined;
      if (embedded === undefined) {
        assert.deepEqual(fromEnvoy, k, `${a}: Envoy's descriptors name the buckets the Check takes`);
        assert.equal(descriptorPrefix(d.prefix ?? [], 48), k.prefix, a);
      } else {
        // masked_remote_address cannot extract an embedded IPv4: the address's own /64 and prefix.
        const g = ipv6Groups(p)!;
        assert.deepEqual(fromEnvoy, { client: prefixOf(g, 64), prefix: prefixOf(g, 48) }, a);
      }
    }), { numRuns: 1000 });
  });
});
