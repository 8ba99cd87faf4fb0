"""This scheduler beside the original, from scripts/bench.sh's JSON lines:
P1's Heartbeat rate and the P5 daemon mix over flare, run by the same
yadcc-loadgen in turns. Prints a markdown table.

    python3 scripts/bench_table.py DIR            # DIR/p1-side-by-side.jsonl, p5-side-by-side.jsonl
    python3 scripts/bench_table.py --check DIR    # checks every result of a bench.sh run
    python3 scripts/bench_table.py --p7 FILE      # P7: the farm's outcome, per mix

--check (the CI smoke run) fails unless every file a run writes is there and
well formed, this scheduler's runs have 0 errors (and no task killed or
renewal refused), and the original's runs answered calls.
"""

import json
import sys
from pathlib import Path

THIS, ORIGINAL = "this", "original"
# The original has no headroom left: calls fail, or it answers fewer than
# this scheduler under the same load.
SATURATED_RATE = 0.95
# P5's latency goal (BENCHMARKS.md).
P99_GOAL_MS = 20
# Below this many calls a second, a rate lower by SATURATED_RATE is noise.
MIN_JUDGED_RATE = 200


def lines(path: Path) -> list[dict]:
    runs = []
    with open(path, encoding="utf-8") as source:
        for number, line in enumerate(source, 1):
            if not line.strip():
                continue
            run = json.loads(line)
            if not isinstance(run, dict) or "bench" not in run:
                raise ValueError(f"{path}:{number}: not a yadcc-loadgen result")
            runs.append(run)
    return runs


def by_label(runs: list[dict]) -> dict[str, list[dict]]:
    labelled: dict[str, list[dict]] = {}
    for run in runs:
        labelled.setdefault(run.get("label", THIS), []).append(run)
    return labelled


