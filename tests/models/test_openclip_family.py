"""The OpenCLIP image-tower family on tiny random open_clip models, bare and as zero-shot
classifiers: ablation against a copy with W_O's columns zeroed (nn.MultiheadAttention never calls
its ``out_proj``), structural pruning against ablation, the piece-by-piece forward against the
model's own, the fast greedy search against the plain one, the analyses, and the refusals. Bare
towers run these checks as every family does, in test_family_contract.py; here the zero-shot
classifiers."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hydra_core as hc
from hydra_core.analysis import _suffix
from hydra_core.analysis.cahp import cahp_select
from hydra_core.analysis.cahp_official import keep_one_per_layer
from hydra_core.analysis.greedy import greedy_circuit, single_head_importance
from hydra_core.analysis.inputs import SearchInputs
from hydra_core.analysis.representations import centroid_distances, head_cls_features
from hydra_core.analysis.taylor import taylor_scores
from hydra_core.hydra.cost import (
    ModelShape,
    count_macs,
    count_params,
    formula_macs,
    parameter_breakdown,
)
from hydra_core.hydra.members import (
    TAYLOR_NAME,
    cahp_members,
    greedy_ranking,
    member_overlap,
    seed_sampled_members,
    taylor_member,
    taylor_ranking,
)
from hydra_core.models.adapter import UnsupportedModelError, family_of, record_head_outputs
from hydra_core.models.openclip import (
    OPENCLIP,
    PrunedMultiheadAttention,
    explicit_attention,
    prune_attention,
)
from hydra_core.models.zero_shot import ZeroShotClassifier
from tests.analysis.test_greedy import assert_same_search
from tests.conftest import clip_images, make_tiny_clip, make_tiny_zero_shot, random_mask

LAYERS, HEADS, DK, D = 3, 4, 16, 64
ATOL = 1e-5
#: tower configurations: layer scale, class-token or average pooling, LayerNorm after pooling
VARIANTS = {
    "tok": dict(),
    "layerscale-avg": dict(layer_scale=True, pool="avg"),
    "ln-after-pool-quickgelu": dict(final_ln_after_pool=True, quick_gelu=True),
}


@functools.cache
def _built(variant: str, wrapped: bool) -> nn.Module:
    kwargs = VARIANTS[variant]
    return make_tiny_zero_shot(**kwargs) if wrapped else make_tiny_clip(**kwargs).visual


def tiny(variant: str = "tok", wrapped: bool = False) -> nn.Module:
    """A fresh copy of a tiny tower (bare) or zero-shot classifier (wrapped)."""
    return copy.deepcopy(_built(variant, wrapped))


def tower(model: nn.Module) -> nn.Module:
    return model.visual if isinstance(model, ZeroShotClassifier) else model


def zeroed_wo(model: nn.Module, keep: torch.Tensor) -> nn.Module:
    """The reference for ablation: a copy whose W_O columns of the removed heads are zero."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for layer, block in enumerate(tower(ref).transformer.resblocks):
            block.attn.out_proj.weight[:, (~keep[layer]).repeat_interleave(DK)] = 0
    return ref


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_untouched(model: nn.Module, state: dict, x: torch.Tensor, out: torch.Tensor) -> None:
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert not any("forward" in vars(m) for m in model.modules())  # no instance forward left
    with torch.no_grad():
        assert torch.equal(model(x), out)


CASES = [(v, w) for v in VARIANTS for w in (False, True)]


@pytest.fixture(params=sorted(VARIANTS))
def model(request) -> nn.Module:
    """A zero-shot classifier (bare towers: every family's checks in test_family_contract.py)."""
    return tiny(request.param, wrapped=True)


def test_layout_pooling_and_outputs_of_towers_and_classifiers():
    for variant, wrapped in CASES:
        model = tiny(variant, wrapped)
        assert family_of(model) is OPENCLIP
        assert hc.head_layout(model).shape == (LAYERS, HEADS)
        assert OPENCLIP.class_token_pooling(model) == (VARIANTS[variant].get("pool") != "avg")
        with torch.no_grad():
            out = model(clip_images(2))
        assert out.shape == (2, 5 if wrapped else 32)


