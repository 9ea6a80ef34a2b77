"""The timm Vision Transformer family (ViT, DeiT, DINOv2 variants): pre-LN blocks
``x + ls1(attn(norm1(x)))``, then ``x + ls2(mlp(norm2(x)))``; the heads are concatenated at the
input of ``blocks[l].attn.proj``; the input is a batch of preprocessed images (B, C, H, W).

Models whose attention puts a norm or a gate between the heads and ``proj`` are refused, rather than
ablating the wrong thing. For Hydra fusion, :func:`fusion_parts` maps a model onto pre-norm
:class:`~hydra_core.models.parts.FusionParts` (a plain Conv2d patch embedding, timm's ``Block`` and
``Mlp``, LayerNorms, a Linear head; the rest refused in one line).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from hydra_core.models.family import (
    PARAMETER_KINDS,
    Context,
    CostSizes,
    HeadLayout,
    ModelFamily,
    PreNormParts,
    UnsupportedModelError,
    shallow_copy,
)
from hydra_core.models.modality import IMAGE_MODALITY
from hydra_core.models.part_readers import block_parts, fused_qkv, norm_parts
from hydra_core.models.parts import (
    POOLS,
    BlockParts,
    FusionParts,
    LinearParts,
    PatchStem,
    plain_patch_conv,
)


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


_MISSING = object()


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
    if queries == slice(0, 1):
        return _class_token_heads(block, x)
    q, k, v = _qkv(block, x)
    if queries is not None:
        q = q[:, :, queries]  # (B, H, Nq, d_k)
    z = attention(q, k, v)  # (B, H, Nq, d_k)
    return z.transpose(1, 2)  # (B, Nq, H, d_k)


def _qkv(block: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every head's queries, keys and values (B, H, N, d_k) for the stream ``x`` (B, N, d)."""
    attn = block.attn
    b, n, _ = x.shape
    h, dk = int(attn.num_heads), int(attn.head_dim)
    qkv = (
        attn.qkv(block.norm1(x)).reshape(b, n, 3, h, dk).permute(2, 0, 3, 1, 4)
    )  # (3, B, H, N, d_k)
    q, k, v = qkv.unbind(0)
    return attn.q_norm(q), attn.k_norm(k), v


