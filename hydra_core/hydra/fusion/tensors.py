"""The members' canonical parts (:mod:`hydra_core.models.parts`) -> the fused model's named tensors.

Every function takes one part from each member and returns tensors with a leading member axis S,
named as the fused model's state dict names them. :func:`~hydra_core.hydra.layers.stack_members`
stacks them: S = 1 (one copy) when every member has the same tensors, else S = M.

- heads (:func:`blocks_tensors`): a layer's Q/K/V rows and W_O columns of each member's kept heads,
  zero-padded to the largest count of that layer (a padded head adds exactly nothing); a pre-norm
  block's attention layer scale is folded into W_O, ``g(W z + b) = (gW) z + gb``; a relative
  position bias keeps the kept heads' columns, zero-padded like the heads;
- the merged MLP (:func:`merged_mlp`, the paper's): weights and biases averaged over members
  (member 0's when all are equal, so zero-shot fusion reproduces every member);
- stems (:func:`patch_stem_tensors`, :func:`token_stem_tensors`) are shared only as a whole;
- LayerNorms (:func:`norm_tensors`) and linear layers (:func:`linear_tensors`) stacked.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hydra_core.hydra.layers import merged_mlp_tensors, stack_members
from hydra_core.models.family import UnsupportedModelError
from hydra_core.models.parts import (
    BlockParts,
    FusionParts,
    LinearParts,
    NormParts,
    PatchStem,
    TokenStem,
)


def _bias(linear: LinearParts) -> torch.Tensor:
    """A linear layer's bias; zeros where it has none."""
    weight = linear.weight
    return weight.new_zeros(weight.shape[:1]) if linear.bias is None else linear.bias


def norm_tensors(name: str, norms: Sequence[NormParts | None]) -> dict[str, torch.Tensor]:
    """The members' LayerNorms (or None, then nothing) stacked as ``{name}.weight/bias``."""
    if all(n is None for n in norms):
        return {}
    if any(n is None for n in norms):
        raise UnsupportedModelError(f"some members have a `{name}` LayerNorm and some do not")
    weight, bias = stack_members([(n.weight, n.bias) for n in norms])
    return {f"{name}.weight": weight, f"{name}.bias": bias}


def linear_tensors(
    names: Sequence[str], per_member: Sequence[Sequence[LinearParts]]
) -> dict[str, torch.Tensor]:
    """Linear layers (one per name, from each member), stacked together for the fused model's
    :class:`~hydra_core.hydra.layers.GroupedLinear` layers: ``{name}.weight`` (S, in, out) and
    ``{name}.bias`` (S, 1, out), zeros where a layer has none. Shared only all together."""
    stacked = stack_members(
        [
            tuple(t for linear in linears for t in (linear.weight.t(), _bias(linear)))
            for linears in per_member
        ]
    )  # per name: weight (S, in, out), bias (S, out)
    tensors = {}
    for name, weight, bias in zip(names, stacked[0::2], stacked[1::2], strict=True):
        tensors[f"{name}.weight"], tensors[f"{name}.bias"] = weight, bias[:, None]
    return tensors


def patch_stem_tensors(stems: Sequence[PatchStem]) -> dict[str, torch.Tensor]:
    """Patch embedding, prefix tokens, position embedding and the stem's norms, stacked. The stem is
    shared only as a whole: if any part differs between members, every part is per member."""
    names = ("patch_weight", "patch_bias", "cls_token", "reg_token", "pos_embed")
    per_member = [tuple(getattr(s, n) for n in names) for s in stems]
    stacked = zip(names, stack_members(per_member), strict=True)
    tensors = {f"stem.{n}": t for n, t in stacked if t is not None}
    tensors.update(norm_tensors("stem.patch_norm", [s.patch_norm for s in stems]))
    tensors.update(norm_tensors("stem.norm_pre", [s.norm_pre for s in stems]))
    if len({t.shape[0] for t in tensors.values()}) > 1:
        tensors = {k: t.expand(len(stems), *t.shape[1:]).clone() for k, t in tensors.items()}
    return tensors


def token_stem_tensors(stems: Sequence[TokenStem]) -> dict[str, torch.Tensor]:
    """Word, position and token type embeddings and their norm, stacked; shared only as a whole."""
    names = ("word", "position", "token_type", "norm.weight", "norm.bias")
    per_member = [(s.word, s.position, s.token_type, s.norm.weight, s.norm.bias) for s in stems]
    stacked = zip(names, stack_members(per_member), strict=True)
    return {f"embeddings.{n}": t for n, t in stacked if t is not None}


