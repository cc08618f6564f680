/**
 * `kustomize build` for this repository's kustomizations, in two independent ways:
 *
 * - `kustomizeBuild(dir)`: a small TypeScript implementation of exactly the features deploy/k8s
 *   uses (resources, namespace, labels, images, strategic-merge patches). Anything else in a
 *   kustomization.yaml is an error, never silently ignored.
 * - `realKustomizeBuild(dir)`: the real kustomize (the Go library, from the PyPI package
 *   pykustomize, called through Python's ctypes), when it is installed in .venv; the tests
 *   check that both agree.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import YAML from 'yaml';
import { ROOT } from '../image.ts';

export interface Resource {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string>; annotations?: Record<string, string> };
  [field: string]: unknown;
}

interface Kustomization {
  apiVersion?: string;
  kind?: string;
  resources?: string[];
  namespace?: string;
  labels?: { pairs: Record<string, string>; includeSelectors?: boolean; includeTemplates?: boolean }[];
  images?: { name: string; newName?: string; newTag?: string; digest?: string }[];
  patches?: { path: string }[];
}

const SUPPORTED = new Set(['apiVersion', 'kind', 'resources', 'namespace', 'labels', 'images', 'patches']);

/** The file's documents (YAML multi-doc), skipping empty ones. */
export function readDocs(path: string): Resource[] {
  return YAML.parseAllDocuments(readFileSync(path, 'utf8')).map((d) => d.toJSON() as Resource | null).filter((d): d is Resource => d !== null);
}

/** Strategic-merge list keys (Kubernetes' patchMergeKey) for the fields this repository patches. */
const MERGE_KEYS: Record<string, string> = {
  containers: 'name', initContainers: 'name', ephemeralContainers: 'name', volumes: 'name', env: 'name',
  volumeMounts: 'mountPath', ports: 'containerPort', topologySpreadConstraints: 'topologyKey', imagePullSecrets: 'name',
};

/** Strategic merge patch: maps merge, lists with a merge key merge by it, other lists are replaced, null deletes. */
export function strategicMerge(base: unknown, patch: unknown, field = ''): unknown {
  if (Array.isArray(patch)) {
    const key = MERGE_KEYS[field];
    if (key === undefined || !Array.isArray(base)) return structuredClone(patch);
    const out = structuredClone(base) as Record<string, unknown>[];
    for (const item of patch as Record<string, unknown>[]) {
      if (item['$patch'] !== undefined) throw new Error(`$patch directives are not supported (${field})`);
      const i = out.findIndex((b) => b[key] === item[key]);
      if (i === -1) out.push(structuredClone(item));
      else out[i] = strategicMerge(out[i], item) as Record<string, unknown>;
    }
    return out;
  }
  if (patch !== null && typeof patch === 'object') {
    if (base === null || typeof base !== 'object' || Array.isArray(base)) return structuredClone(patch);
    const out = { ...(base as Record<string, unknown>) };
    for (const [k, v] of Object.entries(patch)) {
      if (k === '$patch') throw new Error('$patch directives are not supported');
      if (v === null) delete out[k];
      else out[k] = strategicMerge(out[k], v, k);
    }
    return out;
  }
  return patch;
}

/** Every container list of a workload (Deployment, CronJob, Job, Pod, …). */
export function podSpecs(r: Resource): Record<string, unknown>[] {
  const spec = r['spec'] as Record<string, unknown> | undefined;
  if (spec === undefined) return [];
  if (r.kind === 'Pod') return [spec];
  if (r.kind === 'CronJob') {
    const job = (spec['jobTemplate'] as { spec?: { template?: { spec?: Record<string, unknown> } } } | undefined)?.spec?.template?.spec;
    return job === undefined ? [] : [job];
  }
  const t = (spec['template'] as { spec?: Record<string, unknown> } | undefined)?.spec;
  return t === undefined ? [] : [t];
}

function containersOf(r: Resource): Record<string, unknown>[] {
  return podSpecs(r).flatMap((s) => [...((s['containers'] as Record<string, unknown>[]) ?? []), ...((s['initContainers'] as Record<string, unknown>[]) ?? [])]);
}

