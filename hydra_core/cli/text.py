"""Commands for text models: train-text."""

from __future__ import annotations

import argparse

import hydra_core.cli.options as options
from hydra_core.cli.common import command, progress_bar


def _bases() -> dict:
    """train-text's encoders: ``--base`` -> the named model its recipe makes (the first: the
    text default's)."""
    from hydra_core.zoo.named import recipes

    return recipes("train-text")


def _train_text_arguments(p: argparse.ArgumentParser) -> None:
    from hydra_core.models.modality import TEXT_MODALITY
    from hydra_core.zoo.named import default_model

    bases = _bases()
    d = default_model(TEXT_MODALITY).recipe.config()
    defaults = {base: m.recipe.config() for base, m in bases.items()}

    def both(name: str) -> str:
        each = ", ".join(f"{base} {getattr(cfg, name)}" for base, cfg in defaults.items())
        return f"(default: {each})"

    makes = " or ".join(f"{base} (makes {m.name}: {m.recipe.summary})" for base, m in bases.items())
    p.add_argument(
        "--base",
        choices=sorted(bases),
        default=default_model(TEXT_MODALITY).recipe.base,
        help=f"the encoder: {makes} (default: %(default)s)",
    )
    p.add_argument(
        "--recipe",
        choices=("fast", "paper"),
        default=None,
        help="minilm only: fast (the shipped asset's: the top 2 layers, 3 epochs at lr 3e-4, "
        "the epoch of best validation NLL kept) or paper (D.2: every layer, AdamW at lr 1e-5, "
        "10%% warm-up then linear decay, clipping 1.0, up to 7 epochs, early stopping on the "
        "accuracy of 600 held-out training sentences with patience 2); the options below "
        "change the recipe's own values (default: fast)",
    )
    p.add_argument(
        "--seed", type=options.seed, default=d.seed, help="random seed (default: %(default)s)"
    )
    p.add_argument(
        "--trained-layers",
        type=options.positive_int,
        default=None,
        help=f"minilm only: top encoder layers trained, with the pooler and classifier (default: "
        f"{d.trained_layers})",
    )
    p.add_argument(
        "--epochs",
        type=options.positive_int,
        default=None,
        help=f"epochs; the one of best validation NLL is kept {both('epochs')}",
    )
    p.add_argument(
        "--batch-size",
        type=options.positive_int,
        default=None,
        help=f"batch size {both('batch_size')}",
    )
    p.add_argument(
        "--lr",
        type=options.positive_float,
        default=None,
        help=f"AdamW peak learning rate {both('lr')}",
    )
    p.add_argument(
        "--max-length",
        type=options.at_least(3),
        default=None,
        help=f"tokens a sentence is cut to {both('max_length')}",
    )
    p.add_argument(
        "--n-train",
        type=options.at_least(2),
        default=None,
        help="train on a random subset of this many sentences (default: all 6,030)",
    )
    p.add_argument(
        "--n-eval",
        type=options.at_least(2),
        default=None,
        help="validate and test on a random subset of this many sentences each, for a quick "
        "check (default: all 1,000 and 1,500)",
    )
    p.add_argument(
        "--n-validation",
        type=options.positive_int,
        default=None,
        help="minilm only: hold this many training sentences out of the fitting to choose the "
        "epoch and stop early (default: the paper recipe 600, the fast recipe none: the Rotten "
        "Tomatoes validation split chooses)",
    )
    p.add_argument(
        "--output",
        default=None,
        help="the safetensors asset to write (default: results/train-text/<base>_seed<seed>."
        "safetensors; never a shipped hydra_core/assets/ file)",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace --output when it exists already"
    )


@command("train-text", _train_text_arguments)
def _train_text(args: argparse.Namespace) -> int:
    """Train minilm-sentiment (or mpnet-sentiment with --base mpnet) on Rotten Tomatoes.

    Writes the trained tensors (float16) with the recipe and accuracies in the header."""
    from dataclasses import replace

    from tqdm import tqdm

    from hydra_core.errors import InputError
    from hydra_core.outputs import check_output, write_output
    from hydra_core.zoo.minilm import check_max_length

    recipe = _bases()[args.base].recipe
    for name, refusal in recipe.refused.items():
        if getattr(args, name) is not None:
            raise InputError(refusal)
    if args.max_length is not None and recipe.positions is not None:  # before any work
        check_max_length(args.max_length, recipe.positions(), args.base)
    options = {
        name: getattr(args, name)
        for name in ("trained_layers", "epochs", "batch_size", "lr", "max_length")
        if getattr(args, name) is not None
    }
    common = {"seed": args.seed, "n_train": args.n_train, "n_eval": args.n_eval}
    output = check_output(
        args.output or f"results/train-text/{args.base}_seed{args.seed}.safetensors",
        overwrite=args.overwrite,
        option="--output",
    )  # refused before training, not after
    progress = progress_bar("train-text")
    if args.n_validation is not None:
        options["n_validation"] = args.n_validation
    if recipe.variants:
        cfg = replace(
            recipe.variants[args.recipe or next(iter(recipe.variants))], **common, **options
        )
    else:
        cfg = recipe.config(**common, **options)
    model, header = recipe.train(cfg, log=tqdm.write, progress=progress)
    write_output(output, lambda tmp: recipe.save(model, tmp, header))
    print(
        f"wrote {output} (validation accuracy {header['validation_accuracy']:.4f}, test "
        f"accuracy {header['test_accuracy']:.4f} as stored)"
    )
    return 0
