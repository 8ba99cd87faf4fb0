"""Draws benchmark P5 from yadcc-loadgen's JSON lines: p99 latency and CPU
(scheduler and load generator) against cluster size, one series per
scheduler (the runs' `label`: this one, the original) and protocol. A size
seen twice in a series keeps its first run.

    python scripts/plot_p5.py p5.jsonl [p5-side-by-side.jsonl ...] p5.svg
"""

import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402


def series_name(run: dict) -> str:
    label = run.get("label", "this")
    scheduler = "original" if label == "original" else "this scheduler"
    return f"{scheduler}, {run['protocol']}"


def main(sources: list[str], target: str) -> None:
    runs = defaultdict(list)
    seen = set()
    for source in sources:
        with open(source, encoding="utf-8") as lines:
            for line in lines:
                line = line.strip()
                if not line:
                    continue
                run = json.loads(line)
                if run.get("bench") not in ("daemon-mix", "mix"):
                    continue
                series = series_name(run)
                if (series, run["machines"]) in seen:
                    continue
                seen.add((series, run["machines"]))
                runs[series].append(run)
    if not runs:
        sys.exit(f"{', '.join(sources)}: no daemon-mix runs")

    figure, (latency, cpu) = plt.subplots(1, 2, figsize=(11, 4.2))
    largest = 0
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (name, series) in enumerate(sorted(runs.items())):
        colour = palette[index % len(palette)]
        series.sort(key=lambda run: run["machines"])
        sizes = [run["machines"] for run in series]
        largest = max(largest, *sizes)
        latency.plot(sizes, [run["all"]["p99_ms"] for run in series], "o-", color=colour,
                     label=name)
        scheduler = [(run.get("scheduler") or {}).get("cpu_seconds_per_second") for run in series]
        loadgen = [(run.get("loadgen") or {}).get("cpu_seconds_per_second") for run in series]
        cpu.plot(sizes, scheduler, "o-", color=colour, label=f"scheduler: {name}")
        cpu.plot(sizes, loadgen, "x--", color=colour, alpha=0.5,
                 label=f"load generator, against {name}")
        for run in series:
            errors = run["all"]["errors"]
            if errors:
                latency.annotate(f"{errors} errors", (run["machines"], run["all"]["p99_ms"]),
                                 fontsize=8, color="red")

    latency.axhline(20, color="grey", linestyle=":", label="goal: p99 < 20 ms")
    latency.set_xlabel("machines (each servant and delegate)")
    latency.set_ylabel("p99 over all calls (ms)")
    latency.set_title("P5 latency")
    # From well under a millisecond to seconds where a scheduler saturates.
    latency.set_yscale("log")
    latency.legend()

    cpu.plot([0, largest], [0, 0.1 * largest / 1000], color="grey", linestyle=":",
             label="goal: 0.10 per 1,000 machines")
    cpu.set_xlabel("machines (each servant and delegate)")
    cpu.set_ylabel("CPU-seconds per second")
    cpu.set_title("P5 CPU")
    cpu.set_ylim(bottom=0)
    cpu.legend(fontsize=8)

    figure.tight_layout()
    figure.savefig(target)
    print(f"wrote {target}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1:-1], sys.argv[-1])
