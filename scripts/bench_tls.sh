#!/usr/bin/env bash
# P1's TLS row: Connect binary Heartbeat over HTTP/2 with TLS (ALPN h2)
# against the same over h2c, same server and port, same HTTP/2 client
# (h2load from Debian's nghttp2-client), same message, alternating rounds.
# Prints req/s per round and the median ratio.
#
#   scripts/bench_tls.sh [rounds] [seconds]     (defaults: 3 rounds of 5 s)
#
# Builds the release scheduler (SCHEDULER_BINARY to use another build),
# makes a throwaway P-256 certificate with the openssl CLI, and installs
# h2load (Debian's nghttp2-client) when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v h2load >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nghttp2-client >/dev/null
fi
binary=${SCHEDULER_BINARY:-target/release/yadcc-scheduler}
if [ -z "${SCHEDULER_BINARY:-}" ]; then
  cargo build --release --locked --bin yadcc-scheduler
fi
rounds=${1:-3}
seconds=${2:-5}
path=/yadcc.scheduler.SchedulerService/Heartbeat
work=$(mktemp -d)
# shellcheck source=scripts/lib/scheduler.sh
. scripts/lib/scheduler.sh
scheduler_pid=""
trap 'kill $scheduler_pid 2>/dev/null || true; rm -rf "$work"' EXIT

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
  -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
  -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null

# The 38-byte HeartbeatRequest of scripts/bench_grpc.sh.
printf '\x6a\x01s\x38\x90\x4e\x58\x01\x0a\x0e127.0.0.1:8335\x50\x10\x18\x08\x32\x08\x0a\x06c0ffee' >"$work/heartbeat.bin"

start_scheduler "$binary" "$work/scheduler.log" \
  --acceptable_user_tokens=u --acceptable_servant_tokens=s \
  --tls_cert_file="$work/cert.pem" --tls_key_file="$work/key.pem"
port=${scheduler_addr##*:}

# Both answer 200 over HTTP/2 before anything is measured.
for url in "http://127.0.0.1:$port$path" "https://localhost:$port$path"; do
  curl -sf --http2-prior-knowledge --cacert "$work/cert.pem" -o /dev/null \
    -H 'content-type: application/proto' --data-binary @"$work/heartbeat.bin" "$url"
done

run() { # url -> req/s (h2load does not check the certificate)
  h2load -c 8 -m 8 -t 1 -D "$seconds" --warm-up-time 1 \
    -H 'content-type: application/proto' -d "$work/heartbeat.bin" "$1" |
    awk '/^finished in/ { print $4 } /^status codes:/ { if ($3 + 0 == 0) bad = 1 } END { exit bad }'
}
ratios=()
for round in $(seq "$rounds"); do
  h2c=$(run "http://127.0.0.1:$port$path")
  tls=$(run "https://localhost:$port$path")
  ratio=$(awk -v t="$tls" -v c="$h2c" 'BEGIN { printf "%.2f", t / c }')
  ratios+=("$ratio")
  echo "round $round: h2c $h2c req/s, h2+TLS $tls req/s, tls/h2c $ratio"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{ r[NR] = $1 } END { print "median tls/h2c: " r[int((NR + 1) / 2)] }'
