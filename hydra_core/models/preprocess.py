"""From stored images to model input: every model family's preprocessing is built from these."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn


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


def input_format(model: nn.Module) -> tuple[int, int]:
    """(channels, side) of a ViT's input images: 1 or 3 channels, the patch embedding's size."""
    patch_embed = getattr(model, "patch_embed", None)
    size = getattr(patch_embed, "img_size", None)
    channels = getattr(getattr(patch_embed, "proj", None), "in_channels", 3)
    return (1 if channels == 1 else 3), (int(size[0]) if size else 224)


def timm_preprocess(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The resize/normalise step of timm's data config (centre crop folded into the resize)."""
    from timm.data import resolve_data_config

    cfg = resolve_data_config(model=model)
    _, size, _ = cfg["input_size"]
    return partial(
        normalize_images, size=size, channels=cfg["input_size"][0], mean=cfg["mean"], std=cfg["std"]
    )
