/**
 * A port the service could not listen on, named by the setting that chose it: start-up fails
 * with one log line saying which setting, which address and why, not a stack trace.
 */
export class ListenError extends Error {
  constructor(setting: string, host: string, port: number, cause: unknown) {
    super(`${setting}: cannot listen on ${host.includes(':') ? `[${host}]` : host}:${port}: ${reason(cause)}`);
    this.name = 'ListenError';
  }
}

function reason(cause: unknown): string {
  const text = cause instanceof Error ? `${(cause as NodeJS.ErrnoException).code ?? ''} ${cause.message}` : String(cause);
  if (text.includes('EADDRINUSE')) return 'the address is already in use (another process listens there; choose another port or stop it)';
  if (text.includes('EACCES')) return 'permission denied (a port below 1024 needs privileges)';
  if (text.includes('EADDRNOTAVAIL')) return 'the address is not one of this host\'s';
  return cause instanceof Error ? cause.message : String(cause);
}

/** Runs `listen`, turning its failure into a ListenError naming `setting`. */
export async function listenAs<T>(setting: string, host: string, port: number, listen: () => Promise<T>): Promise<T> {
  try {
    return await listen();
  } catch (err) {
    throw new ListenError(setting, host, port, err);
  }
}
