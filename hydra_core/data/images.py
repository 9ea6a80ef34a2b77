"""The in-memory image set every loader returns, and the helpers that cut it into subsets."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

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
        if self.labels is not None:
            if self.labels.shape != (len(self.images),):
                raise ValueError(
                    f"ImageSet {self.name!r}: {len(self.images)} images but labels of shape "
                    f"{tuple(self.labels.shape)}"
                )
            if self.labels.dtype != torch.int64:
                raise ValueError(
                    f"ImageSet {self.name!r}: labels must be int64, got {self.labels.dtype}"
                )
        if self.group not in GROUPS:
            raise ValueError(
                f"ImageSet {self.name!r}: group must be one of {GROUPS}, got {self.group!r}"
            )

    def __len__(self) -> int:
        return len(self.images)

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


def stable_seed(*parts: object) -> int:
    """A seed derived from names, identical on every machine and Python run (unlike ``hash``)."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def stable_permutation(n: int, *parts: object) -> torch.Tensor:
    """A permutation of ``range(n)`` fixed by ``parts`` (e.g. the set's name)."""
    generator = torch.Generator().manual_seed(stable_seed(*parts))
    return torch.randperm(n, generator=generator)


def take(image_set: ImageSet, n: int | None, *, purpose: str) -> ImageSet:
    """The first ``n`` images of a fixed shuffle of ``image_set`` (the whole shuffle when n is None
    or covers the set).

    The shuffle depends only on the set's name and ``purpose``, so the same request always returns
    the same images, and a smaller request is a prefix of a larger one, whatever the two sizes.
    """
    if n is not None and n < 1:
        raise ValueError(f"asked for {n} images of {image_set.name!r}; need at least 1")
    order = stable_permutation(len(image_set), image_set.name, purpose)
    return image_set.subset(order if n is None else order[:n])


def split_in_two(image_set: ImageSet, first_share: float = 0.5) -> tuple[ImageSet, ImageSet]:
    """Two disjoint parts of a set (a fixed shuffle, cut at ``first_share``): (search, report)."""
    if len(image_set) < 2:
        raise ValueError(
            f"{image_set.name!r} has {len(image_set)} image(s); disjoint search and report subsets "
            "need at least 2"
        )
    order = stable_permutation(len(image_set), image_set.name, "search-report")
    cut = min(max(1, round(len(image_set) * first_share)), len(image_set) - 1)
    return image_set.subset(order[:cut]), image_set.subset(order[cut:])
