/**
 * The docs run as written (issue 32 point 2): the command blocks of README.md and docs/*.md are
 * taken from the Markdown at run time (e2e/lib/doc-blocks.ts, never a copy) and run.
 *
 * The convention, checked first over every file (e2e/lib/doc-blocks.ts says it in full): every
 * fence names its language; every ```sh block has on the line before it either
 * `<!-- doc-test: <id> -->` (a test runs it, taking it by that id, which is quoted in that test)
 * or `<!-- doc-test: not run: <why> -->`. Where they run:
 *   - this file: envoy-render-cli (docs/envoy.md); geo-audit (docs/operations.md); policy-reflection, policy-local, policy-replay,
 *     policy-ratelimit (docs/policy-testing.md) on one `npm start`; compose-walkthrough,
 *     compose-setup, compose-up, compose-ingest-order (docs/deploy.md §3) and policy-compose on one
 *     docker-compose stack; podman-walkthrough (docs/deploy.md §4) with a non-default --name,
 *     --publish and --redis-port;
 *   - e2e/start-edges.test.ts: the npm start procedures of docs/operations.md and docs/api.md's
 *     openssl-signed ingest.
 * The walkthroughs run in a copy of the checkout (the files git knows, node_modules and .venv
 * linked), as in a fresh clone: their relative paths (deploy/.secrets, .run/pod) are the copy's.
 * A test leaves out only the lines that install the machine (apt-get, npm ci), each named in
 * full, and checks what they provide instead; it replaces only what must differ on a shared
 * machine (ports, via the settings the doc names; the run directory for .run/).
 *
 * The container walkthroughs follow e2e/lib/images.ts: they skip with one line without a Docker
 * engine, docker-compose or podman (a failing test under EDGE_REQUIRE_CONTAINERS=1), use the
 * images `npm run images` built (the doc's own `npm run images` line builds only what is
 * missing), and remove everything they made: the project's containers, network and volumes, the
 * pod's objects, the copy (its key material first).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { chmodSync, existsSync, readdirSync, readFileSync, realpathSync, rmSync, symlinkSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { freePort } from '../testkit/redis-server.ts';
import { tempDir } from '../testkit/temp-dir.ts';
import { geoFixtures } from '../testkit/geo-fixtures.ts';
import { ROOT } from '../deploy/paths.ts';
import { docBlock, docFiles, fences, replacing, splitBefore, withoutLines } from './lib/doc-blocks.ts';
import { composeSkipReason, freeSubnet, interpolatedNames } from './lib/compose.ts';
import { containerSuite, dockerCli } from './lib/images.ts';
import { newPauseImages, podmanWith, probePodman } from './lib/pod.ts';
import { Collected, recordRunDir } from './lib/npm-start.ts';

/** A bash whose output is collected, in its own process group (killed whole at the end). */
class Shell extends Collected {
  constructor(script: string, cwd: string, env: NodeJS.ProcessEnv) {
    super(spawn('bash', ['-c', script], { cwd, env, stdio: ['ignore', 'pipe', 'pipe'], detached: true }));
  }
  /** `set -eo pipefail` then the block: the first failing command ends it, as a reader would stop. */
  static strict(block: string, cwd: string, env: NodeJS.ProcessEnv): Shell {
    return new Shell(`set -eo pipefail\n${block}`, cwd, env);
  }
  /** Runs to the end: exit 0 within `ms`, else the test fails with the output. */
  async ok(ms: number): Promise<string> {
    assert.equal(await this.exit(ms), 0, this.out);
    return this.out;
  }
  kill(signal: NodeJS.Signals = 'SIGKILL'): void {
    try {
      process.kill(-this.child.pid!, signal);
    } catch { /* gone */ }
  }
}

/** A copy of the checkout as a fresh clone has it: the files git knows (tracked and new), node_modules and .venv linked. */
function checkoutCopy(): string {
  const dir = tempDir('edge-docs-clone-');
  chmodSync(dir, 0o755);
  const files = execFileSync('git', ['ls-files', '-z', '-co', '--exclude-standard'], { cwd: ROOT, maxBuffer: 64 << 20 }).toString().split('\0').filter((f) => f !== '' && existsSync(join(ROOT, f)));
  execFileSync('tar', ['-C', ROOT, '--null', '-T', '-', '-cf', join(dir, '.copy.tar')], { input: files.join('\0') });
  execFileSync('tar', ['-C', dir, '-xf', join(dir, '.copy.tar')]);
  rmSync(join(dir, '.copy.tar'));
  for (const d of ['node_modules', '.venv']) symlinkSync(realpathSync(join(ROOT, d)), join(dir, d));
  return dir;
}

