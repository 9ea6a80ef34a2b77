"""One canonical description of a transformer, for Hydra fusion: what every family hands
:mod:`hydra_core.hydra.fusion`, whatever it calls its modules (as TransformerLens maps every
architecture onto one per-head layout).

A family's :meth:`~hydra_core.models.family.ModelFamily.fusion_parts` reads a model into a
:class:`FusionParts`: tensors (detached, not copied), numbers and names, no modules. Two forms of
block exist, named by ``FusionParts.kind``; it is a property of the architecture, and it picks the
fused model the members become:

- ``"pre-norm"``: ``x + ls1 * W_O(attn(norm1(x)))``, then ``x + ls2 * fc2(act(fc1(norm2(x))))``;
  the stem is a :class:`PatchStem`; after the last block the tokens are normalised (``norm``),
  pooled (``global_pool``), normalised again (``fc_norm``) and mapped by ``head``;
- ``"post-norm"``: ``h = norm1(x + W_O(attn(x)))``, then ``norm2(h + fc2(act(fc1(h))))``, with a
  relative position bias added to the attention scores where a block has one; the stem is a
  :class:`TokenStem`; the class token (position 0) of the last block goes through ``pooler``,
  ``pooler_act`` and ``head``.

Per-head layout: Q, K and V are three linear layers whose weights (H * d_k, d) are head-major, so
``weight.reshape(H, d_k, d)[h]`` are head h's rows; W_O (d, H * d_k) takes the heads' outputs
concatenated, so ``weight.reshape(d, H, d_k)[:, h]`` are head h's columns. Scores are
``q k^T / sqrt(d_k)``. Dropout is left out: the parts describe the model in eval mode.

Where a model outputs embeddings that a zero-shot head turns into logits, ``zero_shot`` describes
that head (:class:`ZeroShotHead`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

#: the block forms of :class:`FusionParts` (``kind``)
BLOCK_KINDS = ("pre-norm", "post-norm")
#: pooling of a pre-norm model's tokens, by timm's names: the class token, or the mean, max or
#: mean + max of the tokens
POOLS = ("token", "avg", "max", "avgmax")
#: MLP activations by name (the name is stored in a saved Hydra model's header)
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "relu": F.relu,
    "silu": F.silu,
}
#: relative position buckets of a post-norm block's position bias: MPNet's (T5's bucketing with
#: 32 buckets up to distance 128), the one encoder with such a bias that Hydra Lab fuses
POSITION_BUCKETS = 32
POSITION_MAX_DISTANCE = 128


@dataclass(frozen=True)
class LinearParts:
    """``y = x W^T + b``: weight (out, in), bias (out,) or None."""

    weight: torch.Tensor
    bias: torch.Tensor | None

    @classmethod
    def of(cls, linear: nn.Linear) -> LinearParts:
        """An ``nn.Linear``'s weight and bias, detached."""
        bias = linear.bias
        return cls(linear.weight.detach(), None if bias is None else bias.detach())


@dataclass(frozen=True)
class NormParts:
    """A LayerNorm over the last axis: weight and bias (d,) (zeros where it has none), eps."""

    weight: torch.Tensor
    bias: torch.Tensor
    eps: float


@dataclass(frozen=True)
class PatchStem:
    """Images (B, C, H, W) -> the tokens entering block 0: a non-overlapping patch convolution
    (kernel = stride), then ``patch_norm``, prefix tokens and the position embedding, then
    ``norm_pre``.

    Args:
        img_size: (H, W), the one image size the model takes.
        patch_weight: (d, C, p_h, p_w), the convolution's weight; patch_bias (d,) or None.
        patch_norm: a LayerNorm on the patch tokens, or None.
        cls_token: (1, d), the class token, or None; reg_token: (R, d), register tokens after it,
            or None.
        pos_embed: (N_pos, d), a learned position embedding, or None.
        no_embed_class: the position embedding covers the patch tokens only (timm's
            ``no_embed_class``); else it covers the prefix tokens too.
        norm_pre: a LayerNorm on the whole stream, or None.
    """

    img_size: tuple[int, int]
    patch_weight: torch.Tensor
    patch_bias: torch.Tensor | None
    patch_norm: NormParts | None
    cls_token: torch.Tensor | None
    reg_token: torch.Tensor | None
    pos_embed: torch.Tensor | None
    no_embed_class: bool
    norm_pre: NormParts | None


@dataclass(frozen=True)
class TokenStem:
    """Token ids (B, T) -> the tokens entering block 0:
    ``norm(word[ids] + token_type + position[positions])``.

    Args:
        word: (vocab, d), the word embedding.
        position: (positions, d), the position embedding.
        token_type: (d,), token type 0's embedding, added to every token; or None.
        padding_idx: None for positions 0, 1, ...; else positions count the non-padding tokens
            from ``padding_idx + 1`` (padding itself at ``padding_idx``).
        norm: the embeddings' LayerNorm.
    """

    word: torch.Tensor
    position: torch.Tensor
    token_type: torch.Tensor | None
    padding_idx: int | None
    norm: NormParts


