#!/usr/bin/env bash
# Benchmarks P1, P3 and P5 (BENCHMARKS.md): builds release, runs the scheduler
# and yadcc-loadgen as separate processes on this machine, collects the load
# generator's JSON lines and draws P5 (p99 and CPU against cluster size).
#
#   scripts/bench.sh            # full scale, as in BENCHMARKS.md (~20 min)
#   scripts/bench.sh small      # a quick check that everything works (~2 min)
#
# Output: $OUT/p1.jsonl, p1-daemon.jsonl, p3.jsonl, p5.jsonl and p5.svg; full scale writes to
# benches/results/ and benches/p5.svg, small scale to target/bench-small/.
# BENCH_ONLY="p1 p5" runs a subset; P1_PROTOCOL (how P1 sets up its servants),
# P3_PROTOCOL, P5_PROTOCOLS and P5_SIZES override the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."

scale=${1:-full}
case "$scale" in
  full)
    out=${OUT:-benches/results}
    svg=${SVG:-benches/p5.svg}
    p1_args=(--connections 64 --duration 3 --warmup 1 --rounds 5)
    # The daemons' habit: two shared connections, many calls in flight.
    p1_daemon_args=(--connections 2 --pipeline 32 --duration 3 --warmup 1 --rounds 5)
    p3_args=(--servants 10000 --delegates 100 --cycles-per-second 2000
             --duration 60 --warmup 5 --running-tasks-interval-ms 0)
    p5_sizes=${P5_SIZES:-"250 500 1000 2000 4000"}
    p5_args=(--duration 30 --warmup 5)
    ;;
  small)
    out=${OUT:-target/bench-small}
    svg=${SVG:-$out/p5.svg}
    p1_args=(--connections 8 --duration 1 --warmup 1 --rounds 1 --tasks 4)
    p1_daemon_args=(--connections 2 --pipeline 8 --duration 1 --warmup 1 --rounds 1 --tasks 4)
    p3_args=(--servants 200 --delegates 10 --cycles-per-second 40
             --duration 5 --warmup 1 --running-tasks-interval-ms 0)
    p5_sizes=${P5_SIZES:-"25 50 100"}
    p5_args=(--duration 5 --warmup 2)
    ;;
  *)
    echo "usage: $0 [full|small]" >&2
    exit 2
    ;;
esac
only=${BENCH_ONLY:-"p1 p3 p5"}
p1_protocol=${P1_PROTOCOL:-flare}
p3_protocol=${P3_PROTOCOL:-flare}
p5_protocols=${P5_PROTOCOLS:-"flare http+pb"}
mkdir -p "$out"

echo "== building release binaries"
cargo build --release --locked --bins --features bench-route
bin=target/release

# Each simulated machine holds up to two sockets: raise the soft limit.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

scheduler_pid=""
port=""
stop_scheduler() {
  if [ -n "$scheduler_pid" ]; then
    kill "$scheduler_pid" 2>/dev/null || true
    wait "$scheduler_pid" 2>/dev/null || true
    scheduler_pid=""
  fi
}
trap stop_scheduler EXIT

# A fresh scheduler per run, on a free loopback port, so runs do not share state.
start_scheduler() {
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  RUST_LOG=warn "$bin/yadcc-scheduler" --listen "127.0.0.1:$port" \
    --acceptable_user_tokens=u --acceptable_servant_tokens=s "$@" &
  scheduler_pid=$!
  for _ in $(seq 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  echo "the scheduler did not start listening" >&2
  exit 1
}

loadgen() {
  "$bin/yadcc-loadgen" --scheduler "127.0.0.1:$port" --user-token u --servant-token s \
    --scheduler-pid "$scheduler_pid" "$@"
}

if [[ " $only " == *" p1 "* ]]; then
  echo "== P1: Heartbeat over flare, http+pb and JSON against the bare route"
  start_scheduler --bench_bare_route
  loadgen --protocol "$p1_protocol" heartbeat-rate "${p1_args[@]}" >"$out/p1.jsonl"
  stop_scheduler
  cat "$out/p1.jsonl"
  echo "== P1, the daemons' habit: 2 connections, 32 calls in flight on each"
  start_scheduler --bench_bare_route
  loadgen --protocol "$p1_protocol" heartbeat-rate "${p1_daemon_args[@]}" \
    --targets flare,http+pb,bare >"$out/p1-daemon.jsonl"
  stop_scheduler
  cat "$out/p1-daemon.jsonl"
fi

if [[ " $only " == *" p3 "* ]]; then
  echo "== P3: servants + grant cycles over $p3_protocol"
  start_scheduler
  loadgen --protocol "$p3_protocol" grant-cycles "${p3_args[@]}" >"$out/p3.jsonl"
  stop_scheduler
  cat "$out/p3.jsonl"
fi

if [[ " $only " == *" p5 "* ]]; then
  echo "== P5: the daemon mix at cluster sizes: $p5_sizes ($p5_protocols)"
  : >"$out/p5.jsonl"
  for protocol in $p5_protocols; do
    for machines in $p5_sizes; do
      start_scheduler
      loadgen --protocol "$protocol" daemon-mix --machines "$machines" "${p5_args[@]}" >>"$out/p5.jsonl"
      stop_scheduler
    done
  done
  cat "$out/p5.jsonl"

  echo "== plotting $svg"
  venv=target/bench-venv
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check 'matplotlib>=3.8,<4'
  fi
  "$venv/bin/python" scripts/plot_p5.py "$out/p5.jsonl" "$svg"
fi
