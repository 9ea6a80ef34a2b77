"""The embedded default model: a small ViT trained from scratch on Fashion-MNIST by our own code.

Reproduce the shipped checkpoint with::

    python -m hydra_core train --seed 0 --threads 1 \\
        --out hydra_core/assets/fmnist_vit_default.safetensors

The same code trains the extra independently-seeded copies that Deep Ensembles need.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from timm.models.vision_transformer import VisionTransformer

from hydra_core.files import atomic_write
from hydra_core.models.preprocess import normalize_images
from hydra_core.paths import ASSETS_DIR
from hydra_core.training import trainer
from hydra_core.training.schedules import warmup_cosine

DEFAULT_CHECKPOINT = ASSETS_DIR / "fmnist_vit_default.safetensors"
DEFAULT_NAME = "fmnist-vit-default"
MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST pixel statistics (training set), on a 0..1 scale


@dataclass(frozen=True)
class VitConfig:
    """Architecture of the default ViT (timm ``VisionTransformer`` keyword arguments)."""

    img_size: int = 28  # Fashion-MNIST resolution
    patch_size: int = 7  # 4x4 = 16 patches + CLS = 17 tokens: cheap enough for live head search
    in_chans: int = 1  # grayscale
    num_classes: int = 10
    embed_dim: int = 192  # d; head dim d_k = 192 / 12 = 16
    depth: int = 6  # L
    num_heads: int = 12  # H, as in ViT-B: 72 heads in all
    mlp_ratio: float = 2.0  # small MLP keeps the model at 1.8M parameters (~7 MB)
    qkv_bias: bool = True
    global_pool: str = "token"  # classify from the CLS token


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation recipe; the defaults reproduce the shipped checkpoint."""

    seed: int = 0  # the only thing Deep Ensemble members change
    epochs: int = 12
    batch_size: int = 128
    lr: float = 1e-3  # AdamW peak learning rate
    weight_decay: float = 0.05
    warmup_epochs: float = 0.5  # linear warm-up, then cosine decay to 0
    pad_crop: int = 0  # random-crop augmentation (pad, crop back to 28); 0 = off: it slowed
    # convergence (84% after 7 of 15 epochs, against 88.6% after 7 of 12 without it)
    hflip: bool = True  # random horizontal flips (clothes are mirror-symmetric enough)


def build_vit(config: VitConfig = VitConfig()) -> VisionTransformer:
    """A freshly initialised ViT of the default architecture."""
    return VisionTransformer(**asdict(config))


#: uint8 images (N, C, H, W) of any size and channel count -> the default model's input: colour
#: averaged to grayscale, resampled to 28x28 (bilinear, antialiased), Fashion-MNIST's statistics
preprocess = partial(normalize_images, size=28, channels=1, mean=(MEAN,), std=(STD,))


def load_checkpoint(path: str | Path) -> tuple[VisionTransformer, dict]:
    """A ViT and the metadata stored beside its weights by :func:`save_checkpoint`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if "vit_config" not in meta:
        raise ValueError(f"{path} has no 'vit_config' metadata; it was not written by Hydra Lab")
    config = VitConfig(**json.loads(meta["vit_config"]))
    model = build_vit(config)
    model.load_state_dict(load_file(str(path)), strict=True)
    model.eval()
    return model, {k: json.loads(v) for k, v in meta.items()}


def save_checkpoint(
    model: VisionTransformer,
    path: str | Path,
    config: VitConfig | dict,
    *,
    preprocess: dict | None = None,
    classes: Sequence[str] | None = None,
    **meta: object,
) -> None:
    """Weights as safetensors, with everything needed to load them in the header.

    Args:
        model: the ViT.
        path: the file to write (atomically).
        config: its architecture: a :class:`VitConfig`, or the keyword arguments of timm's
            ``VisionTransformer`` (``{"img_size": 32, "patch_size": 8, "init_values": 1e-5,
            ...}``), so that ``load_model(path)`` rebuilds it with no other information.
        preprocess: ``{"mean": ..., "std": ...}``, the normalisation of its inputs on a 0..1
            scale (one value or one per channel); Fashion-MNIST's when None.
        classes: class names, index = label.
        meta: more JSON-serialisable entries for the header (training recipe, summary).
    """
    arch = asdict(config) if isinstance(config, VitConfig) else dict(config)
    header = {
        "vit_config": json.dumps(arch),
        "preprocess": json.dumps(preprocess or {"mean": MEAN, "std": STD}),
    }
    if classes is not None:
        header["classes"] = json.dumps(list(classes))
    header.update({k: json.dumps(v) for k, v in meta.items()})
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    atomic_write(path, lambda tmp: save_file(state, str(tmp), metadata=header))


def load_default_model() -> VisionTransformer:
    """The shipped default model (timm ``VisionTransformer``, eval mode, on the CPU)."""
    if not DEFAULT_CHECKPOINT.is_file():
        raise FileNotFoundError(
            f"the default checkpoint {DEFAULT_CHECKPOINT} is missing; it is part of the repository "
            "(restore it with `git checkout -- hydra_core/assets`) or can be retrained with "
            "`python -m hydra_core train --seed 0 --threads 1`"
        )
    model, _ = load_checkpoint(DEFAULT_CHECKPOINT)
    return model


@dataclass(frozen=True)
class Augmentation:
    """One batch's random augmentation draws: crop offsets (None: no crop) and flips."""

    dy: torch.Tensor | None  # (B,) int
    dx: torch.Tensor | None  # (B,) int
    flip: torch.Tensor | None  # (B,) bool


