/** Paths the deploy tools and tests share. */
import { fileURLToPath } from 'node:url';

/** Repository root (the service image's build context). */
export const ROOT = fileURLToPath(new URL('../', import.meta.url));
