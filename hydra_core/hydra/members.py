"""Ensemble members: the M head masks a Hydra ensemble is built from (paper 4.3, B.5).

One entry point, :func:`build_member_masks`, dispatches on a strategy name:

- ``"seed-sampling"``: the normal way to get M different members from one ranking. Each member
  prunes ``budget`` heads drawn at random (its own seed) from the ``pool`` least useful heads of a
  ranking - the greedy circuit's (``ranking_source="greedy"``, Hydra (Circ)) or the Taylor global
  ranking (``"taylor"``). This is the paper's "48 heads pruned, drawn out of the 100 least useful"
  (Appendix B.5), and its finding that the pruning seed is the source of diversity that matters.
- ``"circuit"``: one circuit, the ``budget`` least useful heads of the greedy ranking removed; a
  single member (m = 1).
- ``"identical-circuit"``: M copies of that one circuit - members that do not differ, for the
  "no pruning-seed diversity" rows of the paper's Table 9 and nothing else.
- ``"taylor"``: m = 1: layer-wise Taylor pruning (:func:`~hydra_core.analysis.taylor.taylor_prune`,
  ``per_layer`` heads removed in each layer, gradients recomputed after each layer); m > 1: seed
  sampling over the Taylor global ranking, Hydra (Taylor).
- ``"cahp"``: complementary heads (:func:`~hydra_core.analysis.cahp.cahp_select`), one k-medoids
  seed per member; CAHP chooses how many heads each member keeps.
- ``"file"``: the members of a mask file (SPEC section 9), validated against the model.
- ``"manual"``: masks drawn by hand, as (L, H) bool tensors or :class:`MemberMask` objects.

Members must differ: identical masks are refused with a message that says so, unless the caller
asks for them (``allow_identical=True``, implied by ``"identical-circuit"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from hydra_core.analysis.inputs import SearchInputs
from hydra_core.cache import DiskCache
from hydra_core.masks import (
    MemberMask,
    jaccard_matrix,
    load_masks,
    mask_from_ranking,
    per_layer_counts,
    seed_sampled_masks,
)
from hydra_core.models.adapter import HeadLayout, as_keep_mask, head_label, head_layout
from hydra_core.types import Head, Progress

STRATEGIES = ("seed-sampling", "circuit", "identical-circuit", "taylor", "cahp", "file", "manual")
RANKING_SOURCES = ("greedy", "taylor")
#: What the greedy objectives are called in circuit names (paper D.1.2: CircAcc, CircOOD, CircAvg).
CIRCUIT_NAMES = {"acc": "CircAcc", "ood": "CircOOD", "avg": "CircAvg"}


def build_member_masks(
    strategy: str,
    *,
    model: nn.Module,
    inputs: SearchInputs | None = None,
    m: int | None = 3,
    budget: int | None = None,
    pool: int | None = None,
    seeds: Sequence[int] | None = None,
    ranking: Sequence[Head] | None = None,
    ranking_source: str = "greedy",
    objective: str = "avg",
    per_layer: int | Sequence[int] | None = None,
    taylor_samples: int | None = 512,
    cahp_degree: int = 3,
    cahp_k_grid: Sequence[int] | None = None,
    path: str | Path | None = None,
    identity: dict | None = None,
    masks: Sequence[torch.Tensor | MemberMask] | None = None,
    names: Sequence[str] | None = None,
    allow_identical: bool = False,
    cache: DiskCache | None = None,
    batch_size: int = 256,
    progress: Progress | None = None,
) -> list[MemberMask]:
    """M member masks from one of :data:`STRATEGIES` (see the module docstring).

    Args:
        strategy: the strategy name.
        model: the source model (a timm ViT); never modified.
        inputs: search-split tensors (greedy, Taylor and CAHP score heads on them, never on the
            report split).
        m: number of members (``"file"``: None takes every member of the file).
        budget: heads each member prunes (``circuit``, ``seed-sampling``, ``taylor``).
        pool: seed sampling draws from this many least useful heads (default: twice the budget,
            at most every head; the paper draws 48 of 100).
        seeds: one per member (default 0, 1, ..., m - 1): pruning seeds for seed sampling,
            k-medoids seeds for CAHP.
        ranking: a ranking to use instead of searching (least useful first, as
            :meth:`~hydra_core.analysis.greedy.GreedyResult.ranking` gives it).
        ranking_source: ``"greedy"`` or ``"taylor"``: where seed sampling's ranking comes from.
        objective: the greedy objective, ``"acc"``, ``"ood"`` or ``"avg"``.
        per_layer: ``taylor`` with m = 1: heads removed per layer, one number or one per layer
            (default: ``budget`` split evenly over the layers).
        taylor_samples: ID search images the Taylor scores use (None: all).
        cahp_degree, cahp_k_grid: CAHP's polynomial degree and the head counts it tries.
        path, identity: ``file``: the mask file and the loaded model's identity block
            (:func:`~hydra_core.masks.model_identity`), checked against the file's.
        masks: ``manual``: the masks.
        names: member names (default: from the strategy).
        allow_identical: accept members with equal masks (the identical-members ablation).
        cache: greedy searches are read from and saved to it.
        progress: ``progress(done, total)`` during a greedy search or the CAHP curve.
    """
    if strategy not in STRATEGIES:
        raise ValueError(
            f"unknown member strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}"
        )
    layout = head_layout(model)
    if strategy != "file":
        m = _check_count(m)
    seeds = _seeds(seeds, m) if strategy in ("seed-sampling", "taylor", "cahp") else seeds
    search = dict(inputs=inputs, cache=cache, batch_size=batch_size, progress=progress)
    if strategy == "seed-sampling":
        if ranking is None:
            ranking = _ranking(
                ranking_source,
                model,
                budget=budget,
                objective=objective,
                taylor_samples=taylor_samples,
                **search,
            )
        base = CIRCUIT_NAMES[objective] if ranking_source == "greedy" else "Taylor"
        members = seed_sampled_members(
            ranking, layout, budget=_budget(budget, layout), pool=pool, seeds=seeds, base=base
        )
    elif strategy in ("circuit", "identical-circuit"):
        if strategy == "circuit" and m != 1:
            raise ValueError(
                f"the 'circuit' strategy gives one circuit, so {m} members would be identical; "
                "use 'seed-sampling' for members that differ, or 'identical-circuit' for the "
                "identical-members ablation (paper Table 9)"
            )
        budget = _budget(budget, layout)
        if ranking is None:
            ranking = _ranking("greedy", model, budget=budget, objective=objective, **search)
        circuit = circuit_member(
            ranking, layout, budget=budget, name=f"{CIRCUIT_NAMES[objective]}-{budget}"
        )
        members = (
            [circuit]
            if m == 1
            else [
                MemberMask(
                    f"{circuit.name} copy {i}",
                    f"{circuit.source} (identical copy {i})",
                    circuit.keep,
                )
                for i in range(m)
            ]
        )
        allow_identical = allow_identical or strategy == "identical-circuit"
    elif strategy == "taylor":
        if m == 1:
            members = [
                taylor_member(
                    model,
                    _need(inputs, strategy),
                    budget=budget,
                    per_layer=per_layer,
                    samples=taylor_samples,
                    batch_size=batch_size,
                )
            ]
        else:
            if ranking is None:
                ranking = _ranking("taylor", model, taylor_samples=taylor_samples, **search)
            members = seed_sampled_members(
                ranking,
                layout,
                budget=_budget(budget, layout),
                pool=pool,
                seeds=seeds,
                base="Taylor",
            )
    elif strategy == "cahp":
        members = cahp_members(
            model,
            _need(inputs, strategy),
            seeds=seeds,
            degree=cahp_degree,
            k_grid=cahp_k_grid,
            batch_size=batch_size,
            progress=progress,
        )
    elif strategy == "file":
        if path is None:
            raise ValueError("the 'file' strategy needs path= (a hydra-masks JSON file)")
        members = load_masks(path, layout, identity)
        if m is not None and len(members) != m:
            raise ValueError(
                f"{path} holds {len(members)} members, but m={m} were asked for "
                "(pass m=None to take them all)"
            )
    else:
        if masks is None:
            raise ValueError("the 'manual' strategy needs masks= (one (L, H) bool mask per member)")
        members = manual_members(masks, layout)
        if len(members) != m:
            raise ValueError(f"{len(members)} masks were given for m={m} members")
    if names is not None:
        if len(names) != len(members) or len(set(names)) != len(names):
            raise ValueError(f"names must be {len(members)} distinct strings, got {list(names)}")
        members = [MemberMask(n, mm.source, mm.keep) for n, mm in zip(names, members, strict=True)]
    check_members(members, layout, allow_identical=allow_identical)
    return members


# --- strategies, usable on their own ------------------------------------------------------------


def circuit_member(
    ranking: Sequence[Head], layout: HeadLayout, *, budget: int, name: str = "circuit"
) -> MemberMask:
    """The circuit left when the ``budget`` least useful heads of ``ranking`` are removed."""
    keep = mask_from_ranking(ranking, budget, layout)
    return MemberMask(name, f"{budget} least useful heads of the ranking removed", keep)


def seed_sampled_members(
    ranking: Sequence[Head],
    layout: HeadLayout,
    *,
    budget: int,
    pool: int | None,
    seeds: Sequence[int],
    base: str = "member",
) -> list[MemberMask]:
    """One member per seed, each pruning ``budget`` heads drawn from the ``pool`` least useful."""
    pool = min(2 * budget, len(ranking)) if pool is None else pool
    masks = seed_sampled_masks(ranking, prune=budget, pool=pool, seeds=seeds, layout=layout)
    return [
        MemberMask(
            f"{base} seed {s}",
            f"{budget} of the {pool} least useful heads ({base} ranking) pruned, seed {s}",
            keep,
        )
        for s, keep in zip(seeds, masks, strict=True)
    ]


def taylor_member(
    model: nn.Module,
    inputs: SearchInputs,
    *,
    budget: int | None = None,
    per_layer: int | Sequence[int] | None = None,
    samples: int | None = 512,
    batch_size: int = 256,
) -> MemberMask:
    """Layer-wise Taylor pruning (paper D.1.1): ``per_layer`` heads removed in each layer."""
    from hydra_core.analysis.taylor import taylor_prune

    layout = head_layout(model)
    if per_layer is None:
        budget = _budget(budget, layout)
        if budget % layout.num_layers:
            raise ValueError(
                f"a budget of {budget} heads does not split evenly over {layout.num_layers} "
                "layers; pass per_layer (one number per layer) for layer-wise Taylor pruning"
            )
        per_layer = budget // layout.num_layers
    x, y = inputs.id_x[:samples], inputs.id_y[:samples]
    result = taylor_prune(model, x, y, heads_to_prune_per_layer=per_layer, batch_size=batch_size)
    removed = len(result.pruned)
    counts = per_layer if isinstance(per_layer, int) else "/".join(str(int(r)) for r in per_layer)
    return MemberMask(
        f"Taylor-{removed}",
        f"layer-wise Taylor pruning, {counts} heads per layer ({len(x)} ID search images)",
        result.keep,
    )


def taylor_ranking(
    model: nn.Module, inputs: SearchInputs, *, samples: int | None = 512, batch_size: int = 256
) -> list[Head]:
    """Every head by Taylor score across all layers, least important first (paper B.2: "Taylor
    pruning applied globally")."""
    from hydra_core.analysis.taylor import taylor_global_ranking, taylor_scores

    scores = taylor_scores(
        model, inputs.id_x[:samples], inputs.id_y[:samples], batch_size=batch_size
    )
    return taylor_global_ranking(scores)


def cahp_members(
    model: nn.Module,
    inputs: SearchInputs,
    *,
    seeds: Sequence[int],
    degree: int = 3,
    k_grid: Sequence[int] | None = None,
    batch_size: int = 256,
    progress: Progress | None = None,
) -> list[MemberMask]:
    """One CAHP selection per k-medoids seed (the profiles are computed once per call of
    :func:`cahp_select`; the clustering and the accuracy curve depend on the seed)."""
    from hydra_core.analysis.cahp import cahp_select

    members = []
    for i, seed in enumerate(seeds):
        report = (
            None
            if progress is None
            else (lambda done, total, i=i: progress(i * total + done, len(seeds) * total))
        )
        result = cahp_select(
            model,
            inputs.id_x,
            inputs.id_y,
            degree=degree,
            k_grid=k_grid,
            seed=seed,
            batch_size=batch_size,
            progress=report,
        )
        members.append(
            MemberMask(
                f"CAHP seed {seed}",
                f"CAHP, knee at {result.knee_k} heads, degree {degree}, k-medoids seed {seed}",
                result.keep,
            )
        )
    return members


def manual_members(
    masks: Sequence[torch.Tensor | MemberMask], layout: HeadLayout
) -> list[MemberMask]:
    """Masks drawn by hand, validated against the model."""
    members = []
    for i, mask in enumerate(masks):
        if isinstance(mask, MemberMask):
            members.append(MemberMask(mask.name, mask.source, as_keep_mask(layout, mask.keep)))
        else:
            members.append(MemberMask(f"member {i}", "drawn by hand", as_keep_mask(layout, mask)))
    return members


# --- checks and overlap -------------------------------------------------------------------------


def check_members(
    members: Sequence[MemberMask], layout: HeadLayout, *, allow_identical: bool = False
) -> None:
    """Refuse empty lists, masks that do not fit the model, members that keep no head, duplicate
    names, and (unless ``allow_identical``) members with the same mask."""
    if not members:
        raise ValueError("no members: an ensemble needs at least one member mask")
    names = [mm.name for mm in members]
    if len(set(names)) != len(names):
        raise ValueError(f"member names must differ, got {names}")
    for mm in members:
        as_keep_mask(layout, mm.keep)
        if not mm.keep.any():
            raise ValueError(f"member {mm.name!r} keeps no head at all")
    pairs = identical_pairs(members)
    if pairs and not allow_identical:
        listing = ", ".join(f"{a!r} = {b!r}" for a, b in pairs)
        raise ValueError(
            f"members must differ, but these keep exactly the same heads: {listing}. Identical "
            "members add nothing to an ensemble; use other seeds or a larger pool, or pass "
            "allow_identical=True for the identical-members ablation (paper Table 9)"
        )


def identical_pairs(members: Sequence[MemberMask]) -> list[tuple[str, str]]:
    """Names of every pair of members (i < j) whose masks are equal."""
    return [
        (a.name, b.name)
        for i, a in enumerate(members)
        for b in members[i + 1 :]
        if torch.equal(a.keep, b.keep)
    ]


def member_overlap(members: Sequence[MemberMask]) -> dict:
    """How much the members share.

    Returns:
        ``jaccard``: pairwise Jaccard similarity of the kept-head sets (DataFrame, 1 = identical);
        ``per_layer``: kept heads per layer and member (DataFrame with a total row);
        ``mean_pairwise_jaccard``: the mean over pairs i < j (NaN for one member);
        ``kept``: heads kept per member; ``kept_by_all`` / ``kept_by_any``: the heads every member
        keeps / at least one keeps, as labels; ``identical_pairs``: pairs with equal masks.
    """
    if not members:
        raise ValueError("no members to compare")
    jaccard = jaccard_matrix(members)
    n = len(members)
    upper = jaccard.to_numpy()[np.triu_indices(n, 1)]
    stacked = torch.stack([mm.keep for mm in members])  # (M, L, H)
    return {
        "jaccard": jaccard,
        "per_layer": per_layer_counts(members),
        "mean_pairwise_jaccard": float(upper.mean()) if len(upper) else float("nan"),
        "kept": {mm.name: mm.kept for mm in members},
        "kept_by_all": [head_label(*h) for h in stacked.all(0).nonzero().tolist()],
        "kept_by_any": [head_label(*h) for h in stacked.any(0).nonzero().tolist()],
        "identical_pairs": identical_pairs(members),
    }


# --- helpers ------------------------------------------------------------------------------------


def _check_count(m: int | None) -> int:
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"m must be a positive number of members, got {m!r}")
    return m


