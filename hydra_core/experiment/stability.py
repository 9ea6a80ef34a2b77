"""The stability of a report's circuits: how often each circuit's removals come out again on
bootstrap resamples of its search data, and whether its budget goes past the step where the
objective peaks on held-out search data.

The held-out sample is made of items of the search-role sets (the ID search part and every OOD
search set) that the search did not use: never a report set, and never an item that chose a head
(checked item by item, :func:`~hydra_core.data.provenance.item_keys`). The circuits are the
report's own searches; the curve costs one forward of the held-out sample per step, the resamples
share their work (:mod:`hydra_core.analysis.stability`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd
import torch

from hydra_core.analysis.greedy import GreedyResult
from hydra_core.analysis.holdout import chance_jaccard, held_out_curve
from hydra_core.analysis.stability import STABLE_SHARE, greedy_stability
from hydra_core.data.benchmark import Benchmark
from hydra_core.data.images import take
from hydra_core.data.provenance import item_keys, row_keys
from hydra_core.errors import InputError
from hydra_core.hydra.members import CIRCUIT_NAMES

#: columns of ``stability.csv``, in order
COLUMNS = (
    "circuit",
    "budget",
    "resamples",
    "jaccard",
    "jaccard_chance",
    "removed_frequency_mean",
    "removed_frequency_min",
    "stably_removed",
    "first_step_agreement",
    "held_out_dense",
    "held_out_at_budget",
    "held_out_at_budget_lo",
    "held_out_at_budget_hi",
    "held_out_peak",
    "held_out_at_peak",
    "held_out_at_peak_lo",
    "held_out_at_peak_hi",
    "beyond_peak",
    "peak_beats_budget",
    "held_out_n_id",
    "held_out_n_ood",
    "group_steps",
    "independent_steps",
)


def _unused(full, used, n: int | None):
    """The items of ``full`` that are not in ``used`` (by content), at most ``n`` of them (a fixed
    :func:`take` sample); None when none is left."""
    seen = item_keys(used.inputs)
    rows = [i for i, key in enumerate(row_keys(full.inputs)) if key not in seen]
    if not rows:
        return None
    return take(full.subset(torch.tensor(rows)), n, purpose="held-out")


def held_out_sample(preprocess, full: Benchmark, used: Benchmark, inputs, n: int | None):
    """(id_x, id_y, ood_x, ood_strata) of search-role items the search did not use: the ID search
    part of ``full`` (the same sets, uncapped) less ``used``'s and every OOD search set less the
    items any search input holds, at most ``n`` per set. Refused in one line when a set has none
    left."""
    id_part = _unused(full.id_search, used.id_search, n)
    if id_part is None:
        raise InputError(
            f"no ID search item is left for a held-out sample: the search used all of "
            f"{full.id_search.name}'s search part; lower n_search"
        )
    ood_x, strata = [], []
    for whole, part in zip(full.ood_search, used.ood_search, strict=True):
        rest = _unused(whole, part, n)
        if rest is None:
            continue  # this set is wholly in the search; the others hold out
        ood_x.append(preprocess(rest.inputs))
        strata += [whole.name] * len(rest)
    if not ood_x:
        raise InputError(
            "no OOD search item is left for a held-out sample: the search used all of "
            f"{', '.join(full.search_names())}; lower n_search"
        )
    device = inputs.id_x.device
    return (
        preprocess(id_part.inputs).to(device),
        id_part.labels.to(device),
        torch.cat(ood_x).to(device),
        tuple(strata),
    )


def search_stability(
    model,
    objective: str,
    budget: int,
    inputs,
    *,
    resamples: int,
    cache=None,
    progress=None,
    seed: int = 0,
):
    """The stability run of the report's circuit of ``objective`` (a
    :class:`~hydra_core.analysis.stability.StabilityResult`): its search, ``budget`` steps, on
    ``resamples`` bootstrap resamples of ``inputs`` (saved in and resumed from ``cache``: the
    pieces a process computes under ``torchrun`` are what :func:`circuit_stability` reads)."""
    on_step = None
    if progress is not None:
        name, total = CIRCUIT_NAMES[objective], resamples * budget
        on_step = lambda p: progress(f"stability {name}", p.done, total)  # noqa: E731
    return greedy_stability(
        model,
        inputs.id_x,
        inputs.id_y,
        inputs.ood_x,
        objective=objective,
        budget=budget,
        resamples=resamples,
        seed=seed,
        ood_strata=inputs.ood_strata(),
        cache=cache,
        progress=on_step,
    )


def circuit_stability(
    model,
    circuits: Mapping[str, GreedyResult],
    inputs,
    held_out,
    *,
    resamples: int,
    cache=None,
    progress=None,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per circuit (CircAvg, CircAcc, CircOOD): its stability over ``resamples``
    bootstrap resamples of ``inputs`` (the search inputs it was found on,
    :func:`search_stability`) and its curve on the ``held_out`` sample
    (:func:`held_out_sample`); columns :data:`COLUMNS`."""
    rows = []
    for objective, circuit in circuits.items():
        name = CIRCUIT_NAMES[objective]
        options = dict(resamples=resamples, cache=cache, progress=progress, seed=seed)
        found = search_stability(model, objective, circuit.steps, inputs, **options)
        freq = found.frequency()
        removed = [float(freq[h]) for h in circuit.order]
        id_x, id_y, ood_x, strata = held_out
        curve = held_out_curve(model, circuit, id_x, id_y, ood_x, ood_strata=strata, seed=seed)
        peak, end = curve.peak, circuit.steps
        rows.append(
            {
                "circuit": name,
                "budget": end,
                "resamples": resamples,
                "jaccard": found.jaccard(),
                "jaccard_chance": chance_jaccard(sum(found.num_heads), found.steps),
                "removed_frequency_mean": sum(removed) / len(removed) if removed else math.nan,
                "removed_frequency_min": min(removed, default=math.nan),
                "stably_removed": sum(f >= STABLE_SHARE - 1e-12 for f in removed),
                "first_step_agreement": found.agreement()[0][1] if found.steps else math.nan,
                "held_out_dense": curve.held_out[0],
                "held_out_at_budget": curve.held_out[end],
                "held_out_at_budget_lo": curve.held_out_lo[end],
                "held_out_at_budget_hi": curve.held_out_hi[end],
                "held_out_peak": peak,
                "held_out_at_peak": curve.held_out[peak],
                "held_out_at_peak_lo": curve.held_out_lo[peak],
                "held_out_at_peak_hi": curve.held_out_hi[peak],
                "beyond_peak": curve.beyond_peak(end),
                "peak_beats_budget": curve.peak_beats(end),
                "held_out_n_id": curve.n_id,
                "held_out_n_ood": curve.n_ood,
                "group_steps": found.group_steps,
                "independent_steps": found.resamples * found.steps,
            }
        )
    return pd.DataFrame(rows, columns=list(COLUMNS))
