#!/usr/bin/env bash
# The Debian package, end to end (docs/install.md): builds it with cargo-deb
# (pinned, installed into target/test-tools/cargo-deb), installs it with
# dpkg -i, checks both units with `systemd-analyze verify`, runs the installed
# binary as the unit would (its ExecStart line, as the package's user, with
# the package's flag file and secrets file; only the address changed to a
# free loopback port) until /healthz, /readyz and the dashboard's API
# answer, then removes the package (dpkg -r keeps the configuration, as
# Debian does) and purges it (secrets, state and user gone).
#
# PACKAGE_PROFILE=release (the default) packages `cargo build --release`;
# PACKAGE_PROFILE=debug packages the debug binary `cargo test` built
# (no release build: for CI, where only the package's contents are tested;
# cargo-deb 3.8 warns that it may refuse the dev profile one day).
# PACKAGE_DEB=FILE tests that package instead of building one.
# Needs root (or sudo) for dpkg. It leaves the machine as it found it: a
# yadcc-scheduler package already there (installed, or its configuration
# left) stops it before anything is built, and from `dpkg -i` on, any exit
# (a failed check, an error, SIGTERM from a timeout) purges the package.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/apt.sh
. scripts/lib/apt.sh

# Someone's own install is never replaced or purged by a test.
installed=$(dpkg-query -W -f='${Status}' yadcc-scheduler 2>/dev/null || true)
case "$installed" in
  "" | *not-installed) ;;
  *)
    echo "a yadcc-scheduler package is on this machine ($installed): this test would replace and purge it;" \
      "remove it first (dpkg --purge yadcc-scheduler)" >&2
    exit 1
    ;;
esac

tools=${YADCC_TEST_TOOLS:-target/test-tools}
cargo_deb_version=3.8.0
profile=${PACKAGE_PROFILE:-release}
# How long the installed scheduler may take to answer (a loaded machine).
start_limit_s=30
# How long it may take to stop on SIGTERM before it is killed.
stop_limit_s=10
# How long the cleanup retries the purge while dpkg's lock is held.
purge_limit_s=30
package=yadcc-scheduler

