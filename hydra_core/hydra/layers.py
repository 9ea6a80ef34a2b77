"""Building blocks of the fused Hydra model: each weight carries a leading member axis S.

S is 1 when every member shares the weight and M when each member has its own; a token stream
laid out ``(S_x, B, N, d)`` meets a weight with S = M by broadcasting, so a stream shared so far
splits into M member streams at the first per-member weight.

- :class:`StackedLayerNorm`: LayerNorm with per-member (or shared) weight and bias;
- :class:`GroupedLinear`: ``y[m] = x[m] @ W[m] + b[m]``, one batched matrix multiply;
- :class:`MergedMlp`: one MLP (the members' MLPs averaged) for every stream;
- :class:`FusedBlock`: a transformer block (pre-norm as timm's, or post-norm as BERT's) running
  every member's heads in one attention, optionally with an additive attention bias;
- :class:`Stem`: patch embedding, prefix tokens and position embedding;
- :func:`stack_members`: per-member tensors stacked on the member axis, S = 1 when all are equal.

:class:`~hydra_core.hydra.fusion.pre_norm.HydraViT` and
:class:`~hydra_core.hydra.fusion.post_norm.HydraText` are composed from these.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from hydra_core.models.parts import ACTIVATIONS

#: in-place versions of :data:`~hydra_core.models.parts.ACTIVATIONS` (the MLP activations by
#: name), used when no gradient is recorded (they overwrite their input)
ACTIVATIONS_INPLACE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": torch.ops.aten.gelu_,
    "gelu_tanh": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "quick_gelu": lambda x: x.mul_(torch.sigmoid(1.702 * x)),
    "relu": torch.relu_,
    "silu": lambda x: F.silu(x, inplace=True),
}


def merged_mlp_tensors(
    per_member: list[tuple[torch.Tensor | None, ...]],
) -> dict[str, torch.Tensor | None]:
    """The paper's merged MLP from each member's (fc1 weight, fc1 bias, fc2 weight, fc2 bias):
    weights and biases averaged over members (member 0's when all are equal), named for
    :class:`MergedMlp`."""
    if len({tuple(t is None for t in parts) for parts in per_member}) > 1:
        raise ValueError("members disagree on whether their MLP layers have biases")
    names = ("fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")
    # a single (shared) copy averages to itself exactly
    merged = (None if t is None else t.mean(dim=0) for t in stack_members(per_member))
    return {f"mlp.{n}": t for n, t in zip(names, merged, strict=True)}


def stack_members(
    per_member: list[tuple[torch.Tensor | None, ...]],
) -> tuple[torch.Tensor | None, ...]:
    """Per-member tuples of tensors -> the same tuple with a leading member axis S on each tensor.

    S = 1 (one copy) when every member has identical tensors, else S = M. Tensors are copied, so the
    fused model never aliases a member's weights."""
    first = per_member[0]

    def same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
        if a is None or b is None:
            return a is b
        return a.shape == b.shape and torch.equal(a, b)

    if all(same(a, b) for other in per_member[1:] for a, b in zip(first, other, strict=True)):
        contiguous = torch.contiguous_format
        return tuple(
            None if t is None else t.detach().clone(memory_format=contiguous)[None] for t in first
        )
    return tuple(
        None if parts[0] is None else torch.stack([t.detach() for t in parts])
        for parts in zip(*per_member, strict=True)
    )


class StackedLayerNorm(nn.Module):
    """LayerNorm on the last axis; weight and bias (S, d), per member (S = M) or shared (S = 1)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> None:
        super().__init__()
        if weight.ndim != 2 or weight.shape != bias.shape:
            raise ValueError(
                f"norm weight and bias must both be (S, d), got {tuple(weight.shape)} "
                f"and {tuple(bias.shape)}"
            )
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias)
        self.eps = eps

    @property
    def groups(self) -> int:
        """S: 1 when the members share this layer's weights, M otherwise."""
        return self.weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (S_x, ..., d) -> (max(S, S_x), ..., d)."""
        s, d = self.weight.shape
        if s == 1:
            return F.layer_norm(x, (d,), self.weight[0], self.bias[0], self.eps)
        shape = (s,) + (1,) * (x.ndim - 2) + (d,)  # one row per member, broadcast over the rest
        normed = F.layer_norm(x, (d,), eps=self.eps)
        return torch.addcmul(self.bias.view(shape), normed, self.weight.view(shape))


class GroupedLinear(nn.Module):
    """Grouped fully-connected layer: ``y[m] = x[m] @ weight[m] + bias[m]``.

    Member m's rows meet only member m's weights. ``weight`` is (S, in, out) - stored transposed, as
    ``bmm`` wants it - and ``bias`` (S, 1, out) or None. With S = 1 every member uses the same
    weights and all rows go through one matrix multiply.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        bias_shape = None if bias is None else tuple(bias.shape)
        if weight.ndim != 3 or bias_shape not in (None, (weight.shape[0], 1, weight.shape[2])):
            raise ValueError(
                "grouped weight must be (S, in, out) with bias (S, 1, out), got "
                f"{tuple(weight.shape)} and {bias_shape}"
            )
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)

    @property
    def groups(self) -> int:
        """S: 1 when the members share this layer's weights, M otherwise."""
        return self.weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (S_x, T, in) -> (max(S, S_x), T, out)."""
        s, _, out = self.weight.shape
        if s == 1:  # one weight for every member: a single GEMM over all rows
            rows = x.flatten(0, 1)  # (S_x * T, in)
            w = self.weight[0]
            y = rows @ w if self.bias is None else torch.addmm(self.bias[0], rows, w)
            return y.view(*x.shape[:-1], out)
        x = x.expand(s, *x.shape[1:])  # a stream still shared by all members meets member weights
        if self.bias is None:
            return torch.bmm(x, self.weight)
        return torch.baddbmm(self.bias, x, self.weight)


class MergedMlp(nn.Module):
    """The members' MLPs averaged into one (paper: "Merged MLP"), applied to all streams at once.

    Args:
        fc1_weight, fc1_bias: the first linear layer, (hidden, d) and (hidden,) or None.
        fc2_weight, fc2_bias: the second linear layer, (d, hidden) and (d,) or None.
        act: the activation between them, a key of :data:`ACTIVATIONS`.
    """

    def __init__(
        self,
        fc1_weight: torch.Tensor,
        fc1_bias: torch.Tensor | None,
        fc2_weight: torch.Tensor,
        fc2_bias: torch.Tensor | None,
        act: str,
    ) -> None:
        super().__init__()
        if act not in ACTIVATIONS:
            raise ValueError(f"unknown MLP activation {act!r}; known: {', '.join(ACTIVATIONS)}")
        self.fc1_weight = nn.Parameter(fc1_weight)  # (hidden, d)
        self.fc1_bias = None if fc1_bias is None else nn.Parameter(fc1_bias)
        self.fc2_weight = nn.Parameter(fc2_weight)  # (d, hidden)
        self.fc2_bias = None if fc2_bias is None else nn.Parameter(fc2_bias)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., d) -> (..., d), every stream through the same weights."""
        h = F.linear(x, self.fc1_weight, self.fc1_bias)  # (..., hidden)
        act = ACTIVATIONS if torch.is_grad_enabled() else ACTIVATIONS_INPLACE
        h = act[self.act](h)
        return F.linear(h, self.fc2_weight, self.fc2_bias)


