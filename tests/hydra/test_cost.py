"""Cost accounting: formulas against torch's FlopCounterMode and against hand counts."""

from __future__ import annotations

import pytest
import torch

from hydra_core.hydra import fuse_members
from hydra_core.hydra.cost import (
    VitShape,
    cost_table,
    count_macs,
    count_params,
    formula_macs,
    formula_params,
    measure_latency,
)
from hydra_core.models.adapter import prune_heads
from tests.conftest import make_tiny_vit, random_mask

D, DK, HIDDEN, CLASSES, DEPTH = 24, 6, 48, 5, 3  # the tiny ViT of tests/conftest.py
IMAGE = torch.zeros(1, 1, 16, 16)


def equal_count_masks(heads: int = 3) -> list[torch.Tensor]:
    """Three different masks keeping ``heads`` of 4 heads in every layer."""
    masks = []
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        keep = torch.zeros(DEPTH, 4, dtype=torch.bool)
        for layer in range(DEPTH):
            keep[layer, torch.randperm(4, generator=g)[:heads]] = True
        masks.append(keep)
    return masks


def test_param_count_of_tiny_vit_by_hand():
    model = make_tiny_vit()
    stem = 16 * D + D + D + 17 * D  # patch conv (4x4x1 -> d) with bias, class token, positions
    attention = (3 * D * D + 3 * D) + (D * D + D)  # Q/K/V and W_O with biases
    mlp = (HIDDEN * D + HIDDEN) + (D * HIDDEN + D)
    block = 2 * D + attention + 2 * D + mlp  # two LayerNorms
    head = 2 * D + CLASSES * D + CLASSES  # final norm, classifier
    assert count_params(model) == stem + DEPTH * block + head


def test_param_count_of_zero_shot_hydra_by_hand():
    model = make_tiny_vit()
    hydra = fuse_members([(model, k) for k in equal_count_masks(heads=3)])
    a = 3 * DK  # kept channels per member
    stem = 16 * D + D + D + 17 * D  # one shared stem
    attention = 3 * (D * 3 * a + 3 * a) + 3 * (a * D + D)  # per-member Q/K/V and W_O, with biases
    mlp = (HIDDEN * D + HIDDEN) + (D * HIDDEN + D)
    block = 2 * D + attention + 2 * D + mlp  # shared norms, one MLP
    head = 2 * D + CLASSES * D + CLASSES
    assert count_params(hydra) == stem + DEPTH * block + head


def test_paper_parameter_formula():
    vit_b16 = dict(embed_dim=768, num_tokens=197, num_patches=196, patch_dim=768, num_classes=1000)
    shape = VitShape(**vit_b16, head_dim=64, mlp_hidden=4 * 768, token_pool=True)
    d2 = 768**2
    assert formula_params(shape, [[12]], merged_mlp=False) == 12 * d2
    assert formula_params(shape, [[8]] * 3, merged_mlp=True) == 4 * 3 * 8 * d2 // 12 + 8 * d2
    assert formula_params(shape, [[12]] * 3, merged_mlp=False) == 12 * 3 * d2


def test_paper_parameter_formula_matches_the_fused_weights():
    model = make_tiny_vit()
    hydra = fuse_members([(model, k) for k in equal_count_masks(heads=2)])
    matrices = ("qkv.weight", "proj.weight", "fc1_weight", "fc2_weight")
    weights = sum(
        p.numel()
        for name, p in hydra.named_parameters()
        if name.startswith("blocks.") and name.endswith(matrices)
    )
    heads = [k.sum(1).tolist() for k in equal_count_masks(heads=2)]
    assert weights == formula_params(VitShape.of(model), heads, merged_mlp=True)


@pytest.mark.parametrize("unequal", [False, True])
def test_formula_macs_equal_counted_macs(tiny_vit, unequal):
    """Exact agreement: both leave out the same elementwise work (biases, norms, GELU, softmax)."""
    shape = VitShape.of(tiny_vit)
    full = [[4] * DEPTH]
    assert count_macs(tiny_vit, IMAGE) == formula_macs(shape, full)
    masks = [random_mask((DEPTH, 4), s) for s in range(3)] if unequal else equal_count_masks()
    heads = [k.sum(1).tolist() for k in masks]
    members = [prune_heads(tiny_vit, k) for k in masks]
    assert sum(count_macs(m, IMAGE) for m in members) == formula_macs(shape, heads)
    assert 3 * count_macs(tiny_vit, IMAGE) == formula_macs(shape, full * 3)  # Deep Ensembles
    hydra = fuse_members([(tiny_vit, k) for k in masks])
    assert count_macs(hydra, IMAGE) == formula_macs(shape, heads, fused=True)


