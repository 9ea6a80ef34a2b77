"""Hydra fusion compared, number for number, against the members run one by one."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

from hydra_core.hydra import ensemble_probs, fuse_members, load_hydra, save_hydra
from hydra_core.hydra.fused import HydraConfig, check_fusable
from hydra_core.models.adapter import (
    UnsupportedModelError,
    ablate,
    family_of,
    head_layout,
    prune_heads,
)
from hydra_core.models.family import ModelFamily
from hydra_core.models.parts import ACTIVATIONS, FusionParts, NormParts
from hydra_core.zoo.default import VitConfig, build_vit, save_checkpoint
from tests.conftest import make_tiny_vit, random_mask

ATOL = 1e-5


def member_masks(seed: int = 0) -> list[torch.Tensor]:
    """Three different masks with unequal head counts; member 1 keeps no head in layer 1."""
    masks = [random_mask((3, 4), seed + i) for i in range(3)]
    masks[0][:, 0] = True  # at least one head somewhere, so layers are not all empty
    masks[1][1] = False
    masks[2][2] = True
    return masks


def ablated_logits(model: torch.nn.Module, keep: torch.Tensor, images: torch.Tensor):
    with ablate(model, keep):
        return model(images)


def assert_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got, expected, rtol=0, atol=ATOL)


def perturbed_copy(model: torch.nn.Module, seed: int, scale: float = 0.05, only: str = ""):
    """A stand-in for a fine-tuned member: every parameter whose name contains ``only`` nudged."""
    member = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in member.named_parameters():
            if only in name:
                p.add_(scale * torch.randn(p.shape, generator=g) * p.abs().mean())
    return member


def with_merged_mlps(members: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """The plain reference for fine-tuned fusion: each member with its MLPs replaced by the mean."""
    out = [copy.deepcopy(m) for m in members]
    with torch.no_grad():
        for layer in range(len(members[0].blocks)):
            mlps = [m.blocks[layer].mlp for m in members]
            for name, _ in mlps[0].named_parameters():
                mean = torch.stack([mlp.get_parameter(name) for mlp in mlps]).mean(0)
                for m in out:
                    m.blocks[layer].mlp.get_parameter(name).copy_(mean)
    return out


@torch.no_grad()
def test_members_differing_in_some_norms_only(images):
    model = make_tiny_vit(init_values=0.5)
    members = [
        perturbed_copy(model, 0, only="blocks.1.norm1"),
        perturbed_copy(model, 1, only="blocks.2.ls2"),
        perturbed_copy(model, 2, only="blocks.2.ls2"),
    ]
    masks = [random_mask((3, 4), 2)] * 3
    hydra = fuse_members(list(zip(members, masks, strict=True)))
    assert hydra.num_shared_layers == 1
    assert hydra.blocks[1].norm1.groups == 3 and hydra.blocks[1].qkv.groups == 1
    for m, (ref, keep) in enumerate(zip(members, masks, strict=True)):
        assert_close(hydra(images)[:, m], ablated_logits(ref, keep, images))


def test_ensemble_probs_is_the_mean_of_member_softmaxes():
    logits = torch.randn(6, 3, 5, generator=torch.Generator().manual_seed(0))
    expected = sum(logits[:, m].softmax(-1) for m in range(3)) / 3
    torch.testing.assert_close(ensemble_probs(logits), expected)
    torch.testing.assert_close(ensemble_probs(logits).sum(-1), torch.ones(6))
    with pytest.raises(ValueError, match="members, classes"):
        ensemble_probs(logits[:, 0])


@torch.no_grad()
def test_to_moves_and_casts_every_weight(images):
    model = make_tiny_vit(reg_tokens=1, init_values=0.5)
    masks = member_masks()
    hydra = fuse_members([(perturbed_copy(model, s), k) for s, k in enumerate(masks)])
    hydra = hydra.to(torch.float64)
    assert {p.dtype for p in hydra.parameters()} == {torch.float64}
    assert hydra(images.double()).dtype == torch.float64


def test_load_refuses_foreign_and_corrupt_files(tmp_path):
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00\x01not a safetensors file at all")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_hydra(garbage)
    checkpoint = tmp_path / "vit.safetensors"
    config = VitConfig(depth=1, embed_dim=24, num_heads=2)
    save_checkpoint(build_vit(config), checkpoint, config)
    with pytest.raises(ValueError, match="not a Hydra model"):
        load_hydra(checkpoint)
    with pytest.raises(FileNotFoundError):
        load_hydra(tmp_path / "missing.safetensors")


def test_load_refuses_inconsistent_files(tmp_path):
    hydra = fuse_members([(make_tiny_vit(), k) for k in member_masks()])
    state = {k: v.contiguous() for k, v in hydra.state_dict().items()}
    path = tmp_path / "h.safetensors"
    config = hydra.config.to_json()

    def write(tensors, cfg):
        save_file(tensors, str(path), metadata={"hydra": json.dumps(cfg)})

    write({k: v for k, v in state.items() if k != "blocks.1.proj.weight"}, config)
    with pytest.raises(ValueError, match="lacks the tensor 'blocks.1.proj.weight'"):
        load_hydra(path)
    write({**state, "extra": torch.zeros(1)}, config)
    with pytest.raises(ValueError, match="does not use: extra"):
        load_hydra(path)
    write(state, {**config, "version": 99})
    with pytest.raises(ValueError, match="version 99; this code reads 'hydra-fused' version 1"):
        load_hydra(path)
    write(state, {**config, "kept_heads": [[[0, 1, 2, 3]] * 3] * 3})
    with pytest.raises(ValueError, match="block 0: the weights hold"):
        load_hydra(path)


def test_header_is_the_config_as_json(tmp_path):
    """The header's fields and their order are the file format: files saved earlier must load."""
    masks = member_masks()
    hydra = fuse_members([(make_tiny_vit(reg_tokens=1), k) for k in masks])
    path = tmp_path / "h.safetensors"
    save_hydra(hydra, path)
    with safe_open(str(path), framework="pt") as f:
        header = json.loads(f.metadata()["hydra"])
    assert list(header) == [
        "format",
        "version",
        "num_members",
        "embed_dim",
        "depth",
        "head_dim",
        "num_classes",
        "global_pool",
        "num_prefix_tokens",
        "class_token",
        "reg_tokens",
        "no_embed_class",
        "pool_include_prefix",
        "pos_embed",
        "img_size",
        "patch_size",
        "in_chans",
        "mlp_act",
        "norm_eps",
        "kept_heads",
    ]
    assert header["img_size"] == [16, 16] and header["num_prefix_tokens"] == 2
    assert header["kept_heads"] == [[row.nonzero().flatten().tolist() for row in k] for k in masks]
    assert HydraConfig.from_json(header) == hydra.config


