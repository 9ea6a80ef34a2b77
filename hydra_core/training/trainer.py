"""The one training loop. Every recipe - the default ViT from scratch
(:func:`hydra_core.zoo.default.train_vit`), the text models' top layers and heads
(``train-text``), fine-tuning after pruning (:mod:`hydra_core.hydra.finetune`), a text model's top
on states cached below a frozen prefix (:mod:`hydra_core.training.top`) - is a call of
:func:`train` with its own pieces:

- what is trained: ``parameters`` (every other parameter of the model is frozen for the run);
- the optimiser: AdamW or SGD over the weight-decay split of :func:`decay_split`;
- the batches: ``epoch_batches(generator)`` at the start of every epoch, the generator seeded
  with :attr:`TrainerConfig.seed` (batch order, augmentation draws);
- the loss: cross-entropy of ``logits_and_labels(batch)`` (label smoothing optional);
- the learning rate: ``schedule(step)`` (:mod:`hydra_core.training.schedules`), set every step;
- gradient clipping (optional), dropout from :attr:`TrainerConfig.dropout_seed`;
- epoch-end validation, keeping the epoch whose scores rank lowest (optional), and early
  stopping once ``patience`` epochs in a row have not ranked lower than the best (optional);
- ``progress(done, total)`` after every step, ``on_epoch(record)`` after every epoch;
- with ``resume``, the run's state written after every epoch, so that an interrupted run goes on
  from its last complete epoch and ends exactly as if it had not stopped.

A recipe's random-number consumption (the generator's draws, dropout's), its parameter groups
and the order of its floating-point operations are what this loop does, in this order: the shipped
checkpoints are reproduced bit for bit by their recipes (``scripts/check_trainer_parity.py``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

OPTIMIZERS = ("adamw", "sgd")


@dataclass(frozen=True)
class TrainerConfig:
    """How :func:`train` optimises; a recipe fills one in from its own configuration.

    Args:
        steps: optimiser steps in all; the run ends after the last one, at an epoch's end or not.
        lr: the learning rate the optimiser is built with (the schedule sets it every step).
        optimizer: ``"adamw"`` or ``"sgd"`` (with ``momentum``).
        weight_decay: on the decaying group of :func:`decay_split` (decoupled for AdamW, L2 for
            SGD); none on the other group.
        momentum: SGD's (unused by AdamW).
        grad_clip: the global L2 norm of the trained parameters' gradient is clipped to this.
        label_smoothing: epsilon of the cross-entropy.
        seed: the seed of the generator ``epoch_batches`` draws from (batch order, augmentation).
        dropout_seed: the global random state is seeded with it for the run and restored after;
            None leaves the caller's random state to drive dropout (and advance).
        patience: with validation and a ranking, the run stops early once this many complete
            epochs in a row have not ranked lower than the best epoch so far (None: never). The
            schedule still runs over ``steps``: stopping early leaves its tail unused.
    """

    steps: int
    lr: float
    optimizer: str = "adamw"
    weight_decay: float = 0.0
    momentum: float = 0.0
    grad_clip: float | None = None
    label_smoothing: float = 0.0
    seed: int = 0
    dropout_seed: int | None = None
    patience: int | None = None

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}"
            )
        if self.steps < 1 or not self.lr > 0:
            raise ValueError(f"steps must be >= 1 and lr > 0, got {self.steps} and {self.lr}")
        if self.patience is not None and self.patience < 1:
            raise ValueError(f"patience must be >= 1 epoch (or None), got {self.patience}")


@dataclass(frozen=True)
class StepRecord:
    """One optimiser step: its number (from 1), learning rate and training loss."""

    step: int
    lr: float
    loss: float


@dataclass(frozen=True)
class EpochRecord:
    """One complete epoch: its number (from 1), the steps done by its end, the mean training loss
    of its steps and its validation scores (empty without validation)."""

    epoch: int
    steps: int
    loss: float
    scores: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainResult:
    """Every step and every complete epoch of a run, and the epoch kept (None: the last step's
    weights, no choice made); ``resumed_after``: the epochs an interrupted run had completed
    (0: none), ``seconds``: the time in the loop, its interrupted parts included;
    ``stopped_early``: the run ended by :attr:`TrainerConfig.patience` before its last step."""

    steps: list[StepRecord]
    epochs: list[EpochRecord]
    chosen: int | None = None
    resumed_after: int = 0
    seconds: float = 0.0
    stopped_early: bool = False

    @property
    def chosen_scores(self) -> dict[str, Any]:
        """The validation scores of the epoch kept."""
        if self.chosen is None:
            raise ValueError("no epoch was chosen: the run had no validation with a ranking")
        return self.epochs[self.chosen - 1].scores


def decay_split(
    model: nn.Module, parameters: Mapping[str, nn.Parameter]
) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(decaying, not decaying) ``parameters`` (names as in ``model.named_parameters()``), each
    in the given order: weight matrices decay; biases, norms, embedding tables, position
    embeddings (``pos_embed``) and tokens (CLS, registers) do not."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay = [], []
    for name, p in parameters.items():
        matrix = p.ndim >= 2 and id(p) not in tables
        decays = matrix and "pos_embed" not in name and "token" not in name
        (decay if decays else no_decay).append(p)
    return decay, no_decay


def optimizer_for(
    model: nn.Module, parameters: Mapping[str, nn.Parameter], config: TrainerConfig
) -> torch.optim.Optimizer:
    """The optimiser of ``config`` over two groups: decaying, then not (:func:`decay_split`)."""
    decay, no_decay = decay_split(model, parameters)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum)
    return torch.optim.AdamW(groups, lr=config.lr)


def train(
    model: nn.Module,
    parameters: Mapping[str, nn.Parameter],
    logits_and_labels: Callable[[Any], tuple[torch.Tensor, torch.Tensor]],
    epoch_batches: Callable[[torch.Generator], Sequence[Any]],
    config: TrainerConfig,
    schedule: Callable[[int], float],
    *,
    validate: Callable[[], dict[str, Any]] | None = None,
    rank: Callable[[dict[str, Any]], tuple] | None = None,
    on_epoch: Callable[[EpochRecord], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    resume: str | Path | None = None,
) -> TrainResult:
    """Train ``parameters`` of ``model`` in place for ``config.steps`` steps; ``model`` ends in
    eval mode, its parameters' ``requires_grad`` flags as they were.

    Args:
        model: switched to train mode at the start of every epoch, to eval mode to validate.
        parameters: the trained parameters by name, in ``model.named_parameters()`` order (the
            optimiser's and the clipping's order); every other parameter is frozen for the run.
        logits_and_labels: a batch -> (logits (B, C), labels (B,)); the loss is their mean
            cross-entropy.
        epoch_batches: the generator -> the next epoch's batches, called at each epoch's start.
        config: optimiser, clipping, smoothing, steps and seeds.
        schedule: 0-based step -> learning rate, set on every group before each step.
        validate: scores of the model after each complete epoch (called in eval mode).
        rank: with ``validate``, scores -> a key; the epoch of the lowest key is kept (ties: the
            earlier) and its trained parameters and buffers restored at the end; with
            ``config.patience``, the run stops once that many epochs in a row did not beat it.
        on_epoch: called with each complete epoch's record (after its validation).
        progress: ``progress(done, total)`` after every optimiser step.
        resume: a file holding the run's state after its last complete epoch (trained
            parameters, buffers, optimiser, the generator's and the global random state, the
            records, the best epoch so far), rewritten atomically after every epoch. When it
            exists the run goes on from it and ends with the weights and records of the run that
            was not interrupted (CPU; ``on_epoch`` is called for the new epochs only). A file of
            another run (other parameters or steps) is refused. The caller deletes it once the
            result is stored.
    """
    trained = list(parameters.values())
    optimizer = optimizer_for(model, parameters, config)
    generator = torch.Generator().manual_seed(config.seed)
    steps: list[StepRecord] = []
    epochs: list[EpochRecord] = []
    best = None  # (key, epoch, saved state)
    resumed_after, seconds, start = 0, 0.0, time.perf_counter()
    resume = None if resume is None else Path(resume)
    with _frozen_except(model, trained), _dropout_seeded(config.dropout_seed):
        if resume is not None and resume.is_file():
            state = _read_resume(resume, parameters, config)
            _restore(model, parameters, state["weights"])
            optimizer.load_state_dict(state["optimizer"])
            generator.set_state(state["generator"])
            torch.set_rng_state(state["rng"])
            steps = [StepRecord(*s) for s in state["steps"]]
            epochs = [EpochRecord(**e) for e in state["epochs"]]
            if state["best"] is not None:
                key, epoch, saved = state["best"]
                best = (tuple(key), epoch, saved)
            resumed_after, seconds = len(epochs), state["seconds"]
        while len(steps) < config.steps and not _patience_out(config, best, epochs):
            batches = epoch_batches(generator)
            if len(batches) == 0:
                raise ValueError("epoch_batches gave no batch: an epoch needs at least one")
            model.train()
            running, done = 0.0, 0
            for batch in batches:
                lr = schedule(len(steps))
                for group in optimizer.param_groups:
                    group["lr"] = lr
                logits, labels = logits_and_labels(batch)
                loss = F.cross_entropy(logits, labels, label_smoothing=config.label_smoothing)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if config.grad_clip is not None:
                    nn.utils.clip_grad_norm_(trained, config.grad_clip)
                optimizer.step()
                value = loss.item()
                running += value
                done += 1
                steps.append(StepRecord(len(steps) + 1, lr, value))
                if progress:
                    progress(len(steps), config.steps)
                if len(steps) == config.steps:
                    break
            if done < len(batches):
                break  # the run ended within this epoch
            scores = {}
            if validate is not None:
                model.eval()
                scores = validate()
            record = EpochRecord(len(epochs) + 1, len(steps), running / len(batches), scores)
            epochs.append(record)
            if validate is not None and rank is not None:
                key = rank(scores)
                if best is None or key < best[0]:
                    best = (key, record.epoch, _saved(model, parameters))
            if resume is not None:
                elapsed = seconds + time.perf_counter() - start
                _write_resume(resume, model, parameters, config, optimizer, generator, steps,
                              epochs, best, elapsed)  # fmt: skip
            if on_epoch:
                on_epoch(record)
        if best is not None:
            _restore(model, parameters, best[2])
    model.eval()
    seconds += time.perf_counter() - start
    stopped = len(steps) < config.steps
    chosen = None if best is None else best[1]
    return TrainResult(steps, epochs, chosen, resumed_after, seconds, stopped)


def _patience_out(config: TrainerConfig, best: tuple | None, epochs: list[EpochRecord]) -> bool:
    """Whether early stopping ends the run now: ``config.patience`` complete epochs since the
    best one (read from the records, so a resumed run stops where the whole run would)."""
    if config.patience is None or best is None:
        return False
    return len(epochs) - best[1] >= config.patience


def resume_path(result: Path) -> Path:
    """Where the state of the run that will write ``result`` is kept, epoch by epoch, until the
    result is stored (the ``resume`` file of :func:`train`)."""
    return result.with_name(result.name + ".resume.pt")


def _fingerprint(parameters: Mapping[str, nn.Parameter], config: TrainerConfig) -> dict:
    """What a resume file must match: the trained parameters' names and shapes, and the
    optimisation (a file of another run is refused, never continued)."""
    settings = asdict(config)
    if settings["patience"] is None:  # the files of runs written before early stopping existed
        del settings["patience"]
    return {
        "parameters": [[name, list(p.shape)] for name, p in parameters.items()],
        "config": settings,
    }


def _write_resume(
    path: Path,
    model: nn.Module,
    parameters: Mapping[str, nn.Parameter],
    config: TrainerConfig,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    steps: list[StepRecord],
    epochs: list[EpochRecord],
    best: tuple | None,
    seconds: float,
) -> None:
    """The run's state after a complete epoch, written to a temporary file then renamed over
    ``path``: an interruption while writing leaves the previous epoch's file whole."""
    state = {
        "fingerprint": _fingerprint(parameters, config),
        "weights": _saved(model, parameters),
        "optimizer": optimizer.state_dict(),
        "generator": generator.get_state(),
        "rng": torch.get_rng_state(),
        "steps": [[s.step, s.lr, s.loss] for s in steps],
        "epochs": [vars(e) for e in epochs],
        "best": None if best is None else [list(best[0]), best[1], best[2]],
        "seconds": seconds,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    torch.save(state, partial)
    os.replace(partial, path)


def _read_resume(path: Path, parameters: Mapping[str, nn.Parameter], config: TrainerConfig) -> dict:
    """The state in a resume file, checked to be this run's; an InputError names the file and
    the fix otherwise."""
    from hydra_core.errors import InputError

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        fingerprint = state["fingerprint"]
    except Exception as exc:  # a truncated or foreign file: any reader error
        raise InputError(
            f"{path} is not a readable resume file ({type(exc).__name__}); delete it to train "
            "from the start"
        ) from None
    if fingerprint != _fingerprint(parameters, config):
        raise InputError(
            f"{path} holds the state of another run (other parameters or optimisation); delete "
            "it to train from the start"
        )
    return state


def _saved(model: nn.Module, parameters: Mapping[str, nn.Parameter]) -> dict[str, torch.Tensor]:
    """Copies of the trained parameters and of the model's buffers (running statistics)."""
    state = {f"parameter:{k}": p.detach().clone() for k, p in parameters.items()}
    state.update({f"buffer:{k}": b.detach().clone() for k, b in model.named_buffers()})
    return state


@torch.no_grad()
def _restore(
    model: nn.Module, parameters: Mapping[str, nn.Parameter], state: dict[str, torch.Tensor]
) -> None:
    for name, p in parameters.items():
        p.copy_(state[f"parameter:{name}"])
    for name, b in model.named_buffers():
        b.copy_(state[f"buffer:{name}"])


@contextmanager
def _frozen_except(model: nn.Module, trained: Sequence[nn.Parameter]) -> Iterator[None]:
    """Only ``trained`` require gradients inside; every flag is put back on the way out."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    ids = {id(p) for p in trained}
    if not ids <= {id(p) for p, _ in flags}:
        raise ValueError("every trained parameter must be a parameter of the model trained")
    try:
        for p, _ in flags:
            p.requires_grad_(id(p) in ids)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


@contextmanager
def _dropout_seeded(seed: int | None) -> Iterator[None]:
    """The global random state seeded with ``seed`` inside and restored after (CPU; CUDA's is
    seeded too, not restored); nothing when None."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
