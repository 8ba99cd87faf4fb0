#!/usr/bin/env bash
# Benchmarks P1, P3, P5, P6 and P7 (BENCHMARKS.md), and this scheduler beside the
# original one under the same yadcc-loadgen runs (P1's Heartbeat rate and P5
# over flare). Builds the binaries, runs each scheduler and yadcc-loadgen as
# separate processes on this machine, a fresh scheduler per run, collects the
# load generator's JSON lines, prints the side-by-side table and draws P5.
#
#   scripts/bench.sh            # full scale, as in BENCHMARKS.md (~35 min, and P7 ~3 h; a quiet machine)
#   scripts/bench.sh small      # the same steps at toy scale (~4 min)
#   scripts/bench.sh smoke      # CI: debug build, tiny runs, results checked
#
# The original scheduler is $YADCC_ORIGINAL, else ../shared/peers/yadcc-scheduler
# if present (it speaks only flare, listens on 0.0.0.0, takes --port=P).
# Without it the side-by-side runs are left out; `smoke` is then skipped
# (one line saying so), except in CI (CI=true), where that is an error.
#
# Output in $OUT (full: benches/results/ and benches/p5.svg; small:
# target/bench-small/; smoke: target/bench-smoke/): p1.jsonl, p1-daemon.jsonl,
# p3.jsonl, p5.jsonl, p6.jsonl, p7.jsonl, p1-side-by-side.jsonl, p5-side-by-side.jsonl,
# side-by-side.md (with P7's table) and the P5 plot. BENCH_ONLY="p1 p3 p5 p6 p7 original" runs a
# subset; P1_PROTOCOL (how P1 sets up its servants), P3_PROTOCOL,
# P5_PROTOCOLS, P5_SIZES and ORIGINAL_SIZES override the defaults; P7_SEED and
# P7_MIXES P7's seed and mixes, P7_SPEEDS its farms' processor speeds (same,
# mixed), P7_AGAINST its columns. P7 (the farm's outcome, docs/farm.md) runs
# in real time: each farm and mix against the original, this scheduler, this
# one with --foreign_load_from_own_average=false (the original's rule for a
# servant's foreign load, "held") and this one with
# --place_by_observed_speed=false (the original's pick order, "nospeed"),
# same seed, same builds; every line also carries the ideal placement's
# figures (ideal_*).
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
    p5_sizes=${P5_SIZES:-"250 500 1000 2000 3000 4000 5000"}
    original_sizes=${ORIGINAL_SIZES:-"250 500 1000 2000"}
    p5_args=(--duration 30 --warmup 5)
    # Two load-generator threads: reading 1.1 GB/s of answers on one thread
    # queues the simulated daemons' calls behind each other, and P6's p99 is
    # the scheduler's (BENCHMARKS.md, P6).
    p6_args=(--servants 2000 --pollers 1000 --tasks 20000 --duration 30 --warmup 5 --threads 2)
    p7_args=(--servants 200 --developers 100 --duration 600 --drain 300)
    ;;
  small)
    out=${OUT:-target/bench-small}
    svg=${SVG:-$out/p5.svg}
    p1_args=(--connections 8 --duration 1 --warmup 1 --rounds 1 --tasks 4)
    p1_daemon_args=(--connections 2 --pipeline 8 --duration 1 --warmup 1 --rounds 1 --tasks 4)
    p3_args=(--servants 200 --delegates 10 --cycles-per-second 40
             --duration 5 --warmup 1 --running-tasks-interval-ms 0)
    p5_sizes=${P5_SIZES:-"25 50 100"}
    original_sizes=${ORIGINAL_SIZES:-"25 50"}
    p5_args=(--duration 5 --warmup 2)
    p6_args=(--servants 100 --pollers 50 --tasks 500 --duration 5 --warmup 2)
    p7_args=(--servants 40 --developers 20 --duration 60 --drain 60)
    ;;
  smoke)
    out=${OUT:-target/bench-smoke}
    svg=${SVG:-$out/p5.svg}
    p1_args=(--connections 4 --duration 1 --warmup 1 --rounds 1 --tasks 2)
    p1_daemon_args=(--connections 2 --pipeline 4 --duration 1 --warmup 1 --rounds 1 --tasks 2)
    p5_sizes=${P5_SIZES:-"10 20"}
    original_sizes=${ORIGINAL_SIZES:-"10 20"}
    p5_args=(--duration 3 --warmup 1)
    p6_args=(--servants 20 --pollers 10 --tasks 100 --duration 3 --warmup 1)
    # About 15 s: this scheduler alone, the bursty mix.
    p7_args=(--servants 6 --developers 3 --duration 5 --drain 8 --build-gap 5 --warmup 2)
    p7_mixes=${P7_MIXES:-bursty}
    p7_against=${P7_AGAINST:-this}
    p7_speeds=${P7_SPEEDS:-mixed}
    ;;
  *)
    echo "usage: $0 [full|small|smoke]" >&2
    exit 2
    ;;
