/**
 * The stats listener (ENVOY_STATS_PORT, envoy/render/stats.ts): the setting, the rendered
 * listener and cluster, `envoy --mode validate`, and a live Envoy 1.40 proving that the port
 * serves GET /stats/prometheus and nothing else of the admin interface, and that the client
 * port does not serve it, and that a real Prometheus with the shipped `edge-envoy` scrape job reads it.
 *
 *   scripts/node --test envoy/test/stats-listener.test.ts
 */
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import YAML, { parse } from 'yaml';
import { ALLOW } from '../../authz/src/authz/decision.ts';
import { createGrpcServer, type AuthzGrpcServer } from '../../authz/src/authz/grpc-server.ts';
import { ConfigError, loadConfig, type Env } from '../../authz/src/common/config.ts';
import { freePort } from '../../testkit/redis-server.ts';
import { ROOT } from '../../deploy/paths.ts';
import { TOOLS } from '../../deploy/test/tools.ts';
import { setTimeout as sleep } from 'node:timers/promises';
import { envoyBinary, validateBootstrap } from '../envoy-bin.ts';
import { CLUSTER, FILTER, renderEnvoy, STATS_LISTENER, type JsonObject } from '../render.ts';
import { STATS_ROUTE } from '../render/stats.ts';
import { at, clusterNamed, hcmOf, listenerNamed, request, startEnvoy, startMarketStub, tempDir, type LiveEnvoy, type Upstream } from './helpers.ts';

const work = tempDir('edge-envoy-stats-');
after(() => work.cleanup());

function bootstrapOf(env: Env): JsonObject {
  return parse(renderEnvoy(loadConfig(env), { sdsPath: join(work.dir, 'sds.yaml') }).bootstrap) as JsonObject;
}

describe('ENVOY_STATS_PORT', () => {
  test('unset: no stats listener and no admin cluster (only the client listeners)', () => {
    const b = bootstrapOf({});
    assert.equal(loadConfig({}).envoyStatsPort, undefined);
    assert.equal(listenerNamed(b, STATS_LISTENER), undefined);
    assert.equal(clusterNamed(b, CLUSTER.envoyAdmin), undefined);
  });

  test('a port taken by another Envoy listener, or not a port, is refused naming the setting', () => {
    for (const env of [
      { ENVOY_STATS_PORT: '8080' }, { ENVOY_STATS_PORT: '9901' }, { ENVOY_STATS_PORT: '8082', INGEST_PORT: '8082' },
      { ENVOY_STATS_PORT: '0' }, { ENVOY_STATS_PORT: '65536' }, { ENVOY_STATS_PORT: 'on' },
    ]) {
      assert.throws(() => loadConfig(env), (e: unknown) => e instanceof ConfigError && e.message.includes('ENVOY_STATS_PORT'), JSON.stringify(env));
    }
  });

  test('set: a listener on all interfaces whose only upstream route is GET /stats/prometheus to the loopback admin', () => {
    const b = bootstrapOf({ ENVOY_STATS_PORT: '9902', ENVOY_ADMIN_PORT: '9911' });
    const l = listenerNamed(b, STATS_LISTENER)!;
    assert.deepEqual(at(l, 'address.socket_address'), { address: '0.0.0.0', port_value: 9902 });
    const hcm = hcmOf(b, STATS_LISTENER);
    // No rate limit, no ext_authz, no access log: the router alone.
    assert.deepEqual((hcm['http_filters'] as JsonObject[]).map((f) => f['name']), [FILTER.router]);
    assert.equal(hcm['access_log'], undefined);
    const routes = at(hcm, 'route_config.virtual_hosts[0].routes') as JsonObject[];
    assert.deepEqual(routes.map((r) => r['name']), [STATS_ROUTE.prometheus, STATS_ROUTE.notFound]);
    assert.deepEqual(at(routes[0], 'match'), { path: '/stats/prometheus', headers: [{ name: ':method', string_match: { exact: 'GET' } }] });
    assert.equal(at(routes[0], 'route.cluster'), CLUSTER.envoyAdmin);
    assert.deepEqual(at(routes[1], 'direct_response'), { status: 404 });
    const admin = clusterNamed(b, CLUSTER.envoyAdmin)!;
    assert.deepEqual(at(admin, 'load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address'), { address: '127.0.0.1', port_value: 9911 });
    // The admin interface itself stays on loopback.
    assert.deepEqual(at(b, 'admin.address.socket_address'), { address: '127.0.0.1', port_value: 9911 });
    // No client listener routes to the admin cluster.
    for (const name of ['edge', 'ingest']) {
      const hcmText = JSON.stringify(listenerNamed(bootstrapOf({ ENVOY_STATS_PORT: '9902', INGEST_PORT: '8082' }), name));
      assert.ok(!hcmText.includes(CLUSTER.envoyAdmin), name);
    }
  });

  test('envoy --mode validate accepts the bootstrap with the stats listener (and with INGEST_PORT)', { skip: spawnSync(envoyBinary(), ['--version']).status === 0 ? false : 'no Envoy binary' }, () => {
    for (const [i, env] of [{ ENVOY_STATS_PORT: '9902' }, { ENVOY_STATS_PORT: '9902', INGEST_PORT: '8082' }].entries()) {
      const file = join(work.dir, `validate-${i}.yaml`);
      writeFileSync(file, renderEnvoy(loadConfig(env), { sdsPath: join(work.dir, 'sds.yaml') }).bootstrap);
      const r = validateBootstrap(file);
      assert.ok(r.ok, r.output);
    }
  });
});