def draw_augmentation(n: int, generator: torch.Generator, cfg: TrainConfig) -> Augmentation:
    """The draws for a batch of ``n`` images, in the recipe's order: crop rows, crop columns,
    flips."""
    dy = dx = flip = None
    if cfg.pad_crop:
        dy = torch.randint(0, 2 * cfg.pad_crop + 1, (n,), generator=generator)
        dx = torch.randint(0, 2 * cfg.pad_crop + 1, (n,), generator=generator)
    if cfg.hflip:
        flip = torch.rand(n, generator=generator) < 0.5
    return Augmentation(dy, dx, flip)


def augment(x: torch.Tensor, draws: Augmentation, cfg: TrainConfig) -> torch.Tensor:
    """(B, C, 28, 28) images padded and cropped back, and flipped, as ``draws`` say."""
    if draws.dy is not None:
        p = cfg.pad_crop
        padded = F.pad(x, (p, p, p, p))
        dy, dx = draws.dy, draws.dx
        x = torch.stack(
            [padded[i, :, dy[i] : dy[i] + 28, dx[i] : dx[i] + 28] for i in range(len(x))]
        )
    if draws.flip is not None:
        x = torch.where(draws.flip[:, None, None, None], x.flip(-1), x)
    return x


@torch.inference_mode()
def accuracy_on(
    model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 1000
) -> float:
    """Top-1 accuracy of ``model`` on uint8 Fashion-MNIST-style images."""
    model.eval()
    correct = 0
    for start in range(0, len(images), batch_size):
        logits = model(preprocess(images[start : start + batch_size]))
        correct += (logits.argmax(-1) == labels[start : start + batch_size]).sum().item()
    return correct / len(images)


def train_vit(
    cfg: TrainConfig = TrainConfig(),
    arch: VitConfig = VitConfig(),
    *,
    log: Callable[[str], None] = print,
    progress: Callable[[int, int], None] | None = None,
    resume: str | Path | None = None,
) -> tuple[VisionTransformer, dict]:
    """Train the default ViT on the 55,000 Fashion-MNIST training images (5,000 are held out).

    Returns the model (eval mode) and a summary with validation and test accuracy per epoch.
    ``progress(done, total)`` is called after every optimiser step. ``resume``: a file the run's
    state is kept in after every epoch (:func:`hydra_core.training.trainer.train`); an
    interrupted run given the same file goes on from its last epoch, to the same weights.
    """
    from hydra_core.data.fashion_mnist import load_fashion_mnist

    train, val, test = (load_fashion_mnist(s) for s in ("train", "validation", "test"))
    torch.manual_seed(cfg.seed)  # the initialisation (the model has no dropout)
    model = build_vit(arch)
    steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
    total = cfg.epochs * steps_per_epoch

    def epoch_batches(generator: torch.Generator) -> list[tuple[torch.Tensor, Augmentation]]:
        # every draw of an epoch: its order, then each batch's augmentation in turn
        order = torch.randperm(len(train), generator=generator)
        return [
            (index, draw_augmentation(len(index), generator, cfg))
            for index in order.split(cfg.batch_size)
        ]

    def logits_and_labels(batch: tuple[torch.Tensor, Augmentation]):
        index, draws = batch
        return model(augment(preprocess(train.images[index]), draws, cfg)), train.labels[index]

    start_time = time.perf_counter()
    if resume is not None and Path(resume).is_file():
        log(f"going on from the interrupted run kept in {resume}")

    def record(epoch: trainer.EpochRecord) -> None:
        log(
            f"epoch {epoch.epoch}/{cfg.epochs}  loss {epoch.loss:.4f}  val acc "
            f"{epoch.scores['accuracy']:.4f}  ({time.perf_counter() - start_time:.0f} s)"
        )

    result = trainer.train(
        model,
        dict(model.named_parameters()),
        logits_and_labels,
        epoch_batches,
        trainer.TrainerConfig(steps=total, lr=cfg.lr, weight_decay=cfg.weight_decay, seed=cfg.seed),
        warmup_cosine(cfg.lr, int(cfg.warmup_epochs * steps_per_epoch), total),
        validate=lambda: {"accuracy": accuracy_on(model, val.images, val.labels)},
        on_epoch=record,
        progress=progress,
        resume=resume,
    )
    test_acc = accuracy_on(model, test.images, test.labels)
    log(f"test accuracy {test_acc:.4f}")
    history = [
        {"epoch": e.epoch, "loss": e.loss, "val_accuracy": e.scores["accuracy"]}
        for e in result.epochs
    ]
    summary = {
        "history": history,
        "test_accuracy": test_acc,
        "train_seconds": round(result.seconds, 1),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    return model, summary
