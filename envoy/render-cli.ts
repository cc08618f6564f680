/**
 * Writes the Envoy bootstrap and the client-certificate SDS file for the current environment.
 *
 *   scripts/node envoy/render-cli.ts <out-dir> [--sds-path <path>] [--access-log <path>]
 *       [--node-id <id>] [--allowed-headers minimal|all] [--ratelimit-config <file>] [--validate]
 *
 * Output: <out-dir>/envoy.yaml and, when ORDER_BACKEND_URL is set, <out-dir>/sds-client-cert.yaml;
 * with EDGE_TLS_CERT_FILE, <out-dir>/sds-server-cert.yaml (read beside the client one: `--sds-path`'s directory).
 * The bootstrap refers to the SDS file by absolute path: by default where it was written;
 * `--sds-path` names where it will be mounted instead (Kubernetes ConfigMap, container image).
 * Files are replaced atomically (write + rename), so a running Envoy never reads half a file.
 * `--ratelimit-config <file>` also writes the same rate limit as an envoyproxy/ratelimit config
 * file (domain, descriptors, RPS_PER_IP per second), for RATELIMIT_SERVICE_ADDRESS pointing at
 * that service instead of the TS one (docs/operations.md, "Another rate limit service").
 * `--validate` then runs `envoy --mode validate` and checks the certificate files are readable
 * (validate mode only warns about a broken SDS resource; docs/envoy.md §6).
 * Exit status: 0 written (and valid), 1 bad setting or invalid config, 2 usage.
 */
import { accessSync, constants, mkdirSync, renameSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { ConfigError, loadConfig } from '../authz/src/common/config.ts';
import { validateBootstrap } from './envoy-bin.ts';
import { rateLimitServiceConfig, renderEnvoy, SERVER_SDS_FILE, type AllowedHeaders } from './render.ts';

export const BOOTSTRAP_FILE = 'envoy.yaml';
export const SDS_FILE = 'sds-client-cert.yaml';

function writeAtomic(path: string, text: string, mode: number): void {
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, text, { mode });
  renameSync(tmp, path);
}

class UsageError extends Error {}

const USAGE = 'usage: render-cli.ts <out-dir> [--sds-path <path>] [--access-log <path>] [--node-id <id>] '
  + '[--allowed-headers minimal|all] [--ratelimit-config <file>] [--validate]';

/** The CLI, callable from tests. Returns the exit status. */
export function main(argv: readonly string[], env: Readonly<Record<string, string | undefined>> = process.env): number {
  try {
    const { values, positionals } = parseArgs({
      args: [...argv],
      allowPositionals: true,
      options: {
        'sds-path': { type: 'string' },
        'access-log': { type: 'string' },
        'node-id': { type: 'string' },
        'allowed-headers': { type: 'string' },
        'ratelimit-config': { type: 'string' },
        validate: { type: 'boolean' },
      },
    });
    if (positionals.length !== 1) throw new UsageError('expected exactly one <out-dir>');
    const allowed = values['allowed-headers'] ?? 'minimal';
    if (allowed !== 'minimal' && allowed !== 'all') throw new UsageError(`--allowed-headers: expected minimal or all, got ${allowed}`);
    const outDir = resolve(positionals[0]!);
    const config = loadConfig(env);
    const sdsPath = values['sds-path'] ?? join(outDir, SDS_FILE);
    const rendered = renderEnvoy(config, {
      sdsPath,
      accessLogPath: values['access-log'],
      nodeId: values['node-id'],
      allowedHeaders: allowed as AllowedHeaders,
    });
    for (const w of rendered.warnings) process.stderr.write(`render-cli: warning: ${w}\n`);
    mkdirSync(outDir, { recursive: true });
    const bootstrapPath = join(outDir, BOOTSTRAP_FILE);
    writeAtomic(bootstrapPath, rendered.bootstrap, 0o644);
    if (rendered.sds !== undefined) writeAtomic(join(outDir, SDS_FILE), rendered.sds, 0o644);
    if (rendered.serverSds !== undefined) writeAtomic(join(outDir, SERVER_SDS_FILE), rendered.serverSds, 0o644);
    process.stdout.write(`${bootstrapPath}\n`);
    const rlsConfig = values['ratelimit-config'];
    if (rlsConfig !== undefined) {
      const path = resolve(rlsConfig);
      mkdirSync(dirname(path), { recursive: true });
      writeAtomic(path, rateLimitServiceConfig(config), 0o644);
      process.stdout.write(`${path}\n`);
    }
    if (values.validate) {
      const backend = config.orderBackend;
      if (backend !== undefined) {
        for (const f of [backend.clientCertFile, backend.clientKeyFile, backend.caFile]) accessSync(f, constants.R_OK);
      }
      const tls = config.edgeTls;
      if (tls !== undefined) for (const f of [tls.certFile, tls.keyFile, tls.clientCaFile]) if (f !== undefined) accessSync(f, constants.R_OK);
      const v = validateBootstrap(bootstrapPath);
      if (!v.ok) {
        process.stderr.write(`render-cli: envoy --mode validate failed (exit ${v.exitCode}):\n${v.output}\n`);
        return 1;
      }
    }
    return 0;
  } catch (err) {
    if (err instanceof UsageError || (err instanceof TypeError && 'code' in err && String(err.code).startsWith('ERR_PARSE_ARGS'))) {
      process.stderr.write(`render-cli: ${err.message}\n${USAGE}\n`);
      return 2;
    }
    if (err instanceof ConfigError) {
      process.stderr.write(`render-cli: ${err.message}\n`);
      return 1;
    }
    if (err instanceof Error && 'code' in err && (err.code === 'ENOENT' || err.code === 'EACCES')) {
      process.stderr.write(`render-cli: ${err.message}\n`);
      return 1;
    }
    throw err;
  }
}

if (import.meta.main) process.exitCode = main(process.argv.slice(2));
