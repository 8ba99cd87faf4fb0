#!/usr/bin/env bash
# Validates the committed OpenAPI document (openapi/scheduler.openapi.json)
# against the OpenAPI 3.1 schema with openapi-spec-validator (pinned, from
# PyPI, installed by scripts/python_deps.sh). Whether the committed document
# is what the code generates is checked by `cargo test --test it openapi`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/python_deps.sh
python=${PYTHON:-$(scripts/python_deps.sh --print)}
timeout 300 "$python" -m openapi_spec_validator --schema 3.1 openapi/scheduler.openapi.json
