#!/usr/bin/env bash
# Validates the committed OpenAPI document (openapi/scheduler.openapi.json)
# against the OpenAPI 3.1 schema with openapi-spec-validator from PyPI,
# installing it first when it is missing. Whether the committed document is
# what the code generates is checked by `cargo test --test it openapi`.
set -euo pipefail
cd "$(dirname "$0")/.."

spec=openapi/scheduler.openapi.json
python=${PYTHON:-python3}
requirement='openapi-spec-validator>=0.7,<0.10'

if ! "$python" -c 'import openapi_spec_validator' >/dev/null 2>&1; then
  echo "installing $requirement..."
  # Debian's own python3 refuses system-wide pip installs (PEP 668) unless told.
  "$python" -m pip install --quiet "$requirement" ||
    "$python" -m pip install --quiet --break-system-packages "$requirement"
fi

"$python" -m openapi_spec_validator --schema 3.1 "$spec"