esac

original=${YADCC_ORIGINAL:-}
if [ -z "$original" ] && [ -x ../shared/peers/yadcc-scheduler ]; then
  original=../shared/peers/yadcc-scheduler
fi
if [ -n "$original" ] && [ ! -x "$original" ]; then
  echo "YADCC_ORIGINAL=$original is not an executable" >&2
  exit 2
fi

if [ "$scale" = smoke ]; then
  if [ -z "$original" ]; then
    if [ "${CI:-}" = true ]; then
      echo "bench smoke: the original scheduler is missing (../shared/peers/yadcc-scheduler or YADCC_ORIGINAL)" >&2
      exit 1
    fi
    echo "SKIPPED bench smoke (scripts/bench.sh smoke): no original scheduler at ../shared/peers/yadcc-scheduler; set YADCC_ORIGINAL=path"
    exit 0
  fi
  # Every step at its smallest; P3 is left out (P5 and P6 cover its calls).
  only=${BENCH_ONLY:-"p1 p5 p6 p7 original"}
  # The test profile's binaries, which `cargo test` builds anyway.
  echo "== building debug binaries"
  cargo build --locked --workspace --bins
  bin=target/debug
  p1_targets=flare,http+pb,json
else
  only=${BENCH_ONLY:-"p1 p3 p5 p6 p7 original"}
  echo "== building release binaries"
  cargo build --release --locked --bin yadcc-scheduler --features bench-route
  cargo build --release --locked -p yadcc-loadgen
  bin=target/release
  p1_targets=flare,http+pb,json,bare
fi
p1_protocol=${P1_PROTOCOL:-flare}
p3_protocol=${P3_PROTOCOL:-flare}
p5_protocols=${P5_PROTOCOLS:-"flare http+pb"}
p7_seed=${P7_SEED:-1}
p7_mixes=${p7_mixes:-${P7_MIXES:-"bursty steady"}}
p7_against=${p7_against:-${P7_AGAINST:-"original this held nospeed"}}
p7_speeds=${p7_speeds:-${P7_SPEEDS:-"same mixed"}}
mkdir -p "$out"
echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), load:$(uptime | sed 's/.*load average://')"

# Each simulated machine holds up to two sockets: raise the soft limit.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# shellcheck source=scripts/lib/scheduler.sh
. scripts/lib/scheduler.sh
scheduler_pid=""
scheduler_addr=""
scheduler_log=$(mktemp)
stop_scheduler() {
  if [ -n "$scheduler_pid" ]; then
    kill "$scheduler_pid" 2>/dev/null || true
    wait "$scheduler_pid" 2>/dev/null || true
    scheduler_pid=""
  fi
}
trap 'stop_scheduler; rm -f "$scheduler_log"' EXIT

