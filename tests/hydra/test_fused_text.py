"""Hydra fusion of text encoders compared, number for number, against the members run one by one,
on tiny random BERT, RoBERTa, MPNet and DistilBERT classifiers with ragged masks (fp32, 1e-5)."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch

from hydra_core.hydra import fuse_members, load_hydra
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
from tests.conftest import TEXT_KINDS, make_tiny_text, random_mask, text_batch
from tests.families import tiny_bert
from tests.hydra.test_fused import attention_heads, layer_norm, linear

ATOL = 1e-5
DEPTH = 3


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


def test_relative_position_buckets_are_mpnets():
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    n = 300
    position = torch.arange(n)
    relative = position[None, :] - position[:, None]  # key - query, as MPNet computes it
    expected = MPNetEncoder.relative_position_bucket(relative, num_buckets=32)
    assert torch.equal(relative_position_buckets(n), expected)


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


def test_check_fusable_accepts_text_models(kind):
    model = make_tiny_text(kind)
    check_fusable(model)
    check_fusable(TextClassifier(model))
    check_fusable(prune_heads(model, random_mask((2, 4), 0)))
    with pytest.raises(UnsupportedModelError, match="MLP activation"):
        check_fusable(tiny_bert(hidden_act="mish"))


def test_a_text_hydra_without_inputs_is_refused():
    """(The member-list errors every family shares: test_fused_contract.py.)"""
    model = make_tiny_text("bert")
    keep = random_mask((2, 4), 0)
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
