"""The in-memory image set every image loader returns, and the helpers that cut it, or a
:class:`~hydra_core.data.text.TextSet`, into subsets."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import TypeVar

import torch
import torch.nn.functional as F

#: an :class:`ImageSet` or a :class:`~hydra_core.data.text.TextSet` (text.py builds on this
#: module, so it is not imported here): anything with ``name``, ``__len__`` and ``subset``
DataSet = TypeVar("DataSet")

GROUPS = ("id", "near", "far")


@dataclass(frozen=True, eq=False)
class ImageSet:
    """A labelled or unlabelled set of images held in memory.

    Args:
        name: short identifier (``"fashion_mnist"``, ``"mnist"``), used in tables and cache keys.
        images: uint8 tensor of shape (N, C, H, W); all images of a set share one size.
        labels: int64 tensor of shape (N,), or None for OOD sets without classes.
        group: ``"id"`` for the in-distribution set, ``"near"`` or ``"far"`` for OOD sets.
        classes: class names, index = label, when the set has labels.
        description: one sentence on what the images are and where they come from.
    """

    name: str
    images: torch.Tensor
    labels: torch.Tensor | None = None
    group: str = "id"
    classes: tuple[str, ...] | None = None
    description: str = ""
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.ndim != 4:
            raise ValueError(
                f"ImageSet {self.name!r}: images must be a uint8 tensor of shape (N, C, H, W), "
                f"got {self.images.dtype} with shape {tuple(self.images.shape)}"
            )
        check_labels_and_group(self, "images")

    def __len__(self) -> int:
        return len(self.images)

    @property
    def inputs(self) -> torch.Tensor:
        """What an image model's ``preprocess`` takes: the uint8 images."""
        return self.images

    def subset(self, index: torch.Tensor, name: str | None = None) -> ImageSet:
        """The images at ``index`` (a 1-D int64 tensor), as a new set."""
        return ImageSet(
            name=name or self.name,
            images=self.images[index],
            labels=None if self.labels is None else self.labels[index],
            group=self.group,
            classes=self.classes,
            description=self.description,
            source=self.source,
        )

    def fingerprint(self) -> str:
        """A hash of the pixels and labels: part of every cache key computed from this set."""
        h = hashlib.sha256()
        h.update(self.name.encode())
        h.update(str(tuple(self.images.shape)).encode())
        h.update(self.images.contiguous().numpy().tobytes())
        if self.labels is not None:
            h.update(self.labels.contiguous().numpy().tobytes())
        return h.hexdigest()[:16]


def check_labels_and_group(data_set, items: str) -> None:
    """What every set's ``__post_init__`` checks beside its items: labels (if any) one int64
    per item, and a group of :data:`GROUPS`; errors name the set's class and name."""
    where = f"{type(data_set).__name__} {data_set.name!r}"
    labels, n = data_set.labels, len(data_set)
    if labels is not None:
        if labels.shape != (n,):
            raise ValueError(f"{where}: {n} {items} but labels of shape {tuple(labels.shape)}")
        if labels.dtype != torch.int64:
            raise ValueError(f"{where}: labels must be int64, got {labels.dtype}")
    if data_set.group not in GROUPS:
        raise ValueError(f"{where}: group must be one of {GROUPS}, got {data_set.group!r}")


def stable_seed(*parts: object) -> int:
    """A seed derived from names, identical on every machine and Python run (unlike ``hash``)."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def stable_permutation(n: int, *parts: object) -> torch.Tensor:
    """A permutation of ``range(n)`` fixed by ``parts`` (e.g. the set's name)."""
    generator = torch.Generator().manual_seed(stable_seed(*parts))
    return torch.randperm(n, generator=generator)


def kind_of(data_set: DataSet) -> str:
    """What a set holds, for messages: ``"images"`` or ``"texts"``."""
    return "images" if isinstance(data_set, ImageSet) else "texts"


def take(data_set: DataSet, n: int | None, *, purpose: str) -> DataSet:
    """The first ``n`` items of a fixed shuffle of ``data_set``, an image or a text set (the whole
    shuffle when n is None or covers the set).

    The shuffle depends only on the set's name and ``purpose``, so the same request always returns
    the same items, and a smaller request is a prefix of a larger one, whatever the two sizes.
    """
    if n is not None and n < 1:
        raise ValueError(f"asked for {n} {kind_of(data_set)} of {data_set.name!r}; need at least 1")
    order = stable_permutation(len(data_set), data_set.name, purpose)
    return data_set.subset(order if n is None else order[:n])


def split_in_two(data_set: DataSet, first_share: float = 0.5) -> tuple[DataSet, DataSet]:
    """Two disjoint parts of an image or text set (a fixed shuffle, cut at ``first_share``):
    (search, report)."""
    if len(data_set) < 2:
        raise ValueError(
            f"{data_set.name!r} has {len(data_set)} {kind_of(data_set)}; disjoint search and "
            "report subsets need at least 2"
        )
    order = stable_permutation(len(data_set), data_set.name, "search-report")
    cut = min(max(1, round(len(data_set) * first_share)), len(data_set) - 1)
    return data_set.subset(order[:cut]), data_set.subset(order[cut:])


def resampled(image_set: ImageSet, size: int, channels: int) -> ImageSet:
    """The set as uint8 (N, channels, size, size): bilinear, antialiased resampling; grey copied
    to three channels, colour averaged to one. Returned as it is when it already has that format."""
    images = image_set.images
    if tuple(images.shape[1:]) == (channels, size, size):
        return image_set
    x = images.float()
    if x.shape[1] != channels:
        x = x.expand(-1, 3, -1, -1) if channels == 3 else x.mean(dim=1, keepdim=True)
    if x.shape[-2:] != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True)
    x = x.round_().clamp_(0, 255).to(torch.uint8)  # (N, channels, size, size)
    return replace(
        image_set,
        images=x,
        description=f"{image_set.description}; resampled to {channels}x{size}x{size}",
    )
