"""Commands for text models: train-text."""

from __future__ import annotations

import argparse

from hydra_core.cli.common import command, progress_bar

#: train-text's encoders: the built-in model each one's asset makes
BASES = {"minilm": "minilm-sentiment", "mpnet": "mpnet-sentiment"}


def _train_text_arguments(p: argparse.ArgumentParser) -> None:
    from hydra_core.zoo.minilm import TextTrainConfig
    from hydra_core.zoo.mpnet import HeadTrainConfig

    d, h = TextTrainConfig(), HeadTrainConfig()

    def both(name: str) -> str:
        return f"(default: minilm {getattr(d, name)}, mpnet {getattr(h, name)})"

    p.add_argument(
        "--base",
        choices=sorted(BASES),
        default="minilm",
        help="the encoder: minilm (makes minilm-sentiment: its top layers, pooler and classifier "
        "fine-tuned) or mpnet (makes mpnet-sentiment: only its classification head trained, on "
        "the frozen encoder's token-0 states) (default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=d.seed, help="random seed (default: %(default)s)")
    p.add_argument(
        "--trained-layers",
        type=int,
        default=None,
        help=f"minilm only: top encoder layers trained, with the pooler and classifier (default: "
        f"{d.trained_layers})",
    )
    p.add_argument(
        "--epochs",
        type=int,
        default=None,
        help=f"epochs; the one of best validation NLL is kept {both('epochs')}",
    )
    p.add_argument("--batch-size", type=int, default=None, help=f"batch size {both('batch_size')}")
    p.add_argument("--lr", type=float, default=None, help=f"AdamW peak learning rate {both('lr')}")
    p.add_argument(
        "--max-length",
        type=int,
        default=None,
        help=f"tokens a sentence is cut to {both('max_length')}",
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
        "--output",
        default=None,
        help="the safetensors asset to write (default: hydra_core/assets/minilm_sentiment."
        "safetensors, or mpnet_sentiment.safetensors for --base mpnet)",
    )


@command("train-text", _train_text_arguments)
def _train_text(args: argparse.Namespace) -> int:
    """Train minilm-sentiment (or mpnet-sentiment with --base mpnet) on Rotten Tomatoes.

    Writes the trained tensors (float16) with the recipe and accuracies in the header."""
    from tqdm import tqdm

    from hydra_core.errors import InputError
    from hydra_core.zoo import minilm, mpnet

    for option, least in (("n_train", 2), ("n_eval", 2), ("epochs", 1), ("trained_layers", 1)):
        value = getattr(args, option)
        if value is not None and value < least:
            raise InputError(f"--{option.replace('_', '-')} must be at least {least}, got {value}")
    if args.base == "mpnet" and args.trained_layers is not None:
        raise InputError(
            "--trained-layers applies to --base minilm; --base mpnet trains the classification "
            "head alone (its encoder is bert-base size, too large to ship fine-tuned layers of)"
        )
    options = {
        name: getattr(args, name)
        for name in ("trained_layers", "epochs", "batch_size", "lr", "max_length")
        if getattr(args, name) is not None
    }
    common = {"seed": args.seed, "n_train": args.n_train, "n_eval": args.n_eval}
    progress = progress_bar("train-text")
    if args.base == "mpnet":
        output = args.output or str(mpnet.ASSET)
        cfg = mpnet.HeadTrainConfig(**common, **options)
        model, header = mpnet.train_mpnet_head(cfg, log=tqdm.write, progress=progress)
    else:
        output = args.output or str(minilm.ASSET)
        cfg = minilm.TextTrainConfig(**common, **options)
        model, header = minilm.train_minilm(cfg, log=tqdm.write, progress=progress)
    minilm.save_asset(model, output, header)
    print(
        f"wrote {output} (validation accuracy {header['validation_accuracy']:.4f}, test "
        f"accuracy {header['test_accuracy']:.4f} as stored)"
    )
    return 0
