"""Commands for Hydra ensembles: hydra, train-ensemble, report.

- ``hydra``: assemble the members of a mask file (optionally fine-tuned), evaluate every system,
  write the tables and export the fused model;
- ``train-ensemble``: train the independently seeded copies Deep Ensembles need (cached);
- ``train-baselines``: train the paper's efficient ensembles (Packed-Ensembles, MIMO,
  BatchEnsemble, LoRA Ensembles; cached, resumable);
- ``report``: the replication report (results/report by default).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import hydra_core.cli.options as options
from hydra_core import distributed
from hydra_core.cli.common import (
    add_data_arguments,
    add_model_arguments,
    add_other_weights_argument,
    add_output_arguments,
    add_search_protocol_arguments,
    claim_output,
    command,
    format_table,
    load_for_cli,
    progress_bar,
    stage_bars,
    write_csv,
    write_json,
    write_output,
)
from hydra_core.errors import InputError

#: the text report's fine-tuning recipes by name (hydra_core.training.top.TOP_RECIPES, which a
#: test keeps this equal to; not imported here, so the parser is built without torch)
FINETUNE_RECIPES = ("fast", "paper", "paper-short")
#: the one the text report uses unless told (hydra_core.training.top.DEFAULT_TOP_RECIPE, likewise)
DEFAULT_FINETUNE_RECIPE = "paper-short"


def _finetune_arguments(p: argparse.ArgumentParser) -> None:
    from hydra_core.hydra.finetune import OPTIMIZERS, PARAMETER_GROUPS, FinetuneConfig

    d = FinetuneConfig()
    g = p.add_argument_group("fine-tuning (paper 4.3 / D.2)")
    g.add_argument("--finetune", action="store_true", help="fine-tune each member before fusing")
    g.add_argument(
        "--ft-optimizer", default=d.optimizer, choices=OPTIMIZERS, help="default: %(default)s"
    )
    g.add_argument(
        "--ft-lr",
        type=options.positive_float,
        default=d.lr,
        help="peak learning rate (default: %(default)s)",
    )
    g.add_argument(
        "--ft-epochs", type=options.positive_float, default=d.epochs, help="default: %(default)s"
    )
    g.add_argument(
        "--ft-label-smoothing",
        type=options.smoothing,
        default=d.label_smoothing,
        help="default: %(default)s",
    )
    g.add_argument(
        "--ft-steps",
        type=options.positive_int,
        default=None,
        help="optimiser steps (overrides --ft-epochs)",
    )
    g.add_argument(
        "--ft-batch-size",
        type=options.positive_int,
        default=d.batch_size,
        help="default: %(default)s",
    )
    g.add_argument(
        "--ft-n-train",
        type=options.positive_int,
        default=d.n_train,
        help="Fashion-MNIST training images used (default: %(default)s)",
    )
    g.add_argument(
        "--ft-warmup-steps",
        type=options.non_negative_int,
        default=d.warmup_steps,
        help="default: %(default)s",
    )
    g.add_argument(
        "--ft-trainable",
        nargs="+",
        default=list(d.trainable),
        choices=PARAMETER_GROUPS,
        help="parameter groups updated (default: %(default)s)",
    )
    g.add_argument(
        "--ft-vary-batch-order",
        action="store_true",
        help="a different batch order per member (default: the same for all)",
    )
    g.add_argument(
        "--ft-select",
        action="store_true",
        help="choose --ft-lr, --ft-epochs and --ft-label-smoothing on Fashion-MNIST validation "
        "images by fine-tuning the first member with each of a small grid (replaces them)",
    )


def _finetune_config(args: argparse.Namespace, loaded, members):
    """The --ft-* settings as a FinetuneConfig (None without --finetune); with --ft-select, the
    one :func:`~hydra_core.hydra.finetune.select_finetune_config` picks for the first member."""
    from hydra_core.hydra.finetune import FinetuneConfig

    if not args.finetune:
        if args.ft_select:
            raise ValueError("--ft-select chooses fine-tuning settings; add --finetune")
        return None
    config = FinetuneConfig(
        optimizer=args.ft_optimizer,
        lr=args.ft_lr,
        epochs=args.ft_epochs,
        steps=args.ft_steps,
        batch_size=args.ft_batch_size,
        n_train=args.ft_n_train,
        warmup_steps=args.ft_warmup_steps,
        label_smoothing=args.ft_label_smoothing,
        trainable=tuple(args.ft_trainable),
    )
    if not args.ft_select:
        return config
    from hydra_core.cache import DiskCache
    from hydra_core.hydra.finetune import select_finetune_config
    from hydra_core.inference import resolve_device

    selection = select_finetune_config(
        loaded.model,
        members[0].keep,
        config,
        preprocess=loaded.preprocess,
        device=resolve_device(args.device),
        cache=DiskCache(),
        progress=stage_bars(),
    )
    print(format_table(selection.table))
    best = selection.best
    print(
        f"selected on {members[0].name} by validation {selection.criterion} "
        f"({selection.n_validation} Fashion-MNIST validation images): lr {best.lr}, "
        f"epochs {best.epochs}, label smoothing {best.label_smoothing}"
    )
    return best


# --- hydra --------------------------------------------------------------------------------------


def _hydra_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    add_data_arguments(p, n_report=2000)
    p.add_argument("--masks", required=True, help="mask file with the members (from `masks`)")
    p.add_argument(
        "--label", default="Hydra", help="name of the ensemble rows (default: %(default)s)"
    )
    p.add_argument(
        "--allow-identical",
        action="store_true",
        help="accept members that keep the same heads (identical-members ablation)",
    )
    add_other_weights_argument(p)
    _finetune_arguments(p)
    p.add_argument(
        "--deep-ensemble",
        action="store_true",
        help="add Deep Ensembles from trained copies (see `train-ensemble`)",
    )
    p.add_argument(
        "--baselines",
        nargs="+",
        default=[],
        metavar="NAME",
        help="baselines evaluated beside Hydra: mc-dropout (the model's own dropout, or "
        "--mc-dropout-rate), temperature (temperature scaling fitted on the ID search split), "
        "shared-backbone (Deep Ensembles (D): three fresh heads on the model's backbone, trained "
        "on the embedded ID set's training split), and the paper's efficient ensembles: "
        "batch-ensemble and lora-ensembles (fine-tuned from the model, cached; trained here when "
        "missing), packed-ensembles and mimo (trained from scratch with the default ViT's "
        "recipe by `train-baselines`; left out, with that command, when not stored)",
    )
    p.add_argument(
        "--mc-passes",
        type=options.positive_int,
        default=5,
        help="MC Dropout's forwards (default: %(default)s)",
    )
    p.add_argument(
        "--mc-dropout-rate",
        type=options.open_unit,
        default=None,
        help="MC Dropout at this rate in every dropout module (post hoc: for a model trained "
        "without dropout, such as the default ViT); default: the model's own dropout",
    )
    for option in ("--mc-passes", "--mc-dropout-rate"):
        options.only_with(p, option, "--baselines mc-dropout", _with_mc_dropout)
    options.add_scores_argument(
        p, "the system tables stay MSP, other scores add scores_table.csv and score_gains.csv"
    )
    p.add_argument("--bf16", action="store_true", help="predict under bfloat16 autocast (CUDA)")
    p.add_argument("--no-latency", action="store_true", help="skip the latency measurement")
    p.add_argument(
        "--latency-batch",
        type=options.positive_int,
        default=32,
        help="images per timed forward (default: %(default)s)",
    )
    p.add_argument(
        "--latency-repeats",
        type=options.positive_int,
        default=20,
        help="timed calls per system (default: %(default)s)",
    )
    p.add_argument(
        "--latency-warmup",
        type=options.non_negative_int,
        default=3,
        help="untimed rounds of every system before the timed ones (default: %(default)s)",
    )
    add_output_arguments(p, "results/hydra")


def _with_mc_dropout(args: argparse.Namespace) -> bool:
    return "mc-dropout" in (args.baselines or [])


@command("hydra", _hydra_arguments)
def _hydra(args: argparse.Namespace) -> int:
    """Assemble a Hydra ensemble from a mask file, evaluate every system, export the fused model."""
    from hydra_core.baselines.deep_ensembles import deep_ensemble_for
    from hydra_core.baselines.systems import SharedBackboneBaseline, baseline_systems
    from hydra_core.cache import DiskCache
    from hydra_core.evaluate import format_intervals, interval_columns
    from hydra_core.experiment.evaluate import evaluate_systems, hydra_systems
    from hydra_core.hydra.fused import save_hydra
    from hydra_core.masks import load_masks
    from hydra_core.models.adapter import head_layout
    from hydra_core.models.preprocess import describe
    from hydra_core.outputs import data_identity

    baselines = _baselines(args, baseline_systems)
    loaded, benchmark = load_for_cli(args)
    if not (getattr(args, "id_folder", None) or getattr(args, "id_file", None)):
        for baseline in baselines:  # heads train on the embedded ID set's training split
            if isinstance(baseline, SharedBackboneBaseline):
                baseline.train_set = lambda: loaded.modality.load_id("train")
    layout = head_layout(loaded.model)
    identity = loaded.identity()
    members = load_masks(
        args.masks,
        layout,
        identity,
        allow_identical=args.allow_identical,
        allow_other_weights=args.allow_other_weights,
    )
    out = Path(args.out or "results/hydra")
    if distributed.is_main():  # refused before any member is evaluated
        claim_output(args, out, loaded, data_identity(benchmark))
    finetune = _finetune_config(args, loaded, members)
    seeds = list(range(len(members))) if finetune is not None and args.ft_vary_batch_order else None
    deep = (
        deep_ensemble_for(args.model, log=lambda reason: print(reason, file=sys.stderr))
        if args.deep_ensemble
        else None
    )
    systems = hydra_systems(
        members, label=args.label, finetune=finetune, finetune_seeds=seeds, deep_ensemble=deep
    )
    report = evaluate_systems(
        loaded,
        benchmark,
        systems + baselines,
        device=args.device,
        bf16=args.bf16,
        cache=DiskCache(),
        progress=stage_bars(),
        latency=not args.no_latency,
        latency_batch=args.latency_batch,
        latency_repeats=args.latency_repeats,
        latency_warmup=args.latency_warmup,
        batch_size=args.batch_size,
    )
    if not distributed.is_main():
        return 0
    for name, reason in report.setup["skipped"].items():
        print(f"note: {name} left out: {reason}", file=sys.stderr)
    write_csv(out / "systems_table.csv", report.table(), index=False)
    summary = report.summary()
    write_csv(out / "summary.csv", summary, index=False)
    write_csv(out / "cost.csv", report.cost)
    made_for = {"model": identity, "data": data_identity(benchmark)}
    gains = _scores(args.scores, report, benchmark, out)
    by_score = {} if gains is None else {"scores": gains.attrs["json"]}
    write_json(out / "systems.json", {**made_for, **report.to_json(), **by_score})
    fused = report.info[report.find(args.label, "fused")].models[0].cpu()
    preprocess = describe(loaded.preprocess)
    write_output(
        out / "hydra.safetensors",
        lambda tmp: save_hydra(
            fused, tmp, preprocess=preprocess, source=loaded.name, classes=loaded.classes
        ),
    )
    columns = [
        "system",
        "heads",
        "accuracy",
        "nll",
        "brier",
        "ece",
        "all_auroc",
        "all_fpr95",
        "id_mi",
        "ood_mi",
        "params",
        "latency_ms",
    ]
    shown = [c for c in interval_columns(columns) if c in summary]
    print(format_table(format_intervals(summary[shown])))
    print("\ndifference to the single model (95% paired bootstrap; n.s. = interval holds 0):")
    differences = report.differences("single", ["accuracy", "ece", "all_auroc"])
    print(format_table(format_intervals(differences, signed=True)))
    if gains is not None:
        print("\ndoes each system's OOD gain hold under every score (AUROC minus single's):")
        shown = ["score", "system", *interval_columns(["near_delta", "far_delta"])]
        print(format_table(format_intervals(gains[shown], signed=True)))
    written = "systems_table.csv, summary.csv, cost.csv, systems.json, hydra.safetensors"
    if gains is not None:
        written += ", scores_table.csv, score_gains.csv"
    print(f"wrote {written} to {out}")
    return 0


def _scores(scores: tuple[str, ...], report, benchmark, out: Path):
    """With scores beyond MSP: every OOD metric per score (scores_table.csv) and whether each
    system's AUROC gain over the single model holds under every score (score_gains.csv), written
    to ``out``; returns the gains table, both as JSON in its ``attrs["json"]`` (None for MSP
    alone)."""
    if scores == ("msp",):
        return None
    from hydra_core.evaluate import nest_intervals
    from hydra_core.ood_scores import rescore_report, score_gains, scores_table

    scored = rescore_report(report, scores, benchmark)
    table, gains = scores_table(scored), score_gains(scored)
    write_csv(out / "scores_table.csv", table, index=False)
    write_csv(out / "score_gains.csv", gains, index=False)
    gains.attrs["json"] = {
        "requested": list(scores),
        "table": [nest_intervals(r) for r in table.to_dict(orient="records")],
        "gains": [nest_intervals(r) for r in gains.to_dict(orient="records")],
    }
    return gains


def _baselines(args: argparse.Namespace, baseline_systems) -> list:
    """The systems ``--baselines`` names; an InputError naming a wrong one and the choices (the
    parser has checked --mc-passes and --mc-dropout-rate)."""
    try:
        from hydra_core.baselines.deep_ensembles import reference_checkpoint

        return baseline_systems(
            args.baselines,
            mc_passes=args.mc_passes,
            mc_rate=args.mc_dropout_rate,
            reference=reference_checkpoint(args.model),
        )
    except ValueError as error:
        raise InputError(f"--baselines: {error}") from None


# --- train-ensemble -----------------------------------------------------------------------------


def _train_ensemble_arguments(p: argparse.ArgumentParser) -> None:
    from hydra_core.zoo.default import DEFAULT_CHECKPOINT

    p.add_argument(
        "--seeds",
        type=options.seed,
        nargs="+",
        default=[1, 2],
        help="one copy per seed; the shipped model is seed 0 (default: %(default)s)",
    )
    p.add_argument(
        "--reference",
        default=str(DEFAULT_CHECKPOINT),
        help="checkpoint whose recipe and architecture the copies follow",
    )
    p.add_argument(
        "--epochs", type=options.positive_int, default=None, help="override the recipe's epochs"
    )


@command("train-ensemble", _train_ensemble_arguments)
def _train_ensemble(args: argparse.Namespace) -> int:
    """Train the independently seeded copies of the model that Deep Ensembles need (cached)."""
    from dataclasses import replace

    from tqdm import tqdm

    from hydra_core.baselines.deep_ensembles import copy_path, recipe_of, train_deep_ensemble

    train_config, arch = recipe_of(args.reference)
    if args.epochs is not None:
        train_config = replace(train_config, epochs=args.epochs)
    bars: dict = {}

    def progress(seed: int, done: int, total: int) -> None:
        bars.setdefault(seed, progress_bar(f"train seed {seed}"))(done, total)

    train_deep_ensemble(
        args.seeds,
        train_config=train_config,
        arch=arch,
        reference=args.reference,
        progress=progress,
        log=tqdm.write,
    )
    if not distributed.is_main():
        return 0
    for seed in args.seeds:
        print(f"seed {seed}: {copy_path(seed, train_config, arch)}")
    return 0


# --- train-baselines ----------------------------------------------------------------------------


def _train_baselines_arguments(p: argparse.ArgumentParser) -> None:
    from hydra_core.baselines.efficient import NAMES

    p.add_argument(
        "methods",
        nargs="+",
        choices=list(NAMES),
        metavar="METHOD",
        help=f"the efficient ensembles to train: {', '.join(NAMES)}",
    )
    p.add_argument(
        "--model",
        default="default",
        help="the model BatchEnsemble and LoRA Ensembles are fine-tuned from ('default', "
        "'minilm-sentiment', a checkpoint, ...); Packed-Ensembles and MIMO follow its recipe, so "
        "they need a Hydra Lab checkpoint (default: %(default)s)",
    )
    p.add_argument(
        "--epochs",
        type=options.positive_int,
        default=None,
        help="Packed-Ensembles and MIMO: override the recipe's epochs (another copy)",
    )


@command("train-baselines", _train_baselines_arguments)
def _train_baselines(args: argparse.Namespace) -> int:
    """Train the paper's efficient ensembles (cached; an interrupted run goes on from its last
    epoch when run again)."""
    from tqdm import tqdm

    from hydra_core.baselines import efficient
    from hydra_core.baselines.deep_ensembles import reference_checkpoint
    from hydra_core.zoo.registry import load_model

    reference = reference_checkpoint(args.model)
    scratch = [m for m in args.methods if m in efficient.FROM_SCRATCH]
    if scratch and reference is None:
        raise InputError(
            f"{', '.join(scratch)}: trained from scratch with a Hydra Lab checkpoint's recipe; "
            f"--model {args.model} has none (use --model default or a checkpoint file)"
        )
    if args.epochs is not None and not scratch:
        raise InputError("--epochs applies to packed-ensembles and mimo only; leave it out")
    loaded = None
    for method in dict.fromkeys(args.methods):
        bar = progress_bar(f"train {method}")
        start = time.perf_counter()
        if method in efficient.FROM_SCRATCH:
            efficient.scratch_copy(
                method, reference=reference, epochs=args.epochs, log=tqdm.write, progress=bar
            )
        else:
            loaded = loaded or load_model(args.model)
            copy = (
                efficient.batch_ensemble_copy if method == efficient.BATCH else efficient.lora_copy
            )
            report = bar if method == efficient.BATCH else (lambda seed, d, t, bar=bar: bar(d, t))
            copy(loaded.model, loaded.preprocess, progress=report)
        print(f"{method}: ready ({time.perf_counter() - start:.0f} s)")
    return 0


# --- report -------------------------------------------------------------------------------------


def _report_arguments(p: argparse.ArgumentParser) -> None:
    from hydra_core.baselines.efficient import NAMES as EFFICIENT_NAMES
    from hydra_core.report import DEFAULT_OUT

    p.add_argument(
        "--quick",
        action="store_true",
        help="small subsets, short fine-tuning: every section in a couple of minutes",
    )
    p.add_argument("--model", default=None, help="model source (default: the default model)")
    p.add_argument(
        "--device",
        type=options.device,
        default=None,
        help="auto, cpu, cuda or cuda:N (default: auto)",
    )
    p.add_argument(
        "--n-search", type=options.positive_int, default=None, help="images per search part"
    )
    p.add_argument(
        "--n-report", type=options.positive_int, default=None, help="images per report part"
    )
    p.add_argument("--ood", nargs="+", default=None, metavar="NAME", help="OOD sets (default: all)")
    add_search_protocol_arguments(p)
    options.add_candidates_argument(p)
    p.add_argument(
        "--seeds", type=options.seed, nargs="+", default=None, help="pruning seeds, one per member"
    )
    p.add_argument(
        "--removed-per-layer",
        type=options.positive_int,
        default=None,
        help="heads removed per layer (default: a third of a layer's heads)",
    )
    p.add_argument("--no-finetune", action="store_true", help="zero-shot systems only")
    p.add_argument("--no-deep-ensemble", action="store_true", help="leave Deep Ensembles out")
    p.add_argument(
        "--efficient",
        nargs="*",
        choices=list(EFFICIENT_NAMES),
        default=None,
        metavar="METHOD",
        help="the image and text reports: the efficient ensembles looked for in the cache (each "
        "stored copy is a row of the systems' and the cost tables; the report never trains one, "
        "it names the `train-baselines` command); none given: none (default: all four for the "
        "image report, batch-ensemble and lora-ensembles for the text report)",
    )
    p.add_argument(
        "--finetune-recipe",
        choices=FINETUNE_RECIPES,
        default=None,
        help="--task text: how pruned models and members are fine-tuned: fast (the top 2 layers, "
        "1 epoch of 2,000 sentences at lr 3e-4), paper (D.2: every layer, lr 1e-5, up to 7 "
        "epochs of every sentence, early stopping on held-out training sentences) or "
        "paper-short (the same on 2,000 sentences, at most 3 epochs, patience 1); docs/text.md "
        f"measures each one's cost (default: {DEFAULT_FINETUNE_RECIPE})",
    )
    p.add_argument(
        "--task",
        choices=("image", "text", "zero-shot"),
        default="image",
        help="image: the default ViT (Tables 1, 4-12); text: Table 2 on minilm-sentiment; "
        "zero-shot: Table 3 on an OpenCLIP model (--model openclip:..., needs its weights: "
        "online, or a local open_clip folder)",
    )
    p.add_argument(
        "--id-folder",
        default=None,
        metavar="PATH",
        help="zero-shot: an ImageFolder of your own as the ID set (its sub-folders are the "
        "classes; default: Fashion-MNIST)",
    )
    p.add_argument(
        "--prompts",
        nargs="+",
        default=None,
        metavar="SET_OR_TEMPLATE",
        help="zero-shot: prompt templates: paper (default, 'A photo of a {label}.'), openai, "
        "simple, or your own templates containing {label}",
    )
    p.add_argument(
        "--towers",
        choices=("both", "image"),
        default=None,
        help="zero-shot: prune heads in both towers jointly (default, the paper's D.3: 24 heads "
        "for ViT-B/32) or in the image tower alone (its Appendix E.3.2)",
    )
    add_output_arguments(
        p,
        f"{DEFAULT_OUT}, {DEFAULT_OUT}/text or {DEFAULT_OUT}/zero-shot by --task; the committed "
        "docs/report only when named, with --overwrite",
    )


def _text_only_recipe(args: argparse.Namespace) -> None:
    """Refuse --finetune-recipe for a report other than the text report (called in their
    branches)."""
    if args.finetune_recipe is not None:
        raise InputError(
            f"--finetune-recipe applies to the text report's fine-tuning (--task text), not to "
            f"the {args.task} report"
        )


def _no_efficient(args: argparse.Namespace) -> None:
    """Refuse --efficient for a report other than the image and text reports (called in its
    branch)."""
    if args.efficient is not None:
        raise InputError(
            "--efficient applies to the image and text reports (--task image or text); leave it "
            f"out for --task {args.task}"
        )


@command("report", _report_arguments)
def _report(args: argparse.Namespace) -> int:
    """Replication report of the paper's analyses on the default model (Markdown + CSV)."""
    from dataclasses import replace

    from tqdm import tqdm

    from hydra_core.report import DEFAULT_OUT, config_from_args, run_report

    overrides = dict(
        model=args.model,
        device=args.device,
        n_search=args.n_search,
        n_report=args.n_report,
        ood=tuple(args.ood) if args.ood else None,
        seeds=tuple(args.seeds) if args.seeds else None,
        removed_per_layer=args.removed_per_layer,
        protocol=args.protocol,
        ood_aggregate=args.ood_aggregate,
        candidates=args.candidates,
    )
    if args.task == "zero-shot" and (args.protocol, args.ood_aggregate) != (None, None):
        raise InputError(
            "--protocol and --ood-aggregate apply to the image and text reports (--task image or "
            "text); the zero-shot report searches on its default sets"
        )
    if args.finetune_recipe is not None and args.no_finetune:
        raise InputError(
            "--finetune-recipe applies to the text report's fine-tuning, which --no-finetune "
            "leaves out: pass one of the two"
        )
    if args.task != "zero-shot" and (args.id_folder or args.prompts or args.towers):
        raise InputError(
            "--id-folder, --prompts and --towers apply to the zero-shot report (--task zero-shot)"
        )
    # under torchrun the processes share the repeats out whole, each working alone (no collective
    # inside a repeat); rank 0 writes the report and alone shows progress bars
    bars = stage_bars() if distributed.job_rank() == 0 else None
    if args.task == "zero-shot":
        _text_only_recipe(args)
        _no_efficient(args)
        if distributed.job_size() > 1:
            raise InputError("the zero-shot report has no repeats to share: run it alone")
        from hydra_core.models.zero_shot import prompt_templates
        from hydra_core.report.zero_shot import run_zero_shot_report
        from hydra_core.report.zero_shot_config import (
            DEFAULT_ZERO_SHOT_OUT,
            zero_shot_config_from_args,
        )

        overrides.update(
            id_folder=args.id_folder,
            templates=prompt_templates(args.prompts),
            removed_per_layer=args.removed_per_layer,
            towers=args.towers,
        )
        config = zero_shot_config_from_args(args.quick, **overrides)
        out = args.out or DEFAULT_ZERO_SHOT_OUT
        run_zero_shot_report(config, out, progress=bars, log=tqdm.write, overwrite=args.overwrite)
        return 0
    if args.efficient is not None:  # `--efficient` alone: () (none), not None (the default)
        overrides["efficient"] = tuple(dict.fromkeys(args.efficient))
    if args.task == "text":
        from hydra_core.report.text import run_text_report
        from hydra_core.report.text_config import DEFAULT_TEXT_OUT, text_config_from_args

        config = text_config_from_args(args.quick, args.finetune_recipe, **overrides)
        off = {"finetune": args.no_finetune, "deep": args.no_deep_ensemble}
        config = replace(config, **{k: None for k, on in off.items() if on})
        with distributed.alone():
            run_text_report(
                config,
                args.out or DEFAULT_TEXT_OUT,
                progress=bars,
                log=tqdm.write,
                overwrite=args.overwrite,
            )
        return 0
    _text_only_recipe(args)
    config = config_from_args(args.quick, **overrides)
    if args.no_finetune:
        config = replace(config, finetune=None)
    if args.no_deep_ensemble:
        config = replace(config, deep_ensemble=False)
    with distributed.alone():
        run_report(
            config, args.out or DEFAULT_OUT, progress=bars, log=tqdm.write, overwrite=args.overwrite
        )
    return 0
