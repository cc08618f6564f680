/**
 * The stack lock: one `npm start` per run directory (its pid file, start.pid) and per port. Finds
 * what holds a port through Linux /proc and names it, and whether it is another stack.
 */
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { createServer } from 'node:net';

/** Process `pid`'s command line, arguments joined by spaces ('' when it cannot be read). */
export function cmdline(pid: number | string): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ').trim();
  } catch {
    return '';
  }
}
/** Whether process `pid` is an `npm start` (scripts/start.ts). */
export const isStack = (pid: number): boolean => cmdline(pid).includes('scripts/start.ts');

function parentOf(pid: number): number {
  try {
    // /proc/<pid>/stat: "pid (comm) state ppid …"; comm may hold spaces and parentheses.
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
  } catch {
    return 0;
  }
}

/** The `npm start` (scripts/start.ts) process `pid` belongs to, if any. */
export function stackOf(pid: number): number | undefined {
  for (let p = pid, i = 0; p > 1 && i < 16; p = parentOf(p), i++) if (isStack(p)) return p;
  return undefined;
}

/** Whether TCP `port` is taken on any address (a listen on 0.0.0.0 fails with EADDRINUSE). */
export function portInUse(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = createServer();
    s.once('error', (err: NodeJS.ErrnoException) => resolve(err.code === 'EADDRINUSE'));
    s.listen({ port, host: '0.0.0.0', exclusive: true }, () => s.close(() => resolve(false)));
  });
}

/** The process listening on TCP `port` (Linux /proc; only processes this user may inspect). */
export function portOwner(port: number): number | undefined {
  const inodes = new Set<string>();
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text: string;
    try {
      text = readFileSync(table, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const c = line.trim().split(/\s+/);
      if (c[3] === '0A' && parseInt(c[1]?.split(':')[1] ?? '', 16) === port && c[9] !== undefined) inodes.add(c[9]);
    }
  }
  if (inodes.size === 0) return undefined;
  for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    let fds: string[];
    try {
      fds = readdirSync(`/proc/${pid}/fd`);
    } catch {
      continue;
    }
    for (const fd of fds) {
      try {
        const inode = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`))?.[1];
        if (inode !== undefined && inodes.has(inode)) return Number(pid);
      } catch { /* closed meanwhile */ }
    }
  }
  return undefined;
}

/**
 * Why this start must be refused because a stack (or another process) already holds its run
 * directory or ports: the message, or undefined when nothing does. `pidFile` is the run directory's
 * start.pid, `runDir` how messages name that directory, `ports` the plan's ports by setting.
 */
export async function runningProblem(pidFile: string, runDir: string, ports: ReadonlyArray<readonly [string, number]>): Promise<string | undefined> {
  let recorded: { pid?: number; edge?: string } = {};
  try {
    recorded = JSON.parse(readFileSync(pidFile, 'utf8')) as typeof recorded;
  } catch { /* none, or unreadable: the ports decide */ }
  if (typeof recorded.pid === 'number' && recorded.pid !== process.pid && isStack(recorded.pid)) {
    return `a stack is already running from ${runDir} (pid ${recorded.pid}, ${recorded.edge ?? 'its ports'}); `
      + `stop it first (Ctrl-C in its terminal, or kill ${recorded.pid}), or give this one another DEV_RUN_DIR and ports`;
  }
  const busy: { setting: string; port: number; owner: number | undefined }[] = [];
  for (const [setting, port] of ports) if (await portInUse(port)) busy.push({ setting, port, owner: portOwner(port) });
  if (busy.length === 0) return undefined;
  const list = busy.map((b) => `${b.setting} ${b.port}`).join(', ');
  const stacks = [...new Set(busy.map((b) => (b.owner === undefined ? undefined : stackOf(b.owner))).filter((p) => p !== undefined))];
  if (stacks.length > 0) {
    return `a stack is already running on these ports (pid ${stacks.join(', ')}): ${list}; stop it first (Ctrl-C in its terminal, or kill ${stacks.join(' ')})`;
  }
  const owners = busy.map((b) => `${b.setting} ${b.port} by ${b.owner === undefined ? 'another process' : `pid ${b.owner} (${cmdline(b.owner).slice(0, 80)})`}`);
  return `ports already in use: ${owners.join('; ')}; stop that process or choose other ports (README "Settings")`;
}
