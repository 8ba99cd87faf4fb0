#!/usr/bin/env bash
# The Python test tools, pinned, in a virtual environment of their own
# (target/test-tools/venv; YADCC_TEST_TOOLS moves target/test-tools), so a
# fresh Debian machine needs neither pip nor a system-wide install: Google's
# `protobuf` (the differential JSON test, tests/it/differential.rs),
# `schemathesis` (scripts/schemathesis.sh), `openapi-spec-validator`
# (scripts/validate_openapi.sh) and `prometheus-client` (its strict
# OpenMetrics parser, scripts/check_openmetrics.py). The gRPC and OpenAPI client tools go into
# directories of their own, with this environment's pip (scripts/test.sh):
# grpcio-tools needs an older protobuf than the one pinned here.
#
#   scripts/python_deps.sh           installs whatever differs from the pins
#   scripts/python_deps.sh --print   prints the environment's python
#
# The tests find the environment on their own; $PYTHON overrides it.
set -euo pipefail
cd "$(dirname "$0")/.."

tools=${YADCC_TEST_TOOLS:-target/test-tools}
venv="$tools/venv"
if [ "${1:-}" = "--print" ]; then
  echo "$PWD/$venv/bin/python"
  exit 0
fi

pins="protobuf==7.36.2 schemathesis==4.32.5 openapi-spec-validator==0.9.0 prometheus-client==0.26.0"

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  echo "making the Python test environment in $venv..."
  rm -rf "$venv"
  if ! python3 -m venv "$venv" 2>/dev/null; then
    # Debian's python3 makes environments only with python3-venv (ensurepip).
    # shellcheck source=scripts/lib/apt.sh
    . scripts/lib/apt.sh
    apt_install python3-venv
    rm -rf "$venv"
    python3 -m venv "$venv"
  fi
fi
pip() {
  timeout 1200 "$venv/bin/python" -m pip --disable-pip-version-check --quiet "$@"
}
if [ "$(cat "$venv/.pinned" 2>/dev/null)" != "$pins" ]; then
  echo "installing $pins..."
  # shellcheck disable=SC2086 # the pins are separate words
  pip install $pins
  echo "$pins" >"$venv/.pinned"
fi
