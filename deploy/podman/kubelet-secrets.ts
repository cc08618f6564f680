/**
 * The kubelet's secret volume layout, written on the host for a hostPath volume: files under
 * ..<timestamp>/, the ..data symlink swapped atomically, one symlink per file (what a kubelet does
 * when a Secret changes, so rotation behaves as in a cluster).
 */
import { randomBytes } from 'node:crypto';
import { chmodSync, chownSync, lstatSync, mkdirSync, readlinkSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';


function kubeletStamp(): string {
  const d = new Date();
  const p = (n: number): string => String(n).padStart(2, '0');
  return `..${d.getUTCFullYear()}_${p(d.getUTCMonth() + 1)}_${p(d.getUTCDate())}_${p(d.getUTCHours())}_${p(d.getUTCMinutes())}_${p(d.getUTCSeconds())}.${randomBytes(4).readUInt32BE(0)}`;
}

function present(path: string): boolean {
  return lstatSync(path, { throwIfNoEntry: false }) !== undefined;
}

/**
 * Publishes `files` into `dir` as the kubelet's AtomicWriter does for a secret volume, and with
 * the ownership its fsGroup handling gives them: the files in a new ..<timestamp> directory (0440,
 * group `gid`), ..data_tmp → that directory renamed over ..data (one atomic swap that a watcher
 * of `dir` sees, e.g. Envoy's SDS watched_directory), <file> → ..data/<file> links, the previous
 * ..<timestamp> directory removed.
 */
export function publishKubeletDir(dir: string, files: Readonly<Record<string, string | Buffer>>, gid: number): void {
  mkdirSync(dir, { recursive: true });
  const stamp = kubeletStamp();
  const target = join(dir, stamp);
  mkdirSync(target);
  for (const [name, content] of Object.entries(files)) {
    if (name.includes('/') || name.startsWith('..')) throw new Error(`not a secret file name: ${name}`);
    const p = join(target, name);
    writeFileSync(p, content, { mode: 0o600 });
    chownSync(p, process.getuid?.() ?? 0, gid);
    chmodSync(p, 0o440);
  }
  for (const d of [dir, target]) {
    chownSync(d, process.getuid?.() ?? 0, gid);
    chmodSync(d, 0o2755);
  }
  const tmp = join(dir, '..data_tmp');
  rmSync(tmp, { force: true });
  symlinkSync(stamp, tmp);
  const old = present(join(dir, '..data')) ? readlinkSync(join(dir, '..data')) : undefined;
  renameSync(tmp, join(dir, '..data'));
  for (const name of Object.keys(files)) {
    if (!present(join(dir, name))) symlinkSync(join('..data', name), join(dir, name));
  }
  if (old !== undefined && old !== stamp) rmSync(join(dir, old), { recursive: true, force: true });
}
