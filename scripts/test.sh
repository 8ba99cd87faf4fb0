#!/usr/bin/env bash
# The test command: installs what the tests need on a fresh Debian machine
# (Chromium for the dashboard browser test, the OpenAPI validator), then runs
# every test. Safe to run again: installed pieces are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v chromium >/dev/null 2>&1; then
  echo "installing chromium (dashboard browser test)..."
  if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi

scripts/validate_openapi.sh

cargo test --locked "$@"
