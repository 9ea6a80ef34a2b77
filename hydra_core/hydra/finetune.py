"""Fine-tuning pruned members (paper 4.3 and Appendix D.2), each on its own, before fusion.

Each member is cut out of the source model structurally (:func:`prune_heads`: only its kept heads'
Q/K/V rows and W_O columns remain) and trained on its own with cross-entropy on training samples
(by default the training split of the embedded ID set of the model's modality: Fashion-MNIST
images, Rotten Tomatoes sentences), a fixed
subset (:attr:`FinetuneConfig.n_train`, never a validation or test sample), with a per-step linear
warm-up and a cosine decay to a floor, as in D.2. Only the parameter groups in
:attr:`FinetuneConfig.trainable` are updated - by default attention, MLPs, LayerNorms and the
classifier, D.2's "targeted subset"; the embedding (a ViT's patch and position embeddings, a text
model's token, position and type embeddings) stays frozen. The model's family sorts its
parameters into these groups, and a text member trains in its callable form on packed token ids.
The fine-tuned members are then fused with :func:`fuse_finetuned`, which averages their MLPs
(paper 4.2). D.2's optimiser (SGD, momentum 0.9, no weight decay), at our scale: one epoch of
5,000 images (40 steps) instead of 10,000-120,000 steps; no augmentation and no dropout (the
default model has none; a Hugging Face model's dropout is on while it trains).

**Choosing the configuration.** D.2 takes the peak learning rate from a small grid, "best by
validation"; :func:`select_finetune_config` fine-tunes one member with each point of a grid
(:data:`DEFAULT_GRID`: learning rate x epochs x label smoothing) and keeps the lowest NLL on 2,000
images of Fashion-MNIST's validation split (:func:`validation_subset`). Those are the 5,000
training images held out from the default model's training, also the ID search split that selects
heads: nothing reported is computed on them, fine-tuning never trains on them, and none is a test
image. A part of the 55,000 training images would be a worse validation set: the source model was
trained on every one of them, so it would flatter every grid point, its calibration above all.
NLL, not accuracy: it is a proper score, so it weighs calibration too (see below), where
accuracy counts top labels only (the whole grid spans 0.8 points of it, 16 of 2,000 images). The
defaults are its pick for the default model's first Hydra (Taylor) member (Taylor seed 0, 24 of
72 heads pruned), reproduced by

    python -m hydra_core masks --strategy taylor --m 3 --budget 24 --pool 48 --n-search 256 \
        --taylor-samples 256 --out taylor.json
    python -m hydra_core hydra --masks taylor.json --finetune --ft-select

which prints (validation images; conf = mean top-label confidence; the member before fine-tuning:
accuracy 88.80, conf 90.98, NLL 0.3165; the dense model: 90.40, 92.44, 0.2800):

    lr     epochs  smoothing  accuracy  conf   NLL     ECE
    0.003  1       0          89.55     91.13  0.2985  0.0244  <- selected (the defaults)
    0.003  1       0.1        89.50     90.02  0.2990  0.0160
    0.003  2       0          89.70     91.29  0.2989  0.0264
    0.003  2       0.1        89.55     88.29  0.3098  0.0202
    0.01   1       0          89.30     91.25  0.3026  0.0221
    0.01   1       0.1        88.90     86.18  0.3302  0.0344  <- the previous defaults
    0.01   2       0          89.40     91.59  0.2999  0.0229
    0.01   2       0.1        89.15     81.69  0.3716  0.0746
    0.03   1       0          89.25     91.49  0.3106  0.0275
    0.03   1       0.1        89.05     80.31  0.3920  0.0874
    0.03   2       0          89.10     92.04  0.3148  0.0333
    0.03   2       0.1        89.10     81.87  0.3685  0.0749

The three best points lie within 0.0005 NLL of each other, a near-tie that another member or
batch order may well reorder; the clear signal is label smoothing's, below. The 12 points took 4.8
minutes on 2 CPU cores shared with other jobs (261 s of training: 6-35 s per 1-epoch point, 12-80
s per 2-epoch point).

**Calibration: why the previous recipe (lr 0.01, label smoothing 0.1) gave fine-tuned Hydra the
worst ECE of the report (0.045 against 0.025 for the single model).** The source model and the
zero-shot members are over-confident (mean confidence 2.0-2.7 points above accuracy on these
images). Label smoothing 0.1 trains towards 0.91 on the true class, and the further training goes
(learning rate x steps) the lower the members' confidence: at lr 0.01 the three Taylor members
end up under-confident by 2.4-3.1 points, and averaging their probabilities lowers confidence
once more, so the fused ensemble is under-confident by 3.9 points. Fused Hydra (Taylor), its
three members fine-tuned with the same batch order, on the same validation images:

    members fine-tuned with    members' conf - acc  accuracy  conf   NLL     ECE
    lr 0.01, smoothing 0.1     -2.4 to -3.1         89.55     85.68  0.3203  0.0410  (previous)
    lr 0.01, smoothing 0       +1.9 to +2.8         89.50     90.62  0.2915  0.0159
    lr 0.003, smoothing 0.1    +0.4 to +1.2         89.90     89.38  0.2895  0.0125
    lr 0.003, smoothing 0      +1.2 to +2.3         89.80     90.52  0.2875  0.0164  (defaults)
    zero-shot members          +2.2 to +2.7         88.85     89.86  0.3069  0.0242

The fix is the validation choice above: a lower learning rate and no label smoothing. This departs
from D.2, which smooths with 0.1 for ImageNet and CIFAR-100 (not for BERT); at lr 0.003 the two
are close (smoothing gives the ensemble a lower ECE, no smoothing a lower NLL and the member a
lower NLL, which decides), at the previous lr 0.01 smoothing is clearly worse.

Results are cached (:class:`DiskCache` kind ``finetune``) under the source model's weights, the
mask, the configuration, the training images (and their preprocessing) and the seed, so a repeated
run loads the fine-tuned weights instead of training again.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace

import pandas as pd
import torch
from torch import nn

from hydra_core.cache import DiskCache, cache_key, model_fingerprint
from hydra_core.data.images import take
from hydra_core.data.provenance import item_keys
from hydra_core.data.text import DataSet
from hydra_core.evaluate import callable_model
from hydra_core.inference import predict
from hydra_core.masks import MemberMask
from hydra_core.metrics.classification import classification_metrics
from hydra_core.models.adapter import as_keep_mask, family_of, head_layout, prune_heads
from hydra_core.models.family import PARAMETER_KINDS
from hydra_core.models.vit import VIT
from hydra_core.training.schedules import Schedule, warmup_cosine_to_floor
from hydra_core.training.trainer import OPTIMIZERS, TrainerConfig, train

#: Changes whenever the weights a fine-tuning run produces change; part of every cache key.
FINETUNE_VERSION = "finetune-2"  # 2: a text member's dropout is seeded by its seed
FINETUNE_CACHE_KIND = "finetune"
#: Parameter groups that :attr:`FinetuneConfig.trainable` can name (each family sorts its
#: parameters into them).
PARAMETER_GROUPS = PARAMETER_KINDS
#: What :func:`select_finetune_config` tries by default: three of D.2's peak learning rates, one or
#: two epochs, and label smoothing off or at D.2's 0.1 (see the module docstring for why).
DEFAULT_GRID: dict[str, tuple] = {
    "lr": (0.003, 0.01, 0.03),
    "epochs": (1.0, 2.0),
    "label_smoothing": (0.0, 0.1),
}
#: Validation metrics :func:`select_finetune_config` can choose by.
SELECTION_CRITERIA = ("nll", "accuracy")
#: Validation images :func:`select_finetune_config` scores each grid point on by default.
SELECTION_IMAGES = 2000


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
        label_smoothing: epsilon of the cross-entropy (D.2: 0.1; ours: 0, see the module
            docstring).
        trainable: parameter groups that are updated (see :data:`PARAMETER_GROUPS`).
        n_train: training samples, a fixed subset of the training set (default: Fashion-MNIST's
            55,000 images; None: all).
        grad_clip: clip the gradient's global L2 norm to this (None: no clipping).
    """

    optimizer: str = "sgd"  # as D.2
    lr: float = 0.003  # selected on validation images (module docstring); in D.2's grid
    weight_decay: float = 0.0  # as D.2
    momentum: float = 0.9  # as D.2
    epochs: float = 1.0  # selected with lr and label_smoothing
    steps: int | None = None
    batch_size: int = 128
    warmup_steps: int = 10
    min_lr_fraction: float = 1e-5  # D.2's floor
    label_smoothing: float = 0.0  # selected; D.2 uses 0.1, which leaves our members under-confident
    trainable: tuple[str, ...] = ("attn", "mlp", "norm", "head")  # D.2's targeted subset
    n_train: int | None = 5000  # 40 steps per epoch; the size the selection and the report use
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
    return schedule_of(config, total)(step)