def block_attention(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Each head's attention weights softmax(q k^T / sqrt(d_k)) for the stream ``x`` (B, N, d)
    entering the block, (B, H, N, N) (queries x keys), as timm's unfused attention computes them."""
    attn = block.attn
    b, n, _ = x.shape
    if int(attn.num_heads) == 0:
        return x.new_zeros(b, 0, n, n)
    q, k, _ = _qkv(block, x)
    return ((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)).softmax(-1)  # (B, H, N, N)


def _class_token_heads(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``block_heads`` for the CLS query alone, (B, 1, H, d_k), without forming the N tokens'
    keys and values (when there is no key norm): the scores are (q_h W_K,h) . n_k (W_K's bias adds
    the same to every score, which softmax ignores) and the output is W_V,h (sum_k a_hk n_k) +
    b_V,h, since the weights a_hk sum to one."""
    attn = block.attn
    b = x.shape[0]
    h, dk = int(attn.num_heads), int(attn.head_dim)
    w = attn.qkv.weight.detach().reshape(3, h, dk, -1)  # (q|k|v, H, d_k, d), views
    bias = attn.qkv.bias
    bias = bias.detach().reshape(3, h, dk) if bias is not None else w.new_zeros(3, h, dk)
    normed = block.norm1(x)  # (B, N, d)
    q = F.linear(normed[:, 0], w[0].reshape(h * dk, -1), bias[0].reshape(-1)).reshape(b, h, 1, dk)
    q = attn.q_norm(q)[:, :, 0] * dk**-0.5  # (B, H, d_k)
    if isinstance(attn.k_norm, nn.Identity):
        query = torch.bmm(q.transpose(0, 1), w[1]).transpose(0, 1)  # (B, H, d)
        scores = torch.bmm(query, normed.transpose(1, 2))  # (B, H, N)
        mixed = torch.bmm(scores.softmax(-1), normed)  # (B, H, d)
        z = torch.bmm(mixed.transpose(0, 1), w[2].transpose(1, 2))  # (H, B, d_k)
        z = z + bias[2][:, None]
        return z.transpose(0, 1)[:, None]
    k = torch.einsum("bnd,hkd->bhnk", normed, w[1]) + bias[1][:, None]
    k = attn.k_norm(k)  # (B, H, N, d_k)
    v = torch.einsum("bnd,hkd->bhnk", normed, w[2]) + bias[2][:, None]
    weights = torch.einsum("bhk,bhnk->bhn", q, k).softmax(-1)
    return torch.einsum("bhn,bhnk->bhk", weights, v)[:, None]


def _layer_scale(module: nn.Module) -> torch.Tensor | None:
    """What a block's ``ls1``/``ls2`` multiplies its input by: timm LayerScale's gamma (d,), a
    scalar one for Identity; None for any other module."""
    if isinstance(module, nn.Identity):
        return torch.ones(())
    from timm.layers.layer_scale import LayerScale

    if type(module).forward is LayerScale.forward:
        return module.gamma.detach()
    return None


def block_rest(block: nn.Module, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
    """Finish a block given its attention output after ``proj``: residual, layer scale, MLP."""
    x = x + block.ls1(attn_out)
    return x + block.ls2(block.mlp(block.norm2(x)))


def attention_projection(block: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """(B, N, H, d_k) head outputs -> the attention's output (B, N, d) through W_O."""
    b, n = z.shape[:2]
    return block.attn.proj(z.reshape(b, n, -1))


# --- fusion parts --------------------------------------------------------------------------------


def _fusion_refusal(where: str, what: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"{where} cannot be fused: {what}; Hydra fusion supports timm "
        "VisionTransformers (Conv2d patch embedding, Block, Mlp)"
    )


def _check_fusable(model: nn.Module, where: str) -> None:
    """Refuse what a pre-norm :class:`~hydra_core.models.parts.FusionParts` cannot describe."""
    for attr in ("patch_embed", "norm_pre", "norm", "fc_norm", "head", "global_pool"):
        if not hasattr(model, attr):
            raise _fusion_refusal(where, f"{type(model).__name__} has no `{attr}`")
    pe = model.patch_embed
    if not plain_patch_conv(getattr(pe, "proj", None)):
        raise _fusion_refusal(where, "the patch embedding is not a plain non-overlapping Conv2d")
    if getattr(model, "dynamic_img_size", False) or getattr(pe, "dynamic_img_pad", False):
        raise _fusion_refusal(where, "dynamic image sizes are not supported")
    if getattr(model, "attn_pool", None) is not None:
        raise _fusion_refusal(where, "attention pooling (global_pool='map') is not supported")
    if model.global_pool not in POOLS:
        raise _fusion_refusal(
            where, f"global_pool={model.global_pool!r} is not one of {', '.join(POOLS)}"
        )
    if not isinstance(model.head, nn.Linear):
        raise _fusion_refusal(where, "the classifier head is not a Linear layer (num_classes=0?)")
    from timm.layers import LayerScale

    for layer, block in enumerate(_blocks(model)):
        for name in ("q_norm", "k_norm"):
            if not isinstance(getattr(block.attn, name, nn.Identity()), nn.Identity):
                raise _fusion_refusal(where, f"block {layer} normalises queries/keys ({name})")
        for name in ("ls1", "ls2"):
            if not isinstance(getattr(block, name), (nn.Identity, LayerScale)):
                kind = type(getattr(block, name)).__name__
                raise _fusion_refusal(where, f"block {layer}: {name} is a {kind}")
        mlp = block.mlp
        linear = all(isinstance(getattr(mlp, n, None), nn.Linear) for n in ("fc1", "fc2"))
        if not linear or not isinstance(getattr(mlp, "norm", nn.Identity()), nn.Identity):
            raise _fusion_refusal(
                where, f"block {layer}: the MLP is a {type(mlp).__name__}, not timm's Mlp"
            )


def _block_parts(block: nn.Module, where: str) -> BlockParts:
    """timm's names: ``attn.qkv`` (q | k | v rows), ``attn.proj``, ``norm1``, ``norm2``,
    ``mlp.fc1``, ``mlp.act``, ``mlp.fc2``, ``ls1``, ``ls2``."""
    return block_parts(
        where,
        num_heads=int(block.attn.num_heads),
        qkv=fused_qkv(block.attn.qkv.weight, block.attn.qkv.bias),
        out=block.attn.proj,
        norms=(block.norm1, block.norm2),
        mlp=(block.mlp.fc1, block.mlp.act, block.mlp.fc2),
        layer_scales=(block.ls1, block.ls2),
    )


def fusion_parts(model: nn.Module, where: str = "this model") -> FusionParts:
    """A timm VisionTransformer as pre-norm :class:`~hydra_core.models.parts.FusionParts`."""
    try:
        layout = head_layout(model)
    except UnsupportedModelError as error:
        raise _fusion_refusal(where, str(error)) from None
    _check_fusable(model, where)
    pe = model.patch_embed
    conv = pe.proj
    tokens = [getattr(model, n, None) for n in ("cls_token", "reg_token", "pos_embed")]
    cls_token, reg_token, pos_embed = (None if t is None else t.detach()[0] for t in tokens)
    stem = PatchStem(
        img_size=tuple(int(s) for s in pe.img_size),
        patch_weight=conv.weight.detach(),  # (d, C, p_h, p_w)
        patch_bias=None if conv.bias is None else conv.bias.detach(),
        patch_norm=norm_parts(pe.norm, where),
        cls_token=cls_token,  # (1, d)
        reg_token=reg_token,  # (R, d)
        pos_embed=pos_embed,  # (N_pos, d)
        no_embed_class=bool(getattr(model, "no_embed_class", False)),
        norm_pre=norm_parts(model.norm_pre, where),
    )
    return FusionParts(
        kind="pre-norm",
        arch=VIT.name,
        embed_dim=layout.embed_dim,
        head_dim=layout.head_dim,
        stem=stem,
        blocks=tuple(_block_parts(block, where) for block in _blocks(model)),
        head=LinearParts.of(model.head),
        norm=norm_parts(model.norm, where),
        global_pool=model.global_pool,
        num_prefix_tokens=int(model.num_prefix_tokens),
        pool_include_prefix=bool(getattr(model, "pool_include_prefix", False)),
        fc_norm=norm_parts(model.fc_norm, where),
    )


class VitFamily(ModelFamily):
    """timm ``VisionTransformer`` models (the context is always None)."""

    name = "vit"
    modality = IMAGE_MODALITY

    def matches(self, model: nn.Module) -> bool:
        return hasattr(model, "blocks") and hasattr(model, "patch_embed")

    def blocks(self, model: nn.Module) -> Sequence[nn.Module]:
        return _blocks(model)

    def layout(self, model: nn.Module) -> HeadLayout:
        return head_layout(model)

    def output_projection(self, block: nn.Module) -> nn.Linear:
        return block.attn.proj

    def prune_block(self, block: nn.Module, heads: torch.Tensor) -> nn.Module:
        new = shallow_copy(block)
        new.attn = prune_attention(block.attn, heads)
        return new

    def qkv_weights(self, block: nn.Module) -> list[nn.Parameter]:
        return [block.attn.qkv.weight]

    def parameter_kind(self, model: nn.Module | None, name: str) -> str:
        """By timm's names (``model`` is not needed): a norm inside a block (``norm1``, ``norm2``,
        ``attn.q_norm``) is "norm", the rest of ``attn`` / ``ls1`` "attn", of ``mlp`` / ``ls2``
        "mlp"; ``patch_embed``, class / register tokens and ``pos_embed`` "embed"; ``norm``,
        ``fc_norm``, ``norm_pre`` "norm"; ``head`` "head"."""
        parts = name.split(".")
        if parts[0] == "blocks" and len(parts) > 2:
            if any("norm" in part for part in parts[2:-1]):
                return "norm"
            if parts[2] in ("attn", "ls1"):
                return "attn"
            if parts[2] in ("mlp", "ls2"):
                return "mlp"
        elif parts[0] in ("patch_embed", "cls_token", "reg_token", "pos_embed"):
            return "embed"
        elif parts[0] in ("norm", "fc_norm", "norm_pre"):
            return "norm"
        elif parts[0] == "head":
            return "head"
        raise ValueError(
            f"parameter {name!r} is in none of the groups {', '.join(PARAMETER_KINDS)}; "
            "Hydra Lab knows timm VisionTransformer parameter names only"
        )

    def cost_sizes(self, model: nn.Module, inputs: torch.Tensor | None = None) -> CostSizes:
        conv = model.patch_embed.proj
        num_patches = int(model.patch_embed.num_patches)
        return CostSizes(
            num_tokens=num_patches + int(model.num_prefix_tokens),
            mlp_hidden=int(_blocks(model)[0].mlp.fc1.out_features),
            num_classes=int(model.head.out_features),
            token_pool=model.global_pool == "token",
            num_patches=num_patches,
            patch_dim=conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1],
        )

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> tuple[torch.Tensor, Context]:
        return embed(model, inputs), None

    def block_forward(self, block: nn.Module, x: torch.Tensor, context: Context) -> torch.Tensor:
        return block(x)

    def block_heads(
        self, block: nn.Module, x: torch.Tensor, context: Context, queries: slice | None = None
    ) -> torch.Tensor:
        return block_heads(block, x, queries)

    def block_attention(self, block: nn.Module, x: torch.Tensor, context: Context) -> torch.Tensor:
        return block_attention(block, x)

    @contextmanager
    def explicit_attention(self, model: nn.Module) -> Iterator[None]:
        """timm's unfused attention (``fused_attn = False`` on every block's attention)."""
        saved = [(b.attn, b.attn.__dict__.get("fused_attn", _MISSING)) for b in _blocks(model)]
        try:
            for attn, _ in saved:
                attn.fused_attn = False
            yield
        finally:
            for attn, previous in saved:
                if previous is _MISSING:
                    del attn.fused_attn
                else:
                    attn.fused_attn = previous

    def attention_projection(self, block: nn.Module, z: torch.Tensor) -> torch.Tensor:
        return attention_projection(block, z)

    def block_rest(self, block: nn.Module, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        return block_rest(block, x, attn_out)

    def classify(self, model: nn.Module, x: torch.Tensor, context: Context) -> torch.Tensor:
        return classify(model, x)

    def classifier_layer(self, model: nn.Module) -> nn.Linear:
        """timm's ``head``: it reads the pooled, normed class token (``forward_head``'s
        ``pre_logits``)."""
        head = getattr(model, "head", None)
        if not isinstance(head, nn.Linear):
            raise UnsupportedModelError(
                f"this ViT's head is {type(head).__name__}, not one linear layer: no penultimate "
                "features to read"
            )
        return head

    def class_token_pooling(self, model: nn.Module) -> bool:
        return (
            getattr(model, "attn_pool", None) is None
            and getattr(model, "global_pool", None) == "token"
        )

    def pre_norm_parts(self, block: nn.Module) -> PreNormParts | None:
        """A standard timm block's parts (LayerNorm, Mlp, optional LayerScale), or None when they
        are not the ones the fast search's MLP fold assumes."""
        from timm.layers.mlp import Mlp

        norm, mlp = block.norm2, block.mlp
        scale1 = _layer_scale(block.ls1)
        if (
            scale1 is None
            or _layer_scale(block.ls2) is None
            or type(mlp).forward is not Mlp.forward
            or not isinstance(norm, nn.LayerNorm)
            or not isinstance(mlp.norm, nn.Identity)
            or not isinstance(mlp.fc1, nn.Linear)
            or not isinstance(mlp.fc2, nn.Linear)
        ):
            return None
        return PreNormParts(block.ls1, scale1, norm, mlp.fc1, mlp.act, mlp.fc2, block.ls2)

    def fusion_parts(self, model: nn.Module, where: str = "this model") -> FusionParts:
        return fusion_parts(model, where)


VIT = VitFamily()
