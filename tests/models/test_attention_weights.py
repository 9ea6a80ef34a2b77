"""Each family's attention weights (the seam's ``block_attention``) against the weights the
libraries themselves return, and the differentiable head mask (``scale_heads``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hydra_core.models.adapter import ablate, attention_weights, family_of, scale_heads
from hydra_core.models.text import TextClassifier, pack
from tests.conftest import (
    TEXT_KINDS,
    clip_images,
    make_tiny_text,
    make_tiny_vit,
    make_tiny_zero_shot,
    random_mask,
    text_batch,
)


def test_vit_weights_are_timms_unfused_softmax(tiny_vit, images):
    captured = []
    for block in tiny_vit.blocks:
        block.attn.fused_attn = False  # timm then forms the weights; its attn_drop receives them
        block.attn.attn_drop.register_forward_hook(lambda m, args, out: captured.append(out))
    with torch.no_grad():
        tiny_vit(images)
        own = list(captured)  # the model's own forward; ours runs the blocks again
        weights, real = attention_weights(tiny_vit, images)
    assert real is None and len(weights) == len(own) == len(tiny_vit.blocks)
    for ours, timms in zip(weights, own, strict=True):
        assert ours.shape == timms.shape  # (B, H, N, N)
        torch.testing.assert_close(ours, timms, rtol=0, atol=0)  # the same operations


@pytest.mark.parametrize("kind", TEXT_KINDS)
def test_text_weights_are_hugging_faces_eager_attentions_on_the_real_tokens(kind):
    hf = make_tiny_text(kind)
    hf.set_attn_implementation("eager")
    ids, mask = text_batch(batch=5, tokens=10)
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
        weights, real = attention_weights(TextClassifier(hf), pack(ids, mask))
    assert torch.equal(real, mask.bool())
    for ours, hf_weights in zip(weights, theirs, strict=True):
        for b in range(len(ids)):
            n = int(mask[b].sum())
            # the same order of operations as its eager attention: the same numbers
            torch.testing.assert_close(ours[b, :, :n, :n], hf_weights[b, :, :n, :n], rtol=0, atol=0)
            assert float(ours[b, :, :n, n:].sum()) == 0.0  # padding keys get weight 0
    # Padding never changes a sample's weights: sample 1 alone, without its padding.
    n = int(mask[1].sum())
    with torch.no_grad():
        alone, _ = attention_weights(TextClassifier(hf), pack(ids[1:2, :n]))
    for ours, single in zip(weights, alone, strict=True):
        torch.testing.assert_close(ours[1:2, :, :n, :n], single, rtol=0, atol=1e-6)


def test_openclip_weights_are_multihead_attentions_own():
    model = make_tiny_zero_shot()
    x = clip_images(4)
    inputs = []
    blocks = family_of(model).blocks(model)
    for block in blocks:
        block.attn.register_forward_pre_hook(lambda m, args: inputs.append(args[0]))
    with torch.no_grad():
        model(x)
        own = list(inputs)  # the model's own forward; ours runs the blocks again
        weights, real = attention_weights(model, x)
        assert real is None and len(weights) == len(own) == len(blocks)
        for block, ours, q_x in zip(blocks, weights, own, strict=True):
            assert block.attn.batch_first  # (B, N, d) in, as open_clip builds it
            _, theirs = block.attn(q_x, q_x, q_x, need_weights=True, average_attn_weights=False)
            torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


def test_a_pruned_layer_without_heads_has_no_weights():
    from hydra_core.models.adapter import prune_heads

    model = make_tiny_vit(depth=2)
    keep = torch.ones(2, 4, dtype=torch.bool)
    keep[0] = False
    keep[1, 1] = False
    with torch.no_grad():
        weights, _ = attention_weights(prune_heads(model, keep), torch.randn(3, 1, 16, 16))
    assert weights[0].shape == (3, 0, 17, 17) and weights[1].shape == (3, 3, 17, 17)


@pytest.mark.parametrize("family", ["vit", "text", "openclip"])
def test_scale_heads_is_a_differentiable_head_mask(family):
    if family == "vit":
        model, x = make_tiny_vit().double(), torch.randn(6, 1, 16, 16, dtype=torch.float64)
    elif family == "text":
        model, x = TextClassifier(make_tiny_text("bert").double()), pack(*text_batch())
    else:
        model, x = make_tiny_zero_shot().double(), clip_images(4).double()
    layout = family_of(model).layout(model)
    keep = random_mask(layout.shape, seed=3)
    with torch.no_grad():
        plain = model(x)
        with scale_heads(model, torch.ones(layout.shape, dtype=torch.float64)):
            ones = model(x)
        with scale_heads(model, keep.double()):
            masked = model(x)
        with ablate(model, keep):
            ablated = model(x)
    # OpenCLIP's nn.MultiheadAttention runs its own fused path unless the projection is called
    # as a module (family.projection_called), so there the two routes agree up to rounding, which
    # differs between CPUs (3e-15 seen on AVX-512); elsewhere the hook is the only change: exact
    torch.testing.assert_close(ones, plain, rtol=0, atol=1e-12 if family == "openclip" else 0)
    torch.testing.assert_close(masked, ablated, rtol=0, atol=1e-12)
    # The gradient against central differences of the loss, one head at a time.
    labels = torch.arange(len(plain)) % plain.shape[1]
    scales = torch.ones(layout.shape, dtype=torch.float64, requires_grad=True)
    with scale_heads(model, scales):
        loss = F.cross_entropy(model(x), labels)
    (grad,) = torch.autograd.grad(loss, scales)
    step = 1e-6
    for layer, head in [(0, 0), (1, 2), (layout.num_layers - 1, layout.max_heads - 1)]:
        losses = []
        for sign in (1, -1):
            bumped = torch.ones(layout.shape, dtype=torch.float64)
            bumped[layer, head] += sign * step
            with torch.no_grad(), scale_heads(model, bumped):
                losses.append(F.cross_entropy(model(x), labels).item())
        assert grad[layer, head].item() == pytest.approx(
            (losses[0] - losses[1]) / (2 * step), rel=1e-6, abs=1e-9
        )
    with pytest.raises(ValueError, match="head scales must be a float tensor of shape"):
        with scale_heads(model, keep):
            pass


@pytest.mark.parametrize("family", ["vit", "text", "openclip"])
def test_explicit_attention_is_scoped(family):
    if family == "vit":
        model, x = make_tiny_vit(), torch.randn(4, 1, 16, 16)
        state = lambda: [b.attn.fused_attn for b in model.blocks]  # noqa: E731
    elif family == "text":
        hf = make_tiny_text("bert")
        hf.set_attn_implementation("sdpa")
        model, x = TextClassifier(hf), pack(*text_batch())
        state = lambda: hf.config._attn_implementation  # noqa: E731
    else:
        model, x = make_tiny_zero_shot(), clip_images(4)
        state = lambda: None  # noqa: E731
    before = state()
    seam = family_of(model)
    with torch.no_grad():
        plain = model(x)
        with seam.explicit_attention(model):
            inside = model(x)
            if family == "vit":
                assert not any(state())
            elif family == "text":
                assert state() == "eager"
        with pytest.raises(RuntimeError), seam.explicit_attention(model):
            raise RuntimeError("the body fails")
    assert state() == before
    torch.testing.assert_close(inside, plain, rtol=0, atol=1e-5)
