#!/bin/sh
# Stand-in for the official node image's entrypoint (local/node, see Dockerfile): when the first
# argument is an option (`-e …`) or not a command on PATH (`app.js`), run it with node.
set -e
if [ "${1#-}" != "${1}" ] || [ -z "$(command -v "${1}")" ] || { [ -f "${1}" ] && ! [ -x "${1}" ]; }; then
  set -- node "$@"
fi
exec "$@"
