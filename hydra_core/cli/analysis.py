"""Commands for the head analyses: search, importance, represent.

Each command writes JSON and CSV files into ``--out`` (default ``results/<command>``) and prints
where they are. Search and importance results are cached, so a repeated command is instant and an
interrupted search continues where it stopped. ``search`` and ``importance`` select heads, so they
see the search data only (the ID search part and the search-role OOD sets); ``represent``
describes the reported distributions, so it reads a sample of the report data.
"""

from __future__ import annotations

import argparse
import json
import sys

import pandas as pd

import hydra_core.cli.options as options
from hydra_core import distributed
from hydra_core.analysis.inputs import REPORT_SAMPLE
from hydra_core.cli.common import (
    add_analysis_arguments,
    add_ood_aggregate_argument,
    add_other_weights_argument,
    command,
    head_map_frame,
    prepare,
    read_result_file,
    shows_progress,
    warn_near_chance,
    write_csv,
    write_json,
    write_output,
)
from hydra_core.cli.stability import (
    add_stability_arguments,
    json_summary,
    log_stream,
    run_stability,
    search_data,
    warn_few_samples,
    write_holdout,
)
from hydra_core.cli.transfer import shortcut_summary
from hydra_core.errors import InputError
from hydra_core.models.family import head_label, parse_head_label
from hydra_core.outputs import data_identity


def _search_arguments(p: argparse.ArgumentParser) -> None:
    add_analysis_arguments(p)
    add_ood_aggregate_argument(p)
    p.add_argument(
        "--objective",
        default="avg",
        choices=("acc", "ood", "avg"),
        help="acc: ID accuracy, ood: MSP AUROC, avg: their mean (default: %(default)s)",
    )
    p.add_argument(
        "--budget",
        type=options.positive_int,
        default=24,
        help="heads to remove (default: %(default)s)",
    )
    options.add_search_method_argument(p)
    options.add_candidates_argument(p)
    p.add_argument(
        "--no-resume",
        action="store_true",
        help="start over instead of continuing a saved search (a longer saved search is kept "
        "until the new one is as long)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (objective, budget, order, scores, search_ood, n_id, n_ood, "
        "seconds, shortcut, and holdout/stability when asked for) on stdout; everything else "
        "goes to stderr",
    )
    add_stability_arguments(p)


