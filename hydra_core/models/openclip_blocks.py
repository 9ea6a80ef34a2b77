"""What open_clip's image and text towers share: the ``ResidualAttentionBlock``.

A block is pre-LN: ``x + ls_1(attn(ln_1(x)))``, then ``x + ls_2(mlp(ln_2(x)))``, where ``attn``
is a ``torch.nn.MultiheadAttention``: Q, K and V come from one ``in_proj_weight`` (3d, d) whose
rows are q, k, v, each head-major; the heads are concatenated at the input of ``attn.out_proj``
(W_O). The text tower passes a causal ``attn_mask``; the image tower none.

``nn.MultiheadAttention`` hands ``out_proj.weight`` to ``F.multi_head_attention_forward`` instead
of calling ``out_proj``, so a pre-hook on W_O never fires. :meth:`ResidualBlocksFamily.
projection_called` therefore gives the attentions that carry a hook, for the duration of a
``with`` block, an explicit forward (the same computation, :func:`explicit_attention`) that calls
``out_proj`` as a module: a hook on it then zeroes a head's channels, which equals zeroing its
column block of W_O. A pruned block's attention (:class:`PrunedMultiheadAttention`) always calls
``out_proj``.

open_clip is never imported here unless a model of it was handed in (which imported it already).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from hydra_core.models.family import (
    ModelFamily,
    PreNormParts,
    UnsupportedModelError,
    shallow_copy,
)
from hydra_core.models.vit import _head_rows, _linear_from, attention

# --- attention with W_O called as a module ------------------------------------------------------


def project(attn: nn.Module, x: torch.Tensor, part: int) -> torch.Tensor:
    """(B, N, d) -> q (``part`` 0), k (1) or v (2) of every head of ``attn``, (B, H, N, d_k)."""
    h, dk = int(attn.num_heads), int(attn.head_dim)
    rows = slice(part * h * dk, (part + 1) * h * dk)
    bias = attn.in_proj_bias
    y = F.linear(x, attn.in_proj_weight[rows], None if bias is None else bias[rows])
    return y.reshape(*x.shape[:2], h, dk).transpose(1, 2)  # (B, H, N, d_k)


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An attention mask as nn.MultiheadAttention reads it (bool: True = may not attend; float:
    added to the scores) -> an additive float mask."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
            mask, float("-inf")
        )
    return mask.to(dtype)


def masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d_k) + mask) v for (B, H, N, d_k) operands; ``attn_mask`` (Nq, Nk),
    bool (True = may not attend) or additive float, or None."""
    if attn_mask is None:
        return attention(q, k, v)
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # (B, H, Nq, Nk)
    if attn_mask.ndim != 2:
        raise ValueError(
            f"only a 2-D attention mask (queries, keys) is supported here, got shape "
            f"{tuple(attn_mask.shape)}"
        )
    return (scores + additive_mask(attn_mask, scores.dtype)).softmax(-1) @ v


