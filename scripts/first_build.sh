#!/usr/bin/env bash
# The first `cargo build --release`, from an empty target directory, and
# where its CPU time goes (BENCHMARKS.md, "First build"). On a shared
# machine wall times say more about the load than about the build, so every
# rustc and C compiler run is timed on its own (user + system seconds) and
# summed per crate; what is left of the build's total CPU is cargo itself
# and build scripts' own work.
#   scripts/first_build.sh [DIR] [TOP]    DIR: the scratch target directory
#                                         (default target/first-build, emptied)
# Extra cargo arguments go in FIRST_BUILD_ARGS; the --timings report is left
# in DIR/cargo-timings.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-target/first-build}
top=${2:-8}
command -v /usr/bin/time >/dev/null 2>&1 || {
  echo "needs /usr/bin/time (Debian's time package)" >&2
  exit 2
}
case "$dir" in /*) ;; *) dir="$PWD/$dir" ;; esac
rm -rf "$dir"
mkdir -p "$dir/wrap"
log="$dir/cpu.log"
: >"$log"

# Each wrapper names the unit a run belongs to: rustc by --crate-name, a C
# compiler by the build directory its object goes to (build/CRATE-HASH/out).
cat >"$dir/wrap/rustc" <<'EOF'
#!/usr/bin/env bash
name=rustc-query prev="" out=""
for arg; do
  [ "$prev" = --crate-name ] && name=$arg
  [ "$prev" = --out-dir ] && out=$arg
  prev=$arg
done
# A build script's crate is named by the directory it is built into.
if [ "$name" = build_script_build ]; then
  name="$(sed -n 's|.*/build/\(.*\)-[0-9a-f]\{16\}$|\1|p' <<<"$out") (build script)"
fi
times=$(mktemp)
status=0
/usr/bin/time -f '%U %S' -o "$times" "$@" || status=$?
echo "$name $(tail -1 "$times")" >>"$FIRST_BUILD_LOG"
rm -f "$times"
exit "$status"
EOF
cat >"$dir/wrap/cc" <<'EOF'
#!/usr/bin/env bash
name=cc-probe prev=""
for arg; do
  [ "$prev" = -o ] && name=$(sed -n 's|.*/build/\([^/]*\)-[0-9a-f]\{16\}/out/.*|\1 (C)|p' <<<"$arg")
  prev=$arg
done
times=$(mktemp)
status=0
/usr/bin/time -f '%U %S' -o "$times" "${FIRST_BUILD_CC:-cc}" "$@" || status=$?
echo "${name:-cc-other} $(tail -1 "$times")" >>"$FIRST_BUILD_LOG"
rm -f "$times"
exit "$status"
EOF
chmod +x "$dir/wrap/rustc" "$dir/wrap/cc"

echo "== cargo build --release --locked --timings (target $dir)"
# shellcheck disable=SC2086
FIRST_BUILD_LOG="$log" RUSTC_WRAPPER="$dir/wrap/rustc" CC="$dir/wrap/cc" \
  CARGO_TARGET_DIR="$dir" /usr/bin/time -f '%e %U %S %M' -o "$dir/total" \
  cargo build --release --locked --timings ${FIRST_BUILD_ARGS:-}
read -r wall user sys rss <"$dir/total"
python3 - "$log" "$wall" "$user" "$sys" "$rss" "$top" <<'EOF'
import collections, sys
log, wall, user, sys_s, rss, top = sys.argv[1:]
per = collections.Counter()
for line in open(log):
    parts = line.rsplit(None, 2)
    if len(parts) == 3:
        try:
            per[parts[0]] += float(parts[1]) + float(parts[2])
        except ValueError:
            pass
total = float(user) + float(sys_s)
print(f"wall {float(wall):.0f} s, CPU {total:.0f} s (user {float(user):.0f} + sys {float(sys_s):.0f}), peak RSS {int(rss) // 1024} MiB")
print(f"timed compiler runs {sum(per.values()):.0f} CPU-s; cargo and build scripts' own work {total - sum(per.values()):.0f} CPU-s")
for name, cpu in per.most_common(int(top)):
    print(f"  {cpu:7.1f} CPU-s  {name}")
EOF