@command("search", _search_arguments)
def _search(args: argparse.Namespace) -> int:
    """Greedy Headmap circuit extraction (paper Algorithm 1), resumable; writes the ranking.

    Under torchrun the processes share every step's candidates; rank 0 saves the progress and
    writes the outputs."""
    from tqdm import tqdm

    from hydra_core.analysis.greedy import greedy_circuit, load_greedy
    from hydra_core.masks import MemberMask, save_masks
    from hydra_core.models.adapter import head_layout

    def check_budget(loaded, benchmark) -> None:
        total = head_layout(loaded.model).total_heads
        if not 1 <= args.budget < total:  # the search writes a circuit, which keeps a head
            raise InputError(
                f"--budget must be between 1 and {total - 1}: the model has {total} heads and "
                f"the circuit the search writes keeps at least one; got {args.budget}"
            )

    if args.candidates is not None and args.stability:
        raise InputError(
            "--stability resamples the exact search: leave out --candidates (or --stability)"
        )
    # the options that change the files greedy_<objective>*: another value is another search
    changes = {
        "--candidates": args.candidates,
        "--ood-aggregate": args.ood_aggregate,
        "--holdout": None if args.holdout is None else [args.holdout, args.seed],
    }
    run = (f"greedy_{args.objective}", changes)
    loaded, benchmark, inputs, cache, out = prepare(args, check=check_budget, run=run)
    shortcut = shortcut_summary(loaded, benchmark, cache, args)  # warns before the search
    searched = search_data(args, inputs)
    data = (loaded.model, searched.id_x, searched.id_y, searched.ood_x)
    sets = {"ood_sets": searched.ood_strata, "ood_aggregate": args.ood_aggregate}
    if distributed.is_main():
        warn_few_samples(searched)
    saved = None
    if distributed.is_main():  # the note on a saved search is rank 0's to print
        saved = load_greedy(*data, args.objective, cache, args.method, args.candidates, **sets)
    if saved is not None and saved.steps:
        if args.no_resume:
            note = f"starting over; the saved {saved.steps}-step search is kept unless this one "
            note += "gets as long"
        elif saved.steps >= args.budget:
            note = f"the saved search has {saved.steps} steps: its first {args.budget} are reused"
        else:
            note = f"resumed at step {saved.steps} of {args.budget}"
        print(note, file=sys.stderr)
    bar = tqdm(
        total=args.budget,
        desc=f"greedy {args.objective}",
        unit="head",
        disable=not shows_progress(),
    )

    def progress(step) -> None:
        bar.n = step.step + 1
        bar.set_postfix(removed=head_label(*step.head), score=f"{step.score:.4f}")
        bar.refresh()

    result = greedy_circuit(
        *data,
        objective=args.objective,
        budget=args.budget,
        batch_size=args.batch_size,
        method=args.method,
        candidates=args.candidates,
        cache=cache,
        resume=not args.no_resume,
        progress=progress,
        **sets,
    )
    bar.close()
    identity = {"model": loaded.identity(), "data": data_identity(benchmark, "search")}
    identity["ood_aggregate"] = args.ood_aggregate
    if args.holdout is not None:  # the search chose on the rest of the search split
        identity["holdout"] = {"fraction": args.holdout, "seed": args.seed}
    found = None
    if args.stability:  # every process shares the resampled steps
        found = run_stability(
            args, loaded.model, searched, result, cache, out, identity, log_stream(args)
        )
    if not distributed.is_main():
        return 0
    warn_near_chance(args, loaded, result.base_accuracy)  # on the search split, as eval's
    curve = None
    if searched.held_out is not None:
        curve = write_holdout(loaded.model, result, searched, out, log_stream(args))
    stem = f"greedy_{args.objective}"
    write_json(out / f"{stem}.json", {**result.to_dict(), **identity, "shortcut": shortcut})
    steps = pd.DataFrame(
        {
            "step": range(1, result.steps + 1),
            "head": result.labels(),
            "score": result.scores,
            "accuracy": result.accuracy,
            "auroc": result.auroc,
        }
    )
    write_csv(out / f"{stem}_steps.csv", steps, index=False)
    ranking = pd.DataFrame(
        {
            "rank": range(1, len(result.ranking()) + 1),
            "head": [head_label(*h) for h in result.ranking()],
        }
    )
    write_csv(out / f"{stem}_ranking.csv", ranking, index=False)
    circuit = MemberMask(
        f"Circ{args.objective.capitalize()}-{result.steps}",
        f"greedy {args.objective}, {result.steps} heads removed",
        result.keep_mask(),
    )
    write_output(
        out / f"{stem}_masks.json", lambda tmp: save_masks(tmp, [circuit], loaded.identity())
    )
    summary = sys.stderr if args.json else sys.stdout  # --json: stdout holds the JSON alone
    print(
        f"dense: accuracy {result.base_accuracy:.4f}, AUROC {result.base_auroc:.4f}; "
        f"after removing "
        f"{result.steps} heads: accuracy {result.accuracy[-1]:.4f}, AUROC {result.auroc[-1]:.4f} "
        f"({result.seconds:.0f} s of compute)",
        file=summary,
    )
    if result.candidates is not None:
        print(
            f"guided (K = {result.candidates}): {sum(result.evaluated)} candidates evaluated "
            f"exactly over {result.steps} steps",
            file=summary,
        )
    print(
        f"wrote {out}/{stem}.json, {stem}_steps.csv, {stem}_ranking.csv, {stem}_masks.json",
        file=summary,
    )
    if args.json:
        found = {
            "objective": result.objective,
            "budget": args.budget,
            "order": result.labels(),
            "scores": result.scores,
            "search_ood": benchmark.search_names(),
            "n_id": len(searched.id_x),
            "n_ood": len(searched.ood_x),
            "seconds": result.seconds,  # compute of the search itself, not start-up or loading
            "candidates": result.candidates,  # the guided search's K; None: exact
            "evaluated": result.evaluated,  # candidates evaluated exactly per step
            **json_summary(curve, found, result),
            "shortcut": shortcut,
        }
        print(json.dumps(found, indent=2))
    return 0


