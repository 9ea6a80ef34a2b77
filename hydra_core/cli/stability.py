"""The search command's trust checks: ``--holdout`` (where the search starts fitting its sample)
and ``--stability`` (how often each head comes out again on bootstrap resamples).

``--holdout F`` holds out a fraction F of the search split (every ID class and every OOD search set
within itself; never a report set), searches on the rest and scores the circuit after every step
on the held-out part; ``--stability B`` repeats the search on B resamples of the part it searched
on. Both write their files next to the search's and add their summaries to ``--json``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import torch

import hydra_core.cli.options as options
from hydra_core import distributed
from hydra_core.cli.common import (
    read_result_file,
    shows_progress,
    warn,
    write_csv,
    write_json,
)
from hydra_core.errors import InputError
from hydra_core.models.family import head_label

if TYPE_CHECKING:
    from hydra_core.analysis.holdout import HeldOutCurve
    from hydra_core.analysis.stability import StabilityResult


def add_stability_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--holdout",
        type=options.open_unit,
        default=None,
        metavar="FRACTION",
        help="hold out this fraction of the search split (within every class and OOD set), never "
        "used to choose a head, and score the circuit on it after every step: the step where it "
        "peaks is the suggested budget (writes holdout_<objective>.csv)",
    )
    p.add_argument(
        "--stability",
        type=options.at_least(2),
        default=None,
        metavar="B",
        help="repeat the search on B bootstrap resamples of its search data (ID within class, "
        "each OOD set within itself): every head's selection frequency, each step's agreement "
        "and the mean pairwise Jaccard (writes stability_<objective>.json and _heads.csv)",
    )
    p.add_argument(
        "--seed",
        type=options.seed,
        default=0,
        help="draws the held-out part and the resamples (default: %(default)s)",
    )


@dataclass(frozen=True)
class SearchData:
    """The data a search chooses heads on, the held-out part when there is one."""

    id_x: torch.Tensor
    id_y: torch.Tensor
    ood_x: torch.Tensor
    ood_strata: tuple[str, ...]
    held_out: tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[str, ...]] | None = None


def search_data(args: argparse.Namespace, inputs) -> SearchData:
    """The search inputs, cut into search and held-out parts under ``--holdout``."""
    aggregate = getattr(args, "ood_aggregate", "pooled")
    if aggregate != "pooled" and (args.holdout is not None or args.stability):
        raise InputError(
            f"--holdout and --stability score the pooled AUROC, not --ood-aggregate {aggregate}: "
            "leave them out, or search with --ood-aggregate pooled"
        )
    strata = inputs.ood_strata()
    if args.holdout is None:
        return SearchData(inputs.id_x, inputs.id_y, inputs.ood_x, strata)
    from hydra_core.analysis.holdout import holdout_split

    split = holdout_split(inputs.id_y, strata, args.holdout, seed=args.seed)

    def part(id_rows, ood_rows):
        return (
            inputs.id_x[id_rows.to(inputs.id_x.device)],
            inputs.id_y[id_rows.to(inputs.id_y.device)],
            inputs.ood_x[ood_rows.to(inputs.ood_x.device)],
            tuple(strata[i] for i in ood_rows.tolist()),
        )

    return SearchData(
        *part(split.id_search, split.ood_search),
        held_out=part(split.id_held_out, split.ood_held_out),
    )


def warn_few_samples(data: SearchData) -> None:
    from hydra_core.analysis.holdout import FEW_SAMPLES

    n = min(len(data.id_x), len(data.ood_x))
    if n < FEW_SAMPLES:
        warn(
            f"the search chooses heads on {len(data.id_x)} ID and {len(data.ood_x)} OOD samples "
            f"(fewer than {FEW_SAMPLES} per side): its gains may not transfer to other samples; "
            "check them with --holdout and --stability, or use more (--n-search)"
        )


def write_holdout(model, result, data: SearchData, out: Path, log) -> HeldOutCurve:
    """Score the search on the held-out part; write ``holdout_<objective>.csv/.json``."""
    from hydra_core.analysis.holdout import held_out_curve

    id_x, id_y, ood_x, strata = data.held_out
    curve = held_out_curve(model, result, id_x, id_y, ood_x, ood_strata=strata)
    stem = result.objective
    write_csv(out / f"holdout_{stem}.csv", curve.frame(), index=False)
    write_json(out / f"holdout_{stem}.json", curve.to_dict())
    peak = curve.peak
    where = "before any removal" if peak == 0 else f"after {peak} removal{'s' * (peak != 1)}"
    print(
        f"held out ({curve.n_id} ID + {curve.n_ood} OOD): {result.objective} "
        f"{curve.held_out[0]:.4f} dense, {curve.held_out[-1]:.4f} after {result.steps}; it "
        f"peaks {where} ({curve.held_out[peak]:.4f} [{curve.held_out_lo[peak]:.4f}, "
        f"{curve.held_out_hi[peak]:.4f}])",
        file=log,
    )
    suggested = curve.suggested_budget(result.steps)
    if suggested is not None:
        gain = f"[{curve.peak_gain_lo[result.steps]:+.4f}, {curve.peak_gain_hi[result.steps]:+.4f}]"
        print(
            f"the budget ({result.steps}) goes past the held-out peak, which beats it beyond the "
            f"interval (peak minus budget {gain}): suggested --budget {suggested}",
            file=log,
        )
    elif curve.beyond_peak(result.steps):
        print(
            f"the held-out peak is within the interval of the budget's ({result.steps}) "
            "objective: no smaller budget is suggested",
            file=log,
        )
    return curve


def run_stability(args, model, data: SearchData, result, cache, out: Path, identity: dict, log):
    """``--stability B``: the resampled searches; write ``stability_<objective>.json`` and
    ``stability_<objective>_heads.csv``."""
    from tqdm import tqdm

    from hydra_core.analysis.holdout import jaccard_words
    from hydra_core.analysis.stability import greedy_stability

    bar = tqdm(
        total=args.stability * args.budget,
        desc=f"stability x{args.stability}",
        unit="step",
        disable=not shows_progress() or not distributed.is_main(),
    )

    def progress(p) -> None:
        bar.n = p.done
        bar.set_postfix(groups=p.group_steps)
        bar.refresh()

    found = greedy_stability(
        model,
        data.id_x,
        data.id_y,
        data.ood_x,
        objective=args.objective,
        budget=args.budget,
        resamples=args.stability,
        seed=args.seed,
        ood_strata=data.ood_strata,
        batch_size=args.batch_size,
        method=args.method,
        cache=cache,
        progress=progress,
    )
    bar.close()
    if not distributed.is_main():
        return found
    stem = args.objective
    ranking = [[layer, head] for layer, head in result.ranking()]  # ties of the frequencies
    write_json(
        out / f"stability_{stem}.json", {**found.to_dict(), "search_ranking": ranking, **identity}
    )
    write_csv(out / f"stability_{stem}_heads.csv", heads_frame(found, result), index=False)
    removed = result.order[: args.budget]
    freq = found.frequency()
    share = sum(float(freq[h]) for h in removed) / max(len(removed), 1)
    agreement = jaccard_words(found.jaccard(), sum(found.num_heads), found.steps)
    print(
        f"stability over {found.resamples} resamples: {agreement}; the search's removals come "
        f"out again in {share:.0%} of resamples on average; first step agreed by "
        f"{found.agreement()[0][1]:.0%} "
        f"({found.group_steps} group steps for {found.resamples * found.steps} resample steps)",
        file=log,
    )
    return found


def heads_frame(found: StabilityResult, result) -> pd.DataFrame:
    """One row per head: the share of resamples that removed it (``removal_frequency``) and that
    kept it (``keep_frequency``, higher = more important, the convention of every ranking), the
    step the search removed it at, and whether it is stably removed or kept
    (:data:`STABLE_SHARE`), most often removed first."""
    from hydra_core.analysis.stability import STABLE_SHARE

    freq = found.frequency()
    step = {h: t + 1 for t, h in enumerate(result.order)}
    rows = []
    for layer, count in enumerate(found.num_heads):
        for h in range(count):
            f = float(freq[layer, h])
            rows.append(
                {
                    "head": head_label(layer, h),
                    "layer": layer,
                    "head_index": h,
                    "removal_frequency": f,
                    "keep_frequency": 1.0 - f,
                    "search_step": step.get((layer, h)),
                    "stable": "removed"
                    if f >= STABLE_SHARE - 1e-12
                    else "kept"
                    if f <= 1 - STABLE_SHARE + 1e-12
                    else "",
                }
            )
    frame = pd.DataFrame(rows)
    frame["search_step"] = frame["search_step"].astype("Int64")
    return frame.sort_values(
        ["removal_frequency", "layer", "head_index"], ascending=[False, True, True]
    )


def json_summary(curve: HeldOutCurve | None, found: StabilityResult | None, result) -> dict:
    """What ``--json`` adds for the held-out curve and the stability run."""
    from hydra_core.analysis.holdout import chance_jaccard

    extra = {}
    if curve is not None:
        extra["holdout"] = {
            **curve.to_dict(),
            "suggested_budget": curve.suggested_budget(result.steps),
            "beyond_peak": curve.beyond_peak(result.steps),
            "peak_beats_budget": curve.peak_beats(result.steps),
        }
    if found is not None:
        freq = found.frequency()
        extra["stability"] = {
            **found.summary(),
            "jaccard_chance": chance_jaccard(sum(found.num_heads), found.steps),
            "search_removals_frequency": {head_label(*h): float(freq[h]) for h in result.order},
            "jaccard_curve": found.jaccard_curve(),
            "agreement": [[head_label(*h), share] for h, share in found.agreement()],
        }
    return extra


def log_stream(args) -> object:
    return sys.stderr if args.json else sys.stdout


def read_stability_result(
    path: str, loaded, option: str = "--stability", data: dict | None = None
) -> tuple[StabilityResult, list, dict | None]:
    """A stability result (``search --stability`` wrote it) of the loaded model, the ranking of
    its search (for ties) and the data it was computed on (its ``data`` entry, None in an older
    file); another model's file (or, given ``data``, one of other search data) is refused, an
    unreadable one named."""

    from hydra_core.analysis.stability import StabilityResult
    from hydra_core.models.adapter import head_layout

    hint = "give the stability_<objective>.json that search --stability wrote"

    def parse(data: dict) -> tuple[StabilityResult, list]:
        try:
            ranking = [(int(la), int(h)) for la, h in data.get("search_ranking", [])]
        except (TypeError, ValueError):
            raise ValueError("malformed search_ranking: expected [layer, head] pairs") from None
        return StabilityResult.from_dict(data), ranking, data.get("data")

    found, ranking, made_on = read_result_file(
        path, loaded, option, "a stability result", hint, parse, data=data
    )
    layout = head_layout(loaded.model)
    if found.num_heads != layout.num_heads:
        raise InputError(
            f"{option} {path} is for heads per layer {list(found.num_heads)}, the model has "
            f"{list(layout.num_heads)}: give a stability result of this model"
        )
    return found, ranking, made_on