/** Removes a copy: the directories holding keys first, then the rest. */
function removeCopy(dir: string): void {
  for (const keys of ['deploy/.secrets', '.run/pod/secrets', '.run/pod/pki', '.run/pod/feed_private_key', '.run']) rmSync(join(dir, keys), { recursive: true, force: true });
  rmSync(dir, { recursive: true, force: true });
}

/** The test files under e2e/ and deploy/test/ (where a block's id must be named). */
function testSources(): string {
  const list = (d: string): string[] => readdirSync(join(ROOT, d), { recursive: true, encoding: 'utf8' }).filter((f) => f.endsWith('.test.ts')).map((f) => join(ROOT, d, f));
  return [...list('e2e'), ...list('deploy/test')].map((f) => readFileSync(f, 'utf8')).join('\n');
}

const SHELL_LANGS = new Set(['sh', 'bash', 'shell', 'console', 'zsh']);

test('every fenced block in README.md and docs/*.md names its language, and every sh block is run by a test (doc-test: <id>, the id quoted in that test) or says why not (doc-test: not run: …)', () => {
  const problems: string[] = [];
  const ids = new Map<string, string>();
  const sources = testSources();
  let shell = 0;
  for (const file of docFiles()) {
    for (const f of fences(file)) {
      const where = `${f.file}:${f.line}`;
      if (f.lang === '') problems.push(`${where}: a fence without a language (sh for commands, text for diagrams and output)`);
      if (SHELL_LANGS.has(f.lang) && f.lang !== 'sh') problems.push(`${where}: commands are fenced \`\`\`sh, not ${f.lang}`);
      if (f.marker !== '' && f.lang !== 'sh') problems.push(`${where}: a doc-test marker on a ${f.lang || 'plain'} block`);
      if (f.lang !== 'sh') continue;
      shell++;
      const notRun = /^doc-test: not run: (.{10,})$/.exec(f.marker);
      const id = /^doc-test: ([a-z0-9]+(?:-[a-z0-9]+)*)$/.exec(f.marker)?.[1];
      if (notRun !== null) continue;
      if (id === undefined) {
        problems.push(`${where}: no <!-- doc-test: <id> --> or <!-- doc-test: not run: <why> --> on the line before it`);
        continue;
      }
      if (ids.has(id)) problems.push(`${where}: id ${id} also at ${ids.get(id)}`);
      ids.set(id, where);
      if (!sources.includes(`'${id}'`)) problems.push(`${where}: no test names '${id}' (e2e/**/*.test.ts, deploy/test/*.test.ts)`);
    }
  }
  assert.deepEqual(problems, []);
  // The inventory is not empty by accident (a parser that finds nothing passes the loop above).
  assert.ok(shell >= 20 && ids.size >= 18, `${shell} sh blocks, ${ids.size} run by tests`);
});

