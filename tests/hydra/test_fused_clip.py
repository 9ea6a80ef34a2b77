"""Hydra fusion of OpenCLIP image towers, compared number for number with the members run alone."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

import hydra_core as hc
from hydra_core.hydra.cost import (
    ModelShape,
    count_macs,
    count_params,
    formula_macs,
    parameter_breakdown,
)
from hydra_core.hydra.fused import HydraViT, check_fusable, fuse_members, load_hydra, save_hydra
from hydra_core.hydra.fused_clip import HydraZeroShot, check_clip_fusable, fuse_clip_members
from hydra_core.models.adapter import (
    UnsupportedModelError,
    ablate,
    family_of,
    head_layout,
    prune_heads,
)
from tests.conftest import (
    CLIP_CLASSES,
    CLIP_VARIANTS,
    clip_images,
    make_tiny_clip,
    make_tiny_vit,
    make_tiny_zero_shot,
    random_mask,
)
from tests.hydra.test_fused import canonical_pre_norm_outputs

ATOL = 1e-5
VARIANTS = CLIP_VARIANTS  # (test_export_onnx reads them here)


def tower(**kwargs) -> torch.nn.Module:
    return make_tiny_clip(**kwargs).visual


def member_masks() -> list[torch.Tensor]:
    """Three different (3, 4) masks with unequal head counts per layer: member 1 keeps no head in
    layer 1, member 2 every head of layer 2."""
    masks = [random_mask((3, 4), seed) for seed in range(3)]
    masks[0][:, 0] = True
    masks[1][1] = False
    masks[2][2] = True
    return masks


def ablated(model: torch.nn.Module, keep: torch.Tensor) -> torch.nn.Module:
    """A copy of a tower with the removed heads' W_O columns zeroed: exactly head ablation."""
    model = copy.deepcopy(model)
    tower_ = model.visual if hasattr(model, "class_embeddings") else model
    dk = head_layout(tower_).head_dim
    with torch.no_grad():
        for layer, block in enumerate(tower_.transformer.resblocks):
            for head in range(block.attn.num_heads):
                if not keep[layer, head]:
                    block.attn.out_proj.weight[:, head * dk : (head + 1) * dk] = 0
    return model


def perturbed_copy(model: torch.nn.Module, seed: int, only: str = "") -> torch.nn.Module:
    """A stand-in for a fine-tuned member: every parameter whose name contains ``only`` nudged."""
    member = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in member.named_parameters():
            if only in name:
                p.add_(0.05 * torch.randn(p.shape, generator=g) * p.abs().mean())
    return member


def assert_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got, expected, rtol=0, atol=ATOL)


@torch.no_grad()
def test_members_differing_outside_their_mlps_are_fused_exactly():
    visual, images, masks = tower(layer_scale=True), clip_images(), member_masks()
    members = [perturbed_copy(visual, seed, only="attn") for seed in range(3)]
    fused = fuse_clip_members(list(zip(members, masks, strict=True)))
    assert fused.stem.groups == 1  # the stem is shared, the attention is not
    for m, (member, keep) in enumerate(zip(members, masks, strict=True)):
        assert_close(fused(images)[:, m], ablated(member, keep)(images))


@pytest.mark.parametrize("variant", ["plain", "avg-ln-after-pool-scaled"])
@torch.no_grad()
def test_zero_shot_classifiers_fuse_into_member_logits(variant):
    classifier, images, masks = (
        make_tiny_zero_shot(**VARIANTS[variant]),
        clip_images(),
        member_masks(),
    )
    # separate objects sharing the class embeddings: a copy per member
    members = [(copy.deepcopy(classifier), keep) for keep in masks]
    fused = fuse_members(members)
    assert isinstance(fused, HydraZeroShot)
    logits = fused(images)
    assert logits.shape == (6, 3, len(CLIP_CLASSES))  # (B, M, C)
    for m, keep in enumerate(masks):
        assert_close(logits[:, m], ablated(classifier, keep)(images))
    assert fused.config is fused.visual.config and fused.config.kept_heads == fused.kept_heads
    assert fused.num_members == 3 and fused.num_classes == len(CLIP_CLASSES)
    assert fused.member_head_counts() == [[int(n) for n in k.sum(1)] for k in masks]
    assert fused.classes == CLIP_CLASSES and fused.templates == classifier.templates
    check_fusable(classifier)


