"""Head ablation and structural pruning of timm ViTs: what only ViTs have (masks, labels, the
refusals, the attention kernel). What every family holds is in test_family_contract.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from hydra_core.models.adapter import (
    SHORT_SEQUENCE,
    UnsupportedModelError,
    ablate,
    as_keep_mask,
    attention,
    head_label,
    head_layout,
    parse_head_label,
    prune_heads,
    record_head_outputs,
)
from tests.conftest import make_tiny_vit, random_mask


def count_hooks(model: torch.nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def test_pruned_parameter_count():
    model = make_tiny_vit()
    keep = torch.ones(3, 4, dtype=torch.bool)
    keep[0, :2] = False
    pruned = prune_heads(model, keep)
    removed = sum(p.numel() for p in model.parameters()) - sum(
        p.numel() for p in pruned.parameters()
    )
    d, dk = 24, 6
    assert removed == 2 * (3 * dk * d + 3 * dk + d * dk)  # q, k, v rows with bias, W_O columns


def test_no_hook_survives_the_context(tiny_vit, images):
    with ablate(tiny_vit, random_mask((3, 4), 0)):
        assert count_hooks(tiny_vit) > 0
        with record_head_outputs(tiny_vit, [0, 2]):
            tiny_vit(images)
    assert count_hooks(tiny_vit) == 0


def test_nested_ablations_compose(tiny_vit, images):
    a, b = random_mask((3, 4), 1), random_mask((3, 4), 2)
    with ablate(tiny_vit, a & b):
        expected = tiny_vit(images)
    with ablate(tiny_vit, a), ablate(tiny_vit, b):
        got = tiny_vit(images)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "keep, error, match",
    [
        (torch.ones(3, 4, dtype=torch.float32), TypeError, "dtype bool"),
        (torch.ones(4, 3, dtype=torch.bool), ValueError, r"expected shape \(3, 4\)"),
        (torch.ones(3, dtype=torch.bool), ValueError, "expected shape"),
        ([[True] * 4] * 3, TypeError, "bool tensor"),
    ],
)
def test_bad_masks_are_refused(tiny_vit, images, keep, error, match):
    with pytest.raises(error, match=match):
        with ablate(tiny_vit, keep):
            pass
    with pytest.raises(error, match=match):
        prune_heads(tiny_vit, keep)
    assert count_hooks(tiny_vit) == 0


def test_numpy_masks_are_accepted(tiny_vit):
    keep = np.ones((3, 4), dtype=bool)
    assert as_keep_mask(tiny_vit, keep).dtype == torch.bool


def test_mask_naming_missing_heads_of_pruned_model():
    model = make_tiny_vit()
    keep = torch.ones(3, 4, dtype=torch.bool)
    keep[2, 3] = False
    pruned = prune_heads(model, keep)
    bad = torch.ones(3, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="keeps L2H3, but layer 2 has only 3 heads"):
        as_keep_mask(pruned, bad)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(scale_attn_norm=True), "scale_norm"),
        (dict(class_token=True, global_pool="token"), None),
    ],
)
def test_models_with_norm_between_heads_and_proj_are_refused(overrides, match):
    if match is None:
        head_layout(make_tiny_vit(**overrides))
        return
    with pytest.raises(UnsupportedModelError, match=match):
        head_layout(make_tiny_vit(**overrides))


def test_non_transformer_is_refused():
    with pytest.raises(UnsupportedModelError, match="no `blocks`"):
        head_layout(torch.nn.Linear(3, 3))


def test_head_labels_round_trip():
    assert head_label(3, 7) == "L3H7"
    assert parse_head_label("l3h7") == (3, 7)
    with pytest.raises(ValueError, match="L<layer>H<head>"):
        parse_head_label("layer3")


def test_default_shape_vit_base_layout():
    model = VisionTransformer(
        img_size=32, patch_size=16, embed_dim=64, depth=2, num_heads=8, num_classes=3
    )
    assert head_layout(model).shape == (2, 8)


@pytest.mark.parametrize("keys", [1, 17, SHORT_SEQUENCE, SHORT_SEQUENCE + 1, 197])
@pytest.mark.parametrize("queries", [1, 17])
def test_attention_equals_scaled_dot_product_attention(keys, queries):
    g = torch.Generator().manual_seed(keys)
    q = torch.randn(3, 4, queries, 16, generator=g)
    k, v = torch.randn(2, 3, 4, keys, 16, generator=g)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    reference = (q @ k.transpose(-2, -1) / 4.0).softmax(-1) @ v  # d_k = 16: scale 1/4
    torch.testing.assert_close(attention(q, k, v), expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(attention(q, k, v), reference, atol=1e-6, rtol=1e-5)
