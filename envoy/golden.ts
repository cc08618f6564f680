/**
 * Golden files: the Envoy configuration each shipped profile renders, checked in under
 * envoy/golden/<profile>/ (the files as the profile writes them: envoy.yaml and its SDS files),
 * so a review reads the effect of a renderer change, not only the code that makes it.
 *
 *   npm run render:golden                   # rewrite envoy/golden/ from the current renderer
 *   scripts/node envoy/golden.ts --check    # exit 1 naming every stale or missing file
 *
 * envoy/test/golden.test.ts fails when a file is stale and validates every profile's files with
 * the real `envoy --mode validate`. Each profile is taken from where it ships, not restated:
 *   npm-start            scripts/start.ts with no settings (redis-server installed: its REDIS_URL,
 *                        so the global rate limit is on, taken in the Check; the demo backend on
 *                        DEV_BACKEND_PORT 8443; Unix sockets in the run directory)
 *   rate-limit-local     the same with RATE_LIMIT_SCOPE=local (the global rate limit off)
 *   rate-limit-service   the same with RATELIMIT_SERVICE_ADDRESS naming this stack's TS service
 *                        (Envoy's ratelimit filter; npm start then generates ratelimit-token)
 *   tls                  the same with DEV_EDGE_TLS=1 (EDGE_TLS_CERT_FILE/KEY_FILE: the development
 *                        server certificate)
 *   tls-client-cert      the same with client certificates required (EDGE_TLS_CLIENT_AUTH=required,
 *                        EDGE_TLS_CLIENT_CA_FILE the development client CA)
 *   proxy-protocol       the same with EDGE_PROXY_PROTOCOL=required
 *   traces               the same with OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 (Envoy's
 *                        OpenTelemetry tracer, the default sampler)
 *   compose              deploy/docker-compose.yml's `render` one-shot: its environment as the real
 *                        `docker-compose config` interpolates it with no variable set, its arguments
 *   k8s-production       the edge-envoy ConfigMap of deploy/k8s/overlays/production (deploy/k8s/render.ts)
 * npm start's profiles mirror what scripts/start.ts sets before it renders (start.ts is a
 * top-level program, not a function to call): a change there must be made here too.
 *
 * Machine-specific values never enter: npm start's run directory (DEV_RUN_DIR, default .run/) is
 * written RUN_DIR below, every port is the setting's default (npm start refuses port 0), nothing
 * is read from this process's environment, and the container profiles use container paths.
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { parseArgs } from 'node:util';
import YAML from 'yaml';
import { loadConfig, type Env } from '../authz/src/common/config.ts';
import { GENERATED, renderManifests } from '../deploy/k8s/render.ts';
import { REPO_ROOT } from './envoy-bin.ts';
import { renderEnvoy, SERVER_SDS_FILE, type AllowedHeaders, type RenderedEnvoy, type RenderOptions } from './render.ts';

/** Where the golden files live: one directory per profile. */
export const GOLDEN_DIR = join(REPO_ROOT, 'envoy', 'golden');

/** npm start's run directory as the golden files write it (a fixed path: no machine's own). */
export const RUN_DIR = '/DEV_RUN_DIR';

/** The files of one profile, by the name the profile writes them under. */
export type GoldenFiles = Readonly<Record<string, string>>;

export interface GoldenProfile {
  /** How the profile is rendered, in one line (the golden files' header). */
  readonly what: string;
  /** The files, rendered now. */
  render(): GoldenFiles;
}

/** The files a renderer result gives, named as `npm start` / render-cli write them. */
function filesOf(r: RenderedEnvoy, sdsName: string): GoldenFiles {
  if (r.warnings.length > 0) throw new Error(`renderer warnings: ${r.warnings.join('; ')}`);
  return {
    'envoy.yaml': r.bootstrap,
    ...(r.sds === undefined ? {} : { [sdsName]: r.sds }),
    ...(r.serverSds === undefined ? {} : { [SERVER_SDS_FILE]: r.serverSds }),
  };
}

/**
 * The environment scripts/start.ts renders Envoy's config from when given only `settings`, with
 * run directory `run`: redis-server installed (its own on DEV_REDIS_PORT 6390), the demo backend
 * (DEV_BACKEND_PORT 8443, the development PKI under pki/), Unix sockets under sockets/ (not for the
 * gRPC service when RATELIMIT_SERVICE_ADDRESS is set), DEV_EDGE_TLS's certificate under pki/edge-server/.
 */
