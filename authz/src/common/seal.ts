/**
 * The process's one seal state, shared by the authorization core and the market service (both
 * answer `sealed` from the moment it is set; credentials are zeroed on seal: docs/api.md "Seal").
 * It also records when the last request was refused as sealed, so the drain after a seal can end
 * once nothing asks any more (process.ts) instead of always waiting SHUTDOWN_GRACE_MS.
 */
export interface SealState {
  readonly sealed: boolean;
  /** Sets the state; true the first time only (the caller then zeroes what it owns). */
  set(): boolean;
  /**
   * Whether a request must be refused as sealed; a request asking while sealed is noted (one
   * clock read, on the sealed path only).
   */
  refuses(): boolean;
  /** Milliseconds since the seal or since the last request refused as sealed, whichever is later; 0 before the seal. */
  quietMs(): number;
}

export function createSealState(now: () => number = Date.now): SealState {
  let sealed = false;
  let lastMs = 0;
  return {
    get sealed() { return sealed; },
    set() {
      if (sealed) return false;
      sealed = true;
      lastMs = now();
      return true;
    },
    refuses() {
      if (!sealed) return false;
      lastMs = now();
      return true;
    },
    quietMs: () => (sealed ? now() - lastMs : 0),
  };
}
