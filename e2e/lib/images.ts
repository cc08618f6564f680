/**
 * The images the container tests run, and the Docker CLI they build with.
 *
 * Each third-party image has its official pinned name as the default (the one deploy/ names) and
 * an override (`ENVOY_IMAGE`, `REDIS_IMAGE`, `NODE_IMAGE`, the same variables compose reads). With
 * no override, the official image is used when it is present in the engine; otherwise the local
 * stand-in that `npm run images` builds (scripts/images.sh) when that is present; otherwise the
 * official name, which the engine will try to pull. So an image that is present is never pulled,
 * and a machine that cannot reach a registry runs on the stand-ins without any setting.
 */
import { spawnSync } from 'node:child_process';
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { existsSync } from 'node:fs';

export interface ImageChoice {
  /** The override variable (compose reads the same name). */
  readonly env: 'ENVOY_IMAGE' | 'REDIS_IMAGE' | 'NODE_IMAGE';
  readonly official: string;
  /** Built by scripts/images.sh; never tagged with the official name. */
  readonly standIn: string;
}

export const IMAGES = {
  envoy: { env: 'ENVOY_IMAGE', official: 'envoyproxy/envoy:v1.40.0', standIn: 'local/envoy:v1.40.0' },
  redis: { env: 'REDIS_IMAGE', official: 'redis:7.4-alpine', standIn: 'local/redis:7-bookworm' },
  node: { env: 'NODE_IMAGE', official: 'node:24.19.0-bookworm-slim', standIn: 'local/node:24.19.0-bookworm-slim' },
} as const satisfies Record<string, ImageChoice>;

/**
 * The Docker CLI to run. Debian's docker.io client (/usr/bin/docker) has BuildKit built in, which
 * honours deploy/Dockerfile.dockerignore and sends a context of a few kB; a newer client without
 * the buildx plugin falls back to the legacy builder, which ignores that file and sends the whole
 * checkout (node_modules, .venv: ~700 MB). DOCKER_CLI overrides.
 */
export function dockerCli(): string {
  return process.env['DOCKER_CLI'] ?? (existsSync('/usr/bin/docker') ? '/usr/bin/docker' : 'docker');
}

/** Whether the engine holds `image` (no pull). */
export function imagePresent(image: string): boolean {
  return spawnSync(dockerCli(), ['image', 'inspect', '--format', '{{.Id}}', image], { stdio: 'ignore', timeout: 15_000 }).status === 0;
}

const chosen = new Map<string, string>();

/** The image to run for `kind` (see the header). */
export function imageFor(kind: keyof typeof IMAGES, env: NodeJS.ProcessEnv = process.env): string {
  const c: ImageChoice = IMAGES[kind];
  const override = env[c.env];
  if (override !== undefined && override !== '') return override;
  let image = chosen.get(kind);
  if (image === undefined) {
    image = imagePresent(c.official) ? c.official : imagePresent(c.standIn) ? c.standIn : c.official;
    chosen.set(kind, image);
  }
  return image;
}

/** The three choices as the environment compose and the Dockerfile build read them. */
export function imageEnv(env: NodeJS.ProcessEnv = process.env): Record<ImageChoice['env'], string> {
  return { ENVOY_IMAGE: imageFor('envoy', env), REDIS_IMAGE: imageFor('redis', env), NODE_IMAGE: imageFor('node', env) };
}

export interface Engine {
  readonly ok: boolean;
  /** One line: which engine answered, or why none did (a skip reason). */
  readonly why: string;
}

/**
 * Whether a Docker engine answers `docker info` within 10 s. `.ci/run` starts one
 * (scripts/container-engine.sh) where it can; elsewhere the container tests skip with this line.
 */
export function dockerEngine(): Engine {
  const r = spawnSync(dockerCli(), ['version', '--format', '{{.Server.Version}}'], { encoding: 'utf8', timeout: 10_000 });
  if (r.error !== undefined) return { ok: false, why: `no Docker CLI (${(r.error as NodeJS.ErrnoException).code ?? r.error.message}): run bash scripts/container-engine.sh` };
  if (r.status !== 0 || r.stdout.trim() === '') {
    // Without a daemon the CLI prints why on stderr (e.g. "Cannot connect to the Docker daemon …").
    const lines = `${r.stderr}\n${r.stdout}`.split('\n').map((l) => l.trim()).filter(Boolean);
    const why = lines.find((l) => /cannot connect|permission denied|no such file|is the docker daemon/i.test(l)) ?? lines[0] ?? `exit ${r.status}`;
    return { ok: false, why: `no Docker engine answers (${why.slice(0, 200)}): run bash scripts/container-engine.sh` };
  }
  return { ok: true, why: `Docker engine ${r.stdout.trim()}` };
}

/**
 * The skip of a scenario that needs a container engine (or podman): `reason` when it cannot run
 * here, else false. Where .ci/run found or started an engine it sets EDGE_REQUIRE_CONTAINERS=1;
 * there a skip would let CI pass without the scenario, so a failing test named after it takes its
 * place instead.
 */
export function containerSkip(name: string, reason: string | undefined): string | false {
  if (reason === undefined) return false;
  if (process.env['EDGE_REQUIRE_CONTAINERS'] === '1') {
    test(`${name} – required here (EDGE_REQUIRE_CONTAINERS=1), but cannot run`, () => assert.fail(reason));
  }
  return reason;
}

/**
 * A suite that needs a container engine (or podman): `describe(name, fn)` where it can run; where
 * it cannot (containerSkip), one skipped test named after it instead. node --test counts skipped
 * tests, not skipped suites (a suite's tests are never registered), so skipped `describe`s left
 * the totals at `skipped 1` while four scenarios had not run.
 */
export function containerSuite(name: string, reason: string | undefined, fn: () => void): void {
  const skip = containerSkip(name, reason);
  if (skip === false) describe(name, fn);
  else test(name, { skip }, () => undefined);
}
