import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BlockList } from 'node:net';
import fc from 'fast-check';
import { createGeoClassifier } from '../src/authz/stages/geo.ts';

const ipv4 = fc.tuple(fc.nat(255), fc.nat(255), fc.nat(255), fc.nat(255)).map((t) => t.join('.'));

test('geo trusted CIDRs – the integer IPv4 matcher agrees with node:net BlockList for any prefix /0../32', () => {
  fc.assert(
    fc.property(fc.array(fc.tuple(ipv4, fc.nat(32)), { minLength: 1, maxLength: 4 }), fc.array(ipv4, { minLength: 1, maxLength: 20 }), (cidrs, ips) => {
      const list = new BlockList();
      for (const [net, bits] of cidrs) list.addSubnet(net, bits, 'ipv4');
      const classify = createGeoClassifier(
        { blockedCountries: new Set(['KP']), blockedRegions: new Set(), geoUnknown: 'block', geoTrustedCidrs: cidrs.map(([n, b]) => `${n}/${b}`) },
        { lookup: () => ({ country: 'KP', regions: [] }) },
      );
      for (const ip of ips) assert.equal(classify(ip).verdict === 'trusted', list.check(ip, 'ipv4'), `${ip} in ${JSON.stringify(cidrs)}`);
    }),
    { numRuns: 300 },
  );
});
