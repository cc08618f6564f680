/**
 * Every distinct data record of a MaxMind-format (.mmdb) database, found by walking its search
 * tree: what the GEOIP_DB and ANONYMIZER_DB checks read before a database serves (geoip.ts,
 * anonymizer.ts). mmdb-lib answers lookups only, so the tree is walked here (MaxMind DB spec,
 * "Search Tree Section": nodes of two records of 24, 28 or 32 bits; a record below the node
 * count is a node, equal to it is "no data", above it points into the data section), and each
 * record is decoded by a lookup of an address of its network.
 */
import type { Reader, Response } from 'maxmind';

/** One record met by the walk: the decoded data and the network it was reached by. */
export interface MmdbRecord {
  readonly data: unknown;
  /** The network (`192.0.2.64/28`, `2001:db8::/32`) the walk reached it by: for messages. */
  network(): string;
}

/**
 * Work between two yields, so a reload's walk lets requests run in between: this many nodes walked
 * (~3 ms), or WALK_SLICE_RECORDS records decoded (~5 ms), whichever comes first.
 */
export const WALK_SLICE_NODES = 32_768;
export const WALK_SLICE_RECORDS = 512;

type NodeReader = (offset: number) => number;

function nodeReaders(db: Buffer, recordSize: number): [left: NodeReader, right: NodeReader] {
  switch (recordSize) {
    case 24: return [(o) => db.readUIntBE(o, 3), (o) => db.readUIntBE(o + 3, 3)];
    case 28: return [(o) => (((db[o + 3] ?? 0) & 0xf0) << 20) + db.readUIntBE(o, 3), (o) => (((db[o + 3] ?? 0) & 0x0f) << 24) + db.readUIntBE(o + 4, 3)];
    case 32: return [(o) => db.readUInt32BE(o), (o) => db.readUInt32BE(o + 4)];
    default: throw new Error(`record size ${recordSize} is not a MaxMind DB record size (24, 28 or 32)`);
  }
}

/** The address of `path` (its first bits set, the rest zero) as text a lookup accepts. */
function addressOf(path: Uint8Array): string {
  if (path.length === 4) return path.join('.');
  const groups: string[] = [];
  for (let i = 0; i < 16; i += 2) groups.push((((path[i] ?? 0) << 8) | (path[i + 1] ?? 0)).toString(16));
  return groups.join(':');
}

/** `path`/`bits` as a CIDR; an IPv6 tree's IPv4 subtree (::/96) as the IPv4 network it holds. */
function networkOf(path: Uint8Array, bits: number): string {
  if (path.length === 4) return `${addressOf(path)}/${bits}`;
  if (bits >= 96 && path.subarray(0, 12).every((b) => b === 0)) return `${path.subarray(12).join('.')}/${bits - 96}`;
  // The longest run of zero groups written `::` (RFC 5952), for a readable message.
  const groups = addressOf(path).split(':');
  let best = [-1, 0];
  for (let i = 0; i < 8;) {
    let j = i;
    while (j < 8 && groups[j] === '0') j++;
    if (j - i > (best[1] ?? 0)) best = [i, j - i];
    i = j === i ? i + 1 : j;
  }
  const [at = -1, len = 0] = best;
  const text = len < 2 ? groups.join(':') : `${groups.slice(0, at).join(':')}::${groups.slice(at + len).join(':')}`;
  return `${text}/${bits}`;
}

/**
 * Walks `reader`'s search tree depth first, each node once (an IPv6 tree's aliases of its IPv4
 * subtree are walked once), and hands every distinct data record to `visit` once; `visit` returns
 * true to stop. Yields between slices of work (WALK_SLICE_NODES, WALK_SLICE_RECORDS): run it to
 * the end in one go (start-up) or with a pause at each yield (a reload). Throws on a tree or data
 * section it cannot read (a pointer past the end, a loop deeper than the address): such a
 * database is refused like a corrupt one.
 */
export function* walkRecords(reader: Reader<Response>, db: Buffer, visit: (record: MmdbRecord) => boolean): Generator<void, void, void> {
  const { nodeCount, nodeByteSize, recordSize, ipVersion } = reader.metadata;
  const [left, right] = nodeReaders(db, recordSize);
  const depthMax = ipVersion === 4 ? 32 : 128;
  if (nodeCount * nodeByteSize > db.length) throw new Error(`the search tree (${nodeCount} nodes) is longer than the file`);
  const visited = new Uint8Array(Math.ceil(nodeCount / 8));
  const seen = new Set<number>();
  const path = new Uint8Array(depthMax / 8);
  // Depth first with an explicit stack of (node, depth, the bit that led to it). When an entry is
  // popped, the path's bits above its depth are still its parent's: only the subtree walked since
  // it was pushed (its sibling's) changed bits, and only at its depth or deeper.
  const stackNode = new Uint32Array(2 * depthMax + 2);
  const stackDepth = new Uint8Array(2 * depthMax + 2);
  const stackBit = new Uint8Array(2 * depthMax + 2);
  let top = 1;
  let walked = 0;
  let decoded = 0;
  let sliceStart = 0;
  let sliceRecords = 0;
  while (top > 0) {
    top--;
    const node = stackNode[top] ?? 0;
    const depth = stackDepth[top] ?? 0;
    if (((visited[node >> 3] ?? 0) & (1 << (node & 7))) !== 0) continue;
    visited[node >> 3] = (visited[node >> 3] ?? 0) | (1 << (node & 7));
    if (++walked - sliceStart >= WALK_SLICE_NODES || decoded - sliceRecords >= WALK_SLICE_RECORDS) {
      sliceStart = walked;
      sliceRecords = decoded;
      yield;
    }
    if (depth >= depthMax) throw new Error(`the search tree is deeper than ${depthMax} bits`);
    if (depth > 0) setBit(path, depth - 1, (stackBit[top] ?? 0) as 0 | 1);
    const offset = node * nodeByteSize;
    const l = left(offset);
    const r = right(offset);
    if (l > nodeCount && !seen.has(l) && record(l, depth, 0)) return;
    if (r > nodeCount && !seen.has(r) && record(r, depth, 1)) return;
    // Right pushed first: the left subtree is walked first.
    if (r < nodeCount) push(r, depth + 1, 1);
    if (l < nodeCount) push(l, depth + 1, 0);
  }

  function push(node: number, depth: number, bit: number): void {
    stackNode[top] = node;
    stackDepth[top] = depth;
    stackBit[top] = bit;
    top++;
  }

  /** The record `pointer` reached from the node at `depth` by `side`: decoded and visited. */
  function record(pointer: number, depth: number, side: 0 | 1): boolean {
    seen.add(pointer);
    decoded++;
    setBit(path, depth, side);
    clearFrom(path, depth + 1);
    const at = path.slice();
    return visit({ data: reader.get(addressOf(at)), network: () => networkOf(at, depth + 1) });
  }
}

function setBit(path: Uint8Array, i: number, bit: 0 | 1): void {
  const mask = 0x80 >> (i & 7);
  path[i >> 3] = bit === 1 ? (path[i >> 3] ?? 0) | mask : (path[i >> 3] ?? 0) & ~mask;
}

function clearFrom(path: Uint8Array, i: number): void {
  if (i >= path.length * 8) return;
  const byte = i >> 3;
  path[byte] = (path[byte] ?? 0) & (0xff << (8 - (i & 7)));
  path.fill(0, byte + 1);
}
