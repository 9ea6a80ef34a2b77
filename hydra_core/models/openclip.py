"""The OpenCLIP image-tower family: ``clip_model.visual`` (an open_clip ``VisionTransformer``),
bare or inside a :class:`~hydra_core.models.zero_shot.ZeroShotClassifier`.

Blocks are pre-LN: ``x + ls_1(attn(ln_1(x)))``, then ``x + ls_2(mlp(ln_2(x)))``, where ``attn`` is
a ``torch.nn.MultiheadAttention``: Q, K and V come from one ``in_proj_weight`` (3d, d) whose rows
are q, k, v, each head-major; the heads are concatenated at the input of ``attn.out_proj`` (W_O).

``nn.MultiheadAttention`` hands ``out_proj.weight`` to ``F.multi_head_attention_forward`` instead of
calling ``out_proj``, so a pre-hook on W_O never fires. :meth:`OpenClipFamily.projection_called`
therefore gives the attentions that carry a hook, for the duration of a ``with`` block, an explicit
forward (the same computation) that calls ``out_proj`` as a module: a hook on it then zeroes a
head's channels, which equals zeroing its column block of W_O. A pruned block's attention
(:class:`PrunedMultiheadAttention`) always calls ``out_proj``.

The model's outputs: a bare tower gives its image embeddings (B, D); the zero-shot wrapper gives
logits over its classes (B, C). Refused, each with a message naming the cause: towers with a timm
backbone (``TimmModel``), ``CustomResidualAttentionBlock`` (qk-norm, scaled cosine attention,
head scales: something between the heads and W_O, or attention Hydra Lab does not reproduce),
attentional pooling, towers that return tokens or no pooled embedding, layers whose heads differ
in width. For Hydra fusion, :func:`fusion_parts` maps a tower onto pre-norm
:class:`~hydra_core.models.parts.FusionParts` (its zero-shot head, if any, included), refusing
also towers without ``proj``, non-LayerNorm norms and MLPs other than open_clip's.

open_clip is never imported here unless a model of it was handed in (which imported it already).
"""

from __future__ import annotations

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
    BlockParts,
    FusionParts,
    LinearParts,
    PatchStem,
    ZeroShotHead,
    plain_patch_conv,
)
from hydra_core.models.vit import _head_rows, _linear_from, attention
from hydra_core.models.zero_shot import ZeroShotClassifier


def _from_open_clip(module: object) -> bool:
    return type(module).__module__.split(".")[0] == "open_clip"


def visual_of(model: nn.Module) -> nn.Module:
    """The image tower: ``model.visual`` of a zero-shot classifier, else ``model`` itself."""
    return model.visual if isinstance(model, ZeroShotClassifier) else model


# --- attention with W_O called as a module ------------------------------------------------------


def _project(attn: nn.Module, x: torch.Tensor, part: int) -> torch.Tensor:
    """(B, N, d) -> q (``part`` 0), k (1) or v (2) of every head of ``attn``, (B, H, N, d_k)."""
    h, dk = int(attn.num_heads), int(attn.head_dim)
    rows = slice(part * h * dk, (part + 1) * h * dk)
    bias = attn.in_proj_bias
    y = F.linear(x, attn.in_proj_weight[rows], None if bias is None else bias[rows])
    return y.reshape(*x.shape[:2], h, dk).transpose(1, 2)  # (B, H, N, d_k)


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An attention mask as nn.MultiheadAttention reads it (bool: True = may not attend; float:
    added to the scores) -> an additive float mask."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
            mask, float("-inf")
        )
    return mask.to(dtype)


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
        q, k, v = (_project(attn, t, part) for part, t in enumerate((query, key, value)))
        dropout = float(attn.dropout) if attn.training else 0.0
        if attn_mask is None and dropout == 0.0:
            z = attention(q, k, v)  # (B, H, Nq, d_k)
        else:
            scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # (B, H, Nq, Nk)
            if attn_mask is not None:
                if attn_mask.ndim != 2:
                    raise ValueError(
                        f"only a 2-D attention mask (queries, keys) is supported here, got shape "
                        f"{tuple(attn_mask.shape)}"
                    )
                scores = scores + _additive(attn_mask, scores.dtype)
            z = F.dropout(scores.softmax(-1), dropout) @ v  # (B, H, Nq, d_k)
        z = z.transpose(1, 2).reshape(b, nq, -1)  # (B, Nq, H * d_k)
    out = attn.out_proj(z)  # (B, Nq, d)
    return out if attn.batch_first else out.transpose(0, 1)


