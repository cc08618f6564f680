/**
 * Shared checks for the deploy tests: which settings the service really reads, and
 * `envoy --mode validate` of a config as a container would see it through its mounts.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import YAML from 'yaml';
import { loadConfig, type Env } from '../../authz/src/common/config.ts';
import { loadCredentials } from '../../authz/src/common/credentials.ts';
import { validateBootstrap } from '../../envoy/envoy-bin.ts';
import { ROOT } from '../paths.ts';
import { tempDir } from '../../testkit/temp-dir.ts';

/**
 * Every environment variable name the TS service (config.ts + credentials.ts) and the Envoy
 * renderer read, observed by running them on recording environments (not by grepping source):
 * with and without an order backend, and with secrets given directly and as *_FILE.
 */
export function settingsRead(): Set<string> {
  const seen = new Set<string>();
  const recording = (base: Record<string, string>): Env => new Proxy(base, {
    get(target, key) {
      if (typeof key === 'string') seen.add(key);
      return target[key as string];
    },
  });
  const dir = tempDir('edge-settings-');
  const file = (name: string, text: string): string => {
    writeFileSync(join(dir, name), text);
    return join(dir, name);
  };
  const feed = 'ab'.repeat(32);
  loadConfig(recording({}));
  loadConfig(recording({ ORDER_BACKEND_URL: 'https://backend:8443', ORDER_BACKEND_CA_FILE: 'a', EDGE_CLIENT_CERT_FILE: 'b', EDGE_CLIENT_KEY_FILE: 'c' }));
  loadCredentials(recording({ EDGE_INGEST_HMAC: 'x'.repeat(32), EDGE_INGEST_HMAC_PREVIOUS: 'y'.repeat(32), EDGE_FEED_ED25519_PUBLIC_KEY: feed, EDGE_FEED_ED25519_KEY: '01'.repeat(32) }));
  loadCredentials(recording({
    EDGE_INGEST_HMAC_FILE: file('h', 'x'.repeat(32)), EDGE_INGEST_HMAC_PREVIOUS_FILE: file('p', ''),
    EDGE_FEED_ED25519_PUBLIC_KEY_FILE: file('f', feed), EDGE_FEED_ED25519_KEY_FILE: file('k', ''),
  }));
  rmSync(dir, { recursive: true, force: true });
  return seen;
}

/** Names the demo order backend entry (scripts/dev/order-backend-main.ts) reads. */
export function backendSettings(): Set<string> {
  const src = readFileSync(join(ROOT, 'scripts/dev/order-backend-main.ts'), 'utf8');
  return new Set([...src.matchAll(/(?:need\(|process\.env\[)'([A-Z_]+)'/g)].map((m) => m[1]!));
}

/**
 * Maps every file-system path an Envoy bootstrap or SDS resource reads: `filename` (data
 * sources), `path` of a path_config_source or watched_directory, and a file access log's `path`.
 */
function mapEnvoyPaths(value: unknown, fn: (path: string) => string, key = '', parent = ''): unknown {
  if (Array.isArray(value)) return value.map((x) => mapEnvoyPaths(x, fn, key, parent));
  if (value !== null && typeof value === 'object') {
    const fileLog = String((value as Record<string, unknown>)['@type']).endsWith('.FileAccessLog');
    return Object.fromEntries(Object.entries(value).map(([k, x]) => [k, mapEnvoyPaths(x, fn, k, fileLog && k === 'path' ? 'file_access_log' : key)]));
  }
  const fsPath = key === 'filename' || (key === 'path' && ['path_config_source', 'watched_directory', 'file_access_log'].includes(parent));
  return typeof value === 'string' && fsPath ? fn(value) : value;
}

/** The absolute paths a bootstrap or SDS resource makes Envoy read. */
export function envoyPaths(yamlText: string): string[] {
  const out: string[] = [];
  mapEnvoyPaths(YAML.parse(yamlText), (p) => (out.push(p), p));
  return out;
}

/**
 * Validates Envoy's config as a container sees it. `files` are the config files by container
 * path (bootstrap, SDS resource); `mounts` map the container's other paths (directories or
 * files) to host paths. Every path Envoy reads must be one of `files` or lie under a mount and
 * exist on the host; then the real `envoy --mode validate` runs with those paths mapped.
 */
export function validateEnvoyThroughMounts(files: Readonly<Record<string, string>>, bootstrapPath: string, mounts: readonly (readonly [string, string])[]): void {
  const root = tempDir('edge-envoy-validate-');
  const byLength = [...mounts].sort((a, b) => b[0].length - a[0].length);
  const hostOf = (p: string): string => {
    if (files[p] !== undefined) return join(root, p);
    const m = byLength.find(([c]) => p === c || p.startsWith(`${c}/`));
    assert.ok(m !== undefined, `Envoy reads ${p}, which no mount provides`);
    const host = m[1] + p.slice(m[0].length);
    assert.ok(existsSync(host), `Envoy reads ${p} → ${host}, which does not exist`);
    return host;
  };
  for (const [containerPath, text] of Object.entries(files)) {
    const host = join(root, containerPath);
    mkdirSync(dirname(host), { recursive: true });
    writeFileSync(host, YAML.stringify(mapEnvoyPaths(YAML.parse(text), hostOf)));
  }
  const v = validateBootstrap(join(root, bootstrapPath));
  rmSync(root, { recursive: true, force: true });
  assert.ok(v.ok, v.output);
}
