#!/usr/bin/env bash
# Installs the pinned Python test tools from PyPI when the installed version
# differs: `protobuf` (Google's implementation, for the differential JSON test
# in tests/it/differential.rs), `schemathesis` (scripts/schemathesis.sh) and
# `prometheus-client` (its strict OpenMetrics parser, scripts/check_openmetrics.py).
# Safe to run again: matching versions are skipped.
set -euo pipefail

python=${PYTHON:-python3}
pins=("protobuf==7.36.2" "schemathesis==4.32.5" "prometheus-client==0.26.0")

for pin in "${pins[@]}"; do
  name=${pin%%==*}
  want=${pin#*==}
  have=$("$python" -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || true)
  if [ "$have" != "$want" ]; then
    echo "installing $pin..."
    # Debian's own python3 refuses system-wide pip installs (PEP 668) unless told.
    "$python" -m pip install --quiet "$pin" ||
      "$python" -m pip install --quiet --break-system-packages "$pin"
  fi
done