def _importance_arguments(p: argparse.ArgumentParser) -> None:
    add_analysis_arguments(p)
    p.add_argument(
        "--taylor-samples",
        type=options.positive_int,
        default=512,
        help="ID images for Taylor (default: %(default)s)",
    )
    p.add_argument(
        "--attribution",
        action="store_true",
        help="add the attribution estimates (AtP: one forward and a few backward passes) of "
        "Δaccuracy and ΔAUROC beside the exact single-head ablation, with their rank agreement",
    )
    p.add_argument(
        "--greedy",
        default=None,
        metavar="GREEDY_JSON",
        help="a search result (greedy_*.json) whose removal steps become a map (the heads it "
        "kept tie as the most important)",
    )


@command("importance", _importance_arguments)
def _importance(args: argparse.Namespace) -> int:
    """Head importance maps: single-head Δaccuracy/ΔAUROC, Taylor, greedy rank, and Spearman."""
    import torch

    from hydra_core.analysis.greedy import single_head_importance
    from hydra_core.analysis.importance import importance_maps
    from hydra_core.analysis.taylor import taylor_scores

    greedy = None

    def read_greedy(loaded, benchmark) -> None:  # another model's or data's search: refused
        nonlocal greedy
        data = data_identity(benchmark, "search")
        greedy = _read_greedy(args.greedy, loaded, data) if args.greedy else None

    loaded, _, inputs, cache, out = prepare(args, check=read_greedy)
    single = single_head_importance(
        loaded.model,
        inputs.id_x,
        inputs.id_y,
        inputs.ood_x,
        batch_size=args.batch_size,
        cache=cache,
    )
    if not distributed.is_main():  # Taylor and the maps take one process
        return 0
    n = args.taylor_samples
    taylor = taylor_scores(
        loaded.model, inputs.id_x[:n], inputs.id_y[:n], batch_size=args.batch_size, cache=cache
    )
    estimated = None
    if args.attribution:
        from hydra_core.analysis.attribution import attribution_importance

        estimated = attribution_importance(
            loaded.model,
            inputs.id_x,
            inputs.id_y,
            inputs.ood_x,
            batch_size=min(args.batch_size, 64),
            cache=cache,
        )
    found = importance_maps(single, taylor, greedy, estimated)
    warn_near_chance(args, loaded, found.base_accuracy)
    for criterion in found.criteria:
        frame = head_map_frame(torch.from_numpy(criterion.importance))
        write_csv(out / f"{criterion.file_stem}.csv", frame)
    correlations = found.spearman()
    write_csv(out / "spearman.csv", correlations)
    agreement = found.attribution_agreement()
    if estimated is not None:
        write_csv(out / "attribution_agreement.csv", agreement, index=False)
    write_json(
        out / "importance.json",
        {
            "base_accuracy": found.base_accuracy,
            "base_auroc": found.base_auroc,
            "orientation": "higher = more important (delta maps are negated score changes; "
            "greedy maps are removal steps, kept heads tied at steps + 1)",
            "files": {c.name: f"{c.file_stem}.csv" for c in found.criteria},
            "maps": {name: values.tolist() for name, values in found.maps.items()},
            "spearman": correlations.to_dict(),
            **(
                {"attribution_agreement": agreement.to_dict(orient="records")}
                if estimated is not None
                else {}
            ),
        },
    )
    print(correlations.round(3).to_string())
    files = ", ".join(f"{c.file_stem}.csv" for c in found.criteria)
    if estimated is not None:
        for _, row in agreement.iterrows():
            print(
                f"attribution vs exact ablation, {row['score']}: Spearman "
                f"{row['spearman']:.3f}, {row['top-10 overlap']} of the exact top 10 in the "
                "estimate's top 10"
            )
        files += ", attribution_agreement.csv"
    print(f"wrote {files}, spearman.csv, importance.json to {out}")
    return 0


def _read_greedy(path: str, loaded, data: dict | None = None):
    """A search result (``--greedy``) of the loaded model and, given ``data``, of this run's
    search data: another model's or other data's is refused, one that names no model (an older
    file) warned about."""
    from hydra_core.analysis.greedy import GreedyResult

    hint = "give a search result of this model on this run's search data"
    return read_result_file(
        path, loaded, "--greedy", "a search result", hint, GreedyResult.from_dict, data
    )