def explicit_attention(
    attn: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """What ``nn.MultiheadAttention`` computes (no weights returned), with ``attn.out_proj`` called
    as a module, so that hooks on it fire. ``attn`` is an ``nn.MultiheadAttention`` or a
    :class:`PrunedMultiheadAttention`; ``attn_mask`` (N_q, N_k), bool or additive float."""
    if not attn.batch_first:  # (N, B, d) -> (B, N, d)
        query, key, value = (t.transpose(0, 1) for t in (query, key, value))
    b, nq, _ = query.shape
    if attn.num_heads == 0:
        z = query.new_zeros(b, nq, 0)
    else:
        q, k, v = (project(attn, t, part) for part, t in enumerate((query, key, value)))
        dropout = float(attn.dropout) if attn.training else 0.0
        if dropout == 0.0:
            z = masked_attention(q, k, v, attn_mask)  # (B, H, Nq, d_k)
        else:
            scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # (B, H, Nq, Nk)
            if attn_mask is not None:
                scores = scores + additive_mask(attn_mask, scores.dtype)
            z = F.dropout(scores.softmax(-1), dropout) @ v  # (B, H, Nq, d_k)
        z = z.transpose(1, 2).reshape(b, nq, -1)  # (B, Nq, H * d_k)
    out = attn.out_proj(z)  # (B, Nq, d)
    return out if attn.batch_first else out.transpose(0, 1)


def _check_call(key_padding_mask: object, is_causal: bool) -> None:
    if key_padding_mask is not None or is_causal:
        raise ValueError(
            "key_padding_mask and is_causal are not supported by Hydra Lab's attention for "
            "open_clip towers (which use neither); pass an attn_mask instead"
        )


class _CalledProjection:
    """An instance ``forward`` for an ``nn.MultiheadAttention``: :func:`explicit_attention`,
    with the call signature of ``nn.MultiheadAttention.forward``."""

    def __init__(self, attn: nn.MultiheadAttention) -> None:
        self.attn = attn

    def __call__(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, None]:
        _check_call(key_padding_mask, is_causal)
        return explicit_attention(self.attn, query, key, value, attn_mask), None


_MISSING = object()


class PrunedMultiheadAttention(nn.Module):
    """The attention of a pruned open_clip block: the kept heads' rows of ``in_proj_weight`` and
    ``in_proj_bias`` and W_O's columns of them; called as open_clip calls
    ``nn.MultiheadAttention`` (``attn(q_x, k_x, v_x, need_weights=False, attn_mask=...)[0]``;
    attention weights are never returned). With no head kept it returns W_O's bias.

    Args:
        in_proj_weight: (3 * kept * d_k, d), the kept heads' q rows, then k rows, then v rows.
        in_proj_bias: (3 * kept * d_k,) or None.
        out_proj: W_O with the kept heads' input columns, (d, kept * d_k).
        head_dim: d_k.
        batch_first: whether inputs are (B, N, d) (else (N, B, d)).
        dropout: on the attention weights, in training mode.
    """

    def __init__(
        self,
        in_proj_weight: torch.Tensor,
        in_proj_bias: torch.Tensor | None,
        out_proj: nn.Linear,
        head_dim: int,
        batch_first: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.in_proj_weight = nn.Parameter(in_proj_weight.detach().clone())
        bias = None if in_proj_bias is None else nn.Parameter(in_proj_bias.detach().clone())
        self.register_parameter("in_proj_bias", bias)
        self.out_proj = out_proj
        self.head_dim = head_dim
        self.num_heads = in_proj_weight.shape[0] // (3 * head_dim)
        self.embed_dim = out_proj.out_features
        self.batch_first = batch_first
        self.dropout = dropout

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, None]:
        _check_call(key_padding_mask, is_causal)
        return explicit_attention(self, query, key, value, attn_mask), None


def prune_attention(attn: nn.Module, heads: torch.Tensor) -> PrunedMultiheadAttention:
    """A :class:`PrunedMultiheadAttention` keeping ``heads`` (1-D int64, sorted) of ``attn`` (an
    ``nn.MultiheadAttention`` or a pruned one)."""
    dk = int(attn.head_dim)
    rows = _head_rows(dk, int(attn.num_heads), heads)
    channels = (heads[:, None] * dk + torch.arange(dk)).flatten()  # (kept * d_k,)
    out = attn.out_proj
    bias = None if out.bias is None else out.bias.detach()
    bias_in = attn.in_proj_bias
    return PrunedMultiheadAttention(
        attn.in_proj_weight.detach()[rows],
        None if bias_in is None else bias_in.detach()[rows],
        _linear_from(out.weight.detach()[:, channels], bias),
        dk,
        batch_first=bool(attn.batch_first),
        dropout=float(attn.dropout),
    )


# --- checks -------------------------------------------------------------------------------------


def check_block(index: int, block: nn.Module, tower: str = "") -> None:
    """Refuse a block that is not open_clip's ``ResidualAttentionBlock`` with a plain
    ``nn.MultiheadAttention`` (or a pruned one); ``tower`` names it in the message."""
    from open_clip.transformer import ResidualAttentionBlock

    where = f"{tower} block {index}" if tower else f"block {index}"
    name = type(block).__name__
    if name == "CustomResidualAttentionBlock":
        raise UnsupportedModelError(
            f"{where} is open_clip's CustomResidualAttentionBlock (qk_norm, scaled cosine "
            "attention, scale_heads or inner norms): its attention is not nn.MultiheadAttention "
            "and may scale or normalise the heads before W_O, so this tower is refused"
        )
    if type(block).forward is not ResidualAttentionBlock.forward:
        raise UnsupportedModelError(
            f"{where} is a {name}; expected open_clip's ResidualAttentionBlock "
            "(x + ls_1(attn(ln_1(x))), then x + ls_2(mlp(ln_2(x))))"
        )
    if hasattr(block, "ln_1_kv"):
        raise UnsupportedModelError(
            f"{where} is a cross-attention block (ln_1_kv); Hydra Lab supports self-attention"
        )
    for name in ("ls_1", "ls_2"):
        if getattr(getattr(block, name), "inplace", False):
            raise UnsupportedModelError(
                f"{where}: {name} scales its input in place (inplace=True), which would "
                "overwrite the attention output Hydra Lab reuses; build the tower without it"
            )
    attn = block.attn
    if isinstance(attn, PrunedMultiheadAttention):
        return
    if type(attn) is not nn.MultiheadAttention:
        raise UnsupportedModelError(
            f"{where}: attention is a {type(attn).__name__}; expected nn.MultiheadAttention"
        )
    if not attn._qkv_same_embed_dim or attn.bias_k is not None or attn.add_zero_attn:
        raise UnsupportedModelError(
            f"{where}: nn.MultiheadAttention with separate q/k/v weights, bias_k/bias_v or "
            "add_zero_attn; expected one fused in_proj_weight and plain attention"
        )


def block_head_outputs(
    block: nn.Module,
    x: torch.Tensor,
    queries: slice | None = None,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-head outputs Z (B, Nq, H, d_k) of a ``ResidualAttentionBlock`` for the stream ``x``
    (B, N, d) entering it, before W_O; ``attn_mask`` (N, N) as the block's attention reads it."""
    attn = block.attn
    b, n, _ = x.shape
    h, dk = int(attn.num_heads), int(attn.head_dim)
    rows = range(n)[queries] if queries is not None else range(n)
    if h == 0:
        return x.new_zeros(b, len(rows), 0, dk)
    normed = block.ln_1(x)  # (B, N, d)
    q = project(attn, normed if queries is None else normed[:, queries], 0)  # (B, H, Nq, d_k)
    k, v = project(attn, normed, 1), project(attn, normed, 2)  # (B, H, N, d_k)
    if attn_mask is not None:
        attn_mask = attn_mask[:n, :n] if queries is None else attn_mask[:n, :n][queries]
    return masked_attention(q, k, v, attn_mask).transpose(1, 2)  # (B, Nq, H, d_k)


class ResidualBlocksFamily(ModelFamily):
    """The methods open_clip's image and text towers share: everything about one
    ``ResidualAttentionBlock`` (W_O, pruning, Q/K/V, the parts after the attention)."""

    def output_projection(self, block: nn.Module) -> nn.Linear:
        return block.attn.out_proj

    @contextmanager
    def projection_called(self, model: nn.Module, layers: Sequence[int]) -> Iterator[None]:
        """Each ``nn.MultiheadAttention`` of ``layers`` gets an instance ``forward`` that calls
        ``out_proj`` (:func:`explicit_attention`); the previous state is restored on exit, so
        nested contexts leave in place what an outer one installed."""
        blocks = self.blocks(model)
        saved = []
        try:
            for layer in layers:
                attn = blocks[layer].attn
                if type(attn) is not nn.MultiheadAttention:
                    continue  # a pruned attention calls out_proj already
                saved.append((attn, attn.__dict__.get("forward", _MISSING)))
                attn.forward = _CalledProjection(attn)
            yield
        finally:
            for attn, previous in reversed(saved):
                if previous is _MISSING:
                    del attn.forward
                else:
                    attn.forward = previous

    def prune_block(self, block: nn.Module, heads: torch.Tensor) -> nn.Module:
        new = shallow_copy(block)
        new.attn = prune_attention(block.attn, heads)
        return new

    def qkv_weights(self, block: nn.Module) -> list[nn.Parameter]:
        return [block.attn.in_proj_weight]

    def block_rest(self, block: nn.Module, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        x = x + block.ls_1(attn_out)
        return x + block.ls_2(block.mlp(block.ln_2(x)))

    def pre_norm_parts(self, block: nn.Module) -> PreNormParts | None:
        """``ls_1``, ``ln_2``, ``mlp.c_fc``, ``mlp.gelu``, ``mlp.c_proj``, ``ls_2``, when the layer
        scales are open_clip's (or absent) and ``ln_2`` computes in the stream's dtype (not
        ``LayerNormFp32``)."""
        from open_clip.transformer import LayerNorm, LayerScale

        scales = []
        for scale in (block.ls_1, block.ls_2):
            if isinstance(scale, nn.Identity):
                scales.append(torch.ones(()))
            elif type(scale).forward is LayerScale.forward:
                scales.append(scale.gamma.detach())
            else:
                return None
        mlp = block.mlp
        if (
            type(block.ln_2).forward not in (nn.LayerNorm.forward, LayerNorm.forward)
            or not isinstance(mlp, nn.Sequential)
            or list(mlp._modules) != ["c_fc", "gelu", "c_proj"]
            or not isinstance(mlp.c_fc, nn.Linear)
            or not isinstance(mlp.c_proj, nn.Linear)
        ):
            return None
        return PreNormParts(
            block.ls_1, scales[0], block.ln_2, mlp.c_fc, mlp.gelu, mlp.c_proj, block.ls_2
        )


def block_kind(parts: Sequence[str]) -> str | None:
    """The parameter kind of a ``ResidualAttentionBlock`` parameter from the name's parts after
    ``<index>.`` (``ln_1``/``ln_2``: "norm", ``attn``/``ls_1``: "attn", ``mlp``/``ls_2``: "mlp");
    None for another name."""
    if not parts:
        return None
    if parts[0] in ("ln_1", "ln_2"):
        return "norm"
    if parts[0] in ("attn", "ls_1"):
        return "attn"
    if parts[0] in ("mlp", "ls_2"):
        return "mlp"
    return None
