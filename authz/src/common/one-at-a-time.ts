/**
 * Reloads that run one at a time (the GeoIP/anonymizer databases, the geo policy file): a call
 * during a run waits for it, then runs `fn` on the file as it is then. Resolves with `fn`'s result.
 */
export class OneAtATime {
  #running: Promise<boolean> | undefined;

  /** Whether a run is in progress. */
  get busy(): boolean {
    return this.#running !== undefined;
  }

  run(fn: () => Promise<boolean>): Promise<boolean> {
    const run = (this.#running ?? Promise.resolve(true)).then(fn);
    this.#running = run;
    void run.finally(() => {
      if (this.#running === run) this.#running = undefined;
    });
    return run;
  }
}