def number(value, digits=0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def setup_of(run: dict) -> str:
    if run["pipeline"] > 1:
        return f"daemons' habit ({run['connections']} connections x {run['pipeline']} in flight)"
    return f"one call at a time ({run['connections']} connections)"


def p1_table(runs: list[dict]) -> list[str]:
    labelled = by_label(runs)
    rows = [
        "| P1 Heartbeat over flare | this req/s | original req/s | this / original | "
        "this us/call | original us/call | original / this (CPU per call) | errors (this, original) |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for mine in labelled.get(THIS, []):
        theirs = next(
            (run for run in labelled.get(ORIGINAL, [])
             if (run["connections"], run["pipeline"]) == (mine["connections"], mine["pipeline"])),
            None,
        )
        if theirs is None:
            continue
        rate = mine["per_second"] / theirs["per_second"] if theirs["per_second"] else None
        mine_us, theirs_us = mine.get("scheduler_cpu_us_per_request"), theirs.get(
            "scheduler_cpu_us_per_request")
        cpu = theirs_us / mine_us if mine_us and theirs_us else None
        rows.append(
            f"| {setup_of(mine)} | {number(mine['per_second'])} | {number(theirs['per_second'])} | "
            f"{number(rate, 2)} x | {number(mine_us, 1)} | {number(theirs_us, 1)} | "
            f"{number(cpu, 2)} x | {mine['errors']}, {theirs['errors']} |")
    return rows


def cpu_of(run: dict):
    return (run.get("scheduler") or {}).get("cpu_seconds_per_second")


def p5_table(runs: list[dict]) -> list[str]:
    labelled = by_label(runs)
    originals = {run["machines"]: run for run in labelled.get(ORIGINAL, [])}
    rows = [
        "| P5 machines | this calls/s | this p99 ms | this errors | this CPU-s/s | "
        "original calls/s | original p99 ms | original errors | original CPU-s/s | "
        "original / this (CPU) | the original |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for mine in sorted(labelled.get(THIS, []), key=lambda run: run["machines"]):
        theirs = originals.get(mine["machines"])
        if theirs is None:
            continue
        cpu_mine, cpu_theirs = cpu_of(mine), cpu_of(theirs)
        cpu = cpu_theirs / cpu_mine if cpu_mine and cpu_theirs else None
        kept_up = theirs["all"]["per_second"] >= SATURATED_RATE * mine["all"]["per_second"]
        if theirs["all"]["errors"] > 0:
            verdict = "saturated"
        elif mine["all"]["per_second"] < MIN_JUDGED_RATE:
            # A few dozen calls a second vary by more than the threshold
            # from one run to the next (random jobs).
            verdict = "too small to judge"
        elif not kept_up:
            verdict = "saturated"
        elif theirs["all"]["p99_ms"] >= P99_GOAL_MS:
            verdict = f"keeps up, p99 over {P99_GOAL_MS} ms"
        else:
            verdict = "keeps up"
        rows.append(
            f"| {mine['machines']:,} | {number(mine['all']['per_second'])} | "
            f"{number(mine['all']['p99_ms'], 2)} | {mine['all']['errors']} | {number(cpu_mine, 3)} | "
            f"{number(theirs['all']['per_second'])} | {number(theirs['all']['p99_ms'], 2)} | "
            f"{theirs['all']['errors']} | {number(cpu_theirs, 3)} | {number(cpu, 2)} x | {verdict} |")
    return rows


# What every P7 line carries (the interface an outside check relies on).
P7_FIELDS = ("builds", "build_p50_s", "build_p95_s", "compile_wait_p95_s", "utilisation",
             "idle_while_waiting_slot_s", "ideal_build_p95_s")
# P7's columns: the original, this scheduler (its defaults: rules "own load"
# and "observed speed"), this one with the original's rule for the foreign
# load, and this one with the original's pick order.
P7_COLUMNS = (("original", "original"), ("this", "this"),
              ("held", "this, --foreign_load_from_own_average=false"),
              ("nospeed", "this, --place_by_observed_speed=false"))


def p7_table(runs: list[dict]) -> list[str]:
    rows = ["| speeds | mix | seed | scheduler | builds | build p50 s | build p95 s | "
            "compile wait p95 s | utilisation | idle while waiting, slot-s | unfinished | errors |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    # Lines from before --speeds are of a farm of one speed.
    kinds = sorted({(run.get("speeds", "same"), run["mix"]) for run in runs})
    for speeds, mix in kinds:
        of_mix = [run for run in runs
                  if (run.get("speeds", "same"), run["mix"]) == (speeds, mix)]
        for label, name in P7_COLUMNS:
            for run in of_mix:
                if run.get("label", THIS) != label:
                    continue
                rows.append(
                    f"| {speeds} | {mix} | {run['seed']} | {name} | {run['builds']} | {number(run['build_p50_s'], 1)} | "
                    f"{number(run['build_p95_s'], 1)} | {number(run['compile_wait_p95_s'], 2)} | "
                    f"{number(run['utilisation'], 3)} | {number(run['idle_while_waiting_slot_s'])} | "
                    f"{run.get('unfinished', '-')} | {run.get('errors', '-')} |")
        if of_mix:
            ideal = of_mix[0]
            rows.append(
                f"| {speeds} | {mix} | {ideal['seed']} | ideal (simulated) | {ideal['builds']} | "
                f"{number(ideal['ideal_build_p50_s'], 1)} | {number(ideal['ideal_build_p95_s'], 1)} | "
                f"{number(ideal['ideal_compile_wait_p95_s'], 2)} | {number(ideal['ideal_utilisation'], 3)} | "
                f"{number(ideal['ideal_idle_while_waiting_slot_s'])} | {ideal['ideal_unfinished']} | - |")
    return rows


def table(directory: Path) -> str:
    parts = ["## This scheduler and the original, same yadcc-loadgen runs, over flare", ""]
    p1 = directory / "p1-side-by-side.jsonl"
    if p1.exists():
        parts += p1_table(lines(p1)) + [""]
    p5 = directory / "p5-side-by-side.jsonl"
    if p5.exists():
        parts += p5_table(lines(p5)) + [""]
    return "\n".join(parts)


class Check:
    def __init__(self, directory: Path):
        self.directory = directory
        self.problems: list[str] = []

    def fail(self, message: str) -> None:
        self.problems.append(message)

    def runs(self, name: str) -> list[dict]:
        path = self.directory / name
        if not path.exists():
            self.fail(f"{name}: missing")
            return []
        try:
            runs = lines(path)
        except (ValueError, KeyError) as error:
            self.fail(f"{name}: {error}")
            return []
        if not runs:
            self.fail(f"{name}: empty")
        return runs

    def clean(self, name: str, run: dict) -> None:
        """This scheduler's run: calls answered, none failed."""
        overall = run.get("all", run)
        what = f"{name} ({run['bench']}, {run.get('machines', run.get('target', ''))})"
        if overall.get("ok", 0) <= 0:
            self.fail(f"{what}: no call answered")
        if overall.get("errors") != 0:
            self.fail(f"{what}: {overall.get('errors')} errors {overall.get('error_kinds')}")
        if run.get("anomalies", 0) != 0:
            self.fail(f"{what}: {run['anomalies']} tasks killed or renewals refused")

    def answered(self, name: str, run: dict) -> None:
        """The original's run: well formed, calls answered."""
        if run.get("all", run).get("ok", 0) <= 0:
            self.fail(f"{name} (original, {run['bench']}): no call answered")

    def side_by_side(self, name: str, key) -> None:
        labelled = by_label(self.runs(name))
        for run in labelled.get(THIS, []):
            self.clean(name, run)
        for run in labelled.get(ORIGINAL, []):
            self.answered(name, run)
        mine = sorted(key(run) for run in labelled.get(THIS, []))
        theirs = sorted(key(run) for run in labelled.get(ORIGINAL, []))
        if not mine or mine != theirs:
            self.fail(f"{name}: runs of this scheduler {mine} and of the original {theirs} differ")

    def all(self) -> list[str]:
        for name in ("p1.jsonl", "p1-daemon.jsonl", "p5.jsonl"):
            for run in self.runs(name):
                self.clean(name, run)
        lists = self.runs("p6.jsonl")
        for run in lists:
            self.clean("p6.jsonl", run)
            task_list = run.get("task_list") or {}
            if not task_list.get("largest_list_tasks") or not task_list.get("answers_per_second"):
                self.fail(f"p6.jsonl: no task list received: {task_list}")
        if sorted(run.get("accept_compression") for run in lists) != [False, True]:
            self.fail("p6.jsonl: wants one run accepting compressed answers and one not")
        for run in self.runs("p7.jsonl"):
            missing = [field for field in P7_FIELDS if field not in run]
            if missing:
                self.fail(f"p7.jsonl: {run.get('label', THIS)} lacks {missing}")
            elif run.get("label", THIS) in (THIS, "held"):
                if run["builds"] <= 0 or run["ideal_build_p95_s"] <= 0:
                    self.fail(f"p7.jsonl: no build measured: {run}")
                if run.get("errors") != 0:
                    self.fail(f"p7.jsonl: {run.get('errors')} errors")
        self.side_by_side("p1-side-by-side.jsonl", lambda run: (run["connections"], run["pipeline"]))
        self.side_by_side("p5-side-by-side.jsonl", lambda run: run["machines"])
        markdown = self.directory / "side-by-side.md"
        if not markdown.exists() or markdown.read_text(encoding="utf-8").count("\n|") < 4:
            self.fail("side-by-side.md: missing or without its tables")
        plot = self.directory / "p5.svg"
        if not plot.exists() or "<svg" not in plot.read_text(encoding="utf-8"):
            self.fail("p5.svg: missing or not an SVG")
        return self.problems


def main(arguments: list[str]) -> None:
    if len(arguments) == 2 and arguments[0] == "--check":
        problems = Check(Path(arguments[1])).all()
        for problem in problems:
            print(f"bench check: {problem}", file=sys.stderr)
        if problems:
            sys.exit(1)
        print(f"bench check: every result in {arguments[1]} is well formed, 0 errors for this scheduler")
    elif len(arguments) == 2 and arguments[0] == "--p7":
        print("\n".join(p7_table(lines(Path(arguments[1])))))
    elif len(arguments) == 1:
        print(table(Path(arguments[0])))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
