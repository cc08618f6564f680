/**
 * deploy/docker-compose.yml, checked without a Docker engine, on what the real
 * `docker-compose config` makes of it (it validates the file and prints it normalized:
 * interpolated, merge keys applied, relative paths resolved):
 * - compose accepts it, and every variable has a default (no "variable is not set" warning);
 * - its wiring: only Envoy publishes a port, start order is health-gated, every environment name
 *   is a setting the service really reads, the addresses Envoy is given name compose services;
 * - its files: deploy/compose-setup.ts is run, and every secret, bind mount and *_FILE path of
 *   every service must resolve through that service's mounts to a generated file, owned by the
 *   user the container runs as, mode 0400 (run as a user), or owned by root, group the dedicated
 *   EDGE_GID, mode 0440 (run as root, as in CI); the service's config and credentials load from them;
 *   as root nothing is readable by a host account with uid 1000 and the keys no container reads
 *   stay root's;
 * - the Envoy config compose runs: rendered by the `render` one-shot's own command and settings,
 *   then the real `envoy --mode validate` with every path mapped through the envoy service's mounts.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { createPrivateKey, X509Certificate } from 'node:crypto';
import { chmodSync, linkSync, lstatSync, mkdirSync, realpathSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import YAML from 'yaml';
import { loadConfig } from '../../authz/src/common/config.ts';
import { loadCredentials } from '../../authz/src/common/credentials.ts';
import { readTokenFile } from '../../authz/src/common/token.ts';
import { envoyBinary } from '../../envoy/envoy-bin.ts';
import { main as renderCli } from '../../envoy/render-cli.ts';
import { COMPOSE_FILES, dedicatedGid, FIRST_DEDICATED_GID, hostGids, IMAGE_UID, MOUNTED_DIRS, ownership } from '../compose-setup.ts';
import { budgetOfBootstrap, ENVOY_POD_CPUS, envoyBudget, renderEnvoy } from '../../envoy/render.ts';
import { ROOT } from '../paths.ts';
import { backendSettings, settingsRead, validateEnvoyThroughMounts } from './support.ts';
import { COMPOSE_FILE, composeConfig, serviceMounts, type ComposeFile, type Mount } from './tools.ts';
import { tempDir } from '../../testkit/temp-dir.ts';

/** The file as compose reads it with no variables set (every default) and no deploy/.env. */
const defaults = composeConfig();
const compose = defaults.file;

/** compose-setup.ts output (run as a child: as root it continues as the containers' user). */
let out: string;
let dotenv: Record<string, string>;
/** The file as compose reads it with the project directory (relative paths, .env) at `out`. */
let composed: ComposeFile;
before(() => {
  out = tempDir('edge-compose-');
  chmodSync(out, 0o755);
  execFileSync(join(ROOT, 'scripts/node'), [join(ROOT, 'deploy/compose-setup.ts'), '--out', out], { stdio: 'pipe' });
  dotenv = Object.fromEntries(readFileSync(join(out, COMPOSE_FILES.env), 'utf8').split('\n')
    .filter((l) => /^\w+=/.test(l)).map((l) => l.split('=', 2) as [string, string]));
  composed = composeConfig({ projectDir: out, envFile: join(out, COMPOSE_FILES.env) }).file;
});
after(() => rmSync(out, { recursive: true, force: true }));

/** The container path → host path of a service's mounts (named volumes under `volumes`). */
function hostPath(mounts: Mount[], containerPath: string, volumes: Record<string, string> = {}): string {
  const m = [...mounts].sort((a, b) => b.target.length - a.target.length).find((x) => containerPath === x.target || containerPath.startsWith(`${x.target}/`));
  assert.ok(m !== undefined, `${containerPath}: no mount provides it`);
  const src = m.kind === 'volume' ? volumes[m.source] : m.source;
  assert.ok(src !== undefined, `volume ${m.source} not simulated`);
  return src + containerPath.slice(m.target.length);
}

/** The version of the Node the tests run (`24.19.0`). */
const nodeVersion = (): string => spawnSync(join(ROOT, 'scripts/node'), ['--version'], { encoding: 'utf8' }).stdout.trim().slice(1);

