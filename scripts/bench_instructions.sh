#!/usr/bin/env bash
# Instructions the scheduler spends per P1 Heartbeat, per daemon protocol,
# counted by callgrind: unlike wall-clock rates, instruction counts stay
# comparable on a machine other work is sharing. Uses the release binaries
# as they are (build them first: cargo build --release --bins).
#
#   scripts/bench_instructions.sh                 # flare and http+pb
#   scripts/bench_instructions.sh flare           # one protocol
#   SECONDS_MEASURED=20 scripts/bench_instructions.sh
#
# For each protocol: a scheduler under callgrind, `yadcc-loadgen heartbeat-rate`
# against it; once the benchmark's servants are set up and heartbeats flow,
# callgrind's counters are zeroed, SECONDS_MEASURED later they are dumped, and
# the Heartbeat calls in between are read from the scheduler's /metrics.
# Prints instructions per call; the profiles stay in $OUT
# (callgrind_annotate $OUT/callgrind.<protocol>.out shows where they go).
set -euo pipefail
cd "$(dirname "$0")/.."

protocols=${*:-"flare http+pb"}
measured=${SECONDS_MEASURED:-10}  # at most 15: the benchmark runs 25 s after its warm-up
out=${OUT:-target/instructions}
bin=target/release
mkdir -p "$out"

scheduler_pid=""
loadgen_pid=""
cleanup() {
  [ -n "$loadgen_pid" ] && kill "$loadgen_pid" 2>/dev/null || true
  [ -n "$scheduler_pid" ] && kill "$scheduler_pid" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT

# Heartbeats answered so far over protocol $1.
heartbeats() {
  curl -s "http://127.0.0.1:$port/metrics" |
    awk -v protocol="$1" '
      /^yadcc_scheduler_rpc_requests_total\{/ && index($0, "protocol=\"" protocol "\"") &&
        index($0, "method=\"Heartbeat\"") { sum += $NF }
      END { printf "%d\n", sum }'
}

for protocol in $protocols; do
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  profile="$out/callgrind.$protocol.out"
  RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$profile" \
    "$bin/yadcc-scheduler" --listen "127.0.0.1:$port" \
    --acceptable_user_tokens=u --acceptable_servant_tokens=s 2>"$out/valgrind.$protocol.log" &
  scheduler_pid=$!
  for _ in $(seq 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.2
  done
  "$bin/yadcc-loadgen" --scheduler "127.0.0.1:$port" --user-token u --servant-token s \
    --protocol "$protocol" heartbeat-rate --connections 64 --tasks 16 --rounds 1 \
    --warmup 5 --duration 25 --targets "$protocol" \
    >/dev/null 2>"$out/loadgen.$protocol.log" &
  loadgen_pid=$!
  # Set-up registers 64 servants and fills them with grants (a few hundred
  # calls); wait until the benchmark's own heartbeats are flowing.
  for _ in $(seq 600); do
    kill -0 "$loadgen_pid" 2>/dev/null || { cat "$out/loadgen.$protocol.log" >&2; exit 1; }
    [ "$(heartbeats "$protocol")" -gt 3000 ] && break
    sleep 0.5
  done
  before=$(heartbeats "$protocol")
  callgrind_control -z "$scheduler_pid" >/dev/null
  sleep "$measured"
  callgrind_control -d "$scheduler_pid" >/dev/null
  after=$(heartbeats "$protocol")
  ls -l "$out" >&2
  kill "$loadgen_pid" 2>/dev/null || true
  wait "$loadgen_pid" 2>/dev/null || true
  loadgen_pid=""
  kill "$scheduler_pid" 2>/dev/null || true
  wait "$scheduler_pid" 2>/dev/null || true
  scheduler_pid=""
  # The dump of the measured window is the newest numbered file.
  dump=$(ls -t "$profile".* 2>/dev/null | head -1)
  instructions=$(awk '/^summary:|^totals:/ { print $2; exit }' "$dump")
  calls=$((after - before))
  mv "$dump" "$profile"
  rm -f "$profile".*
  echo "$protocol: $calls calls, $instructions instructions, $((instructions / calls)) per call ($profile)"
done