export function npmStartEnv(run: string, settings: Readonly<Record<string, string>> = {}): Env {
  const env: Record<string, string> = {
    ...settings,
    AUTHZ_ADMIN_TOKEN_FILE: join(run, 'admin-token'),
    AUTHZ_SEAL_FILE: join(run, 'sealed'),
    MARKET_SOCKET: join(run, 'sockets', 'market.sock'),
    GEOIP_DB: join(run, 'geoip', 'country.mmdb'),
    REDIS_URL: 'redis://127.0.0.1:6390/0',
    ORDER_BACKEND_URL: 'https://localhost:8443',
    ORDER_BACKEND_CA_FILE: join(run, 'pki', 'backend-ca.crt'),
    EDGE_CLIENT_CERT_FILE: join(run, 'pki', 'client', 'tls.crt'),
    EDGE_CLIENT_KEY_FILE: join(run, 'pki', 'client', 'tls.key'),
  };
  if (settings['RATELIMIT_SERVICE_ADDRESS'] === undefined) env['AUTHZ_GRPC_SOCKET'] = join(run, 'sockets', 'authz.sock');
  else env['RATELIMIT_SERVICE_TOKEN_FILE'] = join(run, 'ratelimit-token');
  if (settings['DEV_EDGE_TLS'] === '1') {
    delete env['DEV_EDGE_TLS'];
    env['EDGE_TLS_CERT_FILE'] = join(run, 'pki', 'edge-server', 'tls.crt');
    env['EDGE_TLS_KEY_FILE'] = join(run, 'pki', 'edge-server', 'tls.key');
  }
  return env;
}

/** npm start's files (envoy.yaml, sds.yaml, sds-server-cert.yaml) for `settings`, with run directory `run`. */
export function renderNpmStart(settings: Readonly<Record<string, string>> = {}, run = RUN_DIR): GoldenFiles {
  return filesOf(renderEnvoy(loadConfig(npmStartEnv(run, settings)), { sdsPath: join(run, 'sds.yaml') }), 'sds.yaml');
}

