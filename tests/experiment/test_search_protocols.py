"""Search protocols that do not lean on one OOD set: synthetic OOD made from the ID search items,
and leave one group out (far to near, near to far)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from hydra_core.data import synthetic
from hydra_core.data.benchmark import PROTOCOLS, build_benchmark
from hydra_core.data.images import ImageSet
from hydra_core.data.synthetic import (
    IMAGE_SYNTHETIC,
    TEXT_SYNTHETIC,
    synthetic_set,
    synthetic_sets,
)
from hydra_core.data.text import TextSet
from hydra_core.errors import InputError
from hydra_core.experiment.pipeline import search_repeat
from hydra_core.models.modality import IMAGE_MODALITY, TEXT_MODALITY


def image_set(name: str, n: int, seed: int, group: str = "id") -> ImageSet:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 1, 28, 28), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, 3, (n,), generator=g) if group == "id" else None
    return ImageSet(name, images, labels, group=group)


WORDS = "the film is a slow and tender look at grief , funny in places but never cruel".split()


def text_set(name: str, n: int, seed: int, group: str = "id") -> TextSet:
    g = torch.Generator().manual_seed(seed)
    texts = tuple(
        " ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (4 + k % 9,), generator=g))
        + f" {name}{k}"  # every text its own
        for k in range(n)
    )
    labels = torch.randint(0, 2, (n,), generator=g) if group == "id" else None
    return TextSet(name, texts, labels, group=group)


# --- the transforms ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", IMAGE_SYNTHETIC)
def test_image_sets_are_deterministic_and_made_of_their_source(name):
    source = image_set("id", 12, 0)
    a, b = synthetic_set(source, name, seed=3), synthetic_set(source, name, seed=3)
    assert torch.equal(a.images, b.images) and a.images.shape == source.images.shape
    assert not torch.equal(a.images, synthetic_set(source, name, seed=4).images)
    assert not torch.equal(a.images, source.images)
    assert a.labels is None and a.group in ("near", "far") and a.name == f"synthetic_{name}"
    if name != "strong_corruption":  # the same pixel values, elsewhere
        sorted_made = a.images.flatten(1).sort(dim=1).values
        assert torch.equal(sorted_made, source.images.flatten(1).sort(dim=1).values)


def test_patch_shuffle_moves_whole_patches():
    source = image_set("id", 3, 1)
    made = synthetic_set(source, "patch_shuffle").images
    patches = (
        lambda x: {  # noqa: E731
            x[0, r : r + 7, c : c + 7].numpy().tobytes()
            for r in range(0, 28, 7)
            for c in (0, 7, 14, 21)
        }
    )
    for i in range(3):
        assert patches(made[i]) == patches(source.images[i])


def test_text_sets_keep_words_and_lengths():
    source = text_set("id", 30, 0)
    shuffled, tokens, spans = synthetic_sets(source, TEXT_SYNTHETIC, seed=1)
    assert synthetic_sets(source, TEXT_SYNTHETIC, seed=1)[2].texts == spans.texts  # seeded
    vocabulary = {w for t in source.texts for w in t.split()}
    made = zip(source.texts, shuffled.texts, tokens.texts, spans.texts, strict=True)
    for original, s, r, p in made:
        n = len(original.split())
        assert Counter(s.split()) == Counter(original.split())
        assert len(r.split()) == n and set(r.split()) <= vocabulary
        assert len(p.split()) == n and set(p.split()) <= vocabulary
    assert sum(r != o for r, o in zip(tokens.texts, source.texts, strict=True)) > 20


def test_the_modality_names_its_synthetic_sets():
    assert IMAGE_MODALITY.synthetic_ood == IMAGE_SYNTHETIC
    assert TEXT_MODALITY.synthetic_ood == TEXT_SYNTHETIC
    with pytest.raises(InputError, match="unknown synthetic OOD set 'word_shuffle'"):
        synthetic_set(image_set("id", 2, 0), "word_shuffle")


# --- the protocols -------------------------------------------------------------------------------


def pools(make):
    return (
        make("id_val", 40, 0),
        make("id_test", 40, 1),
        [make("near_a", 30, 2, "near"), make("near_b", 30, 3, "near"), make("far_c", 30, 4, "far")],
        [make("far_s", 30, 5, "far")],
    )


@pytest.mark.parametrize("make", [image_set, text_set])
def test_synthetic_is_made_from_the_id_search_items_only(make, monkeypatch):
    id_val, id_test, report, search = pools(make)
    given = []
    real = synthetic.synthetic_sets

    def spy(source, names, **kwargs):
        given.append(source)
        return real(source, names, **kwargs)

    monkeypatch.setattr(synthetic, "synthetic_sets", spy)
    b = build_benchmark(id_val, id_test, report, protocol="synthetic", n_search=16, n_report=20)
    assert len(given) == 1 and given[0].fingerprint() == b.id_search.fingerprint()
    names = IMAGE_SYNTHETIC if make is image_set else TEXT_SYNTHETIC
    assert b.search_names() == [f"synthetic_{n}" for n in names]
    assert b.report_names() == ["near_a", "near_b", "far_c"]  # every report set reported
    for made in b.ood_search:
        assert 0 < len(made) <= len(b.id_search)
    if make is image_set:  # each permuted image holds the pixels of its ID search image
        made = b.ood_search[1].images.flatten(1).sort(dim=1).values
        assert torch.equal(made, b.id_search.images.flatten(1).sort(dim=1).values)
        reported = {x.numpy().tobytes() for x in b.id_report.images.flatten(1).sort(1).values}
        assert not reported & {x.numpy().tobytes() for x in made}
    with pytest.raises(InputError, match="under 'synthetic'"):
        build_benchmark(id_val, id_test, report, search_ood=search, protocol="synthetic")


def test_a_repeat_makes_the_synthetic_sets_again_from_its_own_id_items():
    id_val, id_test, report, _ = pools(image_set)
    b = build_benchmark(id_val, id_test, report, protocol="synthetic", n_search=16)
    again = search_repeat(b, id_val, [], 16, 1)
    assert again.search_names() == b.search_names()
    permuted = again.ood_search[1].images.flatten(1).sort(dim=1).values
    assert torch.equal(permuted, again.id_search.images.flatten(1).sort(dim=1).values)
    assert again.id_search.fingerprint() != b.id_search.fingerprint()


@pytest.mark.parametrize("make", [image_set, text_set])
def test_leave_one_group_out(make):
    id_val, id_test, report, search = pools(make)
    far = build_benchmark(id_val, id_test, report, search_ood=search, protocol="far-to-near")
    assert far.search_names() == ["far_s", "far_c"] and far.report_names() == ["near_a", "near_b"]
    near = build_benchmark(id_val, id_test, report, search_ood=search, protocol="near-to-far")
    assert near.search_names() == ["near_a", "near_b"] and near.report_names() == ["far_c"]
    for b in (far, near):  # nothing reported was searched on
        assert not set(b.search_names()) & set(b.report_names())
        assert {s.group for s in b.ood_search} != {s.group for s in b.ood_report}
    with pytest.raises(InputError, match="needs a far set"):
        build_benchmark(id_val, id_test, report[:2], search_ood=[], protocol="far-to-near")


def test_every_protocol_is_listed():
    assert PROTOCOLS == ("dedicated", "halves", "synthetic", "far-to-near", "near-to-far")
