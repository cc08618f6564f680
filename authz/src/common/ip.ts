/**
 * The client address, parsed one way for everything that judges or counts it: geo, the anonymizer
 * rule, the global rate limit's buckets (ratelimit/bucket.ts), the per-client bound on pending
 * bodies, the decision log and GET /v1/geoblock (docs/api.md "Client address, geo and rate limit").
 *
 * - normalizeIp: brackets, a zone id and surrounding blanks removed; every RFC 4291 spelling of an
 *   IPv4-mapped address (`::ffff:a.b.c.d`, `::ffff:102:304`, `0:0:0:0:0:ffff:…`) is its IPv4 (the
 *   same socket address); '' when not an IP address. Trusted CIDRs are matched against this.
 * - embeddedIpv4: an IPv6 address that carries an IPv4 in a standard translation form, and which
 *   form, so it is judged as the IPv4 (issue: such addresses have no GeoIP record of their own and
 *   would fall to GEO_UNKNOWN):
 *     6to4        2002::/16 (RFC 3056): bits 16–47 are the IPv4 (`2002:c612:7:…` → 198.18.0.7);
 *     nat64       64:ff9b::/96 (RFC 6052 well-known prefix): the last 32 bits;
 *     nat64-local 64:ff9b:1::/48 (RFC 8215 local-use prefix) read with RFC 6052 §2.2's /48 layout,
 *                 the prefix's own length: bits 48–63 are the IPv4's first 16 bits, bits 64–71 the
 *                 "u" octet (must be zero, else not an embedding), bits 72–87 its last 16 bits, the
 *                 rest a suffix (ignored). An operator who carves a longer prefix out of the /48 (a
 *                 /96, say) places the IPv4 elsewhere; that layout cannot be told from outside, so
 *                 the /48 one, which the prefix itself defines, is used;
 *     siit        ::ffff:0:0:0/96 (RFC 7915 IPv4-translated, `::ffff:0:a.b.c.d`): the last 32 bits;
 *     teredo      2001::/32 (RFC 4380): the client's IPv4 is the last 32 bits XOR 0xffffffff (bits
 *                 32–63 are the Teredo server's address, not the client's).
 * - canonicalAddress: the address everything keys on: the IPv4 a mapped or embedded form carries,
 *   else the address as given.
 * - prefixOf: an IPv6 address's prefix (the rate limit's /64 client and its RATE_PREFIX_V6 prefix)
 *   in the form Envoy's masked_remote_address writes it.
 * - cidrMatcher: membership in a list of CIDR blocks (GEO_TRUSTED_CIDRS).
 * - MAPPED_PREFIX: how Envoy prints every IPv4-mapped address; the header_mutation rule that writes
 *   x-edge-client-ip (envoy/render/client-address.ts) strips it with this constant.
 * Property-tested against node:net (isIP, SocketAddress, BlockList) in authz/test/ip-module.test.ts,
 * where geo, the rate limit's keys and the client-address rule are also checked to agree.
 */
import { BlockList, isIP } from 'node:net';

/** `::ffff:`: Envoy (inet_ntop) prints every IPv4-mapped address as `::ffff:a.b.c.d`. */
export const MAPPED_PREFIX = '::ffff:';

/** The translation forms embeddedIpv4 recognizes (the decision log's `embedded` field). */
export type EmbeddedForm = '6to4' | 'nat64' | 'nat64-local' | 'siit' | 'teredo';
export const EMBEDDED_FORMS: readonly EmbeddedForm[] = ['6to4', 'nat64', 'nat64-local', 'siit', 'teredo'];

export interface Embedded {
  readonly form: EmbeddedForm;
  /** The IPv4 it carries, dotted quad. */
  readonly ipv4: string;
}

/**
 * The 8 16-bit groups of an IPv6 address (`::` and a dotted IPv4 tail handled); undefined when it
 * is not one. Cheap (no regular expression); callers usually have checked isIP already.
 */
