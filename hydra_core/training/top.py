"""Training a text model's top on states cached below it: fine-tuning after pruning (paper D.2)
and the fresh heads of Deep Ensembles (D).

The frozen layers (embedding and the first blocks) run once over the training sentences
(:func:`~hydra_core.training.prefix.state_batches`); every optimiser step then runs only the
trained blocks and the head (:func:`~hydra_core.training.prefix.top_logits`), in the one training
loop (:func:`~hydra_core.training.trainer.train`). :func:`finetune_top` trains a copy of a model
(pruned first when a head mask is given), reading and writing the trained tensors through the
disk cache."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn

from hydra_core.cache import DiskCache, cache_key, model_fingerprint
from hydra_core.data.images import stable_permutation, take
from hydra_core.data.text import TextSet
from hydra_core.models.adapter import family_of, prune_heads
from hydra_core.training.prefix import StateBatch, state_batches, top_logits, trained_parameters
from hydra_core.training.schedules import warmup_linear
from hydra_core.training.trainer import TrainerConfig, train

#: part of every fine-tuning cache key; changes whenever the weights a run produces change
TOP_FINETUNE_VERSION = "text-top-finetune-1"
TOP_FINETUNE_CACHE_KIND = "text-finetune"


#: the recipes by name (:data:`TOP_RECIPES`); ``fast`` is the one every cache entry made before
#: recipes had names was trained with
RECIPES = ("fast", "paper", "paper-short")
#: what the epoch choice ranks on: validation NLL (ties: none) or accuracy (ties: lower NLL)
CHOOSE_ON = ("nll", "accuracy")


@dataclass(frozen=True)
class TopFinetuneConfig:
    """How a text model's top is trained on states cached below it (:func:`finetune_top`).

    Args:
        recipe: the name of the recipe this configuration is (or was derived from): part of
            every cache key, so runs of two recipes never share an entry (:data:`TOP_RECIPES`).
        trained_layers: top encoder layers trained, with the head (the family's "head"
            parameters: BERT's pooler and classifier); 0 trains the head alone, None every
            encoder layer (the embedding stays frozen: the members of a Hydra share it).
        epochs: passes over the training sentences (at most, with ``patience``); with more than
            one and validation sentences, the best epoch by ``choose_on`` is kept (as
            ``train-text`` does).
        steps: optimiser steps instead of epochs (quick runs), no epoch choice.
        batch_size: sentences per step (batches of similar lengths, their order shuffled).
        lr: AdamW peak learning rate; weight_decay: on weight matrices only.
        warmup: share of the steps of linear warm-up; then linear decay to zero (D.2).
        grad_clip: the gradient's global L2 norm is clipped to this (D.2: 1.0).
        n_train: a fixed random subset of the training sentences (None: all).
        reinit_head: re-initialise the head from the seed first (Deep Ensembles' heads).
        n_validation: training sentences held out (a fixed random subset, never trained on) to
            choose the epoch and stop early (None: the caller's ``validation_set``, if any).
        choose_on: ``"nll"`` or ``"accuracy"`` (ties: lower NLL) of the validation sentences.
        patience: stop once this many epochs in a row did not beat the best (None: never).
    """

    trained_layers: int | None = 2  # as train-text: encoder layers 4-5 of MiniLM's 0-5
    epochs: int = 1
    steps: int | None = None
    batch_size: int = 32
    lr: float = 3e-4  # chosen on validation sentences (module docstring)
    weight_decay: float = 0.01  # as C.2 and train-text
    warmup: float = 0.1  # D.2
    grad_clip: float | None = 1.0  # D.2
    n_train: int | None = 2000  # of the 6,030 Rotten Tomatoes training sentences
    reinit_head: bool = False
    recipe: str = "fast"
    n_validation: int | None = None
    choose_on: str = "nll"
    patience: int | None = None

    def __post_init__(self) -> None:
        layers = 0 if self.trained_layers is None else self.trained_layers
        if layers < 0 or self.epochs < 1 or self.batch_size < 1 or not self.lr > 0:
            raise ValueError(
                "trained_layers must be >= 0, epochs and batch_size >= 1 and lr > 0; got "
                f"{self.trained_layers}, {self.epochs}, {self.batch_size}, {self.lr}"
            )
        if self.steps is not None and self.steps < 1:
            raise ValueError(
                f"steps must be a positive number of steps (or None), got {self.steps}"
            )
        if self.recipe not in RECIPES or self.choose_on not in CHOOSE_ON:
            raise ValueError(
                f"recipe must be one of {', '.join(RECIPES)} and choose_on one of "
                f"{', '.join(CHOOSE_ON)}; got {self.recipe!r} and {self.choose_on!r}"
            )
        if (self.n_validation is not None and self.n_validation < 1) or (
            self.patience is not None and self.patience < 1
        ):
            raise ValueError(
                f"n_validation and patience must be >= 1 (or None), got {self.n_validation} and "
                f"{self.patience}"
            )

    def identity(self) -> dict:
        """The configuration as its cache keys hold it: the fields added with named recipes are
        left out while they have the values every earlier run had, so that the entries of
        those runs (all ``fast``) are still found; any other value changes the key."""
        settings = asdict(self)
        for name, value in _BEFORE_RECIPES.items():
            if settings[name] == value:
                del settings[name]
        return settings


#: the fields named recipes added, at the values every run before them had
_BEFORE_RECIPES = {"recipe": "fast", "n_validation": None, "choose_on": "nll", "patience": None}

#: The named recipes of fine-tuning after pruning. ``fast``: the top two encoder layers, the pooler
#: and the classifier, one epoch of 2,000 training sentences at lr 3e-4 (the text report's recipe
#: until the paper's was measured: docs/text.md). ``paper``: D.2's recipe for BERT on SST-2:
#: every encoder layer, the pooler and the classifier, AdamW at lr 1e-5, 10% linear warm-up then
#: linear decay, clipping at 1.0, up to 7 epochs of the training sentences, early stopping on the
#: accuracy of held-out training sentences with patience 2, the best epoch's weights kept.
#: ``paper-short``: the paper's recipe on 2,000 of the training sentences for at most 3 epochs,
#: patience 1 (what two CPU cores afford a report: docs/text.md).
TOP_RECIPES = {
    "fast": TopFinetuneConfig(),
    "paper": TopFinetuneConfig(
        recipe="paper",
        trained_layers=None,
        epochs=7,
        lr=1e-5,
        n_train=None,
        n_validation=600,
        choose_on="accuracy",
        patience=2,
    ),
    "paper-short": TopFinetuneConfig(
        recipe="paper-short",
        trained_layers=None,
        epochs=3,
        lr=1e-5,
        n_train=2000,
        n_validation=600,
        choose_on="accuracy",
        patience=1,
    ),
}


#: the recipe the text report fine-tunes pruned models and members with: the paper's, shortened to
#: what two CPU cores afford a report (docs/text.md measures the three recipes' cost and accuracy)
DEFAULT_TOP_RECIPE = "paper-short"


def quick_version(config: TopFinetuneConfig) -> TopFinetuneConfig:
    """``config`` cut to one optimiser step of 16 sentences out of 32, nothing held out (the
    quick reports' fine-tuning: every section in well under a minute on a tiny model)."""
    return replace(config, steps=1, n_train=32, batch_size=16, n_validation=None, patience=None)


def top_recipe(name: str) -> TopFinetuneConfig:
    """The recipe called ``name`` (:data:`TOP_RECIPES`)."""
    if name not in TOP_RECIPES:
        raise ValueError(f"recipe must be one of {', '.join(TOP_RECIPES)}, got {name!r}")
    return TOP_RECIPES[name]


def held_out_split(train_set: TextSet, config: TopFinetuneConfig) -> tuple[TextSet, TextSet | None]:
    """(training sentences, validation sentences): ``config.n_validation`` sentences of
    ``train_set`` held out (a fixed shuffle of the set's name, the rest in order), then
    ``config.n_train`` of the others; (``config.n_train`` of them, None) without a hold-out."""
    if config.n_validation is None:
        return take(train_set, config.n_train, purpose="text-finetune"), None
    if config.n_validation >= len(train_set):
        raise ValueError(
            f"n_validation={config.n_validation} leaves no training sentence of {len(train_set)}"
        )
    order = stable_permutation(len(train_set), train_set.name, "text-finetune-validation")
    held = order[: config.n_validation]
    rest = order[config.n_validation :].sort().values
    trained = take(train_set.subset(rest), config.n_train, purpose="text-finetune")
    return trained, train_set.subset(held.sort().values)


def pruned_copy(model: nn.Module, keep: torch.Tensor) -> nn.Module:
    """``prune_heads(model, keep)`` without the weights fingerprint the copy inherits from
    ``model`` (a deep copy keeps it, and a freshly loaded model's tensor versions can match the
    pruned copy's, so the stale fingerprint would pass for the copy's and its predictions would
    be read from the source model's cache entry)."""
    return unstamped(prune_heads(model, keep))


def unstamped(model: nn.Module) -> nn.Module:
    """``model`` without a remembered weights fingerprint (it is recomputed on first use)."""
    model.__dict__.pop("_hydra_fingerprint", None)
    return model


def reinit_head(model: nn.Module, seed: int) -> None:
    """Re-initialise every layer made of "head" parameters only (PyTorch's default
    initialisation), from ``seed``; the caller's random state is left as it was."""
    family = family_of(model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for prefix, module in model.named_modules():
            own = [
                f"{prefix}.{n}" if prefix else n for n, _ in module.named_parameters(recurse=False)
            ]
            heads = [family.parameter_kind(model, n) == "head" for n in own]
            if own and all(heads) and hasattr(module, "reset_parameters"):
                module.reset_parameters()


@torch.no_grad()
def state_nll(model: nn.Module, frozen: int, batches: Sequence[StateBatch]) -> tuple[float, float]:
    """(mean NLL, accuracy) of the eval-mode model on state batches."""
    model.eval()
    nll, correct, n = 0.0, 0, 0
    for batch in batches:
        logits = top_logits(model, frozen, batch.states, batch.context)
        nll += float(F.cross_entropy(logits, batch.labels, reduction="sum"))
        correct += int((logits.argmax(-1) == batch.labels).sum())
        n += len(batch.labels)
    return nll / n, correct / n


def train_top(
    model: nn.Module,
    batches: Sequence[StateBatch],
    config: TopFinetuneConfig,
    frozen: int,
    seed: int,
    validation: Sequence[StateBatch] | None,
    progress: Callable[[int, int], None] | None,
) -> list[dict]:
    """Train the top of ``model`` in place with :func:`~hydra_core.training.trainer.train`: AdamW,
    linear warm-up then linear decay, clipping, dropout on; the state batches in a new random
    order every epoch. With several epochs and validation batches, the best epoch by
    ``config.choose_on`` is kept, and ``config.patience`` stops the run early. Returns the
    history: per step, its learning rate and loss (and the validation scores at an epoch's end),
    then the chosen epoch (and ``stopped_early``, when the run stopped before its last step)."""
    total = config.steps or config.epochs * len(batches)
    choose = bool(validation) and config.epochs > 1 and config.steps is None

    def shuffled(generator: torch.Generator) -> list[StateBatch]:
        order = torch.randperm(len(batches), generator=generator).tolist()
        return [batches[i] for i in reversed(order)]

    def scores() -> dict:
        nll, accuracy = state_nll(model, frozen, validation)
        return {"nll": nll, "accuracy": accuracy}

    result = train(
        model,
        trained_parameters(model, frozen),
        lambda batch: (top_logits(model, frozen, batch.states, batch.context), batch.labels),
        shuffled,
        TrainerConfig(
            steps=total,
            lr=config.lr,
            weight_decay=config.weight_decay,
            grad_clip=config.grad_clip,
            seed=seed,
            dropout_seed=seed,
            patience=config.patience if choose else None,
        ),
        warmup_linear(config.lr, max(1, round(config.warmup * total)), total, fraction_first=True),
        validate=scores if choose else None,
        rank=(lambda s: (s["nll"],)) if config.choose_on == "nll" else _by_accuracy,
        progress=progress,
    )
    history = [{"step": s.step, "lr": s.lr, "loss": round(s.loss, 5)} for s in result.steps]
    for epoch in result.epochs:
        if epoch.scores:
            history[epoch.steps - 1].update(
                val_nll=round(epoch.scores["nll"], 5), val_accuracy=epoch.scores["accuracy"]
            )
    if result.chosen is not None:
        chosen = {"chosen_epoch": result.chosen, "val_nll": round(result.chosen_scores["nll"], 5)}
        if config.choose_on != "nll":
            chosen["val_accuracy"] = result.chosen_scores["accuracy"]
        if result.stopped_early:
            chosen["stopped_early"] = True
        history.append(chosen)
    for p in model.parameters():
        p.requires_grad_(True)
    return history


def _by_accuracy(scores: dict) -> tuple:
    """Higher validation accuracy first, then lower NLL."""
    return (-scores["accuracy"], scores["nll"])


@dataclass
class TopFinetuned:
    """A model whose top was trained by :func:`finetune_top`."""

    name: str
    model: nn.Module
    seed: int
    history: list[dict] = field(repr=False)
    seconds: float
    cached: bool = False


def finetune_top(
    model: nn.Module,
    train_set: TextSet,
    config: TopFinetuneConfig,
    *,
    preprocess: Callable[[Sequence[str]], torch.Tensor],
    keep: torch.Tensor | None = None,
    validation_set: TextSet | None = None,
    seed: int = 0,
    name: str = "model",
    device: str | torch.device = "cpu",
    cache: DiskCache | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> TopFinetuned:
    """A copy of ``model`` (pruned to ``keep`` first, when given) with its top layers and head
    trained on ``train_set``; the layers below run once over the training sentences and their
    output is kept for every step.

    Args:
        model: the source model; never modified.
        train_set: labelled sentences; ``config.n_train`` of them, a fixed random subset.
        config: what is trained and how.
        preprocess: sentences -> packed token ids (the loaded model's).
        keep: head mask on ``model``: the copy is ``prune_heads(model, keep)``.
        validation_set: labelled sentences that choose the epoch when ``config.epochs > 1``
            (refused with ``config.n_validation``, which holds them out of ``train_set``).
        seed: head initialisation (``config.reinit_head``), batch order and dropout.
        device: where to train; cache: the trained tensors are read from and saved to it.
        progress: ``progress(done, total)`` after every optimiser step.
    """
    tuned = pruned_copy(model, keep) if keep is not None else unstamped(copy.deepcopy(model))
    parts = (model_fingerprint(model), keep)
    return finetune_copy(
        tuned,
        parts,
        train_set,
        config,
        preprocess,
        validation_set,
        seed,
        name,
        None,
        device,
        cache,
        progress,
    )


def finetune_copy(
    tuned: nn.Module,
    key_parts: tuple,
    train_set: TextSet,
    config: TopFinetuneConfig,
    preprocess: Callable[[Sequence[str]], torch.Tensor],
    validation_set: TextSet | None,
    seed: int,
    name: str,
    states: Callable[[], list[StateBatch]] | None,
    device: str | torch.device,
    cache: DiskCache | None,
    progress: Callable[[int, int], None] | None,
) -> TopFinetuned:
    """Train the top of ``tuned`` in place, or load what an earlier run trained (``key_parts``
    name the source model and how ``tuned`` was made from it). ``states``: the training states,
    when the caller shares them between several copies."""
    device = torch.device(device)
    tuned.to(device).eval()
    layers = len(family_of(tuned).blocks(tuned))
    frozen = 0 if config.trained_layers is None else layers - config.trained_layers
    if frozen < 0:
        raise ValueError(f"trained_layers={config.trained_layers}, but the model has {layers}")
    if config.n_validation is not None and validation_set is not None:
        raise ValueError(
            f"the {config.recipe} recipe holds its validation sentences out of the training "
            "sentences (n_validation); pass no validation_set"
        )
    data, held_out = held_out_split(train_set, config)
    validation_set = held_out if held_out is not None else validation_set
    choose = validation_set is not None and config.epochs > 1 and config.steps is None
    key = None
    if config.reinit_head:
        reinit_head(tuned, seed)
    if cache is not None:
        key = cache_key(
            TOP_FINETUNE_VERSION,
            *key_parts,
            config.identity(),
            data.fingerprint(),
            validation_set.fingerprint() if choose else None,
            seed,
        )
        stored = cache.load(TOP_FINETUNE_CACHE_KIND, key)
        if isinstance(stored, dict) and "state" in stored:
            tuned.load_state_dict(stored["state"], strict=False)
            if progress:
                progress(1, 1)
            return TopFinetuned(
                name, tuned.eval(), seed, stored["history"], stored["seconds"], cached=True
            )
    start = time.perf_counter()
    if states is None:
        batches = state_batches(tuned, preprocess, data, frozen, config.batch_size, device)
    else:
        batches = states()
    validation = (
        state_batches(tuned, preprocess, validation_set, frozen, 256, device) if choose else None
    )
    history = train_top(tuned, batches, config, frozen, seed, validation, progress)
    seconds = time.perf_counter() - start
    if cache is not None:
        trained = trained_parameters(tuned, frozen)
        state = {k: p.detach().cpu().clone() for k, p in trained.items()}
        cache.save(
            TOP_FINETUNE_CACHE_KIND, key, {"state": state, "history": history, "seconds": seconds}
        )
    return TopFinetuned(name, tuned.eval(), seed, history, seconds)