@pytest.mark.parametrize("seed", [0, 1])
def test_zero_shot_ablate_equals_zeroing_wo_columns_and_restores_the_model(model, seed):
    x = clip_images(5, seed=seed)
    keep = random_mask((LAYERS, HEADS), seed)
    keep[seed] = False  # a layer that keeps no head
    state = snapshot(model)
    with torch.no_grad():
        dense = model(x)
        expected = zeroed_wo(model, keep)(x)
        with hc.ablate(model, keep):
            ablated = model(x)
        with hc.ablate(model, torch.ones(LAYERS, HEADS, dtype=torch.bool)):
            assert not any("forward" in vars(m) for m in model.modules())
            assert torch.equal(model(x), dense)  # an all-True mask installs nothing
    torch.testing.assert_close(ablated, expected, rtol=0, atol=ATOL)
    assert not torch.allclose(ablated, dense, atol=1e-3)
    assert_untouched(model, state, x, dense)


def test_ablate_restores_the_model_when_the_body_raises():
    model = tiny()
    x = clip_images(3)
    state = snapshot(model)
    with torch.no_grad():
        dense = model(x)
    with pytest.raises(RuntimeError, match="boom"), hc.ablate(model, random_mask((3, 4), 2)):
        raise RuntimeError("boom")
    assert_untouched(model, state, x, dense)


def test_ablate_through_gradients_equals_zeroed_copy():
    model = tiny("layerscale-avg", wrapped=True)
    x, y = clip_images(4), torch.tensor([0, 1, 2, 3])
    keep = random_mask((LAYERS, HEADS), 3)
    ref = zeroed_wo(model, keep)
    with hc.ablate(model, keep):
        loss = F.cross_entropy(model(x), y)
    weight = tower(model).transformer.resblocks[0].attn.in_proj_weight
    ref_weight = tower(ref).transformer.resblocks[0].attn.in_proj_weight
    grad = torch.autograd.grad(loss, weight)[0]
    ref_grad = torch.autograd.grad(F.cross_entropy(ref(x), y), ref_weight)[0]
    torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_zero_shot_prune_heads_equals_ablation(model, seed):
    x = clip_images(5, seed=seed)
    keep = random_mask((LAYERS, HEADS), seed + 10)
    keep[2 - seed] = False
    state = snapshot(model)
    with torch.no_grad():
        dense = model(x)
        with hc.ablate(model, keep):
            ablated = model(x)
        pruned = hc.prune_heads(model, keep)
        torch.testing.assert_close(pruned(x), ablated, rtol=0, atol=ATOL)
    blocks = tower(pruned).transformer.resblocks
    for layer, block in enumerate(blocks):
        kept = int(keep[layer].sum())
        if kept < HEADS:
            assert isinstance(block.attn, PrunedMultiheadAttention)
        assert block.attn.in_proj_weight.shape == (3 * kept * DK, D)
        assert block.attn.out_proj.weight.shape == (D, kept * DK)
    assert hc.head_layout(pruned).num_heads == tuple(keep.sum(1).tolist())
    assert count_params(pruned) < count_params(model)
    assert_untouched(model, state, x, dense)

    # the pruned model is searched further: ablated, recorded and pruned again
    layout = hc.head_layout(pruned)
    again = layout.all_kept()
    layer = next(i for i, n in enumerate(layout.num_heads) if n > 0)
    again[layer, 0] = False
    with torch.no_grad():
        with hc.ablate(pruned, again):
            twice_ablated = pruned(x)
        twice_pruned = hc.prune_heads(pruned, again)(x)
        full = keep.clone()
        full[layer, keep[layer].nonzero()[0, 0]] = False
        expected = zeroed_wo(model, full)(x)
    torch.testing.assert_close(twice_ablated, expected, rtol=0, atol=ATOL)
    torch.testing.assert_close(twice_pruned, expected, rtol=0, atol=ATOL)