export function ipv6Groups(ip: string): number[] | undefined {
  const zone = ip.indexOf('%');
  let s = zone === -1 ? ip : ip.slice(0, zone);
  let tail: [number, number] | undefined;
  const lastColon = s.lastIndexOf(':');
  if (lastColon === -1) return undefined;
  if (s.indexOf('.', lastColon) !== -1) {
    const o = s.slice(lastColon + 1).split('.').map(Number);
    if (o.length !== 4 || o.some((x) => !(x >= 0 && x <= 255))) return undefined;
    tail = [(o[0]! << 8) | o[1]!, (o[2]! << 8) | o[3]!];
    s = `${s.slice(0, lastColon + 1)}0:0`;
  }
  const halves = s.split('::');
  if (halves.length > 2) return undefined;
  const parse = (part: string | undefined): number[] => (part === undefined || part === '' ? [] : part.split(':').map((g) => (/^[0-9a-fA-F]{1,4}$/.test(g) ? parseInt(g, 16) : NaN)));
  const head = parse(halves[0]);
  const rest = parse(halves[1]);
  const groups = halves.length === 2 ? [...head, ...new Array<number>(Math.max(0, 8 - head.length - rest.length)).fill(0), ...rest] : head;
  if (groups.length !== 8 || groups.some((g) => Number.isNaN(g))) return undefined;
  if (tail !== undefined) groups.splice(6, 2, tail[0], tail[1]);
  return groups;
}

const dotted = (hi: number, lo: number): string => `${hi >>> 8}.${hi & 255}.${lo >>> 8}.${lo & 255}`;

/** `::ffff:a.b.c.d` (any spelling) in groups: the IPv4, else undefined. */
export function mappedIpv4(g: readonly number[]): string | undefined {
  return g[0] === 0 && g[1] === 0 && g[2] === 0 && g[3] === 0 && g[4] === 0 && g[5] === 0xffff ? dotted(g[6]!, g[7]!) : undefined;
}

/** The embedded IPv4 and its form, from the groups of an IPv6 address; undefined for none. */
export function embeddedInGroups(g: readonly number[]): Embedded | undefined {
  const g0 = g[0]!;
  if (g0 === 0x2002) return { form: '6to4', ipv4: dotted(g[1]!, g[2]!) };
  if (g0 === 0x64 && g[1] === 0xff9b) {
    if (g[2] === 0 && g[3] === 0 && g[4] === 0 && g[5] === 0) return { form: 'nat64', ipv4: dotted(g[6]!, g[7]!) };
    // RFC 6052 /48: a.b in bits 48–63, u (bits 64–71) zero, c.d in bits 72–87.
    if (g[2] === 1 && (g[4]! >>> 8) === 0) return { form: 'nat64-local', ipv4: dotted(g[3]!, ((g[4]! & 255) << 8) | (g[5]! >>> 8)) };
    return undefined;
  }
  if (g0 === 0x2001 && g[1] === 0) return { form: 'teredo', ipv4: dotted(g[6]! ^ 0xffff, g[7]! ^ 0xffff) };
  if (g0 === 0 && g[1] === 0 && g[2] === 0 && g[3] === 0 && g[4] === 0xffff && g[5] === 0) return { form: 'siit', ipv4: dotted(g[6]!, g[7]!) };
  return undefined;
}

/**
 * The IPv4 an IPv6 address (as normalizeIp returns it) embeds, and the form; undefined for an
 * IPv4 address, any other IPv6 address or no address. Only addresses whose first group (and, for
 * 2001, second) can start one of the forms are parsed.
 */
export function embeddedIpv4(ip: string): Embedded | undefined {
  // Most IPv6 addresses are rejected on their first group (or, under 2001::/16, their second),
  // read from the text without parsing the whole address.
  const first = ip.indexOf(':');
  if (first === -1) return undefined;
  const g0 = first === 0 ? 0 : parseInt(ip.slice(0, first), 16);
  if (g0 === 0x2001) {
    const next = ip.indexOf(':', first + 1);
    const g1 = ip.slice(first + 1, next === -1 ? undefined : next);
    if (g1 !== '' && parseInt(g1, 16) !== 0) return undefined;
  } else if (g0 !== 0x2002 && g0 !== 0x64 && g0 !== 0) {
    return undefined;
  }
  const g = ipv6Groups(ip);
  return g === undefined ? undefined : embeddedInGroups(g);
}

/**
 * Strips IPv6 brackets and a zone id, and turns any IPv4-mapped IPv6 form (::ffff:1.2.3.4,
 * ::ffff:102:304, 0:0:0:0:0:ffff:1.2.3.4) into the IPv4 address; '' when not an IP address.
 */
