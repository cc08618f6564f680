#!/usr/bin/env sh
# Stand-in for the official Envoy image's /docker-entrypoint.sh (local/envoy, see Dockerfile),
# same behaviour: an option as first argument means "run envoy with these options"; $loglevel
# appends --log-level; started as root (the default), envoy runs as the `envoy` user, whose
# uid/gid ENVOY_UID/ENVOY_GID change, unless ENVOY_UID=0. Upstream switches user with su-exec;
# Debian has setpriv (util-linux, in every base) instead.
set -e

loglevel="${loglevel:-}"
USERID=$(id -u)

if [ "${1#-}" != "$1" ]; then
    set -- envoy "$@"
fi

if [ "$1" = 'envoy' ] && [ -n "$loglevel" ]; then
    set -- "$@" --log-level "$loglevel"
fi

if [ "$ENVOY_UID" != "0" ] && [ "$USERID" = 0 ]; then
    if [ -n "$ENVOY_UID" ]; then
        usermod -u "$ENVOY_UID" envoy
    fi
    if [ -n "$ENVOY_GID" ]; then
        groupmod -g "$ENVOY_GID" envoy
    fi
    # Ensure the envoy user is able to write to container logs
    chown envoy:envoy /dev/stdout /dev/stderr
    exec setpriv --reuid=envoy --regid=envoy --init-groups "$@"
else
    exec "$@"
fi
