"""The disjoint search and report subsets that every result is computed on (SPEC section 4).

Heads are selected with scores computed on *search* subsets; results are reported on *report*
subsets that share no image with them (paper Appendix D.1.2, "OOD sets and fairness"):

- in-distribution: two disjoint pools. By default the search pool is Fashion-MNIST's validation
  split (5,000 training images held out from training the default model) and the report pool is
  the official test set (10,000).
- every OOD set is cut once, by a fixed shuffle of its own, into two halves
  (:func:`~hydra_core.data.images.split_in_two`): the search half and the report half.

``n_search`` and ``n_report`` cap each part at the first n images of a fixed shuffle (the one
:func:`~hydra_core.data.images.take` uses), so the same request always gives the same images and a
smaller n is a prefix of a larger one. Nothing depends on the random state of the process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from hydra_core.data.fashion_mnist import load_fashion_mnist
from hydra_core.data.images import ImageSet, split_in_two, stable_permutation, take
from hydra_core.data.ood import load_ood_set, load_ood_sets
from hydra_core.errors import InputError


@dataclass(frozen=True, eq=False)
class Benchmark:
    """ID and OOD images, each cut into a search part (to select heads) and a report part."""

    id_search: ImageSet  # ID images used to select heads
    id_report: ImageSet  # ID images results are reported on
    ood_search: tuple[ImageSet, ...]  # per OOD set, its search part
    ood_report: tuple[ImageSet, ...]  # per OOD set, its report part (same order, same names)

    def __post_init__(self) -> None:
        for part in (self.id_search, self.id_report):
            if part.group != "id" or part.labels is None:
                raise ValueError(
                    f"the in-distribution set {part.name!r} needs labels and group 'id' "
                    f"(has group {part.group!r}, {'no ' if part.labels is None else ''}labels)"
                )
        search_names = [s.name for s in self.ood_search]
        if search_names != [s.name for s in self.ood_report]:
            raise ValueError(
                f"OOD search parts {search_names} and report parts "
                f"{[s.name for s in self.ood_report]} must name the same sets in the same order"
            )
        if len(set(search_names)) != len(search_names):
            raise ValueError(f"OOD set names must be unique, got {search_names}")
        shape = tuple(self.id_search.images.shape[1:])
        for part in (*self.ood_search, *self.ood_report):
            if part.group == "id":
                raise ValueError(
                    f"OOD set {part.name!r} has group 'id'; load it with group='near' or 'far'"
                )
        for part in (self.id_search, self.id_report, *self.ood_search, *self.ood_report):
            if len(part) == 0:
                raise ValueError(f"{part.name!r}: a search or report part is empty")
            if tuple(part.images.shape[1:]) != shape:
                raise ValueError(
                    f"{part.name!r} has images of shape {tuple(part.images.shape[1:])} but the "
                    f"in-distribution set has {shape}; load it with the same size and channels"
                )

    def ood_names(self) -> list[str]:
        return [s.name for s in self.ood_search]

    def pooled_ood_search(self, n: int | None = None) -> ImageSet:
        """The OOD search parts pooled into one unlabelled set named ``"ood_search"``.

        Balanced across sets: ``n`` is split as evenly as possible (the first ``n % k`` sets give
        one image more), each set's share is a :func:`take` cut of its search part, and the pool
        is shuffled by a fixed permutation. ``n=None`` takes as many from every set as the smallest
        search part holds. Its group is the sets' common group, ``"far"`` when they are mixed.
        """
        if not self.ood_search:
            raise ValueError("this benchmark has no OOD sets to pool")
        k, smallest = len(self.ood_search), min(len(s) for s in self.ood_search)
        n = k * smallest if n is None else n
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive number of images (or None), got {n!r}")
        shares = [n // k + (i < n % k) for i in range(k)]
        for part, share in zip(self.ood_search, shares, strict=True):
            if share > len(part):
                raise ValueError(
                    f"a balanced pool of {n} images needs {share} from {part.name!r}, whose search "
                    f"part has {len(part)}; ask for at most {k * smallest}"
                )
        parts = [
            take(part, share, purpose="pooled")
            for part, share in zip(self.ood_search, shares, strict=True)
        ]
        images = torch.cat([p.images for p in parts])  # (n, C, H, W)
        order = stable_permutation(n, "ood_search", *self.ood_names())
        groups = {p.group for p in parts}
        counts = ", ".join(f"{len(p)} {p.name}" for p in parts)
        return ImageSet(
            name="ood_search",
            images=images[order],
            group=groups.pop() if len(groups) == 1 else "far",
            description=f"OOD search parts pooled: {counts}",
            source="pooled",
        )

    def describe(self):
        """One row per set (ID first): name, group, n_search, n_report, description."""
        import pandas as pd

        rows = [(self.id_search, self.id_report)] + list(
            zip(self.ood_search, self.ood_report, strict=True)
        )
        return pd.DataFrame(
            [
                {
                    "name": search.name,
                    "group": search.group,
                    "n_search": len(search),
                    "n_report": len(report),
                    "description": search.description,
                }
                for search, report in rows
            ]
        )

    def fingerprint(self) -> str:
        """A hash of every image and label in every part: part of cache keys computed from it."""
        h = hashlib.sha256()
        for role, part in [("id_search", self.id_search), ("id_report", self.id_report)]:
            h.update(f"{role}:{part.fingerprint()};".encode())
        for search, report in zip(self.ood_search, self.ood_report, strict=True):
            h.update(f"ood:{search.fingerprint()}:{report.fingerprint()};".encode())
        return h.hexdigest()[:16]


def _check_size(value: int | None, what: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(
            f"{what} must be a positive number of images per part (or None for all), got {value!r}"
        )


def build_benchmark(
    id_search_pool: ImageSet,
    id_report_pool: ImageSet | None,
    ood_sets: Sequence[ImageSet],
    *,
    n_search: int | None = None,
    n_report: int | None = None,
    image_format: tuple[int, int] | None = None,
) -> Benchmark:
    """Cut the pools into a :class:`Benchmark`.

    Args:
        id_search_pool: labelled ID images to select heads on.
        id_report_pool: labelled ID images to report on, disjoint from ``id_search_pool``; None
            splits ``id_search_pool`` in two instead (for a single folder of ID images).
        ood_sets: the OOD sets, each split once into a search and a report half.
        n_search: at most this many images in each search part (ID and every OOD set); all
            when None.
        n_report: the same for each report part.
        image_format: (channels, size): bring every part to uint8 (N, channels, size, size)
            (:func:`resampled`) once it is cut, for pools of different formats; None keeps them.
    """
    _check_size(n_search, "n_search")
    _check_size(n_report, "n_report")
    if isinstance(ood_sets, ImageSet):
        ood_sets = [ood_sets]
    if id_report_pool is None:
        id_search_pool, id_report_pool = split_in_two(id_search_pool)
    elif id_report_pool.fingerprint() == id_search_pool.fingerprint():
        raise ValueError(
            f"the ID search and report pools are the same images ({id_search_pool.name!r}); pass "
            "disjoint pools (e.g. validation and test), or id_report_pool=None to split one in two"
        )
    names = [s.name for s in ood_sets]
    if len(set(names)) != len(names):
        raise ValueError(f"OOD set names must be unique, got {names}")
    halves = [split_in_two(s) for s in ood_sets]  # [(search, report), ...]

    def part(pool: ImageSet, n: int | None, purpose: str) -> ImageSet:
        cut = take(pool, n, purpose=purpose)
        return cut if image_format is None else resampled(cut, image_format[1], image_format[0])

    return Benchmark(
        id_search=part(id_search_pool, n_search, "search"),
        id_report=part(id_report_pool, n_report, "report"),
        ood_search=tuple(part(search, n_search, "search") for search, _ in halves),
        ood_report=tuple(part(report, n_report, "report") for _, report in halves),
    )


def default_benchmark(
    *,
    n_search: int | None = 512,
    n_report: int | None = None,
    ood: Sequence[str | ImageSet] | None = None,
) -> Benchmark:
    """The embedded default: Fashion-MNIST (validation to search, test to report) and OOD sets.

    Args:
        n_search: images per search part (ID and each OOD set); all when None.
        n_report: images per report part; all when None.
        ood: OOD sets by name (see :data:`hydra_core.data.ood.OOD_SETS`) or as ImageSets; all
            five default sets when None.
    """
    if ood is None:
        ood_sets = load_ood_sets()
    else:
        ood = [ood] if isinstance(ood, (str, ImageSet)) else ood
        ood_sets = [load_ood_set(s) if isinstance(s, str) else s for s in ood]
    return build_benchmark(
        load_fashion_mnist("validation"),
        load_fashion_mnist("test"),
        ood_sets,
        n_search=n_search,
        n_report=n_report,
    )


def parse_ood_folder(entry: str) -> tuple[str, str]:
    """``"far: /data/textures"`` -> ``("far", "/data/textures")``; a bare path is a far set."""
    group, sep, path = entry.partition(":")
    if sep and group.strip() in ("near", "far"):
        return group.strip(), path.strip()
    return "far", entry.strip()


def folder_benchmark(
    *,
    id_folder: str | None = None,
    ood: Sequence[str] = (),
    ood_folders: Sequence[str] = (),
    size: int = 28,
    channels: int = 1,
    n_search: int | None = 512,
    n_report: int | None = None,
    classes: Sequence[str] | None = None,
) -> Benchmark:
    """A benchmark mixing the embedded sets with image folders of your own.

    Args:
        id_folder: an ImageFolder layout (one sub-folder per class) for the in-distribution set,
            split once into disjoint search and report halves; None for Fashion-MNIST. Its classes
            are numbered in sorted order: they must be the model's output classes in that order.
        ood: default OOD sets by name (:data:`hydra_core.data.ood.OOD_SETS`).
        ood_folders: extra OOD folders, ``"near: path"``, ``"far: path"`` or a bare path (far).
            Flat folders of images or class folders (labels are ignored).
        size, channels: the image format every part is brought to when folders are involved
            (folder images are resized on their shorter side and centre-cropped, parts of the
            embedded sets resampled once cut); use the model's input size and channels, its
            preprocessing does the rest. Without folders the embedded sets stay as they are
            (28 x 28, one channel).
        classes: the model's classes in output order, to label the ID folder's class folders by
            name rather than by sorted position (see
            :func:`~hydra_core.data.generic.load_image_folder`).
    """
    from hydra_core.data.generic import load_image_folder

    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 (grayscale) or 3 (RGB), got {channels}")
    if not ood and not ood_folders:
        raise ValueError("choose at least one OOD set or OOD folder")
    if classes is not None and id_folder is None:
        raise InputError("a class order applies to an ID folder of your own, not to Fashion-MNIST")
    if id_folder is None and not ood_folders:
        return default_benchmark(n_search=n_search, n_report=n_report, ood=list(ood))
    grayscale = channels == 1
    sets = [load_ood_set(name) for name in ood]
    for entry in ood_folders:
        group, path = parse_ood_folder(entry)
        sets.append(load_image_folder(path, size=size, group=group, grayscale=grayscale))
    if id_folder is None:
        return build_benchmark(
            load_fashion_mnist("validation"),
            load_fashion_mnist("test"),
            sets,
            n_search=n_search,
            n_report=n_report,
            image_format=(channels, size),
        )
    id_pool = load_image_folder(
        id_folder, size=size, group="id", grayscale=grayscale, classes=classes
    )
    if len(id_pool) < 4:
        raise ValueError(
            f"the ID folder {id_folder} holds {len(id_pool)} images; a search and a report half "
            "need at least 2 each"
        )
    return build_benchmark(
        id_pool, None, sets, n_search=n_search, n_report=n_report, image_format=(channels, size)
    )


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
