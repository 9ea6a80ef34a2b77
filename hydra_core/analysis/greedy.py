"""Greedy "Headmap" circuit extraction (paper Algorithm 1, Appendix D.1.2), single-head importance.

At every step each remaining head is ablated on its own, the objective S is evaluated, and the head
whose removal leaves the highest S is removed for good. Objectives, all computed in float64 from the
logits so that equal counts tie exactly:

- ``"acc"``: S_acc, top-1 accuracy on the ID samples;
- ``"ood"``: S_ood, AUROC of the maximum softmax probability (MSP), OOD positive:
  P(msp_ood < msp_id) + 0.5 P(msp_ood == msp_id);
- ``"avg"``: S_avg = (S_acc + S_ood) / 2.

With several OOD search sets, ``ood_aggregate`` says how S_ood combines them: ``"pooled"`` (one
AUROC against all OOD items, the default), ``"mean"`` or ``"min"`` of one AUROC per set
(``ood_sets`` names each OOD item's set; docs/search-protocols.md).

Ties go to the lowest (layer, head). Two implementations give the same choices:
``method="plain"`` runs the whole model under :func:`ablate` per candidate (the reference);
``method="fast"`` recomputes only the layers after the candidate's, shares its layer's attention
among the candidates of that layer and stacks candidates and samples in batched passes
(:mod:`hydra_core.analysis._suffix`).

The *guided* search (``candidates=K``) evaluates exactly only the K heads whose attribution
estimate (:mod:`hydra_core.analysis.attribution`, taken with the heads removed so far ablated)
promises the highest objective at each step; K at or above the number of heads is the exact
search, bit for bit. Its cache key includes K; ``GreedyResult.evaluated`` counts the candidates
each step evaluated.

With a :class:`DiskCache` the search is saved after every step under a key of the model weights,
the inputs, the objective and the method (not the budget): an interrupted search continues where
it stopped, a larger budget continues a shorter finished one, a smaller budget returns a prefix.
:func:`load_greedy` and :func:`saved_searches` read those saved searches back without running one.

In a distributed job (:mod:`hydra_core.distributed`, e.g. under ``torchrun``) every process runs
the same call: each scores its share of a step's candidates (:mod:`hydra_core.analysis._shares`),
the scores are summed over processes and every process makes the same choice; rank 0 alone reads
and writes the cache. The result is bit-identical to the single-process search.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import replace

import torch
from torch import nn

from hydra_core import distributed
from hydra_core.analysis._maps import (
    OOD_AGGREGATES as OOD_AGGREGATES,  # re-exported: how the search AUROC combines OOD sets
)
from hydra_core.analysis._maps import (
    Scorer,
    best_head,
    candidate_maps,
    check_ood_aggregate,
    objective_of,
)
from hydra_core.analysis._maps import (
    batched_auroc as batched_auroc,  # re-exported: the search's AUROC
)
from hydra_core.analysis._shares import Unit
from hydra_core.analysis._suffix import Stopped
from hydra_core.analysis._towers import fast_evaluator
from hydra_core.analysis.greedy_result import OBJECTIVES as OBJECTIVES  # re-exported
from hydra_core.analysis.greedy_result import GreedyResult as GreedyResult  # re-exported
from hydra_core.analysis.greedy_result import GreedyStep as GreedyStep  # re-exported
from hydra_core.cache import DiskCache, cache_key, model_fingerprint
from hydra_core.errors import InputError
from hydra_core.models.adapter import (
    HeadLayout,
    ablate,
    head_layout,
    model_and_inputs,
)
from hydra_core.types import Head

#: Changes whenever the numbers a search produces change; part of every cache key.
GREEDY_VERSION = "greedy-1"
METHODS = ("fast", "plain")
#: Cache kinds (folders of the :class:`DiskCache`).
GREEDY_CACHE_KIND = "greedy"
IMPORTANCE_CACHE_KIND = "head-importance"


# --- results: GreedyResult, GreedyStep (hydra_core.analysis.greedy_result) ------------------

# --- evaluators ----------------------------------------------------------------------------------


class _PlainEvaluator:
    """The reference: a full forward of the model under :func:`ablate` for every candidate."""

    def __init__(
        self, model: nn.Module, inputs: torch.Tensor, layout: HeadLayout, batch_size: int
    ) -> None:
        self.model, self.inputs, self.batch_size = model, inputs, batch_size
        self.keep = layout.all_kept()
        self.logits = self._forward(self.keep)

    def _forward(self, keep: torch.Tensor) -> torch.Tensor:
        with ablate(self.model, keep):
            return torch.cat(
                [
                    self.model(self.inputs[i : i + self.batch_size])
                    for i in range(0, len(self.inputs), self.batch_size)
                ]
            )

    def set_removed(self, heads: list[Head]) -> None:
        for layer, head in heads:
            self.keep[layer, head] = False
        if heads:
            self.logits = self._forward(self.keep)

    def remove(self, layer: int, head: int) -> torch.Tensor:
        self.keep[layer, head] = False
        self.logits = self._forward(self.keep)
        return self.logits

    def units(self) -> list[Unit]:
        """Every candidate alone, each a full forward."""
        return [Unit(((layer, head),), 1.0) for layer, head in self.keep.nonzero().tolist()]

    def candidate_logits(
        self,
        should_stop: Callable[[], bool] | None = None,
        heads: Collection[Head] | None = None,
    ) -> Iterator[tuple[list[Head], torch.Tensor]]:
        for layer, head in self.keep.nonzero().tolist():
            if heads is not None and (layer, head) not in heads:
                continue
            if should_stop is not None and should_stop():
                raise Stopped
            keep = self.keep.clone()
            keep[layer, head] = False
            yield [(layer, head)], self._forward(keep)[None]


def _evaluator(
    method: str, model: nn.Module, inputs: torch.Tensor, layout: HeadLayout, batch_size: int
):
    if method == "plain":
        return _PlainEvaluator(model, inputs, layout, batch_size)
    return _fast_evaluator(model, inputs, batch_size)


def _fast_evaluator(model: nn.Module, inputs: torch.Tensor, batch_size: int):
    """On the CPU the passes are sized for its caches and threads; elsewhere by ``batch_size``;
    one evaluator per tower for a model with towers (CLIP's image and text)."""
    return fast_evaluator(
        model, inputs, pairs_per_pass=None if inputs.device.type == "cpu" else batch_size
    )


def _stop_asked(should_stop: Callable[[], bool] | None) -> bool:
    """``should_stop()``, agreed on by every process of a distributed job (any one suffices)."""
    return distributed.any_process(should_stop is not None and should_stop())


# --- validation ----------------------------------------------------------------------------------


def _check_inputs(model: nn.Module, id_x, id_y, ood_x, batch_size: int) -> HeadLayout:
    layout = head_layout(model)
    if model.training:
        raise ValueError(
            "the model is in training mode (dropout would make scores random); "
            "call model.eval() first"
        )
    for name, x in (("id_x", id_x), ("ood_x", ood_x)):
        if x.ndim < 2 or len(x) < 2:
            raise ValueError(
                f"{name} must hold at least 2 samples (shape (N, ...)), got shape {tuple(x.shape)}"
            )
    if id_x.shape[1:] != ood_x.shape[1:]:
        raise ValueError(
            f"id_x samples have shape {tuple(id_x.shape[1:])} but ood_x samples "
            f"{tuple(ood_x.shape[1:])}; both must be preprocessed for the model"
        )
    if (
        not isinstance(id_y, torch.Tensor)
        or id_y.is_floating_point()
        or id_y.is_complex()
        or id_y.dtype == torch.bool
    ):
        raise TypeError("id_y must be an integer tensor (int64) of class labels")
    if id_y.ndim != 1 or len(id_y) != len(id_x):
        raise ValueError(
            f"id_y must be 1-D with one label per id_x sample: id_x has {len(id_x)} samples, "
            f"id_y has shape {tuple(id_y.shape)}"
        )
    if int(id_y.min()) < 0:
        raise ValueError(f"id_y holds a negative class label ({int(id_y.min())})")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    return layout


def _device_and_dtype(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    param = next(model.parameters())
    return param.device, param.dtype


def greedy_cache_key(
    model: nn.Module,
    id_x: torch.Tensor,
    id_y: torch.Tensor,
    ood_x: torch.Tensor,
    objective: str,
    method: str = "fast",
    candidates: int | None = None,
    *,
    ood_sets=None,
    ood_aggregate: str = "pooled",
) -> str:
    """The cache key of a search (kind :data:`GREEDY_CACHE_KIND`): everything but the budget;
    a guided search's ``candidates`` (K) too (None: the exact search, its key unchanged). A
    ``mean`` or ``min`` search adds its aggregate and the OOD items' sets, so searches that score
    the same items another way never share an entry; ``pooled`` keeps the key it always had."""
    extra = {} if candidates is None else {"candidates": candidates}
    if ood_aggregate != "pooled":
        sets = [str(s) for s in (ood_sets.tolist() if hasattr(ood_sets, "tolist") else ood_sets)]
        extra |= {"ood_aggregate": ood_aggregate, "ood_sets": ",".join(sets)}
    return cache_key(
        GREEDY_VERSION,
        model_fingerprint(model),
        id_x,
        id_y.long(),
        ood_x,
        objective=objective,
        method=method,
        **extra,
    )


def _check_sets(ood_sets, ood_aggregate: str, n_ood: int) -> None:
    check_ood_aggregate(ood_aggregate)
    if ood_sets is None:
        if ood_aggregate != "pooled":
            raise ValueError(
                f"ood_aggregate {ood_aggregate!r} scores each OOD search set apart: give "
                "ood_sets, the set of each ood_x item"
            )
        return
    if len(ood_sets) != n_ood:
        raise ValueError(f"ood_sets names {len(ood_sets)} OOD items but ood_x holds {n_ood}")


def _check_objective(objective: str) -> None:
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")


def _load_stored(
    cache: DiskCache,
    key: str,
    objective: str,
    method: str,
    num_heads: tuple[int, ...],
    candidates: int | None = None,
) -> GreedyResult | None:
    """The search stored under ``key``; an unreadable or foreign entry is removed (None)."""
    data = cache.load(GREEDY_CACHE_KIND, key)
    if data is None:
        return None
    try:
        stored = GreedyResult.from_dict(data)
    except ValueError:
        cache.delete(GREEDY_CACHE_KIND, key)
        return None
    found = (stored.objective, stored.method, stored.num_heads, stored.candidates)
    if found != (objective, method, num_heads, candidates):
        cache.delete(GREEDY_CACHE_KIND, key)
        return None
    return stored


# --- public entry points -------------------------------------------------------------------------


def load_greedy(
    model: nn.Module,
    id_x: torch.Tensor,
    id_y: torch.Tensor,
    ood_x: torch.Tensor,
    objective: str,
    cache: DiskCache,
    method: str = "fast",
    candidates: int | None = None,
    *,
    ood_sets=None,
    ood_aggregate: str = "pooled",
) -> GreedyResult | None:
    """The search for ``objective`` saved in ``cache`` for this model and these inputs, finished or
    interrupted, as :func:`greedy_circuit` with ``method`` left it; None when there is none.
    Nothing is computed. An unreadable or foreign entry is removed and gives None, as
    :func:`greedy_circuit` would treat it.
    """
    _check_objective(objective)
    layout = head_layout(model)
    candidates = guided_k(candidates, layout.total_heads)
    key = greedy_cache_key(
        model,
        id_x,
        id_y,
        ood_x,
        objective,
        method,
        candidates,
        ood_sets=ood_sets,
        ood_aggregate=ood_aggregate,
    )
    return _load_stored(cache, key, objective, method, layout.num_heads, candidates)


def saved_searches(
    model: nn.Module,
    id_x: torch.Tensor,
    id_y: torch.Tensor,
    ood_x: torch.Tensor,
    cache: DiskCache,
    *,
    ood_sets=None,
    ood_aggregate: str = "pooled",
) -> dict[str, GreedyResult]:
    """Every search :func:`load_greedy` finds for this model and these inputs, by objective (in the
    order of :data:`OBJECTIVES`; objectives without a saved search are left out)."""
    found = {
        objective: load_greedy(
            model,
            id_x,
            id_y,
            ood_x,
            objective,
            cache,
            ood_sets=ood_sets,
            ood_aggregate=ood_aggregate,
        )
        for objective in OBJECTIVES
    }
    return {objective: result for objective, result in found.items() if result is not None}


def greedy_circuit(
    model: nn.Module,
    id_x: torch.Tensor,
    id_y: torch.Tensor,
    ood_x: torch.Tensor,
    *,
    objective: str = "avg",
    budget: int,
    batch_size: int = 256,
    method: str = "fast",
    candidates: int | None = None,
    cache: DiskCache | None = None,
    resume: bool = True,
    progress: Callable[[GreedyStep], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    ood_sets=None,
    ood_aggregate: str = "pooled",
) -> GreedyResult:
    """Greedy circuit extraction: remove ``budget`` heads one at a time, least useful first.

    Args:
        model: a timm VisionTransformer in eval mode; never modified (no hook survives, weights
            stay bit-identical). Computation runs on the device it is on.
        id_x, ood_x: preprocessed ID and OOD inputs (N, C, H, W), float; at least 2 of each.
        id_y: int64 labels of ``id_x``.
        objective: ``"acc"`` (ID accuracy), ``"ood"`` (MSP AUROC, OOD positive) or ``"avg"``.
        budget: how many heads to remove, 1..(total heads); all of them gives the full removal
            order (as does one less), but a circuit to keep needs at least one head.
        batch_size: samples per forward (``"plain"``); (candidate, sample) pairs per batched
            pass of ``"fast"`` on an accelerator (on the CPU it sizes its passes itself, see
            :func:`hydra_core.analysis._suffix.cpu_rows_per_pass`). Results do not depend on it
            beyond float rounding.
        method: ``"fast"`` (suffix recomputation, batched candidates) or ``"plain"`` (reference).
        candidates: the guided search's K: each step evaluates exactly only the K heads whose
            attribution estimate (:mod:`hydra_core.analysis.attribution`, taken with the heads
            removed so far ablated) promises the highest objective. None, or K at least the
            model's heads: every head each step (the exact search, bit for bit, same cache).
        cache: save progress after every step and reuse earlier runs with the same model, inputs,
            objective and method (any budget).
        resume: when False, ignore a stored run and start again. The new run replaces the
            stored one only once it has as many steps: starting over never loses a longer
            finished search.
        ood_sets: the OOD search set of each ``ood_x`` item (names or ints), for the ``mean``
            and ``min`` aggregates.
        ood_aggregate: how S_ood combines the OOD search sets (:data:`OOD_AGGREGATES`):
            ``"pooled"`` (one AUROC of ID against all of ``ood_x``, the default), ``"mean"`` (the
            mean of one AUROC per set) or ``"min"`` (the worst set's). S_avg then averages
            accuracy with that AUROC.
        progress: called after every step with a :class:`GreedyStep`.
        should_stop: polled between steps and between batched passes; when it returns True the
            partial result (``complete=False``) is returned, its finished steps saved.

    Returns:
        A :class:`GreedyResult` with ``budget`` steps, or fewer when stopped.
    """
    _check_objective(objective)
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    model, id_x, ood_x = model_and_inputs(model, id_x, ood_x, names=("id_x", "ood_x"))
    layout = _check_inputs(model, id_x, id_y, ood_x, batch_size)
    _check_sets(ood_sets, ood_aggregate, len(ood_x))
    total = layout.total_heads
    if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= total:
        raise InputError(
            f"budget must be an int between 1 and {total} (the model's heads), got {budget!r}"
        )

    candidates = guided_k(candidates, total)
    save = None
    stored = None
    if cache is not None:
        key = greedy_cache_key(
            model,
            id_x,
            id_y,
            ood_x,
            objective,
            method,
            candidates,
            ood_sets=ood_sets,
            ood_aggregate=ood_aggregate,
        )
        previous = distributed.from_main(
            lambda: _load_stored(cache, key, objective, method, layout.num_heads, candidates)
        )
        if resume:
            stored = previous
        keep_until = 0 if resume or previous is None else previous.steps

        def save(result: GreedyResult) -> None:
            # a fresh start never overwrites a longer search; in a distributed job rank 0 writes
            if result.steps >= keep_until and distributed.is_main():
                cache.save(GREEDY_CACHE_KIND, key, result.to_dict())

    if stored is not None and stored.steps >= budget:
        return stored.prefix(budget)
    with torch.inference_mode():
        return _search(
            model,
            (id_x, id_y, ood_x),
            layout,
            objective=objective,
            budget=budget,
            method=method,
            candidates=candidates,
            batch_size=batch_size,
            stored=stored,
            save=save,
            progress=progress,
            should_stop=should_stop,
            scorer=Scorer(id_y, len(id_x), ood_sets, ood_aggregate),
        )


def _search(
    model: nn.Module,
    data: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    layout: HeadLayout,
    *,
    objective: str,
    budget: int,
    method: str,
    batch_size: int,
    stored: GreedyResult | None,
    candidates: int | None = None,
    save: Callable[[GreedyResult], object] | None,
    progress: Callable[[GreedyStep], None] | None,
    should_stop: Callable[[], bool] | None,
    scorer: Scorer | None = None,
) -> GreedyResult:
    """The greedy loop, from ``stored`` (a prefix already computed) or from the dense model."""
    id_x, id_y, ood_x = data
    start = time.perf_counter()
    device, dtype = _device_and_dtype(model)
    inputs = torch.cat([id_x, ood_x])
    inputs = inputs.to(device, dtype if inputs.is_floating_point() else None)
    scorer = Scorer(id_y, len(id_x)) if scorer is None else scorer
    evaluator = _evaluator(method, model, inputs, layout, batch_size)
    if stored is None:
        accuracy, auroc = scorer(evaluator.logits[None])
        base_acc, base_roc = float(accuracy[0]), float(auroc[0])
        result = GreedyResult(
            objective=objective,
            budget=budget,
            order=[],
            scores=[],
            accuracy=[],
            auroc=[],
            base_accuracy=base_acc,
            base_auroc=base_roc,
            base_score=float(objective_of(objective, accuracy, auroc)[0]),
            candidate_scores=[],
            complete=False,
            seconds=time.perf_counter() - start,
            num_heads=layout.num_heads,
            method=method,
            candidates=candidates,
        )
        if save is not None:  # a search stopped before its first step still resumes, budget known
            save(result)
    else:
        result = replace(stored, budget=budget, complete=False)
        evaluator.set_removed(list(result.order))

    while result.steps < budget:
        if _stop_asked(should_stop):
            break
        step_start = time.perf_counter()
        chosen = None
        if candidates is not None:  # guided: the K best estimates, re-estimated every step
            chosen = distributed.from_main(
                lambda: _chosen(model, inputs, id_y, layout, result.order, objective, candidates)
            )
        try:
            acc_map, roc_map = candidate_maps(evaluator, scorer, layout.shape, should_stop, chosen)
        except Stopped:
            break
        candidates_map = objective_of(objective, acc_map, roc_map)
        layer, head = best_head(candidates_map)
        accuracy, auroc = scorer(evaluator.remove(layer, head)[None])
        seconds = time.perf_counter() - step_start
        with torch.inference_mode(False):  # results stay ordinary tensors outside this call
            candidates_map = candidates_map.clone()
        result.order.append((layer, head))
        result.scores.append(float(objective_of(objective, accuracy, auroc)[0]))
        result.accuracy.append(float(accuracy[0]))
        result.auroc.append(float(auroc[0]))
        result.candidate_scores.append(candidates_map)
        result.step_seconds.append(seconds)
        result.evaluated.append(int((~torch.isnan(candidates_map)).sum()))
        result.seconds += seconds
        result.complete = result.steps == budget
        if save is not None:
            save(result)
        if progress is None:
            continue
        with torch.inference_mode(False):  # the callback runs as if called from outside
            progress(
                GreedyStep(
                    step=result.steps - 1,
                    head=(layer, head),
                    score=result.scores[-1],
                    accuracy=result.accuracy[-1],
                    auroc=result.auroc[-1],
                    candidate_scores=candidates_map,
                    seconds=seconds,
                    elapsed=time.perf_counter() - start,
                    result=replace(
                        result,
                        order=list(result.order),
                        scores=list(result.scores),
                        accuracy=list(result.accuracy),
                        auroc=list(result.auroc),
                        candidate_scores=list(result.candidate_scores),
                        step_seconds=list(result.step_seconds),
                        evaluated=list(result.evaluated),
                    ),
                )
            )
    return result


#: items per forward and backward of the guided search's attribution
ATTRIBUTION_BATCH = 32


def guided_k(candidates: int | None, total: int) -> int | None:
    """The guided search's K, checked; None (the exact search) when it covers every head."""
    if candidates is None:
        return None
    if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 1:
        raise InputError(f"candidates must be a positive int (K), got {candidates!r}")
    return None if candidates >= total else candidates


def _chosen(
    model: nn.Module,
    inputs: torch.Tensor,
    id_y: torch.Tensor,
    layout: HeadLayout,
    removed: list[Head],
    objective: str,
    k: int,
) -> list[Head] | None:
    """The guided step's candidates: the K kept heads with the best estimated objective (every
    kept head without an estimate besides); None when they are all the kept heads."""
    from hydra_core.analysis.attribution import (
        estimated_objective,
        head_attribution,
        top_candidates,
    )

    keep = layout.all_kept()
    for layer, head in removed:
        keep[layer, head] = False
    if k >= int(keep.sum()):
        return None
    found = head_attribution(model, inputs, labels=id_y, keep=keep, batch_size=ATTRIBUTION_BATCH)
    estimates = estimated_objective(found, id_y, len(id_y), objective)
    return top_candidates(estimates, keep, k)


def single_head_importance(
    model: nn.Module,
    id_x: torch.Tensor,
    id_y: torch.Tensor,
    ood_x: torch.Tensor,
    *,
    batch_size: int = 256,
    cache: DiskCache | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, torch.Tensor | float]:
    """The effect of ablating each head alone: one greedy step's worth of evaluations (fast path);
    ``progress(heads scored, heads)`` as it goes (not for a result read from the cache).

    Returns:
        ``delta_accuracy``, ``delta_auroc``, ``delta_avg``: (L, H) float64 maps of the score with
        that head alone ablated minus the dense model's (NaN for heads a pruned model lacks);
        ``base_accuracy``, ``base_auroc``: the dense model's scores.
    """
    model, id_x, ood_x = model_and_inputs(model, id_x, ood_x, names=("id_x", "ood_x"))
    layout = _check_inputs(model, id_x, id_y, ood_x, batch_size)
    key = None
    if cache is not None:
        key = cache_key(
            GREEDY_VERSION, "single-head", model_fingerprint(model), id_x, id_y.long(), ood_x
        )
        stored = distributed.from_main(lambda: cache.load(IMPORTANCE_CACHE_KIND, key))
        if (
            isinstance(stored, dict)
            and {"delta_accuracy", "delta_auroc", "delta_avg"} <= stored.keys()
        ):
            return stored
    with torch.inference_mode():
        device, dtype = _device_and_dtype(model)
        inputs = torch.cat([id_x, ood_x])
        inputs = inputs.to(device, dtype if inputs.is_floating_point() else None)
        scorer = Scorer(id_y, len(id_x))
        evaluator = _fast_evaluator(model, inputs, batch_size)
        base_acc, base_roc = (float(v[0]) for v in scorer(evaluator.logits[None]))
        heads = layout.total_heads
        scored = None if progress is None else lambda done: progress(min(done, heads), heads)
        acc_map, roc_map = candidate_maps(evaluator, scorer, layout.shape, None, scored=scored)
    with torch.inference_mode(False):
        acc_map, roc_map = acc_map.clone(), roc_map.clone()
    result = {
        "delta_accuracy": acc_map - base_acc,
        "delta_auroc": roc_map - base_roc,
        "delta_avg": (acc_map + roc_map) / 2 - (base_acc + base_roc) / 2,
        "base_accuracy": base_acc,
        "base_auroc": base_roc,
    }
    if cache is not None and distributed.is_main():
        cache.save(IMPORTANCE_CACHE_KIND, key, result)
    return result
