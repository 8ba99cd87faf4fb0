#!/usr/bin/env bash
# The test command: installs what the tests need on a fresh Debian machine
# (Chromium for the dashboard browser test, the OpenAPI validator, a Python
# grpcio client and buf for the gRPC tests, Google's protobuf and schemathesis
# from PyPI, the original yadcc's runtime libraries), then runs schemathesis
# against a live server, the benchmark smoke run and every test.
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

# gRPC clients for tests/it/grpc.rs, pinned, in target/test-tools (where the
# tests look; YADCC_TEST_TOOLS overrides). A marker names the pinned
# versions, so changing a pin reinstalls.
tools=${YADCC_TEST_TOOLS:-target/test-tools}
python=${PYTHON:-python3}
grpc_python='grpcio==1.76.0 grpcio-tools==1.76.0'
if [ "$(cat "$tools/python/.pinned" 2>/dev/null)" != "$grpc_python" ]; then
  echo "installing $grpc_python (gRPC client test)..."
  rm -rf "$tools/python"
  # shellcheck disable=SC2086 # the pins are separate words
  "$python" -m pip install --quiet --disable-pip-version-check --target "$tools/python" $grpc_python
  echo "$grpc_python" >"$tools/python/.pinned"
fi
buf_npm='@bufbuild/buf@1.75.0'
if [ "$(cat "$tools/npm/.pinned" 2>/dev/null)" != "$buf_npm" ]; then
  echo "installing $buf_npm (buf curl test)..."
  command -v npm >/dev/null 2>&1 || apt_install npm
  rm -rf "$tools/npm"
  mkdir -p "$tools/npm"
  npm install --silent --no-audit --no-fund --prefix "$tools/npm" "$buf_npm"
  echo "$buf_npm" >"$tools/npm/.pinned"
fi

# The original yadcc's runtime libraries (Debian 12, ../shared/peers/README.md),
# for the benchmark smoke run beside the original scheduler.
original=${YADCC_ORIGINAL:-../shared/peers/yadcc-scheduler}
if [ -x "$original" ] && ldd "$original" | grep -q "not found"; then
  echo "installing the original yadcc's runtime libraries..."
  apt_install libgoogle-glog0v6 libgflags2.2 libfmt9 libssl3 libcurl4 libgoogle-perftools4 \
    libctemplate3 libopentracing1 libyaml-cpp0.7 libjsoncpp25 liblz4-1 libsnappy1v5 libzstd1 \
    libnghttp2-14
fi

scripts/validate_openapi.sh
scripts/python_deps.sh

echo "== schemathesis (every check, both route styles)"
scripts/schemathesis.sh

# This scheduler and the original under the same tiny yadcc-loadgen runs:
# every result well formed, 0 errors for this scheduler. Without the original
# (../shared/peers or YADCC_ORIGINAL) it says so in one line and is skipped,
# except in CI.
echo "== benchmark smoke run beside the original scheduler"
scripts/bench.sh smoke

# Last, so the run closes on cargo's summary.
cargo test --locked "$@"