def _check_call(key_padding_mask: object, is_causal: bool) -> None:
    if key_padding_mask is not None or is_causal:
        raise ValueError(
            "key_padding_mask and is_causal are not supported by Hydra Lab's attention for "
            "open_clip image towers (which use neither); pass an attn_mask instead"
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


def _check_tower(visual: nn.Module) -> None:
    name = type(visual).__name__
    if hasattr(visual, "visual") and hasattr(visual, "encode_text"):
        raise UnsupportedModelError(
            f"{name} is a whole CLIP model; pass its image tower (clip_model.visual) or a "
            "ZeroShotClassifier (hydra_core.models.zero_shot.zero_shot_classifier)"
        )
    if name == "TimmModel":
        raise UnsupportedModelError(
            "this open_clip image tower is a timm backbone (TimmModel); Hydra Lab supports "
            "open_clip VisionTransformer towers only (load the backbone through timm to search "
            "its heads)"
        )
    if name != "VisionTransformer" or not hasattr(visual, "transformer"):
        raise UnsupportedModelError(
            f"{name} is not an open_clip VisionTransformer image tower; Hydra Lab supports "
            "VisionTransformer towers (clip_model.visual) and ZeroShotClassifier around one"
        )
    if getattr(visual, "attn_pool", None) is not None:
        raise UnsupportedModelError(
            "this open_clip tower pools with attentional pooling (attn_pool), whose heads are not "
            "the blocks'; Hydra Lab supports class-token ('tok') or average ('avg') pooling"
        )
    if visual.pool_type not in ("tok", "avg"):
        raise UnsupportedModelError(
            f"this open_clip tower has pool_type={visual.pool_type!r} and returns no pooled "
            "embedding; Hydra Lab supports 'tok' and 'avg' pooling"
        )
    if getattr(visual, "output_tokens", False):
        raise UnsupportedModelError(
            "this open_clip tower returns (pooled, tokens) (output_tokens=True); set "
            "visual.output_tokens = False so that it returns its embeddings"
        )


def _check_block(index: int, block: nn.Module) -> None:
    from open_clip.transformer import ResidualAttentionBlock

    name = type(block).__name__
    if name == "CustomResidualAttentionBlock":
        raise UnsupportedModelError(
            f"block {index} is open_clip's CustomResidualAttentionBlock (qk_norm, scaled cosine "
            "attention, scale_heads or inner norms): its attention is not nn.MultiheadAttention "
            "and may scale or normalise the heads before W_O, so this tower is refused"
        )
    if type(block).forward is not ResidualAttentionBlock.forward:
        raise UnsupportedModelError(
            f"block {index} is a {name}; expected open_clip's ResidualAttentionBlock "
            "(x + ls_1(attn(ln_1(x))), then x + ls_2(mlp(ln_2(x))))"
        )
    if hasattr(block, "ln_1_kv"):
        raise UnsupportedModelError(
            f"block {index} is a cross-attention block (ln_1_kv); Hydra Lab supports self-attention"
        )
    for name in ("ls_1", "ls_2"):
        if getattr(getattr(block, name), "inplace", False):
            raise UnsupportedModelError(
                f"block {index}: {name} scales its input in place (inplace=True), which would "
                "overwrite the attention output Hydra Lab reuses; build the tower without it"
            )
    attn = block.attn
    if isinstance(attn, PrunedMultiheadAttention):
        return
    if type(attn) is not nn.MultiheadAttention:
        raise UnsupportedModelError(
            f"block {index}: attention is a {type(attn).__name__}; expected nn.MultiheadAttention"
        )
    if not attn._qkv_same_embed_dim or attn.bias_k is not None or attn.add_zero_attn:
        raise UnsupportedModelError(
            f"block {index}: nn.MultiheadAttention with separate q/k/v weights, bias_k/bias_v or "
            "add_zero_attn; expected one fused in_proj_weight and plain attention"
        )


# --- fusion parts -------------------------------------------------------------------------------

#: open_clip's ``pool_type`` -> the canonical pooling ('avg' leaves the class token out)
_POOLS = {"tok": "token", "avg": "avg"}


def _fusion_refusal(where: str, what: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"{where} cannot be fused: {what}; Hydra fusion supports open_clip "
        "VisionTransformers (ResidualAttentionBlock with nn.MultiheadAttention, 'tok' or "
        "'avg' pooling)"
    )


def _check_fusable(tower: nn.Module, where: str, embed_dim: int) -> None:
    """Refuse what a pre-norm :class:`~hydra_core.models.parts.FusionParts` cannot describe."""
    from open_clip.transformer import LayerScale
    from timm.layers import LayerScale as TimmLayerScale

    if tower.proj is None:
        raise _fusion_refusal(where, "it has no output projection (proj is None)")
    if not plain_patch_conv(tower.conv1):
        raise _fusion_refusal(where, "the patch embedding is not a plain non-overlapping Conv2d")
    tokens = tower.grid_size[0] * tower.grid_size[1] + 1
    if tuple(tower.positional_embedding.shape) != (tokens, embed_dim):
        raise _fusion_refusal(
            where,
            f"the position embedding has shape {tuple(tower.positional_embedding.shape)}; "
            f"expected ({tokens}, {embed_dim}) for the class token and the patches",
        )
    for layer, block in enumerate(tower.transformer.resblocks):
        for name in ("ls_1", "ls_2"):
            scale = getattr(block, name)
            if not isinstance(scale, (nn.Identity, LayerScale, TimmLayerScale)):
                raise _fusion_refusal(where, f"block {layer}: {name} is a {type(scale).__name__}")
        mlp = block.mlp
        parts = dict(mlp.named_children()) if isinstance(mlp, nn.Sequential) else {}
        if list(parts) != ["c_fc", "gelu", "c_proj"] or not all(
            isinstance(parts[n], nn.Linear) for n in ("c_fc", "c_proj")
        ):
            raise _fusion_refusal(
                where, f"block {layer}: the MLP is not open_clip's c_fc, activation, c_proj"
            )


def _resblock_parts(resblock: nn.Module, where: str) -> BlockParts:
    """open_clip's names: the ``nn.MultiheadAttention``'s ``in_proj_weight`` / ``in_proj_bias``
    (q | k | v rows) and ``out_proj``; ``ln_1``, ``ln_2``; ``mlp.c_fc``, ``mlp.gelu``,
    ``mlp.c_proj``; ``ls_1``, ``ls_2``."""
    attn, mlp = resblock.attn, resblock.mlp
    return block_parts(
        where,
        num_heads=int(attn.num_heads),
        qkv=fused_qkv(attn.in_proj_weight, attn.in_proj_bias),
        out=attn.out_proj,
        norms=(resblock.ln_1, resblock.ln_2),
        mlp=(mlp.c_fc, mlp.gelu, mlp.c_proj),
        layer_scales=(resblock.ls_1, resblock.ls_2),
    )


def fusion_parts(model: nn.Module, where: str = "this model") -> FusionParts:
    """An open_clip VisionTransformer (bare, or in a zero-shot classifier, whose head becomes
    ``zero_shot``) as pre-norm :class:`~hydra_core.models.parts.FusionParts`: ``conv1`` -> the
    patch embedding; ``class_embedding`` -> the class token; ``positional_embedding`` (its row 0
    is the class token's) -> the position embedding; ``ln_pre`` -> ``norm_pre``; in a block,
    ``in_proj_weight`` / ``in_proj_bias`` -> Q/K/V, ``out_proj`` -> W_O, ``ln_1`` / ``ln_2`` ->
    norm1 / norm2, ``ls_1`` / ``ls_2`` -> the layer scales, ``mlp.c_fc`` / ``mlp.c_proj`` -> the
    MLP; ``ln_post`` -> ``norm`` before pooling or, with ``final_ln_after_pool``, ``fc_norm``
    after it; ``proj`` (d, D) -> the head, without bias."""
    try:
        # the family refuses custom blocks, attentional pooling, pool_type 'none', returned tokens
        layout = OPENCLIP.layout(model)
    except UnsupportedModelError as error:
        raise _fusion_refusal(where, str(error)) from None
    tower = visual_of(model)
    _check_fusable(tower, where, layout.embed_dim)
    conv = tower.conv1
    stem = PatchStem(
        img_size=tuple(int(s) for s in tower.image_size),
        patch_weight=conv.weight.detach(),  # (d, 3, p, p)
        patch_bias=None if conv.bias is None else conv.bias.detach(),
        patch_norm=None,
        cls_token=tower.class_embedding.detach()[None],  # (1, d)
        reg_token=None,
        pos_embed=tower.positional_embedding.detach(),  # (1 + patches, d)
        no_embed_class=False,
        norm_pre=norm_parts(tower.ln_pre, where),
    )
    post = norm_parts(tower.ln_post, where)
    after_pool = bool(tower.final_ln_after_pool)
    zero_shot = None
    if isinstance(model, ZeroShotClassifier):
        zero_shot = ZeroShotHead(
            class_embeddings=model.class_embeddings.detach(),
            logit_scale=model.logit_scale.detach(),
            classes=tuple(model.classes),
            templates=tuple(model.templates),
        )
    return FusionParts(
        kind="pre-norm",
        arch=OPENCLIP.name,
        embed_dim=layout.embed_dim,
        head_dim=layout.head_dim,
        stem=stem,
        blocks=tuple(_resblock_parts(b, where) for b in tower.transformer.resblocks),
        head=LinearParts(tower.proj.detach().t(), None),  # (D, d)
        norm=None if after_pool else post,
        global_pool=_POOLS[tower.pool_type],
        num_prefix_tokens=1,
        pool_include_prefix=False,
        fc_norm=post if after_pool else None,
        zero_shot=zero_shot,
    )


# --- the family ---------------------------------------------------------------------------------


class OpenClipFamily(ModelFamily):
    """open_clip ``VisionTransformer`` image towers, bare (outputs: embeddings (B, D)) or inside
    a :class:`ZeroShotClassifier` (outputs: logits (B, C)); the context is always None."""

    name = "openclip"
    modality = IMAGE_MODALITY

    def matches(self, model: nn.Module) -> bool:
        return isinstance(model, ZeroShotClassifier) or _from_open_clip(model)

    def blocks(self, model: nn.Module) -> Sequence[nn.Module]:
        visual = visual_of(model)
        _check_tower(visual)
        return visual.transformer.resblocks

    def layout(self, model: nn.Module) -> HeadLayout:
        blocks = self.blocks(model)
        if len(blocks) == 0:
            raise UnsupportedModelError("the model has no transformer blocks")
        for i, block in enumerate(blocks):
            _check_block(i, block)
        head_dims = {int(b.attn.head_dim) for b in blocks}
        if len(head_dims) != 1:
            raise UnsupportedModelError(
                f"layers disagree on the width of their heads: {sorted(head_dims)}"
            )
        return HeadLayout(
            num_heads=tuple(int(b.attn.num_heads) for b in blocks),
            head_dim=head_dims.pop(),
            embed_dim=int(blocks[0].attn.out_proj.out_features),
        )

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

    def parameter_kind(self, model: nn.Module, name: str) -> str:
        """``conv1``, ``class_embedding``, ``positional_embedding`` are "embed"; ``ln_pre``,
        ``ln_post`` and the blocks' ``ln_1``/``ln_2`` "norm"; in a block ``attn``/``ls_1``
        "attn", ``mlp``/``ls_2`` "mlp"; ``proj`` "head". A zero-shot classifier's parameters
        are its tower's (``visual.`` prefix); its class embeddings are a buffer."""
        local = name.removeprefix("visual.") if isinstance(model, ZeroShotClassifier) else name
        parts = local.split(".")
        if parts[:2] == ["transformer", "resblocks"] and len(parts) > 3:
            part = parts[3]
            if part in ("ln_1", "ln_2"):
                return "norm"
            if part in ("attn", "ls_1"):
                return "attn"
            if part in ("mlp", "ls_2"):
                return "mlp"
        elif parts[0] in ("conv1", "class_embedding", "positional_embedding"):
            return "embed"
        elif parts[0] in ("ln_pre", "ln_post"):
            return "norm"
        elif parts[0] == "proj":
            return "head"
        raise ValueError(
            f"parameter {name!r} is in none of the groups {', '.join(PARAMETER_KINDS)}; "
            "Hydra Lab knows open_clip VisionTransformer parameter names only"
        )

    def cost_sizes(self, model: nn.Module, inputs: torch.Tensor | None = None) -> CostSizes:
        """Tokens: the patch grid plus the class token. The classifier: the tower's ``proj``
        (d -> D; outputs D for a bare tower), then a zero-shot classifier's class matrix
        (D -> C)."""
        visual = visual_of(model)
        grid_h, grid_w = visual.grid_size
        conv = visual.conv1
        width = int(self.layout(model).embed_dim)
        embed = int(visual.proj.shape[1]) if visual.proj is not None else width
        zero_shot = isinstance(model, ZeroShotClassifier)
        return CostSizes(
            num_tokens=grid_h * grid_w + 1,
            mlp_hidden=int(self.blocks(model)[0].mlp.c_fc.out_features),
            num_classes=int(model.class_embeddings.shape[0]) if zero_shot else embed,
            token_pool=self.class_token_pooling(model),
            num_patches=grid_h * grid_w,
            patch_dim=conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1],
            pre_classifier=embed if zero_shot and visual.proj is not None else 0,
        )

    # --- piece by piece -----------------------------------------------------------------------

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> tuple[torch.Tensor, Context]:
        return visual_of(model)._embeds(inputs), None  # (B, N, d)

    def block_forward(self, block: nn.Module, x: torch.Tensor, context: Context) -> torch.Tensor:
        if block.attn.batch_first:
            return block(x)
        return block(x.transpose(0, 1)).transpose(0, 1)  # the block runs on (N, B, d)

    def block_heads(
        self, block: nn.Module, x: torch.Tensor, context: Context, queries: slice | None = None
    ) -> torch.Tensor:
        attn = block.attn
        b, n, _ = x.shape
        h, dk = int(attn.num_heads), int(attn.head_dim)
        nq = n if queries is None else len(range(n)[queries])
        if h == 0:
            return x.new_zeros(b, nq, 0, dk)
        normed = block.ln_1(x)  # (B, N, d)
        q = _project(attn, normed if queries is None else normed[:, queries], 0)  # (B, H, Nq, d_k)
        k, v = _project(attn, normed, 1), _project(attn, normed, 2)  # (B, H, N, d_k)
        return attention(q, k, v).transpose(1, 2)  # (B, Nq, H, d_k)

    def block_attention(self, block: nn.Module, x: torch.Tensor, context: Context) -> torch.Tensor:
        b, n, _ = x.shape
        if int(block.attn.num_heads) == 0:
            return x.new_zeros(b, 0, n, n)
        normed = block.ln_1(x)  # (B, N, d)
        q, k = _project(block.attn, normed, 0), _project(block.attn, normed, 1)  # (B, H, N, d_k)
        return ((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)).softmax(-1)  # (B, H, N, N)

    def block_rest(self, block: nn.Module, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        x = x + block.ls_1(attn_out)
        return x + block.ls_2(block.mlp(block.ln_2(x)))

    def classify(self, model: nn.Module, x: torch.Tensor, context: Context) -> torch.Tensor:
        visual = visual_of(model)
        pooled, _ = visual._pool(x)  # (B, d)
        if visual.proj is not None:
            pooled = pooled @ visual.proj  # (B, D)
        if isinstance(model, ZeroShotClassifier):
            return model.logits_from_embeddings(pooled)  # (B, C)
        return pooled

    def class_token_pooling(self, model: nn.Module) -> bool:
        visual = visual_of(model)
        return getattr(visual, "attn_pool", None) is None and visual.pool_type == "tok"

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

    def fusion_parts(self, model: nn.Module, where: str = "this model") -> FusionParts:
        return fusion_parts(model, where)


OPENCLIP = OpenClipFamily()
