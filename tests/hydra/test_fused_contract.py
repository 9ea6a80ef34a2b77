"""The fusion contract, for every family (``family`` fixture: each tiny ViT configuration, text
kind and OpenCLIP tower configuration): a Hydra's members give, number for number (fp32, 1e-5),
what each member gives run alone, the heads it leaves out removed the family's own plain way.

Checks that hold for one family only stay in its file: test_fused.py (ViTs), test_fused_text.py,
test_fused_clip.py (zero-shot classifiers, unsupported towers, costs)."""

from __future__ import annotations

import json
import operator

import pytest
import torch
from safetensors import safe_open

from hydra_core.hydra import ensemble_probs, load_hydra, save_hydra
from hydra_core.models.adapter import ablate, head_layout, prune_heads
from tests.conftest import make_tiny_clip, make_tiny_text, make_tiny_vit
from tests.families import (
    DEPTH,
    HEADS,
    member_masks,
    perturbed_copy,
    tiny_bert,
    with_merged_mlps,
)

ATOL = 1e-5


def assert_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got, expected, rtol=0, atol=ATOL)


@torch.no_grad()
def test_zero_shot_members_equal_ablated_and_pruned_members(family):
    model, batch = family.build(), family.batch(1)
    masks = member_masks()
    hydra = family.fuse([(model, k) for k in masks])
    assert isinstance(hydra, family.hydra_type)
    logits = family.run(hydra, batch)
    assert logits.shape == (family.batch_size, 3, family.outputs)
    full = family.run(model, batch)
    for m, keep in enumerate(masks):
        reference = family.ablated(model, keep, batch)
        assert (reference - full).abs().max() > 1e-2  # removing the heads matters
        assert_close(logits[:, m], reference)
        assert_close(logits[:, m], family.run(prune_heads(model, keep), batch))
    assert not torch.allclose(logits[:, 0], logits[:, 1], atol=1e-3), "members should differ"
    assert hydra.member_head_counts() == [k.sum(1).tolist() for k in masks]
    assert ensemble_probs(logits).shape == (family.batch_size, family.outputs)


@torch.no_grad()
def test_layer_where_no_member_keeps_a_head(family):
    model, batch = family.build(), family.batch(7)
    masks = member_masks(seed=2)
    for keep in masks:
        keep[1] = False
    hydra = family.fuse([(model, k) for k in masks])
    assert hydra.blocks[1].max_heads == 0 and hydra.blocks[1].qkv is None
    logits = family.run(hydra, batch)
    for m, keep in enumerate(masks):
        assert_close(logits[:, m], family.ablated(model, keep, batch))


@torch.no_grad()
def test_one_member_with_all_heads_is_the_source_model(family):
    model, batch = family.build(), family.batch(6)
    hydra = family.fuse([(model, head_layout(model).all_kept())])
    assert hydra.num_shared_layers == DEPTH
    assert_close(family.run(hydra, batch)[:, 0], family.run(model, batch))


@pytest.mark.parametrize("shared", [0, 1, 2, 3])
@torch.no_grad()
def test_leading_layers_shared_by_all_members_run_once(family, shared):
    model = family.build()
    masks = member_masks(seed=3)
    for keep in masks[1:]:
        keep[:shared] = masks[0][:shared]
    if shared < DEPTH:
        masks[1][shared] = ~masks[0][shared]  # the members part ways at layer `shared`
    hydra = family.fuse([(model, k) for k in masks])
    assert hydra.num_shared_layers == shared
    streams = []  # the member axis S of each block's output: 1 while computed once
    handles = [
        b.register_forward_hook(lambda mod, args, out: streams.append(out.shape[0]))
        for b in hydra.blocks
    ]
    batch = family.batch(5)
    logits = family.run(hydra, batch)
    for handle in handles:
        handle.remove()
    assert streams == [1] * shared + [3] * (DEPTH - shared)
    for m, keep in enumerate(masks):
        assert_close(logits[:, m], family.ablated(model, keep, batch))


def fine_tuned_members(family, model) -> list[torch.nn.Module]:
    return [
        model if only is None else perturbed_copy(model, seed, only=only)
        for seed, only in enumerate(family.fine_tune)
    ]


