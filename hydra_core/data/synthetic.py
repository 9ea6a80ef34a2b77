"""Synthetic OOD sets made from the ID search items, so that a search needs no outside OOD set
(protocol ``"synthetic"``, :mod:`hydra_core.data.benchmark`).

Every transform keeps what a shortcut could key on (an image's pixel values, a text's length and
words) and destroys what a classifier of the ID task relies on (shapes, word order, sentences):

Images (uint8, (N, C, H, W)):

- ``patch_shuffle``: the image cut into a 4 x 4 grid of patches, the patches put back in a random
  order (every pixel value kept, local shapes kept, the object gone);
- ``pixel_permutation``: every pixel of the image moved to a random place (the pixel histogram
  kept, all structure gone);
- ``strong_corruption``: one of the severity-5 corruptions of :mod:`hydra_core.data.corruptions`
  per image (noise, blur, contrast, pixelation, ...), drawn at random.

Texts:

- ``word_shuffle``: the words of the sentence in a random order (the same words, the same length);
- ``random_tokens``: half of the words replaced by words drawn from the ID search texts'
  vocabulary (the same length, the same word frequencies, no meaning);
- ``truncated_span``: a span of the concatenated ID search texts as long (in words) as the sentence,
  starting at a random word: it begins and ends mid-sentence, length-matched to its source.

Made from the ID *search* items only (:meth:`~hydra_core.data.benchmark.Benchmark` builds them
from its ``id_search`` part, never from a report part), deterministic given the items and the
seed: the same items and seed always give the same sets, bit for bit.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from hydra_core.data.corruptions import IMAGE_CORRUPTIONS, corrupt_images
from hydra_core.data.images import DataSet, ImageSet, stable_seed
from hydra_core.data.text import TextSet, text_key
from hydra_core.errors import InputError

#: the synthetic OOD sets of each kind of item (the modality declares which it uses)
IMAGE_SYNTHETIC = ("patch_shuffle", "pixel_permutation", "strong_corruption")
TEXT_SYNTHETIC = ("word_shuffle", "random_tokens", "truncated_span")
GRID = 4  # patches per image side of patch_shuffle
REPLACED_SHARE = 0.5  # share of words random_tokens replaces


@dataclass(frozen=True)
class _Transform:
    group: str  # "near" or "far": only a label (a search set is never reported)
    description: str


_TRANSFORMS = {
    "patch_shuffle": _Transform("near", f"ID search images, {GRID} x {GRID} patches shuffled"),
    "pixel_permutation": _Transform("far", "ID search images, every pixel permuted"),
    "strong_corruption": _Transform(
        "far", "ID search images, each under one severity-5 corruption"
    ),
    "word_shuffle": _Transform("near", "ID search sentences, words shuffled"),
    "random_tokens": _Transform(
        "near", f"ID search sentences, {REPLACED_SHARE:.0%} of words replaced by random ID words"
    ),
    "truncated_span": _Transform(
        "near", "spans of the ID search sentences cut mid-sentence, as long as each sentence"
    ),
}


def _generator(name: str, seed: int, source: DataSet) -> torch.Generator:
    return torch.Generator().manual_seed(stable_seed("synthetic", name, seed, source.fingerprint()))


def _patch_shuffle(images: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    n, c, h, w = images.shape
    ph, pw = h // GRID, w // GRID
    if ph == 0 or pw == 0:
        raise InputError(f"patch_shuffle needs images of at least {GRID} x {GRID} pixels")
    out = images.clone()
    core = images[:, :, : ph * GRID, : pw * GRID]  # a ragged border is left in place
    patches = core.reshape(n, c, GRID, ph, GRID, pw).permute(0, 2, 4, 1, 3, 5)
    patches = patches.reshape(n, GRID * GRID, c, ph, pw)
    order = torch.argsort(torch.rand(n, GRID * GRID, generator=g), dim=1)
    shuffled = patches[torch.arange(n)[:, None], order]  # (n, GRID * GRID, c, ph, pw)
    shuffled = shuffled.reshape(n, GRID, GRID, c, ph, pw).permute(0, 3, 1, 4, 2, 5)
    out[:, :, : ph * GRID, : pw * GRID] = shuffled.reshape(n, c, ph * GRID, pw * GRID)
    return out


def _pixel_permutation(images: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    n, c, h, w = images.shape
    order = torch.argsort(torch.rand(n, h * w, generator=g), dim=1)  # one permutation per image
    flat = images.reshape(n, c, h * w)
    return flat.gather(2, order[:, None, :].expand(n, c, h * w)).reshape(n, c, h, w)


def _strong_corruption(images: torch.Tensor, g: torch.Generator, seed: int) -> torch.Tensor:
    which = torch.randint(len(IMAGE_CORRUPTIONS), (len(images),), generator=g)
    out = images.clone()
    for k, name in enumerate(IMAGE_CORRUPTIONS):
        rows = (which == k).nonzero().flatten()
        if len(rows):
            out[rows] = corrupt_images(images[rows], name, 5, seed=seed)
    return out


def _word_shuffle(texts: tuple[str, ...], rng: random.Random) -> tuple[str, ...]:
    out = []
    for text in texts:
        words = text.split()
        rng.shuffle(words)
        out.append(" ".join(words))
    return tuple(out)


def _random_tokens(texts: tuple[str, ...], rng: random.Random) -> tuple[str, ...]:
    vocabulary = [word for text in texts for word in text.split()]
    out = []
    for text in texts:
        words = [
            rng.choice(vocabulary) if rng.random() < REPLACED_SHARE else word
            for word in text.split()
        ]
        out.append(" ".join(words))
    return tuple(out)


def _truncated_span(texts: tuple[str, ...], rng: random.Random) -> tuple[str, ...]:
    stream = [word for text in texts for word in text.split()]
    out = []
    for text in texts:
        length = max(1, min(len(text.split()), len(stream)))
        start = rng.randrange(len(stream) - length + 1)
        out.append(" ".join(stream[start : start + length]))
    return tuple(out)


def synthetic_set(source: DataSet, name: str, *, seed: int = 0) -> DataSet:
    """The synthetic OOD set ``name`` made from every item of ``source`` (the ID search part),
    unlabelled, as many items as ``source``; the same source and seed give the same set."""
    known = IMAGE_SYNTHETIC if isinstance(source, ImageSet) else TEXT_SYNTHETIC
    if name not in known:
        raise InputError(
            f"unknown synthetic OOD set {name!r} for {source.name!r}; choose from "
            f"{', '.join(known)}"
        )
    transform = _TRANSFORMS[name]
    set_name = f"synthetic_{name}"
    description = f"{transform.description} (seed {seed})"
    if isinstance(source, ImageSet):
        g = _generator(name, seed, source)
        if name == "patch_shuffle":
            images = _patch_shuffle(source.images, g)
        elif name == "pixel_permutation":
            images = _pixel_permutation(source.images, g)
        else:
            images = _strong_corruption(source.images, g, seed)
        return ImageSet(
            set_name, images, group=transform.group, description=description, source="synthetic"
        )
    rng = random.Random(stable_seed("synthetic", name, seed, source.fingerprint()))
    make = {
        "word_shuffle": _word_shuffle,
        "random_tokens": _random_tokens,
        "truncated_span": _truncated_span,
    }[name]
    return TextSet(
        set_name,
        make(source.texts, rng),
        group=transform.group,
        description=description,
        source="synthetic",
    )


def synthetic_sets(source: DataSet, names: tuple[str, ...], *, seed: int = 0) -> tuple:
    """:func:`synthetic_set` for every name, in order."""
    if not names:
        raise InputError("the synthetic protocol needs at least one synthetic OOD set")
    return tuple(synthetic_set(source, name, seed=seed) for name in names)


def synthetic_search(
    id_search: DataSet, reported: list, names: tuple[str, ...] | None, *, seed: int = 0
) -> list[DataSet]:
    """The search sets of protocol ``"synthetic"``: ``names`` (None: every one of the items' kind)
    made from ``id_search``, the ID search part and nothing else. A made-up text that is also an
    ID search text or a ``reported`` one (up to case and punctuation) is left out, so no text
    has two roles."""
    texts = isinstance(id_search, TextSet)
    names = tuple(names or (TEXT_SYNTHETIC if texts else IMAGE_SYNTHETIC))
    made = list(synthetic_sets(id_search, names, seed=seed))
    if not texts:
        return made
    known = {text_key(t) or t for other in (id_search, *reported) for t in other.texts}
    kept = []
    for s in made:
        keep = [i for i, t in enumerate(s.texts) if (text_key(t) or t) not in known]
        kept.append(s if len(keep) == len(s) else s.subset(torch.tensor(keep, dtype=torch.long)))
    return kept


def remade(made: tuple, source: DataSet, reported: list, *, seed: int) -> tuple:
    """The synthetic sets ``made`` (as :func:`synthetic_sets` named them) made again from
    ``source`` with ``seed``, as :func:`synthetic_search` makes them: another search
    subsample's."""
    names = tuple(s.name.removeprefix("synthetic_") for s in made)
    return tuple(synthetic_search(source, reported, names, seed=seed))