const envoyAvailable = spawnSync(envoyBinary(), ['--version']).status === 0;

describe('live Envoy 1.40: the stats port serves /stats/prometheus only', { skip: envoyAvailable ? false : 'no Envoy binary' }, () => {
  let authz: AuthzGrpcServer;
  let market: Upstream<import('node:http').Server>;
  let envoy: LiveEnvoy;
  let statsPort = 0;

  before(async () => {
    authz = createGrpcServer({ evaluate: () => ALLOW, observe: () => {}, onError: () => {} });
    const grpcPort = await authz.listen('127.0.0.1', 0);
    authz.setServing(true);
    market = await startMarketStub();
    // The admin cluster needs the admin's port before Envoy starts: both picked free here.
    statsPort = await freePort();
    const adminPort = await freePort();
    const env: Env = {
      EDGE_PORT: '0', ENVOY_ADMIN_PORT: String(adminPort), ENVOY_STATS_PORT: String(statsPort),
      AUTHZ_GRPC_PORT: String(grpcPort), MARKET_PORT: String(market.port),
    };
    const file = join(work.dir, 'live.yaml');
    writeFileSync(file, renderEnvoy(loadConfig(env), { sdsPath: join(work.dir, 'sds.yaml'), accessLogPath: join(work.dir, 'access.log') }).bootstrap);
    envoy = await startEnvoy(file, work.dir);
  });

  after(async () => {
    await envoy?.stop();
    await Promise.all([authz?.close(0), market?.close()]);
  });

  const isNotFoundJson = (res: { status: number; headers: Record<string, unknown>; body: string }, what: string): void => {
    assert.equal(res.status, 404, `${what}: ${res.body}`);
    assert.equal(res.headers['content-type'], 'application/json', what);
    assert.equal((JSON.parse(res.body) as { error: string }).error, 'not_found', what);
  };

  test('GET /stats/prometheus on the stats port returns Envoy\'s Prometheus page (envoy_* series)', async () => {
    const res = await request(statsPort, 'GET', '/stats/prometheus');
    assert.equal(res.status, 200, res.body);
    assert.match(String(res.headers['content-type']), /^text\/plain/);
    assert.match(res.body, /^# TYPE envoy_cluster_upstream_rq_total counter$/m);
    assert.match(res.body, /^envoy_cluster_upstream_rq_total\{envoy_cluster_name="market"\} \d+$/m);
    // Its own scrapes are counted under the stats listener's prefix, apart from the client listeners'.
    assert.match(res.body, new RegExp(`envoy_http_downstream_rq_total\\{envoy_http_conn_manager_prefix="${STATS_LISTENER}"\\}`));
  });

  test('every other admin endpoint on the stats port is 404 JSON and Envoy keeps running', async () => {
    const attempts: [string, string][] = [
      ['POST', '/quitquitquit'], ['POST', '/drain_listeners'], ['POST', '/drain_listeners?inboundonly'], ['POST', '/healthcheck/fail'],
      ['GET', '/config_dump'], ['GET', '/stats?format=json'], ['GET', '/stats'], ['GET', '/clusters'], ['GET', '/listeners'],
      ['POST', '/runtime_modify?x=1'], ['POST', '/logging?level=trace'], ['GET', '/certs'], ['GET', '/ready'], ['GET', '/'],
      ['POST', '/stats/prometheus'], ['HEAD', '/stats/prometheus/'], ['GET', '/stats/prometheus/../../quitquitquit'], ['POST', '/stats/prometheus/../../quitquitquit'],
      ['POST', '/reset_counters'], ['GET', '/stats/prometheusx'],
    ];
    for (const [method, path] of attempts) {
      const res = await request(statsPort, method, path);
      if (method === 'HEAD') assert.equal(res.status, 404, `${method} ${path}`);
      else isNotFoundJson(res, `${method} ${path}`);
    }
    // An escaped slash is refused outright (400 JSON), as on the client listeners.
    const escaped = await request(statsPort, 'POST', '/stats%2Fprometheus%2F..%2F..%2Fquitquitquit');
    assert.equal(escaped.status, 400, escaped.body);
    assert.equal(escaped.headers['content-type'], 'application/json');
    // Nothing reached the admin: Envoy still runs, is not draining or failing health checks,
    // and the counters were not reset.
    assert.equal(envoy.process.exitCode, null);
    const ready = await fetch(`http://127.0.0.1:${envoy.adminPort}/ready`);
    assert.equal(ready.status, 200);
    assert.equal((await ready.text()).trim(), 'LIVE');
    const stats = await envoy.stats(`http.${STATS_LISTENER}.downstream_rq_total`);
    assert.ok(Number(stats.get(`http.${STATS_LISTENER}.downstream_rq_total`)) >= 2);
    assert.equal((await request(statsPort, 'GET', '/stats/prometheus')).status, 200);
  });

  test('the client port does not serve /stats/prometheus: it is a read, routed to the market service', async () => {
    const before = market.seen.length;
    const res = await request(envoy.edgePort, 'GET', '/stats/prometheus');
    assert.equal(res.status, 200, res.body);
    assert.equal(res.body, '{"ok":true}');
    assert.ok(!res.body.includes('envoy_'));
    assert.equal(market.seen.length, before + 1);
    assert.equal(market.seen.at(-1)?.url, '/stats/prometheus');
  });

  test('a real Prometheus with deploy/prometheus/scrape.yaml\'s edge-envoy job scrapes the stats port and no other port of the pod', async (t) => {
    if (spawnSync(TOOLS.prometheus.bin, ['--version']).status !== 0) { t.skip(`no ${TOOLS.prometheus.bin}: ${TOOLS.prometheus.install}`); return; }
    // The shipped job, its Kubernetes discovery (Debian's Prometheus has none) replaced by file
    // discovery of two targets carrying the pod-role labels a kubelet's pod would give: the envoy
    // container's `envoy-stats` port and its `http` port (which the job must drop).
    const shipped = (YAML.parse(readFileSync(join(ROOT, 'deploy/prometheus/scrape.yaml'), 'utf8')) as { scrape_configs: Record<string, unknown>[] }).scrape_configs;
    const job = shipped.find((j) => j['job_name'] === 'edge-envoy')!;
    const { kubernetes_sd_configs: discovery, ...rest } = job;
    assert.deepEqual(discovery, [{ role: 'pod' }]);
    const dir = join(work.dir, 'prometheus');
    spawnSync('mkdir', ['-p', dir]);
    const pod = { __meta_kubernetes_pod_label_app: 'edge', __meta_kubernetes_namespace: 'edge', __meta_kubernetes_pod_name: 'edge-0' };
    writeFileSync(join(dir, 'targets.json'), JSON.stringify([
      { targets: [`127.0.0.1:${statsPort}`], labels: { ...pod, __meta_kubernetes_pod_container_port_name: 'envoy-stats' } },
      { targets: [`127.0.0.1:${envoy.edgePort}`], labels: { ...pod, __meta_kubernetes_pod_container_port_name: 'http' } },
    ]));
    writeFileSync(join(dir, 'prometheus.yml'), YAML.stringify({
      global: { scrape_interval: '1s', scrape_timeout: '1s' },
      scrape_configs: [{ ...rest, file_sd_configs: [{ files: [join(dir, 'targets.json')] }] }],
    }));
    const port = await freePort();
    const proc = spawn(TOOLS.prometheus.bin, [`--config.file=${join(dir, 'prometheus.yml')}`, `--storage.tsdb.path=${join(dir, 'data')}`,
      `--web.listen-address=127.0.0.1:${port}`, '--log.level=warn'], { stdio: 'ignore' });
    const exited = new Promise((r) => proc.once('exit', r));
    try {
      const query = async (expr: string): Promise<{ metric: Record<string, string>; value: [number, string] }[]> => {
        const body = await (await fetch(`http://127.0.0.1:${port}/api/v1/query?${new URLSearchParams({ query: expr })}`)).json() as { data: { result: { metric: Record<string, string>; value: [number, string] }[] } };
        return body.data.result;
      };
      let rq: Awaited<ReturnType<typeof query>> = [];
      for (const end = Date.now() + 30_000; rq.length === 0; await sleep(250)) {
        assert.ok(Date.now() < end, 'Prometheus scraped no envoy_cluster_upstream_rq_total within 30 s');
        rq = await query('envoy_cluster_upstream_rq_total{envoy_cluster_name="market"}').catch(() => []);
      }
      assert.deepEqual(rq.map((s) => [s.metric['job'], s.metric['instance'], s.metric['pod'], s.metric['namespace']]), [['edge-envoy', `127.0.0.1:${statsPort}`, 'edge-0', 'edge']]);
      // One target only (the http port was dropped by the job's keep rule), and it is up.
      assert.deepEqual((await query('up')).map((s) => [s.metric['instance'], s.value[1]]), [[`127.0.0.1:${statsPort}`, '1']]);
    } finally {
      proc.kill('SIGTERM');
      await Promise.race([exited, sleep(5000)]);
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
    }
  });
});
