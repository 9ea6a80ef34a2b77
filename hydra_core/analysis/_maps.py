"""A greedy step's candidate maps: every candidate's logits scored into (L, H) maps of accuracy and
AUROC, in one process or shared among the processes of a distributed job.

Two scorers turn a batch of candidate logits into scores:

- :class:`Scorer`, the search's own: accuracy and MSP AUROC of the samples as given;
- :class:`WeightedScorer`: the same numbers for G *resamples* of the samples at once, each given as
  integer counts (how often each sample is drawn). Counting in integers makes its scores
  bit-identical to :class:`Scorer` on the resample written out with its repeats, so a search scored
  with weights makes the same choices as one run on the resample itself
  (:mod:`hydra_core.analysis.stability`).

A scorer returns (accuracy, AUROC) of shape (C, *extra): ``extra`` is () for :class:`Scorer` and
(G,) for :class:`WeightedScorer`; the maps then have shape (L, H, *extra).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection

import torch

from hydra_core import distributed
from hydra_core.analysis._shares import Unit
from hydra_core.analysis._suffix import Stopped
from hydra_core.types import Head


def batched_auroc(id_scores: torch.Tensor, ood_scores: torch.Tensor) -> torch.Tensor:
    """AUROC with OOD as the positive class and higher score = more in-distribution, per row.

    Args:
        id_scores: (..., n_id) scores of the ID samples (e.g. MSP).
        ood_scores: (..., n_ood) scores of the OOD samples; leading dimensions as ``id_scores``.

    Returns:
        (...,) float64: P(ood < id) + 0.5 P(ood == id) over all ID/OOD pairs, the same number as
        ``sklearn.metrics.roc_auc_score(is_ood, -score)``. Counted exactly in integers, so equal
        orderings give bit-identical values.
    """
    if id_scores.shape[:-1] != ood_scores.shape[:-1]:
        raise ValueError(
            f"id_scores {tuple(id_scores.shape)} and ood_scores {tuple(ood_scores.shape)} "
            "differ in their leading (batch) dimensions"
        )
    n_id, n_ood = id_scores.shape[-1], ood_scores.shape[-1]
    if n_id == 0 or n_ood == 0:
        raise ValueError(f"AUROC needs ID and OOD scores, got {n_id} ID and {n_ood} OOD")
    if torch.isnan(id_scores).any() or torch.isnan(ood_scores).any():
        raise ValueError("AUROC scores contain NaN")
    id_scores, ood_scores = id_scores.double(), ood_scores.double()
    ood_sorted = ood_scores.sort(dim=-1).values.contiguous()
    queries = id_scores.contiguous()
    below = torch.searchsorted(ood_sorted, queries, right=False)  # OOD scores < each ID score
    at_or_below = torch.searchsorted(ood_sorted, queries, right=True)  # OOD scores <= it
    return (below + at_or_below).sum(dim=-1).double() / (2 * n_id * n_ood)


def _checked_logits(logits: torch.Tensor, top_label: int) -> torch.Tensor:
    logits = logits.cpu().double()  # on the CPU: not every accelerator has float64
    if torch.isnan(logits).any():
        raise FloatingPointError("the model produced NaN logits; the head search cannot rank heads")
    num_classes = logits.shape[-1]
    if top_label >= num_classes:
        raise ValueError(f"id_y holds class {top_label} but the model has {num_classes} classes")
    return logits


#: how the search AUROC combines its OOD search sets: ``pooled`` (one AUROC of ID against every OOD
#: item at once), ``mean`` (the mean of the per-set AUROCs), ``min`` (the worst set's AUROC)
OOD_AGGREGATES = ("pooled", "mean", "min")
#: the aggregate the command line, the app and the reports use unless told otherwise
DEFAULT_OOD_AGGREGATE = "pooled"


def check_ood_aggregate(ood_aggregate: str) -> None:
    if ood_aggregate not in OOD_AGGREGATES:
        raise ValueError(
            f"ood_aggregate must be one of {', '.join(OOD_AGGREGATES)}, got {ood_aggregate!r}"
        )


def set_ids(ood_sets) -> torch.Tensor:
    """The OOD search set of each OOD item (names or ints, one per item) as int64 ids numbered in
    order of first appearance."""
    if isinstance(ood_sets, torch.Tensor):
        ood_sets = ood_sets.tolist()
    numbers: dict = {}
    return torch.tensor([numbers.setdefault(s, len(numbers)) for s in ood_sets], dtype=torch.long)


def aggregate_auroc(
    id_scores: torch.Tensor, ood_scores: torch.Tensor, groups: torch.Tensor | None, how: str
) -> torch.Tensor:
    """The search AUROC of (..., n_id) ID and (..., n_ood) OOD scores: pooled over every OOD item,
    or the mean or the minimum of one AUROC per OOD set (``groups``: (n_ood,) set ids)."""
    if how == "pooled" or groups is None:
        return batched_auroc(id_scores, ood_scores)
    per_set = torch.stack(
        [
            batched_auroc(id_scores, ood_scores[..., groups == g])
            for g in range(int(groups.max()) + 1)
        ],
        dim=-1,
    )  # (..., G) float64
    return per_set.mean(-1) if how == "mean" else per_set.amin(-1)


class Scorer:
    """Logits of candidates -> their (accuracy, AUROC) in float64.

    Args:
        labels: (n_id,) labels of the ID samples (the logits' first ``n_id`` rows).
        n_id: how many ID samples lead the logits.
        ood_sets: the OOD search set of each remaining row (names or ids); needed by the
            ``mean`` and ``min`` aggregates.
        ood_aggregate: ``pooled`` (one AUROC over all OOD rows, the default), ``mean`` or
            ``min`` over the per-set AUROCs (:data:`OOD_AGGREGATES`).
    """

    extra: tuple[int, ...] = ()

    def __init__(
        self,
        labels: torch.Tensor,
        n_id: int,
        ood_sets=None,
        ood_aggregate: str = "pooled",
    ) -> None:
        check_ood_aggregate(ood_aggregate)
        self.labels = labels.cpu().long()  # (n_id,)
        self.n_id = n_id
        self.top_label = int(labels.max())
        self.ood_aggregate = ood_aggregate
        self.groups = None
        if ood_aggregate != "pooled":
            if ood_sets is None:
                raise ValueError(f"ood_aggregate {ood_aggregate!r} needs the OOD items' sets")
            self.groups = set_ids(ood_sets)

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(C, S, K) logits, ID samples first -> (accuracy (C,), auroc (C,)), float64 on the CPU."""
        logits = _checked_logits(logits, self.top_label)
        correct = (logits[:, : self.n_id].argmax(-1) == self.labels).sum(-1)  # (C,)
        msp = logits.softmax(-1).amax(-1)  # (C, S)
        if self.groups is not None and len(self.groups) != msp.shape[1] - self.n_id:
            raise ValueError(
                f"ood_sets names {len(self.groups)} OOD items but the logits hold "
                f"{msp.shape[1] - self.n_id}"
            )
        auroc = aggregate_auroc(
            msp[:, : self.n_id], msp[:, self.n_id :], self.groups, self.ood_aggregate
        )
        return correct.double() / self.n_id, auroc


class WeightedScorer:
    """Logits of candidates -> (accuracy, AUROC) of G resamples at once, (C, G) float64 each.

    Args:
        labels: (n_id,) labels of the ID samples the logits hold (first ``n_id`` rows).
        id_counts: (G, n_id) integer counts: how often resample g draws each ID sample.
        ood_counts: (G, n_ood) the same for the OOD samples (the logits' remaining rows).

    Resample g's accuracy is its correct draws over its ID draws and its AUROC counts every pair
    of drawn ID and OOD samples with their multiplicities, all in integers: the numbers
    :class:`Scorer` gives for the resample written out sample by sample, bit for bit.
    """

    def __init__(
        self, labels: torch.Tensor, id_counts: torch.Tensor, ood_counts: torch.Tensor
    ) -> None:
        if id_counts.ndim != 2 or ood_counts.ndim != 2 or len(id_counts) != len(ood_counts):
            raise ValueError("id_counts and ood_counts must be (G, n) with the same G")
        self.labels = labels.cpu().long()
        self.n_id = len(self.labels)
        self.id_counts = id_counts.cpu().long()  # (G, n_id)
        self.ood_counts = ood_counts.cpu().long()  # (G, n_ood)
        self.id_total = self.id_counts.sum(-1)  # (G,)
        self.ood_total = self.ood_counts.sum(-1)
        if (self.id_total == 0).any() or (self.ood_total == 0).any():
            raise ValueError("every resample needs at least one ID and one OOD draw")
        self.top_label = int(labels.max())
        self.extra = (len(id_counts),)

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(C, S, K) logits, ID samples first -> (accuracy (C, G), auroc (C, G))."""
        logits = _checked_logits(logits, self.top_label)
        n_id = self.n_id
        correct = (logits[:, :n_id].argmax(-1) == self.labels).long()  # (C, n_id)
        hits = correct @ self.id_counts.T  # (C, G) integer counts of correct draws
        msp = logits.softmax(-1).amax(-1)  # (C, S)
        id_msp, ood_msp = msp[:, :n_id].contiguous(), msp[:, n_id:]
        ood_sorted, order = ood_msp.sort(dim=-1)
        ood_sorted = ood_sorted.contiguous()
        below = torch.searchsorted(ood_sorted, id_msp, right=False)  # (C, n_id) positions
        at_or_below = torch.searchsorted(ood_sorted, id_msp, right=True)
        # (C, G, n_ood + 1) running counts of OOD draws in each candidate's sorted order
        sorted_counts = self.ood_counts[:, order].permute(1, 0, 2)  # (C, G, n_ood)
        running = torch.nn.functional.pad(sorted_counts.cumsum(-1), (1, 0))
        c, g = running.shape[:2]
        drawn_below = running.gather(-1, below[:, None, :].expand(c, g, n_id))
        drawn_at_or_below = running.gather(-1, at_or_below[:, None, :].expand(c, g, n_id))
        pairs = ((drawn_below + drawn_at_or_below) * self.id_counts[None]).sum(-1)  # (C, G)
        accuracy = hits.double() / self.id_total.double()
        auroc = pairs.double() / (2 * self.id_total * self.ood_total).double()
        return accuracy, auroc


def objective_of(objective: str, accuracy: torch.Tensor, auroc: torch.Tensor) -> torch.Tensor:
    """The search objective from its two scores: ``acc``, ``ood`` (AUROC) or ``avg``."""
    if objective == "acc":
        return accuracy
    if objective == "ood":
        return auroc
    return (accuracy + auroc) / 2


def candidate_maps(
    evaluator,
    scorer,
    shape: tuple[int, int],
    should_stop: Callable[[], bool] | None,
    heads: Collection[Head] | None = None,
    scored: Callable[[int], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(accuracy, auroc), each (L, H, *scorer.extra) float64, NaN where a head is not a
    candidate; ``heads``: score only these candidates (the guided search's), all when None;
    ``scored(n)`` after each pass, with the candidates scored so far (one process)."""
    if distributed.active():
        return _shared_candidate_maps(evaluator, scorer, shape, should_stop, heads)
    accuracy = torch.full((*shape, *scorer.extra), math.nan, dtype=torch.float64)
    auroc = torch.full_like(accuracy, math.nan)
    found = (
        evaluator.candidate_logits(should_stop)
        if heads is None
        else evaluator.candidate_logits(should_stop, set(heads))
    )
    done = 0
    for heads, logits in found:
        acc, roc = scorer(logits)
        for i, (layer, head) in enumerate(heads):
            accuracy[layer, head], auroc[layer, head] = acc[i], roc[i]
        done += len(heads)
        if scored is not None:
            scored(done)
    return accuracy, auroc


def _shared_candidate_maps(
    evaluator,
    scorer,
    shape: tuple[int, int],
    should_stop: Callable[[], bool] | None,
    chosen: Collection[Head] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`candidate_maps` in a distributed job: this process scores its share of the units,
    and the maps are summed over processes. Each candidate is scored by exactly one process (the
    others add 0), so every process ends with the same maps, bit for bit. A stop asked for on any
    process during the step (:class:`Stopped`) stops it on every process, at the sum."""
    units = evaluator.units()
    if chosen is not None:  # the guided search's candidates: each unit cut to them
        chosen = set(chosen)
        units = [
            Unit(kept, unit.cost * len(kept) / len(unit.heads))
            for unit in units
            if (kept := tuple(h for h in unit.heads if h in chosen))
        ]
    mine = distributed.split([unit.cost for unit in units])[distributed.rank()]
    heads = {head for i in mine for head in units[i].heads}
    maps = torch.zeros(2, *shape, *scorer.extra, dtype=torch.float64)  # accuracy, auroc
    stopped = False
    try:
        for candidates, logits in evaluator.candidate_logits(should_stop, heads):
            acc, roc = scorer(logits)
            for i, (layer, head) in enumerate(candidates):
                maps[0, layer, head], maps[1, layer, head] = acc[i], roc[i]
    except Stopped:
        stopped = True
    flag = torch.tensor([float(stopped)], dtype=torch.float64)
    total = distributed.sum_over_processes(torch.cat([maps.flatten(), flag]))
    if total[-1] > 0:
        raise Stopped
    maps = total[:-1].reshape(maps.shape)
    is_candidate = torch.zeros(shape, dtype=torch.bool)
    for unit in units:
        for layer, head in unit.heads:
            is_candidate[layer, head] = True
    maps[:, ~is_candidate] = math.nan
    return maps[0], maps[1]


def best_head(scores: torch.Tensor) -> Head:
    """The candidate with the highest score in an (L, H) map (NaN: not a candidate); ties go to
    the lowest (layer, head)."""
    best, best_score = None, -math.inf
    for layer, head in (~torch.isnan(scores)).nonzero().tolist():  # lexicographic order
        value = float(scores[layer, head])
        if best is None or value > best_score:
            best, best_score = (layer, head), value
    return best
