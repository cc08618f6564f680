/**
 * `npm start`'s own output: every line it writes (and its children's output, passed through) goes
 * through `emit`, so a terminal or pipe that goes away is noticed once and ends the stack in order.
 *
 * Output that may go away: a terminal closed, or the reader of a pipe (`npm start | tee log`,
 * then Ctrl-C) gone. A failed write (EIO, EPIPE) is a hang-up: nothing more is written and the
 * stack stops in order, as on SIGHUP (`setOnHangUp`, set once the stack starts). Writing after that
 * would only fail again; writing from the error's own handler used to loop at full CPU.
 */
let outputGone = false;
let onHangUp = (): void => undefined;
function hangUp(): void {
  if (outputGone) return;
  outputGone = true;
  onHangUp();
}
for (const stream of [process.stdout, process.stderr]) stream.on('error', hangUp);

/** Writes to stdout or stderr unless the output is gone. */
export function emit(stream: NodeJS.WriteStream, text: string | Uint8Array): void {
  if (outputGone) return;
  try {
    stream.write(text);
  } catch {
    hangUp();
  }
}

/** One line on stdout, prefixed `npm start: `. */
export const say = (msg: string): void => emit(process.stdout, `npm start: ${msg}\n`);

/** Refused before anything started: one line, exit code 2. */
export function refuse(msg: string): never {
  emit(process.stderr, `npm start: ${msg}\n`);
  process.exit(2);
}

/** What a hang-up does from now on; run at once if the output is already gone. */
export function setOnHangUp(fn: () => void): void {
  onHangUp = fn;
  if (outputGone) onHangUp();
}