def _seeds(seeds: Sequence[int] | None, m: int) -> list[int]:
    seeds = list(range(m)) if seeds is None else [int(s) for s in seeds]
    if len(seeds) != m:
        raise ValueError(f"{len(seeds)} seeds were given for m={m} members; give one per member")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must differ so that members differ, got {seeds}")
    return seeds


def _budget(budget: int | None, layout: HeadLayout) -> int:
    if budget is None:
        raise ValueError("budget= (heads each member prunes) is required for this strategy")
    total = layout.total_heads
    if isinstance(budget, bool) or not isinstance(budget, int) or not 0 < budget < total:
        raise ValueError(
            f"budget must be between 1 and {total - 1} (the model has {total} heads; "
            f"a member keeps at least one), got {budget!r}"
        )
    return budget


def _need(inputs: SearchInputs | None, strategy: str) -> SearchInputs:
    if inputs is None:
        raise ValueError(
            f"the {strategy!r} strategy scores heads on search data: pass inputs= "
            "(hydra_core.analysis.inputs.search_inputs)"
        )
    return inputs


def _ranking(
    source: str,
    model: nn.Module,
    *,
    inputs: SearchInputs | None,
    budget: int | None = None,
    objective: str = "avg",
    taylor_samples: int | None = 512,
    cache: DiskCache | None = None,
    batch_size: int = 256,
    progress: Progress | None = None,
) -> list[Head]:
    """A ranking of every head, least useful first, from a greedy search or Taylor scores."""
    if source not in RANKING_SOURCES:
        raise ValueError(
            f"ranking_source must be one of {', '.join(RANKING_SOURCES)}, got {source!r}"
        )
    inputs = _need(inputs, f"{source} ranking")
    if source == "taylor":
        return taylor_ranking(model, inputs, samples=taylor_samples, batch_size=batch_size)
    from hydra_core.analysis.greedy import greedy_circuit

    steps = _budget(budget, head_layout(model))
    report = None if progress is None else (lambda step: progress(step.step + 1, steps))
    result = greedy_circuit(
        model,
        inputs.id_x,
        inputs.id_y,
        inputs.ood_x,
        objective=objective,
        budget=steps,
        batch_size=batch_size,
        cache=cache,
        progress=report,
    )
    return result.ranking()
