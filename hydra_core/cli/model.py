"""Commands on a whole model: train, eval, info."""

from __future__ import annotations

import argparse
import sys

import hydra_core.cli.options as options
from hydra_core.cli.common import (
    add_data_arguments,
    add_model_arguments,
    add_output_arguments,
    command,
    format_table,
    load_for_cli,
    progress_bar,
    warn_near_chance,
)
from hydra_core.errors import InputError


def _train_arguments(p: argparse.ArgumentParser) -> None:
    from hydra_core.zoo.default import TrainConfig

    d = TrainConfig()
    p.add_argument(
        "--seed", type=options.seed, default=d.seed, help="random seed (default: %(default)s)"
    )
    p.add_argument(
        "--epochs",
        type=options.positive_int,
        default=d.epochs,
        help="epochs (default: %(default)s)",
    )
    p.add_argument(
        "--batch-size", type=options.positive_int, default=d.batch_size, help="default: %(default)s"
    )
    p.add_argument(
        "--lr",
        type=options.positive_float,
        default=d.lr,
        help="AdamW peak learning rate (default: %(default)s)",
    )
    p.add_argument(
        "--warmup-epochs",
        type=options.non_negative_float,
        default=d.warmup_epochs,
        help="default: %(default)s",
    )
    p.add_argument(
        "--pad-crop",
        type=options.non_negative_int,
        default=d.pad_crop,
        help="random-crop augmentation padding in pixels, 0 = off (default: %(default)s)",
    )
    add_output_arguments(
        p,
        "results/train/vit_seed<seed>.safetensors; never the shipped checkpoint",
        what="safetensors checkpoint",
    )


@command("train", _train_arguments)
def _train(args: argparse.Namespace) -> int:
    """Train the default ViT architecture on Fashion-MNIST (reproduces the shipped checkpoint)."""
    from tqdm import tqdm

    from hydra_core.outputs import check_output, write_output
    from hydra_core.training.trainer import resume_path
    from hydra_core.zoo.default import TrainConfig, VitConfig, save_checkpoint, train_vit

    out = check_output(
        args.out or f"results/train/vit_seed{args.seed}.safetensors", overwrite=args.overwrite
    )  # refused before training, not after
    cfg = TrainConfig(
        seed=args.seed,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup_epochs=args.warmup_epochs,
        pad_crop=args.pad_crop,
    )
    bar = tqdm(total=None, unit="step", disable=not sys.stderr.isatty())

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    resume = resume_path(out)  # Ctrl-C and the same command go on from the last epoch
    model, summary = train_vit(cfg, log=tqdm.write, progress=progress, resume=resume)
    bar.close()
    from dataclasses import asdict

    write_output(
        out,
        lambda tmp: save_checkpoint(
            model, tmp, VitConfig(), train_config=asdict(cfg), summary=summary
        ),
    )
    resume.unlink(missing_ok=True)
    print(f"wrote {out} (test accuracy {summary['test_accuracy']:.4f})")
    return 0


def _eval_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    add_data_arguments(p)
    options.add_scores_argument(p, "the first gives the main table, every one its OOD metrics")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


@command("eval", _eval_arguments)
def _eval(args: argparse.Namespace) -> int:
    """Evaluate a model on the report data (ID and report OOD sets): accuracy, calibration, OOD."""
    import json

    from hydra_core.cache import DiskCache
    from hydra_core.evaluate import evaluate_model, format_intervals
    from hydra_core.ood_scores import scores_table

    loaded, benchmark = load_for_cli(args, fused_ok=True)
    bars: dict = {}

    def report(name: str, done: int, total: int) -> None:
        bars.setdefault(name, progress_bar(f"predict {name}"))(done, total)

    evaluation = evaluate_model(
        loaded.model,
        loaded.preprocess,
        benchmark.id_report,
        benchmark.ood_report,
        name=loaded.name,
        device=args.device,
        batch_size=args.batch_size,
        cache=DiskCache(),
        progress=report,
    )
    warn_near_chance(args, loaded, evaluation.id_metrics()["accuracy"])
    scored = scored_evaluations(evaluation, args.scores, benchmark)
    main = next(iter(scored.values()))
    if args.json:
        out = main.to_json(loaded.card())
        if len(args.scores) > 1:
            # every requested score's OOD metrics, per report set and averaged
            parts = {s: ev.to_json() for s, ev in scored.items()}
            out["scores"] = {s: {k: j[k] for k in ("ood", "ood_average")} for s, j in parts.items()}
        print(json.dumps(out, indent=2))
    else:
        print(format_table(format_intervals(main.table())))
        if len(args.scores) > 1:
            print("\nOOD metrics per score (OOD positive; 95% bootstrap intervals):")
            print(format_table(format_intervals(scores_table(scored).drop(columns="kind"))))
    return 0


def scored_evaluations(evaluation, scores, benchmark) -> dict:
    """score -> ``evaluation`` under it, for each of ``scores`` that applies to the model (a note
    on stderr for each that does not); an InputError when none does."""
    from hydra_core.ood_scores import rescore

    scored = {}
    for score in scores:
        found = rescore(evaluation, score, benchmark)
        if found is None:
            note = f"note: the {score} score does not apply to this model: left out"
            print(note, file=sys.stderr)
        else:
            scored[score] = found
    if not scored:
        raise InputError(f"--scores: none of {', '.join(scores)} applies to this model")
    return scored


def _info_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    add_data_arguments(p, n_report=2000)
    p.add_argument("--json", action="store_true", help="print JSON")


@command("info", _info_arguments)
def _info(args: argparse.Namespace) -> int:
    """Show the model card: layers, heads, parameters, ID accuracy, AUROC per report OOD set."""
    import json

    from hydra_core.cache import DiskCache
    from hydra_core.evaluate import model_card

    loaded, benchmark = load_for_cli(args, fused_ok=True)
    card = model_card(
        loaded, benchmark, cache=DiskCache(), device=args.device, batch_size=args.batch_size
    )
    warn_near_chance(args, loaded, card["id_accuracy"])
    if args.json:
        print(json.dumps(card, indent=2))
        return 0
    width = max(len(k) for k in card if k != "ood_auroc") + 12
    for key, value in card.items():
        if key == "ood_auroc":
            for name, auroc in value.items():
                lo, hi = card["ood_auroc_ci95"][name]
                print(f"{'AUROC ' + name:>{width}}  {auroc:.4f} [{lo:.4f}, {hi:.4f}]")
        elif key == "id_accuracy":
            lo, hi = card["id_accuracy_ci95"]
            print(f"{key:>{width}}  {value:.4f} [{lo:.4f}, {hi:.4f}]")
        elif not key.endswith("_ci95"):
            print(
                f"{key:>{width}}  {value:.4f}"
                if isinstance(value, float)
                else f"{key:>{width}}  {value}"
            )
    return 0