test('docs/operations.md: geo:audit runs as written (a CSV and a JSON answer for the listed addresses, the comment line skipped)', { timeout: 60_000 }, () => {
  const dir = tempDir('edge-docs-geo-audit-');
  const geo = geoFixtures();
  // The deployment's environment the block assumes: the test databases and a Nevada rule.
  const env: NodeJS.ProcessEnv = { ...process.env, GEOIP_DB: geo.geoip2, BLOCKED_REGIONS: 'US-NV', REDIS_URL: '' };
  for (const k of ['GEO_POLICY_FILE', 'GEOIP_DB_SECONDARY', 'ANONYMIZER_DB', 'BLOCKED_COUNTRIES', 'CLOSE_ONLY_COUNTRIES', 'CLOSE_ONLY_REGIONS', 'GEO_UNKNOWN', 'GEO_REGION_UNKNOWN']) delete env[k];
  const block = replacing(docBlock('docs/operations.md', 'geo-audit'), [['addresses.txt', `${dir}/addresses.txt`], ['audit.csv', `${dir}/audit.csv`], ['audit.json', `${dir}/audit.json`]]);
  try {
    execFileSync('bash', ['-euo', 'pipefail', '-c', block], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'], timeout: 50_000 });
    const rows = readFileSync(join(dir, 'audit.csv'), 'utf8').trimEnd().split('\n').map((l) => l.split(',').slice(0, 8).join(','));
    assert.deepEqual(rows, [
      'address,tier,jurisdiction,country,region,verdict,rule,embedded',
      '198.18.0.7,blocked,US-NV,US,US-NV,blocked_region,region,',
      '2002:c612:7::1,blocked,US-NV,US,US-NV,blocked_region,region,6to4',
      '198.18.1.9,blocked,US,US,,unknown_region,unknown_region,',
    ]);
    const json = JSON.parse(readFileSync(join(dir, 'audit.json'), 'utf8')) as { addresses: unknown[]; errors: unknown[] };
    assert.equal(json.addresses.length, 3);
    assert.deepEqual(json.errors, []);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('docs/envoy.md: the renderer and Envoy run as written (the bootstrap validates; Envoy serves its admin /ready LIVE)', { timeout: 60_000 }, async () => {
  const dir = tempDir('edge-docs-envoy-');
  const ports = { EDGE_PORT: await freePort(), AUTHZ_GRPC_PORT: await freePort(), MARKET_PORT: await freePort(), ENVOY_ADMIN_PORT: await freePort() };
  const env: NodeJS.ProcessEnv = { ...process.env, ...Object.fromEntries(Object.entries(ports).map(([k, v]) => [k, String(v)])) };
  for (const k of ['ORDER_BACKEND_URL', 'INGEST_PORT', 'REDIS_URL', 'RATELIMIT_SERVICE_ADDRESS']) delete env[k];
  const [render, run] = splitBefore(replacing(docBlock('docs/envoy.md', 'envoy-render-cli'), [['.run/', `${dir}/`]]), '.venv/bin/envoy');
  try {
    const rendered = await Shell.strict(render, ROOT, env).ok(30_000);
    assert.ok(existsSync(join(dir, 'envoy/envoy.yaml')), rendered);
    const envoy = Shell.strict(run, ROOT, env);
    try {
      let ready = '';
      for (let i = 0; i < 100 && ready !== 'LIVE' && envoy.child.exitCode === null; i++) {
        await sleep(200);
        ready = await fetch(`http://127.0.0.1:${ports.ENVOY_ADMIN_PORT}/ready`).then(async (r) => (await r.text()).trim(), () => '');
      }
      assert.equal(ready, 'LIVE', envoy.out);
    } finally {
      envoy.kill('SIGTERM');
      await envoy.exit(20_000);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

describe('docs/policy-testing.md against npm start, as written', () => {
  let runDir = '';
  let ports: Record<string, number>;
  let env: NodeJS.ProcessEnv;
  let stack: Shell | undefined;
  /** The doc's paths and ports are the defaults: this run's instead. */
  const ours = (block: string): string => block.replaceAll('.run/', `${runDir}/`).replaceAll('127.0.0.1:9191', `127.0.0.1:${ports['AUTHZ_GRPC_PORT']}`);

  before(async () => {
    runDir = tempDir('edge-docs-policy-');
    ports = {};
    for (const k of ['EDGE_PORT', 'AUTHZ_GRPC_PORT', 'MARKET_PORT', 'AUTHZ_ADMIN_PORT', 'ENVOY_ADMIN_PORT', 'DEV_REDIS_PORT', 'DEV_BACKEND_PORT']) ports[k] = await freePort();
    env = { ...process.env, DEV_RUN_DIR: runDir, LOG_LEVEL: 'warn', SHUTDOWN_GRACE_MS: '1000' };
    for (const k of ['REDIS_URL', 'ORDER_BACKEND_URL', 'EDGE_INGEST_HMAC', 'EDGE_INGEST_HMAC_PREVIOUS', 'EDGE_FEED_ED25519_PUBLIC_KEY', 'EDGE_FEED_ED25519_KEY', 'GEOIP_DB', 'NODE_TEST_CONTEXT', 'INGEST_PORT']) delete env[k];
    for (const [k, v] of Object.entries(ports)) env[k] = String(v);
    // The RateLimitService block is "under npm start with RATELIMIT_SERVICE_ADDRESS=127.0.0.1:9191".
    env['RATELIMIT_SERVICE_ADDRESS'] = `127.0.0.1:${ports['AUTHZ_GRPC_PORT']}`;
  });
  after(async () => {
    if (stack !== undefined) {
      stack.kill('SIGINT');
      await Promise.race([stack.exited, sleep(20_000)]);
      stack.kill();
    }
    if (runDir === '') return;
    recordRunDir(runDir); // the trace audit's ledger (a no-op otherwise): this stack's keys
    for (const keys of ['pki', 'dev.env', 'admin-token', 'ratelimit-token']) rmSync(join(runDir, keys), { recursive: true, force: true });
    rmSync(runDir, { recursive: true, force: true });
  });

  test('policy-local: npm start "in another terminal", the markets, a blocked country 451; policy-reflection lists and describes; policy-replay allowed then 401 ingest_replay; policy-ratelimit OK with 39 left', { timeout: 180_000 }, async () => {
    const [start, rest] = splitBefore(docBlock('docs/policy-testing.md', 'policy-local'), 'set -a;');
    assert.match(start, /^BLOCKED_COUNTRIES=KP npm start +# in another terminal\n$/);
    stack = new Shell(ours(start), ROOT, env);
    await stack.waitFor(/start: READY/, 90_000);

    const local = await Shell.strict(ours(rest), ROOT, env).ok(60_000);
    assert.match(local, /200 \{"status":"stored","conditionId":"0xdemo"/, local);
    assert.match(local, /200 \{"status":"stored","conditionId":"0xclosed"/, local);
    assert.match(local, /"denied_response": \{\s*"status": \{\s*"code": 451\b[\s\S]*restricted_jurisdiction/, local);

    const reflection = await Shell.strict(ours(docBlock('docs/policy-testing.md', 'policy-reflection')), ROOT, env).ok(30_000);
    assert.match(reflection, /^envoy\.service\.auth\.v3\.Authorization$/m);
    assert.match(reflection, /rpc Check \( \.envoy\.service\.auth\.v3\.CheckRequest \)/);
    assert.match(reflection, /message HttpRequest \{/);

    // The blocks below run in the terminal of the one above: its keys line (the doc's) first.
    const keysLine = rest.split('\n')[0]!;
    assert.match(keysLine, /^set -a; \. \.run\/dev\.env; set \+a/);
    const replay = await Shell.strict(ours(`${keysLine}\n${docBlock('docs/policy-testing.md', 'policy-replay')}`), ROOT, env).ok(30_000);
    assert.match(replay, /"ok_response"/);
    assert.match(replay, /"denied_response"[\s\S]*"Unauthorized"[\s\S]*ingest_replay/, replay);

    const rl = await Shell.strict(ours(docBlock('docs/policy-testing.md', 'policy-ratelimit')), ROOT, env).ok(30_000);
    const answer = JSON.parse(rl) as { overallCode?: string; overall_code?: string; statuses?: { limit_remaining?: number; limitRemaining?: number }[] };
    assert.equal(answer.overall_code ?? answer.overallCode, 'OK', rl);
    assert.equal(answer.statuses?.[0]?.limit_remaining ?? answer.statuses?.[0]?.limitRemaining, 39, rl);
  });
});

/** The SHA-256 of the last accepted order in `out` (the client prints its answer without a newline). */
const orderSha = (out: string): string => {
  const m = [...out.matchAll(/200 \{"status":"accepted","bytes":64,"sha256":"([0-9a-f]{64})"/g)].map((x) => x[1]!);
  assert.ok(m.length > 0, `no accepted order in:\n${out}`);
  return m[m.length - 1]!;
};

containerSuite('docs/deploy.md §3 docker-compose, as written in a fresh copy of the checkout: the walkthrough from an empty machine, the numbered steps, and policy testing with the project\'s grpcurl', composeSkipReason(), () => {
  let copy: string;
  let env: NodeJS.ProcessEnv;
  let port: number;
  let ingestPort: number;
  const project = `edgedocs${process.pid}`;
  /** The published ports are this run's (EDGE_PUBLISH, INGEST_PUBLISH): the doc's URLs likewise. */
  const ours = (block: string): string => block.replaceAll('127.0.0.1:8080', `127.0.0.1:${port}`).replaceAll('127.0.0.1:8082', `127.0.0.1:${ingestPort}`);
  const leftovers = (): string[] => spawnSync(dockerCli(), ['ps', '-a', '-q', '--filter', `label=com.docker.compose.project=${project}`], { encoding: 'utf8' }).stdout.split('\n').filter((l) => l !== '');

  before(async () => {
    copy = checkoutCopy();
    port = await freePort();
    ingestPort = await freePort();
    env = { ...process.env };
    for (const k of Object.keys(env)) if (k.startsWith('COMPOSE_')) delete env[k];
    for (const k of [...interpolatedNames(), 'DOCKER_BUILDKIT', 'EDGE_INGEST_HMAC', 'EDGE_FEED_ED25519_KEY', 'EDGE_RUN_DIR']) delete env[k];
    // What must differ on a shared engine, through the settings the compose file and the client read.
    Object.assign(env, { COMPOSE_PROJECT_NAME: project, EDGE_PUBLISH: `127.0.0.1:${port}`, INGEST_PUBLISH: `127.0.0.1:${ingestPort}`, EDGE_SUBNET: await freeSubnet(), EDGE_PORT: String(port) });
  });
  after(async () => {
    if (copy === undefined) return;
    spawnSync('docker-compose', ['-f', join(copy, 'deploy/docker-compose.yml'), 'down', '-v', '--remove-orphans', '--timeout', '5'], { env: { ...env, PATH: `/usr/bin:${env['PATH'] ?? ''}` }, stdio: 'ignore', timeout: 90_000 });
    removeCopy(copy);
  });

  test('compose-walkthrough up to the stop, then compose-setup, compose-up, compose-ingest-order and policy-compose on the same stack, then the walkthrough\'s stop: ingest stored, the order\'s SHA-256 the same in the answer, sha256sum and the backend\'s log; nothing of the project left', { timeout: 600_000 }, async () => {
    assert.ok(existsSync(join(copy, 'node_modules/.package-lock.json')) && existsSync(join(copy, '.venv/bin/envoy')), 'npm ci && npm run setup: their result is in place (linked from the checkout)');
    const block = withoutLines(docBlock('docs/deploy.md', 'compose-walkthrough'), {
      'npm ci && npm run setup                      # Node deps; .venv with Node 24, Envoy, kubectl … (~30 s)': 'the copy links the checkout\'s node_modules and .venv (checked above); npm ci would replace the shared node_modules',
    });
    const [up, stop] = splitBefore(ours(block), 'docker-compose -f deploy/docker-compose.yml down -v');

    const walked = await Shell.strict(up, copy, env).ok(420_000);
    assert.match(walked, /\{"status":"ok"\}/);
    assert.match(walked, /200 \{"status":"stored","conditionId":"0xdemo"/, walked);
    assert.match(walked, /"conditionId":"0xdemo"/);
    const sha = orderSha(walked);
    assert.match(walked, new RegExp(`^${sha}  \\.run/order\\.bin$`, 'm'), 'sha256sum prints the same SHA-256');
    assert.match(walked, new RegExp(`"msg":"order","bytes":64,"sha256":"${sha}"[^}]*"clientCert":"edge-client-1"`), 'the backend logged it');

    // The numbered steps, as written, on the same stack (BuildKit as the paragraph above them says).
    const stepEnv = { ...env, DOCKER_BUILDKIT: '1', COMPOSE_DOCKER_CLI_BUILD: '1', PATH: `/usr/bin:${env['PATH'] ?? ''}`, NODE_IMAGE: 'local/node:24.19.0-bookworm-slim', ENVOY_IMAGE: 'local/envoy:v1.40.0', REDIS_IMAGE: 'local/redis:7-bookworm' };
    const again = await Shell.strict(docBlock('docs/deploy.md', 'compose-setup'), copy, stepEnv).ok(30_000);
    assert.match(again, /already exists/, 'a second setup keeps the secrets the stack runs with');
    await Shell.strict(docBlock('docs/deploy.md', 'compose-up'), copy, stepEnv).ok(300_000);
    const steps = await Shell.strict(ours(docBlock('docs/deploy.md', 'compose-ingest-order')), copy, stepEnv).ok(120_000);
    assert.match(steps, /200 \{"status":"stored","conditionId":"0xdemo"/, steps);
    assert.match(steps, new RegExp(`"sha256":"${orderSha(steps)}"[^}]*"clientCert":"edge-client-1"`), steps);

    const policy = await Shell.strict(docBlock('docs/policy-testing.md', 'policy-compose'), copy, stepEnv).ok(60_000);
    assert.match(policy, /"ok_response"/, policy);

    const stopped = await Shell.strict(stop, copy, env).ok(120_000);
    assert.doesNotMatch(stopped, /ERROR/, stopped);
    assert.deepEqual(leftovers(), [], 'down -v removed every container of the project');
  });
});

const podman = probePodman();

containerSuite('docs/deploy.md §4 the Podman walkthrough, as written in a fresh copy of the checkout, with --name, --publish and --redis-port not the defaults', podman.skip, () => {
  let copy: string;
  let script: Shell | undefined;
  const name = `docs${process.pid}`;

  before(() => { copy = checkoutCopy(); });
  after(async () => {
    if (copy === undefined) return;
    script?.kill();
    // What a failed run may have left: everything named in its pod.env, the Redis pids, the images.
    const envFile = join(copy, '.run/pod/pod.env');
    if (existsSync(envFile)) {
      spawnSync('bash', ['-c', `. ${envFile}
        podman pod rm -f -t 0 $POD_NAME $POD_GEOIP_UPDATE_POD
        podman volume rm -f $POD_VOLUMES
        podman network rm -f $POD_NETWORK; rm -rf /var/lib/cni/networks/$POD_NETWORK
        for f in .run/pod/redis.pid .run/pod/replica.pid; do [ -f $f ] && kill -9 $(cat $f); done
        podman rmi docker.io/local/envoy:v1.40.0 docker.io/library/edge-trading-proxy:1.0.0`], { cwd: copy, stdio: 'ignore', timeout: 120_000 });
      const conf = join(copy, '.run/pod/containers.conf');
      const p = podmanWith(conf);
      for (const image of await newPauseImages(p, podman.pauseBefore)) await p(['rmi', image]);
    }
    removeCopy(copy);
  });

  test('podman-walkthrough: the pod turns healthy, gRPC SERVING on the published port, an ingest stored with the replica in sync, the order delivered (the same SHA-256), the service exits 0 on stop, nothing of the run left', { timeout: 600_000 }, async () => {
    const [http, grpc, metrics, ingest, redis, replica] = [await freePort(), await freePort(), await freePort(), await freePort(), await freePort(), await freePort()];
    const block = replacing(withoutLines(docBlock('docs/deploy.md', 'podman-walkthrough'), {
      'apt-get install -y --no-install-recommends podman catatonit runc    # Debian\'s podman 4.3.1 (~10 s)': 'installs packages; probePodman found podman able to run a pod (else this suite skips)',
      'npm ci && npm run setup': 'the copy links the checkout\'s node_modules and .venv; npm ci would replace the shared node_modules',
    }), [['deploy/podman/setup.ts --out .run/pod ', `deploy/podman/setup.ts --out .run/pod --name ${name} --publish ${http},${grpc},${metrics},${ingest} --redis-port ${redis} --redis-replica-port ${replica} `]]);
    const env: NodeJS.ProcessEnv = { ...process.env };
    for (const k of ['CONTAINERS_CONF', 'EDGE_INGEST_HMAC', 'EDGE_FEED_ED25519_KEY', 'EDGE_CLIENT_XFF', 'EDGE_RUN_DIR', 'EDGE_PORT']) delete env[k];
    script = Shell.strict(block, copy, env);
    const out = await script.ok(540_000);
    assert.match(out, /"status": "SERVING"/, 'grpcurl on the published gRPC port');
    assert.match(out, /200 \{"status":"stored","conditionId":"0xdemo"/, out);
    const sha = orderSha(out);
    assert.match(out, new RegExp(`^${sha}  \\.run/pod/order\\.bin$`, 'm'));
    assert.match(out, new RegExp(`"sha256":"${sha}"[^}]*"clientCert":"edge-client-1"`), 'the backend logged the order');
    assert.equal(out.match(/^0$/gm)?.length, 2, 'podman wait: the CronJob\'s container exited 0; podman inspect: the TS service exited 0 on the stop');
    // Nothing of the run left in podman (its conf: the run's network configuration directory).
    const p = podmanWith(join(copy, '.run/pod/containers.conf'));
    const list = async (args: string[]): Promise<string[]> => (await p(args)).stdout.split('\n').filter((l) => l.includes(name));
    assert.deepEqual([...await list(['pod', 'ps', '--format', '{{.Name}}']), ...await list(['ps', '-a', '--format', '{{.Names}}']), ...await list(['volume', 'ls', '--format', '{{.Name}}']), ...await list(['network', 'ls', '--format', '{{.Name}}'])], []);
  });
});