def _represent_arguments(p: argparse.ArgumentParser) -> None:
    add_analysis_arguments(p)
    p.add_argument(
        "--layer", type=int, default=-1, help="layer whose heads are read (default: the last)"
    )
    p.add_argument(
        "--masks",
        default=None,
        help="a mask file; its first member is the circuit compared "
        "with the dense model (paper Table 5)",
    )
    p.add_argument(
        "--heads",
        nargs="+",
        default=None,
        metavar="LxHy",
        help="heads for the 2-D projection (default: every head of --layer)",
    )
    add_other_weights_argument(p)
    p.add_argument("--method", default="pca", choices=("pca", "umap"))
    p.add_argument(
        "--n-images",
        type=options.positive_int,
        default=REPORT_SAMPLE,
        help="images per set: a fixed sample of the ID report part and of every report set "
        "(default: %(default)s)",
    )


@command("represent", _represent_arguments)
def _represent(args: argparse.Namespace) -> int:
    """Per-head CLS outputs of report images: centroid distances, dense vs circuit, 2-D maps."""
    from hydra_core.analysis.representations import (
        centroid_distances,
        distance_table_dense_vs_circuit,
        head_cls_features,
        project_features,
    )
    from hydra_core.masks import load_masks
    from hydra_core.models.adapter import head_layout

    layer, heads, member = 0, [], None

    def check_choice(loaded, benchmark) -> None:  # layer, heads, mask file: before any work
        nonlocal layer, heads, member
        layout = head_layout(loaded.model)
        if not -layout.num_layers <= args.layer < layout.num_layers:
            raise InputError(
                f"--layer {args.layer} does not exist: {loaded.name} has layers "
                f"0..{layout.num_layers - 1} (-1 is the last)"
            )
        layer = args.layer % layout.num_layers
        heads = (
            [_head(label, layout) for label in args.heads]
            if args.heads
            else [(layer, h) for h in range(layout.num_heads[layer])]
        )
        if any(h[0] != layer for h in heads):
            raise InputError(
                f"--heads must belong to --layer {layer} (L{layer}H0, L{layer}H1, ...)"
            )
        if args.masks:
            identity, other = loaded.identity(), args.allow_other_weights
            member = load_masks(args.masks, layout, identity, allow_other_weights=other)[0]

    loaded, _, inputs, _, out = prepare(args, report_sample_size=args.n_images, check=check_choice)
    id_feats = head_cls_features(
        loaded.model, inputs.id_x, layers=[layer], batch_size=args.batch_size
    )
    tables, ood_feats = [], {}
    for name, x in inputs.ood_per_set.items():
        ood_feats[name] = head_cls_features(
            loaded.model, x, layers=[layer], batch_size=args.batch_size
        )
        tables.append(
            centroid_distances(id_feats, ood_feats[name], layers=[layer]).assign(ood_set=name)
        )
    distances = pd.concat(tables, ignore_index=True)
    write_csv(out / f"distances_layer{layer}.csv", distances, index=False)
    projection = project_features(
        id_feats, ood_feats, heads=heads, method=args.method, layers=[layer]
    )
    write_csv(out / f"{args.method}_layer{layer}.csv", projection, index=False)
    written = [f"distances_layer{layer}.csv", f"{args.method}_layer{layer}.csv"]
    if member is not None:
        table5 = distance_table_dense_vs_circuit(
            loaded.model,
            member.keep,
            inputs.id_x,
            inputs.ood_per_set,
            layer=layer,
            batch_size=args.batch_size,
        )
        write_csv(out / "dense_vs_circuit.csv", table5, index=False)
        written.append("dense_vs_circuit.csv")
        print(table5.round(3).to_string(index=False))
    summary = distances.groupby("ood_set")[["euclidean", "mahalanobis"]].mean()
    print(summary.round(3).to_string())
    print(f"wrote {', '.join(written)} to {out}")
    return 0


def _head(label: str, layout) -> tuple[int, int]:
    """A --heads label (``L3H5``) as (layer, head), checked against the model."""
    try:
        layer, head = parse_head_label(label)
    except ValueError:
        raise InputError(
            f"--heads {label!r} is not a head label; write L<layer>H<head>, e.g. L0H3"
        ) from None
    if not (0 <= layer < layout.num_layers and 0 <= head < layout.num_heads[layer]):
        raise InputError(f"--heads {label} does not exist in a model of {layout.num_layers} layers")
    return layer, head
