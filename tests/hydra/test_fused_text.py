"""Hydra fusion of text encoders compared, number for number, against the members run one by one,
on tiny random BERT, RoBERTa, MPNet and DistilBERT classifiers with ragged masks (fp32, 1e-5)."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch
from safetensors import safe_open

from hydra_core.hydra import HydraText, ensemble_probs, fuse_members, load_hydra, save_hydra
from hydra_core.hydra.fused import check_fusable
from hydra_core.models.adapter import (
    UnsupportedModelError,
    ablate,
    family_of,
    head_layout,
    prune_heads,
)
from hydra_core.models.parts import ACTIVATIONS, FusionParts, relative_position_buckets
from hydra_core.models.text import TextClassifier, pack
from tests.conftest import TEXT_KINDS, make_tiny_text, make_tiny_vit, random_mask, text_batch
from tests.hydra.test_fused import attention_heads, layer_norm, linear

ATOL = 1e-5
DEPTH = 3
#: a block's MLP parameters, by their Hugging Face names (the plain reference below edits them)
MLP = re.compile(r"layer\.(\d+)\.(intermediate\.dense|output\.dense|ffn\.lin1|ffn\.lin2)\.")


@pytest.fixture(params=TEXT_KINDS)
def kind(request) -> str:
    return request.param


def make_model(kind: str, **kwargs):
    """A tiny random classifier of ``DEPTH`` layers whose output layer is scaled up, so that its
    logits are of order 1 and a 1e-5 comparison is a strict one."""
    model = make_tiny_text(kind, depth=DEPTH, **kwargs)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in ("classifier.weight", "classifier.out_proj.weight"):
                p.mul_(20)
    return model


def member_masks(seed: int = 0) -> list[torch.Tensor]:
    """Three different masks with unequal head counts; member 1 keeps no head in layer 1."""
    masks = [random_mask((DEPTH, 4), seed + i) for i in range(3)]
    masks[0][:, 0] = True
    masks[1][1] = False
    masks[2][2] = True
    return masks


def member_logits(model, keep, ids, mask) -> torch.Tensor:
    """The plain reference: the member run alone, its heads switched off by ``ablate``."""
    with ablate(model, keep):
        return model(input_ids=ids, attention_mask=mask).logits


def assert_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got, expected, rtol=0, atol=ATOL)


def perturbed_copy(model, seed: int, scale: float = 0.05, only: str = ""):
    """A stand-in for a fine-tuned member: every parameter whose name matches ``only`` nudged."""
    member = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in member.named_parameters():
            if re.search(only, name):
                p.add_(scale * torch.randn(p.shape, generator=g) * p.abs().mean())
    return member


def with_merged_mlps(members: list) -> list:
    """Each member with every block's MLP replaced by the members' mean: what fusion computes."""
    out = [copy.deepcopy(m) for m in members]
    params = [dict(m.named_parameters()) for m in members]
    with torch.no_grad():
        for name in params[0]:
            if MLP.search(name):
                mean = torch.stack([p[name] for p in params]).mean(0)
                for m in out:
                    m.get_parameter(name).copy_(mean)
    return out


@torch.no_grad()
def test_zero_shot_members_equal_ablated_and_pruned_members(kind):
    model = make_model(kind)
    ids, mask = text_batch(seed=1)
    masks = member_masks()
    hydra = fuse_members([(model, k) for k in masks])
    assert isinstance(hydra, HydraText)
    logits = hydra(input_ids=ids, attention_mask=mask)
    assert logits.shape == (6, 3, 3)
    for m, keep in enumerate(masks):
        assert_close(logits[:, m], member_logits(model, keep, ids, mask))
        pruned = prune_heads(model, keep)
        assert_close(logits[:, m], pruned(input_ids=ids, attention_mask=mask).logits)
    assert not torch.allclose(logits[:, 0], logits[:, 1], atol=1e-3), "members should differ"
    assert hydra.member_head_counts() == [k.sum(1).tolist() for k in masks]
    assert ensemble_probs(logits).shape == (6, 3)


@torch.no_grad()
def test_packed_inputs_and_wrapped_members_give_the_same_logits(kind):
    model = make_model(kind)
    ids, mask = text_batch(seed=2)
    masks = member_masks(seed=4)
    hydra = fuse_members([(model, k) for k in masks])
    expected = hydra(input_ids=ids, attention_mask=mask)
    assert torch.equal(hydra(pack(ids, mask)), expected)
    wrapped = fuse_members([(TextClassifier(model), k) for k in masks])
    assert torch.equal(wrapped(pack(ids, mask)), expected)
    # no mask: every token is real
    assert_close(hydra(input_ids=ids)[:, 0], member_logits(model, masks[0], ids, None))


@torch.no_grad()
def test_padding_never_changes_a_result(kind):
    model = make_model(kind)
    hydra = fuse_members([(model, k) for k in member_masks(seed=8)])
    ids, mask = text_batch(seed=3)
    expected = hydra(input_ids=ids, attention_mask=mask)
    extra = torch.ones(len(ids), 7, dtype=ids.dtype)  # more padding columns (id 1)
    padded = hydra(
        input_ids=torch.cat([ids, extra], 1),
        attention_mask=torch.cat([mask, torch.zeros_like(extra)], 1),
    )
    assert_close(padded, expected)
    for i in (1, 2):  # one sample alone gives what it gives in the padded batch
        n = int(mask[i].sum())
        alone = hydra(input_ids=ids[i : i + 1, :n], attention_mask=mask[i : i + 1, :n])
        assert_close(alone, expected[i : i + 1])


@pytest.mark.parametrize("shared", [0, 1, 2, 3])
@pytest.mark.parametrize("source", ["bert", "mpnet"])
@torch.no_grad()
def test_leading_layers_shared_by_all_members_run_once(source, shared):
    model = make_model(source)
    masks = member_masks(seed=3)
    for keep in masks[1:]:
        keep[:shared] = masks[0][:shared]
    if shared < DEPTH:
        masks[1][shared] = ~masks[0][shared]  # the members part ways at layer `shared`
    hydra = fuse_members([(model, k) for k in masks])
    assert hydra.num_shared_layers == shared
    streams = []  # the member axis S of each block's output: 1 while computed once
    handles = [
        b.register_forward_hook(lambda mod, args, out: streams.append(out.shape[0]))
        for b in hydra.blocks
    ]
    ids, mask = text_batch(seed=5)
    logits = hydra(input_ids=ids, attention_mask=mask)
    for handle in handles:
        handle.remove()
    assert streams == [1] * shared + [3] * (DEPTH - shared)
    for m, keep in enumerate(masks):
        assert_close(logits[:, m], member_logits(model, keep, ids, mask))


@torch.no_grad()
def test_one_member_with_all_heads_is_the_source_model(kind):
    model = make_model(kind)
    hydra = fuse_members([(model, head_layout(model).all_kept())])
    assert hydra.num_shared_layers == DEPTH
    ids, mask = text_batch(seed=6)
    expected = model(input_ids=ids, attention_mask=mask).logits
    assert_close(hydra(input_ids=ids, attention_mask=mask)[:, 0], expected)


@torch.no_grad()
def test_layer_where_no_member_keeps_a_head(kind):
    model = make_model(kind)
    masks = member_masks(seed=2)
    for keep in masks:
        keep[1] = False
    hydra = fuse_members([(model, k) for k in masks])
    assert hydra.blocks[1].max_heads == 0
    ids, mask = text_batch(seed=7)
    logits = hydra(input_ids=ids, attention_mask=mask)
    for m, keep in enumerate(masks):
        assert_close(logits[:, m], member_logits(model, keep, ids, mask))


@torch.no_grad()
def test_fine_tuned_members_use_the_averaged_mlp(kind):
    model = make_model(kind)
    members = [
        model,
        perturbed_copy(model, 1, only=r"layer\.|LayerNorm|layer_norm"),  # MLPs and norms
        perturbed_copy(model, 2),  # everything: embeddings, position bias, classifier too
    ]
    masks = member_masks(seed=5)
    hydra = fuse_members(list(zip(members, masks, strict=True)))
    assert hydra.num_shared_layers == 0
    assert hydra.embeddings.groups == 3 and hydra.classifier.groups == 3
    assert hydra.blocks[0].norm1.groups == 3
    ids, mask = text_batch(seed=8)
    logits = hydra(input_ids=ids, attention_mask=mask)
    for m, (ref, keep) in enumerate(zip(with_merged_mlps(members), masks, strict=True)):
        assert_close(logits[:, m], member_logits(ref, keep, ids, mask))
    alone = member_logits(members[1], masks[1], ids, mask)
    assert not torch.allclose(logits[:, 1], alone, atol=1e-3), "the merged MLP should matter"


@torch.no_grad()
def test_members_that_differ_only_in_their_mlps_are_one_stream_after_merging(kind):
    model = make_model(kind)
    members = [perturbed_copy(model, seed, only=MLP.pattern) for seed in range(3)]
    keep = member_masks()[0]
    hydra = fuse_members([(m, keep) for m in members])
    assert hydra.num_shared_layers == DEPTH
    ids, mask = text_batch(seed=9)
    expected = member_logits(with_merged_mlps(members)[0], keep, ids, mask)
    logits = hydra(input_ids=ids, attention_mask=mask)
    for m in range(3):
        assert_close(logits[:, m], expected)


@torch.no_grad()
def test_members_differing_only_in_mpnets_position_bias():
    model = make_model("mpnet")
    members = [
        perturbed_copy(model, s, scale=0.5, only="relative_attention_bias") for s in range(3)
    ]
    keep = member_masks()[0]
    hydra = fuse_members([(m, keep) for m in members])
    assert hydra.blocks[0].qkv.groups == 1 and hydra.blocks[0].position_bias.shape[0] == 3
    assert hydra.num_shared_layers == 0
    ids, mask = text_batch(seed=14)
    logits = hydra(input_ids=ids, attention_mask=mask)
    for m, member in enumerate(members):
        assert_close(logits[:, m], member_logits(member, keep, ids, mask))
    assert not torch.allclose(logits[:, 0], logits[:, 1], atol=1e-4)


@torch.no_grad()
def test_already_pruned_fine_tuned_members(kind):
    model = make_model(kind)
    first = member_masks(seed=7)
    members = [perturbed_copy(prune_heads(model, k), seed) for seed, k in enumerate(first)]
    keeps = [head_layout(m).all_kept() for m in members]
    keeps[2][0, 0] = False  # and drop one more head of the pruned member 2
    keeps[0][2, 1] = False  # MPNet: its pruned heads map back to their position-bias columns
    hydra = fuse_members(list(zip(members, keeps, strict=True)))
    ids, mask = text_batch(seed=10)
    logits = hydra(input_ids=ids, attention_mask=mask)
    for m, (ref, keep) in enumerate(zip(with_merged_mlps(members), keeps, strict=True)):
        assert_close(logits[:, m], member_logits(ref, keep, ids, mask))


def test_gradients_flow_and_match_inference_mode():
    model = make_model("mpnet")
    hydra = fuse_members([(model, k) for k in member_masks()])
    ids, mask = text_batch(seed=11)
    with torch.inference_mode():
        expected = hydra(input_ids=ids, attention_mask=mask)
    logits = hydra(input_ids=ids, attention_mask=mask)
    logits.square().mean().backward()
    assert_close(logits.detach(), expected)
    assert all(p.grad is not None for p in hydra.blocks[0].parameters())


@torch.no_grad()
def test_cpu_bfloat16_autocast_runs_and_is_close():
    model = make_model("mpnet", scale=1.0)
    hydra = fuse_members([(model, k) for k in member_masks()])
    ids, mask = text_batch(seed=12)
    expected = hydra(input_ids=ids, attention_mask=mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = hydra(input_ids=ids, attention_mask=mask)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(
        got.float(), expected, rtol=0, atol=0.05 * expected.abs().max().item()
    )


@torch.no_grad()
def test_source_model_is_not_aliased():
    model = make_model("bert")
    hydra = fuse_members([(model, k) for k in member_masks()])
    ids, mask = text_batch()
    before = hydra(input_ids=ids, attention_mask=mask)
    for p in model.parameters():
        p.mul_(2)
    assert torch.equal(hydra(input_ids=ids, attention_mask=mask), before)


def test_relative_position_buckets_are_mpnets():
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    n = 300
    position = torch.arange(n)
    relative = position[None, :] - position[:, None]  # key - query, as MPNet computes it
    expected = MPNetEncoder.relative_position_bucket(relative, num_buckets=32)
    assert torch.equal(relative_position_buckets(n), expected)


@pytest.mark.parametrize("fine_tuned", [False, True])
@torch.no_grad()
def test_save_and_load_round_trip(tmp_path, kind, fine_tuned):
    model = make_model(kind)
    masks = member_masks()
    members = [perturbed_copy(model, s) if fine_tuned else model for s in range(3)]
    hydra = fuse_members(list(zip(members, masks, strict=True)))
    path = tmp_path / "hydra.safetensors"
    save_hydra(hydra, path, source="tiny", classes=["a", "b", "c"])
    loaded = load_hydra(path)
    assert isinstance(loaded, HydraText)
    assert loaded.config == hydra.config
    assert loaded.num_shared_layers == hydra.num_shared_layers
    ids, mask = text_batch(seed=13)
    assert torch.equal(
        loaded(input_ids=ids, attention_mask=mask), hydra(input_ids=ids, attention_mask=mask)
    )
    with safe_open(str(path), framework="pt") as f:
        header = json.loads(f.metadata()["hydra"])
    assert (header["format"], header["version"], header["kind"]) == ("hydra-fused-text", 1, kind)
    assert header["kept_heads"] == [[row.nonzero().flatten().tolist() for row in k] for k in masks]


def test_load_refuses_inconsistent_text_files(tmp_path):
    from safetensors.torch import save_file

    hydra = fuse_members([(make_model("mpnet"), k) for k in member_masks()])
    state = {k: v.contiguous() for k, v in hydra.state_dict().items()}
    path = tmp_path / "h.safetensors"
    config = hydra.config.to_json()

    def write(tensors, cfg):
        save_file(tensors, str(path), metadata={"hydra": json.dumps(cfg)})

    write({k: v for k, v in state.items() if k != "blocks.0.position_bias"}, config)
    with pytest.raises(ValueError, match="lacks the tensor 'blocks.0.position_bias'"):
        load_hydra(path)
    write(state, {**config, "version": 7})
    with pytest.raises(ValueError, match="version 7; this code reads 'hydra-fused-text' version 1"):
        load_hydra(path)
    write(state, {**config, "format": "other"})
    with pytest.raises(ValueError, match="'hydra-fused' version 1 or 'hydra-fused-text'"):
        load_hydra(path)
    write(state, {**config, "vocab_size": 61})
    with pytest.raises(ValueError, match=r"embeddings.word has shape \(1, 60, 24\)"):
        load_hydra(path)


def tiny_bert(**overrides):
    import transformers

    torch.manual_seed(0)
    config = dict(
        vocab_size=60,
        max_position_embeddings=40,
        num_labels=3,
        pad_token_id=1,
        hidden_size=24,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
    )
    config.update(overrides)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(**config))
    return model.eval()


@pytest.mark.parametrize(
    "other, match",
    [
        (lambda: make_tiny_text("mpnet"), "kind: member 0 has 'bert', member 1 has 'mpnet'"),
        (lambda: tiny_bert(hidden_size=32), "embed_dim: member 0 has 24, member 1 has 32"),
        (lambda: tiny_bert(num_hidden_layers=3), "depth"),
        (lambda: tiny_bert(num_attention_heads=2), "head_dim"),
        (lambda: tiny_bert(num_labels=2), "num_classes"),
        (lambda: tiny_bert(vocab_size=70), "vocab_size"),
        (lambda: tiny_bert(intermediate_size=40), "mlp_hidden"),
        (lambda: tiny_bert(hidden_act="relu"), "mlp_act: member 0 has 'gelu', member 1 has 'relu'"),
        (lambda: make_tiny_vit(), "the model family: member 0 is a text model, member 1 is a vit"),
    ],
)
def test_members_must_share_the_architecture(other, match):
    a, b = tiny_bert(), other()
    with pytest.raises(ValueError, match=f"members disagree on {match}"):
        fuse_members([(a, head_layout(a).all_kept()), (b, head_layout(b).all_kept())])


def test_check_fusable_accepts_text_models(kind):
    model = make_tiny_text(kind)
    check_fusable(model)
    check_fusable(TextClassifier(model))
    check_fusable(prune_heads(model, random_mask((2, 4), 0)))
    with pytest.raises(UnsupportedModelError, match="MLP activation"):
        check_fusable(tiny_bert(hidden_act="mish"))


def test_bad_member_lists_are_refused():
    model = make_tiny_text("bert")
    keep = random_mask((2, 4), 0)
    with pytest.raises(ValueError, match=r"member 1: .*expected shape \(2, 4\)"):
        fuse_members([(model, keep), (model, torch.ones(4, 2, dtype=torch.bool))])
    with pytest.raises(TypeError, match="member 0: .*dtype bool"):
        fuse_members([(model, keep.float())])
    hydra = fuse_members([(model, keep)])
    with pytest.raises(ValueError, match="pass packed inputs"):
        hydra()


def canonical_post_norm_logits(
    parts: FusionParts, ids: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """The post-norm forward that :mod:`hydra_core.models.parts` describes, written from the
    parts alone."""
    stem = parts.stem
    n = ids.shape[1]
    if stem.padding_idx is None:
        positions = torch.arange(n)[None]  # (1, N)
    else:
        real = ids.ne(stem.padding_idx).long()
        positions = real.cumsum(1) * real + stem.padding_idx  # (B, N)
    x = stem.word[ids] + stem.position[positions]
    if stem.token_type is not None:
        x = x + stem.token_type
    x = layer_norm(x, stem.norm)
    padding = torch.zeros(mask.shape).masked_fill(~mask.bool(), torch.finfo(x.dtype).min)
    for block in parts.blocks:
        bias = padding[:, None, None]  # (B, 1, 1, N)
        if block.position_bias is not None:
            buckets = relative_position_buckets(n, num_buckets=block.position_bias.shape[0])
            bias = bias + block.position_bias[buckets].permute(2, 0, 1)  # (H, N, N)
        x = layer_norm(x + attention_heads(block, x, bias), block.norm1)
        hidden = ACTIVATIONS[block.act](linear(x, block.fc1))
        x = layer_norm(x + linear(hidden, block.fc2), block.norm2)
    act = {"tanh": torch.tanh, "relu": torch.relu}[parts.pooler_act]
    return linear(act(linear(x[:, 0], parts.pooler)), parts.head)


@torch.no_grad()
def test_a_text_models_parts_alone_compute_its_logits(kind):
    model = make_model(kind)
    ids, mask = text_batch(seed=1)
    for member in (model, prune_heads(model, member_masks()[1])):
        parts = family_of(member).fusion_parts(member)
        assert parts.kind == "post-norm" and parts.arch == kind
        assert parts.num_heads == head_layout(member).num_heads
        expected = member(input_ids=ids, attention_mask=mask).logits
        assert_close(canonical_post_norm_logits(parts, ids, mask), expected)
