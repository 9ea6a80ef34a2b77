"""Common corruptions of the ID data at five severities (paper Tables 13-14, after Hendrycks &
Dietterich's ImageNet-C): the ones that make sense on small grayscale images, and character- and
word-level noise for text. Every corruption is deterministic given its seed: the same set, name,
severity and seed always give the same items.

Images: ``gaussian_noise``, ``shot_noise``, ``impulse_noise``, ``gaussian_blur``, ``contrast``,
``brightness``, ``pixelate`` and ``jpeg``, on uint8 images (N, C, H, W), returned as uint8 of the
same shape. ImageNet-C's parameters are for 224-pixel photos: the blur and pixelation are given
here in pixels of a 28-pixel image (ImageNet-C's blur of sigma 3 would leave nothing of it); the
noise, contrast, brightness and JPEG levels are ImageNet-C's own. Weather and geometric
corruptions (fog, frost, snow, elastic, zoom, motion) need image assets or assume photos and are
left out.

Text: ``typos`` (a character replaced, deleted, inserted or swapped with its neighbour, each
letter with the severity's probability), ``word_dropout`` (each word dropped) and ``word_swap``
(neighbouring words exchanged).
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from hydra_core.data.images import DataSet, ImageSet, kind_of, stable_seed
from hydra_core.errors import InputError

SEVERITIES = (1, 2, 3, 4, 5)

#: per image corruption, its parameter at severities 1..5 (ImageNet-C's where they carry over)
IMAGE_LEVELS: dict[str, tuple[float, ...]] = {
    "gaussian_noise": (0.08, 0.12, 0.18, 0.26, 0.38),  # std of added noise, images in [0, 1]
    "shot_noise": (60, 25, 12, 5, 3),  # photons per unit intensity (Poisson)
    "impulse_noise": (0.03, 0.06, 0.09, 0.17, 0.27),  # share of pixels set to 0 or 1
    "gaussian_blur": (0.5, 0.75, 1.0, 1.5, 2.0),  # sigma in pixels (28-pixel images)
    "contrast": (0.4, 0.3, 0.2, 0.1, 0.05),  # remaining contrast around the image mean
    "brightness": (0.1, 0.2, 0.3, 0.4, 0.5),  # added to every pixel
    "pixelate": (2, 3, 4, 5, 7),  # block side in pixels on 28-pixel images (scaled on others)
    "jpeg": (25, 18, 15, 10, 7),  # JPEG quality
}

#: per text corruption, the probability per letter (typos) or word at severities 1..5
TEXT_LEVELS: dict[str, tuple[float, ...]] = {
    "typos": (0.02, 0.05, 0.08, 0.12, 0.18),
    "word_dropout": (0.05, 0.1, 0.2, 0.3, 0.4),
    "word_swap": (0.05, 0.1, 0.2, 0.3, 0.4),
}

IMAGE_CORRUPTIONS = tuple(IMAGE_LEVELS)
TEXT_CORRUPTIONS = tuple(TEXT_LEVELS)


def _check(name: str, severity: int, levels: dict[str, tuple[float, ...]]) -> float:
    if name not in levels:
        raise InputError(f"unknown corruption {name!r}; choose one of {', '.join(levels)}")
    if isinstance(severity, bool) or severity not in SEVERITIES:
        raise InputError(f"severity must be one of 1..5, got {severity!r}")
    return levels[name][severity - 1]


# --- images (float in [0, 1], shape (N, C, H, W)) ----------------------------------------------


def _gaussian_noise(x: torch.Tensor, level: float, g: torch.Generator) -> torch.Tensor:
    return x + level * torch.randn(x.shape, generator=g)


def _shot_noise(x: torch.Tensor, level: float, g: torch.Generator) -> torch.Tensor:
    return torch.poisson(x * level, generator=g) / level


def _impulse_noise(x: torch.Tensor, level: float, g: torch.Generator) -> torch.Tensor:
    hit = torch.rand(x.shape, generator=g) < level
    salt = torch.rand(x.shape, generator=g) < 0.5
    return torch.where(hit, salt.to(x.dtype), x)


def _gaussian_blur(x: torch.Tensor, level: float, g: torch.Generator) -> torch.Tensor:
    radius = max(1, int(3 * level + 0.5))
    t = torch.arange(-radius, radius + 1, dtype=x.dtype)
    kernel = torch.exp(-(t**2) / (2 * level**2))
    kernel = kernel / kernel.sum()
    n, c, h, w = x.shape
    flat = x.reshape(n * c, 1, h, w)
    flat = F.conv2d(F.pad(flat, (radius, radius, 0, 0), mode="reflect"), kernel.view(1, 1, 1, -1))
    flat = F.conv2d(F.pad(flat, (0, 0, radius, radius), mode="reflect"), kernel.view(1, 1, -1, 1))
    return flat.reshape(n, c, h, w)


def _contrast(x: torch.Tensor, level: float, g: torch.Generator) -> torch.Tensor:
    mean = x.mean(dim=(1, 2, 3), keepdim=True)  # (N, 1, 1, 1)
    return (x - mean) * level + mean


def _brightness(x: torch.Tensor, level: float, g: torch.Generator) -> torch.Tensor:
    return x + level


def _pixelate(x: torch.Tensor, level: float, g: torch.Generator) -> torch.Tensor:
    h, w = x.shape[-2:]
    block = max(1, round(level * h / 28))  # pixels per block side, for 28-pixel images as given
    padded = F.pad(x, (0, -w % block, 0, -h % block), mode="replicate")  # whole blocks
    coarse = F.avg_pool2d(padded, block)  # (N, C, ceil(H / block), ceil(W / block))
    return coarse.repeat_interleave(block, dim=2).repeat_interleave(block, dim=3)[..., :h, :w]


def _jpeg(x: torch.Tensor, level: float, g: torch.Generator) -> torch.Tensor:
    from PIL import Image

    images = (x * 255).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)  # (N, H, W, C)
    mode = "L" if images.shape[-1] == 1 else "RGB"
    out = torch.empty_like(images)
    for i, image in enumerate(images.numpy()):
        buffer = io.BytesIO()
        array = image[..., 0] if mode == "L" else image
        Image.fromarray(array, mode=mode).save(buffer, format="JPEG", quality=int(level))
        decoded = np.asarray(Image.open(buffer).convert(mode))  # (H, W) or (H, W, C)
        out[i] = torch.from_numpy(decoded.reshape(image.shape).copy())
    return out.permute(0, 3, 1, 2).to(x.dtype) / 255


_IMAGE_FUNCTIONS: dict[str, Callable[[torch.Tensor, float, torch.Generator], torch.Tensor]] = {
    "gaussian_noise": _gaussian_noise,
    "shot_noise": _shot_noise,
    "impulse_noise": _impulse_noise,
    "gaussian_blur": _gaussian_blur,
    "contrast": _contrast,
    "brightness": _brightness,
    "pixelate": _pixelate,
    "jpeg": _jpeg,
}


def corrupt_images(
    images: torch.Tensor, name: str, severity: int, *, seed: int = 0
) -> torch.Tensor:
    """``images`` (uint8, (N, C, H, W)) under corruption ``name`` at ``severity`` (1..5), as
    uint8 of the same shape; the same arguments always give the same images."""
    level = _check(name, severity, IMAGE_LEVELS)
    if images.dtype != torch.uint8 or images.ndim != 4:
        raise InputError(
            f"corrupt_images takes uint8 images of shape (N, C, H, W), got {images.dtype} "
            f"with shape {tuple(images.shape)}"
        )
    g = torch.Generator().manual_seed(stable_seed("corruption", name, severity, seed))
    x = images.to(torch.float32) / 255
    y = _IMAGE_FUNCTIONS[name](x, level, g)
    return (y.clamp(0, 1) * 255).round().to(torch.uint8)


# --- text --------------------------------------------------------------------------------------

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _typos(text: str, p: float, rng: random.Random) -> str:
    chars, out, i = list(text), [], 0
    while i < len(chars):
        c = chars[i]
        if not c.isalpha() or rng.random() >= p:
            out.append(c)
            i += 1
            continue
        kind = rng.randrange(4)
        if kind == 0:  # replaced
            out.append(rng.choice(_LETTERS))
        elif kind == 2:  # inserted before it
            out += [rng.choice(_LETTERS), c]
        elif kind == 3 and i + 1 < len(chars):  # swapped with the next character
            out += [chars[i + 1], c]
            i += 1
        elif kind == 3:
            out.append(c)
        # kind 1: deleted
        i += 1
    return "".join(out)


def _word_dropout(text: str, p: float, rng: random.Random) -> str:
    words = text.split()
    kept = [w for w in words if rng.random() >= p]
    if words and not kept:  # never an empty text
        kept = [words[rng.randrange(len(words))]]
    return " ".join(kept)


def _word_swap(text: str, p: float, rng: random.Random) -> str:
    words, i = text.split(), 0
    while i + 1 < len(words):
        if rng.random() < p:
            words[i], words[i + 1] = words[i + 1], words[i]
            i += 2
        else:
            i += 1
    return " ".join(words)


_TEXT_FUNCTIONS: dict[str, Callable[[str, float, random.Random], str]] = {
    "typos": _typos,
    "word_dropout": _word_dropout,
    "word_swap": _word_swap,
}


def corrupt_texts(
    texts: tuple[str, ...] | list[str], name: str, severity: int, *, seed: int = 0
) -> tuple[str, ...]:
    """``texts`` under corruption ``name`` at ``severity`` (1..5); the same arguments always give
    the same texts."""
    p = _check(name, severity, TEXT_LEVELS)
    rng = random.Random(stable_seed("corruption", name, severity, seed))
    return tuple(_TEXT_FUNCTIONS[name](t, p, rng) for t in texts)


# --- sets --------------------------------------------------------------------------------------


def corruptions_for(data_set: DataSet) -> tuple[str, ...]:
    """The corruption names that apply to ``data_set``'s items (images or texts)."""
    return IMAGE_CORRUPTIONS if isinstance(data_set, ImageSet) else TEXT_CORRUPTIONS


def check_corruptions(names: tuple[str, ...] | list[str], data_set: DataSet) -> None:
    """Refuse (InputError) a corruption name that does not apply to ``data_set``'s items."""
    known = corruptions_for(data_set)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InputError(
            f"unknown corruption {unknown[0]!r} for {kind_of(data_set)}; choose from "
            f"{', '.join(known)}"
        )


def corrupt_set(data_set: DataSet, name: str, severity: int, *, seed: int = 0) -> DataSet:
    """``data_set`` (an image or a text set) with every item corrupted, labels kept, named
    ``"<set>-<corruption>-<severity>"`` (its cache keys differ from the clean set's)."""
    from dataclasses import replace

    new_name = f"{data_set.name}-{name}-{severity}"
    if isinstance(data_set, ImageSet):
        images = corrupt_images(data_set.images, name, severity, seed=seed)
        return replace(data_set, name=new_name, images=images)
    texts = corrupt_texts(data_set.texts, name, severity, seed=seed)
    return replace(data_set, name=new_name, texts=texts)
