"""Model adapter for timm Vision Transformers: where the heads are, how to switch them off, how to
cut them out.

Head layout (as in TransformerLens): head outputs are ``[batch, pos, head, d_head]``; they are
concatenated at the input of ``blocks[l].attn.proj`` (shape (B, N, H * d_k)), so head ``h`` of layer
``l`` owns channels ``h*d_k : (h+1)*d_k`` there. A head mask is a bool tensor of shape
(layers, heads), True = kept. Heads are labelled ``L{layer}H{head}``, zero-based.

Every intervention is a forward hook that lives inside a context manager and is removed in
``finally``: a model leaves every context bit-identical to how it entered.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


class UnsupportedModelError(ValueError):
    """The model is not a transformer whose heads Hydra Lab knows how to find."""


@dataclass(frozen=True)
class HeadLayout:
    """Where the heads of a model are.

    Args:
        num_heads: heads per layer, as the model has them now (a pruned model may differ per layer).
        head_dim: d_k, the width of one head's output.
        embed_dim: d, the width of the residual stream.
    """

    num_heads: tuple[int, ...]
    head_dim: int
    embed_dim: int

    @property
    def num_layers(self) -> int:
        return len(self.num_heads)

    @property
    def max_heads(self) -> int:
        return max(self.num_heads, default=0)

    @property
    def shape(self) -> tuple[int, int]:
        """The shape of a head mask for this model: (layers, max heads)."""
        return (self.num_layers, self.max_heads)

    @property
    def total_heads(self) -> int:
        return sum(self.num_heads)

    def all_kept(self) -> torch.Tensor:
        """The mask that keeps every head the model has."""
        keep = torch.zeros(self.shape, dtype=torch.bool)
        for layer, n in enumerate(self.num_heads):
            keep[layer, :n] = True
        return keep


def head_label(layer: int, head: int) -> str:
    """``L3H7``: the name of head 7 of layer 3 (zero-based)."""
    return f"L{layer}H{head}"


def parse_head_label(label: str) -> tuple[int, int]:
    """``"L3H7"`` -> (3, 7)."""
    text = label.strip().upper()
    if not text.startswith("L") or "H" not in text:
        raise ValueError(
            f"{label!r} is not a head label; expected the form L<layer>H<head>, e.g. L3H7"
        )
    layer, head = text[1:].split("H", 1)
    try:
        return int(layer), int(head)
    except ValueError:
        raise ValueError(
            f"{label!r} is not a head label; expected the form L<layer>H<head>, e.g. L3H7"
        ) from None


def _blocks(model: nn.Module) -> Sequence[nn.Module]:
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, (nn.Sequential, nn.ModuleList)):
        raise UnsupportedModelError(
            f"{type(model).__name__} has no `blocks` list of transformer blocks; Hydra Lab "
            "supports "
            "timm VisionTransformer models (ViT, DeiT, DINOv2 variants)"
        )
    return blocks


def _check_block(index: int, block: nn.Module) -> None:
    missing = [n for n in ("norm1", "attn", "ls1", "norm2", "mlp", "ls2") if not hasattr(block, n)]
    if missing:
        raise UnsupportedModelError(
            f"block {index} ({type(block).__name__}) lacks {', '.join(missing)}; expected timm's "
            "pre-norm Block (norm1, attn, ls1, norm2, mlp, ls2)"
        )
    attn = block.attn
    for name in ("qkv", "proj", "num_heads", "head_dim"):
        if not hasattr(attn, name):
            raise UnsupportedModelError(
                f"block {index}: attention {type(attn).__name__} has no `{name}`; expected timm's "
                "Attention with a fused qkv projection and an output projection `proj`"
            )
    norm = getattr(attn, "norm", None)
    if norm is not None and not isinstance(norm, nn.Identity):
        raise UnsupportedModelError(
            f"block {index}: attention applies {type(norm).__name__} between the heads and `proj` "
            "(scale_norm); zeroing a head there would not remove it, so this model is refused"
        )
    if getattr(attn, "gate", None) is not None:
        raise UnsupportedModelError(
            f"block {index}: attention gates the heads before `proj`; this model is refused "
            "because "
            "ablating at the projection input would not match removing the head"
        )
    if type(block).forward is not _TIMM_BLOCK_FORWARD:
        raise UnsupportedModelError(
            f"block {index} is a {type(block).__name__} with its own forward; expected "
            "timm's Block "
            "(x + ls1(attn(norm1(x))), then x + ls2(mlp(norm2(x))))"
        )


def _timm_block_forward():
    from timm.models.vision_transformer import Block

    return Block.forward


_TIMM_BLOCK_FORWARD = _timm_block_forward()


def head_layout(model: nn.Module) -> HeadLayout:
    """The head layout of a supported model; raises :class:`UnsupportedModelError` otherwise."""
    blocks = _blocks(model)
    for i, block in enumerate(blocks):
        _check_block(i, block)
    if len(blocks) == 0:
        raise UnsupportedModelError("the model has no transformer blocks")
    head_dims = {int(b.attn.head_dim) for b in blocks}
    if len(head_dims) != 1:
        raise UnsupportedModelError(f"layers disagree on the head dimension: {sorted(head_dims)}")
    return HeadLayout(
        num_heads=tuple(int(b.attn.num_heads) for b in blocks),
        head_dim=head_dims.pop(),
        embed_dim=int(blocks[0].attn.proj.out_features),
    )


def as_keep_mask(layout: HeadLayout | nn.Module, keep: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Validate a head mask against a model and return it as a CPU bool tensor.

    A mask must be boolean with shape (layers, max heads), True = kept; for layers of a pruned model
    that have fewer heads, the positions past the last head must be False.
    """
    if isinstance(layout, nn.Module):
        layout = head_layout(layout)
    if isinstance(keep, np.ndarray):
        keep = torch.from_numpy(keep)
    if not isinstance(keep, torch.Tensor):
        raise TypeError(
            f"a head mask must be a bool tensor of shape {layout.shape}, got {type(keep).__name__}"
        )
    if keep.dtype != torch.bool:
        raise TypeError(
            f"a head mask must have dtype bool (True = kept), got {keep.dtype}; if 1 means kept, "
            "pass keep.bool()"
        )
    if tuple(keep.shape) != layout.shape:
        raise ValueError(
            f"head mask has shape {tuple(keep.shape)} but the model has {layout.num_layers} layers "
            f"of up to {layout.max_heads} heads: expected shape {layout.shape}"
        )
    keep = keep.detach().cpu()
    for layer, n in enumerate(layout.num_heads):
        extra = (keep[layer, n:].nonzero().flatten() + n).tolist()
        if extra:
            raise ValueError(
                f"head mask keeps {', '.join(head_label(layer, h) for h in extra)}, "
                f"but layer {layer} "
                f"has only {n} heads"
            )
    return keep


