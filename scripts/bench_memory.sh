#!/usr/bin/env bash
# Peak RSS (VmHWM) of the scheduler under each attack of issue 22, and the
# worst latency of a legitimate daemon's heartbeats during it: the memory
# tests (tests/memory) against a release binary, each attack 20 s against a
# fresh scheduler holding 40,960 running tasks. Prints one line per attack.
#
#   scripts/bench_memory.sh                          # this tree, release
#   scripts/bench_memory.sh path/to/yadcc-scheduler  # another build (an older one)
#   SECONDS_ATTACKED=10 scripts/bench_memory.sh
#
# An attack stops early only past STOP_MIB (8192 by default), so an older
# build shows how far it grows; its tests then fail, which is expected.
set -euo pipefail
cd "$(dirname "$0")/.."

binary=${1:-}
if [ -z "$binary" ]; then
  cargo build --release --locked --bin yadcc-scheduler
  binary=target/release/yadcc-scheduler
fi
binary=$(realpath "$binary")
# The clients (attackers and the legitimate daemon) are the test harness.
cargo test --locked --test memory --no-run
YADCC_SCHEDULER_BINARY=$binary \
  YADCC_MEMORY_ATTACK_SECONDS=${SECONDS_ATTACKED:-20} \
  YADCC_MEMORY_STOP_MIB=${STOP_MIB:-8192} \
  cargo test --locked --test memory -- --nocapture --test-threads=1 2>&1 |
  grep -E '^memory: [0-9]' || true
