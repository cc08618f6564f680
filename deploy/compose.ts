/**
 * deploy/docker-compose.yml read the way `docker compose` reads it, for tests and tools that
 * must agree with it without a Docker engine: YAML with merge keys, `${VAR}` / `${VAR:-default}`
 * interpolation, and each service's mounts (bind mounts, named volumes, `secrets:`) resolved to
 * container path → source.
 */
import { readFileSync } from 'node:fs';
import { join, posix, resolve } from 'node:path';
import YAML from 'yaml';
import { ROOT } from './image.ts';

export const COMPOSE_FILE = join(ROOT, 'deploy/docker-compose.yml');

export interface ComposeService {
  image?: string;
  build?: { context: string; dockerfile: string };
  user?: string;
  entrypoint?: string[];
  command?: string[];
  environment?: Record<string, string>;
  ports?: string[];
  volumes?: string[];
  secrets?: (string | { source: string; target?: string })[];
  read_only?: boolean;
  tmpfs?: string[];
  network_mode?: string;
  restart?: string;
  depends_on?: Record<string, { condition: string }>;
  healthcheck?: { test: string[]; interval?: string; timeout?: string; retries?: number; start_period?: string };
  stop_grace_period?: string;
  cap_drop?: string[];
  security_opt?: string[];
}

export interface ComposeFile {
  services: Record<string, ComposeService>;
  secrets: Record<string, { file: string }>;
  volumes: Record<string, unknown>;
  networks?: { default?: { ipam?: { config?: { subnet: string }[] } } };
  [extension: `x-${string}`]: unknown;
}

/** Variables the file interpolates, with their defaults (`${NAME:-default}`); undefined = no default. */
export function composeVariables(text: string = readFileSync(COMPOSE_FILE, 'utf8')): Map<string, string | undefined> {
  const vars = new Map<string, string | undefined>();
  for (const m of text.replace(/^\s*#.*$/gm, '').matchAll(/\$\{(\w+)(?::?-([^}]*))?\}/g)) vars.set(m[1]!, m[2]);
  return vars;
}

/** Compose interpolation of one string: `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `$$`. */
export function interpolate(s: string, env: Readonly<Record<string, string | undefined>>): string {
  return s.replace(/\$\$|\$\{(\w+)(?:(:?)-([^}]*))?\}/g, (whole: string, name?: string, colon?: string, def?: string): string => {
    if (whole === '$$') return '$';
    const v = env[name!];
    if (def === undefined) {
      if (v === undefined) throw new Error(`compose: \${${name}} is not set and has no default`);
      return v;
    }
    return (colon === ':' ? v === undefined || v === '' : v === undefined) ? def : (v ?? def);
  });
}

function interpolateAll(v: unknown, env: Readonly<Record<string, string | undefined>>): unknown {
  if (typeof v === 'string') return interpolate(v, env);
  if (Array.isArray(v)) return v.map((x) => interpolateAll(x, env));
  if (v !== null && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, interpolateAll(x, env)]));
  return v;
}

/** The compose file after merge keys and interpolation (`env`: the variables, e.g. deploy/.env). */
export function loadCompose(env: Readonly<Record<string, string | undefined>> = {}, text: string = readFileSync(COMPOSE_FILE, 'utf8')): ComposeFile {
  return interpolateAll(YAML.parse(text, { merge: true }), env) as ComposeFile;
}

export interface Mount {
  /** Absolute path in the container. */
  readonly target: string;
  readonly kind: 'bind' | 'volume' | 'secret';
  /** Host path (bind, secret: relative ones resolved against `base`) or the volume's name. */
  readonly source: string;
  readonly readOnly: boolean;
}

/**
 * A service's mounts. `base` is the directory relative paths are resolved against (the
 * compose file's directory, or where compose-setup.ts wrote its files in a test).
 */
export function serviceMounts(file: ComposeFile, service: string, base: string): Mount[] {
  const svc = file.services[service];
  if (svc === undefined) throw new Error(`no service ${service}`);
  const out: Mount[] = [];
  for (const v of svc.volumes ?? []) {
    const [src, target, mode] = v.split(':') as [string, string, string | undefined];
    const bind = src.startsWith('.') || src.startsWith('/');
    out.push({ target, kind: bind ? 'bind' : 'volume', source: bind ? resolve(base, src) : src, readOnly: mode === 'ro' });
  }
  for (const s of svc.secrets ?? []) {
    const name = typeof s === 'string' ? s : s.source;
    const t = typeof s === 'string' ? name : s.target ?? name;
    const def = file.secrets[name];
    if (def === undefined) throw new Error(`${service}: secret ${name} is not defined`);
    out.push({ target: posix.isAbsolute(t) ? t : `/run/secrets/${t}`, kind: 'secret', source: resolve(base, def.file), readOnly: true });
  }
  return out;
}