def channel_mask(keep_layer: torch.Tensor, head_dim: int) -> torch.Tensor:
    """A per-head mask (H,) expanded to the projection input's channels (H * d_k,)."""
    return keep_layer.repeat_interleave(head_dim)


@contextmanager
def ablate(model: nn.Module, keep: torch.Tensor) -> Iterator[nn.Module]:
    """Switch off the heads where ``keep`` is False, for the duration of the ``with`` block.

    A switched-off head's d_k slice is zeroed at the input of the attention output projection, which
    equals zeroing its column block of W_O (paper, Appendix D.1.2). Layers that keep every head get
    no hook, so an all-True mask leaves the logits bit-identical.
    """
    layout = head_layout(model)
    keep = as_keep_mask(layout, keep)
    blocks = _blocks(model)
    handles = []
    try:
        for layer, n in enumerate(layout.num_heads):
            if bool(keep[layer, :n].all()):
                continue
            handles.append(
                blocks[layer].attn.proj.register_forward_pre_hook(
                    _ZeroChannels(channel_mask(keep[layer, :n], layout.head_dim))
                )
            )
        yield model
    finally:
        for handle in handles:
            handle.remove()


class _ZeroChannels:
    """Forward pre-hook: multiply the projection input by a 0/1 channel mask."""

    def __init__(self, mask: torch.Tensor) -> None:
        self.mask = mask
        self._cast: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def __call__(self, module: nn.Module, args: tuple[torch.Tensor, ...]):
        x = args[0]
        key = (x.device, x.dtype)
        if key not in self._cast:
            self._cast[key] = self.mask.to(device=x.device, dtype=x.dtype)
        return (x * self._cast[key],) + tuple(args[1:])


