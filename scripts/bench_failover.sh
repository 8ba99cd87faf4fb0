#!/usr/bin/env bash
# Failover time of the hot standby (BENCHMARKS.md): Debian's etcd and
# HAProxy, two release schedulers and 30 simulated stock daemons over flare
# through HAProxy; kill -9 the leader 10 times (restarting it as the new
# standby each time) and print, per run and as min / median / max, the time
# from the kill to the new leader's first grant. About two minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in etcd haproxy; do
  command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || {
    echo "$tool is missing: scripts/test.sh installs it (apt-get install etcd-server haproxy)" >&2
    exit 1
  }
done
exec cargo test --release --locked --test ha failover_time_over_10_runs -- --ignored --nocapture