@torch.no_grad()
def test_fine_tuned_members_use_the_averaged_mlp(family):
    model, batch = family.build(), family.batch(8)
    members = fine_tuned_members(family, model)
    masks = member_masks(seed=5)
    hydra = family.fuse(list(zip(members, masks, strict=True)))
    assert hydra.num_shared_layers == 0
    for name in family.grouped:  # held once per member
        assert operator.attrgetter(name)(hydra).groups == 3, name
    logits = family.run(hydra, batch)
    references = with_merged_mlps(members, family.mlp)
    for m, (ref, member, keep) in enumerate(zip(references, members, masks, strict=True)):
        assert_close(logits[:, m], family.ablated(ref, keep, batch))
        alone = family.ablated(member, keep, batch)
        assert not torch.allclose(logits[:, m], alone, atol=1e-3), "the merged MLP should matter"


@torch.no_grad()
def test_already_pruned_fine_tuned_members(family):
    model, batch = family.build(), family.batch(10)
    first = member_masks(seed=7)
    members = [perturbed_copy(prune_heads(model, k), seed) for seed, k in enumerate(first)]
    keeps = [head_layout(m).all_kept() for m in members]
    keeps[2][0, 0] = False  # and drop one more head of the pruned member 2
    keeps[0][2, 1] = False  # MPNet: its pruned heads map back to their position-bias columns
    hydra = family.fuse(list(zip(members, keeps, strict=True)))
    logits = family.run(hydra, batch)
    for m, (ref, keep) in enumerate(zip(with_merged_mlps(members, family.mlp), keeps, strict=True)):
        assert_close(logits[:, m], family.ablated(ref, keep, batch))


@torch.no_grad()
def test_structurally_pruned_members(family):
    """Members pruned beforehand (their own head counts per layer, one with no head left in a
    layer) and then masked further in their own numbering: each is the source model with the
    heads of both steps removed."""
    model, batch = family.build(), family.batch(4)
    prunes, masks = member_masks(), []
    pruned = [prune_heads(model, keep) for keep in prunes]
    for m, member in enumerate(pruned):
        keep = head_layout(member).all_kept()
        if m == 2:
            keep[2, 1] = False  # member 2 removes one more head of layer 2, in its own numbering
        masks.append(keep)
    assert [head_layout(p).num_heads for p in pruned] == [tuple(k.sum(1).tolist()) for k in prunes]
    hydra = family.fuse(list(zip(pruned, masks, strict=True)))
    assert isinstance(hydra, family.hydra_type)
    out = family.run(hydra, batch)
    for m, (member, keep) in enumerate(zip(pruned, masks, strict=True)):
        with ablate(member, keep):
            assert_close(out[:, m], family.run(member, batch))
    # member 0 and 1 keep all of their own heads: the source model, its heads removed
    for m in (0, 1):
        assert_close(out[:, m], family.ablated(model, prunes[m], batch))


@torch.no_grad()
def test_members_that_differ_only_in_their_mlps_are_one_stream_after_merging(family):
    model, batch = family.build(), family.batch(9)
    members = [perturbed_copy(model, seed, only=family.mlp) for seed in range(3)]
    keep = member_masks()[0]
    hydra = family.fuse([(m, keep) for m in members])
    assert hydra.num_shared_layers == DEPTH
    expected = family.ablated(with_merged_mlps(members, family.mlp)[0], keep, batch)
    logits = family.run(hydra, batch)
    for m in range(3):
        assert_close(logits[:, m], expected)


def test_gradients_flow_and_match_inference_mode(family):
    hydra = family.fuse([(family.build(), k) for k in member_masks()])
    batch = family.batch(11)
    with torch.inference_mode():
        expected = family.run(hydra, batch)
    logits = family.run(hydra, batch)
    logits.square().mean().backward()
    assert_close(logits.detach(), expected)
    assert all(p.grad is not None for p in hydra.blocks[0].parameters())


