"""Commands for text models: train-text."""

from __future__ import annotations

import argparse

from hydra_core.cli.common import command, progress_bar


def _train_text_arguments(p: argparse.ArgumentParser) -> None:
    from hydra_core.models.minilm import ASSET, TextTrainConfig

    d = TextTrainConfig()
    p.add_argument("--seed", type=int, default=d.seed, help="random seed (default: %(default)s)")
    p.add_argument(
        "--trained-layers",
        type=int,
        default=d.trained_layers,
        help="top encoder layers trained, with the pooler and classifier (default: %(default)s)",
    )
    p.add_argument("--epochs", type=int, default=d.epochs, help="default: %(default)s")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="default: %(default)s")
    p.add_argument(
        "--lr", type=float, default=d.lr, help="AdamW peak learning rate (default: %(default)s)"
    )
    p.add_argument(
        "--max-length",
        type=int,
        default=d.max_length,
        help="tokens a sentence is cut to (default: %(default)s)",
    )
    p.add_argument(
        "--n-train",
        type=int,
        default=None,
        help="train on a random subset of this many sentences (default: all 6,030)",
    )
    p.add_argument(
        "--n-eval",
        type=int,
        default=None,
        help="validate and test on a random subset of this many sentences each, for a quick "
        "check (default: all 1,000 and 1,500)",
    )
    p.add_argument(
        "--output", default=str(ASSET), help="the safetensors asset to write (default: %(default)s)"
    )


@command("train-text", _train_text_arguments)
def _train_text(args: argparse.Namespace) -> int:
    """Fine-tune all-MiniLM-L6-v2's top layers on Rotten Tomatoes (reproduces minilm-sentiment).

    Writes the trained tensors (float16) with the recipe and accuracies in the header."""
    from tqdm import tqdm

    from hydra_core.errors import InputError
    from hydra_core.models.minilm import TextTrainConfig, save_asset, train_minilm

    for option, least in (("n_train", 2), ("n_eval", 2), ("epochs", 1), ("trained_layers", 1)):
        value = getattr(args, option)
        if value is not None and value < least:
            raise InputError(f"--{option.replace('_', '-')} must be at least {least}, got {value}")
    cfg = TextTrainConfig(
        seed=args.seed,
        trained_layers=args.trained_layers,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        max_length=args.max_length,
        n_train=args.n_train,
        n_eval=args.n_eval,
    )
    model, header = train_minilm(cfg, log=tqdm.write, progress=progress_bar("train-text"))
    save_asset(model, args.output, header)
    print(
        f"wrote {args.output} (validation accuracy {header['validation_accuracy']:.4f}, test "
        f"accuracy {header['test_accuracy']:.4f} as stored)"
    )
    return 0