@dataclass(frozen=True)
class BlockParts:
    """One transformer block (pre-norm or post-norm, as :class:`FusionParts` says).

    Args:
        num_heads: H, the heads the block has now (a pruned block may have fewer, or none).
        query, key, value: (H * d_k, d) head-major weights and their biases; None when the block
            has no head.
        out: W_O, (d, H * d_k); its input is the heads' outputs concatenated.
        norm1, norm2: the LayerNorms (pre-norm: before the attention and the MLP; post-norm: after
            their residuals).
        fc1, act, fc2: the MLP; ``act`` is a key of :data:`ACTIVATIONS`.
        ls1, ls2: pre-norm: the layer scales (d,) of the attention and MLP branches, or None.
        position_bias: (buckets, H), added to head h's scores through column h, indexed by
            :func:`relative_position_buckets`; or None.
    """

    num_heads: int
    query: LinearParts | None
    key: LinearParts | None
    value: LinearParts | None
    out: LinearParts
    norm1: NormParts
    norm2: NormParts
    fc1: LinearParts
    act: str
    fc2: LinearParts
    ls1: torch.Tensor | None = None
    ls2: torch.Tensor | None = None
    position_bias: torch.Tensor | None = None


@dataclass(frozen=True)
class ZeroShotHead:
    """Logits from the model's output embeddings (..., D):
    ``logit_scale * cos(embedding, class_embeddings[c])`` for each class c.

    Args:
        class_embeddings: (C, D), normalised.
        logit_scale: a scalar tensor.
        classes: the class names, index = label.
        templates: the prompt templates the class embeddings were made from.
    """

    class_embeddings: torch.Tensor
    logit_scale: torch.Tensor
    classes: tuple[str, ...]
    templates: tuple[str, ...]


@dataclass(frozen=True)
class FusionParts:
    """A whole model in the canonical layout (see the module docstring for the forward).

    Args:
        kind: the block form, one of :data:`BLOCK_KINDS`.
        arch: the source architecture (``"vit"``, ``"bert"``, ...); a post-norm model's file
            stores it, and its members must agree on it.
        embed_dim: d, the width of the stream.
        head_dim: d_k, the width of one head.
        stem: :class:`PatchStem` (pre-norm) or :class:`TokenStem` (post-norm).
        blocks: the blocks, in order.
        head: the last linear layer, (C, d): logits, or (D, d): embeddings.
        norm: pre-norm: the LayerNorm on the tokens after the last block, or None.
        global_pool: pre-norm: one of :data:`POOLS`.
        num_prefix_tokens: pre-norm: class and register tokens ahead of the patch tokens.
        pool_include_prefix: pre-norm: avg/max pooling reads the prefix tokens too.
        fc_norm: pre-norm: the LayerNorm on the pooled token, or None.
        pooler: post-norm: the dense layer on the class token; pooler_act: the activation after
            it, "tanh" or "relu".
        zero_shot: the zero-shot head on the outputs (then embeddings), or None.
    """

    kind: str
    arch: str
    embed_dim: int
    head_dim: int
    stem: PatchStem | TokenStem
    blocks: tuple[BlockParts, ...]
    head: LinearParts
    norm: NormParts | None = None
    global_pool: str = "token"
    num_prefix_tokens: int = 1
    pool_include_prefix: bool = False
    fc_norm: NormParts | None = None
    pooler: LinearParts | None = None
    pooler_act: str | None = None
    zero_shot: ZeroShotHead | None = None

    def __post_init__(self) -> None:
        if self.kind not in BLOCK_KINDS:
            raise ValueError(f"kind must be one of {', '.join(BLOCK_KINDS)}, got {self.kind!r}")

    @property
    def num_heads(self) -> tuple[int, ...]:
        """H per layer, as the model has them now."""
        return tuple(block.num_heads for block in self.blocks)

    def norms(self) -> list[NormParts]:
        """Every LayerNorm of the model (a fused model has one eps for all)."""
        stem = self.stem
        if isinstance(stem, PatchStem):
            found = [stem.patch_norm, stem.norm_pre]
        else:
            found = [stem.norm]
        found += [n for block in self.blocks for n in (block.norm1, block.norm2)]
        return [n for n in (*found, self.norm, self.fc_norm) if n is not None]


def plain_patch_conv(conv: object) -> bool:
    """True for the patch embedding a :class:`PatchStem` describes: a non-overlapping Conv2d
    (stride = kernel, no padding, groups or dilation)."""
    return (
        isinstance(conv, nn.Conv2d)
        and conv.stride == conv.kernel_size
        and conv.groups == 1
        and conv.padding in ((0, 0), "valid")
        and conv.dilation == (1, 1)
    )


def relative_position_buckets(
    length: int,
    device: torch.device | str = "cpu",
    num_buckets: int = POSITION_BUCKETS,
    max_distance: int = POSITION_MAX_DISTANCE,
) -> torch.Tensor:
    """MPNet's (T5's) relative position buckets for a sequence of ``length``: (T, T) int64, entry
    [i, j] the bucket of key j seen from query i (as ``MPNetEncoder.relative_position_bucket``)."""
    position = torch.arange(length, dtype=torch.long, device=device)
    n = position[:, None] - position[None, :]  # -(key - query)
    half = num_buckets // 2
    ret = (n < 0).to(torch.long) * half
    n = n.abs()
    max_exact = half // 2
    large = max_exact + (
        torch.log(n.float() / max_exact) / math.log(max_distance / max_exact) * (half - max_exact)
    ).to(torch.long)
    large = large.clamp(max=half - 1)
    return ret + torch.where(n < max_exact, n, large)
