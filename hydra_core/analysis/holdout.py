"""Where a greedy search starts fitting its sample: the objective on a held-out part, step by step.

The search split is cut in two, stratified (ID within class, each OOD set within itself): the
search part chooses the heads, the held-out part never does, and no report set is either. After
every step the circuit so far is scored on the held-out part (one forward of it per step, by the
fast path's evaluator removing the heads in the search's order). The step where the held-out
objective peaks is offered as the budget: past it, each removal raised the objective on the
search's own sample and lowered it on other samples of the same distributions. Every held-out value
carries a 95% interval over resamples of the held-out items (the project's stratified bootstrap,
scored in integers by :class:`~hydra_core.analysis._maps.WeightedScorer`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
    part (``held_out_lo``/``_hi``: 95% interval over held-out resamples)."""

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

    @property
    def peak(self) -> int:
        """The number of removals with the highest held-out objective (the first such step)."""
        return int(np.argmax(self.held_out))

    def beyond_peak(self, budget: int) -> bool:
        """Whether ``budget`` removals go past the held-out peak."""
        return budget > self.peak

    #: the per-step columns: one value per number of removals, 0 .. steps
    COLUMNS = (
        "search",
        "held_out",
        "held_out_lo",
        "held_out_hi",
        "held_out_accuracy",
        "held_out_auroc",
    )

    def frame(self):
        """One row per number of removals: the head removed last and every per-step column."""
        import pandas as pd

        heads = [""] + [head_label(*h) for h in self.order]
        columns = {c: getattr(self, c) for c in self.COLUMNS}
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
    values, lo, hi, accuracy, auroc = [], [], [], [], []
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
            replicates = objective_of(result.objective, *weighted(logits[None]))[0].numpy()
            low, high = percentile_interval(replicates)
            lo.append(float(low))
            hi.append(float(high))
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
    )