def blocks_tensors(
    parts: Sequence[FusionParts], heads: Sequence[Sequence[torch.Tensor]], dk: int
) -> dict[str, torch.Tensor]:
    """Every layer's fused weights from each member's blocks and, per member and layer, the
    indices of its kept heads (in its own numbering)."""
    tensors = {}
    for layer in range(len(parts[0].blocks)):
        blocks = [p.blocks[layer] for p in parts]
        tensors.update(block_tensors(layer, blocks, [h[layer] for h in heads], dk))
    return tensors


def block_tensors(
    layer: int, blocks: Sequence[BlockParts], heads: Sequence[torch.Tensor], dk: int
) -> dict[str, torch.Tensor]:
    """One layer's fused weights from each member's block and kept heads (in its own numbering)."""
    d = blocks[0].out.weight.shape[0]
    h_max = max(len(h) for h in heads)
    qkv_bias = any(
        linear is not None and linear.bias is not None
        for block in blocks
        for linear in (block.query, block.key, block.value)
    )
    proj_bias = any(block.out.bias is not None for block in blocks)
    attn, position, norm1, norm2, ls2 = [], [], [], [], []
    for block, kept in zip(blocks, heads, strict=True):
        n, h = block.num_heads, len(kept)
        out = block.out.weight  # (d, n * d_k)
        # Q/K/V rows of the kept heads, zero-padded to h_max heads
        qkv_w = out.new_zeros(3, h_max, dk, d)
        qkv_b = out.new_zeros(3, h_max, dk)
        if h:
            for i, linear in enumerate((block.query, block.key, block.value)):
                qkv_w[i, :h] = linear.weight.reshape(n, dk, d)[kept]
                if linear.bias is not None:
                    qkv_b[i, :h] = linear.bias.reshape(n, dk)[kept]
        # W_O columns of the kept heads, padded; layer scale folded in: g(W z + b) = (gW) z + gb
        proj_w = out.new_zeros(d, h_max, dk)
        proj_w[:, :h] = out.reshape(d, n, dk)[:, kept]
        proj_b = _bias(block.out)
        if block.ls1 is not None:
            proj_w = proj_w * block.ls1[:, None, None]
            proj_b = proj_b * block.ls1
        attn.append(
            (
                qkv_w.reshape(3 * h_max * dk, d).t() if h_max else None,  # (d, 3*h_max*d_k)
                qkv_b.reshape(1, -1) if qkv_bias and h_max else None,  # (1, 3*h_max*d_k)
                proj_w.reshape(d, h_max * dk).t(),  # (h_max*d_k, d)
                proj_b[None] if proj_bias else None,  # (1, d)
            )
        )
        if block.position_bias is not None and h_max:
            table = block.position_bias  # (buckets, n)
            bias = table.new_zeros(table.shape[0], h_max)
            bias[:, :h] = table[:, kept]
            position.append((bias,))
        norm1.append((block.norm1.weight, block.norm1.bias))
        norm2.append((block.norm2.weight, block.norm2.bias))
        ls2.append((block.ls2,))
    if len({g is None for (g,) in ls2}) > 1:
        raise UnsupportedModelError(
            f"block {layer}: some members scale their MLP output (layer scale) and some do not"
        )
    names = ("qkv.weight", "qkv.bias", "proj.weight", "proj.bias")
    tensors = dict(zip(names, stack_members(attn), strict=True))
    if position:
        (tensors["position_bias"],) = stack_members(position)
    tensors["norm1.weight"], tensors["norm1.bias"] = stack_members(norm1)
    tensors["norm2.weight"], tensors["norm2.bias"] = stack_members(norm2)
    (tensors["ls2"],) = stack_members(ls2)
    tensors.update(merged_mlp(blocks))
    return {f"blocks.{layer}.{k}": v for k, v in tensors.items() if v is not None}


def merged_mlp(blocks: Sequence[BlockParts]) -> dict[str, torch.Tensor | None]:
    """The paper's merged MLP: weights and biases averaged over members (member 0's if equal)."""
    per_member = [(b.fc1.weight, b.fc1.bias, b.fc2.weight, b.fc2.bias) for b in blocks]
    try:
        return merged_mlp_tensors(per_member)
    except ValueError as error:
        raise UnsupportedModelError(str(error)) from None


def kept_head_indices(keep: torch.Tensor, num_heads: Sequence[int]) -> list[torch.Tensor]:
    """Per layer, the indices of the heads a validated mask keeps (in the model's own numbering)."""
    return [keep[layer, :n].nonzero().flatten() for layer, n in enumerate(num_heads)]
