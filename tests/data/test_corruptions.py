"""Corruptions of images and texts (hydra_core.data.corruptions): shape, range, determinism, a
distance to the clean items that grows with the severity, and the plain computations (torchvision's
Gaussian blur, PIL's JPEG) they must equal."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from hydra_core.data.corruptions import (
    IMAGE_CORRUPTIONS,
    IMAGE_LEVELS,
    SEVERITIES,
    TEXT_CORRUPTIONS,
    check_corruptions,
    corrupt_images,
    corrupt_set,
    corrupt_texts,
)
from hydra_core.data.images import ImageSet
from hydra_core.data.text import TextSet
from hydra_core.errors import InputError


def smooth_images(n: int = 12, size: int = 28, seed: int = 0) -> torch.Tensor:
    """Grayscale images with structure (smoothed noise over the full 0..255 range), uint8."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, size // 4, size // 4, generator=g)
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = (x - x.amin(dim=(2, 3), keepdim=True)) / x.amax(dim=(2, 3), keepdim=True).clamp_min(1e-6)
    return (x * 200 + 20).round().clamp(0, 255).to(torch.uint8)


SENTENCES = tuple(
    f"the film {w} a quietly moving portrait of a family that never quite finds its voice"
    for w in ("is", "was", "remains", "becomes", "seems", "stays", "feels", "looks")
)


def edit_distance(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


@pytest.mark.parametrize("name", IMAGE_CORRUPTIONS)
def test_image_corruptions_keep_shape_and_range_and_are_deterministic(name):
    images = smooth_images()
    for severity in SEVERITIES:
        out = corrupt_images(images, name, severity, seed=3)
        assert out.dtype == torch.uint8 and out.shape == images.shape
        assert torch.equal(out, corrupt_images(images, name, severity, seed=3))
    assert not torch.equal(corrupt_images(images, name, 5), images)


@pytest.mark.parametrize("name", IMAGE_CORRUPTIONS)
def test_image_corruptions_grow_with_the_severity(name):
    images = smooth_images()
    distances = [
        (corrupt_images(images, name, s).float() - images.float()).abs().mean().item()
        for s in SEVERITIES
    ]
    assert all(a < b for a, b in zip(distances, distances[1:], strict=False)), distances


@pytest.mark.parametrize("name", ["gaussian_noise", "shot_noise", "impulse_noise"])
def test_noise_depends_on_the_seed_only(name):
    images = smooth_images()
    assert not torch.equal(
        corrupt_images(images, name, 3, seed=0), corrupt_images(images, name, 3, seed=1)
    )


def test_gaussian_blur_equals_torchvisions():
    from torchvision.transforms.functional import gaussian_blur

    images = smooth_images()
    for severity, sigma in zip(SEVERITIES, IMAGE_LEVELS["gaussian_blur"], strict=True):
        radius = max(1, int(3 * sigma + 0.5))
        expected = gaussian_blur(images.float() / 255, [2 * radius + 1] * 2, [sigma, sigma])
        expected = (expected.clamp(0, 1) * 255).round().to(torch.uint8)
        found = corrupt_images(images, "gaussian_blur", severity)
        assert (found.int() - expected.int()).abs().max() <= 1  # float rounding at .5


def test_jpeg_equals_pil_and_contrast_and_brightness_their_formulas():
    images = smooth_images(n=3)
    found = corrupt_images(images, "jpeg", 2)
    for image, out in zip(images, found, strict=True):
        buffer = io.BytesIO()
        Image.fromarray(image[0].numpy(), mode="L").save(buffer, format="JPEG", quality=18)
        assert np.array_equal(np.asarray(Image.open(buffer)), out[0].numpy())
    x = images.double() / 255
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    expected = (((x - mean) * 0.2 + mean).clamp(0, 1) * 255).round()
    assert (corrupt_images(images, "contrast", 3).double() - expected).abs().max() <= 1
    expected = ((x + 0.4).clamp(0, 1) * 255).round()
    assert (corrupt_images(images, "brightness", 4).double() - expected).abs().max() <= 1


def test_pixelate_is_constant_on_blocks():
    images = smooth_images(n=2)
    out = corrupt_images(images, "pixelate", 5)  # blocks of 7x7: 4 x 4 of them
    blocks = out.view(2, 1, 4, 7, 4, 7)
    assert (blocks == blocks[:, :, :, :1, :, :1]).all()
    means = images.double().view(2, 1, 4, 7, 4, 7).mean(dim=(3, 5)).round()
    assert (blocks[:, :, :, 0, :, 0].double() - means).abs().max() <= 1


@pytest.mark.parametrize("name", TEXT_CORRUPTIONS)
def test_text_corruptions_are_deterministic_and_grow_with_the_severity(name):
    distances = []
    for severity in SEVERITIES:
        out = corrupt_texts(SENTENCES, name, severity, seed=2)
        assert out == corrupt_texts(SENTENCES, name, severity, seed=2)
        assert len(out) == len(SENTENCES) and all(t.strip() for t in out)
        distances.append(sum(edit_distance(a, b) for a, b in zip(SENTENCES, out, strict=True)))
    assert all(a < b for a, b in zip(distances, distances[1:], strict=False)), distances


def test_word_swap_keeps_the_words_and_dropout_drops_only():
    for t, out in zip(SENTENCES, corrupt_texts(SENTENCES, "word_swap", 5), strict=True):
        assert sorted(t.split()) == sorted(out.split())
    for t, out in zip(SENTENCES, corrupt_texts(SENTENCES, "word_dropout", 5), strict=True):
        words = iter(t.split())
        assert all(w in words for w in out.split())  # a subsequence of the words, in order
    assert corrupt_texts(("one",), "word_dropout", 5) == ("one",)  # never an empty text


def test_corrupt_set_keeps_labels_and_names_the_corruption():
    images = ImageSet("fmnist", smooth_images(n=4), torch.arange(4), classes=tuple("abcd"))
    out = corrupt_set(images, "contrast", 2)
    assert out.name == "fmnist-contrast-2" and torch.equal(out.labels, images.labels)
    assert out.fingerprint() != images.fingerprint()
    texts = TextSet("rt", SENTENCES[:3], torch.tensor([0, 1, 0]))
    out = corrupt_set(texts, "typos", 4)
    assert out.name == "rt-typos-4" and torch.equal(out.labels, texts.labels)
    assert out.texts == corrupt_texts(SENTENCES[:3], "typos", 4)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: corrupt_images(smooth_images(n=1), "fog", 1), "unknown corruption 'fog'"),
        (lambda: corrupt_images(smooth_images(n=1), "contrast", 6), "severity must be one of 1..5"),
        (lambda: corrupt_images(smooth_images(n=1).float(), "contrast", 1), "uint8 images"),
        (lambda: corrupt_texts(SENTENCES, "blur", 1), "unknown corruption 'blur'"),
        (
            lambda: check_corruptions(["typos"], ImageSet("x", smooth_images(n=1))),
            "unknown corruption 'typos' for images; choose from gaussian_noise",
        ),
    ],
)
def test_bad_corruptions_are_refused(call, message):
    with pytest.raises(InputError, match=message):
        call()
