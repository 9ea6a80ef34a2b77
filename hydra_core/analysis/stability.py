"""How stable a greedy circuit is: the same search on B bootstrap resamples of its search data.

A resample draws, with replacement, as many ID samples of every class as the class has and as many
samples of every OOD search set as the set has (ID within class, each OOD set within itself). The
greedy search (:func:`~hydra_core.analysis.greedy.greedy_circuit`) on each resample gives a removal
path; from the B paths: every head's **selection frequency** (the share of resamples that removed
it within the budget), each step's **agreement** (the share of resamples whose t-th removal is the
most common t-th removal) and the **mean pairwise Jaccard** of the removed sets.

**Exact.** Resample b's path is the path an independent ``greedy_circuit`` takes on resample b
written out sample by sample (:meth:`Resamples.inputs`): its candidates are scored by
:class:`~hydra_core.analysis._maps.WeightedScorer`, which counts every ID/OOD pair with its
multiplicities in integers, so its scores are those of the written-out resample bit for bit, and
the choice rule (highest score, ties to the lowest (layer, head)) is the search's own.

**Fast, because the resamples share work.** Every resample is the same images with other counts,
and the greedy state after t steps is the set of heads removed. Resamples whose paths share a
prefix share every step of it: the search keeps the resamples in groups that have removed the same
heads, computes each group's candidate logits once, over the samples any of its resamples draws,
and scores all its resamples from them. A group splits where its resamples choose differently; a
lone resample costs one search on its distinct samples (about 63% of them). The search goes step
by step: at each step the resamples are grouped anew by the set of heads they removed, so paths
that part and meet again (the same heads in another order) share their steps again. In a
distributed job (``torchrun``) each group's step is shared among the processes as a search's step
is (:mod:`hydra_core.analysis._maps`).

With a :class:`~hydra_core.cache.DiskCache` the paths are saved after every group step under a key
of the model, the data, the OOD strata, the objective, the method, B and the seed (not the budget):
a stopped run resumes, a larger budget continues a finished one and a smaller one reads its prefix.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations

import numpy as np
import torch
from torch import nn

from hydra_core import distributed
from hydra_core.analysis._maps import WeightedScorer, best_head, candidate_maps, objective_of
from hydra_core.analysis._suffix import Stopped
from hydra_core.analysis.greedy import (
    OBJECTIVES,
    _check_inputs,
    _check_objective,
    _device_and_dtype,
    _evaluator,
    _stop_asked,
)
from hydra_core.cache import DiskCache, cache_key, model_fingerprint
from hydra_core.errors import InputError
from hydra_core.metrics.bootstrap import check_resampled, stratified_indices
from hydra_core.models.adapter import head_label, model_and_inputs
from hydra_core.types import Head

STABILITY_VERSION = "stability-1"
STABILITY_CACHE_KIND = "stability"
#: removal frequency from which a head counts as stably removed (or, below 1 minus it, stably kept)
STABLE_SHARE = 0.8


# --- resamples -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resamples:
    """B stratified bootstrap resamples of a search split, as indices and counts.

    ``id_index[b]`` (n_id,) and ``ood_index[b]`` (n_ood,) list resample b's draws (ID positions
    draw within their class, OOD positions within their set); ``id_counts``/``ood_counts`` (B, n)
    count how often each sample is drawn.
    """

    id_index: np.ndarray
    ood_index: np.ndarray
    seed: int

    @classmethod
    def draw(
        cls, id_y: torch.Tensor, ood_strata: Sequence[str], resamples: int, seed: int = 0
    ) -> Resamples:
        n_id = len(id_y)
        strata = [f"id:{int(y)}" for y in id_y.cpu().tolist()]
        strata += [f"ood:{name}" for name in ood_strata]
        check_resampled(np.array(strata))  # classes of one item: every resample the same
        index = stratified_indices(np.array(strata), n_boot=resamples, seed=seed)
        return cls(index[:, :n_id], index[:, n_id:] - n_id, seed)

    def __len__(self) -> int:
        return len(self.id_index)

    def counts(self, n_id: int, n_ood: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(id_counts (B, n_id), ood_counts (B, n_ood)), int64."""

        def count(index: np.ndarray, n: int) -> torch.Tensor:
            rows = np.stack([np.bincount(row, minlength=n) for row in index])
            return torch.from_numpy(rows.astype(np.int64))

        return count(self.id_index, n_id), count(self.ood_index, n_ood)

    def inputs(
        self, b: int, id_x: torch.Tensor, id_y: torch.Tensor, ood_x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Resample ``b`` written out sample by sample: (id_x, id_y, ood_x) with repeats, the data
        an independent search on it takes."""
        id_index = torch.from_numpy(self.id_index[b]).to(id_x.device)
        ood_index = torch.from_numpy(self.ood_index[b]).to(ood_x.device)
        return id_x[id_index], id_y[id_index.to(id_y.device)], ood_x[ood_index]


# --- result --------------------------------------------------------------------------------------


@dataclass
class StabilityResult:
    """The greedy paths of B resamples of one search split, and what they say about its heads.

    ``orders[b]`` lists resample b's removals; ``scores[b][t]``, ``accuracy[b][t]`` and
    ``auroc[b][t]`` are its objective and scores with ``orders[b][: t + 1]`` removed, on resample
    b. ``group_steps`` counts the candidate evaluations made (one per group and step), against
    ``resamples * steps`` for independent searches.
    """

    objective: str
    budget: int
    seed: int
    method: str
    num_heads: tuple[int, ...]
    n_id: int
    n_ood: int
    orders: list[list[Head]]
    scores: list[list[float]]
    accuracy: list[list[float]]
    auroc: list[list[float]]
    group_steps: int = 0
    seconds: float = 0.0
    complete: bool = False
    step_groups: list[int] = field(default_factory=list)  # groups alive at each step

    @property
    def resamples(self) -> int:
        return len(self.orders)

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.num_heads), max(self.num_heads, default=0))

    @property
    def steps(self) -> int:
        """Steps every resample has made (the budget once complete)."""
        return min((len(order) for order in self.orders), default=0)

    def _steps(self, n: int | None) -> int:
        n = self.steps if n is None else n
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self.steps:
            raise ValueError(f"n must be an int between 0 and {self.steps}, got {n!r}")
        return n

    def frequency(self, n: int | None = None) -> torch.Tensor:
        """(L, H) float64: the share of resamples that removed each head within their first ``n``
        steps (default: all made); NaN where the model has no head."""
        n = self._steps(n)
        freq = torch.full(self.shape, math.nan, dtype=torch.float64)
        for layer, count in enumerate(self.num_heads):
            freq[layer, :count] = 0.0
        for order in self.orders:
            for layer, head in order[:n]:
                freq[layer, head] += 1.0 / self.resamples
        return freq

    def agreement(self) -> list[tuple[Head, float]]:
        """Per step: the most common removal at that step (ties: lowest (layer, head)) and the
        share of resamples that made it."""
        found = []
        for t in range(self.steps):
            counts = Counter(order[t] for order in self.orders)
            head = min(counts, key=lambda h: (-counts[h], h))
            found.append((head, counts[head] / self.resamples))
        return found

    def jaccard(self, n: int | None = None) -> float:
        """Mean pairwise Jaccard index of the sets the resamples removed in ``n`` steps (1.0
        for a single resample; NaN for n = 0)."""
        n = self._steps(n)
        if n == 0:
            return math.nan
        sets = [set(order[:n]) for order in self.orders]
        pairs = list(combinations(sets, 2))
        if not pairs:
            return 1.0
        return float(np.mean([len(a & b) / len(a | b) for a, b in pairs]))

    def jaccard_curve(self) -> list[float]:
        """:meth:`jaccard` after 1, 2, ..., steps removals."""
        return [self.jaccard(n) for n in range(1, self.steps + 1)]

    def stable_heads(
        self, share: float = STABLE_SHARE, n: int | None = None
    ) -> tuple[list[Head], list[Head]]:
        """(removed, kept): heads removed within ``n`` steps by at least ``share`` of the
        resamples, and heads removed by at most 1 - ``share`` of them (most stable first)."""
        freq = self.frequency(n)
        heads = [(layer, h) for layer, c in enumerate(self.num_heads) for h in range(c)]
        removed = sorted(
            (h for h in heads if freq[h] >= share - 1e-12), key=lambda h: (-float(freq[h]), h)
        )
        kept = sorted(
            (h for h in heads if freq[h] <= 1 - share + 1e-12), key=lambda h: (float(freq[h]), h)
        )
        return removed, kept

    def ranking(self, tiebreak: Sequence[Head] = ()) -> list[Head]:
        """Every head, most often removed first (least useful by the resamples' account), for
        building members from the stable heads; equal frequencies follow ``tiebreak`` (e.g. the
        search's own :meth:`~hydra_core.analysis.greedy.GreedyResult.ranking`), then (layer,
        head)."""
        freq = self.frequency()
        position = {h: i for i, h in enumerate(tiebreak)}
        heads = [(layer, h) for layer, c in enumerate(self.num_heads) for h in range(c)]
        return sorted(heads, key=lambda h: (-float(freq[h]), position.get(h, len(position)), h))

    def prefix(self, n: int) -> StabilityResult:
        """The first ``n`` steps of every resample, as a run with budget ``n``."""
        n = self._steps(n)
        return replace(
            self,
            budget=n,
            orders=[o[:n] for o in self.orders],
            scores=[s[:n] for s in self.scores],
            accuracy=[a[:n] for a in self.accuracy],
            auroc=[a[:n] for a in self.auroc],
            complete=True,
            step_groups=self.step_groups[:n],
        )

    def summary(self) -> dict:
        """The headline numbers, JSON-safe."""
        agreement = self.agreement()
        removed, kept = self.stable_heads()
        return {
            "resamples": self.resamples,
            "steps": self.steps,
            "jaccard": None if self.steps == 0 else self.jaccard(),
            "first_step_agreement": agreement[0][1] if agreement else None,
            "stably_removed": [head_label(*h) for h in removed],
            "stably_kept": len(kept),
            "group_steps": self.group_steps,
            "independent_steps": self.resamples * self.steps,
        }

    def to_dict(self) -> dict:
        """JSON-safe; ``frequency`` ((L, H), null where there is no head) is included for readers
        that want the map alone."""
        freq = self.frequency()
        return {
            "format": "hydra-stability",
            "version": 1,
            "objective": self.objective,
            "budget": self.budget,
            "seed": self.seed,
            "method": self.method,
            "num_heads": list(self.num_heads),
            "n_id": self.n_id,
            "n_ood": self.n_ood,
            "orders": [[[layer, head] for layer, head in order] for order in self.orders],
            "scores": self.scores,
            "accuracy": self.accuracy,
            "auroc": self.auroc,
            "group_steps": self.group_steps,
            "seconds": self.seconds,
            "complete": self.complete,
            "step_groups": self.step_groups,
            "frequency": [[None if math.isnan(v) else v for v in row] for row in freq.tolist()],
            "summary": self.summary(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> StabilityResult:
        """Inverse of :meth:`to_dict`; raises ValueError on anything inconsistent."""
        if not isinstance(data, dict) or data.get("format") != "hydra-stability":
            raise ValueError("not a stability result (expected format 'hydra-stability')")
        try:
            result = cls(
                objective=str(data["objective"]),
                budget=int(data["budget"]),
                seed=int(data["seed"]),
                method=str(data["method"]),
                num_heads=tuple(int(n) for n in data["num_heads"]),
                n_id=int(data["n_id"]),
                n_ood=int(data["n_ood"]),
                orders=[[(int(la), int(h)) for la, h in order] for order in data["orders"]],
                scores=[[float(v) for v in row] for row in data["scores"]],
                accuracy=[[float(v) for v in row] for row in data["accuracy"]],
                auroc=[[float(v) for v in row] for row in data["auroc"]],
                group_steps=int(data["group_steps"]),
                seconds=float(data["seconds"]),
                complete=bool(data["complete"]),
                step_groups=[int(v) for v in data.get("step_groups", [])],
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"malformed stability result: {error}") from None
        lists = (result.scores, result.accuracy, result.auroc)
        if result.objective not in OBJECTIVES or not result.orders:
            raise ValueError("malformed stability result: objective or resamples")
        for b, order in enumerate(result.orders):
            if {len(rows[b]) for rows in lists} != {len(order)} or len(set(order)) != len(order):
                raise ValueError(f"malformed stability result: resample {b}'s lists disagree")
            if any(
                not (0 <= layer < len(result.num_heads) and 0 <= h < result.num_heads[layer])
                for layer, h in order
            ):
                raise ValueError("malformed stability result: a removed head is outside the model")
        return result


@dataclass
class StabilityProgress:
    """What ``progress`` receives after each group step."""

    done: int  # resample-steps made (summed over resamples)
    total: int  # resamples * budget
    group_steps: int  # candidate evaluations made so far
    groups: int  # resamples sharing the step just made
    seconds: float  # this group step's compute time
    elapsed: float
    result: StabilityResult


# --- the search ----------------------------------------------------------------------------------


def stability_cache_key(
    model: nn.Module,
    id_x: torch.Tensor,
    id_y: torch.Tensor,
    ood_x: torch.Tensor,
    ood_strata: Sequence[str],
    objective: str,
    method: str,
    resamples: int,
    seed: int,
) -> str:
    """The cache key of a stability run (kind :data:`STABILITY_CACHE_KIND`): all but the budget."""
    return cache_key(
        STABILITY_VERSION,
        model_fingerprint(model),
        id_x,
        id_y.long(),
        ood_x,
        list(ood_strata),
        objective=objective,
        method=method,
        resamples=resamples,
        seed=seed,
    )


def _check_strata(ood_strata: Sequence[str] | None, n_ood: int) -> tuple[str, ...]:
    if ood_strata is None:
        return ("ood",) * n_ood
    strata = tuple(str(s) for s in ood_strata)
    if len(strata) != n_ood:
        raise ValueError(
            f"ood_strata must name the set of each of the {n_ood} OOD samples, got {len(strata)}"
        )
    return strata


def load_stability(
    model: nn.Module,
    id_x: torch.Tensor,
    id_y: torch.Tensor,
    ood_x: torch.Tensor,
    cache: DiskCache,
    *,
    objective: str,
    resamples: int,
    seed: int = 0,
    method: str = "fast",
    ood_strata: Sequence[str] | None = None,
) -> StabilityResult | None:
    """The stability run saved in ``cache`` for these arguments (finished or not), or None."""
    strata = _check_strata(ood_strata, len(ood_x))
    key = stability_cache_key(model, id_x, id_y, ood_x, strata, objective, method, resamples, seed)
    return _load(cache, key, objective, resamples)


def _load(cache: DiskCache, key: str, objective: str, resamples: int) -> StabilityResult | None:
    data = cache.load(STABILITY_CACHE_KIND, key)
    if data is None:
        return None
    try:
        stored = StabilityResult.from_dict(data)
    except ValueError:
        cache.delete(STABILITY_CACHE_KIND, key)
        return None
    if stored.objective != objective or stored.resamples != resamples:
        cache.delete(STABILITY_CACHE_KIND, key)
        return None
    return stored


def greedy_stability(
    model: nn.Module,
    id_x: torch.Tensor,
    id_y: torch.Tensor,
    ood_x: torch.Tensor,
    *,
    objective: str = "avg",
    budget: int,
    resamples: int = 10,
    seed: int = 0,
    ood_strata: Sequence[str] | None = None,
    batch_size: int = 256,
    method: str = "fast",
    cache: DiskCache | None = None,
    resume: bool = True,
    progress: Callable[[StabilityProgress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> StabilityResult:
    """The greedy search on ``resamples`` stratified bootstrap resamples of the search data.

    Args:
        model, id_x, id_y, ood_x, objective, budget, batch_size, method: as for
            :func:`~hydra_core.analysis.greedy.greedy_circuit`.
        resamples: B, at least 2.
        seed: draws the resamples (:class:`Resamples`).
        ood_strata: the OOD set of every ``ood_x`` row (each set is resampled within itself);
            None: one set.
        cache, resume, progress, should_stop: as for ``greedy_circuit``; a stop returns the
            paths made so far (``complete=False``), saved.

    Returns:
        A :class:`StabilityResult`; resample b's path equals ``greedy_circuit`` on
        ``Resamples.draw(id_y, ood_strata, resamples, seed).inputs(b, ...)``.
    """
    _check_objective(objective)
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 2:
        raise InputError(f"resamples must be an int of at least 2, got {resamples!r}")
    model, id_x, ood_x = model_and_inputs(model, id_x, ood_x, names=("id_x", "ood_x"))
    layout = _check_inputs(model, id_x, id_y, ood_x, batch_size)
    total = layout.total_heads
    if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= total:
        raise InputError(
            f"budget must be an int between 1 and {total} (the model's heads), got {budget!r}"
        )
    strata = _check_strata(ood_strata, len(ood_x))
    draws = Resamples.draw(id_y, strata, resamples, seed)

    stored, save = None, None
    if cache is not None:
        key = stability_cache_key(
            model, id_x, id_y, ood_x, strata, objective, method, resamples, seed
        )
        if resume:
            stored = distributed.from_main(lambda: _load(cache, key, objective, resamples))

        def save(result: StabilityResult) -> None:
            if distributed.is_main():
                cache.save(STABILITY_CACHE_KIND, key, result.to_dict())

    if stored is not None and stored.steps >= budget:
        return stored.prefix(budget)
    if stored is None:
        stored = StabilityResult(
            objective=objective,
            budget=budget,
            seed=seed,
            method=method,
            num_heads=layout.num_heads,
            n_id=len(id_x),
            n_ood=len(ood_x),
            orders=[[] for _ in range(resamples)],
            scores=[[] for _ in range(resamples)],
            accuracy=[[] for _ in range(resamples)],
            auroc=[[] for _ in range(resamples)],
        )
    result = replace(stored, budget=budget, complete=False)
    with torch.inference_mode():
        _Search(model, (id_x, id_y, ood_x), layout, draws, result, batch_size, save).run(
            progress, should_stop
        )
    result.complete = result.steps == budget
    if save is not None:
        save(result)
    return result


class _Group:
    """Resamples that removed the same heads, with the evaluator over the samples they draw and
    the scorer of their counts."""

    def __init__(self, search: _Search, members: list[int]) -> None:
        self.members = members
        id_counts, ood_counts = search.id_counts[members], search.ood_counts[members]
        id_used = (id_counts > 0).any(0).nonzero().flatten()
        ood_used = (ood_counts > 0).any(0).nonzero().flatten()
        rows = torch.cat([id_used, ood_used + search.n_id]).to(search.inputs.device)
        self.rows = len(rows)
        self.evaluator = _evaluator(
            search.result.method,
            search.model,
            search.inputs[rows],
            search.layout,
            search.batch_size,
        )
        self.evaluator.set_removed(list(search.result.orders[members[0]]))
        self.scorer = WeightedScorer(
            search.id_y[id_used], id_counts[:, id_used], ood_counts[:, ood_used]
        )


class _Search:
    """The walk over groups of resamples that share their removals, one step at a time.

    At every step the resamples still searching are grouped by the *set* of heads they removed
    (the greedy state), so resamples whose paths parted and met again (the same heads removed in
    another order) are one group again. A group that made one choice for all its resamples keeps
    its evaluator for the next step (one head more removed), within a memory bound of
    :data:`KEPT_ROWS` times the samples; any other group builds its own, over the samples its
    resamples draw."""

    #: evaluators kept from one step to the next hold at most this many times the samples
    KEPT_ROWS = 4

    def __init__(self, model, data, layout, draws: Resamples, result, batch_size, save) -> None:
        self.model, self.layout, self.result = model, layout, result
        self.batch_size, self.save = batch_size, save
        id_x, id_y, ood_x = data
        device, dtype = _device_and_dtype(model)
        inputs = torch.cat([id_x, ood_x])
        self.inputs = inputs.to(device, dtype if inputs.is_floating_point() else None)
        self.id_y, self.n_id = id_y.cpu().long(), len(id_x)
        self.id_counts, self.ood_counts = draws.counts(len(id_x), len(ood_x))

    def _groups(self, members: Sequence[int]) -> list[list[int]]:
        """``members`` grouped by the heads they removed (groups in order of their first)."""
        found: dict[frozenset, list[int]] = {}
        for b in members:
            found.setdefault(frozenset(self.result.orders[b]), []).append(b)
        return list(found.values())

    def run(self, progress, should_stop) -> None:
        result = self.result
        start = time.perf_counter()
        kept: dict[tuple[int, ...], _Group] = {}  # by members: evaluators one removal on
        while True:
            pending = [b for b in range(result.resamples) if len(result.orders[b]) < result.budget]
            if not pending:
                return
            carried, rows = {}, 0
            for members in self._groups(pending):
                group = kept.pop(tuple(members), None) or _Group(self, members)
                try:
                    choices = self._step(group, start, progress, should_stop)
                except Stopped:
                    return
                if len(set(choices)) == 1 and rows + group.rows <= self.KEPT_ROWS * len(
                    self.inputs
                ):
                    group.evaluator.remove(*choices[0])
                    carried[tuple(members)], rows = group, rows + group.rows
            kept = carried

    def _step(self, group: _Group, start: float, progress, should_stop) -> list[Head]:
        """One step of every resample of ``group``; returns their choices."""
        result = self.result
        if _stop_asked(should_stop):
            raise Stopped
        step_start = time.perf_counter()
        acc_map, roc_map = candidate_maps(
            group.evaluator, group.scorer, self.layout.shape, should_stop
        )
        scores = objective_of(result.objective, acc_map, roc_map)  # (L, H, G)
        choices = []
        for g, b in enumerate(group.members):
            head = best_head(scores[..., g])
            choices.append(head)
            result.orders[b].append(head)
            result.scores[b].append(float(scores[(*head, g)]))
            result.accuracy[b].append(float(acc_map[(*head, g)]))
            result.auroc[b].append(float(roc_map[(*head, g)]))
        seconds = time.perf_counter() - step_start
        result.group_steps += 1
        result.seconds += seconds
        t = len(result.orders[group.members[0]]) - 1
        if len(result.step_groups) <= t:
            result.step_groups.append(0)
        result.step_groups[t] += 1
        if self.save is not None:
            self.save(result)
        if progress is not None:
            with torch.inference_mode(False):
                progress(
                    StabilityProgress(
                        done=sum(len(o) for o in result.orders),
                        total=result.resamples * result.budget,
                        group_steps=result.group_steps,
                        groups=len(group.members),
                        seconds=seconds,
                        elapsed=time.perf_counter() - start,
                        result=result,
                    )
                )
        return choices