def trainer_config(config: FinetuneConfig, total: int, seed: int) -> TrainerConfig:
    """The training loop's settings of a fine-tuning of ``total`` steps with ``config``, its
    batch order and dropout drawn from ``seed``."""
    return TrainerConfig(
        steps=total,
        lr=config.lr,
        optimizer=config.optimizer,
        weight_decay=config.weight_decay,
        momentum=config.momentum,
        grad_clip=config.grad_clip,
        label_smoothing=config.label_smoothing,
        seed=int(seed),
        dropout_seed=int(seed),
    )


def schedule_of(config: FinetuneConfig, total: int) -> Schedule:
    """The learning rate of every step of a run of ``total`` steps (:func:`learning_rate`)."""
    return warmup_cosine_to_floor(config.lr, config.warmup_steps, total, config.min_lr_fraction)


def parameter_group(name: str, model: nn.Module | None = None) -> str:
    """Which of :data:`PARAMETER_GROUPS` the parameter ``name`` of ``model`` belongs to, as its
    family says (:meth:`~hydra_core.models.family.ModelFamily.parameter_kind`); without a model,
    by timm ViT names."""
    if model is None:
        return VIT.parameter_kind(None, name)
    return family_of(model).parameter_kind(model, name)


def trainable_parameters(model: nn.Module, groups: Sequence[str]) -> dict[str, nn.Parameter]:
    """The parameters of ``model`` in ``groups`` (:func:`parameter_group`), by name, in model
    order: what fine-tuning updates."""
    family = family_of(model)
    return {
        name: p
        for name, p in model.named_parameters()
        if family.parameter_kind(model, name) in groups
    }


