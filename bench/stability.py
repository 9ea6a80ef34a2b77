"""Stability of a greedy search: B resamples sharing work against B independent searches.

    python bench/stability.py                    # default model, 512 + 512 search images,
                                                 # budget 24, CircAvg, B = 10, all 10 verified
    python bench/stability.py --verify 3         # check only the first 3 resamples' paths
    python bench/stability.py --quick            # 128 + 128 images, budget 8, B = 4
    python bench/stability.py --model minilm-sentiment --n 256 --budget 12 --resamples 5

In this process: one search on the search data (the reference cost), then
:func:`~hydra_core.analysis.stability.greedy_stability` with B resamples, then an independent
``greedy_circuit`` on each of the first ``--verify`` resamples written out sample by sample, whose
removal order must equal the stability run's path (exit code 1 otherwise). Prints the seconds, the
ratio stability / one search, the ratio against the independent searches (per resample, scaled to
B), the group steps made against B x budget, the work ratio (the candidate x item evaluations the
run makes over one search's: the floor of the time ratio that the paths' parting sets), and the
machine's load average beside each timing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hydra_core.analysis.greedy import greedy_circuit  # noqa: E402
from hydra_core.analysis.stability import Resamples, greedy_stability  # noqa: E402


def loadavg() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return math.nan


def timed(label: str, work):
    load = loadavg()
    start = time.perf_counter()
    value = work()
    seconds = time.perf_counter() - start
    print(f"{label}: {seconds:.1f} s (load {load:.1f} -> {loadavg():.1f})", flush=True)
    return value, seconds


def work_ratio(found, draws: Resamples, n_id: int, n_ood: int, total_heads: int) -> float:
    """The candidate x item evaluations the stability run makes, as a multiple of one search's
    on all the items: at each step every group of resamples that removed the same heads scores
    each head still in on the union of its resamples' items (the shared work's floor, set by how
    early the paths part, whatever the implementation's overheads)."""
    id_counts, ood_counts = draws.counts(n_id, n_ood)
    work, groups_seen = 0, 0
    for t in range(found.steps):
        groups: dict[frozenset, list[int]] = {}
        for b, order in enumerate(found.orders):
            groups.setdefault(frozenset(order[:t]), []).append(b)
        for members in groups.values():
            drawn = (id_counts[members].sum(0) > 0).sum() + (ood_counts[members].sum(0) > 0).sum()
            work += (total_heads - t) * int(drawn)
        groups_seen += len(groups)
    if groups_seen != found.group_steps:  # the run grouped otherwise: the floor would be wrong
        raise RuntimeError(f"{groups_seen} groups here, {found.group_steps} in the run")
    return work / (sum(total_heads - t for t in range(found.steps)) * (n_id + n_ood))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--n", type=int, default=512, help="ID search samples (and OOD, pooled)")
    p.add_argument("--budget", type=int, default=24)
    p.add_argument("--resamples", type=int, default=10)
    p.add_argument("--objective", default="avg", choices=("acc", "ood", "avg"))
    p.add_argument("--verify", type=int, default=None, help="independent searches (default: B)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--quick", action="store_true", help="--n 128 --budget 8 --resamples 4")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the figures here")
    args = p.parse_args()
    if args.quick:
        args.n, args.budget, args.resamples = 128, 8, 4
    if args.threads:
        torch.set_num_threads(args.threads)
    verify = args.resamples if args.verify is None else min(args.verify, args.resamples)

    from hydra_core.analysis.inputs import search_inputs
    from hydra_core.zoo.registry import load_model

    loaded = load_model(args.model)
    benchmark = loaded.modality.benchmark(n_search=args.n)
    inputs = search_inputs(loaded.preprocess, benchmark, n_ood=args.n)
    data = (loaded.model, inputs.id_x, inputs.id_y, inputs.ood_x)
    strata = inputs.ood_strata()
    print(
        f"{loaded.name}: {inputs.describe()}; {args.objective}, budget {args.budget}, "
        f"B = {args.resamples}, {torch.get_num_threads()} threads",
        flush=True,
    )
    search = dict(objective=args.objective, budget=args.budget)
    _, one = timed("one search", lambda: greedy_circuit(*data, **search))
    found, shared = timed(
        f"stability, B = {args.resamples}",
        lambda: greedy_stability(*data, **search, resamples=args.resamples, ood_strata=strata),
    )
    draws = Resamples.draw(inputs.id_y, strata, args.resamples, found.seed)
    total_heads = sum(found.num_heads)
    same, independent = 0, 0.0
    for b in range(verify):
        alone, seconds = timed(
            f"independent search on resample {b}",
            lambda b=b: greedy_circuit(loaded.model, *draws.inputs(b, *data[1:]), **search),
        )
        independent += seconds
        same += alone.order == found.orders[b]
        if alone.order != found.orders[b]:
            print(f"  resample {b}: paths differ: {alone.labels()} vs {found.orders[b]}")
    figures = {
        "model": loaded.name,
        "n_id": len(inputs.id_x),
        "n_ood": len(inputs.ood_x),
        "objective": args.objective,
        "budget": args.budget,
        "resamples": args.resamples,
        "threads": torch.get_num_threads(),
        "one_search_s": one,
        "stability_s": shared,
        "ratio_to_one_search": shared / one,
        "group_steps": found.group_steps,
        "independent_steps": args.resamples * args.budget,
        "groups_per_step": found.step_groups,
        "work_ratio": work_ratio(found, draws, len(inputs.id_x), len(inputs.ood_x), total_heads),
        "jaccard": found.jaccard(),
        "verified": verify,
        "identical_paths": same,
    }
    if verify:
        figures["independent_s_scaled_to_B"] = independent / verify * args.resamples
        figures["speedup_vs_independent"] = figures["independent_s_scaled_to_B"] / shared
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if same == verify else 1


if __name__ == "__main__":
    sys.exit(main())
