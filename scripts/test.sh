#!/usr/bin/env bash
# The test command: installs what the tests need on a fresh Debian machine
# (Chromium for the dashboard browser test, etcd and HAProxy for the hot
# standby's, the OpenAPI validator, a Python
# grpcio client, grpcio-health-checking and buf for the gRPC tests, the
# OpenAPI linters and client generators, Google's protobuf and schemathesis
# from PyPI), then runs schemathesis against a live server and every test.
# Safe to run again: installed pieces are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
apt_updated=""
apt_install() {
  if [ -z "$apt_updated" ]; then
    $sudo apt-get update -qq
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

if ! command -v chromium >/dev/null 2>&1; then
  echo "installing chromium (dashboard browser test)..."
  apt_install chromium
fi

# The hot standby's tests (tests/ha/) start Debian's etcd and HAProxy.
if ! command -v etcd >/dev/null 2>&1; then
  echo "installing etcd-server (hot standby tests)..."
  apt_install etcd-server
fi
if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ]; then
  echo "installing haproxy (hot standby tests)..."
  apt_install haproxy
fi

# Client tools of the integration tests, pinned, each set in its own
# directory under target/test-tools (where the tests look; YADCC_TEST_TOOLS
# overrides). A marker names the pinned versions, so changing a pin
# reinstalls that set.
tools=${YADCC_TEST_TOOLS:-target/test-tools}
python=${PYTHON:-python3}
pip_tools() { # DIR PURPOSE PINS...
  local dir=$tools/$1 purpose=$2
  shift 2
  if [ "$(cat "$dir/.pinned" 2>/dev/null)" != "$*" ]; then
    echo "installing $* ($purpose)..."
    rm -rf "$dir"
    "$python" -m pip install --quiet --disable-pip-version-check --target "$dir" "$@"
    echo "$*" >"$dir/.pinned"
  fi
}
npm_tools() { # DIR PURPOSE PINS...
  local dir=$tools/$1 purpose=$2
  shift 2
  if [ "$(cat "$dir/.pinned" 2>/dev/null)" != "$*" ]; then
    echo "installing $* ($purpose)..."
    command -v npm >/dev/null 2>&1 || apt_install npm
    rm -rf "$dir"
    mkdir -p "$dir"
    npm install --silent --no-audit --no-fund --prefix "$dir" "$@"
    echo "$*" >"$dir/.pinned"
  fi
}
pip_tools python "gRPC client and health tests" \
  grpcio==1.76.0 grpcio-tools==1.76.0 grpcio-health-checking==1.76.0
npm_tools npm "buf curl test" @bufbuild/buf@1.75.0
# The OpenAPI consumers' tools (tests/it/openapi_clients.rs): linters, the
# Python and TypeScript client generators, and the TypeScript compiler.
pip_tools openapi-python "generated Python client test" openapi-python-client==0.29.1
npm_tools openapi-npm "OpenAPI lint and TypeScript client tests" \
  @redocly/cli@2.77.0 @stoplight/spectral-cli@6.16.3 openapi-typescript@7.13.0 typescript@5.9.3

scripts/validate_openapi.sh
scripts/python_deps.sh

echo "== schemathesis (every check, both route styles)"
scripts/schemathesis.sh

# Last, so the run closes on cargo's summary.
cargo test --locked "$@"
