#!/usr/bin/env python3
"""Reads an OpenMetrics exposition on stdin and parses it with the strict
OpenMetrics parser of the Prometheus Python client (`prometheus-client`,
pinned in scripts/python_deps.sh): `# EOF`, `_total` counters, `_info`
infos, histogram buckets, label and value syntax. promtool reads only the
classic text format, so this is the OpenMetrics answer's check. Prints each
family's name and sample count; exits 1 with the parser's message on the
first violation."""

import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families


def main() -> int:
    text = sys.stdin.read()
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as error:
        print(f"invalid OpenMetrics: {error}", file=sys.stderr)
        return 1
    for family in families:
        print(f"{family.name} {family.type} {len(family.samples)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