class FusedBlock(nn.Module):
    """One fused transformer block for all members: pre-norm (timm ``Block``) or post-norm (BERT).

    Pre-norm: ``x + W_O(attn(norm1(x)))``, then ``x + ls2 * mlp(norm2(x))``. Post-norm:
    ``h = norm1(x + W_O(attn(x)))``, then ``norm2(h + mlp(h))``.

    Args:
        head_dim: d_k.
        norm1, norm2: the two LayerNorms (shared or per member).
        qkv: grouped Q/K/V projection, (S, d, 3 * H_max * d_k), columns ordered q | k | v and
            head-major within each; None when no member keeps a head in this layer.
        proj: grouped output projection (S, H_max * d_k, d), the attention's layer scale folded in.
        mlp: the merged MLP.
        ls2: the MLP's layer scale, (S, d), or None (always None when ``post_norm``).
        post_norm: normalise after each residual (BERT) instead of before each branch (timm).
    """

    def __init__(
        self,
        *,
        head_dim: int,
        norm1: StackedLayerNorm,
        qkv: GroupedLinear | None,
        proj: GroupedLinear,
        norm2: StackedLayerNorm,
        mlp: MergedMlp,
        ls2: torch.Tensor | None,
        post_norm: bool = False,
    ) -> None:
        super().__init__()
        if post_norm and ls2 is not None:
            raise ValueError("a post-norm block has no layer scale: pass ls2=None")
        self.head_dim = head_dim
        self.norm1, self.qkv, self.proj, self.norm2, self.mlp = norm1, qkv, proj, norm2, mlp
        self.ls2 = None if ls2 is None else nn.Parameter(ls2)
        self.post_norm = post_norm

    @property
    def max_heads(self) -> int:
        return 0 if self.qkv is None else self.qkv.weight.shape[2] // (3 * self.head_dim)

    @property
    def is_shared(self) -> bool:
        """True when every member uses the same weights here (and so the same heads)."""
        parts = [self.norm1.weight, self.proj.weight, self.norm2.weight]
        parts += [self.qkv.weight] if self.qkv is not None else []
        parts += [self.ls2] if self.ls2 is not None else []
        return all(p.shape[0] == 1 for p in parts)

    def forward(
        self, x: torch.Tensor, cls_only: bool = False, attn_bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x: (S_x, B, N, d) -> (S, B, N', d); N' = 1 when ``cls_only`` (row 0 only).
        ``attn_bias``: added to every head's attention scores (see :meth:`head_outputs`)."""
        _, b, _, d = x.shape
        z = self.head_outputs(x if self.post_norm else self.norm1(x), cls_only, attn_bias)
        if cls_only:
            x = x[:, :, :1]  # (S_x, B, 1, d)
        x = _add_residual(x, self.proj(z).view(-1, b, x.shape[2], d))  # (S, B, N', d)
        del z  # free activation-sized temporaries as soon as they are used
        if self.post_norm:
            x = self.norm1(x)
            return self.norm2(_add_residual(x, self.mlp(x)))
        m = self.mlp(self.norm2(x))
        if self.ls2 is None:
            return _add_residual(x, m)
        return torch.addcmul(x, self.ls2.view(self.ls2.shape[0], 1, 1, d), m)

    def head_outputs(
        self, h: torch.Tensor, cls_only: bool = False, attn_bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Every member's head outputs Z (before W_O) for the (normalised) stream h (S_x, B, N, d).

        ``attn_bias`` is added to the attention scores: a float tensor (S_b, B, H_b, N_q, N) with
        S_b in (1, S), H_b in (1, H_max) and N_q in (1, N) - e.g. a padding mask (1, B, 1, 1, N)
        holding a large negative value at padding keys, plus a per-member, per-head position bias.

        Returns (S, B*N', H_max*d_k): member-major, heads concatenated as at timm's ``proj``."""
        s_x, b, n, d = h.shape
        nq = 1 if cls_only else n
        if self.qkv is None:  # no member keeps a head: the attention adds only W_O's bias
            return h.new_zeros(s_x, b * nq, 0)
        heads, dk = self.max_heads, self.head_dim
        qkv = self.qkv(h.view(s_x, b * n, d))  # (S, B*N, 3*H*d_k)
        s = qkv.shape[0]
        if attn_bias is not None and attn_bias.shape[0] > s:  # one Q/K/V, per-member biases
            s = attn_bias.shape[0]
            qkv = qkv.expand(s, *qkv.shape[1:])
        qkv = qkv.reshape(s * b, n, 3, heads, dk)  # (S*B, N, 3, H, d_k): a view unless expanded
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # each (S*B, H, N, d_k)
        mask = None
        if attn_bias is not None:
            if cls_only:
                attn_bias = attn_bias[..., :1, :]  # (S_b, B, H_b, 1, N)
            rest = attn_bias.shape[2:]
            mask = attn_bias.to(q.dtype).expand(s, b, *rest).reshape(s * b, *rest)
        if cls_only:
            q = q[:, :, :1]  # (S*B, H, 1, d_k)
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (S*B, H, N', d_k)
        return z.transpose(1, 2).reshape(s, b * nq, heads * dk)  # (S, B*N', H*d_k), no copy


def _add_residual(x: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
    """``x + update``, written into ``update`` - a fresh matmul output that autograd does not keep -
    when that keeps dtype and shape, which saves allocating one activation-sized tensor. (Under
    autocast ``update`` is low precision and the stream fp32: then a new tensor, as timm does.)"""
    if update.dtype == x.dtype and update.shape == torch.broadcast_shapes(x.shape, update.shape):
        return update.add_(x)
    return x + update


class Stem(nn.Module):
    """Patch embedding, class/register tokens and position embedding (timm's ``_pos_embed``).

    Args:
        patch_weight: (S, d, C, p_h, p_w) conv weights; patch_bias (S, d) or None.
        patch_norm, norm_pre: optional LayerNorms (the patch embedding's norm, timm's norm_pre).
        cls_token: (S, 1, d), reg_token: (S, R, d), pos_embed: (S, N_pos, d), each or None.
        no_embed_class: the position embedding covers the patches only; prefix tokens come after.
    """

    def __init__(
        self,
        *,
        patch_weight: torch.Tensor,
        patch_bias: torch.Tensor | None,
        patch_norm: StackedLayerNorm | None,
        cls_token: torch.Tensor | None,
        reg_token: torch.Tensor | None,
        pos_embed: torch.Tensor | None,
        no_embed_class: bool,
        norm_pre: StackedLayerNorm | None,
    ) -> None:
        super().__init__()
        self.patch_weight = nn.Parameter(patch_weight)
        self.patch_bias = None if patch_bias is None else nn.Parameter(patch_bias)
        self.patch_norm = patch_norm
        self.cls_token = None if cls_token is None else nn.Parameter(cls_token)
        self.reg_token = None if reg_token is None else nn.Parameter(reg_token)
        self.pos_embed = None if pos_embed is None else nn.Parameter(pos_embed)
        self.no_embed_class = no_embed_class
        self.norm_pre = norm_pre

    @property
    def groups(self) -> int:
        """S: 1 when the members share the whole stem, M otherwise."""
        return self.patch_weight.shape[0]

    def forward(self, images: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (S, B, N, d)
        s, d = self.patch_weight.shape[:2]
        b = images.shape[0]
        weight = self.patch_weight.flatten(0, 1)  # (S*d, C, p_h, p_w): all members in one conv
        bias = None if self.patch_bias is None else self.patch_bias.flatten()
        x = F.conv2d(images, weight, bias, stride=weight.shape[-2:])  # (B, S*d, gh, gw)
        x = x.view(b, s, d, -1).permute(1, 0, 3, 2)  # (S, B, Np, d)
        if self.patch_norm is not None:
            x = self.patch_norm(x)
        tokens = [t for t in (self.cls_token, self.reg_token) if t is not None]
        prefix = [t[:, None].expand(s, b, *t.shape[1:]) for t in tokens]  # (S, B, 1 or R, d)
        pos = None if self.pos_embed is None else self.pos_embed[:, None]  # (S, 1, N_pos, d)
        if pos is not None and self.no_embed_class:
            x = x + pos
        if prefix:
            x = torch.cat([*prefix, x], dim=2)  # (S, B, N, d)
        if pos is not None and not self.no_embed_class:
            x = x + pos
        if self.norm_pre is not None:
            x = self.norm_pre(x)
        return x
