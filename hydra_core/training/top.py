"""Training a text model's top on states cached below it: fine-tuning after pruning (paper D.2)
and the fresh heads of Deep Ensembles (D).

The frozen layers (embedding and the first blocks) run once over the training sentences
(:func:`state_batches`); every optimiser step then runs only the trained blocks and the head
(:func:`top_logits`). :func:`finetune_top` trains a copy of a model (pruned first when a head mask
is given), reading and writing the trained tensors through the disk cache.
"""

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
from hydra_core.models.preprocess import TrimmedPreprocess

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


@dataclass
class StateBatch:
    """The stream entering the trained layers for a batch of sentences, with its context."""

    states: torch.Tensor  # (B, T, d)
    context: object  # the family's context (attention mask, ...)
    labels: torch.Tensor  # (B,)


@torch.no_grad()
def state_batches(
    model: nn.Module,
    preprocess: Callable[[Sequence[str]], torch.Tensor],
    data: TextSet,
    frozen: int,
    batch_size: int,
    device: torch.device,
) -> list[StateBatch]:
    """Run the embedding and the first ``frozen`` blocks of ``model`` (eval mode) once over
    ``data``, in batches of similar lengths. ``no_grad``, not ``inference_mode``: the states are
    inputs of the training graph."""
    family = family_of(model)
    blocks = family.blocks(model)
    model.eval()
    packed = preprocess(data.inputs)  # (N, 2, T)
    order = torch.argsort(packed[:, 1].sum(1), stable=True)
    trim = TrimmedPreprocess(lambda x: x)  # already packed
    batches = []
    for start in range(0, len(order), batch_size):
        index = order[start : start + batch_size]
        inputs = family.prepare(model, trim(packed[index]).to(device))
        x, context = family.embed(model, inputs)
        for block in blocks[:frozen]:
            x = family.block_forward(block, x, context)
        batches.append(StateBatch(x, context, data.labels[index].to(device)))
    return batches


def top_logits(model: nn.Module, frozen: int, batch: StateBatch) -> torch.Tensor:
    """Logits from the stream leaving the frozen blocks: the trained blocks, then the head."""
    family = family_of(model)
    x = batch.states
    for block in family.blocks(model)[frozen:]:
        x = family.block_forward(block, x, batch.context)
    return family.classify(model, x, batch.context)


def trained_parameters(model: nn.Module, frozen: int) -> dict[str, nn.Parameter]:
    """The parameters of the blocks from ``frozen`` on and of the head, by name."""
    family = family_of(model)
    top = {id(p) for block in family.blocks(model)[frozen:] for p in block.parameters()}
    return {
        name: p
        for name, p in model.named_parameters()
        if id(p) in top or family.parameter_kind(model, name) == "head"
    }


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
        logits = top_logits(model, frozen, batch)
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
    """Train the top of ``model`` in place (AdamW, warm-up then linear decay, clipping; dropout
    on); with several epochs and validation batches, keep the epoch of lowest validation NLL."""
    trained = trained_parameters(model, frozen)
    for p in model.parameters():
        p.requires_grad_(False)
    decay, no_decay = [], []
    for p in trained.values():
        p.requires_grad_(True)
        (decay if p.ndim >= 2 else no_decay).append(p)
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.lr,
    )
    total = config.steps or config.epochs * len(batches)
    warmup = max(1, round(config.warmup * total))
    generator = torch.Generator().manual_seed(seed)  # batch order
    history, best, order = [], None, []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # dropout
        model.train()
        for step in range(total):
            if not order:
                order = torch.randperm(len(batches), generator=generator).tolist()
            batch = batches[order.pop()]
            lr = config.lr * (
                (step + 1) / warmup if step < warmup else (total - step) / max(1, total - warmup)
            )
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss = F.cross_entropy(top_logits(model, frozen, batch), batch.labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.grad_clip is not None:
                nn.utils.clip_grad_norm_(list(trained.values()), config.grad_clip)
            optimizer.step()
            history.append({"step": step + 1, "lr": lr, "loss": round(loss.item(), 5)})
            if progress:
                progress(step + 1, total)
            epoch_end = config.steps is None and (step + 1) % len(batches) == 0
            if epoch_end and validation and config.epochs > 1:
                nll, accuracy = state_nll(model, frozen, validation)
                history[-1].update(val_nll=round(nll, 5), val_accuracy=accuracy)
                if best is None or nll < best[0]:
                    state = {k: p.detach().clone() for k, p in trained.items()}
                    best = (nll, (step + 1) // len(batches), state)
                model.train()
    if best is not None:
        with torch.no_grad():
            for name, p in trained.items():
                p.copy_(best[2][name])
        history.append({"chosen_epoch": best[1], "val_nll": round(best[0], 5)})
    model.eval()
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