@torch.no_grad()
def test_zero_shot_members_share_classes_and_scale_and_keep_their_own_class_embeddings():
    classifier, keep = make_tiny_zero_shot(), random_mask((3, 4), 0)
    other = copy.deepcopy(classifier)
    other.logit_scale.fill_(50.0)
    with pytest.raises(
        ValueError, match=r"member 1 and member 0 differ in their logit scale \(14\.2857 vs 50\)"
    ):
        fuse_clip_members([(classifier, keep), (other, keep)])
    other = copy.deepcopy(classifier)
    other.class_embeddings.copy_(other.class_embeddings.roll(1, 0))  # other class embeddings
    fused = fuse_clip_members([(classifier, keep), (other, keep)])
    images = clip_images()
    assert_close(fused(images)[:, 0], ablated(classifier, keep)(images))
    assert_close(fused(images)[:, 1], ablated(other, keep)(images))
    assert fused.class_embeddings.shape == (2, len(CLIP_CLASSES), 32)
    renamed = make_tiny_zero_shot(classes=("a", "b", "c", "d", "e"))
    with pytest.raises(ValueError, match="member 2 and member 0 differ in their classes"):
        fuse_clip_members([(classifier, keep), (classifier, keep), (renamed, keep)])
    with pytest.raises(ValueError, match="all zero-shot classifiers or all image towers"):
        fuse_clip_members([(classifier, keep), (classifier.visual, keep)])


def open_clip_tower(**overrides) -> torch.nn.Module:
    from open_clip.transformer import VisionTransformer

    kwargs = dict(image_size=32, patch_size=8, width=32, layers=1, heads=4, mlp_ratio=2.0)
    return VisionTransformer(**{**kwargs, "output_dim": 16, **overrides}).eval()


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(attentional_pool=True, attn_pooler_heads=4, attn_pooler_queries=4), "attentional"),
        (dict(pool_type="none"), "pool_type='none'"),
        (dict(qk_norm=True), "ResidualAttentionBlock"),
        (dict(output_tokens=True), "output_tokens"),
    ],
)
def test_unsupported_towers_are_refused_in_one_line(overrides, match):
    model = open_clip_tower(**overrides)
    with pytest.raises(UnsupportedModelError, match=match) as error:
        check_clip_fusable(model)
    assert "\n" not in str(error.value) and "this model cannot be fused" in str(error.value)
    with pytest.raises(UnsupportedModelError, match=f"member 0 cannot be fused: .*{match}"):
        fuse_clip_members([(model, torch.ones(1, 4, dtype=torch.bool))])


def test_a_tower_without_projection_is_refused():
    model = open_clip_tower()
    model.proj = None
    with pytest.raises(UnsupportedModelError, match=r"no output projection"):
        check_clip_fusable(model)


@torch.no_grad()
def test_zero_shot_save_and_load_round_trip(tmp_path):
    """(Image towers' round trip: test_fused_contract.py.)"""
    model = make_tiny_zero_shot(
        layer_scale=True, pool="avg", final_ln_after_pool=True, quick_gelu=True
    )
    members = [perturbed_copy(model, seed) for seed in range(3)]
    fused = fuse_clip_members(list(zip(members, member_masks(), strict=True)))
    path = tmp_path / "hydra.safetensors"
    save_hydra(fused, path, source="tiny-clip")
    loaded = load_hydra(path)
    assert type(loaded) is type(fused) and not loaded.training
    assert loaded.config == fused.config
    images = clip_images()
    assert torch.equal(loaded(images), fused(images))
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    assert json.loads(meta["hydra"])["format"] == "hydra-fused"
    assert (loaded.classes, loaded.templates) == (fused.classes, fused.templates)
    assert torch.equal(loaded.logit_scale, fused.logit_scale)
    assert json.loads(meta["classes"]) == list(CLIP_CLASSES)
    assert json.loads(meta["zero_shot"])["classes"] == list(CLIP_CLASSES)


def test_load_refuses_malformed_zero_shot_files(tmp_path):
    fused = fuse_clip_members([(make_tiny_zero_shot(), random_mask((3, 4), 0))])
    path = tmp_path / "hydra.safetensors"
    save_hydra(fused, path)
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    broken = tmp_path / "broken.safetensors"
    save_file(tensors, str(broken), metadata={k: v for k, v in meta.items() if k != "zero_shot"})
    with pytest.raises(ValueError, match="zero-shot tensors but no 'zero_shot' header entry"):
        load_hydra(broken)
    entry = json.loads(meta["zero_shot"])
    del entry["templates"]
    save_file(tensors, str(broken), metadata={**meta, "zero_shot": json.dumps(entry)})
    with pytest.raises(ValueError, match="'zero_shot' header entry is malformed"):
        load_hydra(broken)
    rest = {k: v for k, v in tensors.items() if not k.startswith("zero_shot.")}
    save_file(rest, str(broken), metadata=meta)
    with pytest.raises(ValueError, match="expected the one tensor 'zero_shot.class_embeddings'"):
        load_hydra(broken)


