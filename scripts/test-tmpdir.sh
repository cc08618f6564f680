#!/usr/bin/env bash
# Runs a command (`npm test` runs every suite through it) with TMPDIR a fresh directory of its own,
# under the caller's TMPDIR or /tmp, so what lands there is this run's alone (other runs on the
# same machine have theirs). The tests remove every temporary directory they make
# (testkit/temp-dir.ts), several holding key material; whatever is left at the end is listed,
# removed, and fails the run. With E2E_KEEP set it is kept for a look instead.
#   bash scripts/test-tmpdir.sh <command> [args…]
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: scripts/test-tmpdir.sh <command> [args…]" >&2; exit 2; }
run=$(mktemp -d "${TMPDIR:-/tmp}/edge-test-run.XXXXXX") || exit 1
# Others may pass through, not list: the tests make 0755 directories inside for the containers'
# users (compose, podman), each 0700 otherwise.
chmod 0711 "$run"
remove() { rm -rf --one-file-system "$run"; }
trap 'remove; exit 130' INT
trap 'remove; exit 143' TERM
TMPDIR=$run "$@"
status=$?
# node-compile-cache: tsc, ESLint and Redocly enable Node's compile cache, which lives in TMPDIR by
# default: a tool's cache, not a test's directory; it goes with the run's directory. So does
# testcontainers' lock file (testcontainers-node-<uid>.lock, taken while it looks for its reaper).
left=$(find "$run" -mindepth 1 -maxdepth 1 ! -name node-compile-cache ! -name 'testcontainers-node-*.lock' -printf '%f\n' | sort)
if [ -n "$left" ]; then
  echo "test-tmpdir: the run left these in its temporary directory $run:" >&2
  echo "$left" | sed 's/^/  /' >&2
  [ "$status" -ne 0 ] || status=1
fi
if [ -n "$left" ] && [ -n "${E2E_KEEP:-}" ]; then
  echo "test-tmpdir: kept (E2E_KEEP is set)" >&2
else
  remove
fi
exit "$status"
