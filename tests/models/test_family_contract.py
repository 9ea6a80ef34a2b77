"""The model-family contract, for every family (``family`` fixture: each tiny ViT configuration,
text kind and OpenCLIP tower configuration): head ablation equals the copy with W_O's columns
zeroed, structural pruning equals ablation, and the family's pieces (embed, per-head outputs,
W_O, the rest of the block, the classifier) rebuild the model's own forward (fp32, 1e-5).

Checks that hold for one family only stay in its file: test_adapter.py (ViTs),
test_text_family.py, test_openclip_family.py (zero-shot classifiers, nn.MultiheadAttention)."""

from __future__ import annotations

import pytest
import torch

from hydra_core.hydra.cost import count_params
from hydra_core.models.adapter import (
    ablate,
    family_of,
    head_layout,
    prune_heads,
    record_head_outputs,
    run_blocks,
)
from tests.conftest import random_mask
from tests.families import DEPTH, HEADS

TOL = dict(rtol=0, atol=1e-5)


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_untouched(family, model, state: dict, batch, out: torch.Tensor) -> None:
    """The model's weights, modules and output are what they were before."""
    assert model.state_dict().keys() == state.keys()
    for name, value in model.state_dict().items():
        assert torch.equal(value, state[name]), name
    assert not any("forward" in vars(m) for m in model.modules())  # no instance forward left
    assert sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules()) == 0
    with torch.no_grad():
        assert torch.equal(family.run(model, batch), out)


def test_layout_and_family(family):
    model = family.build()
    assert family_of(model) is family.model_family
    layout = head_layout(model)
    assert layout.num_heads == (HEADS,) * DEPTH and layout.shape == (DEPTH, HEADS)
    assert (layout.head_dim, layout.embed_dim) == (family.head_dim, family.embed_dim)
    with torch.no_grad():
        out = family.run(model, family.batch(0))
    assert out.shape == (family.batch_size, family.outputs)


@torch.no_grad()
def test_all_kept_mask_is_bit_identical_and_installs_nothing(family):
    model, batch = family.build(), family.batch(0)
    expected = family.run(model, batch)
    with ablate(model, torch.ones(DEPTH, HEADS, dtype=torch.bool)):
        assert not any("forward" in vars(m) for m in model.modules())
        assert torch.equal(family.run(model, batch), expected)


@pytest.mark.parametrize("seed", [0, 1, 2])
@torch.no_grad()
def test_ablation_equals_zeroed_wo_columns_and_leaves_the_model_untouched(family, seed):
    model, batch = family.build(), family.batch(seed)
    keep = random_mask((DEPTH, HEADS), seed)
    keep[seed] = False  # a layer that keeps no head
    keep[(seed + 1) % DEPTH, 0] = True
    state = snapshot(model)
    dense = family.run(model, batch)
    expected = family.run(family.zeroed(model, keep), batch)
    with ablate(model, keep):
        ablated = family.run(model, batch)
    torch.testing.assert_close(
        ablated, expected, rtol=0, atol=1e-6 if family.name == "vit" else 1e-5
    )
    assert not torch.allclose(ablated, dense, atol=1e-3), "the mask should change the output"
    assert_untouched(family, model, state, batch, dense)


def test_an_exception_inside_ablate_restores_the_model(family):
    model, batch = family.build(), family.batch(3)
    state = snapshot(model)
    with torch.no_grad():
        dense = family.run(model, batch)
        with pytest.raises(RuntimeError, match="boom"):
            with ablate(model, random_mask((DEPTH, HEADS), 2)):
                family.run(model, batch)
                raise RuntimeError("boom")
    assert_untouched(family, model, state, batch, dense)


def rebuilt_by_pieces(model, inputs) -> torch.Tensor:
    """The forward written out from the family's pieces: embed, then per block the heads' outputs
    Z, W_O and the rest of the block, then the classifier."""
    pieces = family_of(model)
    x, context = pieces.embed(model, inputs)
    for block in pieces.blocks(model):
        z = pieces.block_heads(block, x, context)
        x = pieces.block_rest(block, x, pieces.attention_projection(block, z))
    return pieces.classify(model, x, context)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@torch.no_grad()
def test_prune_heads_equals_ablation(family, seed):
    model, batch = family.build(), family.batch(seed)
    keep = random_mask((DEPTH, HEADS), seed + 10, p_keep=0.5)
    keep[seed % DEPTH] = False  # a layer without heads
    keep[(seed + 1) % DEPTH, :2] = True  # and one that keeps two or more
    state = snapshot(model)
    dense = family.run(model, batch)
    with ablate(model, keep):
        ablated = family.run(model, batch)
    pruned = prune_heads(model, keep)
    assert type(pruned) is type(model)
    assert head_layout(pruned).num_heads == tuple(int(n) for n in keep.sum(1))
    assert count_params(pruned) < count_params(model)
    torch.testing.assert_close(family.run(pruned, batch), ablated, **TOL)
    assert_untouched(family, model, state, batch, dense)
    # the pruned model's pieces rebuild its forward
    torch.testing.assert_close(rebuilt_by_pieces(pruned, family.inputs(batch)), ablated, **TOL)

    # the pruned model is searched further: ablated and pruned again, in its own numbering
    again, full = head_layout(pruned).all_kept(), keep.clone()
    for layer, n in enumerate(head_layout(pruned).num_heads):
        if n > 1:
            again[layer, 0] = False  # its first remaining head
            full[layer, keep[layer].nonzero()[0, 0]] = False
    expected = family.run(family.zeroed(model, full), batch)
    with ablate(pruned, again):
        torch.testing.assert_close(family.run(pruned, batch), expected, **TOL)
    torch.testing.assert_close(family.run(prune_heads(pruned, again), batch), expected, **TOL)


@torch.no_grad()
def test_recorded_head_outputs_and_pieces_rebuild_the_forward(family):
    model, batch = family.build(), family.batch(4)
    pieces, inputs = family_of(model), family.inputs(batch)
    out = family.run(model, batch)
    with record_head_outputs(model, list(range(DEPTH)), token=None) as store:
        recorded_out = family.run(model, batch)
    with record_head_outputs(model, list(range(DEPTH))) as class_token:  # token 0
        family.run(model, batch)
    stream, context = pieces.embed(model, inputs)
    for layer, block in enumerate(pieces.blocks(model)):
        z = pieces.block_heads(block, stream, context)  # (B, N, H, d_k)
        assert z.shape[2:] == (HEADS, family.head_dim)
        torch.testing.assert_close(store[layer][0], z, **TOL)
        torch.testing.assert_close(class_token[layer][0], z[:, 0], **TOL)
        cls_only = pieces.block_heads(block, stream, context, queries=slice(0, 1))
        torch.testing.assert_close(cls_only, z[:, :1], **TOL)
        rebuilt = pieces.block_rest(block, stream, pieces.attention_projection(block, z))
        stream = pieces.block_forward(block, stream, context)
        torch.testing.assert_close(rebuilt, stream, **TOL)
    torch.testing.assert_close(pieces.classify(model, stream, context), out, **TOL)
    torch.testing.assert_close(rebuilt_by_pieces(model, inputs), out, **TOL)
    # the whole blocks as the model runs them, too
    torch.testing.assert_close(
        pieces.classify(model, run_blocks(model, inputs), context), out, **TOL
    )
    torch.testing.assert_close(recorded_out, out, rtol=0, atol=0)
    assert not any("forward" in vars(m) for m in model.modules())