function imageName(image: string): string {
  return image.replace(/@.*$/, '').replace(/:[^:/]+$/, '');
}

/** `kustomize build <dir>` for the features deploy/k8s uses. */
export function kustomizeBuild(dir: string): Resource[] {
  const k = YAML.parse(readFileSync(join(dir, 'kustomization.yaml'), 'utf8')) as Kustomization;
  for (const f of Object.keys(k)) if (!SUPPORTED.has(f)) throw new Error(`${dir}/kustomization.yaml: field ${f} is not supported by deploy/k8s/kustomize.ts`);
  let out: Resource[] = [];
  for (const r of k.resources ?? []) {
    const p = resolve(dir, r);
    out.push(...(statSync(p).isDirectory() ? kustomizeBuild(p) : readDocs(p)));
  }
  const id = (r: Resource): string => `${r.kind}/${r.metadata.name}`;
  const seen = new Set<string>();
  for (const r of out) {
    if (seen.has(id(r))) throw new Error(`${dir}: duplicate resource ${id(r)}`);
    seen.add(id(r));
  }
  for (const p of k.patches ?? []) {
    for (const patch of readDocs(resolve(dir, p.path))) {
      const i = out.findIndex((r) => r.kind === patch.kind && r.metadata.name === patch.metadata.name);
      if (i === -1) throw new Error(`${dir}: patch ${p.path} targets ${id(patch)}, which no resource defines`);
      out[i] = strategicMerge(out[i], patch) as Resource;
    }
  }
  if (k.namespace !== undefined) out = out.map((r) => ({ ...r, metadata: { ...r.metadata, namespace: k.namespace! } }));
  for (const l of k.labels ?? []) {
    if (l.includeSelectors === true || l.includeTemplates === true) throw new Error('labels with includeSelectors/includeTemplates are not supported');
    out = out.map((r) => ({ ...r, metadata: { ...r.metadata, labels: { ...r.metadata.labels, ...l.pairs } } }));
  }
  for (const img of k.images ?? []) {
    for (const r of out) {
      for (const c of containersOf(r)) {
        const image = String(c['image']);
        if (imageName(image) !== img.name) continue;
        const tag = img.digest !== undefined ? `@${img.digest}` : img.newTag !== undefined ? `:${img.newTag}` : image.slice(imageName(image).length);
        c['image'] = `${img.newName ?? img.name}${tag}`;
      }
    }
  }
  return out;
}

/** The real kustomize library shipped in the PyPI package pykustomize, if installed in .venv. */
export function realKustomizeLibrary(root: string = ROOT): string | undefined {
  const lib = join(root, '.venv', 'lib');
  if (!existsSync(lib)) return undefined;
  for (const py of readdirSync(lib)) {
    const so = join(lib, py, 'site-packages/pykustomize/_lib/linux-amd64/libpykustomize.so');
    if (existsSync(so) && process.platform === 'linux' && process.arch === 'x64') return so;
  }
  return undefined;
}

const PY_BUILD = `
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.pykustomize_build.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
lib.pykustomize_last_error.restype = ctypes.c_void_p
out = ctypes.c_void_p()
if lib.pykustomize_build(sys.argv[2].encode(), b'{}', ctypes.byref(out)) != 0:
    err = lib.pykustomize_last_error()
    sys.exit('kustomize: ' + (ctypes.string_at(err).decode() if err else 'failed'))
sys.stdout.write(ctypes.string_at(out).decode())
`;

/** `kustomize build <dir>` with the real kustomize; undefined when it is not installed. */
export function realKustomizeBuild(dir: string, root: string = ROOT): Resource[] | undefined {
  const so = realKustomizeLibrary(root);
  if (so === undefined) return undefined;
  const yaml = execFileSync(join(root, '.venv/bin/python'), ['-c', PY_BUILD, so, dir], { encoding: 'utf8' });
  return YAML.parseAllDocuments(yaml).map((d) => d.toJSON() as Resource).filter((d) => d !== null);
}