@contextmanager
def record_head_outputs(
    model: nn.Module, layers: Sequence[int], *, token: int | None = 0
) -> Iterator[dict[int, list[torch.Tensor]]]:
    """Record each head's output Z (before W_O) at ``layers`` during forwards inside the block.

    Yields a dict ``layer -> list of tensors``, one per forward call, of shape (B, H, d_k) for one
    ``token`` (0 = CLS) or (B, N, H, d_k) when ``token`` is None. Ablation hooks registered before
    this one apply first, so a recorded ablated head reads zero.
    """
    layout = head_layout(model)
    blocks = _blocks(model)
    for layer in layers:
        if not 0 <= layer < layout.num_layers:
            raise ValueError(
                f"layer {layer} does not exist; the model has layers 0..{layout.num_layers - 1}"
            )
    store: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
    handles = []

    def recorder(layer: int):
        def hook(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            x = args[0]
            b, n, _ = x.shape
            z = x.reshape(b, n, layout.num_heads[layer], layout.head_dim)  # (B, N, H, d_k)
            store[layer].append((z if token is None else z[:, token]).detach())

        return hook

    try:
        for layer in layers:
            handles.append(blocks[layer].attn.proj.register_forward_pre_hook(recorder(layer)))
        yield store
    finally:
        for handle in handles:
            handle.remove()


def _head_rows(head_dim: int, total_heads: int, heads: torch.Tensor) -> torch.Tensor:
    """Rows of ``heads`` in a fused qkv weight of ``total_heads`` heads: q, then k, then v rows."""
    within = (heads[:, None] * head_dim + torch.arange(head_dim)).flatten()  # (kept * d_k,)
    width = total_heads * head_dim
    return torch.cat([within + part * width for part in range(3)])


def _slice_linear(
    linear: nn.Linear, rows: torch.Tensor | None = None, cols: torch.Tensor | None = None
) -> nn.Linear:
    weight = linear.weight.detach()
    if rows is not None:
        weight = weight[rows]
    if cols is not None:
        weight = weight[:, cols]
    bias = linear.bias
    if bias is not None and rows is not None:
        bias = bias.detach()[rows]
    return _linear_from(weight, None if bias is None else bias.detach())


def _linear_from(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """An ``nn.Linear`` holding copies of ``weight`` (out, in) and ``bias`` (no random init)."""
    out = nn.Linear(1, 1, bias=bias is not None, device=weight.device, dtype=weight.dtype)
    out.in_features, out.out_features = weight.shape[1], weight.shape[0]
    out.weight = nn.Parameter(weight.clone())
    out.bias = None if bias is None else nn.Parameter(bias.clone())
    return out


class EmptyAttention(nn.Module):
    """The attention of a layer that keeps no head: it adds only the output projection's bias."""

    def __init__(self, proj: nn.Linear, head_dim: int) -> None:
        super().__init__()
        self.num_heads = 0
        self.head_dim = head_dim
        self.attn_dim = 0
        self.qkv = _linear_from(proj.weight.new_empty(0, proj.out_features), None)
        self.proj = proj
        self.norm = nn.Identity()

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> torch.Tensor:
        return self.proj(x.new_zeros(*x.shape[:-1], 0))  # = bias (or zeros), shape (B, N, d)


def prune_attention(attn: nn.Module, heads: torch.Tensor) -> nn.Module:
    """A copy of a timm ``Attention`` keeping only ``heads`` (1-D int64, sorted), structurally."""
    head_dim = int(attn.head_dim)
    channels = (heads[:, None] * head_dim + torch.arange(head_dim)).flatten()
    proj = _slice_linear(attn.proj, cols=channels)
    if len(heads) == 0:
        return EmptyAttention(proj, head_dim)
    new = copy.deepcopy(attn)  # keeps q_norm/k_norm (they act per head) and the attention options
    new.qkv = _slice_linear(attn.qkv, rows=_head_rows(head_dim, int(attn.num_heads), heads))
    new.proj = proj
    new.num_heads = len(heads)
    new.attn_dim = len(heads) * head_dim
    return new


def prune_heads(model: nn.Module, keep: torch.Tensor) -> nn.Module:
    """A new, structurally smaller model that keeps only the heads where ``keep`` is True.

    Only the kept heads' Q/K/V rows and W_O columns remain (per-layer head counts may differ; a
    layer that keeps no head adds only W_O's bias). Its logits equal those of ``model`` under
    ``ablate(model, keep)``. The source model is not modified.
    """
    layout = head_layout(model)
    keep = as_keep_mask(layout, keep)
    pruned = copy.deepcopy(model)
    for layer, block in enumerate(_blocks(pruned)):
        n = layout.num_heads[layer]
        heads = keep[layer, :n].nonzero().flatten()
        if len(heads) == n:
            continue
        block.attn = prune_attention(block.attn, heads)
    return pruned


def embed(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Images -> the token stream entering block 0, shape (B, N, d)."""
    x = model.patch_embed(x)
    x = model._pos_embed(x)
    x = model.patch_drop(x)
    return model.norm_pre(x)


def classify(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The token stream leaving the last block (B, N, d) -> logits (B, C)."""
    return model.forward_head(model.norm(tokens))


#: Up to this many keys, attention on the CPU is an explicit matmul-softmax-matmul: for the short
#: sequences of small ViTs (17 tokens in the default model) that is about twice as fast as torch's
#: fused CPU kernel (16 vs 32 ms for 1024 x 12 heads x 17 tokens x d_k 16 on 2 cores), which wins
#: from a few hundred tokens on (101 vs 215 ms at 197 tokens).
SHORT_SEQUENCE = 64


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d_k)) v for (..., N, d_k) operands, the same numbers as
    ``scaled_dot_product_attention`` (to float rounding), with the faster kernel for the shape."""
    if q.device.type != "cpu" or k.shape[-2] > SHORT_SEQUENCE:
        return nn.functional.scaled_dot_product_attention(q, k, v)
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # (..., Nq, Nk)
    return scores.softmax(-1) @ v


def block_heads(block: nn.Module, x: torch.Tensor, queries: slice | None = None) -> torch.Tensor:
    """Per-head attention outputs Z of one block for the residual stream ``x``, before W_O.

    Args:
        x: (B, N, d), the stream entering the block (``norm1`` is applied here).
        queries: compute only these query positions (e.g. ``slice(0, 1)`` for the CLS token).

    Returns:
        (B, Nq, H, d_k), the same numbers the block's attention concatenates before ``proj``.
    """
    attn = block.attn
    b, n, _ = x.shape
    h, dk = int(attn.num_heads), int(attn.head_dim)
    if h == 0:
        nq = n if queries is None else len(range(n)[queries])
        return x.new_zeros(b, nq, 0, dk)
    qkv = (
        attn.qkv(block.norm1(x)).reshape(b, n, 3, h, dk).permute(2, 0, 3, 1, 4)
    )  # (3, B, H, N, d_k)
    q, k, v = qkv.unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    if queries is not None:
        q = q[:, :, queries]  # (B, H, Nq, d_k)
    z = attention(q, k, v)  # (B, H, Nq, d_k)
    return z.transpose(1, 2)  # (B, Nq, H, d_k)


def block_rest(block: nn.Module, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
    """Finish a block given its attention output after ``proj``: residual, layer scale, MLP."""
    x = x + block.ls1(attn_out)
    return x + block.ls2(block.mlp(block.norm2(x)))


def attention_projection(block: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """(B, N, H, d_k) head outputs -> the attention's output (B, N, d) through W_O."""
    b, n = z.shape[:2]
    return block.attn.proj(z.reshape(b, n, -1))