@torch.no_grad()
def test_cpu_bfloat16_autocast_runs_and_is_close(family):
    hydra = family.fuse([(family.build(**family.low_scale), k) for k in member_masks()])
    batch = family.batch(12)
    expected = family.run(hydra, batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = family.run(hydra, batch)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(
        got.float(), expected, rtol=0, atol=0.05 * expected.abs().max().item()
    )


@torch.no_grad()
def test_source_model_is_not_aliased(family):
    model = family.build()
    hydra = family.fuse([(model, k) for k in member_masks()])
    batch = family.batch(0)
    before = family.run(hydra, batch)
    for p in model.parameters():
        p.mul_(2)
    assert torch.equal(family.run(hydra, batch), before)


@pytest.mark.parametrize("fine_tuned", [False, True])
@torch.no_grad()
def test_save_and_load_round_trip(tmp_path, family, fine_tuned):
    model, masks = family.build(), member_masks()
    members = [perturbed_copy(model, s) if fine_tuned else model for s in range(3)]
    hydra = family.fuse(list(zip(members, masks, strict=True)))
    path = tmp_path / "hydra.safetensors"
    save_hydra(hydra, path, source="tiny", classes=family.classes)
    loaded = load_hydra(path)
    assert type(loaded) is type(hydra) and not loaded.training
    assert loaded.config == hydra.config
    assert loaded.num_shared_layers == hydra.num_shared_layers
    batch = family.batch(13)
    assert torch.equal(family.run(loaded, batch), family.run(hydra, batch))
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    header = json.loads(meta["hydra"])
    assert {k: header[k] for k in family.header} == family.header
    assert header["kept_heads"] == [[row.nonzero().flatten().tolist() for row in k] for k in masks]
    assert "zero_shot" not in meta
    if family.classes is None:
        assert "classes" not in meta
    else:
        assert json.loads(meta["classes"]) == list(family.classes)


def test_bad_member_lists_are_refused(family):
    model, keep = family.build(), member_masks()[0]
    with pytest.raises(ValueError, match="empty list"):
        family.fuse([])
    with pytest.raises(TypeError, match=r"member 1 must be a \(model, keep\) pair"):
        family.fuse([(model, keep), model])
    with pytest.raises(ValueError, match=rf"member 1: .*expected shape \({DEPTH}, {HEADS}\)"):
        family.fuse([(model, keep), (model, torch.ones(HEADS, DEPTH, dtype=torch.bool))])
    with pytest.raises(TypeError, match="member 0: .*dtype bool"):
        family.fuse([(model, keep.float())])


# --- members of other architectures -----------------------------------------------------------


def tower(**kwargs) -> torch.nn.Module:
    return make_tiny_clip(**kwargs).visual


#: per family: the model, then (another model, what the error names) pairs
DISAGREEMENTS = {
    "vit-token-bias": (
        make_tiny_vit,
        [
            (lambda: make_tiny_vit(embed_dim=32), "embed_dim"),
            (lambda: make_tiny_vit(depth=2), "depth"),
            (lambda: make_tiny_vit(num_heads=2), "head_dim"),
            (lambda: make_tiny_vit(num_classes=7), "num_classes"),
            (lambda: make_tiny_vit(global_pool="avg"), "global_pool"),
            (lambda: make_tiny_vit(reg_tokens=1), "num_prefix_tokens"),
            (lambda: make_tiny_vit(mlp_ratio=3.0), "mlp_hidden"),
        ],
    ),
    "text-bert": (
        tiny_bert,
        [
            (lambda: make_tiny_text("mpnet"), "kind: member 0 has 'bert', member 1 has 'mpnet'"),
            (lambda: tiny_bert(hidden_size=32), "embed_dim: member 0 has 24, member 1 has 32"),
            (lambda: tiny_bert(num_hidden_layers=3), "depth"),
            (lambda: tiny_bert(num_attention_heads=2), "head_dim"),
            (lambda: tiny_bert(num_labels=2), "num_classes"),
            (lambda: tiny_bert(vocab_size=70), "vocab_size"),
            (lambda: tiny_bert(intermediate_size=40), "mlp_hidden"),
            (
                lambda: tiny_bert(hidden_act="relu"),
                "mlp_act: member 0 has 'gelu', member 1 has 'relu'",
            ),
            (
                lambda: make_tiny_vit(),
                "the model family: member 0 is a text model, member 1 is a vit",
            ),
        ],
    ),
    "openclip-plain": (
        tower,
        [
            (lambda: tower(pool="avg"), "global_pool"),
            (lambda: tower(final_ln_after_pool=True), "final_ln_after_pool"),
            (lambda: tower(quick_gelu=True), "mlp_act"),
            (lambda: tower(width=32), "embed_dim"),
            (lambda: tower(layers=2), "depth"),
            (lambda: tower(heads=2), "head_dim"),
            (lambda: tower(embed_dim=16), "num_classes"),
        ],
    ),
}
CASES = [
    pytest.param(family_id, base, other, match, id=f"{family_id}-{match.split(':')[0]}")
    for family_id, (base, others) in DISAGREEMENTS.items()
    for other, match in others
]


@pytest.mark.parametrize("family, base, other, match", CASES, indirect=["family"])
def test_members_must_share_the_architecture(family, base, other, match):
    a, b = base(), other()
    keeps = [head_layout(m).all_kept() for m in (a, b)]
    with pytest.raises(ValueError, match=f"members disagree on {match}"):
        family.fuse(list(zip((a, b), keeps, strict=True)))
    if family.name != "text":  # the message names both members' values
        with pytest.raises(ValueError, match=f"{match}: member 0 has .*, member 1"):
            family.fuse(list(zip((a, b), keeps, strict=True)))
