"""Ensemble members: the M head masks a Hydra ensemble is built from (paper 4.3, B.5).

Each way of making members is its own function, called directly by the app, the CLI and the
report:

- :func:`seed_sampled_members`: the normal way to get M different members from one ranking. Each
  member prunes ``budget`` heads drawn at random (its own seed) from the ``pool`` least useful
  heads of a ranking - the greedy circuit's (:func:`greedy_ranking`, Hydra (Circ)) or the Taylor
  global ranking (:func:`taylor_ranking`, Hydra (Taylor)). This is the paper's "48 heads pruned,
  drawn out of the 100 least useful" (Appendix B.5), and its finding that the pruning seed is the
  source of diversity that matters.
- :func:`circuit_member`: one circuit, the ``budget`` least useful heads of a ranking removed,
  named after the ranking (``CircAvg-24``, ``Taylor-24``).
- :func:`circuit_members`: Hydra (Circ) as the paper's method builds it (B.2 question 3, D.3):
  one circuit per criterion (CircAcc, CircOOD, CircAvg), each from its own greedy search. The
  seed-sampled members of one circuit's ranking are the paper's B.5 ablation, where "only one
  circuit [is] available (CircAvg)".
- :func:`identical_members`: M copies of one member - members that do not differ, for the
  "no pruning-seed diversity" rows of the paper's Table 9 and nothing else.
- :func:`taylor_member`: layer-wise Taylor pruning
  (:func:`~hydra_core.analysis.taylor.taylor_prune`, ``per_layer`` heads removed in each layer,
  gradients recomputed after each layer).
- :func:`cahp_members`: complementary heads (:func:`~hydra_core.analysis.cahp.cahp_select`, the
  official variant or accuracy-knee), one clustering seed per member; CAHP chooses how many heads
  each member keeps.
- :func:`manual_members`: masks drawn by hand, as (L, H) bool tensors or :class:`MemberMask`
  objects. The members of a mask file (docs/cli.md, Mask files) come from
  :func:`~hydra_core.masks.load_masks`.

Members must differ: the functions that make several members refuse identical masks with a message
that says so, unless the caller asks for them (``allow_identical=True``). :func:`check_members`
runs the same checks on any list, e.g. members gathered from several strategies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from hydra_core.analysis.inputs import SearchInputs
from hydra_core.cache import DiskCache
from hydra_core.errors import InputError, choice
from hydra_core.masks import (
    MemberMask,
    jaccard_matrix,
    mask_from_ranking,
    per_layer_counts,
    seed_sampled_masks,
)
from hydra_core.models.adapter import HeadLayout, as_keep_mask, head_label, head_layout
from hydra_core.types import Head, Progress

#: What the greedy objectives are called in circuit names (paper D.1.2: CircAcc, CircOOD, CircAvg).
CIRCUIT_NAMES = {"acc": "CircAcc", "ood": "CircOOD", "avg": "CircAvg"}
#: The name of the Taylor global ranking, in member names (Taylor-24, Taylor seed 0).
TAYLOR_NAME = "Taylor"


# --- rankings: every head, least useful first ---------------------------------------------------


def greedy_ranking(
    model: nn.Module,
    inputs: SearchInputs,
    *,
    objective: str,
    budget: int,
    cache: DiskCache | None = None,
    batch_size: int = 256,
    progress: Progress | None = None,
    ood_aggregate: str = "pooled",
    candidates: int | None = None,
) -> list[Head]:
    """Every head, least useful first, from a greedy Headmap search of ``budget`` steps (paper
    Algorithm 1); members built from it are named ``CIRCUIT_NAMES[objective]``.

    Args:
        model: the source model (a timm ViT or a Hugging Face text classifier); never modified.
        inputs: search-split tensors (never the report split).
        objective: the greedy objective, ``"acc"``, ``"ood"`` or ``"avg"``.
        budget: heads the search removes; the rest of the ranking follows the last step's scores.
        cache: the search is read from and saved to it.
        progress: ``progress(done, total)`` after each search step.
        ood_aggregate: how the search AUROC combines the OOD search sets (``pooled``, ``mean``,
            ``min``; :func:`~hydra_core.analysis.greedy.greedy_circuit`).
        candidates: the guided search's K (None: the exact search).
    """
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
        ood_sets=inputs.ood_sets,
        ood_aggregate=ood_aggregate,
        candidates=candidates,
    )
    return result.ranking()


def taylor_ranking(
    model: nn.Module, inputs: SearchInputs, *, samples: int | None = 512, batch_size: int = 256
) -> list[Head]:
    """Every head by Taylor score across all layers, least important first (paper B.2: "Taylor
    pruning applied globally"); members built from it are named :data:`TAYLOR_NAME`.

    Args:
        model: the source model; never modified.
        inputs: search-split tensors; the scores use the first ``samples`` ID inputs (None: all).
    """
    from hydra_core.analysis.taylor import taylor_global_ranking, taylor_scores

    scores = taylor_scores(
        model, inputs.id_x[:samples], inputs.id_y[:samples], batch_size=batch_size
    )
    return taylor_global_ranking(scores)


# --- strategies ---------------------------------------------------------------------------------


def circuit_member(
    ranking: Sequence[Head],
    layout: HeadLayout,
    *,
    budget: int,
    ranking_name: str,
    ranking_info: dict | None = None,
) -> MemberMask:
    """The circuit left when the ``budget`` least useful heads of ``ranking`` are removed, named
    after its ranking: ``f"{ranking_name}-{budget}"`` (``CircAvg-24``, ``Taylor-24``).

    Args:
        ranking: every head, least useful first (:func:`greedy_ranking`, :func:`taylor_ranking`).
        layout: the model's heads (:func:`~hydra_core.models.adapter.head_layout`).
        budget: heads removed, between 1 and the number of heads - 1.
        ranking_name: what the ranking is called (``CIRCUIT_NAMES[objective]``,
            :data:`TAYLOR_NAME`).
        ranking_info: how the ranking was made (:func:`ranking_provenance`), for the member's
            provenance in a mask file.
    """
    budget = _budget(budget, layout)
    keep = mask_from_ranking(ranking, budget, layout)
    return MemberMask(
        f"{ranking_name}-{budget}",
        f"{budget} least useful heads of the {ranking_name} ranking removed",
        keep,
        provenance("circuit", {"budget": budget}, ranking_name, ranking_info),
    )


#: the criteria of Hydra (Circ)'s circuits, one member each (paper B.2 question 3)
CIRCUIT_OBJECTIVES = ("acc", "ood", "avg")


def circuit_members(
    rankings: Mapping[str, Sequence[Head]],
    layout: HeadLayout,
    *,
    budget: int,
    allow_identical: bool = False,
    ranking_info: Mapping[str, dict] | None = None,
) -> list[MemberMask]:
    """One member per greedy criterion: the circuit of each ranking, ``budget`` heads removed,
    named ``CircAcc-24``, ``CircOOD-24``, ``CircAvg-24`` (paper B.2 question 3: "we extract three
    different circuits, each optimized for a different criterion").

    Args:
        rankings: objective (``"acc"``, ``"ood"``, ``"avg"``) -> its greedy ranking
            (:func:`greedy_ranking`), two or more.
        layout, budget: as :func:`circuit_member`.
        allow_identical: accept two criteria that found the same circuit (otherwise refused:
            members must differ).
        ranking_info: objective -> how its ranking was made (:func:`ranking_provenance`), for
            each member's provenance in a mask file.
    """
    unknown = sorted(set(rankings) - set(CIRCUIT_NAMES))
    if unknown:
        raise ValueError(
            f"unknown circuit criteria {unknown}; expected some of {', '.join(CIRCUIT_NAMES)}"
        )
    if len(rankings) < 2:
        raise ValueError(
            f"Hydra (Circ) needs circuits of two or more criteria, got {len(rankings)}"
        )
    info = ranking_info or {}
    members = [
        circuit_member(
            rankings[o],
            layout,
            budget=budget,
            ranking_name=CIRCUIT_NAMES[o],
            ranking_info=info.get(o),
        )
        for o in CIRCUIT_NAMES
        if o in rankings
    ]
    pairs = identical_pairs(members)
    if pairs and not allow_identical:
        listing = ", ".join(f"{a} = {b}" for a, b in pairs)
        raise InputError(
            f"the criteria found the same circuit ({listing}), so those members would be "
            "identical; search on more items or remove more heads (a larger budget), or accept "
            f"identical members ({choice('allow_identical')})"
        )
    check_members(members, layout, allow_identical=allow_identical)
    return members


def identical_members(member: MemberMask, m: int) -> list[MemberMask]:
    """``m`` copies of ``member`` (named ``"<name> copy i"``): the identical-members ablation of
    the paper's Table 9, where members do not differ by their pruning seed. Nothing else should
    build an ensemble of equal masks.

    Args:
        member: the member to copy, e.g. a :func:`circuit_member`.
        m: number of copies, at least 1.
    """
    return [
        MemberMask(
            f"{member.name} copy {i}",
            f"{member.source} (identical copy {i})",
            member.keep,
            {**member.provenance, "identical_copy": i},
        )
        for i in range(_check_count(m))
    ]


def seed_sampled_members(
    ranking: Sequence[Head],
    layout: HeadLayout,
    *,
    budget: int,
    seeds: Sequence[int],
    ranking_name: str,
    pool: int | None = None,
    allow_identical: bool = False,
    ranking_info: dict | None = None,
) -> list[MemberMask]:
    """One member per seed, each pruning ``budget`` heads drawn from the ``pool`` least useful
    heads of ``ranking``, named ``f"{ranking_name} seed {seed}"``.

    Args:
        ranking: every head, least useful first (:func:`greedy_ranking`, :func:`taylor_ranking`).
        layout: the model's heads (:func:`~hydra_core.models.adapter.head_layout`).
        budget: heads each member prunes, between 1 and the number of heads - 1.
        seeds: one pruning seed per member, all different.
        ranking_name: what the ranking is called (``CIRCUIT_NAMES[objective]``,
            :data:`TAYLOR_NAME`).
        pool: the draw is from this many least useful heads (default: twice the budget, at most
            every head; the paper draws 48 of 100).
        allow_identical: accept members with equal masks (a pool too small for the seeds to
            matter), for ablations only.
        ranking_info: how the ranking was made (:func:`ranking_provenance`), for the members'
            provenance in a mask file.
    """
    budget = _budget(budget, layout)
    seeds = _distinct_seeds(seeds)
    pool = min(2 * budget, len(ranking)) if pool is None else pool
    masks = seed_sampled_masks(ranking, prune=budget, pool=pool, seeds=seeds, layout=layout)
    members = [
        MemberMask(
            f"{ranking_name} seed {s}",
            f"{budget} of the {pool} least useful heads ({ranking_name} ranking) pruned, seed {s}",
            keep,
            provenance(
                "seed-sampling",
                {"budget": budget, "pool": pool, "seed": s},
                ranking_name,
                ranking_info,
            ),
        )
        for s, keep in zip(seeds, masks, strict=True)
    ]
    check_members(members, layout, allow_identical=allow_identical)
    return members


def taylor_member(
    model: nn.Module,
    inputs: SearchInputs,
    *,
    budget: int | None = None,
    per_layer: int | Sequence[int] | None = None,
    samples: int | None = 512,
    batch_size: int = 256,
    search: dict | None = None,
) -> MemberMask:
    """Layer-wise Taylor pruning (paper D.1.1): ``per_layer`` heads removed in each layer, named
    ``Taylor-<heads removed>``.

    Args:
        model: the source model; never modified.
        inputs: search-split tensors; the scores use the first ``samples`` ID inputs (None: all).
        budget: heads removed in all, split evenly over the layers (give this or ``per_layer``).
        per_layer: heads removed in each layer, one number or one per layer.
        search: the search data (:func:`search_provenance`), for the member's provenance.
    """
    from hydra_core.analysis.taylor import taylor_prune

    layout = head_layout(model)
    if (budget is None) == (per_layer is None):
        raise ValueError(
            "taylor_member needs budget= (heads removed in all) or per_layer= (heads removed in "
            f"each layer), exactly one of them; got budget={budget!r}, per_layer={per_layer!r}"
        )
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
    counts = per_layer if isinstance(per_layer, int) else "/".join(str(int(r)) for r in per_layer)
    member = MemberMask(
        f"{TAYLOR_NAME}-{len(result.pruned)}",
        f"layer-wise Taylor pruning, {counts} heads per layer ({len(x)} ID search samples)",
        result.keep,
        provenance(
            "taylor",
            {"per_layer": per_layer if isinstance(per_layer, int) else [int(r) for r in per_layer]},
            TAYLOR_NAME,
            ranking_provenance("taylor", samples=len(x), search=search),
        ),
    )
    check_members([member], layout)
    return member


def cahp_members(
    model: nn.Module,
    inputs: SearchInputs,
    *,
    seeds: Sequence[int],
    variant: str = "official",
    degree: int | None = None,
    representative: str | None = None,
    k_grid: Sequence[int] | None = None,
    batch_size: int = 256,
    progress: Progress | None = None,
    allow_identical: bool = False,
    search: dict | None = None,
) -> list[MemberMask]:
    """One CAHP selection per seed, named ``CAHP <variant> seed <seed>``; CAHP chooses how many
    heads each member keeps (the clustering, and with it the knee, depends on the seed).

    Args:
        model: the source model; never modified.
        inputs: search-split tensors: the ID inputs and labels give everything CAHP reads.
        seeds: one clustering (and t-SNE) seed per member, all different
            (:func:`~hydra_core.analysis.cahp.cahp_seeds` gives the variant's defaults).
        variant, degree, representative, k_grid: as :func:`~hydra_core.analysis.cahp.cahp_select`
            takes them (None: the variant's default).
        progress: ``progress(done, total)`` over the selections of every seed.
        allow_identical: accept seeds that select the same heads, for ablations only.
        search: the search data (:func:`search_provenance`), for the members' provenance.
    """
    from hydra_core.analysis.cahp import cahp_select

    refuse_towers_for_cahp(head_layout(model))
    seeds = _distinct_seeds(seeds)
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
            variant=variant,
            seed=seed,
            degree=degree,
            representative=representative,
            k_grid=k_grid,
            batch_size=batch_size,
            progress=report,
        )
        members.append(
            MemberMask(
                f"CAHP {variant} seed {seed}",
                result.describe(),
                result.keep,
                provenance(
                    "cahp",
                    {
                        "variant": result.variant,
                        "degree": result.degree,
                        "seed": seed,
                        "representative": result.representative,
                        "k_grid": None if k_grid is None else [int(k) for k in k_grid],
                        "knee_k": int(result.knee_k),
                    },
                    "CAHP",
                    ranking_provenance("cahp", samples=len(inputs.id_x), search=search),
                ),
            )
        )
    check_members(members, head_layout(model), allow_identical=allow_identical)
    return members


def manual_members(
    masks: Sequence[torch.Tensor | MemberMask],
    layout: HeadLayout,
    *,
    allow_identical: bool = False,
) -> list[MemberMask]:
    """Masks drawn by hand, validated against the model.

    Args:
        masks: (L, H) bool masks, True = kept (named ``member i``), or :class:`MemberMask` objects
            (their names kept).
        layout: the model's heads; every mask must fit it.
        allow_identical: accept members with equal masks, for ablations only.
    """
    members = []
    for i, mask in enumerate(masks):
        if isinstance(mask, MemberMask):
            keep = as_keep_mask(layout, mask.keep)
            members.append(MemberMask(mask.name, mask.source, keep, mask.provenance))
        else:
            keep = as_keep_mask(layout, mask)
            members.append(MemberMask(f"member {i}", "drawn by hand", keep, MANUAL))
    check_members(members, layout, allow_identical=allow_identical)
    return members


def member_seeds(m: int, seeds: Sequence[int] | None = None) -> list[int]:
    """One seed per member: ``seeds`` if given (checked to be ``m`` different numbers), else
    0, 1, ..., m - 1. Callers that take M and seeds separately (the CLI) check them with this
    before any search runs."""
    m = _check_count(m)
    seeds = list(range(m)) if seeds is None else list(seeds)
    if len(seeds) != m:
        raise ValueError(f"{len(seeds)} seeds were given for m={m} members; give one per member")
    return _distinct_seeds(seeds)


# --- provenance: how a member was made, as its mask file records it -----------------------------

#: the provenance of a member drawn by hand
MANUAL = {"strategy": "manual"}


def search_provenance(benchmark, inputs: SearchInputs) -> dict:
    """The search data a ranking was computed on: the protocol, the ID search set and the
    number of its items used, each OOD search set and its number of items, and the size of the
    pooled OOD set the search scores (a :class:`~hydra_core.data.benchmark.Benchmark` and the
    :class:`SearchInputs` made from it)."""
    return {
        "protocol": benchmark.protocol,
        "id": {"name": benchmark.id_search.name, "n": len(inputs.id_x)},
        "ood": {name: len(x) for name, x in inputs.ood_per_set.items()},
        "ood_pooled": len(inputs.ood_x),
    }


def ranking_provenance(
    method: str,
    *,
    objective: str | None = None,
    budget: int | None = None,
    steps: int | None = None,
    samples: int | None = None,
    resamples: int | None = None,
    candidates: int | None = None,
    search: dict | None = None,
) -> dict:
    """How a ranking was made: ``method`` ("greedy", "taylor", "cahp", "stability"), a greedy
    search's objective, budget and the steps it made (and ``candidates``, the guided search's
    K), the ID samples of a gradient or clustering method, the bootstrap resamples of a
    stability ranking, and the search data (:func:`search_provenance`); what is not given is
    left out."""
    found = {
        "method": method,
        "objective": objective,
        "budget": budget,
        "steps": steps,
        "candidates": candidates,
        "samples": samples,
        "resamples": resamples,
        "search": search,
    }
    return {k: v for k, v in found.items() if v is not None}


def stable_ranking(found, tiebreak=(), search: dict | None = None) -> tuple[str, list, dict]:
    """A stability run (:class:`~hydra_core.analysis.stability.StabilityResult`) as a ranking to
    build members from: its name (``CircAvg-stable``), every head most often removed by the
    resamples first (ties in ``tiebreak`` order, e.g. the search's own ranking) and its
    provenance (:func:`ranking_provenance`)."""
    info = ranking_provenance(
        "stability",
        objective=found.objective,
        budget=found.budget,
        steps=found.steps,
        resamples=found.resamples,
        search=search,
    )
    return f"{CIRCUIT_NAMES[found.objective]}-stable", found.ranking(tiebreak), info


def provenance(
    strategy: str, parameters: dict, ranking_name: str, ranking: dict | None = None
) -> dict:
    """A member's provenance block: the strategy, its parameters and the ranking it drew from."""
    return {
        "strategy": strategy,
        "parameters": parameters,
        "ranking": {"name": ranking_name, **(ranking or {})},
    }


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
            "members add nothing to an ensemble; use other seeds or a larger pool, or accept them "
            f"for the identical-members ablation (paper Table 9) with {choice('allow_identical')}"
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


def refuse_towers_for_cahp(layout: HeadLayout) -> None:
    """CAHP describes each head by its response to the labelled ID inputs; in a joint layout
    (CLIP's both towers) the text tower's heads see only the prompts, so it is refused there."""
    if len(layout.input_layers) < layout.num_layers:
        raise InputError(
            f"CAHP describes each head by its response to the ID inputs, but this model's head "
            f"layout ({layout.describe()}) holds heads that see other inputs (the text tower's "
            "see the prompts): load the model with towers 'image' (--towers image; Setup: "
            "Towers) for CAHP"
        )


def _check_count(m: int) -> int:
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"m must be a positive number of members, got {m!r}")
    return m


def _distinct_seeds(seeds: Sequence[int]) -> list[int]:
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("no seeds: give one seed per member")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must differ so that members differ, got {seeds}")
    return seeds


def _budget(budget: int, layout: HeadLayout) -> int:
    total = layout.total_heads
    if isinstance(budget, bool) or not isinstance(budget, int) or not 0 < budget < total:
        raise ValueError(
            f"{choice('budget')} must be between 1 and {total - 1} (the model has {total} "
            f"heads; a member keeps at least one), got {budget!r}"
        )
    return budget
