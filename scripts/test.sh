#!/usr/bin/env bash
# The test command: installs what the tests need on a fresh Debian machine
# (Chromium for the dashboard browser test; a Python environment with the
# pinned test tools, see scripts/python_deps.sh; buf for the gRPC tests; when
# the original yadcc is at hand, its runtime libraries, iproute2 and g++),
# then runs schemathesis against a live server and every test, and last the
# tests against the original yadcc daemons (tests/it/peers/).
# Safe to run again: installed pieces are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/apt.sh
. scripts/lib/apt.sh

in_ci() { [ -n "${CI:-}" ] && [ "${CI:-}" != "false" ]; }

# Chromium comes from Debian, which ships one version at a time; the
# dashboard test was last checked against this major version.
chromium_major=156
if ! command -v chromium >/dev/null 2>&1; then
  echo "installing chromium (dashboard browser test)..."
  apt_install chromium
fi
have_major=$(timeout 60 chromium --version 2>/dev/null | sed -n 's/^Chromium \([0-9]*\)\..*/\1/p')
if [ "$have_major" != "$chromium_major" ]; then
  message="chromium is major version ${have_major:-unknown}, the browser test is pinned to $chromium_major: check tests/it/browser.rs with it, then update chromium_major in scripts/test.sh"
  if in_ci; then
    echo "$message" >&2
    exit 1
  fi
  echo "warning: $message" >&2
fi

# buf for tests/it/grpc_clients.rs, pinned, in target/test-tools (where the
# tests look; YADCC_TEST_TOOLS overrides). A marker names the pinned
# version, so changing the pin reinstalls.
tools=${YADCC_TEST_TOOLS:-target/test-tools}
buf_npm='@bufbuild/buf@1.75.0'
if [ "$(cat "$tools/npm/.pinned" 2>/dev/null)" != "$buf_npm" ]; then
  echo "installing $buf_npm (buf curl test)..."
  command -v npm >/dev/null 2>&1 || apt_install npm
  rm -rf "$tools/npm"
  mkdir -p "$tools/npm"
  timeout 600 npm install --silent --no-audit --no-fund --save-exact --prefix "$tools/npm" "$buf_npm"
  echo "$buf_npm" >"$tools/npm/.pinned"
fi

scripts/python_deps.sh
scripts/validate_openapi.sh

# The original yadcc (tests/it/peers/): where it is, and whether this
# machine can run it (root for network namespaces).
peers=${YADCC_PEERS:-$PWD/../shared/peers}
peers_missing=""
if [ ! -x "$peers/yadcc-daemon" ] || [ ! -x "$peers/yadcc-cxx" ]; then
  peers_missing="no original yadcc at $peers (set YADCC_PEERS)"
elif [ "$(id -u)" -ne 0 ]; then
  peers_missing="not root: network namespaces need it"
else
  # Its runtime libraries (peers/README.md), by Debian 12's package names,
  # which carry the library versions the binaries were built against.
  if ! dpkg -s libgoogle-glog0v6 libgflags2.2 libfmt9 libssl3 libcurl4 libgoogle-perftools4 \
    libctemplate3 libopentracing1 libyaml-cpp0.7 libjsoncpp25 liblz4-1 libsnappy1v5 libzstd1 \
    libnghttp2-14 iproute2 g++ util-linux >/dev/null 2>&1; then
    echo "installing the original yadcc's runtime libraries, iproute2 and g++ (tests/it/peers/)..."
    apt_install libgoogle-glog0v6 libgflags2.2 libfmt9 libssl3 libcurl4 libgoogle-perftools4 \
      libctemplate3 libopentracing1 libyaml-cpp0.7 libjsoncpp25 liblz4-1 libsnappy1v5 libzstd1 \
      libnghttp2-14 iproute2 g++ util-linux
  fi
  probe="yadcc-ci-probe-$$"
  if ! { ip netns add "$probe" && ip netns del "$probe"; } 2>/dev/null; then
    peers_missing="cannot make a network namespace here"
  fi
fi
if [ -n "$peers_missing" ]; then
  if in_ci; then
    echo "the tests against the original yadcc cannot run: $peers_missing" >&2
    exit 1
  fi
  echo "the tests against the original yadcc (tests/it/peers/) are skipped: $peers_missing"
fi

echo "== schemathesis (every check, both route styles)"
scripts/schemathesis.sh

cargo test --locked "$@"

# Last, on their own, so nothing else loads the machine while real daemons
# compile; without the original yadcc, the run above counted them ignored.
if [ -z "$peers_missing" ]; then
  echo "== the original yadcc daemons against this scheduler"
  YADCC_PEERS="$peers" cargo test --locked --test it peers:: -- --ignored --nocapture
fi
