"""Compare two report.json files number by number: the check that a refactoring left a report's
results unchanged. Timings, dates, commands and machine facts are not results and are skipped.

    python scripts/compare_reports.py OLD/report.json NEW/report.json [--tolerance 0]

Prints every difference (path, old, new) and exits 1 when there is one, 0 when every table, every
system and every other setup entry is equal (within the tolerance for numbers)."""

from __future__ import annotations

import argparse
import json
import math
import sys

#: setup entries that describe the run, not its results
SKIPPED = {"created", "command", "seconds", "total_seconds", "machine", "platform", "torch"}


def differences(
    old, new, path: str = "", tolerance: float = 0.0
) -> list[tuple[str, object, object]]:
    """Every (path, old, new) where the two JSON values differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for key in sorted(set(old) | set(new), key=str):
            if key in SKIPPED and path.startswith("setup"):
                continue
            where = f"{path}.{key}" if path else str(key)
            if key not in old or key not in new:
                found.append((where, old.get(key, "<missing>"), new.get(key, "<missing>")))
            else:
                found += differences(old[key], new[key], where, tolerance)
        return found
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [(f"{path} (length)", len(old), len(new))]
        return [
            d
            for i, (a, b) in enumerate(zip(old, new))
            for d in differences(a, b, f"{path}[{i}]", tolerance)
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
    args = parser.parse_args(argv)
    with open(args.old) as f:
        old = json.load(f)
    with open(args.new) as f:
        new = json.load(f)
    found = differences(old, new, tolerance=args.tolerance)
    for where, a, b in found:
        print(f"{where}: {a!r} -> {b!r}")
    print(f"{len(found)} difference(s) between {args.old} and {args.new}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