@dataclass
class FinetunedMember:
    """A fine-tuned member: the structurally pruned model and how it came about.

    Args:
        name: the member's name (from its :class:`MemberMask`).
        model: the pruned, fine-tuned model, of the source model's kind (eval mode, CPU); its own
            layout keeps every head.
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
    data: DataSet,
    preprocess: Callable[[torch.Tensor], torch.Tensor],
    seed: int,
) -> str:
    """Source weights, mask, configuration, training samples, preprocessing (by its output on the
    first samples) and seed: everything the fine-tuned weights depend on."""
    probe = preprocess(data.inputs[:4])
    return cache_key(
        FINETUNE_VERSION,
        model_fingerprint(model),
        keep,
        asdict(config),
        data.fingerprint(),
        probe,
        seed=int(seed),
    )


def training_subset(config: FinetuneConfig, train_set: DataSet | None = None) -> DataSet:
    """The fixed subset of ``train_set`` (default: Fashion-MNIST train) a run trains on."""
    train_set = _labelled(train_set, "train", "training")
    return take(train_set, config.n_train, purpose="finetune")


def members_training_items(
    model: nn.Module, config: FinetuneConfig, train_set: DataSet | None = None
) -> DataSet:
    """The items :func:`finetune_members` trains ``model``'s members on: the fixed subset of
    ``train_set`` (default: the training split of the embedded ID set of its modality)."""
    return training_subset(config, _training_set(model, train_set))


def validation_subset(
    n: int | None = SELECTION_IMAGES, validation_set: DataSet | None = None
) -> DataSet:
    """The fixed subset of ``validation_set`` (default: Fashion-MNIST validation, the 5,000
    training images held out from the default model's training) that
    :func:`select_finetune_config` scores its grid points on."""
    validation_set = _labelled(validation_set, "validation", "validation")
    return take(validation_set, n, purpose="finetune-validation")


def finetune_member(
    model: nn.Module,
    keep: torch.Tensor,
    config: FinetuneConfig,
    *,
    preprocess: Callable[[torch.Tensor], torch.Tensor],
    train_set: DataSet | None = None,
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
        preprocess: a set's inputs (uint8 images, texts) -> model inputs (the loaded model's).
        train_set: a labelled training set (default: the training split of the embedded ID set
            of the model's modality: Fashion-MNIST, Rotten Tomatoes); the run uses
            ``config.n_train`` of its samples, a fixed subset.
        seed: the batch-order seed.
        device: where to train.
        cache: load the weights from it when present, save them after training.
        progress: ``progress(done, total)`` after every optimiser step.
    """
    keep = as_keep_mask(head_layout(model), keep)
    data = training_subset(config, _training_set(model, train_set))
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
    family_of(pruned).weights_changed(pruned)  # e.g. a trained text tower's class embeddings
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
    train_set: DataSet | None = None,
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
    """The fine-tuned members fused into one model (:func:`~hydra_core.hydra.fused.fuse_members`),
    their MLPs averaged (each member keeps all the heads its pruned model has)."""
    from hydra_core.hydra.fused import fuse_members

    return fuse_members([(m.model, head_layout(m.model).all_kept()) for m in members])


# --- choosing the configuration on validation images ------------------------------------------


@dataclass
class FinetuneSelection:
    """What :func:`select_finetune_config` found.

    Args:
        best: the configuration of the best grid point.
        table: one row per grid point, in grid order: the grid's fields, ``steps``, the fine-tuned
            member's validation ``accuracy``, ``nll``, ``ece`` and mean top-label ``confidence``
            (below accuracy: under-confident), training ``seconds`` and ``cached``.
        criterion: the validation metric that chose (see :data:`SELECTION_CRITERIA`).
        n_validation: validation images every grid point was scored on.
    """

    best: FinetuneConfig
    table: pd.DataFrame
    criterion: str
    n_validation: int


def grid_configs(base: FinetuneConfig, grid: Mapping[str, Sequence]) -> list[FinetuneConfig]:
    """Every combination of ``grid``'s values (field name -> values to try) on top of ``base``, in
    grid order: the last field varies fastest."""
    names = {f.name for f in fields(FinetuneConfig)}
    unknown = sorted(set(grid) - names)
    if unknown:
        raise ValueError(
            f"the grid names {unknown}, which are not FinetuneConfig fields; expected some of "
            f"{', '.join(sorted(names))}"
        )
    empty = [name for name, values in grid.items() if len(values) == 0]
    if empty or not grid:
        raise ValueError(f"every grid field needs at least one value; got {dict(grid)}")
    if "epochs" in grid and base.steps is not None:
        raise ValueError(
            f"the grid varies epochs but the base configuration sets steps={base.steps}, which "
            "overrides them; leave steps unset (None) or take epochs out of the grid"
        )
    return [
        replace(base, **dict(zip(grid, values, strict=True)))
        for values in itertools.product(*grid.values())
    ]


def select_finetune_config(
    model: nn.Module,
    keep: torch.Tensor,
    base: FinetuneConfig | None = None,
    *,
    preprocess: Callable[[torch.Tensor], torch.Tensor],
    grid: Mapping[str, Sequence] | None = None,
    criterion: str = "nll",
    train_set: DataSet | None = None,
    validation_set: DataSet | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
    cache: DiskCache | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> FinetuneSelection:
    """Fine-tune one member with every configuration of a small grid and keep the one whose member
    scores best on validation samples (D.2: "best by validation").

    The validation samples must share no sample (by pixels, or by text) with the samples any grid
    point trains on; the default ones (:func:`validation_subset`) are held out from the default
    model's training too, and none of them is a Fashion-MNIST test image, the split the reports
    use.

    Args:
        model: the source model; never modified.
        keep: the member's head mask on ``model`` (e.g. the first member of an ensemble).
        base: the configuration the grid varies (default: :class:`FinetuneConfig()`).
        grid: field name -> values to try (default: :data:`DEFAULT_GRID`).
        criterion: ``"nll"`` (default: a proper score, so it weighs calibration as well as
            accuracy) or ``"accuracy"`` (ties broken by NLL); exact ties go to the earlier grid
            point.
        train_set: as :func:`finetune_member`.
        validation_set: the labelled samples that score each grid point (default:
            :func:`validation_subset` of the modality's embedded ID set's validation split).
        seed, device, cache: as :func:`finetune_member`; every grid point uses the same seed.
        progress: ``progress(grid point, done, total)`` after every optimiser step.
    """
    _check_criterion(criterion)
    grid = DEFAULT_GRID if grid is None else grid
    configs = grid_configs(FinetuneConfig() if base is None else base, grid)
    train_set = _labelled(_training_set(model, train_set), "train", "training")
    validation = (
        validation_subset(validation_set=_training_set(model, None, "validation"))
        if validation_set is None
        else _labelled(validation_set, "validation", "validation")
    )
    seen = item_keys(validation.inputs)
    rows = []
    for config in configs:
        data = training_subset(config, train_set)
        shared = len(seen & item_keys(data.inputs))
        if shared:
            kind = "images" if isinstance(data.inputs, torch.Tensor) else "texts"
            raise ValueError(
                f"{shared} of the {len(validation)} validation {kind} are also among the "
                f"{len(data)} fine-tuning {kind}; validate on {kind} held out from fine-tuning "
                "(e.g. Fashion-MNIST's validation split)"
            )
        point = {name: getattr(config, name) for name in grid}
        label = ", ".join(f"{name} {value}" for name, value in point.items())
        member = finetune_member(
            model,
            keep,
            config,
            preprocess=preprocess,
            train_set=train_set,
            seed=seed,
            name=label,
            device=device,
            cache=cache,
            progress=None if progress is None else (lambda d, t, s=label: progress(s, d, t)),
        )
        member_model = callable_model(member.model.to(device))
        probs = predict(member_model, validation.inputs, preprocess, device=device)
        probs = probs.softmax(-1)  # (N, C)
        scores = classification_metrics(probs, validation.labels)
        rows.append(
            {
                **point,
                "steps": config.total_steps(len(data)),
                "accuracy": scores["accuracy"],
                "nll": scores["nll"],
                "ece": scores["ece"],
                "confidence": probs.max(-1).values.mean().item(),
                "seconds": member.seconds,
                "cached": member.cached,
            }
        )
    table = pd.DataFrame(rows)
    return FinetuneSelection(
        configs[best_grid_point(table, criterion)], table, criterion, len(validation)
    )


def best_grid_point(table: pd.DataFrame, criterion: str = "nll") -> int:
    """The position of the row of ``table`` (columns ``nll`` and ``accuracy``) that ``criterion``
    picks: the lowest NLL, or the highest accuracy with ties broken by the lower NLL; of rows
    equal in both, the first."""
    _check_criterion(criterion)
    nlls, accuracies = table["nll"].tolist(), table["accuracy"].tolist()
    if criterion == "nll":
        return min(range(len(table)), key=lambda i: nlls[i])  # min keeps the first of equals
    return min(range(len(table)), key=lambda i: (-accuracies[i], nlls[i]))


# --- the training run ---------------------------------------------------------------------------


def _train(
    model: nn.Module,
    data: DataSet,
    config: FinetuneConfig,
    preprocess: Callable[[torch.Tensor], torch.Tensor],
    seed: int,
    device: torch.device,
    progress: Callable[[int, int], None] | None,
) -> list[dict]:
    """Fine-tune ``model`` in place with :func:`~hydra_core.training.trainer.train`: the
    ``config.trainable`` groups, cross-entropy on preprocessed samples in a new random order
    every epoch and dropout (a text model's) both from ``seed``, so that the same member, config
    and seed give the same weights whatever ran before (the cache key assumes so)."""
    model.to(device)
    system = callable_model(model)  # a text model: one that takes packed token ids
    n = len(data)
    total = config.total_steps(n)

    def shuffled(generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        return torch.randperm(n, generator=generator).split(config.batch_size)

    def logits_and_labels(index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = preprocess(_items(data.inputs, index)).to(device)  # token ids stay ints
        return system(x), data.labels[index].to(device)

    result = train(
        model,
        trainable_parameters(model, config.trainable),
        logits_and_labels,
        shuffled,
        trainer_config(config, total, seed),
        schedule_of(config, total),
        progress=progress,
    )
    return [{"step": s.step, "lr": s.lr, "loss": s.loss} for s in result.steps]


def _training_set(model: nn.Module, data: DataSet | None, split: str = "train") -> DataSet:
    """``data``, or when None the ``split`` of the embedded ID set of ``model``'s modality
    (Fashion-MNIST for images, Rotten Tomatoes for text)."""
    return family_of(model).modality.load_id(split) if data is None else data


def _labelled(data: DataSet | None, split: str, role: str) -> DataSet:
    """``data``, or Fashion-MNIST's ``split`` when None; refused without labels."""
    if data is None:
        from hydra_core.data.fashion_mnist import load_fashion_mnist

        data = load_fashion_mnist(split)
    if data.labels is None:
        raise ValueError(f"the {role} set {data.name!r} has no labels")
    return data


def _items(inputs: torch.Tensor | Sequence[str], index: torch.Tensor):
    """The items of a set's ``inputs`` (images, or a tuple of texts) at ``index`` (1-D int64)."""
    if isinstance(inputs, torch.Tensor):
        return inputs[index]
    return tuple(inputs[i] for i in index.tolist())


def _check_criterion(criterion: str) -> None:
    if criterion not in SELECTION_CRITERIA:
        raise ValueError(
            f"criterion must be one of {', '.join(SELECTION_CRITERIA)}, got {criterion!r}"
        )


def _reset_flags(model: nn.Module) -> None:
    """Fine-tuned members leave with every parameter trainable again, as a fresh model is."""
    for p in model.parameters():
        p.requires_grad_(True)
