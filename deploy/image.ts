/**
 * What the service image (deploy/Dockerfile) contains, read from the Dockerfile itself, so
 * tests and the testcontainers driver agree with the image without a Docker engine:
 *
 *   parseDockerfile()    the final stage's COPYs, USER, HEALTHCHECK, ENTRYPOINT, …
 *   imageFiles()         every repository file the final stage copies from the build context
 *   stageImageTree()     those files laid out as WORKDIR (/app), with node_modules holding only
 *                        the production dependencies (what `npm ci --omit=dev` installs), so the
 *                        image's commands can be run on this machine exactly as the image runs them
 *   stageBuildContext()  a minimal build context (Dockerfile + the files it copies), so a build
 *                        never sends node_modules/.venv/secrets to the engine
 */
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { dirname, join, posix, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

/** Repository root. */
export const ROOT = fileURLToPath(new URL('../', import.meta.url));
/** The service Dockerfile, relative to the root (the build context). */
export const DOCKERFILE = 'deploy/Dockerfile';

export interface CopyInstruction {
  /** `--from=<stage>`; undefined for the build context. */
  readonly from: string | undefined;
  readonly sources: readonly string[];
  readonly dest: string;
}

export interface DockerfileFacts {
  /** `ARG` defaults by name. */
  readonly args: Readonly<Record<string, string>>;
  /** FROM of the final stage, ARGs substituted. */
  readonly baseImage: string;
  readonly workdir: string;
  readonly copies: readonly CopyInstruction[];
  /** Every RUN of the final stage. */
  readonly runs: readonly string[];
  readonly env: Readonly<Record<string, string>>;
  readonly user: string | undefined;
  readonly expose: readonly number[];
  /** HEALTHCHECK options (`--interval=10s` → interval: '10s') and its exec-form command. */
  readonly healthcheck: { readonly options: Readonly<Record<string, string>>; readonly command: readonly string[] } | undefined;
  readonly stopSignal: string | undefined;
  readonly entrypoint: readonly string[];
  /** Every stage's RUN, for checks that span stages (`npm ci --omit=dev`). */
  readonly allRuns: readonly string[];
}

/** Joins `\`-continued lines and drops comments/blank lines: one entry per instruction. */
function instructions(text: string): { op: string; rest: string }[] {
  const out: { op: string; rest: string }[] = [];
  let current = '';
  for (const raw of text.split('\n')) {
    const line = raw.trimEnd();
    if (current === '' && (line.trim() === '' || line.trimStart().startsWith('#'))) continue;
    if (line.endsWith('\\')) {
      current += `${line.slice(0, -1)} `;
      continue;
    }
    current += line;
    const m = /^\s*([A-Za-z]+)\s+([\s\S]*)$/.exec(current);
    if (m !== null) out.push({ op: m[1]!.toUpperCase(), rest: m[2]!.trim() });
    current = '';
  }
  return out;
}

function execForm(rest: string): string[] {
  if (!rest.startsWith('[')) return ['/bin/sh', '-c', rest];
  return JSON.parse(rest) as string[];
}

/** Parses the Dockerfile (default deploy/Dockerfile). Throws on instructions it does not know. */
export function parseDockerfile(text: string = readFileSync(join(ROOT, DOCKERFILE), 'utf8')): DockerfileFacts {
  const args: Record<string, string> = {};
  const sub = (s: string): string => s.replace(/\$\{(\w+)\}|\$(\w+)/g, (_, a: string | undefined, b: string | undefined) => args[(a ?? b)!] ?? '');
  let stage: Omit<DockerfileFacts, 'args' | 'allRuns'> | undefined;
  const allRuns: string[] = [];
  const fresh = (baseImage: string): typeof stage => ({
    baseImage, workdir: '/', copies: [], runs: [], env: {}, user: undefined, expose: [], healthcheck: undefined, stopSignal: undefined, entrypoint: [],
  });
  for (const { op, rest } of instructions(text)) {
    const s = stage as { -readonly [K in keyof NonNullable<typeof stage>]: NonNullable<typeof stage>[K] } | undefined;
    switch (op) {
      case 'ARG': {
        const [name, def] = rest.split('=', 2) as [string, string | undefined];
        if (def !== undefined) args[name] = def;
        break;
      }
      case 'FROM':
        stage = fresh(sub(rest.split(/\s+/)[0]!));
        break;
      case 'WORKDIR':
        s!.workdir = posix.resolve(s!.workdir, rest);
        break;
      case 'COPY': {
        const words = rest.split(/\s+/);
        const flags = words.filter((w) => w.startsWith('--'));
        const paths = words.filter((w) => !w.startsWith('--'));
        const from = flags.find((f) => f.startsWith('--from='))?.slice('--from='.length);
        (s!.copies as CopyInstruction[]).push({ from, sources: paths.slice(0, -1), dest: paths.at(-1)! });
        break;
      }
      case 'RUN':
        (s!.runs as string[]).push(rest);
        allRuns.push(rest);
        break;
      case 'ENV':
        for (const m of rest.matchAll(/(\w+)=("[^"]*"|\S+)/g)) (s!.env as Record<string, string>)[m[1]!] = m[2]!.replace(/^"|"$/g, '');
        break;
      case 'USER':
        s!.user = rest;
        break;
      case 'EXPOSE':
        s!.expose = rest.split(/\s+/).map((p) => Number(p.replace(/\/tcp$/, '')));
        break;
      case 'HEALTHCHECK': {
        const m = /^((?:--\S+\s+)*)CMD\s+(.*)$/.exec(rest);
        if (m === null) throw new Error(`HEALTHCHECK: cannot parse ${rest}`);
        const options = Object.fromEntries([...m[1]!.matchAll(/--([\w-]+)=(\S+)/g)].map((o) => [o[1]!, o[2]!]));
        s!.healthcheck = { options, command: execForm(m[2]!) };
        break;
      }
      case 'STOPSIGNAL':
        s!.stopSignal = rest;
        break;
      case 'ENTRYPOINT':
        s!.entrypoint = execForm(rest);
        break;
      case 'LABEL':
        break;
      default:
        throw new Error(`Dockerfile: instruction ${op} is not understood by deploy/image.ts`);
    }
  }
  if (stage === undefined) throw new Error('Dockerfile: no FROM');
  return { ...stage, args, allRuns };
}

function walk(abs: string): string[] {
  if (!statSync(abs).isDirectory()) return [abs];
  return readdirSync(abs).flatMap((f) => walk(join(abs, f)));
}

/** Every file the final stage copies from the build context: [repository path, path in the image]. */
export function imageFiles(facts: DockerfileFacts = parseDockerfile(), root: string = ROOT): [string, string][] {
  const out: [string, string][] = [];
  for (const c of facts.copies) {
    if (c.from !== undefined) continue;
    const destDir = posix.resolve(facts.workdir, c.dest);
    for (const src of c.sources) {
      const abs = join(root, src);
      if (!existsSync(abs)) throw new Error(`COPY source missing from the repository: ${src}`);
      for (const f of walk(abs)) {
        const inImage = statSync(abs).isDirectory() ? posix.join(destDir, relative(abs, f)) : posix.join(destDir, posix.basename(src));
        out.push([relative(root, f), inImage]);
      }
    }
  }
  return out;
}

/** Top-level packages `npm ci --omit=dev` installs (package-lock.json entries not marked dev). */
export function productionPackages(root: string = ROOT): string[] {
  const lock = JSON.parse(readFileSync(join(root, 'package-lock.json'), 'utf8')) as { packages: Record<string, { dev?: boolean }> };
  return Object.entries(lock.packages)
    .filter(([k, v]) => /^node_modules\/(?:@[^/]+\/)?[^/]+$/.test(k) && v.dev !== true)
    .map(([k]) => k.slice('node_modules/'.length));
}

/**
 * Lays the image's WORKDIR out under `dest`: the copied files, and node_modules with a symlink
 * per production package (into this checkout's node_modules). Returns the WORKDIR path.
 */
export function stageImageTree(dest: string, facts: DockerfileFacts = parseDockerfile(), root: string = ROOT): string {
  const app = join(dest, facts.workdir);
  for (const [src, inImage] of imageFiles(facts, root)) {
    const target = join(dest, inImage);
    mkdirSync(dirname(target), { recursive: true });
    cpSync(join(root, src), target);
  }
  for (const pkg of productionPackages(root)) {
    const link = join(app, 'node_modules', pkg);
    mkdirSync(dirname(link), { recursive: true });
    symlinkSync(join(root, 'node_modules', pkg), link);
  }
  return app;
}

/** Writes a build context holding only the Dockerfile and what it copies (plus package-lock.json). */
export function stageBuildContext(dest: string, root: string = ROOT): string {
  const files = new Set([DOCKERFILE, 'package.json', 'package-lock.json', ...imageFiles(parseDockerfile(), root).map(([src]) => src)]);
  for (const f of files) {
    mkdirSync(dirname(join(dest, f)), { recursive: true });
    cpSync(join(root, f), join(dest, f));
  }
  writeFileSync(join(dest, '.dockerignore'), '');
  return dest;
}

/** Relative and bare imports of a TS file that survive type stripping (`import type` is erased). */
export function runtimeImports(source: string): string[] {
  const out: string[] = [];
  const code = source.replace(/\/\*[\s\S]*?\*\//g, '').replace(/^\s*\/\/.*$/gm, '');
  for (const m of code.matchAll(/^\s*(import|export)\s+(type\s+)?[^'";]*?\bfrom\s+['"]([^'"]+)['"]/gm)) {
    if (m[2] === undefined) out.push(m[3]!);
  }
  for (const m of code.matchAll(/^\s*import\s+['"]([^'"]+)['"]/gm)) out.push(m[1]!);
  for (const m of code.matchAll(/\bimport\(\s*['"]([^'"]+)['"]\s*\)/g)) out.push(m[1]!);
  return out;
}
