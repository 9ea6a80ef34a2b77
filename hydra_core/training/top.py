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
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from hydra_core.cache import DiskCache, cache_key, model_fingerprint
from hydra_core.data.images import take
from hydra_core.data.text import TextSet
from hydra_core.models.adapter import family_of, prune_heads
from hydra_core.training.prefix import StateBatch, state_batches, top_logits, trained_parameters
from hydra_core.training.schedules import warmup_linear
from hydra_core.training.trainer import TrainerConfig, train

#: part of every fine-tuning cache key; changes whenever the weights a run produces change
TOP_FINETUNE_VERSION = "text-top-finetune-1"
TOP_FINETUNE_CACHE_KIND = "text-finetune"


@dataclass(frozen=True)
class TopFinetuneConfig:
    """How a text model's top is trained on states cached below it (:func:`finetune_top`).

    Args:
        trained_layers: top encoder layers trained, with the head (the family's "head"
            parameters: BERT's pooler and classifier); 0 trains the head alone.
        epochs: passes over the training sentences; with more than one, the epoch of lowest NLL
            on the validation sentences is kept (as ``train-text`` does).
        steps: optimiser steps instead of epochs (quick runs), no epoch choice.
        batch_size: sentences per step (batches of similar lengths, their order shuffled).
        lr: AdamW peak learning rate; weight_decay: on weight matrices only.
        warmup: share of the steps of linear warm-up; then linear decay to zero (D.2).
        grad_clip: the gradient's global L2 norm is clipped to this (D.2: 1.0).
        n_train: a fixed random subset of the training sentences (None: all).
        reinit_head: re-initialise the head from the seed first (Deep Ensembles' heads).
    """

    trained_layers: int = 2  # as train-text: encoder layers 4-5 of MiniLM's 0-5
    epochs: int = 1
    steps: int | None = None
    batch_size: int = 32
    lr: float = 3e-4  # chosen on validation sentences (module docstring)
    weight_decay: float = 0.01  # as C.2 and train-text
    warmup: float = 0.1  # D.2
    grad_clip: float | None = 1.0  # D.2
    n_train: int | None = 2000  # of the 6,030 Rotten Tomatoes training sentences
    reinit_head: bool = False

    def __post_init__(self) -> None:
        if self.trained_layers < 0 or self.epochs < 1 or self.batch_size < 1 or not self.lr > 0:
            raise ValueError(
                "trained_layers must be >= 0, epochs and batch_size >= 1 and lr > 0; got "
                f"{self.trained_layers}, {self.epochs}, {self.batch_size}, {self.lr}"
            )
        if self.steps is not None and self.steps < 1:
            raise ValueError(
                f"steps must be a positive number of steps (or None), got {self.steps}"
            )


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
    order every epoch. With several epochs and validation batches, the epoch of lowest
    validation NLL is kept. Returns the history: per step, its learning rate and loss (and the
    validation scores at an epoch's end), then the chosen epoch."""
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
        ),
        warmup_linear(config.lr, max(1, round(config.warmup * total)), total, fraction_first=True),
        validate=scores if choose else None,
        rank=lambda s: (s["nll"],),
        progress=progress,
    )
    history = [{"step": s.step, "lr": s.lr, "loss": round(s.loss, 5)} for s in result.steps]
    for epoch in result.epochs:
        if epoch.scores:
            history[epoch.steps - 1].update(
                val_nll=round(epoch.scores["nll"], 5), val_accuracy=epoch.scores["accuracy"]
            )
    if result.chosen is not None:
        history.append(
            {"chosen_epoch": result.chosen, "val_nll": round(result.chosen_scores["nll"], 5)}
        )
    for p in model.parameters():
        p.requires_grad_(True)
    return history


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
        validation_set: labelled sentences that choose the epoch when ``config.epochs > 1``.
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
    frozen = layers - config.trained_layers
    if frozen < 0:
        raise ValueError(f"trained_layers={config.trained_layers}, but the model has {layers}")
    data = take(train_set, config.n_train, purpose="text-finetune")
    choose = validation_set is not None and config.epochs > 1 and config.steps is None
    key = None
    if config.reinit_head:
        reinit_head(tuned, seed)
    if cache is not None:
        key = cache_key(
            TOP_FINETUNE_VERSION,
            *key_parts,
            asdict(config),
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
