#!/usr/bin/env bash
# Restart figure (issue 10): a simulated cluster of stock-daemon behaviour
# (yadcc-loadgen `grant-cycles`, over flare: the daemons' default protocol, named
# explicitly so the figure says what produced it) runs against the scheduler;
# 25 s in, the scheduler is SIGKILLed and started again at once on the same
# port with the same serving-daemon secret. The loadgen's summary counts tasks killed by
# their servant (ids returned in `expired_tasks`) and renewals refused.
#
#   scripts/restart_figure.sh [servants] [delegates]     (defaults: 300 30)
#
# Needs target/release/yadcc-scheduler and yadcc-loadgen (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
servants=${1:-300}
delegates=${2:-30}
port=18436
args=(--port "$port" --acceptable_user_tokens=demo-user-token --acceptable_servant_tokens=demo-servant-token)
export YADCC_SERVING_DAEMON_TOKEN_SECRET=restart-figure-secret
export RUST_LOG=warn
target/release/yadcc-scheduler "${args[@]}" &
first=$!
trap 'kill "$first" "${second:-}" 2>/dev/null || true' EXIT
sleep 1
target/release/yadcc-loadgen --scheduler "127.0.0.1:$port" --protocol flare grant-cycles \
  --servants "$servants" --delegates "$delegates" --cycles-per-second 200 \
  --duration 40 --warmup 5 --task-min-ms 1200 --task-max-ms 8000 --progress-every 5 &
loadgen=$!
sleep 25
kill -9 "$first"
echo "scheduler SIGKILLed at $(date +%T); starting it again"
target/release/yadcc-scheduler "${args[@]}" &
second=$!
wait "$loadgen"