# The original takes only --port=P and binds 0.0.0.0, so its port is picked
# here just before it starts, below the kernel's ephemeral range: a probe
# of a port inside that range can connect to itself (its source port picked
# equal to the target) and pass with nothing listening. Should another
# process take the port first, the original exits and launch tries another.
original_port() {
  python3 - <<'PICK'
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(200):
    port = random.randrange(10000, max(low, 10001))
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            continue
        print(port)
        break
else:
    raise SystemExit("no free port below the ephemeral range")
PICK
}

# Listening means accepting twice with the process still alive afterwards.
original_listening() {
  local port=$1 accepted=0
  for _ in $(seq 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      accepted=$((accepted + 1))
      if [ "$accepted" -ge 2 ] && kill -0 "$scheduler_pid" 2>/dev/null; then
        return 0
      fi
    fi
    kill -0 "$scheduler_pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# A fresh scheduler per run, so runs do not share state: `this` (on a port
# the kernel picks, read back from its log) or `original`.
launch() {
  local which=$1 port
  shift
  if [ "$which" = original ]; then
    local attempt
    for attempt in 1 2 3; do
      port=$(original_port)
      "$original" --port="$port" --acceptable_user_tokens=u --acceptable_servant_tokens=s \
        --logtostderr 2>>"$out/original.log" &
      scheduler_pid=$!
      scheduler_addr=127.0.0.1:$port
      original_listening "$port" && return 0
      echo "the original scheduler did not start listening on $port (attempt $attempt)" >&2
      stop_scheduler
    done
    echo "the original scheduler never started listening; its log: $out/original.log" >&2
    exit 1
  else
    start_scheduler "$bin/yadcc-scheduler" "$scheduler_log" \
      --acceptable_user_tokens=u --acceptable_servant_tokens=s "$@"
  fi
}

# A failed run says what the scheduler logged (CI keeps no files).
loadgen() {
  local status=0
  "$bin/yadcc-loadgen" --scheduler "$scheduler_addr" --user-token u --servant-token s \
    --scheduler-pid "$scheduler_pid" "$@" || status=$?
  if [ "$status" -ne 0 ]; then
    echo "yadcc-loadgen $* failed ($status); the scheduler's log, last 40 lines:" >&2
    tail -n 40 "$scheduler_log" "$out/original.log" 2>/dev/null >&2 || true
  fi
  return "$status"
}

bare_flag=()
[[ "$p1_targets" == *bare* ]] && bare_flag=(--bench_bare_route)

if [[ " $only " == *" p1 "* ]]; then
  echo "== P1: Heartbeat over flare, http+pb and JSON${bare_flag:+ against the bare route}"
  launch this "${bare_flag[@]}"
  loadgen --label this --protocol "$p1_protocol" heartbeat-rate "${p1_args[@]}" \
    --targets "$p1_targets" >"$out/p1.jsonl"
  stop_scheduler
  cat "$out/p1.jsonl"
  echo "== P1, the daemons' habit: 2 connections, many calls in flight on each"
  launch this "${bare_flag[@]}"
  loadgen --label this --protocol "$p1_protocol" heartbeat-rate "${p1_daemon_args[@]}" \
    --targets "${p1_targets/,json/}" >"$out/p1-daemon.jsonl"
  stop_scheduler
  cat "$out/p1-daemon.jsonl"
fi

if [[ " $only " == *" p3 "* ]]; then
  echo "== P3: servants + grant cycles over $p3_protocol"
  launch this
  loadgen --label this --protocol "$p3_protocol" grant-cycles "${p3_args[@]}" >"$out/p3.jsonl"
  stop_scheduler
  cat "$out/p3.jsonl"
fi

if [[ " $only " == *" p5 "* ]]; then
  echo "== P5: the daemon mix at cluster sizes: $p5_sizes ($p5_protocols)"
  : >"$out/p5.jsonl"
  for protocol in $p5_protocols; do
    for machines in $p5_sizes; do
      launch this
      loadgen --label this --protocol "$protocol" daemon-mix --machines "$machines" \
        "${p5_args[@]}" >>"$out/p5.jsonl"
      stop_scheduler
    done
  done
  cat "$out/p5.jsonl"
fi

if [[ " $only " == *" p6 "* ]]; then
  echo "== P6: the task list at scale, answers uncompressed, then compressed ones accepted"
  : >"$out/p6.jsonl"
  for accept in no yes; do
    accepting=()
    [ "$accept" = yes ] && accepting=(--accept-compression)
    launch this
    loadgen --label this --protocol flare task-list "${p6_args[@]}" "${accepting[@]}" \
      >>"$out/p6.jsonl"
    stop_scheduler
  done
  cat "$out/p6.jsonl"
fi

if [[ " $only " == *" p7 "* ]]; then
  echo "== P7: the farm's outcome, speeds $p7_speeds, mixes $p7_mixes, seed $p7_seed (${p7_args[*]})"
  : >"$out/p7.jsonl"
  for speeds in $p7_speeds; do
    for mix in $p7_mixes; do
      for which in $p7_against; do
        case "$which" in
          original)
            if [ -z "$original" ]; then
              echo "P7: no original scheduler: its column left out"
              continue
            fi
            launch original ;;
          held) launch this --foreign_load_from_own_average=false ;;
          nospeed) launch this --place_by_observed_speed=false ;;
          *) launch this ;;
        esac
        loadgen --label "$which" --protocol flare farm "${p7_args[@]}" --mix "$mix" \
          --speeds "$speeds" --seed "$p7_seed" >>"$out/p7.jsonl"
        stop_scheduler
      done
    done
  done
  cat "$out/p7.jsonl"
  python3 scripts/bench_table.py --p7 "$out/p7.jsonl" | tee "$out/p7.md"
