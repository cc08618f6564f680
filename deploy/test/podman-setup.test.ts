/**
 * The Podman pod setup's parts (deploy/podman/) on their own, without podman: the host limits
 * read and written into containers.conf, the subnet and bridge choice, the kubelet's secret
 * volume layout (a real directory, rotated twice), image references, and the production render
 * split for `podman kube play` (by the real kubectl kustomize). e2e/pod.test.ts plays the pod.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { hardLimits, containersConf, PODMAN_NPROC_CAP } from '../podman/host.ts';
import { bridgeName, cidrsOverlap, freeSubnet, routedCidrs } from '../podman/network.ts';
import { publishKubeletDir } from '../podman/kubelet-secrets.ts';
import { findResource, overlayKustomization, PRODUCTION_OVERLAY, productionDocs, secretVolumes, splitForPodman, splitImage, type Workload } from '../podman/overlay.ts';
import { kustomize, yamlDocs } from '../lib/tools.ts';

const dir = mkdtempSync(join(tmpdir(), 'podman-setup-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const LIMITS = `Limit                     Soft Limit           Hard Limit           Units
Max processes             63432                unlimited            processes
Max open files            1024                 524288               files
`;

test('podman host – hard limits read from /proc/self/limits text; containers.conf caps nproc at podman\'s own', () => {
  const limits = hardLimits(LIMITS);
  assert.deepEqual(limits, { nofile: 524288, nproc: Infinity });
  const conf = containersConf('/run/x', limits);
  assert.ok(conf.includes('524288'), conf);
  assert.ok(conf.includes(String(PODMAN_NPROC_CAP)));
  assert.ok(conf.includes('/run/x/cni') && conf.includes('/run/x/events.log'));
  assert.ok(!conf.includes('{{'), 'every placeholder filled');
  assert.throws(() => hardLimits('nothing'), /no "Max open files" line/);
});

const overlaps: Record<string, [string, string, boolean]> = {
  'the same /24': ['10.91.3.0/24', '10.91.3.0/24', true],
  'a /16 holding a /24': ['10.91.0.0/16', '10.91.200.0/24', true],
  'neighbouring /24s': ['10.91.3.0/24', '10.91.4.0/24', false],
  'a host route inside': ['10.91.3.0/24', '10.91.3.77/32', true],
};
for (const [name, [a, b, want]] of Object.entries(overlaps)) {
  test(`podman network – cidrsOverlap: ${name}`, () => {
    assert.equal(cidrsOverlap(a, b), want);
    assert.equal(cidrsOverlap(b, a), want);
  });
}

test('podman network – routes read from /proc/net/route text (default route left out); a free subnet overlaps none of this host\'s', () => {
  const route = 'Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n'
    + 'eth0\t00000000\t0100A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n'
    + 'eth0\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n'
    + 'br0\t00005B0A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n';
  assert.deepEqual(routedCidrs(route), ['192.168.0.0/24', '10.91.0.0/16']);
  const subnet = freeSubnet(() => 0.5);
  assert.match(subnet, /^10\.91\.\d+\.0\/24$/);
  for (const r of routedCidrs()) assert.ok(!cidrsOverlap(subnet, r), `${subnet} overlaps ${r}`);
});

test('podman network – the bridge name is the network\'s own, stable, and fits an interface name (15 bytes)', () => {
  assert.equal(bridgeName('edge-a'), bridgeName('edge-a'));
  assert.notEqual(bridgeName('edge-a'), bridgeName('edge-b'));
  assert.ok(bridgeName('edge-a').length <= 15);
});

test('kubelet secret layout – files under ..<timestamp>/ (0440), ..data swapped on rotation, the old timestamp removed', () => {
  const secret = join(dir, 'secret');
  const gid = process.getgid?.() ?? 0;
  publishKubeletDir(secret, { 'tls.crt': 'one', 'tls.key': 'k1' }, gid);
  const first = readlinkSync(join(secret, '..data'));
  assert.match(first, /^\.\.\d{4}_\d\d_\d\d_\d\d_\d\d_\d\d\.\d+$/);
  assert.equal(readlinkSync(join(secret, 'tls.crt')), join('..data', 'tls.crt'));
  assert.equal(lstatSync(join(secret, first, 'tls.crt')).mode & 0o777, 0o440);
  publishKubeletDir(secret, { 'tls.crt': 'two', 'tls.key': 'k2' }, gid);
  const second = readlinkSync(join(secret, '..data'));
  assert.notEqual(second, first);
  assert.equal(readFileSync(join(secret, 'tls.crt'), 'utf8'), 'two');
  assert.deepEqual(readdirSync(secret).sort(), ['..data', second, 'tls.crt', 'tls.key'].sort());
  assert.throws(() => publishKubeletDir(secret, { '../x': 'no' }, gid), /not a secret file name/);
});

test('podman overlay – image references split into kustomize\'s name and tag (a registry port is no tag)', () => {
  assert.deepEqual(splitImage('docker.io/local/envoy:v1.40.0'), { name: 'docker.io/local/envoy', tag: 'v1.40.0' });
  assert.deepEqual(splitImage('localhost:5000/edge'), { name: 'localhost:5000/edge', tag: undefined });
});

test('podman overlay – the production render split for kube play: the claim alone, the rest, and the CronJob\'s job as a Pod', () => {
  const rendered = kustomize(PRODUCTION_OVERLAY);
  assert.deepEqual(productionDocs(), yamlDocs(rendered));
  const split = splitForPodman(rendered);
  assert.deepEqual(yamlDocs(split.pvc).map((d) => d.kind), ['PersistentVolumeClaim']);
  const rest = yamlDocs(split.edge);
  assert.equal(rest.length, yamlDocs(rendered).length - 1);
  assert.ok(rest.some((d) => d.kind === 'Deployment') && !rest.some((d) => d.kind === 'PersistentVolumeClaim'));
  const [pod] = yamlDocs(split.geoipUpdate);
  assert.equal(pod?.kind, 'Pod');
  assert.equal(pod?.metadata.name, split.geoipUpdatePodName);
  assert.match(split.geoipUpdatePodName, /-run$/);
});

test('podman overlay – the overlay, rendered by the real kustomize: names suffixed, one replica, images from podman\'s store, ports on loopback, Redis on the gateway, secrets as kubelet-layout directories', () => {
  const production = productionDocs();
  const deployment = findResource<Workload>(production, 'Deployment');
  const secretDirs = Object.fromEntries(secretVolumes(deployment).map((v) => [v.secretName, join(dir, 'secrets', v.secretName)]));
  const publish = Object.fromEntries(deployment.spec.template.spec.containers.flatMap((c) => c.ports ?? []).map((p, i) => [p.name ?? '', 20000 + i]));
  const overlayDir = join(dir, 'overlay');
  mkdirSync(overlayDir);
  writeFileSync(join(overlayDir, 'kustomization.yaml'), overlayKustomization(overlayDir, {
    name: 't1', envoyImage: 'docker.io/local/envoy:v9', serviceImage: 'docker.io/library/edge:9', gateway: '10.91.7.1', redisPort: 16390,
    publish, secretDirs, blockedCountries: 'KP',
  }, production));
  const docs = yamlDocs(kustomize(overlayDir));
  assert.equal(docs.length, production.length);
  for (const d of docs) assert.match(d.metadata.name, /-t1$/, `${d.kind} ${d.metadata.name}`);
  const pod = findResource<Workload>(docs, 'Deployment');
  assert.equal((pod.spec as { replicas?: number }).replicas, 1);
  const containers = pod.spec.template.spec.containers;
  const images = containers.map((c) => c.image);
  for (const want of ['docker.io/library/edge:9', 'docker.io/local/envoy:v9']) assert.ok(images.includes(want), `${want} in ${images.join(', ')}`);
  for (const p of containers.flatMap((c) => c.ports ?? [])) assert.deepEqual([p.hostIP, p.hostPort], ['127.0.0.1', publish[p.name ?? '']]);
  const settings = docs.find((d) => d.kind === 'ConfigMap' && (d as { data?: Record<string, string> }).data?.['REDIS_URL'] !== undefined) as { data: Record<string, string> } | undefined;
  assert.equal(settings?.data['REDIS_URL'], 'redis://10.91.7.1:16390/0');
  assert.equal(settings?.data['BLOCKED_COUNTRIES'], 'KP');
  const hostPaths = (pod.spec.template.spec.volumes ?? []).flatMap((v) => (v.hostPath === undefined ? [] : [v.hostPath.path]));
  assert.deepEqual(hostPaths.sort(), Object.values(secretDirs).sort());
});
