"""Compare two report.json files number by number: the check that a refactoring left a report's
results unchanged. Timings (any entry named ``seconds`` or ``latency...``, e.g. a search's time or
Table 7's latencies), dates, commands and machine facts are not results and are skipped.

    python scripts/compare_reports.py OLD/report.json NEW/report.json [--tolerance 0] [--timings]

Prints every difference (path, old, new) and exits 1 when there is one, 0 when every table, every
system and every other setup entry is equal (within the tolerance for numbers)."""

from __future__ import annotations

import argparse
import json
import math
import sys

#: setup entries that describe the run, not its results
SKIPPED = {"created", "command", "machine", "platform", "torch"}


def is_timing(key: object) -> bool:
    """A measured time anywhere in the report: a stage's or a search's seconds, a latency."""
    return str(key) in ("seconds", "total_seconds") or str(key).startswith("latency")


def differences(
    old, new, path: str = "", tolerance: float = 0.0, timings: bool = False
) -> list[tuple[str, object, object]]:
    """Every (path, old, new) where the two JSON values differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for key in sorted(set(old) | set(new), key=str):
            if (key in SKIPPED and path.startswith("setup")) or (is_timing(key) and not timings):
                continue
            where = f"{path}.{key}" if path else str(key)
            if key not in old or key not in new:
                found.append((where, old.get(key, "<missing>"), new.get(key, "<missing>")))
            else:
                found += differences(old[key], new[key], where, tolerance, timings)
        return found
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [(f"{path} (length)", len(old), len(new))]
        return [
            d
            for i, (a, b) in enumerate(zip(old, new, strict=True))
            for d in differences(a, b, f"{path}[{i}]", tolerance, timings)
        ]
    numbers = (int, float)
    if isinstance(old, numbers) and isinstance(new, numbers) and not isinstance(old, bool):
        same = old == new or (math.isnan(old) and math.isnan(new)) or abs(old - new) <= tolerance
        return [] if same else [(path, old, new)]
    return [] if old == new else [(path, old, new)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--tolerance", type=float, default=0.0, help="absolute, for numbers")
    parser.add_argument("--timings", action="store_true", help="compare timings too")
    args = parser.parse_args(argv)
    with open(args.old) as f:
        old = json.load(f)
    with open(args.new) as f:
        new = json.load(f)
    found = differences(old, new, tolerance=args.tolerance, timings=args.timings)
    for where, a, b in found:
        print(f"{where}: {a!r} -> {b!r}")
    print(f"{len(found)} difference(s) between {args.old} and {args.new}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
