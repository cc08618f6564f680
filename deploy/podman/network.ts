/**
 * The pod's podman network: a free IPv4 /24 (by this host's routes), created with a bridge
 * interface named after the network, and its gateway (where the pod reaches the host).
 */
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { podmanSync } from './host.ts';

function ipv4(ip: string): number {
  return ip.split('.').reduce((n, o) => (n * 256) + Number(o), 0);
}

/** Whether two IPv4 CIDRs overlap. */
export function cidrsOverlap(a: string, b: string): boolean {
  const range = (c: string): [number, number] => {
    const [ip = '0.0.0.0', len = '32'] = c.split('/');
    const size = 2 ** (32 - Number(len));
    const start = Math.floor(ipv4(ip) / size) * size;
    return [start, start + size - 1];
  };
  const [x0, x1] = range(a);
  const [y0, y1] = range(b);
  return x0 <= y1 && y0 <= x1;
}

/** The IPv4 destinations this host routes (/proc/net/route), default route excluded. */
export function routedCidrs(text = readFileSync('/proc/net/route', 'utf8')): string[] {
  const le = (hex: string): string => [6, 4, 2, 0].map((i) => parseInt(hex.slice(i, i + 2), 16)).join('.');
  return text.split('\n').slice(1).map((l) => l.trim().split(/\s+/)).filter((f) => f.length >= 8 && f[1] !== '00000000')
    .map((f) => `${le(f[1] ?? '')}/${le(f[7] ?? '').split('.').reduce((n, o) => n + [...Number(o).toString(2)].filter((b) => b === '1').length, 0)}`);
}

/**
 * A /24 in 10.91.0.0/16 that no route of this host covers, starting at a random one: podman picks
 * the lowest free subnet of its pools (10.89.0.0/24 first) by the networks it knows, and a run's
 * networks live in the run's own CNI directory, so two runs at once must not both take the first.
 */
export function freeSubnet(random = Math.random): string {
  const used = routedCidrs();
  const start = Math.floor(random() * 256);
  for (let i = 0; i < 256; i++) {
    const candidate = `10.91.${(start + i) % 256}.0/24`;
    if (!used.some((u) => cidrsOverlap(candidate, u))) return candidate;
  }
  throw new Error(`no free /24 in 10.91.0.0/16 (routed: ${used.join(', ')})`);
}

/** The bridge interface of network `name`: its own name, so no other network's can be the same. */
export function bridgeName(name: string): string {
  return `ep-${createHash('sha256').update(name).digest('hex').slice(0, 10)}`;
}

/**
 * Creates the podman network when missing (on `subnet`, else one podman picks) and returns its
 * IPv4 gateway. Its bridge interface gets a name of its own (bridgeName): podman 4.3 names a new
 * bridge cni-podman<N>, the first N that neither the networks in its configuration directory nor
 * the host's live interfaces use, so two runs with configuration directories of their own that
 * create networks before either has a pod attached would share cni-podman0, and removing one
 * network would take the other's bridge down. podman 4.3 has no --interface-name: the bridge
 * name is set in the network's CNI file (`configDir`/<name>.conflist) before any pod uses it.
 */
export function ensureNetwork(name: string, env: NodeJS.ProcessEnv, configDir: string, subnet?: string): string {
  if (podmanSync(['network', 'exists', name], env).status !== 0) {
    const r = podmanSync(['network', 'create', ...(subnet === undefined ? [] : ['--subnet', subnet]), name], env);
    if (r.status !== 0) throw new Error(`podman network create ${name} failed: ${r.stderr}`);
    const file = join(configDir, `${name}.conflist`);
    const conf = JSON.parse(readFileSync(file, 'utf8')) as { plugins: { type: string; bridge?: string }[] };
    const bridge = conf.plugins.find((p) => p.type === 'bridge');
    if (bridge === undefined) throw new Error(`${file}: no bridge plugin`);
    bridge.bridge = bridgeName(name);
    writeFileSync(file, `${JSON.stringify(conf, null, 2)}\n`);
  }
  const r = podmanSync(['network', 'inspect', name, '--format', '{{.NetworkInterface}} {{range .Subnets}}{{.Gateway}} {{end}}'], env);
  const [iface, ...gateways] = r.stdout.trim().split(/\s+/);
  const gateway = gateways.find((l) => /^\d+\.\d+\.\d+\.\d+$/.test(l));
  if (r.status !== 0 || gateway === undefined) throw new Error(`podman network inspect ${name}: no IPv4 gateway (${r.stderr}${r.stdout})`);
  if (iface !== bridgeName(name)) throw new Error(`podman network ${name}: bridge ${iface}, not ${bridgeName(name)}`);
  return gateway;
}