fi

if [[ " $only " == *" original "* ]]; then
  if [ -z "$original" ]; then
    echo "== side by side: no original scheduler (YADCC_ORIGINAL or ../shared/peers): left out"
  else
    echo "== side by side with $original: P1's Heartbeat rate and P5 over flare, in turns"
    : >"$out/original.log"
    : >"$out/p1-side-by-side.jsonl"
    for which in this original; do
      for setup in one daemon; do
        if [ "$setup" = one ]; then args=("${p1_args[@]}"); else args=("${p1_daemon_args[@]}"); fi
        launch "$which"
        loadgen --label "$which" --protocol flare heartbeat-rate "${args[@]}" \
          --targets flare >>"$out/p1-side-by-side.jsonl"
        stop_scheduler
      done
    done
    : >"$out/p5-side-by-side.jsonl"
    for machines in $original_sizes; do
      for which in this original; do
        launch "$which"
        loadgen --label "$which" --protocol flare daemon-mix --machines "$machines" \
          "${p5_args[@]}" >>"$out/p5-side-by-side.jsonl"
        stop_scheduler
      done
    done
    cat "$out/p1-side-by-side.jsonl" "$out/p5-side-by-side.jsonl"
    python3 scripts/bench_table.py "$out" | tee "$out/side-by-side.md"
  fi
fi

if [ -s "$out/p5.jsonl" ]; then
  echo "== plotting $svg"
  venv=target/bench-venv
  matplotlib='matplotlib==3.10.8'
  if [ "$(cat "$venv/.pinned" 2>/dev/null)" != "$matplotlib" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$matplotlib"
    echo "$matplotlib" >"$venv/.pinned"
  fi
  sources=("$out/p5.jsonl")
  [ -s "$out/p5-side-by-side.jsonl" ] && sources+=("$out/p5-side-by-side.jsonl")
  "$venv/bin/python" scripts/plot_p5.py "${sources[@]}" "$svg"
fi

if [ "$scale" = smoke ]; then
  python3 scripts/bench_table.py --check "$out"
fi
