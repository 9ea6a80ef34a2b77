"""Head ablation and structural pruning compared against the plain computations they replace."""

from __future__ import annotations

import copy

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
    attention_projection,
    block_heads,
    block_rest,
    classify,
    embed,
    head_label,
    head_layout,
    parse_head_label,
    prune_heads,
    record_head_outputs,
)
from tests.conftest import make_tiny_vit, random_mask


def state_snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_same_state(model: torch.nn.Module, snapshot: dict[str, torch.Tensor]) -> None:
    state = model.state_dict()
    assert state.keys() == snapshot.keys()
    for k, v in state.items():
        assert torch.equal(v, snapshot[k]), k


def count_hooks(model: torch.nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def zero_wo_columns(model: torch.nn.Module, keep: torch.Tensor) -> torch.nn.Module:
    """The paper's definition of ablation: zero each removed head's column block of W_O."""
    ref = copy.deepcopy(model)
    dk = head_layout(model).head_dim
    with torch.no_grad():
        for layer, block in enumerate(ref.blocks):
            for head in (~keep[layer]).nonzero().flatten().tolist():
                block.attn.proj.weight[:, head * dk : (head + 1) * dk] = 0
    return ref


def test_layout_of_tiny_vit(tiny_vit):
    layout = head_layout(tiny_vit)
    assert layout.num_heads == (4, 4, 4)
    assert (layout.head_dim, layout.embed_dim, layout.shape) == (6, 24, (3, 4))


def test_all_kept_mask_is_bit_identical(tiny_vit, images):
    expected = tiny_vit(images)
    with ablate(tiny_vit, torch.ones(3, 4, dtype=torch.bool)):
        got = tiny_vit(images)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ablation_equals_zeroed_wo_columns(tiny_vit, images, seed):
    keep = random_mask((3, 4), seed)
    expected = zero_wo_columns(tiny_vit, keep)(images)
    with ablate(tiny_vit, keep):
        got = tiny_vit(images)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert not torch.allclose(got, tiny_vit(images)), "the mask should change the logits"


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_pruned_equals_ablated(tiny_vit, images, seed):
    keep = random_mask((3, 4), seed)
    keep[1] = False  # one layer keeps no head at all
    with ablate(tiny_vit, keep):
        expected = tiny_vit(images)
    pruned = prune_heads(tiny_vit, keep)
    torch.testing.assert_close(pruned(images), expected, rtol=0, atol=1e-5)
    assert head_layout(pruned).num_heads == tuple(int(n) for n in keep.sum(1))


def test_prune_leaves_source_untouched(tiny_vit, images):
    snapshot = state_snapshot(tiny_vit)
    before = tiny_vit(images)
    prune_heads(tiny_vit, random_mask((3, 4), 5))
    assert_same_state(tiny_vit, snapshot)
    assert torch.equal(tiny_vit(images), before)


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


def test_pruned_model_can_be_ablated_and_pruned_again(images):
    model = make_tiny_vit()
    first = random_mask((3, 4), 7, p_keep=0.75)
    first[:, 0] = True
    pruned = prune_heads(model, first)
    layout = head_layout(pruned)
    second = layout.all_kept()
    second[:, 0] = False  # drop the first remaining head of every layer
    with ablate(pruned, second):
        expected = pruned(images)
    torch.testing.assert_close(prune_heads(pruned, second)(images), expected, rtol=0, atol=1e-5)


def test_exception_inside_ablate_restores_model(tiny_vit, images):
    snapshot = state_snapshot(tiny_vit)
    before = tiny_vit(images)
    with pytest.raises(RuntimeError, match="boom"):
        with ablate(tiny_vit, random_mask((3, 4), 0)):
            tiny_vit(images)
            raise RuntimeError("boom")
    assert count_hooks(tiny_vit) == 0
    assert_same_state(tiny_vit, snapshot)
    assert torch.equal(tiny_vit(images), before)


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


def test_functional_pieces_rebuild_the_forward(tiny_vit, images):
    x = embed(tiny_vit, images)
    for block in tiny_vit.blocks:
        z = block_heads(block, x)
        x = block_rest(block, x, attention_projection(block, z))
    torch.testing.assert_close(classify(tiny_vit, x), tiny_vit(images), rtol=0, atol=1e-5)


def test_recorded_head_outputs_match_block_heads(images):
    model = make_tiny_vit()
    with record_head_outputs(model, [1], token=None) as store:
        model(images)
    x = embed(model, images)
    x = block_rest(
        model.blocks[0], x, attention_projection(model.blocks[0], block_heads(model.blocks[0], x))
    )
    torch.testing.assert_close(store[1][0], block_heads(model.blocks[1], x), rtol=0, atol=1e-5)
    cls_only = block_heads(model.blocks[1], x, queries=slice(0, 1))
    torch.testing.assert_close(cls_only[:, 0], store[1][0][:, 0], rtol=0, atol=1e-5)


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