def test_load_refuses_headers_with_missing_or_unknown_fields(tmp_path):
    hydra = fuse_members([(make_tiny_vit(), k) for k in member_masks()])
    state = {k: v.contiguous() for k, v in hydra.state_dict().items()}
    path = tmp_path / "h.safetensors"
    header = hydra.config.to_json()
    del header["depth"]
    save_file(state, str(path), metadata={"hydra": json.dumps(header)})
    with pytest.raises(ValueError, match="header is malformed .*lacks the fields depth"):
        load_hydra(path)
    header = {**hydra.config.to_json(), "extra": 1}
    save_file(state, str(path), metadata={"hydra": json.dumps(header)})
    with pytest.raises(ValueError, match="unknown fields extra"):
        load_hydra(path)


def test_models_fusion_cannot_read_are_refused():
    """(The member-list errors every family shares: test_fused_contract.py.)"""
    keep = random_mask((3, 4), 0)
    with pytest.raises(UnsupportedModelError, match="member 0: .*no `blocks`"):
        fuse_members([(torch.nn.Linear(2, 2), keep)])
    with pytest.raises(UnsupportedModelError, match="q_norm"):
        fuse_members([(make_tiny_vit(qk_norm=True), keep)])


# --- the canonical parts a family hands fusion ------------------------------------------------


def layer_norm(x: torch.Tensor, norm: NormParts | None) -> torch.Tensor:
    return x if norm is None else F.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, norm.eps)


def linear(x: torch.Tensor, parts) -> torch.Tensor:
    return F.linear(x, parts.weight, parts.bias)


def attention_heads(block, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The block's attention output (B, N, d) through W_O, from its per-head Q/K/V rows."""
    if block.query is None:
        return x.new_zeros(x.shape) + (0 if block.out.bias is None else block.out.bias)
    q, k, v = (
        linear(x, lin).unflatten(-1, (block.num_heads, -1)).transpose(1, 2)  # (B, H, N, d_k)
        for lin in (block.query, block.key, block.value)
    )
    z = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # (B, H, N, d_k)
    return linear(z.transpose(1, 2).flatten(2), block.out)  # heads concatenated -> W_O


def canonical_pre_norm_outputs(parts: FusionParts, images: torch.Tensor) -> torch.Tensor:
    """The pre-norm forward that :mod:`hydra_core.models.parts` describes, written from the parts
    alone (class token, position embedding over every token, 'token' or 'avg' pooling)."""
    stem = parts.stem
    x = F.conv2d(images, stem.patch_weight, stem.patch_bias, stride=stem.patch_weight.shape[2:])
    x = layer_norm(x.flatten(2).transpose(1, 2), stem.patch_norm)  # (B, patches, d)
    x = torch.cat([stem.cls_token.expand(len(x), -1, -1), x], 1) + stem.pos_embed
    x = layer_norm(x, stem.norm_pre)
    for block in parts.blocks:
        attn = attention_heads(block, layer_norm(x, block.norm1))
        x = x + (attn if block.ls1 is None else attn * block.ls1)
        hidden = ACTIVATIONS[block.act](linear(layer_norm(x, block.norm2), block.fc1))
        mlp = linear(hidden, block.fc2)
        x = x + (mlp if block.ls2 is None else mlp * block.ls2)
    x = layer_norm(x, parts.norm)
    pooled = x[:, 0] if parts.global_pool == "token" else x[:, parts.num_prefix_tokens :].mean(1)
    return linear(layer_norm(pooled, parts.fc_norm), parts.head)


@pytest.mark.parametrize("config", [{}, {"init_values": 0.5}, {"global_pool": "avg"}])
@torch.no_grad()
def test_a_vits_parts_alone_compute_its_logits(images, config):
    model = make_tiny_vit(**config)
    for member in (model, prune_heads(model, member_masks()[1])):
        parts = family_of(member).fusion_parts(member)
        assert parts.kind == "pre-norm" and parts.num_heads == head_layout(member).num_heads
        assert_close(canonical_pre_norm_outputs(parts, images), member(images))
    qkv = model.blocks[0].attn.qkv.weight
    query = family_of(model).fusion_parts(model).blocks[0].query.weight
    assert query.data_ptr() == qkv.data_ptr()  # a view of the model's weight, not a copy


def test_a_family_without_fusion_parts_is_refused():
    class Other(ModelFamily):
        name = "other"

    with pytest.raises(UnsupportedModelError, match="member 2 cannot be fused: .*other models"):
        Other().fusion_parts(torch.nn.Linear(2, 2), "member 2")
    with pytest.raises(UnsupportedModelError, match="this model cannot be fused: .*Tanh"):
        check_fusable(make_tiny_vit(act_layer=torch.nn.Tanh))
