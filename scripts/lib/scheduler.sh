# shellcheck shell=bash
# Sourced by the scripts that start a scheduler. It listens on a port the
# kernel picks (`--listen HOST:0`) and the script reads the address back from
# its log, so no port is ever chosen before the scheduler binds it.
#
#   start_scheduler BINARY LOG [FLAGS...]
#       starts BINARY on 127.0.0.1:0 (SCHEDULER_HOST to change the address)
#       with its log in LOG; sets scheduler_pid and scheduler_addr (HOST:PORT).
#       Extra words before BINARY (e.g. valgrind) go in SCHEDULER_WRAPPER.
#   wait_for_listening PID LOG
#       prints HOST:PORT once the scheduler PID says where it listens; fails
#       loudly (its log on stderr) if it exits first or takes over a minute.
#
# The address is in an info line of the `yadcc_scheduler` target, so the log
# level keeps it (SCHEDULER_RUST_LOG; the access log stays off by default).

wait_for_listening() {
  local pid=$1 log=$2 addr
  for _ in $(seq 600); do
    addr=$(sed -n 's|.*listening on http://\([^ ]*\).*|\1|p' "$log" | head -n 1)
    if [ -n "$addr" ]; then
      echo "$addr"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "the scheduler (pid $pid) exited before it listened; its log:" >&2
      cat "$log" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "the scheduler (pid $pid) did not say where it listens within a minute; its log:" >&2
  cat "$log" >&2
  return 1
}

start_scheduler() {
  local binary=$1 log=$2
  shift 2
  # shellcheck disable=SC2086 # the wrapper is words on purpose
  RUST_LOG=${SCHEDULER_RUST_LOG:-info,yadcc_scheduler::access=warn} \
    ${SCHEDULER_WRAPPER:-} "$binary" --listen "${SCHEDULER_HOST:-127.0.0.1}:0" "$@" >"$log" 2>&1 &
  scheduler_pid=$!
  # shellcheck disable=SC2034 # for the script that sources this one
  scheduler_addr=$(wait_for_listening "$scheduler_pid" "$log")
}
