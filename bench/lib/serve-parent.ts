/**
 * The child side of ./child.ts's IPC protocol, in its own module so a server process does
 * not install the parent's signal handlers.
 */

/**
 * Reports `port` as ready and serves `handlers` by name.
 * Exits when the parent disconnects.
 */
export function serveParent(port: number, handlers: Readonly<Record<string, (arg: unknown) => unknown>>, onExit?: () => Promise<void> | void): void {
  const send = process.send?.bind(process);
  if (send === undefined) throw new Error('serveParent: not started with an IPC channel (use forkNode)');
  process.on('message', (m: { type: string; id: number; cmd: string; arg: unknown }) => {
    if (m.type !== 'call') return;
    const h = handlers[m.cmd];
    if (h === undefined) {
      send({ type: 'reply', id: m.id, error: `unknown call ${m.cmd}` });
      return;
    }
    Promise.resolve()
      .then(() => h(m.arg))
      .then(
        (result) => send({ type: 'reply', id: m.id, result }),
        (err: unknown) => send({ type: 'reply', id: m.id, error: String(err) }),
      );
  });
  const exit = (): void => {
    Promise.resolve(onExit?.()).finally(() => process.exit(0));
  };
  process.once('disconnect', exit);
  process.once('SIGTERM', exit);
  send({ type: 'ready', port });
}
