"""Command line: ``python -m hydra_core <command> --help``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


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
    p.add_argument("--lr", type=float, default=d.lr, help="AdamW peak learning rate (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--out", default=str(DEFAULT_CHECKPOINT), help="where to write the safetensors checkpoint")


@command("train", _train_arguments)
def _train(args: argparse.Namespace) -> int:
    """Train the default ViT architecture on Fashion-MNIST (reproduces the shipped checkpoint)."""
    import torch
    from tqdm import tqdm

    from hydra_core.models.default import TrainConfig, VitConfig, save_checkpoint, train_vit

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = TrainConfig(seed=args.seed, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr)
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


def build_parser() -> argparse.ArgumentParser:
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
