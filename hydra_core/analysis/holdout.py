"""Where a greedy search starts fitting its sample: the objective on a held-out part, step by step.

The search split is cut in two, stratified (ID within class, each OOD set within itself): the
search part chooses the heads, the held-out part never does, and no report set is either. After
every step the circuit so far is scored on the held-out part (one forward of it per step, by the
fast path's evaluator removing the heads in the search's order). Every held-out value carries a
95% interval over resamples of the held-out items (the project's stratified bootstrap, scored in
integers by :class:`~hydra_core.analysis._maps.WeightedScorer`), and so does the paired gain of the
peak over every step (``peak_gain_lo``/``_hi``: the same resamples for both steps).

The suggestion rule (:meth:`HeldOutCurve.suggested_budget`): a smaller budget, the peak, is
suggested only where the held-out objective at the peak is better than at the budget beyond the
interval, i.e. the paired 95% interval of (peak - budget) lies above 0. A peak inside the noise of
the held-out part (e.g. a curve whose band spans 0.70-0.85) suggests nothing: the budget stands.

:func:`chance_jaccard` gives the mean Jaccard index of two random sets of k of n heads, the
baseline beside which the stability resamples' mean pairwise Jaccard reads
(:func:`jaccard_words`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from math import comb

import numpy as np
import torch
from torch import nn

from hydra_core.analysis._maps import Scorer, WeightedScorer, objective_of
from hydra_core.analysis._towers import fast_evaluator
from hydra_core.analysis.greedy import GreedyResult, _check_inputs, _device_and_dtype
from hydra_core.data.images import stable_permutation
from hydra_core.errors import InputError
from hydra_core.metrics.bootstrap import LEVEL, percentile_interval, stratified_counts
from hydra_core.models.adapter import head_label, model_and_inputs

#: samples per side below which a search's gains are unlikely to transfer (the app and CLI say so)
FEW_SAMPLES = 300


@dataclass(frozen=True)
class HoldoutSplit:
    """Positions of the search part and the held-out part, for the ID rows and the OOD rows."""

    id_search: torch.Tensor
    id_held_out: torch.Tensor
    ood_search: torch.Tensor
    ood_held_out: torch.Tensor
    fraction: float


def _cut(strata: Sequence, fraction: float, name: str, seed: int) -> tuple[list[int], list[int]]:
    """Per stratum, a fixed shuffle of its positions cut at ``round(fraction * size)``, at least
    one on each side; a stratum of one item stays in the search part. Refused in one line when
    nothing can be held out."""
    groups: dict = {}
    for i, s in enumerate(strata):
        groups.setdefault(s, []).append(i)
    search, held = [], []
    for stratum, members in sorted(groups.items(), key=lambda kv: str(kv[0])):
        if len(members) < 2:
            search += members
            continue
        order = stable_permutation(len(members), "holdout", name, str(stratum), seed).tolist()
        k = min(max(round(fraction * len(members)), 1), len(members) - 1)
        held += [members[i] for i in order[:k]]
        search += [members[i] for i in order[k:]]
    if len(held) < 2:
        raise InputError(
            f"the held-out part would hold {len(held)} {name} sample(s), and a score needs at "
            f"least 2 (only classes or sets with 2 or more {name} samples give some): use more "
            "search samples or a larger held-out share, or no held-out part"
        )
    return sorted(search), sorted(held)


def holdout_split(
    id_y: torch.Tensor, ood_strata: Sequence[str], fraction: float, seed: int = 0
) -> HoldoutSplit:
    """Hold out ``fraction`` of every ID class and of every OOD set (fixed given ``seed``)."""
    if isinstance(fraction, bool) or not isinstance(fraction, float | int) or not 0 < fraction < 1:
        raise InputError(
            f"the held-out fraction must lie strictly between 0 and 1, got {fraction!r}"
        )
    id_search, id_held = _cut(id_y.cpu().tolist(), fraction, "ID", seed)
    ood_search, ood_held = _cut(list(ood_strata), fraction, "OOD", seed)
    as_tensor = lambda rows: torch.tensor(rows, dtype=torch.long)  # noqa: E731
    return HoldoutSplit(
        as_tensor(id_search),
        as_tensor(id_held),
        as_tensor(ood_search),
        as_tensor(ood_held),
        float(fraction),
    )


@dataclass
class HeldOutCurve:
    """A search's objective after 0, 1, ..., steps removals, on its search part and on the held-out
    part (``held_out_lo``/``_hi``: 95% interval over held-out resamples; ``peak_gain_lo``/``_hi``:
    the paired 95% interval of the held-out objective at the peak minus at each step, empty for a
    curve written before they existed)."""

    objective: str
    order: list
    search: list[float]
    held_out: list[float]
    held_out_lo: list[float]
    held_out_hi: list[float]
    held_out_accuracy: list[float]
    held_out_auroc: list[float]
    n_id: int
    n_ood: int
    peak_gain_lo: list[float] = field(default_factory=list)
    peak_gain_hi: list[float] = field(default_factory=list)

    @property
    def peak(self) -> int:
        """The number of removals with the highest held-out objective (the first such step)."""
        return int(np.argmax(self.held_out))

    def beyond_peak(self, budget: int) -> bool:
        """Whether ``budget`` removals go past the held-out peak (by its point value alone; see
        :meth:`peak_beats` for whether that is more than noise)."""
        return budget > self.peak

    def peak_beats(self, budget: int) -> bool:
        """Whether the held-out objective at the peak is better than after ``budget`` removals
        beyond the interval: the paired 95% interval of their difference lies above 0 (for a
        curve without it, the two steps' own intervals do not overlap)."""
        if budget <= self.peak:
            return False
        if len(self.peak_gain_lo) > budget:
            return bool(self.peak_gain_lo[budget] > 0)
        return bool(self.held_out_lo[self.peak] > self.held_out_hi[budget])

    def suggested_budget(self, budget: int) -> int | None:
        """The budget to suggest instead of ``budget`` (the peak, at least 1), or None where the
        peak does not beat ``budget`` beyond the interval (:meth:`peak_beats`)."""
        return max(self.peak, 1) if self.peak_beats(budget) else None

    #: the per-step columns: one value per number of removals, 0 .. steps
    COLUMNS = (
        "search",
        "held_out",
        "held_out_lo",
        "held_out_hi",
        "held_out_accuracy",
        "held_out_auroc",
        "peak_gain_lo",
        "peak_gain_hi",
    )

    def frame(self):
        """One row per number of removals: the head removed last and every per-step column."""
        import pandas as pd

        heads = [""] + [head_label(*h) for h in self.order]
        n = len(self.held_out)
        columns = {c: getattr(self, c) or [np.nan] * n for c in self.COLUMNS}
        return pd.DataFrame({"removed": range(len(self.held_out)), "head": heads, **columns})

    def to_dict(self) -> dict:
        return {
            "objective": self.objective,
            "order": [head_label(*h) for h in self.order],
            **{c: getattr(self, c) for c in self.COLUMNS},
            "n_id": self.n_id,
            "n_ood": self.n_ood,
            "peak": self.peak,
            "level": LEVEL,
        }


def held_out_curve(
    model: nn.Module,
    result: GreedyResult,
    id_x: torch.Tensor,
    id_y: torch.Tensor,
    ood_x: torch.Tensor,
    *,
    ood_strata: Sequence[str] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> HeldOutCurve:
    """Score ``result``'s circuit after every step on held-out data (never used by the search).

    Args:
        model: the searched model, in eval mode.
        result: a search on the search part of the same split.
        id_x, id_y, ood_x: the held-out part; ``ood_strata`` its OOD rows' sets (the bootstrap
            resamples each set within itself).
    """
    model, id_x, ood_x = model_and_inputs(model, id_x, ood_x, names=("id_x", "ood_x"))
    layout = _check_inputs(model, id_x, id_y, ood_x, batch_size=1)
    if layout.num_heads != result.num_heads:
        raise InputError(
            f"the search has heads per layer {list(result.num_heads)}, the model "
            f"{list(layout.num_heads)}: score a search of this model"
        )
    strata = ["ood"] * len(ood_x) if ood_strata is None else list(ood_strata)
    counts = stratified_counts(
        np.array([f"id:{int(y)}" for y in id_y.cpu().tolist()] + [f"ood:{s}" for s in strata]),
        n_boot=n_boot,
        seed=seed,
    ).astype(np.int64)
    n_id = len(id_x)
    weighted = WeightedScorer(
        id_y, torch.from_numpy(counts[:, :n_id]), torch.from_numpy(counts[:, n_id:])
    )
    plain = Scorer(id_y, n_id)
    device, dtype = _device_and_dtype(model)
    inputs = torch.cat([id_x, ood_x])
    inputs = inputs.to(device, dtype if inputs.is_floating_point() else None)
    values, lo, hi, accuracy, auroc, replicates = [], [], [], [], [], []
    with torch.inference_mode():
        evaluator = fast_evaluator(model, inputs, pairs_per_pass=None)
        logits = evaluator.logits
        for step in range(result.steps + 1):
            if step:
                logits = evaluator.remove(*result.order[step - 1])
            acc, roc = plain(logits[None])
            values.append(float(objective_of(result.objective, acc, roc)[0]))
            accuracy.append(float(acc[0]))
            auroc.append(float(roc[0]))
            replicates.append(objective_of(result.objective, *weighted(logits[None]))[0].numpy())
            low, high = percentile_interval(replicates[-1])
            lo.append(float(low))
            hi.append(float(high))
    peak = int(np.argmax(values))
    gain = [percentile_interval(replicates[peak] - r) for r in replicates]
    return HeldOutCurve(
        objective=result.objective,
        order=list(result.order),
        search=[result.base_score, *result.scores],
        held_out=values,
        held_out_lo=lo,
        held_out_hi=hi,
        held_out_accuracy=accuracy,
        held_out_auroc=auroc,
        n_id=n_id,
        n_ood=len(ood_x),
        peak_gain_lo=[float(g[0]) for g in gain],
        peak_gain_hi=[float(g[1]) for g in gain],
    )


def chance_jaccard(n: int, k: int) -> float:
    """The expected Jaccard index |A & B| / |A | B| of two independent, uniformly random sets of
    ``k`` of ``n`` heads, exactly: the overlap i is hypergeometric, P(i) = C(k, i) C(n - k, k - i)
    / C(n, k), and E[J] = sum_i P(i) i / (2k - i). 1 for k = n; NaN for k = 0 (both sets empty)."""
    if isinstance(n, bool) or isinstance(k, bool) or not 0 <= k <= n:
        raise ValueError(f"chance_jaccard needs 0 <= k <= n, got n={n!r}, k={k!r}")
    if k == 0:
        return float("nan")
    total = comb(n, k)
    return sum(comb(k, i) * comb(n - k, k - i) * i / (2 * k - i) for i in range(k + 1)) / total


def jaccard_words(observed: float, n: int, k: int) -> str:
    """The stability resamples' mean pairwise Jaccard beside chance, in words: "mean pairwise
    Jaccard 0.62 of the removed sets, against 0.09 for two random sets of 12 of 72 heads: 6.6x
    chance"."""
    chance = chance_jaccard(n, k)
    base = (
        f"mean pairwise Jaccard {observed:.2f} of the removed sets, against {chance:.2f} for two "
        f"random sets of {k} of {n} heads"
    )
    if observed != observed or chance != chance:
        return base
    if chance >= 1:
        return base + " (every head removed: any two sets agree)"
    if observed <= chance:
        return base + ": no more agreement than chance"
    return base + f": {observed / chance:.1f}x chance"
