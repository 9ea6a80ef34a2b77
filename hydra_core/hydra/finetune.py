"""Fine-tuning pruned members (paper 4.3 and Appendix D.2), each on its own, before fusion.

Each member is cut out of the source model structurally (:func:`prune_heads`: only its kept heads'
Q/K/V rows and W_O columns remain) and trained on its own with cross-entropy with label smoothing
0.1 on Fashion-MNIST training images (a fixed subset, :attr:`FinetuneConfig.n_train`), with a
per-step linear warm-up and a cosine decay to a floor, as in D.2. Only the parameter groups in
:attr:`FinetuneConfig.trainable` are updated - by default attention, MLPs, LayerNorms and the
classifier, D.2's "targeted subset"; the patch and position embeddings stay frozen. The fine-tuned
members are then fused with :func:`fuse_finetuned`, which averages their MLPs (paper 4.2).

D.2's optimiser (SGD with momentum, lr 0.01 from its grid), but at our scale: one epoch of 10,000
images (79 steps) instead of 10,000-120,000 steps, so that three members fine-tune in a few
minutes on two CPU cores; no augmentation and no dropout (the default model has none). On the
default model, a Taylor-pruned member (4 of 12 heads removed per layer) went from 87.6% to 88.2%
test accuracy with SGD lr 0.01 after 40 steps on 5,000 images, against 87.9% / 87.7% / 87.2% with
AdamW at lr 1e-4 / 3e-4 / 1e-3 (2,000 test images; the dense model: 89.4%).

Results are cached (:class:`DiskCache` kind ``finetune``) under the source model's weights, the
mask, the configuration, the training images (and their preprocessing) and the seed, so a repeated
run loads the fine-tuned weights instead of training again.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hydra_core.cache import DiskCache, cache_key, model_fingerprint
from hydra_core.data.images import ImageSet, take
from hydra_core.masks import MemberMask
from hydra_core.models.adapter import as_keep_mask, head_layout, prune_heads

#: Changes whenever the weights a fine-tuning run produces change; part of every cache key.
FINETUNE_VERSION = "finetune-1"
FINETUNE_CACHE_KIND = "finetune"
OPTIMIZERS = ("adamw", "sgd")
#: Parameter groups of a timm ViT that :attr:`FinetuneConfig.trainable` can name.
PARAMETER_GROUPS = ("embed", "attn", "mlp", "norm", "head")


@dataclass(frozen=True)
class FinetuneConfig:
    """How each pruned member is fine-tuned.

    Args:
        optimizer: ``"adamw"`` or ``"sgd"`` (with ``momentum``; the paper's choice for images).
        lr: peak learning rate, reached after the warm-up.
        weight_decay: decoupled (AdamW) or L2 (SGD) decay on weight matrices; none on biases,
            norms and tokens.
        momentum: SGD momentum (unused by AdamW).
        epochs: passes over the ``n_train`` images (fractions allowed); ignored when ``steps``
            is set.
        steps: optimiser steps; overrides ``epochs``.
        batch_size: images per step.
        warmup_steps: linear warm-up from lr / warmup_steps to lr (per step, as D.2).
        min_lr_fraction: the cosine decay ends at lr * min_lr_fraction (D.2's floor).
        label_smoothing: epsilon of the cross-entropy (D.2: 0.1).
        trainable: parameter groups that are updated (see :data:`PARAMETER_GROUPS`).
        n_train: training images, a fixed subset of Fashion-MNIST's 55,000 (None: all).
        grad_clip: clip the gradient's global L2 norm to this (None: no clipping).
    """

    optimizer: str = "sgd"  # as D.2
    lr: float = 0.01  # from D.2's grid; best of the few we tried (see the module docstring)
    weight_decay: float = 0.0
    momentum: float = 0.9
    epochs: float = 1.0
    steps: int | None = None
    batch_size: int = 128
    warmup_steps: int = 10
    min_lr_fraction: float = 1e-5
    label_smoothing: float = 0.1
    trainable: tuple[str, ...] = ("attn", "mlp", "norm", "head")
    n_train: int | None = 10_000  # 1 epoch: about a minute per member on 2 CPU cores
    grad_clip: float | None = 1.0

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}"
            )
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.steps is None and not self.epochs > 0:
            raise ValueError(f"epochs must be positive (or set steps), got {self.epochs}")
        if self.steps is not None and (isinstance(self.steps, bool) or self.steps < 1):
            raise ValueError(
                f"steps must be a positive number of optimiser steps, got {self.steps!r}"
            )
        if self.batch_size < 1 or self.warmup_steps < 0:
            raise ValueError(
                f"batch_size must be >= 1 and warmup_steps >= 0, got "
                f"{self.batch_size} and {self.warmup_steps}"
            )
        if not 0 <= self.min_lr_fraction <= 1 or not 0 <= self.label_smoothing < 1:
            raise ValueError("min_lr_fraction must be in [0, 1] and label_smoothing in [0, 1)")
        unknown = sorted(set(self.trainable) - set(PARAMETER_GROUPS))
        if unknown or not self.trainable:
            raise ValueError(
                f"trainable must name some of {', '.join(PARAMETER_GROUPS)}, got "
                f"{list(self.trainable)}"
            )
        if self.n_train is not None and self.n_train < 1:
            raise ValueError(
                f"n_train must be a positive number of images (or None), got {self.n_train}"
            )

    def total_steps(self, n_images: int) -> int:
        """Optimiser steps for a training set of ``n_images``."""
        if self.steps is not None:
            return self.steps
        return max(1, math.ceil(self.epochs * math.ceil(n_images / self.batch_size)))


def learning_rate(config: FinetuneConfig, step: int, total: int) -> float:
    """The learning rate of (0-based) ``step`` of ``total``: linear warm-up, then cosine decay
    from ``lr`` to ``lr * min_lr_fraction`` at the last step."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    decay_steps = max(1, total - config.warmup_steps - 1)
    progress = min(1.0, (step - config.warmup_steps) / decay_steps)
    floor = config.lr * config.min_lr_fraction
    return floor + 0.5 * (config.lr - floor) * (1 + math.cos(math.pi * progress))


def parameter_group(name: str) -> str:
    """Which of :data:`PARAMETER_GROUPS` a timm ViT parameter belongs to, by its name."""
    parts = name.split(".")
    if parts[0] == "blocks" and len(parts) > 2:
        part = parts[2]
        if part in ("attn", "ls1"):
            return "attn"
        if part in ("mlp", "ls2"):
            return "mlp"
        if part in ("norm1", "norm2"):
            return "norm"
    elif parts[0] in ("patch_embed", "cls_token", "reg_token", "pos_embed"):
        return "embed"
    elif parts[0] in ("norm", "fc_norm", "norm_pre"):
        return "norm"
    elif parts[0] == "head":
        return "head"
    raise ValueError(
        f"parameter {name!r} is in none of the groups {', '.join(PARAMETER_GROUPS)}; "
        "fine-tuning knows timm VisionTransformer parameter names only"
    )


def set_trainable(model: nn.Module, groups: Sequence[str]) -> list[str]:
    """Freeze every parameter outside ``groups`` (and unfreeze those inside); returns the names of
    the trainable ones."""
    names = []
    for name, p in model.named_parameters():
        train = parameter_group(name) in groups
        p.requires_grad_(train)
        if train:
            names.append(name)
    return names


@dataclass
class FinetunedMember:
    """A fine-tuned member: the structurally pruned model and how it came about.

    Args:
        name: the member's name (from its :class:`MemberMask`).
        model: the pruned, fine-tuned timm ViT (eval mode, CPU); its own layout keeps every head.
        keep: the mask on the source model the member was cut out with.
        seed: the batch-order seed.
        history: per step: step, lr, loss (the label-smoothed training loss of that batch).
        seconds: training time (of the run that produced the cached weights, when loaded).
        cached: True when the weights came from the cache.
    """

    name: str
    model: nn.Module
    keep: torch.Tensor
    seed: int
    history: list[dict]
    seconds: float
    cached: bool = False


def finetune_cache_key(
    model: nn.Module,
    keep: torch.Tensor,
    config: FinetuneConfig,
    data: ImageSet,
    preprocess: Callable[[torch.Tensor], torch.Tensor],
    seed: int,
) -> str:
    """Source weights, mask, configuration, training images, preprocessing (by its output on the
    first images) and seed: everything the fine-tuned weights depend on."""
    probe = preprocess(data.images[:4])
    return cache_key(
        FINETUNE_VERSION,
        model_fingerprint(model),
        keep,
        asdict(config),
        data.fingerprint(),
        probe,
        seed=int(seed),
    )


def training_subset(config: FinetuneConfig, train_set: ImageSet | None = None) -> ImageSet:
    """The fixed subset of ``train_set`` (default: Fashion-MNIST train) a run trains on."""
    if train_set is None:
        from hydra_core.data.fashion_mnist import load_fashion_mnist

        train_set = load_fashion_mnist("train")
    if train_set.labels is None:
        raise ValueError(f"the training set {train_set.name!r} has no labels")
    return take(train_set, config.n_train, purpose="finetune")


def finetune_member(
    model: nn.Module,
    keep: torch.Tensor,
    config: FinetuneConfig,
    *,
    preprocess: Callable[[torch.Tensor], torch.Tensor],
    train_set: ImageSet | None = None,
    seed: int = 0,
    name: str = "member",
    device: str | torch.device = "cpu",
    cache: DiskCache | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> FinetunedMember:
    """Cut one member out of ``model`` with ``keep`` and fine-tune it.

    Args:
        model: the source model; never modified.
        keep: the member's head mask on ``model``.
        preprocess: uint8 images -> model input (the loaded model's).
        train_set: labelled training images (default: Fashion-MNIST train); the run uses
            ``config.n_train`` of them, a fixed subset.
        seed: the batch-order seed.
        device: where to train.
        cache: load the weights from it when present, save them after training.
        progress: ``progress(done, total)`` after every optimiser step.
    """
    keep = as_keep_mask(head_layout(model), keep)
    data = training_subset(config, train_set)
    key = None if cache is None else finetune_cache_key(model, keep, config, data, preprocess, seed)
    pruned = prune_heads(model, keep).cpu()
    if cache is not None:
        stored = cache.load(FINETUNE_CACHE_KIND, key)
        if isinstance(stored, dict) and "state" in stored:
            pruned.load_state_dict(stored["state"])
            _reset_flags(pruned)
            total = len(stored["history"])
            if progress:
                progress(total, total)
            return FinetunedMember(
                name, pruned.eval(), keep, seed, stored["history"], stored["seconds"], cached=True
            )
    start = time.perf_counter()
    history = _train(pruned, data, config, preprocess, seed, torch.device(device), progress)
    seconds = time.perf_counter() - start
    pruned = pruned.cpu().eval()
    _reset_flags(pruned)
    if cache is not None:
        state = {k: v.detach().clone() for k, v in pruned.state_dict().items()}
        cache.save(
            FINETUNE_CACHE_KIND, key, {"state": state, "history": history, "seconds": seconds}
        )
    return FinetunedMember(name, pruned, keep, seed, history, seconds)


def finetune_members(
    model: nn.Module,
    members: Sequence[MemberMask],
    config: FinetuneConfig,
    *,
    preprocess: Callable[[torch.Tensor], torch.Tensor],
    train_set: ImageSet | None = None,
    seeds: Sequence[int] | None = None,
    device: str | torch.device = "cpu",
    cache: DiskCache | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[FinetunedMember]:
    """Fine-tune every member separately (paper 4.3).

    Args:
        seeds: batch-order seed per member (default: 0 for every member, so that members differ
            only by their heads - the paper's main setting; vary them for the batch-order rows of
            Table 9).
        progress: ``progress(member name, done, total)`` after every optimiser step.
        Other arguments as :func:`finetune_member`.
    """
    seeds = [0] * len(members) if seeds is None else [int(s) for s in seeds]
    if len(seeds) != len(members):
        raise ValueError(f"{len(seeds)} seeds for {len(members)} members; give one per member")
    out = []
    for member, seed in zip(members, seeds, strict=True):
        report = (
            None
            if progress is None
            else (lambda done, total, name=member.name: progress(name, done, total))
        )
        out.append(
            finetune_member(
                model,
                member.keep,
                config,
                preprocess=preprocess,
                train_set=train_set,
                seed=seed,
                name=member.name,
                device=device,
                cache=cache,
                progress=report,
            )
        )
    return out


def fuse_finetuned(members: Sequence[FinetunedMember]):
    """The fine-tuned members fused into one :class:`~hydra_core.hydra.fused.HydraViT`, their MLPs
    averaged (each member keeps all the heads its pruned model has)."""
    from hydra_core.hydra.fused import fuse_members

    return fuse_members([(m.model, head_layout(m.model).all_kept()) for m in members])


# --- the training loop --------------------------------------------------------------------------


def _optimizer(model: nn.Module, config: FinetuneConfig) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (
                decay
                if p.ndim >= 2 and "pos_embed" not in name and "token" not in name
                else no_decay
            ).append(p)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum)
    return torch.optim.AdamW(groups, lr=config.lr)


def _train(
    model: nn.Module,
    data: ImageSet,
    config: FinetuneConfig,
    preprocess: Callable[[torch.Tensor], torch.Tensor],
    seed: int,
    device: torch.device,
    progress: Callable[[int, int], None] | None,
) -> list[dict]:
    model.to(device).train()
    set_trainable(model, config.trainable)
    optimizer = _optimizer(model, config)
    trainable = [p for p in model.parameters() if p.requires_grad]
    n = len(data)
    total = config.total_steps(n)
    batches_per_epoch = math.ceil(n / config.batch_size)
    generator = torch.Generator().manual_seed(int(seed))
    history, order = [], None
    for step in range(total):
        b = step % batches_per_epoch
        if b == 0:  # a new pass over the data, in a new order
            order = torch.randperm(n, generator=generator)
        index = order[b * config.batch_size : (b + 1) * config.batch_size]
        x = preprocess(data.images[index]).to(device)
        y = data.labels[index].to(device)
        lr = learning_rate(config, step, total)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = F.cross_entropy(model(x), y, label_smoothing=config.label_smoothing)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(trainable, config.grad_clip)
        optimizer.step()
        history.append({"step": step + 1, "lr": lr, "loss": loss.item()})
        if progress:
            progress(step + 1, total)
    return history


def _reset_flags(model: nn.Module) -> None:
    """Fine-tuned members leave with every parameter trainable again, as a fresh model is."""
    for p in model.parameters():
        p.requires_grad_(True)
