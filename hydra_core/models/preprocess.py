"""From stored images to model input: every model family's preprocessing is built from these."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from hydra_core.models.text import TextPreprocess


def normalize_images(images: torch.Tensor, *, size: int, channels: int, mean, std) -> torch.Tensor:
    """uint8 (N, C, H, W) -> float, resized to size x size (bilinear, antialiased), normalised."""
    x = images.float().div_(255.0)
    if x.shape[1] != channels:
        if channels == 3 and x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        elif channels == 1:
            x = x.mean(dim=1, keepdim=True)
        else:
            raise ValueError(
                f"cannot turn {x.shape[1]}-channel images into {channels}-channel input"
            )
    if x.shape[-2:] != (size, size):
        x = F.interpolate(
            x, size=(size, size), mode="bilinear", antialias=True, align_corners=False
        )
    mean = torch.as_tensor(mean, dtype=x.dtype).view(1, -1, 1, 1)
    std = torch.as_tensor(std, dtype=x.dtype).view(1, -1, 1, 1)
    return (x - mean) / std


def describe(preprocess: Callable[[torch.Tensor], torch.Tensor]) -> dict | None:
    """The settings of a preprocessing built on :func:`normalize_images` (``size``,
    ``channels``, ``mean``, ``std``), to store beside a model; None for any other function."""
    if isinstance(preprocess, TextPreprocess) and preprocess.source:
        return {"tokenizer": preprocess.source, "max_length": preprocess.max_length}
    if isinstance(preprocess, partial) and preprocess.func is normalize_images:
        spec = dict(preprocess.keywords)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in spec.items()}
    return None


def input_format(model: nn.Module) -> tuple[int, int]:
    """(channels, side) of a ViT's input images: 1 or 3 channels, the patch embedding's size
    (a fused Hydra model states both in its ``config``; an open_clip image tower, bare or in a
    zero-shot classifier's ``visual``, its ``image_size`` and ``conv1``)."""
    config = getattr(model, "config", None)
    if hasattr(config, "in_chans") and hasattr(config, "img_size"):
        return (1 if config.in_chans == 1 else 3), int(config.img_size[0])
    tower = _openclip_tower(model)
    if tower is not None:
        return (1 if tower.conv1.in_channels == 1 else 3), int(tower.image_size[0])
    patch_embed = getattr(model, "patch_embed", None)
    size = getattr(patch_embed, "img_size", None)
    channels = getattr(getattr(patch_embed, "proj", None), "in_channels", 3)
    return (1 if channels == 1 else 3), (int(size[0]) if size else 224)


def _openclip_tower(model: nn.Module) -> nn.Module | None:
    """The open_clip image tower of ``model`` (itself, or its ``visual``), else None."""
    for candidate in (model, getattr(model, "visual", None)):
        if hasattr(candidate, "conv1") and hasattr(candidate, "image_size"):
            return candidate
    return None


def model_preprocess(
    model: nn.Module,
    *,
    mean: Sequence[float] | float | None = None,
    std: Sequence[float] | float | None = None,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """uint8 images -> the input ``model`` itself expects: its own image size and channels.

    The size and channels come from the model (``patch_embed.img_size``, the patch projection's
    input channels), never from a pretrained config that the model may have been built apart
    from (``img_size=32`` on a 224 px architecture). The normalisation is ``mean``/``std`` when
    given, else the model's timm ``pretrained_cfg`` (an open_clip image tower's
    ``preprocess_cfg``, else CLIP's own statistics), else ImageNet's; statistics of three colour
    channels are averaged for a one-channel model.

    Images are resized to a square only where they are not one already; image folders are read at
    the model's size (shorter side resized, bilinear, centre crop). open_clip's own transform
    resizes the shorter side with bicubic interpolation (for most models) before the same crop."""
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    channels, size = input_format(model)
    tower = _openclip_tower(model)
    if tower is not None:
        from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD

        cfg = {"mean": OPENAI_DATASET_MEAN, "std": OPENAI_DATASET_STD}
        cfg.update(getattr(tower, "preprocess_cfg", None) or {})
    else:
        cfg = getattr(model, "pretrained_cfg", None) or {}
    mean = _per_channel(
        mean if mean is not None else cfg.get("mean", IMAGENET_DEFAULT_MEAN), channels
    )
    std = _per_channel(std if std is not None else cfg.get("std", IMAGENET_DEFAULT_STD), channels)
    return partial(normalize_images, size=size, channels=channels, mean=mean, std=std)


def _per_channel(values: Sequence[float] | float, channels: int) -> tuple[float, ...]:
    values = (float(values),) if isinstance(values, int | float) else tuple(map(float, values))
    if len(values) == channels:
        return values
    if len(values) == 1:
        return values * channels
    if channels == 1:
        return (sum(values) / len(values),)
    raise ValueError(f"normalisation has {len(values)} values for a {channels}-channel model")


class TrimmedPreprocess:
    """A text preprocessing whose batches keep only the token columns some sentence uses: with
    sentences sorted by length, a batch costs its longest sentence, not ``max_length``."""

    def __init__(self, preprocess: Callable[[Sequence[str]], torch.Tensor]) -> None:
        self.preprocess = preprocess

    def __call__(self, texts: Sequence[str]) -> torch.Tensor:
        packed = self.preprocess(texts)  # (N, 2, T)
        used = max(1, int(packed[:, 1].sum(1).max())) if len(packed) else packed.shape[-1]
        return packed[..., :used]


def untrimmed(preprocess: Callable) -> Callable:
    """``preprocess`` without :class:`TrimmedPreprocess`'s trimming: what keys a copy stored for
    the model (a trimmed batch differs in shape only, never in a result)."""
    return preprocess.preprocess if isinstance(preprocess, TrimmedPreprocess) else preprocess