def test_formula_macs_with_shared_layers_and_per_member_stem():
    model = make_tiny_vit()
    shape = VitShape.of(model)
    masks = equal_count_masks()
    for keep in masks[1:]:
        keep[0] = masks[0][0]
    hydra = fuse_members([(model, k) for k in masks])
    heads = [k.sum(1).tolist() for k in masks]
    assert hydra.num_shared_layers == 1
    assert count_macs(hydra, IMAGE) == formula_macs(shape, heads, fused=True, shared_layers=1)
    assert count_macs(hydra, IMAGE) < formula_macs(shape, heads)  # less than members one by one
    fine_tuned = [make_tiny_vit(seed=s) for s in range(3)]
    hydra = fuse_members(list(zip(fine_tuned, masks, strict=True)))
    assert count_macs(hydra, IMAGE) == formula_macs(shape, heads, fused=True, shared_stem=False)


def test_counted_macs_scale_with_batch():
    model = make_tiny_vit()
    assert count_macs(model, torch.zeros(4, 1, 16, 16)) == 4 * count_macs(model, IMAGE)


def test_measure_latency_calls_and_summarises():
    calls = []
    result = measure_latency(lambda: calls.append(1), warmup=2, repeats=5)
    assert len(calls) == 7
    assert set(result) == {"median_ms", "iqr_ms", "min_ms", "repeats"}
    assert 0 <= result["min_ms"] <= result["median_ms"] and result["iqr_ms"] >= 0
    with pytest.raises(ValueError, match="repeats"):
        measure_latency(lambda: None, repeats=0)


def test_cost_table():
    model = make_tiny_vit()
    masks = equal_count_masks()
    members = [prune_heads(model, k) for k in masks]
    hydra = fuse_members([(model, k) for k in masks])
    deep = [make_tiny_vit(seed=s) for s in range(3)]
    images = torch.zeros(2, 1, 16, 16)
    systems = {
        "single": [model],
        **{f"member {i}": [m] for i, m in enumerate(members)},
        "members one by one": members,
        "Deep Ensembles": deep,
        "Hydra fused": [hydra],
    }
    table = cost_table(systems, images, warmup=1, repeats=3)
    assert list(table.index) == list(systems) and table.index.name == "system"
    assert table.loc["single", "params_ratio"] == table.loc["single", "latency_ratio"] == 1
    assert table.loc["members one by one", "params"] == sum(count_params(m) for m in members)
    assert table.loc["single", "macs"] == 2 * count_macs(model, IMAGE)  # the batch of 2
    assert table.loc["Deep Ensembles", "macs"] == 3 * table.loc["single", "macs"]
    assert table.loc["Hydra fused", "macs"] == 2 * count_macs(hydra, IMAGE)
    assert table.loc["member 1", "macs"] == 2 * count_macs(members[1], IMAGE)
    assert (table["latency_ms"] > 0).all() and (table["latency_iqr_ms"] >= 0).all()
    quick = cost_table({"Hydra fused": [hydra], "single": [model]}, images, latency=False)
    assert list(quick.columns) == ["params", "macs", "params_ratio", "macs_ratio"]
    assert quick.loc["Hydra fused", "macs_ratio"] == table.loc["Hydra fused", "macs_ratio"]
    two = cost_table(
        {"single": [model]}, images, precisions={"a": None, "b": torch.bfloat16}, repeats=1
    )
    assert {"a_ms", "a_iqr_ms", "a_ratio", "b_ms", "b_iqr_ms", "b_ratio"} <= set(two.columns)
    without_single = cost_table({"Hydra fused": [hydra]}, images, latency=False)
    assert list(without_single.columns) == ["params", "macs"]


def test_parameter_breakdown_counts_every_parameter_once():
    from hydra_core.hydra.cost import parameter_breakdown
    from hydra_core.hydra.fused import fuse_members
    from tests.conftest import make_tiny_vit, random_mask

    model = make_tiny_vit()  # d = 24, 3 layers, MLP ratio 2
    parts = parameter_breakdown(model)
    assert sum(parts.values()) == sum(p.numel() for p in model.parameters())
    d, depth = 24, 3
    assert parts["attention weights"] == depth * 4 * d * d  # Q, K, V and the output projection
    assert parts["MLP weights"] == depth * 2 * d * (2 * d)
    assert parts["classifier"] == 5 * d + 5
    hydra = fuse_members([(model, random_mask((3, 4), seed)) for seed in (1, 2)])
    assert sum(parameter_breakdown(hydra).values()) == sum(p.numel() for p in hydra.parameters())
