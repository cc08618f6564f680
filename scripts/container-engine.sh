#!/usr/bin/env bash
# Makes sure a Docker engine answers, for the container tests and `npm run images` (issue 15).
#
#   bash scripts/container-engine.sh [start]   # idempotent: use a running engine, else start one
#   bash scripts/container-engine.sh stop      # stop the daemon THIS script started (and only it)
#   bash scripts/container-engine.sh status
#
# Exit codes: 0 an engine answers (or `stop` did its job); 3 no engine could be started (not
# root, apt failed, dockerd did not come up): ONE line on stderr says why, so callers can skip
# their container tests with that reason. Anything else is a bug in this script.
#
# Why a script and not a service manager: the machines this runs on (CI runners, sandboxes) often
# have no systemd, so dockerd is started directly, detached, with its log and a pid file under
# EDGE_RUN_DIR (default .run/, gitignored). The pid file is how `stop` knows the daemon is ours: a
# daemon someone else runs (Docker Desktop, systemd's docker.service) is used but never stopped.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUN_DIR=${EDGE_RUN_DIR:-$ROOT/.run}
PID_FILE=$RUN_DIR/dockerd.pid              # the dockerd we started
CONTAINERD_PID_FILE=$RUN_DIR/containerd.pid # the containerd that dockerd started for us, if any
LOG_FILE=$RUN_DIR/dockerd.log
WAIT_SECS=${EDGE_ENGINE_WAIT_SECS:-30}
NO_ENGINE=3

say() { echo "container-engine: $*"; }
give_up() { echo "container-engine: no container engine: $*" >&2; exit "$NO_ENGINE"; }

# `docker info` is the question every caller asks (testcontainers, docker-compose, the CLI), so it
# is the test here too. Bounded: a wedged daemon must not hang the caller.
engine_answers() { timeout 10 docker info >/dev/null 2>&1; }

# A pid from a pid file that is still the process we expect (pids are reused).
live_pid() {
  local file=$1 comm=$2 pid
  [ -f "$file" ] || return 1
  pid=$(cat "$file" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ] || return 1
  echo "$pid"
}

install_packages() {
  local missing=()
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing ${missing[*]} with apt"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >>"$LOG_FILE" 2>&1 \
    || give_up "apt-get install ${missing[*]} failed (see $LOG_FILE)"
}

start() {
  if engine_answers; then
    say "an engine was already running ($(docker info --format '{{.ServerVersion}} {{.Driver}}' 2>/dev/null)); nothing to do"
    return 0
  fi
  [ "$(id -u)" -eq 0 ] || give_up "no engine answers and starting dockerd needs root (running as uid $(id -u))"
  command -v apt-get >/dev/null 2>&1 || command -v dockerd >/dev/null 2>&1 || give_up "dockerd is not installed and there is no apt-get"
  mkdir -p "$RUN_DIR"
  install_packages

  local pid
  if pid=$(live_pid "$PID_FILE" dockerd); then
    # Ours, but not answering (yet): wait for it below instead of starting a second one.
    say "dockerd $pid (started earlier by this script) is not answering yet; waiting"
  else
    rm -f "$PID_FILE" "$CONTAINERD_PID_FILE"
    # Another dockerd we did not start holds the socket but does not answer: not ours to fix.
    if [ -f /var/run/docker.pid ] && live_pid /var/run/docker.pid dockerd >/dev/null; then
      give_up "a dockerd this script did not start (pid $(cat /var/run/docker.pid)) is running but does not answer"
    fi
    say "starting dockerd (log: $LOG_FILE)"
    # setsid: its own session, so the daemon outlives this shell and the caller's job control
    # (a terminal's Ctrl-C or a CI step's process-group kill must not take the engine down).
    # When no system containerd socket exists, dockerd 20.10 starts and supervises its own
    # containerd, which it stops again on SIGTERM.
    setsid dockerd >>"$LOG_FILE" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$PID_FILE"
  fi

  local waited=0
  until engine_answers; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$PID_FILE"
      give_up "dockerd exited during start-up: $(grep -E 'level=(error|fatal)|failed' "$LOG_FILE" | tail -1 | cut -c1-200)"
    fi
    if [ "$waited" -ge "$WAIT_SECS" ]; then
      give_up "dockerd $pid did not answer within ${WAIT_SECS}s (see $LOG_FILE; '$0 stop' stops it)"
    fi
    sleep 1
    waited=$((waited + 1))
  done
  # Remember the containerd it spawned, so `stop` can clean it up if dockerd dies without doing so.
  [ -f /var/run/docker/containerd/containerd.pid ] && cp /var/run/docker/containerd/containerd.pid "$CONTAINERD_PID_FILE"
  say "dockerd $pid answers after ${waited}s ($(docker info --format '{{.ServerVersion}}, storage {{.Driver}}' 2>/dev/null)); '$0 stop' stops it"
}

stop() {
  local pid cpid
  if ! pid=$(live_pid "$PID_FILE" dockerd); then
    rm -f "$PID_FILE"
    say "no dockerd started by this script is running; leaving any other engine alone"
  else
    say "stopping dockerd $pid"
    kill -TERM "$pid"
    # dockerd stops its containers (10 s grace each, in parallel) and its containerd first.
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then say "dockerd $pid still running after 20s; SIGKILL"; kill -KILL "$pid"; fi
    rm -f "$PID_FILE"
  fi
  if cpid=$(live_pid "$CONTAINERD_PID_FILE" containerd); then
    say "stopping containerd $cpid left behind by dockerd"
    kill -TERM "$cpid"
    for _ in $(seq 1 20); do kill -0 "$cpid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$cpid" 2>/dev/null && kill -KILL "$cpid"
  fi
  rm -f "$CONTAINERD_PID_FILE"
}

status() {
  local pid
  if engine_answers; then
    if pid=$(live_pid "$PID_FILE" dockerd); then say "engine answers: dockerd $pid, started by this script"
    else say "engine answers (not started by this script)"; fi
  else
    say "no engine answers"; exit "$NO_ENGINE"
  fi
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 [start|stop|status]" >&2; exit 2 ;;
esac
