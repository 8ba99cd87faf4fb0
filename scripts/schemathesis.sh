#!/usr/bin/env bash
# Property-based test of the OpenAPI document against a live server, with
# schemathesis and every check (`--checks all`): schema-valid requests must be
# accepted, schema-violating ones refused, every answer's status, headers,
# content type and body as documented, basic auth honoured. Both route styles
# are in the document, so both are tested.
#
# The server accepts any token (--insecure_accept_any_token), so the tester
# reaches the logic behind the token check, guards /api/v1/ with a basic
# auth credential that schemathesis is given, and takes an admin token for
# the operators' service, which schemathesis sends as the document's
# `adminToken` bearer scheme says (scripts/schemathesis.toml). Run time is bounded by the
# examples per operation: SCHEMATHESIS_MAX_EXAMPLES (default 100), and as a
# whole by SCHEMATHESIS_TIMEOUT (seconds, default 1200).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/scheduler.sh
. scripts/lib/scheduler.sh

scripts/python_deps.sh
python=${PYTHON:-$(scripts/python_deps.sh --print)}

cargo build --locked --quiet --bin yadcc-scheduler
credential="schemathesis:$("$python" -c 'import secrets; print(secrets.token_hex(8))')"
SCHEMATHESIS_ADMIN_TOKEN=$("$python" -c 'import secrets; print(secrets.token_hex(16))')
# Each scheme's credential (scripts/schemathesis.toml): one given with
# `--auth` would go to every operation instead.
SCHEMATHESIS_USER=${credential%%:*}
SCHEMATHESIS_PASSWORD=${credential#*:}
export SCHEMATHESIS_ADMIN_TOKEN SCHEMATHESIS_USER SCHEMATHESIS_PASSWORD
work=$(mktemp -d)
servant=""
scheduler_pid=""
trap 'kill $servant $scheduler_pid 2>/dev/null || true; rm -rf "$work"' EXIT
YADCC_INSPECT_CREDENTIAL="$credential" YADCC_ADMIN_TOKENS="$SCHEMATHESIS_ADMIN_TOKEN" \
  start_scheduler ./target/debug/yadcc-scheduler "$work/scheduler.log" --insecure_accept_any_token
base="http://$scheduler_addr"

# A servant offering the documented example compiler, heartbeating for the
# whole run, so that WaitForStartingTask calls reach the grant logic. The
# first heartbeat must succeed; a later failure fails the run after the test.
digest=$("$python" -c "import json, urllib.request; d = json.load(urllib.request.urlopen('$base/openapi.json', timeout=30)); print(d['components']['schemas']['yadcc.EnvironmentDesc']['properties']['compilerDigest']['examples'][0])")
heartbeat="{\"location\":\"127.0.0.1:1\",\"capacity\":100000,\"nextHeartbeatInMs\":10000,\"servantPriority\":\"SERVANT_PRIORITY_DEDICATED\",\"envDescs\":[{\"compilerDigest\":\"$digest\"}]}"
send_heartbeat() {
  "$python" -c "import sys, urllib.request; urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), headers={'Content-Type': 'application/json'}), timeout=5)" \
    "$base/rpc/yadcc.scheduler.SchedulerService.Heartbeat" "$heartbeat"
}
if ! send_heartbeat; then
  echo "the setup heartbeat failed; the scheduler's log:" >&2
  cat "$work/scheduler.log" >&2
  exit 1
fi
(
  while kill -0 "$scheduler_pid" 2>/dev/null; do
    sleep 3
    send_heartbeat >/dev/null 2>&1 || echo "heartbeat failed at $(date +%T)" >>"$work/heartbeat-failures"
  done
) &
servant=$!

status=0
timeout --kill-after=10 "${SCHEMATHESIS_TIMEOUT:-1200}" \
  "$python" -m schemathesis.cli --config-file scripts/schemathesis.toml run \
  "$base/openapi.json" \
  --checks all \
  --max-examples "${SCHEMATHESIS_MAX_EXAMPLES:-100}" \
  --generation-database none \
  --no-color \
  ${SCHEMATHESIS_INCLUDE:+--include-path-regex "$SCHEMATHESIS_INCLUDE"} \
  ${SCHEMATHESIS_SEED:+--seed "$SCHEMATHESIS_SEED"} || status=$?
if [ -s "$work/heartbeat-failures" ]; then
  echo "the servant's heartbeats failed during the run, so WaitForStartingTask was not tested as documented:" >&2
  cat "$work/heartbeat-failures" >&2
  exit 1
fi
[ "$status" -ne 124 ] || echo "schemathesis ran for over ${SCHEMATHESIS_TIMEOUT:-1200} s and was stopped" >&2
exit "$status"
