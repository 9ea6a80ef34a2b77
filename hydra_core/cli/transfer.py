"""``transfer``: does a circuit searched on one OOD set separate the others? The transfer matrix
(:mod:`hydra_core.analysis.transfer`), and the shortcut check every search runs first
(:mod:`hydra_core.analysis.shortcut`)."""

from __future__ import annotations

import argparse
import json
import sys
import time

import hydra_core.cli.options as options
from hydra_core import distributed
from hydra_core.cli.common import (
    add_data_arguments,
    add_model_arguments,
    add_output_arguments,
    claim_output,
    command,
    load_for_cli,
    result_options,
    shows_progress,
    warn,
    write_csv,
    write_json,
    write_output,
)
from hydra_core.errors import InputError


def shortcut_summary(loaded, benchmark, cache, args, *, in_matrix: bool = False) -> dict:
    """The shortcut check of ``benchmark``'s search sets (rank 0 prints one warning line per
    set that warns; ``in_matrix``: the transfer command's, which is the check the line points
    to): ``{SET: {"auroc", "lo", "hi", "dense_auroc", "warns"}}``."""
    from hydra_core.analysis.shortcut import CHECK, CHECK_IN_MATRIX, benchmark_shortcuts

    checks = benchmark_shortcuts(
        loaded, benchmark, cache=cache, device=args.device, batch_size=args.batch_size
    )
    if distributed.is_main():
        for check in checks.values():
            if check.warns:
                warn(check.warning(CHECK_IN_MATRIX if in_matrix else CHECK))
    return {name: check.to_dict() for name, check in checks.items()}


def _transfer_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    add_data_arguments(p, n_search=512, n_report=None)
    add_output_arguments(p, "results/transfer")
    p.add_argument(
        "--objective",
        default="ood",
        choices=("ood", "avg"),
        help="each row's search: ood (CircOOD, MSP AUROC) or avg (CircAvg, the mean of ID "
        "accuracy and AUROC) (default: %(default)s)",
    )
    p.add_argument(
        "--budget",
        type=options.positive_int,
        default=24,
        help="heads each search removes (default: %(default)s, as search)",
    )
    options.add_search_method_argument(p)
    options.add_candidates_argument(p)
    p.add_argument(
        "--json",
        action="store_true",
        help='print {"cells": [{"searched_on", "reported_on", "group", "delta_auroc", "lo", '
        '"hi"}], "summary": {SET: {"near"|"far": {"delta_auroc", "lo", "hi", "n_sets"}}}} on '
        "stdout (AUROC changes as fractions); everything else goes to stderr",
    )


