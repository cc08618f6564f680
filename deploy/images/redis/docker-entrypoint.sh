#!/bin/sh
# Stand-in for the official redis image's entrypoint (local/redis, see Dockerfile), plus the one
# thing the official image compiles in: protected mode off.
set -e

# First argument an option or a config file: run redis-server with it.
if [ "${1#-}" != "$1" ] || [ "${1%.conf}" != "$1" ]; then
	set -- redis-server "$@"
fi

# Started as root (the default): own the data directory, then start over as `redis`
# (upstream uses gosu; Debian has setpriv from util-linux in every base).
if [ "$1" = 'redis-server' ] && [ "$(id -u)" = '0' ]; then
	find . \! -user redis -exec chown redis '{}' +
	exec setpriv --reuid=redis --regid=redis --init-groups "$0" "$@"
fi

if [ "$1" = 'redis-server' ]; then
	# The official image builds redis with protected mode off by default, so other containers
	# can connect without a password; Debian's keeps it on. Insert `--protected-mode no` right
	# after the config file, if any, so options given later (including --protected-mode yes) win.
	shift
	if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
		conf=$1; shift
		set -- redis-server "$conf" --protected-mode no "$@"
	else
		set -- redis-server --protected-mode no "$@"
	fi
fi

# An appropriate umask (if one isn't set already), as upstream: data readable by redis only.
um="$(umask)"
if [ "$um" = '0022' ]; then
	umask 0077
fi
exec "$@"
