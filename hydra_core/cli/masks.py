"""Commands that make member masks: masks (every strategy) and cahp (CAHP alone, with its curve)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import hydra_core.cli.options as options
from hydra_core.cli.common import (
    add_analysis_arguments,
    add_data_arguments,
    add_model_arguments,
    add_ood_aggregate_argument,
    add_output_arguments,
    command,
    input_paths,
    load_for_cli,
    prepare,
    progress_bar,
    write_csv,
    write_json,
    write_output,
)
from hydra_core.models.family import head_label

if TYPE_CHECKING:
    from hydra_core.analysis.inputs import SearchInputs
    from hydra_core.masks import MemberMask
    from hydra_core.types import Head

#: strategies that compute masks (a mask file or hand-drawn masks need no command)
COMPUTED_STRATEGIES = (
    "seed-sampling",
    "circuits",
    "circuit",
    "identical-circuit",
    "taylor",
    "cahp",
)


def _masks_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    add_data_arguments(p)
    add_ood_aggregate_argument(p)
    p.add_argument(
        "--strategy",
        default="seed-sampling",
        choices=COMPUTED_STRATEGIES,
        help="how the members are made (default: %(default)s; 'circuits': Hydra (Circ) as the "
        "paper's method, one circuit per criterion: CircAcc, CircOOD, CircAvg; 'seed-sampling' "
        "of the CircAvg ranking is its B.5 ablation)",
    )
    p.add_argument(
        "--m", type=options.positive_int, default=3, help="number of members (default: %(default)s)"
    )
    p.add_argument(
        "--budget",
        type=options.positive_int,
        default=24,
        help="heads each member prunes (default: %(default)s)",
    )
    p.add_argument(
        "--pool",
        type=options.positive_int,
        default=None,
        help="seed sampling draws from this many least useful heads (default: 2 x budget)",
    )
    p.add_argument(
        "--seeds",
        type=options.seed,
        nargs="+",
        default=None,
        help="one per member (default: 0..m-1)",
    )
    p.add_argument(
        "--objective",
        default="avg",
        choices=("acc", "ood", "avg"),
        help="greedy objective of the circuit ranking (default: %(default)s; a stability "
        "ranking has its file's objective)",
    )
    options.only_with(
        p,
        "--objective",
        "--strategy circuit or identical-circuit, or seed-sampling of --ranking-source greedy",
        _greedy_ranking,
    )
    options.add_candidates_argument(p)
    options.only_with(
        p,
        "--candidates",
        "a strategy whose members come from greedy searches (circuits, circuit, identical-circuit, "
        "or seed-sampling of --ranking-source greedy)",
        _searches,
    )
    p.add_argument(
        "--ranking-source",
        default="greedy",
        choices=("greedy", "taylor", "stability"),
        help="seed sampling's or a circuit's ranking (default: %(default)s; 'stability': the "
        "heads most often removed by the resamples of --stability FILE first)",
    )
    p.add_argument(
        "--stability",
        default=None,
        metavar="FILE",
        help="with --ranking-source stability: the stability_<objective>.json that "
        "search --stability wrote",
    )
    p.add_argument(
        "--per-layer",
        type=options.non_negative_int,
        nargs="+",
        default=None,
        help="taylor with --m 1: heads removed per layer (one number, or one per layer)",
    )
    p.add_argument(
        "--taylor-samples", type=options.positive_int, default=512, help="default: %(default)s"
    )
    _add_cahp_options(p, prefix="cahp-")
    p.add_argument(
        "--allow-identical",
        action="store_true",
        help="accept members with equal masks (identical-members ablation)",
    )
    add_output_arguments(p, "results/masks/members.json", what="mask file")
    from hydra_core.cli.export import add_masks_export

    add_masks_export(p)  # `masks export --to nnsight|plain`


def _greedy_ranking(args: argparse.Namespace) -> bool:
    """Whether the members come from the greedy ranking of --objective."""
    if args.ranking_source == "stability":
        return False  # the ranking is the stability file's, of its own objective
    if args.strategy in ("circuit", "identical-circuit"):
        return True
    return args.strategy == "seed-sampling" and args.ranking_source == "greedy"


def _searches(args: argparse.Namespace) -> bool:
    """Whether the members come from greedy searches (one per criterion, or --objective's)."""
    return args.strategy == "circuits" or _greedy_ranking(args)


@command("masks", _masks_arguments)
def _masks(args: argparse.Namespace) -> int:
    """Build M ensemble member masks (seed sampling, circuit, Taylor, CAHP), write a mask file."""
    from hydra_core.analysis.inputs import search_inputs
    from hydra_core.evaluate import resolve_device
    from hydra_core.hydra.members import member_overlap, search_provenance
    from hydra_core.masks import save_masks
    from hydra_core.outputs import check_result_file, data_identity

    loaded, benchmark = load_for_cli(args)
    out = check_result_file(  # another model's mask file is refused before any search
        args.out or "results/masks/members.json",
        model=loaded.identity(),
        overwrite=args.overwrite,
        reads=input_paths(args),
    )
    device = resolve_device(args.device)
    loaded.model.to(device)
    inputs = search_inputs(loaded.preprocess, benchmark).to(device)
    search = {
        **search_provenance(benchmark, inputs),
        "data": data_identity(benchmark, "search"),
    }
    members = _build_members(args, loaded, inputs, search)
    write_output(out, lambda tmp: save_masks(tmp, members, loaded.identity()))
    overlap = member_overlap(members)
    print("kept heads per layer:")
    print(overlap["per_layer"].to_string())
    if len(members) < 2:
        print(f"\none member keeps {len(overlap['kept_by_all'])} heads (overlap needs two members)")
    else:
        print("\nJaccard similarity of kept heads:")
        print(overlap["jaccard"].round(3).to_string())
        print(
            f"\nmean pairwise Jaccard {overlap['mean_pairwise_jaccard']:.3f}; "
            f"{len(overlap['kept_by_all'])} heads kept by every member, "
            f"{len(overlap['kept_by_any'])} by at least one"
        )
    print(f"wrote {out} ({len(members)} member{'s' if len(members) != 1 else ''})")
    return 0


def _stable_ranking(args: argparse.Namespace, loaded, search: dict):
    """(name, ranking, provenance) of ``--ranking-source stability``; None otherwise. Checks the
    file and that B and K stay within the removals its resamples made."""
    from hydra_core.cli.stability import read_stability_result
    from hydra_core.hydra.members import stable_ranking

    if args.ranking_source != "stability":
        if args.stability:
            raise ValueError("--stability is read with --ranking-source stability")
        return None
    if not args.stability:
        raise ValueError("--ranking-source stability needs --stability FILE (search --stability)")
    if args.strategy not in ("seed-sampling", "circuit"):
        raise ValueError(
            f"--ranking-source stability is for seed-sampling and circuit, not {args.strategy}"
        )
    found, tiebreak, made_on = read_stability_result(
        args.stability, loaded, data=search.get("data")
    )
    pool = args.pool or 2 * args.budget
    reach = args.budget if args.strategy == "circuit" else max(args.budget, pool)
    if reach > found.steps:
        asked = f"--budget {args.budget}" + (
            f" and a pool of {pool}" if args.strategy != "circuit" else ""
        )
        raise ValueError(
            f"{asked} reach past the {found.steps} removals the resamples of {args.stability} "
            f"made; run search --stability with --budget {reach}, or ask for fewer"
        )
    # the ranking's data is the stability file's, copied from it: never this run's sample sizes
    made = {"id": {"n": found.n_id}, "ood_pooled": found.n_ood, "from": args.stability}
    if made_on:
        made["data"] = made_on
    return stable_ranking(found, tiebreak, made)


def _build_members(
    args: argparse.Namespace, loaded, inputs: SearchInputs, search: dict
) -> list[MemberMask]:
    """The members ``--strategy`` asks for, each strategy calling its own function of members.py.

    ``taylor`` is layer-wise Taylor pruning for one member and seed sampling over the Taylor global
    ranking for more (Hydra (Taylor)); ``seed-sampling`` draws from the greedy ranking of
    ``--objective`` or, with ``--ranking-source taylor``, from the Taylor one. Arguments are checked
    before any search runs.
    """
    from hydra_core.analysis.cahp import cahp_seeds
    from hydra_core.analysis.greedy import guided_k
    from hydra_core.cache import DiskCache
    from hydra_core.hydra.members import (
        CIRCUIT_NAMES,
        CIRCUIT_OBJECTIVES,
        TAYLOR_NAME,
        cahp_members,
        circuit_member,
        circuit_members,
        greedy_ranking,
        identical_members,
        member_seeds,
        ranking_provenance,
        seed_sampled_members,
        taylor_member,
        taylor_ranking,
    )
    from hydra_core.models.adapter import head_layout

    model = loaded.model
    layout = head_layout(model)
    stable = _stable_ranking(args, loaded, search)  # refused before any search
    candidates = guided_k(args.candidates, layout.total_heads)  # K of every head: exact
    if args.m < 1:
        raise ValueError(f"--m must be a positive number of members, got {args.m}")
    per_layer = args.per_layer[0] if args.per_layer and len(args.per_layer) == 1 else args.per_layer
    if per_layer is not None and (args.strategy, args.m) != ("taylor", 1):
        raise ValueError("--per-layer is for layer-wise pruning: --strategy taylor with --m 1")

    def greedy(objective: str = args.objective) -> list[Head]:
        return greedy_ranking(
            model,
            inputs,
            objective=objective,
            budget=args.budget,
            cache=DiskCache(),
            batch_size=args.batch_size,
            progress=progress_bar(f"{CIRCUIT_NAMES[objective]} search"),
            ood_aggregate=args.ood_aggregate,
            candidates=candidates,
        )

    if args.strategy == "circuits":
        if args.m != len(CIRCUIT_OBJECTIVES):
            raise ValueError(
                f"the 'circuits' strategy makes one member per criterion (CircAcc, CircOOD, "
                f"CircAvg), so --m must be {len(CIRCUIT_OBJECTIVES)}, got {args.m}; use "
                "'seed-sampling' for another number of members"
            )
        rankings = {o: greedy(o) for o in CIRCUIT_OBJECTIVES}
        info = {
            o: ranking_provenance(
                "greedy",
                objective=o,
                budget=args.budget,
                steps=args.budget,
                candidates=candidates,
                search=search,
            )
            for o in CIRCUIT_OBJECTIVES
        }
        return circuit_members(
            rankings,
            layout,
            budget=args.budget,
            allow_identical=args.allow_identical,
            ranking_info=info,
        )
    if args.strategy == "taylor" and args.m == 1:
        member = taylor_member(
            model,
            inputs,
            budget=args.budget if per_layer is None else None,
            per_layer=per_layer,
            samples=args.taylor_samples,
            batch_size=args.batch_size,
            search=search,
        )
        return [member]
    # greedy_ranking runs the whole budget (or fails): the search made that many steps
    greedy_info = ranking_provenance(
        "greedy",
        objective=args.objective,
        budget=args.budget,
        steps=args.budget,
        candidates=candidates,
        search=search,
    )
    if args.ranking_source == "stability":
        name, ranking, info = stable
        if args.strategy == "circuit":
            return [
                circuit_member(
                    ranking, layout, budget=args.budget, ranking_name=name, ranking_info=info
                )
            ]
        return seed_sampled_members(
            ranking,
            layout,
            budget=args.budget,
            seeds=member_seeds(args.m, args.seeds),
            ranking_name=name,
            pool=args.pool,
            allow_identical=args.allow_identical,
            ranking_info=info,
        )
    if args.strategy in ("circuit", "identical-circuit"):
        if args.strategy == "circuit" and args.m != 1:
            raise ValueError(
                f"the 'circuit' strategy gives one circuit, so {args.m} members would be "
                "identical; use 'seed-sampling' for members that differ, or 'identical-circuit' "
                "for the identical-members ablation (paper Table 9)"
            )
        name = CIRCUIT_NAMES[args.objective]
        circuit = circuit_member(
            greedy(), layout, budget=args.budget, ranking_name=name, ranking_info=greedy_info
        )
        return [circuit] if args.m == 1 else identical_members(circuit, args.m)
    if args.strategy == "cahp":
        return cahp_members(
            model,
            inputs,
            seeds=member_seeds(args.m, args.seeds or cahp_seeds(args.m, args.cahp_variant)),
            **_cahp_options(args, layout.total_heads, prefix="cahp_"),
            batch_size=args.batch_size,
            progress=progress_bar(f"{args.strategy} ({args.cahp_variant})"),
            allow_identical=args.allow_identical,
            search=search,
        )
    seeds = member_seeds(args.m, args.seeds)
    if args.strategy == "taylor" or args.ranking_source == "taylor":
        name = TAYLOR_NAME
        ranking = taylor_ranking(
            model, inputs, samples=args.taylor_samples, batch_size=args.batch_size
        )
        samples = min(args.taylor_samples, len(inputs.id_x))
        info = ranking_provenance("taylor", samples=samples, search=search)
    else:
        name, ranking, info = CIRCUIT_NAMES[args.objective], greedy(), greedy_info
    return seed_sampled_members(
        ranking,
        layout,
        budget=args.budget,
        seeds=seeds,
        ranking_name=name,
        pool=args.pool,
        allow_identical=args.allow_identical,
        ranking_info=info,
    )


def _add_cahp_options(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """CAHP's options; ``prefix`` ("cahp-") where they sit beside other strategies' options."""
    from hydra_core.analysis.cahp import CAHP_VARIANTS, REPRESENTATIVES

    names = [f"--{prefix}variant"] if prefix else ["--variant", "--cahp-variant"]
    p.add_argument(
        *names,
        dest=f"{prefix.replace('-', '_')}variant",
        default=CAHP_VARIANTS[0],
        choices=CAHP_VARIANTS,
        help="CAHP: official (the authors' code: attention maps, t-SNE, FasterPAM, knee of the "
        "silhouette curve) or accuracy-knee (our earlier reading: CLS-output profiles, knee "
        "of the accuracy curve) (default: %(default)s)",
    )
    p.add_argument(
        f"--{prefix}degree",
        type=options.positive_int,
        default=None,
        help="CAHP: degree of the knee's polynomial fit (default: 6 official, 3 accuracy-knee)",
    )
    p.add_argument(
        f"--{prefix}representative",
        default=None,
        choices=REPRESENTATIVES,
        help="CAHP accuracy-knee: the head kept per cluster (default: medoid; official: always "
        "the most important)",
    )
    p.add_argument(
        f"--{prefix}k-step",
        type=options.positive_int,
        default=1,
        help="CAHP accuracy-knee: evaluate every k-th number of clusters (default: %(default)s)",
    )


def _cahp_options(args: argparse.Namespace, total_heads: int, prefix: str = "") -> dict:
    """The keyword arguments of ``cahp_select`` / ``cahp_members`` that CAHP's options give."""
    from hydra_core.analysis.cahp import cahp_k_grid

    variant = getattr(args, f"{prefix}variant")
    k_step = getattr(args, f"{prefix}k_step")
    if variant == "official" and k_step != 1:
        raise ValueError(
            f"--{prefix.replace('_', '-')}k-step is an option of the accuracy-knee variant; the "
            "official one clusters for every k"
        )
    return {
        "variant": variant,
        "degree": getattr(args, f"{prefix}degree"),
        "representative": getattr(args, f"{prefix}representative"),
        "k_grid": None if variant == "official" else cahp_k_grid(total_heads, k_step),
    }


def _cahp_arguments(p: argparse.ArgumentParser) -> None:
    add_analysis_arguments(p)
    _add_cahp_options(p)
    p.add_argument(
        "--seed",
        type=options.seed,
        default=None,
        help="clustering (and t-SNE) seed (default: 42 official, 0 accuracy-knee)",
    )


@command("cahp", _cahp_arguments)
def _cahp(args: argparse.Namespace) -> int:
    """CAHP complementary head selection (official, or accuracy-knee); writes curve and mask."""
    from hydra_core.analysis.cahp import cahp_select
    from hydra_core.hydra.members import refuse_towers_for_cahp
    from hydra_core.masks import MemberMask, save_masks
    from hydra_core.models.adapter import head_layout

    def check(loaded, benchmark) -> None:  # the options the model decides, before the folder
        layout = head_layout(loaded.model)
        refuse_towers_for_cahp(layout)
        _cahp_options(args, layout.total_heads)

    loaded, _, inputs, _, out = prepare(args, check=check)
    layout = head_layout(loaded.model)
    result = cahp_select(
        loaded.model,
        inputs.id_x,
        inputs.id_y,
        **_cahp_options(args, layout.total_heads),
        seed=args.seed,
        batch_size=args.batch_size,
        progress=progress_bar(f"CAHP {args.variant}"),
    )
    write_csv(out / "cahp_curve.csv", result.curve, index=False)
    write_json(
        out / "cahp.json",
        {
            "variant": result.variant,
            "knee_k": result.knee_k,
            "curve": result.score_name,
            "degree": result.degree,
            "seed": result.seed,
            "representative": result.representative,
            "coefficients": result.coefficients.tolist(),
            "kept": [head_label(*h) for h in sorted(result.representatives + result.added)],
            "representatives": [head_label(*h) for h in result.representatives],
            "added_for_empty_layers": [head_label(*h) for h in result.added],
        },
    )
    member = MemberMask(f"CAHP-{int(result.keep.sum())}", result.describe(), result.keep)
    write_output(out / "cahp_masks.json", lambda tmp: save_masks(tmp, [member], loaded.identity()))
    print(
        f"{result.describe()} (of {layout.total_heads} heads); wrote cahp_curve.csv, cahp.json, "
        f"cahp_masks.json to {out}"
    )
    return 0
