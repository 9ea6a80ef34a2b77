"""Commands that make member masks: masks (every strategy) and cahp (CAHP alone, with its curve)."""

from __future__ import annotations

import argparse
from pathlib import Path

from hydra_core.cli.common import (
    add_analysis_arguments,
    add_data_arguments,
    add_model_arguments,
    command,
    load_for_cli,
    prepare,
    progress_bar,
    write_json,
)
from hydra_core.models.adapter import head_label, head_layout

#: strategies that compute masks (a mask file or hand-drawn masks need no command)
COMPUTED_STRATEGIES = ("seed-sampling", "circuit", "identical-circuit", "taylor", "cahp")


def _masks_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    add_data_arguments(p)
    p.add_argument(
        "--strategy",
        default="seed-sampling",
        choices=COMPUTED_STRATEGIES,
        help="how the members are made (default: %(default)s)",
    )
    p.add_argument("--m", type=int, default=3, help="number of members (default: %(default)s)")
    p.add_argument(
        "--budget", type=int, default=24, help="heads each member prunes (default: %(default)s)"
    )
    p.add_argument(
        "--pool",
        type=int,
        default=None,
        help="seed sampling draws from this many least useful heads (default: 2 x budget)",
    )
    p.add_argument(
        "--seeds", type=int, nargs="+", default=None, help="one per member (default: 0..m-1)"
    )
    p.add_argument(
        "--objective",
        default="avg",
        choices=("acc", "ood", "avg"),
        help="greedy objective of the circuit ranking (default: %(default)s)",
    )
    p.add_argument(
        "--ranking-source",
        default="greedy",
        choices=("greedy", "taylor"),
        help="seed sampling's ranking (default: %(default)s)",
    )
    p.add_argument(
        "--per-layer",
        type=int,
        nargs="+",
        default=None,
        help="taylor with --m 1: heads removed per layer (one number, or one per layer)",
    )
    p.add_argument("--taylor-samples", type=int, default=512, help="default: %(default)s")
    p.add_argument(
        "--cahp-degree",
        type=int,
        default=3,
        help="CAHP: degree of the accuracy-vs-heads fit (default: %(default)s)",
    )
    p.add_argument(
        "--cahp-k-step",
        type=int,
        default=1,
        help="CAHP: evaluate every k-th number of heads (default: %(default)s)",
    )
    p.add_argument(
        "--allow-identical",
        action="store_true",
        help="accept members with equal masks (identical-members ablation)",
    )
    p.add_argument("--out", default="results/masks/members.json", help="mask file to write")


@command("masks", _masks_arguments)
def _masks(args: argparse.Namespace) -> int:
    """Build M ensemble member masks (seed sampling, circuit, Taylor, CAHP), write a mask file."""
    from hydra_core.analysis.inputs import search_inputs
    from hydra_core.cache import DiskCache
    from hydra_core.evaluate import resolve_device
    from hydra_core.hydra.members import build_member_masks, member_overlap
    from hydra_core.masks import save_masks
    from hydra_core.models.adapter import head_layout

    loaded, benchmark = load_for_cli(args)
    device = resolve_device(args.device)
    loaded.model.to(device)
    inputs = search_inputs(loaded.preprocess, benchmark).to(device)
    per_layer = args.per_layer[0] if args.per_layer and len(args.per_layer) == 1 else args.per_layer
    layout = head_layout(loaded.model)
    k_grid = sorted(
        {*range(1, layout.total_heads + 1, max(1, args.cahp_k_step)), layout.total_heads}
    )
    needs_budget = args.strategy in ("seed-sampling", "circuit", "identical-circuit", "taylor")
    members = build_member_masks(
        args.strategy,
        model=loaded.model,
        inputs=inputs,
        m=args.m,
        budget=args.budget if needs_budget and per_layer is None else None,
        pool=args.pool,
        seeds=args.seeds,
        ranking_source=args.ranking_source,
        objective=args.objective,
        per_layer=per_layer,
        taylor_samples=args.taylor_samples,
        cahp_degree=args.cahp_degree,
        cahp_k_grid=k_grid,
        allow_identical=args.allow_identical,
        cache=DiskCache(),
        batch_size=args.batch_size,
        progress=progress_bar(f"{args.strategy} ranking"),
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_masks(out, members, loaded.identity())
    overlap = member_overlap(members)
    print("kept heads per layer:")
    print(overlap["per_layer"].to_string())
    print("\nJaccard similarity of kept heads:")
    print(overlap["jaccard"].round(3).to_string())
    print(
        f"\nmean pairwise Jaccard {overlap['mean_pairwise_jaccard']:.3f}; "
        f"{len(overlap['kept_by_all'])} heads kept by every member, "
        f"{len(overlap['kept_by_any'])} by at least one"
    )
    print(f"wrote {out} ({len(members)} members)")
    return 0


def _cahp_arguments(p: argparse.ArgumentParser) -> None:
    add_analysis_arguments(p)
    p.add_argument(
        "--degree", type=int, default=3, help="degree of the polynomial fit (default: %(default)s)"
    )
    p.add_argument(
        "--k-step",
        type=int,
        default=1,
        help="evaluate every k-th number of heads (default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=0, help="k-medoids seed (default: %(default)s)")


@command("cahp", _cahp_arguments)
def _cahp(args: argparse.Namespace) -> int:
    """CAHP complementary head selection (our reading of the public abstract); writes the mask."""
    from hydra_core.analysis.cahp import cahp_select
    from hydra_core.masks import MemberMask, save_masks

    loaded, _, inputs, _, out = prepare(args)
    layout = head_layout(loaded.model)
    grid = list(range(1, layout.total_heads + 1, max(1, args.k_step)))
    if grid[-1] != layout.total_heads:
        grid.append(layout.total_heads)
    result = cahp_select(
        loaded.model,
        inputs.id_x,
        inputs.id_y,
        degree=args.degree,
        k_grid=grid,
        seed=args.seed,
        batch_size=args.batch_size,
        progress=progress_bar("CAHP curve"),
    )
    result.curve.to_csv(out / "cahp_curve.csv", index=False)
    write_json(
        out / "cahp.json",
        {
            "knee_k": result.knee_k,
            "degree": args.degree,
            "seed": args.seed,
            "coefficients": result.coefficients.tolist(),
            "kept": [head_label(*h) for h in result.medoids[result.knee_k]],
        },
    )
    member = MemberMask(
        f"CAHP-{result.knee_k}", f"CAHP degree {args.degree} seed {args.seed}", result.keep
    )
    save_masks(out / "cahp_masks.json", [member], loaded.identity())
    print(
        f"knee at {result.knee_k} heads (of {layout.total_heads}); "
        "wrote cahp_curve.csv, cahp.json, "
        f"cahp_masks.json to {out}"
    )
    return 0
