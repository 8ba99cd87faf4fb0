#!/usr/bin/env bash
# P1's gRPC row: gRPC Heartbeat against Connect binary Heartbeat, same
# server, same HTTP/2 client (h2load from Debian's nghttp2-client), same
# message, alternating rounds. Prints req/s per round and the median ratio.
#
#   scripts/bench_grpc.sh [rounds] [seconds]     (defaults: 3 rounds of 5 s)
#
# Builds the release scheduler, and installs h2load and nghttp (Debian's
# nghttp2-client) when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v h2load >/dev/null 2>&1 || ! command -v nghttp >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nghttp2-client >/dev/null
fi
cargo build --release --locked --bin yadcc-scheduler
rounds=${1:-3}
seconds=${2:-5}
path=/yadcc.scheduler.SchedulerService/Heartbeat
work=$(mktemp -d)
# shellcheck source=scripts/lib/scheduler.sh
. scripts/lib/scheduler.sh
scheduler_pid=""
trap 'kill $scheduler_pid 2>/dev/null || true; rm -rf "$work"' EXIT

# HeartbeatRequest{token "s", next_heartbeat_in_ms 10000, version 1,
# location "127.0.0.1:8335", num_processors 16, capacity 8,
# env_descs [{compiler_digest "c0ffee"}]}, hand-encoded: 38 bytes.
printf '\x6a\x01s\x38\x90\x4e\x58\x01\x0a\x0e127.0.0.1:8335\x50\x10\x18\x08\x32\x08\x0a\x06c0ffee' >"$work/heartbeat.bin"
length=$(wc -c <"$work/heartbeat.bin")
{ printf '\x00\x00\x00\x00'; printf "\\x$(printf %02x "$length")"; cat "$work/heartbeat.bin"; } >"$work/heartbeat.grpc"

start_scheduler target/release/yadcc-scheduler "$work/scheduler.log" \
  --acceptable_user_tokens=u --acceptable_servant_tokens=s
addr=$scheduler_addr

# Both succeed before anything is measured (gRPC: grpc-status 0 in the trailers).
curl -sf --http2-prior-knowledge -o /dev/null -H 'content-type: application/proto' \
  --data-binary @"$work/heartbeat.bin" "http://$addr$path"
# curl does not show HTTP/2 trailers; nghttp (same package as h2load) does.
nghttp -v -H 'content-type: application/grpc' -H 'te: trailers' -d "$work/heartbeat.grpc" \
  "http://$addr$path" >"$work/grpc-frames" 2>&1 || true
grep -aq 'grpc-status: 0' "$work/grpc-frames" ||
  { echo "gRPC Heartbeat failed:"; grep -a 'grpc-' "$work/grpc-frames"; exit 1; }

run() { # content-type body -> req/s
  h2load -c 8 -m 8 -t 1 -D "$seconds" --warm-up-time 1 \
    -H "content-type: $1" -H 'te: trailers' -d "$2" "http://$addr$path" |
    awk '/^finished in/ { print $4 } /^status codes:/ { if ($3 + 0 == 0) bad = 1 } END { exit bad }'
}
ratios=()
for round in $(seq "$rounds"); do
  connect=$(run application/proto "$work/heartbeat.bin")
  grpc=$(run application/grpc "$work/heartbeat.grpc")
  ratio=$(awk -v g="$grpc" -v c="$connect" 'BEGIN { printf "%.2f", g / c }')
  ratios+=("$ratio")
  echo "round $round: connect-binary $connect req/s, grpc $grpc req/s, grpc/connect $ratio"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{ r[NR] = $1 } END { print "median grpc/connect: " r[int((NR + 1) / 2)] }'
