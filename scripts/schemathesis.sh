#!/usr/bin/env bash
# Property-based test of the OpenAPI document against a live server, with
# schemathesis and every check (`--checks all`): schema-valid requests must be
# accepted, schema-violating ones refused, every answer's status, headers,
# content type and body as documented, basic auth honoured. Both route styles
# are in the document, so both are tested.
#
# The server accepts any token (--insecure_accept_any_token), so the tester
# reaches the logic behind the token check, and guards /api/v1/ with a basic
# auth credential that schemathesis is given. Run time is bounded by the
# examples per operation: SCHEMATHESIS_MAX_EXAMPLES (default 100).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
scripts/python_deps.sh

cargo build --locked --quiet --bin yadcc-scheduler
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
credential="schemathesis:$("$python" -c 'import secrets; print(secrets.token_hex(8))')"
log=$(mktemp)
YADCC_INSPECT_CREDENTIAL="$credential" ./target/debug/yadcc-scheduler \
  --listen "127.0.0.1:$port" \
  --insecure_accept_any_token >"$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; rm -f "$log"' EXIT

for _ in $(seq 100); do
  if "$python" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/healthz', timeout=1)" 2>/dev/null; then
    break
  fi
  if ! kill -0 "$server" 2>/dev/null; then
    cat "$log"
    echo "the scheduler did not start" >&2
    exit 1
  fi
  sleep 0.1
done

# A servant offering the documented example compiler, heartbeating for the
# whole run, so that WaitForStartingTask calls reach the grant logic.
digest=$("$python" -c "import json, urllib.request; d = json.load(urllib.request.urlopen('http://127.0.0.1:$port/openapi.json')); print(d['components']['schemas']['yadcc.EnvironmentDesc']['properties']['compilerDigest']['examples'][0])")
heartbeat="{\"location\":\"127.0.0.1:1\",\"capacity\":100000,\"nextHeartbeatInMs\":10000,\"servantPriority\":\"SERVANT_PRIORITY_DEDICATED\",\"envDescs\":[{\"compilerDigest\":\"$digest\"}]}"
(
  while kill -0 "$server" 2>/dev/null; do
    "$python" -c "import sys, urllib.request; urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), headers={'Content-Type': 'application/json'}), timeout=5)" \
      "http://127.0.0.1:$port/rpc/yadcc.scheduler.SchedulerService.Heartbeat" "$heartbeat" >/dev/null 2>&1 || true
    sleep 3
  done
) &
servant=$!
trap 'kill "$servant" "$server" 2>/dev/null || true; rm -f "$log"' EXIT

"$python" -m schemathesis.cli --config-file scripts/schemathesis.toml run \
  "http://127.0.0.1:$port/openapi.json" \
  --checks all \
  --max-examples "${SCHEMATHESIS_MAX_EXAMPLES:-100}" \
  --auth "$credential" \
  --generation-database none \
  --no-color \
  ${SCHEMATHESIS_SEED:+--seed "$SCHEMATHESIS_SEED"}