test('compose – docker-compose config accepts the file with no variable set: every ${VARIABLE} has a default, so `docker-compose up` works with or without deploy/.env', () => {
  assert.deepEqual(defaults.warnings, [], 'docker-compose config printed warnings');
  assert.deepEqual(Object.keys(compose.services).sort(), ['authz', 'backend', 'envoy', 'redis', 'render']);
  // compose-setup.ts writes exactly the variables the file reads for the containers' user.
  assert.deepEqual(new Set(Object.keys(dotenv)), new Set(['EDGE_UID', 'EDGE_GID']));
  const users = composeConfig({ env: { EDGE_UID: '4242', EDGE_GID: '4343' } }).file.services;
  for (const name of ['authz', 'envoy', 'backend']) assert.equal(users[name]?.user, '4242:4343', `${name} runs as EDGE_UID:EDGE_GID`);
});

test('compose – the checks fail when compose does: an unknown option is refused, a variable without a default is reported', () => {
  const dir = tempDir('edge-compose-broken-');
  try {
    const text = readFileSync(COMPOSE_FILE, 'utf8');
    const unknown = text.replace('    stop_grace_period: 15s', '    stop_grace_period: 15s\n    not_a_compose_option: true');
    assert.notEqual(unknown, text);
    writeFileSync(join(dir, 'unknown.yml'), unknown);
    assert.throws(() => composeConfig({ file: join(dir, 'unknown.yml') }), /docker-compose [\s\S]*failed[\s\S]*not_a_compose_option/);
    const noDefault = text.replace('${EDGE_UID:-1000}', '${EDGE_UID}');
    assert.notEqual(noDefault, text);
    writeFileSync(join(dir, 'no-default.yml'), noDefault);
    assert.ok(composeConfig({ file: join(dir, 'no-default.yml') }).warnings.some((w) => /EDGE_UID variable is not set/.test(w)));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('compose – Envoy is the official image of the version the tests run; the service images are built from deploy/Dockerfile on the Node the tests run', () => {
  const version = /\/(\d+\.\d+\.\d+)\//.exec(execFileSync(envoyBinary(), ['--version']).toString())?.[1];
  assert.equal(compose.services['envoy']?.image, `envoyproxy/envoy:v${version}`);
  const built = Object.entries(compose.services).filter(([, s]) => s.build !== undefined);
  assert.deepEqual(built.map(([n]) => n), ['render']);
  const build = built[0]![1].build!;
  assert.equal(build.context.replace(/\/$/, ''), ROOT.replace(/\/$/, ''), 'built from the repository root');
  assert.equal(build.dockerfile, 'deploy/Dockerfile');
  assert.deepEqual(Object.keys(build.args ?? {}), ['NODE_IMAGE']);
  const nodeImage = build.args!['NODE_IMAGE']!;
  assert.equal(/^node:(\d+\.\d+\.\d+)-[a-z]+-slim$/.exec(nodeImage)?.[1], nodeVersion(), `NODE_IMAGE ${nodeImage}: the official slim image of the Node the tests run`);
  for (const name of ['render', 'authz', 'backend']) assert.equal(compose.services[name]?.image, built[0]![1].image, name);
  for (const [name, s] of Object.entries(compose.services)) assert.match(s.image ?? '', /:[\w.-]+$/, `${name}: image tag pinned`);
});

test('compose – ENVOY_IMAGE / REDIS_IMAGE / NODE_IMAGE (npm run images stand-ins) replace exactly the image they name', () => {
  const env = { ENVOY_IMAGE: 'local/envoy:test', REDIS_IMAGE: 'local/redis:test', NODE_IMAGE: 'local/node:test' };
  const over = composeConfig({ env }).file.services;
  assert.equal(over['envoy']?.image, env.ENVOY_IMAGE);
  assert.equal(over['redis']?.image, env.REDIS_IMAGE);
  assert.deepEqual(over['render']?.build?.args, { NODE_IMAGE: env.NODE_IMAGE });
  for (const name of ['render', 'authz', 'backend']) assert.equal(over[name]?.image, compose.services[name]?.image, `${name}: the service image's name stays`);
});

test('compose – hardening: read-only root filesystems, non-root users, capabilities dropped; only Envoy publishes a port (loopback by default)', () => {
  for (const [name, s] of Object.entries(compose.services)) {
    assert.equal(s.read_only, true, `${name}: read_only`);
    if (name !== 'redis') {
      assert.deepEqual(s.cap_drop, ['ALL'], `${name}: cap_drop`);
      assert.ok(s.security_opt?.includes('no-new-privileges:true'), `${name}: no-new-privileges`);
    }
    if (['authz', 'envoy', 'backend'].includes(name)) assert.equal(s.user, '1000:1000', `${name}: runs as EDGE_UID:EDGE_GID`);
    if (name !== 'envoy') assert.equal(s.ports, undefined, `${name} publishes no port`);
  }
  assert.deepEqual(compose.services['envoy']?.ports, ['127.0.0.1:8080:8080/tcp', '127.0.0.1:8082:8082/tcp', '127.0.0.1:9902:9902/tcp'], 'clients, the feed\'s ingest port, Envoy\'s stats listener');
  assert.equal(compose.services['render']?.network_mode, 'none');
});

test('compose – start order is health-gated: every dependency is healthy (or the render one-shot completed) first', () => {
  const envoy = compose.services['envoy']!;
  assert.deepEqual(envoy.depends_on, {
    render: { condition: 'service_completed_successfully' },
    authz: { condition: 'service_healthy' },
    backend: { condition: 'service_healthy' },
  });
  assert.deepEqual(compose.services['authz']?.depends_on, { redis: { condition: 'service_healthy' } });
  for (const [name, s] of Object.entries(compose.services)) {
    for (const [dep, { condition }] of Object.entries(s.depends_on ?? {})) {
      assert.ok(compose.services[dep] !== undefined, `${name} depends on unknown ${dep}`);
      if (condition === 'service_healthy') assert.ok(compose.services[dep]?.healthcheck?.test !== undefined, `${dep} has no healthcheck`);
      if (condition === 'service_completed_successfully') assert.equal(compose.services[dep]?.restart, 'no', `${dep} is a one-shot`);
    }
  }
});

test('compose – environment names are settings the service reads; Envoy reaches services by name; the network it trusts is the compose network', () => {
  const read = settingsRead();
  const env = (svc: string): Record<string, string> => compose.services[svc]?.environment ?? {};
  for (const svc of ['render', 'authz']) for (const name of Object.keys(env(svc))) assert.ok(read.has(name), `${svc}: ${name} is not a setting`);
  const backendNames = backendSettings();
  for (const name of Object.keys(env('backend'))) assert.ok(backendNames.has(name), `backend: ${name} is not read by order-backend-main.ts`);
  // render and authz share the settings Envoy's config depends on.
  for (const [k, v] of Object.entries(env('render'))) assert.equal(env('authz')[k] ?? v, v, k);
  const a = env('authz');
  assert.equal(a['AUTHZ_BIND_ADDRESS'], '0.0.0.0');
  for (const k of ['AUTHZ_ADDRESS', 'MARKET_ADDRESS']) assert.equal(a[k], 'authz', k);
  const backendUrl = new URL(a['ORDER_BACKEND_URL']!);
  assert.ok(compose.services[backendUrl.hostname] !== undefined);
  assert.equal(backendUrl.port, env('backend')['BACKEND_PORT']);
  assert.equal(a['ORDER_BACKEND_SAN'], backendUrl.hostname, 'the dev PKI issues the backend certificate for the service name');
  assert.ok(compose.services[new URL(a['REDIS_URL']!).hostname] !== undefined);
  const subnet = compose.networks?.default?.ipam?.config?.[0]?.subnet;
  assert.ok(subnet !== undefined && a['GEO_TRUSTED_CIDRS']!.split(',').includes(subnet), 'GEO_TRUSTED_CIDRS includes the compose subnet');
  // Health checks use the ports the settings give.
  assert.ok(compose.services['envoy']?.healthcheck?.test.join(' ').includes(`/dev/tcp/127.0.0.1/${a['ENVOY_ADMIN_PORT']}`));
  assert.ok(compose.services['backend']?.healthcheck?.test.join(' ').includes(`connect(${env('backend')['BACKEND_PORT']},`));
  assert.equal(compose.services['envoy']?.ports?.[0]?.replace(/\/tcp$/, '').split(':').at(-1), a['EDGE_PORT']);
  // Ingest on its own port (INGEST_PORT), bound inside the container on every address, published; the
  // overload manager's memory bound is the container's limit.
  assert.equal(compose.services['envoy']?.ports?.[1]?.replace(/\/tcp$/, '').split(':').at(-1), a['INGEST_PORT']);
  assert.equal(a['INGEST_BIND_ADDRESS'], '0.0.0.0');
  // Envoy's stats listener (GET /stats/prometheus only), published on the host's loopback.
  assert.equal(compose.services['envoy']?.ports?.[2]?.replace(/\/tcp$/, '').split(':').at(-1), a['ENVOY_STATS_PORT']);
  const mem = /^(\d+)([kmg]?)b?$/i.exec(String(compose.services['envoy']?.mem_limit ?? ''));
  const memBytes = mem === null ? NaN : Number(mem[1]) * 1024 ** ' kmg'.indexOf((mem[2] || ' ').toLowerCase());
  assert.equal(memBytes, Number(a['ENVOY_MEMORY_LIMIT_MB']) * 1_048_576, 'ENVOY_MEMORY_LIMIT_MB is the envoy service\'s mem_limit');
  // And the limit holds Envoy's budget (envoy/render/budget.ts, docs/capacity.md): every descriptor
  // LRU full and every connection open under the first memory action, counted on the config the
  // render service writes from these settings (one Envoy CPU, as in the pod).
  const config = loadConfig(a);
  const bootstrap = YAML.parse(renderEnvoy(config, { sdsPath: '/etc/envoy/sds.yaml' }).bootstrap) as never;
  const budget = envoyBudget({
    ...budgetOfBootstrap(bootstrap), memoryLimitMb: memBytes / 1_048_576, envoyCpus: ENVOY_POD_CPUS,
    refillSecs: Math.max(config.rateBurst / config.rpsPerIp, config.prefixBurst / config.rpsPerPrefix),
  });
  assert.deepEqual(budget.problems, [], 'Envoy\'s budget adds up in the envoy service\'s mem_limit');
});

test('compose – every secret and mount resolves to a file compose-setup.ts wrote, readable only by the containers\' user (0400, its own; as root 0440 root:EDGE_GID, a group no host account has); the service loads them', () => {
  const uid = Number(dotenv['EDGE_UID']);
  const gid = Number(dotenv['EDGE_GID']);
  const asRoot = process.getuid?.() === 0;
  if (asRoot) {
    assert.equal(uid, IMAGE_UID, 'as root the containers run as the image\'s user');
    assert.ok(gid >= FIRST_DEDICATED_GID && !hostGids().has(gid), `EDGE_GID ${gid} is a dedicated group: no host group or user has it`);
  }
  const checkSecretFile = (p: string): void => {
    const st = statSync(p);
    if (asRoot) {
      assert.deepEqual([st.mode & 0o777, st.uid, st.gid], [0o440, 0, gid], `${p}: mode ${(st.mode & 0o777).toString(8)}, owner ${st.uid}:${st.gid}`);
    } else {
      assert.equal(st.mode & 0o777, 0o400, `${p}: mode ${(st.mode & 0o777).toString(8)}`);
      assert.equal(st.uid, uid, `${p}: owner`);
    }
  };
  for (const [name, def] of Object.entries(composed.secrets)) {
    assert.ok(def.file.startsWith(join(out, '.secrets/')), `${name}: secrets live in deploy/.secrets (${def.file})`);
    checkSecretFile(def.file);
  }
  for (const svc of Object.keys(composed.services)) {
    for (const m of serviceMounts(composed, svc)) {
      if (m.kind === 'volume') assert.ok(composed.volumes[m.source] !== undefined, `${svc}: volume ${m.source}`);
      else assert.ok(statSync(m.source, { throwIfNoEntry: false }) !== undefined, `${svc}: ${m.source} missing`);
      // Read-only, but for the TS service's state directory: the seal marker (AUTHZ_SEAL_FILE) is written there.
      const sealDir = svc === 'authz' ? dirname(composed.services['authz']?.environment?.['AUTHZ_SEAL_FILE'] ?? '') : undefined;
      if (m.kind === 'bind' && m.target === sealDir) {
        const st = statSync(m.source);
        if (asRoot) assert.deepEqual([st.isDirectory(), st.mode & 0o777, st.uid, st.gid], [true, 0o770, 0, gid], `${svc}: ${m.source} is root's, writable by the containers' group`);
        else assert.deepEqual([st.isDirectory(), st.mode & 0o777, st.uid], [true, 0o700, uid], `${svc}: ${m.source} is the containers' user's own directory`);
        assert.ok(!m.readOnly, `${svc}: the seal directory is writable`);
      } else if (m.kind === 'bind') assert.ok(m.readOnly, `${svc}: bind mounts are read-only`);
    }
  }
  // authz: every file setting through its mounts; then config + credentials load from them.
  const authz = composed.services['authz']!;
  const mounts = serviceMounts(composed, 'authz');
  const env = { ...authz.environment };
  for (const [k, v] of Object.entries(env)) {
    if (/_FILE$/.test(k) && !/^(ORDER_BACKEND_CA|EDGE_CLIENT_CERT|EDGE_CLIENT_KEY|EDGE_TLS_CERT|EDGE_TLS_KEY|AUTHZ_SEAL)_FILE$/.test(k)) {
      env[k] = hostPath(mounts, v);
      checkSecretFile(env[k]);
    }
  }
  env['GEOIP_DB'] = hostPath(mounts, env['GEOIP_DB']!);
  assert.ok(statSync(env['GEOIP_DB']).size > 1000);
  loadConfig(env);
  readTokenFile('AUTHZ_ADMIN_TOKEN_FILE', env['AUTHZ_ADMIN_TOKEN_FILE']!);
  const creds = loadCredentials(env);
  assert.equal(creds.hmacKeys.length, 1, 'no HMAC rotation in progress: the previous-key file is empty');
  assert.equal(creds.feedKeys.length, 1);
  // envoy: the client port's server certificate (EDGE_TLS_*), through its directory mount: a
  // certificate for localhost and 127.0.0.1, its key's, issued by the CA clients are told to trust.
  const em = serviceMounts(composed, 'envoy');
  const tlsCert = hostPath(em, env['EDGE_TLS_CERT_FILE'] ?? '');
  const tlsKey = hostPath(em, env['EDGE_TLS_KEY_FILE'] ?? '');
  for (const f of [tlsCert, tlsKey]) checkSecretFile(f);
  const served = new X509Certificate(readFileSync(tlsCert));
  const edgeCa = new X509Certificate(readFileSync(join(out, COMPOSE_FILES.edgeCa)));
  assert.ok(served.checkPrivateKey(createPrivateKey(readFileSync(tlsKey))), 'EDGE_TLS_KEY_FILE is the certificate\'s key');
  assert.ok(served.checkIssued(edgeCa) && served.verify(edgeCa.publicKey), 'issued by pki/edge-ca.crt');
  assert.deepEqual([served.checkHost('localhost'), served.checkIP('127.0.0.1')], ['localhost', '127.0.0.1']);
  // backend: its certificate files.
  const bm = serviceMounts(composed, 'backend');
  for (const [k, v] of Object.entries(composed.services['backend']?.environment ?? {})) if (k.endsWith('_FILE')) checkSecretFile(hostPath(bm, v));
});

test('compose – the Envoy config the render one-shot writes is valid with the envoy service\'s mounts (real envoy --mode validate)', () => {
  const render = composed.services['render']!;
  const [node, script, outDir, ...args] = render.entrypoint!;
  // The image runs the compiled JavaScript (deploy/Dockerfile); this test runs the same renderer from its source.
  assert.deepEqual([node, script], ['node', 'envoy/render-cli.js']);
  const volumes: Record<string, string> = {};
  for (const name of Object.keys(composed.volumes)) mkdirSync(volumes[name] = join(out, 'volumes', name), { recursive: true });
  const rm = serviceMounts(composed, 'render');
  const written = hostPath(rm, outDir!, volumes);
  const write = process.stdout.write;
  process.stdout.write = () => true; // render-cli prints the path it wrote
  try {
    assert.equal(renderCli([written, ...args], render.environment), 0);
  } finally {
    process.stdout.write = write;
  }
  const envoy = composed.services['envoy']!;
  const em = serviceMounts(composed, 'envoy');
  const bootstrap = envoy.command![envoy.command!.indexOf('-c') + 1]!;
  const files: Record<string, string> = {};
  for (const f of readdirSync(written)) files[`${outDir}/${f}`] = readFileSync(join(written, f), 'utf8');
  assert.ok(files[bootstrap] !== undefined, `envoy -c ${bootstrap} is written by render`);
  validateEnvoyThroughMounts(files, bootstrap, em.map((m) => [m.target, m.kind === 'volume' ? volumes[m.source]! : m.source] as const));
  // With REDIS_URL set, the global rate limit is on by default: the TS service takes the bucket in
  // the Check Envoy already makes (no ratelimit filter, no rate limit cluster); the routes mark it.
  const doc = YAML.parse(files[bootstrap]!) as { static_resources: { clusters: { name: string; load_assignment: unknown }[] } };
  assert.doesNotMatch(files[bootstrap]!, /envoy\.filters\.http\.ratelimit/);
  assert.equal(doc.static_resources.clusters.find((c) => c.name === 'ratelimit'), undefined);
  assert.match(files[bootstrap]!, /rate_limit: global\n/);
});

test('compose-setup as root – nothing it writes is readable by a host account: every file root\'s, only what a container mounts group-readable by the dedicated EDGE_GID; the signing key and the CA keys 0400 root; a rotation keeps it so', () => {
  // The choice of the group, whoever runs the test.
  assert.equal(dedicatedGid(new Set([1, 1000, 10001, 10002])), 10003, 'the first gid from 10001 no host group or user has');
  assert.deepEqual(hostGids('root:x:0:\ncloudsdk:x:1000:\n# comment\n', 'u:x:1000:4242:x:/home/u:/bin/sh\n'), new Set([0, 1000, 4242]));
  assert.deepEqual(ownership(4242, 4343), { uid: 4242, gid: 4343, group: false }, 'a user: the containers run as that user');
  assert.deepEqual(ownership(0, 0, () => 10007), { uid: IMAGE_UID, gid: 10007, group: true });
  if (process.getuid?.() !== 0) return; // the rest is what a run as root writes (CI runs as root)
  const gid = Number(dotenv['EDGE_GID']);
  const mounted = new Set(Object.values(composed.secrets).map((d) => d.file));
  const clientDir = join(out, COMPOSE_FILES.clientCertDir);
  const sharedDirs = MOUNTED_DIRS.map((d) => join(out, d));
  assert.deepEqual(MOUNTED_DIRS, [COMPOSE_FILES.clientCertDir, COMPOSE_FILES.edgeServerDir], 'the client and the server certificate directories');
  const check = (): void => {
    const walk = (dir: string): void => {
      for (const f of readdirSync(dir)) {
        const p = join(dir, f);
        const st = lstatSync(p);
        if (st.isSymbolicLink()) continue;
        const shared = mounted.has(p) || sharedDirs.some((d) => p === d || p.startsWith(`${d}/`));
        assert.equal(st.uid, 0, `${p}: owned by root`);
        assert.equal(st.mode & 0o007, 0, `${p}: nothing for others (mode ${(st.mode & 0o777).toString(8)})`);
        if (st.isDirectory()) {
          assert.deepEqual([st.mode & 0o777, st.gid], shared ? [0o750, gid] : [0o700, 0], p);
          walk(p);
        } else {
          assert.deepEqual([st.mode & 0o777, st.gid], shared ? [0o440, gid] : [f.endsWith('.srl') ? 0o600 : 0o400, 0], p);
        }
      }
    };
    walk(join(out, '.secrets'));
  };
  check();
  for (const f of [COMPOSE_FILES.feedPrivateKey, 'pki/client-ca.key', 'pki/backend-ca.key', 'pki/edge-ca.key']) {
    assert.deepEqual([statSync(join(out, f.startsWith('pki/') ? `.secrets/${f}` : f)).mode & 0o777, statSync(join(out, f.startsWith('pki/') ? `.secrets/${f}` : f)).gid], [0o400, 0], `${f}: root's alone`);
  }
  // Who can open the files themselves: each is hard-linked into an open directory (the same inode,
  // as a container sees it through its bind mount, without the 0700 directories on the way).
  const probe = tempDir('edge-compose-probe-');
  try {
    chmodSync(probe, 0o755);
    const as = (uid: number, g: number, f: string): number | null => {
      const link = join(probe, f.replaceAll('/', '_'));
      rmSync(link, { force: true });
      linkSync(join(out, f), link);
      return spawnSync('setpriv', [`--reuid=${uid}`, `--regid=${g}`, '--clear-groups', 'cat', link], { encoding: 'utf8' }).status;
    };
    // uid 1000 with its own group (a host account, as the first user is): reads nothing.
    assert.notEqual(as(1000, 1000, COMPOSE_FILES.ingestHmac), 0, 'uid 1000 outside the group cannot read the HMAC key');
    assert.notEqual(as(1000, 1000, COMPOSE_FILES.backendKey), 0, 'nor the backend key');
    // The containers' user and group read their secrets, and not the signing key.
    assert.equal(as(IMAGE_UID, gid, COMPOSE_FILES.ingestHmac), 0, 'the containers\' user reads its secret through the group');
    assert.equal(as(IMAGE_UID, gid, COMPOSE_FILES.backendKey), 0);
    assert.notEqual(as(IMAGE_UID, gid, COMPOSE_FILES.feedPrivateKey), 0, 'but not the signing key');
  } finally {
    rmSync(probe, { recursive: true, force: true });
  }
  // A rotation publishes the new certificate group-readable before the ..data swap, and keeps the rest as it was.
  execFileSync(join(ROOT, 'scripts/node'), [join(ROOT, 'deploy/compose-setup.ts'), '--out', out, '--rotate-client-cert'], { stdio: 'pipe' });
  check();
  const key = realpathSync(join(clientDir, 'tls.key'));
  assert.deepEqual([statSync(key).mode & 0o777, statSync(key).gid, statSync(dirname(key)).mode & 0o777, statSync(dirname(key)).gid], [0o440, gid, 0o750, gid], 'the rotated key is readable by the containers');
  // The same for the client port's server certificate: a new one from the same edge CA (clients keep their --cacert).
  const serverDir = join(out, COMPOSE_FILES.edgeServerDir);
  const before = new X509Certificate(readFileSync(join(serverDir, 'tls.crt'))).fingerprint256;
  execFileSync(join(ROOT, 'scripts/node'), [join(ROOT, 'deploy/compose-setup.ts'), '--out', out, '--rotate-server-cert'], { stdio: 'pipe' });
  check();
  const rotated = new X509Certificate(readFileSync(join(serverDir, 'tls.crt')));
  assert.notEqual(rotated.fingerprint256, before, 'a new server certificate is published');
  assert.ok(rotated.checkIssued(new X509Certificate(readFileSync(join(out, COMPOSE_FILES.edgeCa)))) && rotated.checkHost('localhost') !== undefined, 'from the same edge CA, for localhost');
  assert.ok(rotated.checkPrivateKey(createPrivateKey(readFileSync(join(serverDir, 'tls.key')))), 'with its own key');
  const serverKey = realpathSync(join(serverDir, 'tls.key'));
  assert.deepEqual([statSync(serverKey).mode & 0o777, statSync(serverKey).gid, statSync(dirname(serverKey)).mode & 0o777, statSync(dirname(serverKey)).gid], [0o440, gid, 0o750, gid], 'the rotated server key is readable by the containers');
});

test('compose-setup as root – an --out only root can enter works (the engine makes the bind mounts; no container walks the host path); --gid of a host group is refused in one line, writing nothing', () => {
  if (process.getuid?.() !== 0) return;
  const parent = tempDir('edge-compose-private-');
  try {
    chmodSync(parent, 0o700);
    const taken = spawnSync(join(ROOT, 'scripts/node'), [join(ROOT, 'deploy/compose-setup.ts'), '--out', join(parent, 'taken'), '--gid', '0'], { encoding: 'utf8' });
    assert.equal(taken.status, 1, taken.stderr);
    assert.equal(taken.stderr, 'compose-setup: --gid 0: a positive number\n');
    const host = spawnSync(join(ROOT, 'scripts/node'), [join(ROOT, 'deploy/compose-setup.ts'), '--out', join(parent, 'taken'), '--gid', String([...hostGids()].find((g) => g > 0) ?? 1)], { encoding: 'utf8' });
    assert.equal(host.status, 1, host.stderr);
    assert.match(host.stderr, /^compose-setup: --gid \d+ is a host group's or user's: the containers' group must be one no host account has\n$/);
    assert.equal(statSync(join(parent, 'taken'), { throwIfNoEntry: false }), undefined, 'nothing written');
    const ok = spawnSync(join(ROOT, 'scripts/node'), [join(ROOT, 'deploy/compose-setup.ts'), '--out', join(parent, 'deploy-out')], { encoding: 'utf8' });
    assert.equal(ok.status, 0, ok.stderr);
    assert.match(ok.stdout, /secrets owned by root, read by the containers \(uid 1000\) through the dedicated group \d+\)\n$/);
  } finally {
    rmSync(parent, { recursive: true, force: true });
  }
});

test('compose-setup – a .secrets written before TLS on the client port gets its server certificate on the next run (as docker-compose.yml now mounts it); the other secrets are kept', () => {
  const again = tempDir('edge-compose-upgrade-');
  try {
    chmodSync(again, 0o755);
    const setup = (): string => execFileSync(join(ROOT, 'scripts/node'), [join(ROOT, 'deploy/compose-setup.ts'), '--out', again], { encoding: 'utf8' });
    setup();
    const hmac = readFileSync(join(again, COMPOSE_FILES.ingestHmac), 'utf8');
    const serverDir = join(again, COMPOSE_FILES.edgeServerDir);
    // What an earlier version of the script wrote: no server certificate, no edge CA.
    rmSync(serverDir, { recursive: true });
    for (const f of readdirSync(join(again, COMPOSE_FILES.pki))) if (f.startsWith('edge-')) rmSync(join(again, COMPOSE_FILES.pki, f));
    assert.match(setup(), /already exists \(admin token, server certificate and .* ensured\)/);
    assert.equal(readFileSync(join(again, COMPOSE_FILES.ingestHmac), 'utf8'), hmac, 'the HMAC key is kept');
    const cert = new X509Certificate(readFileSync(join(serverDir, 'tls.crt')));
    assert.ok(cert.checkIssued(new X509Certificate(readFileSync(join(again, COMPOSE_FILES.edgeCa)))), 'a new certificate from a new edge CA');
    const key = realpathSync(join(serverDir, 'tls.key'));
    if (process.getuid?.() === 0) {
      const gid = Number(/^EDGE_GID=(\d+)$/m.exec(readFileSync(join(again, COMPOSE_FILES.env), 'utf8'))?.[1]);
      assert.deepEqual([statSync(key).mode & 0o777, statSync(key).uid, statSync(key).gid], [0o440, 0, gid], 'readable by the containers\' group');
      assert.deepEqual([statSync(join(again, COMPOSE_FILES.pki, 'edge-ca.key')).mode & 0o777], [0o400], 'the CA key root\'s alone');
    } else {
      assert.equal(statSync(key).mode & 0o777, 0o400);
    }
  } finally {
    rmSync(again, { recursive: true, force: true });
  }
});