case "$tools" in /*) ;; *) tools="$PWD/$tools" ;; esac
export PATH="$tools/cargo-deb/bin:$PATH"
if [ "$(cargo-deb --version 2>/dev/null)" != "cargo-deb $cargo_deb_version" ]; then
  echo "installing cargo-deb $cargo_deb_version..."
  # Without its default features: it compresses with Debian's xz instead of
  # compiling liblzma, and reads no debug ids (no -dbgsym package here); it
  # builds in about 75 s here.
  cargo install cargo-deb --version "$cargo_deb_version" --locked --force --no-default-features \
    --root "$tools/cargo-deb"
fi
command -v xz >/dev/null 2>&1 || apt_install xz-utils
command -v systemd-analyze >/dev/null 2>&1 || apt_install systemd
command -v curl >/dev/null 2>&1 || apt_install curl

deb=${PACKAGE_DEB:-}
if [ -z "$deb" ]; then
echo "== building the package ($profile binary)"
case "$profile" in
  release)
    cargo build --release --locked --bin yadcc-scheduler
    deb_profile=(--profile release)
    ;;
  debug)
    # With the integration tests, so with the dev-dependencies' features
    # (tokio's test-util among them) that `cargo test` built the binary
    # with: after the tests nothing is rebuilt, where the binary alone
    # would rebuild most of the tree without them.
    cargo build --locked --bin yadcc-scheduler --test it
    # xz at its fastest: the debug binary is large, and only its contents
    # are tested.
    deb_profile=(--profile dev --fast)
    ;;
  *)
    echo "PACKAGE_PROFILE is release or debug, not $profile" >&2
    exit 2
    ;;
esac
# Its own directory: target/debian holds what `cargo deb` makes by hand (a
# release package someone is about to install), which a test must not replace.
out=target/package-test
rm -rf "$out"
deb=$(cargo deb --no-build --locked "${deb_profile[@]}" --output "$out" | tail -1)
[ -f "$deb" ] || {
  echo "cargo deb made no package: $deb" >&2
  exit 1
}
fi
echo "$deb: $(du -h "$deb" | cut -f1)"

if [ "$(id -u)" -eq 0 ]; then root=(); else root=(sudo); fi
scratch=$(mktemp -d -t yadcc-package.XXXXXX)
server=""
# The scheduler is stopped and gone before the purge: userdel refuses a
# user that still runs a process, and the purge would fail.
stop_server() {
  [ -n "$server" ] || return 0
  kill "$server" 2>/dev/null || true
  (sleep "$stop_limit_s" && kill -KILL "$server" 2>/dev/null) &
  local killer=$!
  wait "$server" 2>/dev/null || true
  kill "$killer" 2>/dev/null || true
  server=""
}
cleanup() {
  stop_server
  # A dpkg cut short (a timeout's SIGTERM) may hold its lock a moment
  # longer, leaves the package half installed, which only a forced purge
  # removes, and its new configuration files unregistered. (A purge of a
  # package that is not there succeeds.)
  for _ in $(seq $((purge_limit_s * 2))); do
    "${root[@]}" dpkg --purge --force-remove-reinstreq "$package" >/dev/null 2>&1 && break
    sleep 0.5
  done
  "${root[@]}" find /etc/yadcc-scheduler -maxdepth 1 -name '*.dpkg-*' -delete 2>/dev/null || true
  "${root[@]}" rmdir /etc/yadcc-scheduler 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT

echo "== dpkg -i"
"${root[@]}" dpkg -i "$deb"
for path in /usr/bin/yadcc-scheduler /etc/yadcc-scheduler/flags /etc/yadcc-scheduler/ha.flags \
  /etc/yadcc-scheduler/env /lib/systemd/system/yadcc-scheduler.service \
  /lib/systemd/system/yadcc-scheduler-ha.service /usr/share/doc/yadcc-scheduler/install.md; do
  [ -e "$path" ] || {
    echo "the package installed no $path" >&2
    exit 1
  }
done
getent passwd "$package" >/dev/null || {
  echo "the package made no $package user" >&2
  exit 1
}
mode=$(stat -c '%a %U:%G' /etc/yadcc-scheduler/env)
[ "$mode" = "640 root:$package" ] || {
  echo "/etc/yadcc-scheduler/env is $mode, not 640 root:$package" >&2
  exit 1
}

echo "== systemd-analyze verify"
for unit in yadcc-scheduler.service yadcc-scheduler-ha.service; do
  said=$(timeout 60 systemd-analyze verify "/lib/systemd/system/$unit" 2>&1) || {
    echo "$unit: $said" >&2
    exit 1
  }
  if grep -F "$unit" <<<"$said"; then
    echo "$unit: systemd-analyze verify warned" >&2
    exit 1
  fi
done

echo "== the installed scheduler, as yadcc-scheduler.service starts it"
exec_start=$(sed -n 's/^ExecStart=//p' /lib/systemd/system/yadcc-scheduler.service)
read -r -a command <<<"$exec_start"
log="$scratch/scheduler.log"
: >"$log"
# The admin token is drawn but commented out (the admin API stays closed
# until an operator opens it): the run below opens it as an operator would,
# by removing the #.
admin_token=$("${root[@]}" sed -n 's/^#YADCC_ADMIN_TOKENS=//p' /etc/yadcc-scheduler/env)
[[ "$admin_token" =~ ^[0-9a-f]{32}$ ]] || {
  echo "/etc/yadcc-scheduler/env has no commented #YADCC_ADMIN_TOKENS=<32 hex> line" >&2
  exit 1
}
# The unit's environment file holds the secrets: read it as systemd does
# (KEY=value lines, # comments). setpriv execs the scheduler (runuser would
# fork it), so $! is the scheduler itself, which stop_server waits for.
"${root[@]}" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
  $("${root[@]}" grep -v '^#' /etc/yadcc-scheduler/env | grep '=') YADCC_ADMIN_TOKENS="$admin_token" \
  setpriv --reuid="$package" --regid="$package" --init-groups -- \
  "${command[@]}" --listen=127.0.0.1:0 2>"$log" &
server=$!
address=""
for _ in $(seq $((start_limit_s * 10))); do
  address=$(grep -o 'listening on http://[0-9.:]*' "$log" | head -1 | sed 's/listening on //' || true)
  [ -n "$address" ] && break
  kill -0 "$server" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$address" ]; then
  echo "the installed scheduler did not start:" >&2
  cat "$log" >&2
  exit 1
fi
credential=$("${root[@]}" sed -n 's/^YADCC_INSPECT_CREDENTIAL=//p' /etc/yadcc-scheduler/env)
status=$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' \
  -H "Authorization: Bearer $admin_token" -d '{}' \
  "$address/rpc/yadcc.scheduler.AdminService.ListServantStates")
[ "$status" = 200 ] || {
  echo "the admin API answered $status to the packaged admin token once uncommented, not 200" >&2
  exit 1
}
curl -fsS "$address/healthz" >/dev/null
curl -fsS "$address/readyz" >/dev/null
curl -fsS -u "$credential" "$address/api/v1/overview" >/dev/null
status=$(curl -s -o /dev/null -w '%{http_code}' "$address/api/v1/overview")
[ "$status" = 401 ] || {
  echo "the dashboard's API answered $status without the packaged credential, not 401" >&2
  exit 1
}
echo "$address: /healthz, /readyz, /api/v1/overview with the packaged credential (401 without), the admin API with the packaged admin token"
stop_server

echo "== dpkg -r, then --purge"
"${root[@]}" dpkg -r "$package"
[ ! -e /usr/bin/yadcc-scheduler ] || {
  echo "dpkg -r left /usr/bin/yadcc-scheduler" >&2
  exit 1
}
[ -e /etc/yadcc-scheduler/flags ] || {
  echo "dpkg -r removed the configuration (only --purge does)" >&2
  exit 1
}
"${root[@]}" dpkg --purge "$package"
for path in /etc/yadcc-scheduler /var/lib/yadcc-scheduler; do
  [ ! -e "$path" ] || {
    echo "dpkg --purge left $path" >&2
    exit 1
  }
done
! getent passwd "$package" >/dev/null || {
  echo "dpkg --purge left the $package user" >&2
  exit 1
}
echo "package test passed"