@command("transfer", _transfer_arguments)
def _transfer(args: argparse.Namespace) -> int:
    """Transfer matrix: a circuit searched on each OOD set alone, its AUROC change vs dense on
    every set (held-out items), with paired 95% intervals and near/far averages per row.

    Every OOD set (search and report sets alike, and your own folders or files) is cut once into
    a search part and a held-out part; row S searches (CircOOD; --objective avg: CircAvg) on the
    ID search part and S's search part, and is measured on the ID report part and every set's
    held-out part. Searches are cached and resume; under torchrun the processes share each
    step's candidates and rank 0 writes."""
    from pathlib import Path

    from tqdm import tqdm

    from hydra_core.analysis.transfer import plot_transfer, transfer_matrix
    from hydra_core.cache import DiskCache
    from hydra_core.evaluate import resolve_device
    from hydra_core.models.adapter import head_layout
    from hydra_core.outputs import data_identity

    started = time.perf_counter()
    loaded, benchmark = load_for_cli(args, every_set=True)
    total = head_layout(loaded.model).total_heads
    if not 1 <= args.budget < total:
        raise InputError(
            f"--budget must be between 1 and {total - 1}: the model has {total} heads and a "
            f"circuit keeps at least one; got {args.budget}"
        )
    if len(benchmark.ood_report) < 2:
        raise InputError(
            "a transfer matrix needs at least two OOD sets: name more with --ood / --search-ood"
        )
    device = resolve_device(args.device)
    loaded.model.to(device)
    cache = DiskCache()
    out = Path(args.out or "results/transfer")
    if distributed.is_main():
        # one matrix per objective in a folder (transfer_<objective>*), each with its options
        changes = {k: v for k, v in result_options(args).items() if k != "--objective"}
        run = (f"transfer_{args.objective}", changes)
        claim_output(args, out, loaded, data_identity(benchmark, "all"), run)
        sizes = ", ".join(
            f"{s.name} {len(s)} + {len(r)}"
            for s, r in zip(benchmark.ood_search, benchmark.ood_report, strict=True)
        )
        print(
            f"{loaded.name} on {device}: {len(benchmark.id_search)} ID search + "
            f"{len(benchmark.id_report)} ID report items; OOD search + held-out: {sizes}",
            file=sys.stderr,
        )
    shortcut = shortcut_summary(loaded, benchmark, cache, args, in_matrix=True)
    bars: dict = {}

    def progress(name: str, done: int, budget: int) -> None:
        if name not in bars:
            bars[name] = tqdm(
                total=budget, desc=f"searched on {name}", disable=not shows_progress()
            )
        bars[name].n = done
        bars[name].refresh()
        if done == budget and not shows_progress() and distributed.is_main():
            print(f"searched on {name}: {budget} heads removed", file=sys.stderr, flush=True)

    result = transfer_matrix(
        loaded,
        benchmark,
        objective=args.objective,
        budget=args.budget,
        batch_size=args.batch_size,
        method=args.method,
        candidates=args.candidates,
        device=device,
        cache=cache,
        progress=progress,
    )
    for bar in bars.values():
        bar.close()
    if not distributed.is_main():
        return 0
    stem = f"transfer_{args.objective}"
    write_csv(out / f"{stem}.csv", result.cells, index=False)
    write_csv(out / f"{stem}_summary.csv", result.summary_frame(), index=False)
    figure = plot_transfer(result)
    write_output(out / f"{stem}.png", lambda tmp: figure.savefig(tmp, dpi=120, format="png"))
    found = {
        **result.to_json(),
        "objective": args.objective,
        "budget": args.budget,
        "candidates": result.candidates,  # the guided search's K; None: exact
        "sets": {name: result.groups[name] for name in result.sets},
        "removed": result.removed,
        "shortcut": shortcut,
        "n_search": {"id": len(benchmark.id_search)}
        | {s.name: len(s) for s in benchmark.ood_search},
        "n_report": {"id": len(benchmark.id_report)}
        | {s.name: len(s) for s in benchmark.ood_report},
        "search_seconds": result.seconds,
        "seconds": time.perf_counter() - started,
        "model": loaded.identity(),
        "data": data_identity(benchmark, "all"),
    }
    write_json(out / f"{stem}.json", found)
    summary = sys.stderr if args.json else sys.stdout
    print(_summary_text(result), file=summary)
    print(f"wrote {out}/{stem}.csv, {stem}_summary.csv, {stem}.png, {stem}.json", file=summary)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    return 0


def _summary_text(result) -> str:
    """Per searched-on set: its own held-out cell and the near / far averages, in points."""
    lines = ["searched on -> AUROC change vs dense (points, 95% interval)"]
    cells = result.cells.set_index(["searched_on", "reported_on"])
    for name in result.sets:
        own = cells.loc[(name, name)]
        parts = [f"own held-out {own.delta_auroc * 100:+.2f} [{own.lo * 100:+.2f}, "
                 f"{own.hi * 100:+.2f}]"]  # fmt: skip
        for group in ("near", "far"):
            found = result.summary[name].get(group)
            if found is not None:
                parts.append(
                    f"{group} {found['delta_auroc'] * 100:+.2f} [{found['lo'] * 100:+.2f}, "
                    f"{found['hi'] * 100:+.2f}]"
                )
        lines.append(f"  {name} ({result.groups[name]}): " + "; ".join(parts))
    return "\n".join(lines)