def ablated_by_hooks(model: torch.nn.Module, keep: torch.Tensor, images: torch.Tensor):
    with ablate(model, keep):
        return model(images)


@torch.no_grad()
def test_fuse_members_dispatches_open_clip_towers_and_classifiers():
    classifier, images, masks = make_tiny_zero_shot(pool="avg"), clip_images(), member_masks()
    towers = hc.fuse_members([(classifier.visual, keep) for keep in masks])
    logits = hc.fuse_members([(classifier, keep) for keep in masks])
    assert isinstance(towers, HydraViT) and isinstance(logits, HydraZeroShot)
    for m, keep in enumerate(masks):
        assert_close(towers(images)[:, m], ablated_by_hooks(classifier.visual, keep, images))
        assert_close(logits(images)[:, m], ablated_by_hooks(classifier, keep, images))
    check_fusable(classifier.visual)
    with pytest.raises(UnsupportedModelError, match="this model cannot be fused: .*attn_pool"):
        check_fusable(open_clip_tower(attentional_pool=True, attn_pooler_heads=4))
    vit = make_tiny_vit()
    with pytest.raises(ValueError, match="member 0 is a openclip model, member 1 is a vit model"):
        fuse_members([(classifier, masks[0]), (vit, head_layout(vit).all_kept())])


@pytest.mark.parametrize("zero_shot", [False, True])
@torch.no_grad()
def test_a_tiny_clip_costs_what_the_formula_says(zero_shot):
    """Parameters by kind sum to the total, and counted multiply-adds (nn.MultiheadAttention's
    fused kernel included) equal the formula, for the tower, a pruned member and the fused
    model."""
    model = make_tiny_zero_shot(layer_scale=True) if zero_shot else tower(layer_scale=True)
    masks, image = member_masks(), clip_images(1)
    pruned = prune_heads(model, masks[0])
    fused = fuse_members([(model, keep) for keep in masks])
    for system in (model, pruned, fused):
        assert sum(parameter_breakdown(system).values()) == count_params(system)
    parts = parameter_breakdown(model)
    d, depth, hidden = 64, 3, 256
    assert parts["attention weights"] == depth * 4 * d * d  # in_proj (3d, d) and out_proj
    assert parts["MLP weights"] == depth * 2 * d * hidden
    assert parts["classifier"] == d * 32  # proj (d, D); class embeddings are a buffer
    assert parts["embedding"] == 3 * 64 * 8 * 8 + d + 17 * d  # conv1, class token, positions
    shape = ModelShape.of(model)
    counts = [[int(n) for n in keep.sum(1)] for keep in masks]
    assert count_macs(model, image) == formula_macs(shape, [[4, 4, 4]])
    assert count_macs(pruned, image) == formula_macs(shape, counts[:1])
    assert count_macs(fused, image) == formula_macs(shape, counts, fused=True)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@torch.no_grad()
def test_a_towers_parts_alone_compute_its_embeddings(variant):
    images = clip_images()
    visual = tower(**VARIANTS[variant])
    for member in (visual, prune_heads(visual, member_masks()[1])):
        parts = family_of(member).fusion_parts(member)
        assert parts.kind == "pre-norm" and parts.zero_shot is None
        torch.testing.assert_close(
            canonical_pre_norm_outputs(parts, images), member(images), rtol=0, atol=ATOL
        )


@torch.no_grad()
def test_a_zero_shot_classifiers_parts_carry_its_head():
    images = clip_images()
    classifier = make_tiny_zero_shot()
    parts = family_of(classifier).fusion_parts(classifier)
    head = parts.zero_shot
    assert head.classes == CLIP_CLASSES and head.templates == classifier.templates
    embeddings = canonical_pre_norm_outputs(parts, images)
    logits = head.logit_scale * F.normalize(embeddings, dim=-1) @ head.class_embeddings.T
    torch.testing.assert_close(logits, classifier(images), rtol=0, atol=ATOL)
