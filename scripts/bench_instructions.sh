#!/usr/bin/env bash
# Instructions the scheduler spends per P1 Heartbeat, per protocol, counted by
# callgrind: unlike wall-clock rates, instruction counts stay comparable on a
# machine other work is sharing. Uses the release binaries as they are (build
# them first: cargo build --release --bins).
#
#   scripts/bench_instructions.sh                 # flare, http+pb, json, protobuf
#   scripts/bench_instructions.sh flare           # one protocol
#   scripts/bench_instructions.sh codec           # decode/encode alone (benches/codec.rs)
#   SECONDS_MEASURED=20 scripts/bench_instructions.sh
#   BIN=target/before scripts/bench_instructions.sh json   # another build's binaries
#   CODEC_BENCH=path/to/codec-bench scripts/bench_instructions.sh codec
#
# Protocols: flare and http+pb as the daemons send them; json and protobuf,
# the same Heartbeat as JSON and as binary protobuf over plain HTTP to
# /rpc/... (hyper, the same route and server path: they differ only by the
# codec). For each: a scheduler under callgrind, `yadcc-loadgen heartbeat-rate`
# against it; once the benchmark's servants are set up and heartbeats flow,
# callgrind's counters are zeroed, SECONDS_MEASURED later they are dumped, and
# the Heartbeat calls in between are read from the scheduler's /metrics.
# Prints instructions per call; the profiles stay in $OUT
# (callgrind_annotate $OUT/callgrind.<protocol>.out shows where they go).
#
# `codec` runs benches/codec.rs's cases alone (CODEC_BENCH_SPIN) under
# callgrind at two counts and prints the difference per call, so start-up
# is not counted.
set -euo pipefail
cd "$(dirname "$0")/.."

protocols=${*:-"flare http+pb json protobuf"}
measured=${SECONDS_MEASURED:-10}  # at most 15: the benchmark runs 25 s after its warm-up
out=${OUT:-target/instructions}
bin=${BIN:-target/release}
mkdir -p "$out"
# shellcheck source=scripts/lib/scheduler.sh
. scripts/lib/scheduler.sh

# Instructions callgrind counts for one run of "$@".
instructions_of() {
  valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.codec.out" "$@" 2>&1 |
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}

if [ "$protocols" = codec ]; then
  bench=${CODEC_BENCH:-$(cargo bench --locked --bench codec --no-run 2>&1 |
    sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -1)}
  [ -x "$bench" ] || { echo "cannot build benches/codec.rs" >&2; exit 1; }
  for case in decode/json decode/binary encode/json/heartbeat encode/binary/heartbeat \
      encode/json/running_tasks encode/binary/running_tasks; do
    few=$(CODEC_BENCH_SPIN="$case:100" instructions_of "$bench")
    many=$(CODEC_BENCH_SPIN="$case:1100" instructions_of "$bench")
    echo "$case: $(((many - few) / 1000)) instructions per call"
  done
  exit 0
fi

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
  curl -s "http://$scheduler_addr/metrics" |
    awk -v protocol="$1" '
      /^yadcc_scheduler_rpc_requests_total\{/ && index($0, "protocol=\"" protocol "\"") &&
        index($0, "method=\"Heartbeat\"") { sum += $NF }
      END { printf "%d\n", sum }'
}

for protocol in $protocols; do
  # How the benchmark sets its servants up, which target it drives, and the
  # protocol label its Heartbeats carry in /metrics.
  case "$protocol" in
    flare | http+pb) setup=$protocol target=$protocol label=$protocol ;;
    json) setup=json target=json label=http ;;
    protobuf) setup=http+pb target=protobuf label=http ;;
    *) echo "unknown protocol $protocol: flare, http+pb, json, protobuf or codec" >&2; exit 2 ;;
  esac
  profile="$out/callgrind.$protocol.out"
  SCHEDULER_WRAPPER="valgrind --tool=callgrind --callgrind-out-file=$profile" \
    start_scheduler "$bin/yadcc-scheduler" "$out/valgrind.$protocol.log" \
    --acceptable_user_tokens=u --acceptable_servant_tokens=s
  "$bin/yadcc-loadgen" --scheduler "$scheduler_addr" --user-token u --servant-token s \
    --protocol "$setup" heartbeat-rate --connections 64 --tasks 16 --rounds 1 \
    --warmup 5 --duration 25 --targets "$target" \
    >/dev/null 2>"$out/loadgen.$protocol.log" &
  loadgen_pid=$!
  # Set-up registers 64 servants and fills them with grants (a few hundred
  # calls; the benchmark says when it is done); then the benchmark's heartbeats
  # flow, measured once its 5 s warm-up is over. Waiting for a count of
  # heartbeats instead would wait longer for a slower protocol, past the
  # end of the phase.
  for _ in $(seq 1200); do
    kill -0 "$loadgen_pid" 2>/dev/null || { cat "$out/loadgen.$protocol.log" >&2; exit 1; }
    grep -q "servants registered" "$out/loadgen.$protocol.log" && break
    sleep 0.5
  done
  sleep 6
  before=$(heartbeats "$label")
  callgrind_control -z "$scheduler_pid" >/dev/null
  sleep "$measured"
  callgrind_control -d "$scheduler_pid" >/dev/null
  after=$(heartbeats "$label")
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
