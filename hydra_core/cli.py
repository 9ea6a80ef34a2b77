"""Command line: ``python -m hydra_core <command> --help``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

COMMANDS: dict[
    str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
] = {}


def command(name: str, add_arguments: Callable[[argparse.ArgumentParser], None]):
    """Register ``run(args) -> exit code`` as the sub-command ``name``."""

    def register(run: Callable[[argparse.Namespace], int]):
        COMMANDS[name] = (add_arguments, run)
        return run

    return register


def _train_arguments(p: argparse.ArgumentParser) -> None:
    from hydra_core.models.default import DEFAULT_CHECKPOINT, TrainConfig

    d = TrainConfig()
    p.add_argument("--seed", type=int, default=d.seed, help="random seed (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=d.epochs, help="epochs (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="default: %(default)s")
    p.add_argument(
        "--lr", type=float, default=d.lr, help="AdamW peak learning rate (default: %(default)s)"
    )
    p.add_argument(
        "--warmup-epochs", type=float, default=d.warmup_epochs, help="default: %(default)s"
    )
    p.add_argument(
        "--pad-crop",
        type=int,
        default=d.pad_crop,
        help="random-crop augmentation padding in pixels, 0 = off (default: %(default)s)",
    )
    p.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    p.add_argument(
        "--out", default=str(DEFAULT_CHECKPOINT), help="where to write the safetensors checkpoint"
    )


@command("train", _train_arguments)
def _train(args: argparse.Namespace) -> int:
    """Train the default ViT architecture on Fashion-MNIST (reproduces the shipped checkpoint)."""
    import torch
    from tqdm import tqdm

    from hydra_core.models.default import TrainConfig, VitConfig, save_checkpoint, train_vit

    if args.threads:
        torch.set_num_threads(args.threads)
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

    model, summary = train_vit(cfg, log=tqdm.write, progress=progress)
    bar.close()
    from dataclasses import asdict

    save_checkpoint(model, args.out, VitConfig(), train_config=asdict(cfg), summary=summary)
    print(f"wrote {args.out} (test accuracy {summary['test_accuracy']:.4f})")
    return 0


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """--model/--arch/--device: which model to load and where to run it."""
    p.add_argument(
        "--model",
        default="default",
        help="'default', 'dinov2-s', a timm model name (online) or a checkpoint file "
        "(default: %(default)s)",
    )
    p.add_argument("--arch", default=None, help="timm architecture of a foreign checkpoint file")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    p.add_argument("--batch-size", type=int, default=256, help="default: %(default)s")


def add_data_arguments(
    p: argparse.ArgumentParser, *, n_search: int | None = 512, n_report: int | None = None
) -> None:
    """--n-search/--n-report/--ood: which images the command uses."""
    p.add_argument(
        "--n-search",
        type=int,
        default=n_search,
        help="images per set in the search split (default: %(default)s)",
    )
    p.add_argument(
        "--n-report",
        type=int,
        default=n_report,
        help="images per set in the report split (default: all)",
    )
    p.add_argument(
        "--ood",
        nargs="+",
        default=None,
        metavar="NAME",
        help="OOD sets to use (default: all of mnist, animal_silhouettes, digits8x8, "
        "textures, noise; none when --ood-folder is given)",
    )
    p.add_argument(
        "--id-folder",
        default=None,
        metavar="PATH",
        help="an ImageFolder of your own (one sub-folder per class, in the model's class order) "
        "instead of Fashion-MNIST; split once into search and report halves",
    )
    p.add_argument(
        "--ood-folder",
        nargs="+",
        default=[],
        metavar="[near:|far:]PATH",
        help="extra OOD image folders, e.g. near:/data/a far:/data/b (a bare path is far)",
    )


def progress_bar(description: str):
    """A tqdm-backed ``progress(done, total)`` callback, silent when stderr is not a terminal."""
    from tqdm import tqdm

    bar = tqdm(desc=description, total=None, disable=not sys.stderr.isatty(), leave=False)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return update


def load_for_cli(args: argparse.Namespace):
    """The model and benchmark named by the common arguments."""
    from hydra_core.data.benchmark import folder_benchmark
    from hydra_core.data.ood import OOD_SETS
    from hydra_core.models.registry import input_format, load_model

    loaded = load_model(args.model, arch=args.arch)
    default_ood = [] if args.ood_folder else list(OOD_SETS)  # folders alone replace the defaults
    channels, size = input_format(loaded.model)
    benchmark = folder_benchmark(
        id_folder=args.id_folder,
        ood=default_ood if args.ood is None else args.ood,
        ood_folders=args.ood_folder,
        size=size,
        channels=channels,
        n_search=args.n_search,
        n_report=args.n_report,
    )
    return loaded, benchmark


def _eval_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    add_data_arguments(p)
    p.add_argument(
        "--score",
        default="msp",
        choices=("msp", "max_logit", "energy", "entropy"),
        help="OOD score, higher = more in-distribution (default: %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


@command("eval", _eval_arguments)
def _eval(args: argparse.Namespace) -> int:
    """Evaluate a model on the ID report split and every OOD set (accuracy, calibration, OOD)."""
    import json

    from hydra_core.cache import DiskCache
    from hydra_core.evaluate import evaluate_model

    loaded, benchmark = load_for_cli(args)
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
        score=args.score,
        cache=DiskCache(),
        progress=report,
    )
    if args.json:
        print(json.dumps(evaluation.to_json(loaded.card()), indent=2))
    else:
        print(format_table(evaluation.table()))
    return 0


def format_table(table) -> str:
    """A metrics table as aligned text (4 decimals)."""
    return table.to_string(index=False, float_format=lambda v: f"{v:.4f}")


def _info_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    add_data_arguments(p, n_report=2000)
    p.add_argument("--json", action="store_true", help="print JSON")


@command("info", _info_arguments)
def _info(args: argparse.Namespace) -> int:
    """Show the model card: layers, heads, parameters, ID accuracy and OOD AUROC per OOD set."""
    import json

    from hydra_core.cache import DiskCache
    from hydra_core.evaluate import model_card

    loaded, benchmark = load_for_cli(args)
    card = model_card(
        loaded, benchmark, cache=DiskCache(), device=args.device, batch_size=args.batch_size
    )
    if args.json:
        print(json.dumps(card, indent=2))
        return 0
    width = max(len(k) for k in card if k != "ood_auroc")
    for key, value in card.items():
        if key == "ood_auroc":
            for name, auroc in value.items():
                print(f"{'AUROC ' + name:>{width + 12}}  {auroc:.4f}")
        else:
            print(
                f"{key:>{width + 12}}  {value:.4f}"
                if isinstance(value, float)
                else f"{key:>{width + 12}}  {value}"
            )
    return 0


def build_parser() -> argparse.ArgumentParser:
    import hydra_core.cli_analysis  # noqa: F401 - registers search, importance, represent, cahp
    import hydra_core.cli_hydra  # noqa: F401 - registers masks, hydra, train-ensemble, report

    parser = argparse.ArgumentParser(
        prog="python -m hydra_core",
        description="Hydra Lab: find the attention heads that carry a transformer's uncertainty, "
        "and fuse pruned members into one Hydra ensemble.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (add_arguments, run) in COMMANDS.items():
        doc = (run.__doc__ or "").strip().splitlines()[0] if run.__doc__ else ""
        p = sub.add_parser(name, help=doc, description=doc)
        add_arguments(p)
        p.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)