export function normalizeIp(raw: string): string {
  let ip = raw.trim();
  if (ip.startsWith('[') && ip.endsWith(']')) ip = ip.slice(1, -1);
  const zone = ip.indexOf('%');
  if (zone !== -1) ip = ip.slice(0, zone);
  const family = isIP(ip);
  if (family === 4) return ip;
  if (family === 0) return '';
  // Only an address starting with a zero group can be IPv4-mapped (`::ffff:…`, `0:0:…`).
  const c = ip.charCodeAt(0);
  if (c !== 58 /* : */ && c !== 48 /* 0 */) return ip;
  const g = ipv6Groups(ip);
  return (g === undefined ? undefined : mappedIpv4(g)) ?? ip;
}

/**
 * The address a client is judged and counted as: for an IPv6 address that is IPv4-mapped or embeds
 * an IPv4 (the forms above), that IPv4; any other address, and anything that is not an address,
 * unchanged (no trimming: the rate limit's keys take the address exactly as Envoy wrote it; geo
 * passes normalizeIp's result).
 */
export function canonicalAddress(address: string): string {
  if (isIP(address) !== 6) return address;
  const g = ipv6Groups(address);
  if (g === undefined) return address;
  return mappedIpv4(g) ?? embeddedInGroups(g)?.ipv4 ?? address;
}

/**
 * `2001:db8:3:ffff::/64`, `2001:db8:3::/48`: the prefix of `length` bits (32..64) of an IPv6
 * address's groups, in Envoy's (RFC 5952) form, as masked_remote_address writes it. At least four
 * trailing groups are zero, always the longest run, so: the kept groups without their trailing
 * zeros, then `::`.
 */
export function prefixOf(groups: readonly number[], length: number): string {
  const kept = Math.ceil(length / 16);
  const first = groups.slice(0, kept);
  const partial = length % 16;
  if (partial !== 0) first[kept - 1] = first[kept - 1]! & ((0xffff << (16 - partial)) & 0xffff);
  while (first.length > 0 && first.at(-1) === 0) first.pop();
  return `${first.map((g) => g.toString(16)).join(':')}::/${length}`;
}

/** Dotted-quad IPv4 → uint32 (the input is already known to be a valid IPv4 address). */
export function ipv4ToInt(ip: string): number {
  let n = 0;
  let part = 0;
  for (let i = 0; i < ip.length; i++) {
    const c = ip.charCodeAt(i);
    if (c === 46 /* . */) {
      n = (n << 8) | part;
      part = 0;
    } else {
      part = part * 10 + (c - 48);
    }
  }
  return ((n << 8) | part) >>> 0;
}

/**
 * Membership in CIDR blocks (`10.0.0.0/8`, `::1/128`), for an address as normalizeIp returns it
 * and its family. IPv4 ranges are compared as integers in plain JS (BlockList.check builds a
 * native SocketAddress per call, ~0.7 µs on every Check); IPv6 uses BlockList. Throws on a block
 * whose address is not one (the caller has validated the list).
 */
export function cidrMatcher(cidrs: readonly string[], what = 'GEO_TRUSTED_CIDRS'): (ip: string, family: number) => boolean {
  const v4: [number, number][] = [];
  const v6 = new BlockList();
  let anyV6 = false;
  for (const cidr of cidrs) {
    const [net = '', bits = ''] = cidr.split('/');
    const family = isIP(net);
    if (family === 0) throw new Error(`${what}: not an address: ${cidr}`);
    const prefix = Number(bits);
    if (family === 4) {
      const mask = prefix === 0 ? 0 : (0xffffffff << (32 - prefix)) >>> 0;
      v4.push([(ipv4ToInt(net) & mask) >>> 0, mask]);
    } else {
      v6.addSubnet(net, prefix, 'ipv6');
      anyV6 = true;
    }
  }
  return (ip, family) => {
    if (family === 4) {
      const n = ipv4ToInt(ip);
      for (const [base, mask] of v4) if (((n & mask) >>> 0) === base) return true;
      return false;
    }
    return anyV6 && v6.check(ip, 'ipv6');
  };
}
