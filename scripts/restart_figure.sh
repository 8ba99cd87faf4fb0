#!/usr/bin/env bash
# Restart figure (issue 10): a simulated cluster of stock-daemon behaviour
# (yadcc-loadgen `grant-cycles`, over flare: the daemons' default protocol, named
# explicitly so the figure says what produced it) runs against the scheduler;
# 25 s in, the scheduler is SIGKILLed and, once the old process is gone,
# started again on the same port with the same serving-daemon secret. The
# loadgen's summary counts tasks killed by their servant (ids returned in
# `expired_tasks`) and renewals refused. If the restarted scheduler does not
# serve, the script says so and fails: a figure of 0 tasks killed means
# nothing when no scheduler ran.
#
#   scripts/restart_figure.sh [servants] [delegates]     (defaults: 300 30)
#
# Needs target/release/yadcc-scheduler and yadcc-loadgen (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/scheduler.sh
. scripts/lib/scheduler.sh
servants=${1:-300}
delegates=${2:-30}
args=(--acceptable_user_tokens=demo-user-token --acceptable_servant_tokens=demo-servant-token)
export YADCC_SERVING_DAEMON_TOKEN_SECRET=restart-figure-secret
work=$(mktemp -d)
second=""
loadgen=""
trap 'kill $scheduler_pid $second $loadgen 2>/dev/null || true; rm -rf "$work"' EXIT

start_scheduler target/release/yadcc-scheduler "$work/first.log" "${args[@]}"
first=$scheduler_pid
addr=$scheduler_addr
timeout 120 target/release/yadcc-loadgen --scheduler "$addr" --protocol flare grant-cycles \
  --servants "$servants" --delegates "$delegates" --cycles-per-second 200 \
  --duration 40 --warmup 5 --task-min-ms 1200 --task-max-ms 8000 --progress-every 5 &
loadgen=$!
sleep 25
kill -9 "$first"
# Reaped: the old process is gone, though the kernel may hold its port a
# moment longer (the new one waits for it, and logs that it does).
wait "$first" 2>/dev/null || true
echo "scheduler SIGKILLed at $(date +%T); starting it again on $addr"
RUST_LOG=${SCHEDULER_RUST_LOG:-info,yadcc_scheduler::access=warn} \
  target/release/yadcc-scheduler --listen "$addr" "${args[@]}" >"$work/second.log" 2>&1 &
second=$!
if ! wait_for_listening "$second" "$work/second.log" >/dev/null; then
  echo "FAILED: the restarted scheduler does not serve on $addr; the figure would be meaningless" >&2
  exit 1
fi
status=0
wait "$loadgen" || status=$?
loadgen=""
if ! kill -0 "$second" 2>/dev/null; then
  echo "FAILED: the restarted scheduler died during the run; its log:" >&2
  cat "$work/second.log" >&2
  exit 1
fi
exit "$status"