def explicit_heads(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Per-head outputs (B, N, H, d_k) of an nn.MultiheadAttention block, written out."""
    attn = block.attn
    b, n, _ = x.shape
    q, k, v = F.linear(block.ln_1(x), attn.in_proj_weight, attn.in_proj_bias).chunk(3, -1)
    q, k, v = (t.reshape(b, n, HEADS, DK).transpose(1, 2) for t in (q, k, v))  # (B, H, N, d_k)
    weights = (q @ k.transpose(-2, -1) / DK**0.5).softmax(-1)  # (B, H, N, N)
    return (weights @ v).transpose(1, 2)  # (B, N, H, d_k)


def test_zero_shot_recorded_head_outputs_and_pieces_rebuild_the_forward(model):
    x = clip_images(4, seed=3)
    family = family_of(model)
    blocks = family.blocks(model)
    with torch.no_grad():
        out = model(x)
        with record_head_outputs(model, [0, 1, 2], token=None) as store:
            recorded_out = model(x)
        stream, context = family.embed(model, x)
        for layer, block in enumerate(blocks):
            z = family.block_heads(block, stream, context)  # (B, N, H, d_k)
            torch.testing.assert_close(z, explicit_heads(block, stream), rtol=0, atol=ATOL)
            torch.testing.assert_close(store[layer][0], z, rtol=0, atol=ATOL)
            cls = family.block_heads(block, stream, context, queries=slice(0, 1))
            torch.testing.assert_close(cls, z[:, :1], rtol=0, atol=ATOL)
            attn_out = family.attention_projection(block, z)
            rebuilt = family.block_rest(block, stream, attn_out)
            stream = family.block_forward(block, stream, context)
            torch.testing.assert_close(rebuilt, stream, rtol=0, atol=ATOL)
        pieces = family.classify(model, stream, context)
    torch.testing.assert_close(recorded_out, out, rtol=0, atol=ATOL)
    torch.testing.assert_close(pieces, out, rtol=0, atol=ATOL)
    assert not any("forward" in vars(m) for m in model.modules())


def test_ablate_nested_in_record_reads_zero_for_ablated_heads():
    model = tiny("layerscale-avg", wrapped=True)
    x = clip_images(4)
    keep = torch.ones(LAYERS, HEADS, dtype=torch.bool)
    keep[1, 2] = keep[2, 0] = False
    with torch.no_grad(), record_head_outputs(model, [1, 2]) as store:
        with hc.ablate(model, keep):
            ablated = model(x)
        model(x)  # the recording context still holds after the inner one left
    assert not any("forward" in vars(m) for m in model.modules())
    torch.testing.assert_close(ablated, zeroed_wo(model, keep)(x), rtol=0, atol=ATOL)
    assert store[1][0][:, 2].abs().max() == 0 and store[2][0][:, 0].abs().max() == 0
    assert store[1][0][:, 1].abs().max() > 0
    assert store[1][1][:, 2].abs().max() > 0  # dense again in the second forward
    torch.testing.assert_close(
        head_cls_features(model, x, layers=[1], keep=keep)[:, 0], store[1][0], rtol=0, atol=ATOL
    )


def test_non_batch_first_tower():
    """An older-style tower whose transformer runs on (N, B, d)."""
    from open_clip.transformer import Transformer

    model = tiny("layerscale-avg")
    source = model.transformer
    other = Transformer(D, LAYERS, HEADS, mlp_ratio=4.0, ls_init_value=0.5, batch_first=False)
    other.load_state_dict(source.state_dict())
    x = clip_images(3)
    with torch.no_grad():
        dense = model(x)
        model.transformer = other.eval()
        torch.testing.assert_close(model(x), dense, rtol=0, atol=ATOL)
        keep = random_mask((LAYERS, HEADS), 4)
        with hc.ablate(model, keep):
            ablated = model(x)
        torch.testing.assert_close(ablated, zeroed_wo(model, keep)(x), rtol=0, atol=ATOL)
        torch.testing.assert_close(hc.prune_heads(model, keep)(x), ablated, rtol=0, atol=ATOL)
        family = family_of(model)
        stream = family.embed(model, x)[0]
        for block in family.blocks(model):
            stream = family.block_forward(block, stream, None)
        torch.testing.assert_close(family.classify(model, stream, None), dense, rtol=0, atol=ATOL)


@pytest.mark.parametrize("batch_first", [True, False])
def test_explicit_attention_equals_multihead_attention_with_masks(batch_first):
    torch.manual_seed(0)
    attn = nn.MultiheadAttention(D, HEADS, batch_first=batch_first).eval()
    x = torch.randn(3, 7, D) if batch_first else torch.randn(7, 3, D)
    banned = torch.rand(7, 7, generator=torch.Generator().manual_seed(1)) < 0.3
    banned.fill_diagonal_(False)
    additive = torch.randn(7, 7)
    pruned = prune_attention(attn, torch.arange(HEADS))  # keeps every head
    for mask in (None, banned, additive):
        expected = attn(x, x, x, need_weights=False, attn_mask=mask)[0]
        torch.testing.assert_close(
            explicit_attention(attn, x, x, x, mask), expected, rtol=0, atol=ATOL
        )
        torch.testing.assert_close(pruned(x, x, x, attn_mask=mask)[0], expected, rtol=0, atol=ATOL)


# --- search and analyses --------------------------------------------------------------------


def search_data(model: nn.Module, n: int = 20):
    """ID images labelled mostly by the model's own predictions, and brighter OOD images."""
    id_x = clip_images(n, seed=5).double()
    with torch.no_grad():
        labels = model(id_x).argmax(-1)
    labels[::3] = torch.arange(len(labels[::3])) % 5
    return id_x, labels, 1.5 * clip_images(n, seed=6).double() + 0.5


@pytest.fixture
def small_passes(monkeypatch):
    """Fast-path passes of a few samples: ragged chunks, many passes."""
    monkeypatch.setattr(_suffix, "CPU_ROWS_PER_PASS", 7 * 17)
    monkeypatch.setattr(_suffix, "CPU_ROWS_PER_PASS_THREADED", 7 * 17)


@pytest.mark.parametrize(
    ("objective", "variant"), [("avg", "tok"), ("acc", "layerscale-avg"), ("ood", "tok")]
)
def test_fast_greedy_equals_plain(objective, variant, small_passes):
    model = tiny(variant, wrapped=True).double()
    id_x, id_y, ood_x = search_data(model)
    modules = list(model.modules())
    state = snapshot(model)
    runs = [
        greedy_circuit(model, id_x, id_y, ood_x, objective=objective, budget=12, method=m)
        for m in ("fast", "plain")
    ]
    assert_same_search(*runs)
    assert runs[0].steps == 12 and runs[0].keep_mask().sum() == 0
    assert list(model.modules()) == modules
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_zero_shot_fast_candidate_logits_match_ablated_forward_in_float32(variant):
    """(Bare towers, as every family: test_search_contract.py.)"""
    model = tiny(variant, wrapped=True)
    inputs = clip_images(10, seed=12)
    removed = [(0, 1), (1, 0), (1, 2), (2, 3), (2, 0), (2, 2)]  # layer 2 keeps one head
    keep = torch.ones(LAYERS, HEADS, dtype=torch.bool)
    for layer, head in removed:
        keep[layer, head] = False
    with torch.inference_mode():
        evaluator = _suffix.SuffixEvaluator(model, inputs, pairs_per_pass=3)
        assert all(fold is not None and fold.pre_norm is not None for fold in evaluator.folds)
        evaluator.set_removed(removed)
        with hc.ablate(model, keep):
            torch.testing.assert_close(evaluator.logits, model(inputs), rtol=0, atol=ATOL)
        seen = []
        for heads, logits in evaluator.candidate_logits():
            for (layer, head), got in zip(heads, logits, strict=True):
                one_less = keep.clone()
                one_less[layer, head] = False
                with hc.ablate(model, one_less):
                    torch.testing.assert_close(got, model(inputs), rtol=0, atol=ATOL)
                seen.append((layer, head))
    assert seen == [tuple(h) for h in keep.nonzero().tolist()]


def test_single_head_importance_equals_ablating_each_head():
    model = tiny(wrapped=True).double()
    id_x, id_y, ood_x = search_data(model, n=12)
    result = single_head_importance(model, id_x, id_y, ood_x)
    for layer, head in [(0, 1), (2, 3)]:
        keep = torch.ones(LAYERS, HEADS, dtype=torch.bool)
        keep[layer, head] = False
        with torch.no_grad():
            accuracy = (zeroed_wo(model, keep)(id_x).argmax(-1) == id_y).double().mean()
        delta = float(accuracy) - result["base_accuracy"]
        assert float(result["delta_accuracy"][layer, head]) == pytest.approx(delta, abs=1e-9)


def reference_taylor(model: nn.Module, x, y, keep: torch.Tensor) -> torch.Tensor:
    """|W * dL/dW| over each head's q, k and v rows of in_proj_weight, on the zeroed-W_O copy."""
    ref = zeroed_wo(model, keep)
    weights = [b.attn.in_proj_weight for b in tower(ref).transformer.resblocks]
    grads = torch.autograd.grad(F.cross_entropy(ref(x), y), weights)
    per_head = [
        (w * g).abs().reshape(3, HEADS, DK, D).mean(dim=(2, 3)).mean(0)  # (H,)
        for w, g in zip(weights, grads, strict=True)
    ]
    scores = torch.stack(per_head)  # (L, H)
    scores[~keep] = float("nan")
    return scores.float()


def test_taylor_scores_equal_autograd_on_the_zeroed_copy():
    model = tiny("ln-after-pool-quickgelu", wrapped=True)
    x, y = clip_images(6, seed=7), torch.arange(6) % 5
    keep = random_mask((LAYERS, HEADS), 5)
    for mask in (torch.ones(LAYERS, HEADS, dtype=torch.bool), keep):
        scores = taylor_scores(model, x, y, keep=mask, batch_size=4)
        torch.testing.assert_close(
            scores, reference_taylor(model, x, y, mask), rtol=1e-4, atol=1e-8, equal_nan=True
        )


def test_head_features_centroids_and_cahp():
    model = tiny(wrapped=True)
    x, y = clip_images(15, seed=8), torch.arange(15) % 5
    features = head_cls_features(model, x, batch_size=4)  # (N, L, H, d_k)
    stream = family_of(model).embed(model, x)[0]
    with torch.no_grad():
        for layer, block in enumerate(tower(model).transformer.resblocks):
            expected = explicit_heads(block, stream)[:, 0]
            torch.testing.assert_close(features[:, layer], expected, rtol=0, atol=ATOL)
            stream = block(stream)
    ood = head_cls_features(model, 2 * clip_images(9, seed=9), batch_size=4)
    table = centroid_distances(features, ood)
    assert len(table) == LAYERS * HEADS and (table["euclidean"] > 0).all()
    result = cahp_select(
        model, x, y, variant="accuracy-knee", k_grid=[1, 4, 8, 12], degree=2, batch_size=7
    )
    for k, accuracy in zip(result.curve["k"], result.curve["accuracy"], strict=True):
        medoids = result.medoids[k]
        guard = keep_one_per_layer(
            [result.heads.index(h) for h in medoids], result.heads, result.importance
        )
        keep = torch.zeros(LAYERS, HEADS, dtype=torch.bool)
        for layer, head in medoids + [result.heads[i] for i in guard]:
            keep[layer, head] = True
        with torch.no_grad():
            expected = (zeroed_wo(model, keep)(x).argmax(-1) == y).float().mean().item()
        assert accuracy == pytest.approx(expected)


def test_member_strategies():
    model = tiny(wrapped=True)
    id_x, ood_x = clip_images(12, seed=10), 2 * clip_images(12, seed=11)
    inputs = SearchInputs(id_x, torch.arange(12) % 5, ood_x, {"ood": ood_x})
    layout = hc.head_layout(model)
    ranking = taylor_ranking(model, inputs, samples=None)
    assert sorted(ranking) == sorted((layer, h) for layer in range(LAYERS) for h in range(HEADS))
    members = seed_sampled_members(
        ranking, layout, budget=4, seeds=[0, 1, 2], ranking_name=TAYLOR_NAME, pool=8
    )
    assert all(int(m.keep.sum()) == 8 for m in members)
    assert 0 <= member_overlap(members)["mean_pairwise_jaccard"] < 1
    assert len(greedy_ranking(model, inputs, objective="avg", budget=3)) == LAYERS * HEADS
    assert taylor_member(model, inputs, per_layer=1, samples=None).keep.sum(1).tolist() == [3] * 3
    cahp = cahp_members(
        model,
        inputs,
        seeds=[0, 1],
        variant="accuracy-knee",
        k_grid=[1, 4, 8, 12],
        degree=2,
        allow_identical=True,
    )
    assert [m.name for m in cahp] == ["CAHP accuracy-knee seed 0", "CAHP accuracy-knee seed 1"]


@pytest.mark.parametrize("wrapped", [False, True])
def test_cost_sizes_and_parameter_kinds(wrapped):
    model = tiny(wrapped=wrapped)
    x = clip_images(2)
    shape = ModelShape.of(model)
    assert (shape.num_tokens, shape.mlp_hidden, shape.num_patches, shape.patch_dim) == (
        17,
        4 * D,
        16,
        3 * 8 * 8,
    )
    assert (shape.num_classes, shape.pre_classifier) == ((5, 32) if wrapped else (32, 0))
    # every layer pruned: torch's FlopCounterMode does not see nn.MultiheadAttention's native
    # inference kernel, but sees every multiply of a PrunedMultiheadAttention
    keep = torch.tensor([[True, False, True, False], [False] * 4, [True, True, True, False]])
    pruned = hc.prune_heads(model, keep)
    assert count_macs(pruned, x) == 2 * formula_macs(shape, [keep.sum(1).tolist()])
    parts = parameter_breakdown(model)
    assert sum(parts.values()) == count_params(model)
    assert parts["classifier"] == D * 32
    assert parts["embedding"] == 3 * 8 * 8 * D + D + 17 * D
    assert parts["attention weights"] == LAYERS * 4 * D * D


# --- refusals -------------------------------------------------------------------------------


def _tower(**kwargs) -> nn.Module:
    from open_clip.transformer import VisionTransformer

    options = dict(image_size=32, patch_size=8, width=D, layers=1, heads=HEADS, mlp_ratio=2.0)
    return VisionTransformer(**{**options, "output_dim": 32, **kwargs}).eval()


def _mixed_widths() -> nn.Module:
    model = tiny()
    model.transformer.resblocks[1].attn = nn.MultiheadAttention(D, 2, batch_first=True)
    return model


def _timm_tower() -> nn.Module:
    from open_clip.timm_model import TimmModel

    return TimmModel("test_vit", embed_dim=32, image_size=32)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: _tower(qk_norm=True), "CustomResidualAttentionBlock"),
        (lambda: _tower(scale_heads=True), "CustomResidualAttentionBlock"),
        (lambda: _tower(attentional_pool=True, attn_pooler_queries=4), "attentional pooling"),
        (lambda: _tower(output_tokens=True), "output_tokens"),
        (lambda: _tower(pool_type="none"), "pool_type='none'"),
        (_timm_tower, "timm backbone"),
        (_mixed_widths, r"width of their heads: \[16, 32\]"),
        (lambda: make_tiny_clip(layers=1), "whole CLIP model; pass its image tower"),
    ],
    ids=["qk-norm", "scale-heads", "attn-pool", "tokens", "no-pool", "timm", "widths", "clip"],
)
def test_refusals_name_the_cause(build, message):
    model = build()
    with pytest.raises(UnsupportedModelError, match=message):
        hc.head_layout(model)
    with pytest.raises(UnsupportedModelError, match=message):
        hc.prune_heads(model, torch.ones(1, HEADS, dtype=torch.bool))


def test_family_of_names_open_clip_when_nothing_matches():
    with pytest.raises(UnsupportedModelError, match="open_clip VisionTransformer image towers"):
        family_of(nn.Linear(2, 2))