/** `docker-compose config` of deploy/docker-compose.yml with no variable set and no deploy/.env. */
function composeConfig(): { services: Record<string, { entrypoint?: string[]; environment?: Record<string, string> }> } {
  const dir = mkdtempSync(join(tmpdir(), 'edge-golden-compose-'));
  try {
    writeFileSync(join(dir, 'empty.env'), '');
    const r = spawnSync('docker-compose', ['-f', join(REPO_ROOT, 'deploy', 'docker-compose.yml'), '--env-file', join(dir, 'empty.env'), 'config'], {
      encoding: 'utf8', cwd: dir, env: { PATH: process.env['PATH'] ?? '/usr/bin:/bin' }, maxBuffer: 16 << 20,
    });
    if (r.error !== undefined) throw new Error(`docker-compose: ${r.error.message} (install it: apt-get install docker-compose)`);
    if (r.status !== 0) throw new Error(`docker-compose config failed (exit ${r.status}): ${r.stderr}`);
    return YAML.parse(r.stdout) as ReturnType<typeof composeConfig>;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** The compose `render` one-shot's files: its environment and render-cli arguments (deploy/docker-compose.yml). */
export function renderCompose(): GoldenFiles {
  const render = composeConfig().services['render'];
  const [, script, , ...args] = render?.entrypoint ?? [];
  if (script !== 'envoy/render-cli.js') throw new Error(`compose's render service runs ${String(script)}, not envoy/render-cli.js`);
  const { values } = parseArgs({
    args, strict: true,
    options: { 'sds-path': { type: 'string' }, 'node-id': { type: 'string' }, 'access-log': { type: 'string' }, 'allowed-headers': { type: 'string' } },
  });
  if (values['sds-path'] === undefined) throw new Error('compose\'s render service gives no --sds-path: its bootstrap would name the volume\'s path');
  const opts: RenderOptions = {
    sdsPath: values['sds-path'], nodeId: values['node-id'], accessLogPath: values['access-log'],
    allowedHeaders: (values['allowed-headers'] ?? 'minimal') as AllowedHeaders,
  };
  return filesOf(renderEnvoy(loadConfig(render?.environment ?? {}), opts), 'sds-client-cert.yaml');
}

/** The production pod's files: the edge-envoy ConfigMap's data as deploy/k8s/render.ts renders it. */
export function renderK8sProduction(): GoldenFiles {
  const text = renderManifests()[GENERATED.production];
  if (text === undefined) throw new Error('deploy/k8s/render.ts renders no production overlay');
  const map = YAML.parseAllDocuments(text).map((d) => d.toJSON() as { kind?: string; metadata?: { name?: string }; data?: Record<string, string> })
    .find((d) => d.kind === 'ConfigMap' && d.metadata?.name === 'edge-envoy');
  if (map?.data === undefined) throw new Error('the production overlay has no edge-envoy ConfigMap');
  return map.data;
}

/** Every shipped profile, by the directory its golden files live in. */
export const PROFILES: Readonly<Record<string, GoldenProfile>> = {
  'npm-start': { what: 'npm start with no settings (scripts/start.ts)', render: () => renderNpmStart() },
  'rate-limit-local': { what: 'npm start with RATE_LIMIT_SCOPE=local: the global rate limit off', render: () => renderNpmStart({ RATE_LIMIT_SCOPE: 'local' }) },
  'rate-limit-service': {
    what: 'npm start with RATELIMIT_SERVICE_ADDRESS=127.0.0.1:9191: the global rate limit asked by Envoy\'s ratelimit filter',
    render: () => renderNpmStart({ RATELIMIT_SERVICE_ADDRESS: '127.0.0.1:9191' }),
  },
  tls: { what: 'npm start with DEV_EDGE_TLS=1: TLS on the client port (EDGE_TLS_CERT_FILE, EDGE_TLS_KEY_FILE)', render: () => renderNpmStart({ DEV_EDGE_TLS: '1' }) },
  'tls-client-cert': {
    what: 'npm start with DEV_EDGE_TLS=1, EDGE_TLS_CLIENT_AUTH=required and EDGE_TLS_CLIENT_CA_FILE the development client CA',
    render: () => renderNpmStart({ DEV_EDGE_TLS: '1', EDGE_TLS_CLIENT_AUTH: 'required', EDGE_TLS_CLIENT_CA_FILE: join(RUN_DIR, 'pki', 'client-ca.crt') }),
  },
  'proxy-protocol': { what: 'npm start with EDGE_PROXY_PROTOCOL=required', render: () => renderNpmStart({ EDGE_PROXY_PROTOCOL: 'required' }) },
  traces: {
    what: 'npm start with OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317: Envoy\'s OpenTelemetry tracer, the default sampler',
    render: () => renderNpmStart({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://127.0.0.1:4317' }),
  },
  compose: { what: 'deploy/docker-compose.yml\'s render one-shot, no variable set', render: renderCompose },
  'k8s-production': { what: 'the production pod: deploy/k8s/overlays/production, edge-envoy ConfigMap (deploy/k8s/render.ts)', render: renderK8sProduction },
};

/** A golden file's text: a header naming its profile and how to regenerate it, then the rendered file as it is. */
export function goldenText(profile: string, file: string, rendered: string): string {
  const what = PROFILES[profile]?.what ?? profile;
  return `# GOLDEN FILE (envoy/golden.ts): ${file} of profile ${profile}: ${what}.\n`
    + '# Do not edit; after a renderer change run: npm run render:golden, and review the diff.\n'
    + rendered;
}

/** Every golden file's path (relative to GOLDEN_DIR) and fresh content. */
export function renderGolden(): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, profile] of Object.entries(PROFILES)) {
    for (const [file, text] of Object.entries(profile.render())) out[join(name, file)] = goldenText(name, file, text);
  }
  return out;
}

/** Files under `dir` (default GOLDEN_DIR; relative paths), whatever their profile. */
export function committedGolden(dir = GOLDEN_DIR): string[] {
  const out: string[] = [];
  let profiles: string[] = [];
  try {
    profiles = readdirSync(dir);
  } catch { /* none yet */ }
  for (const d of profiles) for (const f of readdirSync(join(dir, d))) out.push(join(d, f));
  return out.sort();
}

/** What differs between the golden files under `dir` and `fresh`: stale, missing and extra paths. */
export function goldenDrift(fresh: Readonly<Record<string, string>> = renderGolden(), dir = GOLDEN_DIR): { stale: string[]; missing: string[]; extra: string[] } {
  const committed = new Set(committedGolden(dir));
  const stale: string[] = [];
  const missing: string[] = [];
  for (const [path, text] of Object.entries(fresh)) {
    if (!committed.has(path)) missing.push(path);
    else if (readFileSync(join(dir, path), 'utf8') !== text) stale.push(path);
  }
  return { stale, missing, extra: [...committed].filter((p) => fresh[p] === undefined) };
}

/** Replaces everything under `dir` (default GOLDEN_DIR) by `files`. */
export function writeGolden(files: Readonly<Record<string, string>>, dir = GOLDEN_DIR): void {
  rmSync(dir, { recursive: true, force: true });
  for (const [path, text] of Object.entries(files)) {
    mkdirSync(dirname(join(dir, path)), { recursive: true });
    writeFileSync(join(dir, path), text);
  }
}

if (import.meta.main) {
  const fresh = renderGolden();
  if (process.argv.includes('--check')) {
    const { stale, missing, extra } = goldenDrift(fresh);
    for (const [what, paths] of [['stale', stale], ['missing', missing], ['not rendered by any profile', extra]] as const) {
      for (const p of paths) process.stderr.write(`envoy/golden/${p}: ${what}\n`);
    }
    if (stale.length + missing.length + extra.length > 0) {
      process.stderr.write('run: npm run render:golden (and review the diff: git diff envoy/golden/)\n');
      process.exitCode = 1;
    }
  } else {
    writeGolden(fresh);
    process.stdout.write(`wrote ${Object.keys(fresh).length} files under envoy/golden/ (${Object.keys(PROFILES).join(', ')})\n`);
  }
}
