"""The OpenCLIP family: ``clip_model.visual`` (an open_clip ``VisionTransformer``), bare or inside
a :class:`~hydra_core.models.zero_shot.ZeroShotClassifier`, which may hold the text tower too.

Blocks are open_clip's ``ResidualAttentionBlock`` with an ``nn.MultiheadAttention``
(:mod:`hydra_core.models.openclip_blocks`: W_O is called as a module during an intervention,
pruned attention, the checks). A zero-shot classifier with a text tower (towers "both", the
paper's D.3) has a *joint* head layout: the image tower's layers, then the text tower's
(:class:`~hydra_core.models.openclip_text.ClipTextTower`, family
:data:`~hydra_core.models.openclip_text.OPENCLIP_TEXT`), each with its own heads per layer. Head
masks, ablation, recording, structural pruning and Taylor scores then cover both towers (a text
head changes the class embeddings, which the classifier recomputes with its own text tower); the
piece-by-piece forward is per tower (:meth:`OpenClipFamily.towers`, ``join_towers``), and the
fused model holds each member's class embeddings (:meth:`OpenClipFamily.member_fusion_parts`).

The model's outputs: a bare tower gives its image embeddings (B, D); the zero-shot wrapper gives
logits over its classes (B, C). Refused, each with a message naming the cause: towers with a timm
backbone (``TimmModel``), ``CustomResidualAttentionBlock`` (qk-norm, scaled cosine attention,
head scales: something between the heads and W_O, or attention Hydra Lab does not reproduce),
attentional pooling, towers that return tokens or no pooled embedding, layers whose heads differ
in width (also image and text heads, in the joint layout). For Hydra fusion,
:func:`fusion_parts` maps a tower onto pre-norm :class:`~hydra_core.models.parts.FusionParts`
(its zero-shot head, if any, included), refusing also towers without ``proj``, non-LayerNorm
norms and MLPs other than open_clip's.

open_clip is never imported here unless a model of it was handed in (which imported it already).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import replace

import torch
from torch import nn

from hydra_core.models.family import (
    PARAMETER_KINDS,
    Context,
    CostSizes,
    HeadLayout,
    Tower,
    UnsupportedModelError,
    shallow_copy,
)
from hydra_core.models.modality import IMAGE_MODALITY
from hydra_core.models.openclip_blocks import (
    PrunedMultiheadAttention,
    ResidualBlocksFamily,
    block_head_outputs,
    block_kind,
    check_block,
    explicit_attention,
    project,
    prune_attention,
)
from hydra_core.models.openclip_text import OPENCLIP_TEXT, class_embeddings_from_prompts
from hydra_core.models.part_readers import block_parts, fused_qkv, norm_parts
from hydra_core.models.parts import (
    BlockParts,
    FusionParts,
    LinearParts,
    PatchStem,
    ZeroShotHead,
    plain_patch_conv,
)
from hydra_core.models.zero_shot import ZeroShotClassifier

__all__ = [
    "OPENCLIP",
    "OpenClipFamily",
    "PrunedMultiheadAttention",
    "explicit_attention",
    "fusion_parts",
    "prune_attention",
    "visual_of",
]


def _from_open_clip(module: object) -> bool:
    return type(module).__module__.split(".")[0] == "open_clip"


def visual_of(model: nn.Module) -> nn.Module:
    """The image tower: ``model.visual`` of a zero-shot classifier, else ``model`` itself."""
    return model.visual if isinstance(model, ZeroShotClassifier) else model


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


def _joint(model: nn.Module) -> bool:
    """A zero-shot classifier that holds its text tower: the joint layout (towers "both")."""
    return isinstance(model, ZeroShotClassifier) and model.text is not None


def _image_layers(model: nn.Module) -> int:
    return len(visual_of(model).transformer.resblocks)


def _text_class_embeddings(text: nn.Module, keep: torch.Tensor) -> torch.Tensor:
    """The class embeddings (C, D) of ``text`` (a ClipTextTower) keeping the heads of ``keep``
    (its own layout's mask), from a structurally pruned view (nothing of ``text`` changes)."""
    view = shallow_copy(text)
    view.transformer = shallow_copy(text.transformer)
    blocks = list(text.transformer.resblocks)
    for layer, block in enumerate(blocks):
        n = int(block.attn.num_heads)
        heads = keep[layer, :n].nonzero().flatten()
        if len(heads) < n:
            blocks[layer] = OPENCLIP_TEXT.prune_block(block, heads)
    view.transformer.resblocks = nn.ModuleList(blocks)
    view.interventions = 0
    with torch.no_grad():
        return view.class_embeddings()


class OpenClipFamily(ResidualBlocksFamily):
    """open_clip ``VisionTransformer`` image towers, bare (outputs: embeddings (B, D)) or inside
    a :class:`ZeroShotClassifier` (outputs: logits (B, C)), whose text tower's heads join the
    image tower's when it holds one; the context is always None."""

    name = "openclip"
    modality = IMAGE_MODALITY
    projection_is_called = False  # nn.MultiheadAttention reads out_proj.weight itself

    def matches(self, model: nn.Module) -> bool:
        return isinstance(model, ZeroShotClassifier) or _from_open_clip(model)

    def blocks(self, model: nn.Module) -> Sequence[nn.Module]:
        """The image tower's blocks, then (joint layout) the text tower's."""
        visual = visual_of(model)
        _check_tower(visual)
        if _joint(model):
            return [*visual.transformer.resblocks, *model.text.blocks]
        return visual.transformer.resblocks

    def layout(self, model: nn.Module) -> HeadLayout:
        visual = visual_of(model)
        _check_tower(visual)
        blocks = visual.transformer.resblocks
        if len(blocks) == 0:
            raise UnsupportedModelError("the model has no transformer blocks")
        for i, block in enumerate(blocks):
            check_block(i, block)
        head_dims = {int(b.attn.head_dim) for b in blocks}
        if len(head_dims) != 1:
            raise UnsupportedModelError(
                f"layers disagree on the width of their heads: {sorted(head_dims)}"
            )
        image = HeadLayout(
            num_heads=tuple(int(b.attn.num_heads) for b in blocks),
            head_dim=head_dims.pop(),
            embed_dim=int(blocks[0].attn.out_proj.out_features),
        )
        if not isinstance(model, ZeroShotClassifier):
            return image
        if model.text is None:
            return replace(image, towers=(("image", image.num_layers),))
        text = OPENCLIP_TEXT.layout(model.text)
        if text.head_dim != image.head_dim:
            raise UnsupportedModelError(
                f"the image tower's heads are {image.head_dim} wide and the text tower's "
                f"{text.head_dim}: one joint head layout needs one head width; prune the image "
                "tower alone (towers='image', --towers image)"
            )
        return replace(
            image,
            num_heads=image.num_heads + text.num_heads,
            towers=(("image", image.num_layers), ("text", text.num_layers)),
        )

    def set_block(self, model: nn.Module, layer: int, block: nn.Module) -> None:
        image_layers = _image_layers(model)
        if layer < image_layers:
            visual_of(model).transformer.resblocks[layer] = block
        else:
            model.text.transformer.resblocks[layer - image_layers] = block

    def weights_changed(self, model: nn.Module) -> None:
        if _joint(model):
            model.refresh_class_embeddings()

    @contextmanager
    def projection_called(self, model: nn.Module, layers: Sequence[int]) -> Iterator[None]:
        """The image tower's layers as the base class does it; the text tower's through its own
        family, which marks it as intervened on (the classifier then runs it)."""
        if not _joint(model):
            with super().projection_called(model, layers):
                yield
            return
        image_layers = _image_layers(model)
        with ExitStack() as stack:
            image = [layer for layer in layers if layer < image_layers]
            text = [layer - image_layers for layer in layers if layer >= image_layers]
            stack.enter_context(super().projection_called(visual_of(model), image))
            if text:
                stack.enter_context(OPENCLIP_TEXT.projection_called(model.text, text))
            yield

    def parameter_kind(self, model: nn.Module, name: str) -> str:
        """``conv1``, ``class_embedding``, ``positional_embedding`` are "embed"; ``ln_pre``,
        ``ln_post`` and the blocks' ``ln_1``/``ln_2`` "norm"; in a block ``attn``/``ls_1``
        "attn", ``mlp``/``ls_2`` "mlp"; ``proj`` "head". A zero-shot classifier's parameters
        are its tower's (``visual.`` prefix) and its text tower's (``text.``, as
        :data:`~hydra_core.models.openclip_text.OPENCLIP_TEXT` sorts them); its class
        embeddings are a buffer."""
        if isinstance(model, ZeroShotClassifier):
            if name.startswith("text.") and model.text is not None:
                return OPENCLIP_TEXT.parameter_kind(model.text, name.removeprefix("text."))
            name = name.removeprefix("visual.")
        parts = name.split(".")
        if parts[:2] == ["transformer", "resblocks"] and len(parts) > 3:
            kind = block_kind(parts[3:])
            if kind is not None:
                return kind
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

    def per_input_parameters(self, model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
        """Without the text tower's: it runs once per classifier, into the class embeddings."""
        for name, parameter in model.named_parameters():
            if not (_joint(model) and name.startswith("text.")):
                yield name, parameter

    def cost_sizes(self, model: nn.Module, inputs: torch.Tensor | None = None) -> CostSizes:
        """Tokens: the patch grid plus the class token. The classifier: the tower's ``proj``
        (d -> D; outputs D for a bare tower), then a zero-shot classifier's class matrix
        (D -> C); a text tower runs once per classifier, not per image, and counts nothing."""
        visual = visual_of(model)
        grid_h, grid_w = visual.grid_size
        conv = visual.conv1
        width = int(self.layout(model).embed_dim)
        embed = int(visual.proj.shape[1]) if visual.proj is not None else width
        zero_shot = isinstance(model, ZeroShotClassifier)
        return CostSizes(
            num_tokens=grid_h * grid_w + 1,
            mlp_hidden=int(visual.transformer.resblocks[0].mlp.c_fc.out_features),
            num_classes=int(model.class_embeddings.shape[0]) if zero_shot else embed,
            token_pool=self.class_token_pooling(model),
            num_patches=grid_h * grid_w,
            patch_dim=conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1],
            pre_classifier=embed if zero_shot and visual.proj is not None else 0,
        )

    # --- piece by piece (the image tower; with towers, each through :meth:`towers`) -----------

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> tuple[torch.Tensor, Context]:
        return visual_of(model)._embeds(inputs), None  # (B, N, d)

    def block_forward(self, block: nn.Module, x: torch.Tensor, context: Context) -> torch.Tensor:
        if block.attn.batch_first:
            return block(x)
        return block(x.transpose(0, 1)).transpose(0, 1)  # the block runs on (N, B, d)

    def block_heads(
        self, block: nn.Module, x: torch.Tensor, context: Context, queries: slice | None = None
    ) -> torch.Tensor:
        return block_head_outputs(block, x, queries)

    def block_attention(self, block: nn.Module, x: torch.Tensor, context: Context) -> torch.Tensor:
        b, n, _ = x.shape
        if int(block.attn.num_heads) == 0:
            return x.new_zeros(b, 0, n, n)
        normed = block.ln_1(x)  # (B, N, d)
        q, k = project(block.attn, normed, 0), project(block.attn, normed, 1)  # (B, H, N, d_k)
        return ((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)).softmax(-1)  # (B, H, N, N)

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

    # --- towers -------------------------------------------------------------------------------

    def towers(self, model: nn.Module) -> tuple[Tower, ...]:
        """With a text tower: the image tower (the model's inputs) and the text tower with its
        prompts; none otherwise."""
        if not _joint(model):
            return ()
        return (Tower("image", model.visual), Tower("text", model.text, model.text.prompts))

    def join_towers(self, model: nn.Module, outputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """Image embeddings (..., S, D) and prompt embeddings (..., P, D) -> logits (..., S, C),
        as the classifier computes them."""
        images, prompts = outputs
        classes = class_embeddings_from_prompts(prompts, model.text.templates)  # (..., C, D)
        return model.logits_from_embeddings(images, classes)

    # --- fusion -------------------------------------------------------------------------------

    def fusion_parts(self, model: nn.Module, where: str = "this model") -> FusionParts:
        return fusion_parts(model, where)

    def member_fusion_parts(
        self, model: nn.Module, keep: torch.Tensor, where: str = "this model"
    ) -> tuple[FusionParts, torch.Tensor]:
        """With a text tower: the image tower's parts with this member's class embeddings, made
        by its own text tower keeping the heads of ``keep``'s text layers, and the image
        tower's rows of ``keep``."""
        parts = fusion_parts(model, where)
        if not _joint(model):
            return parts, keep
        image_layers = _image_layers(model)
        text_keep = keep[image_layers:]
        if bool(text_keep.sum() == sum(OPENCLIP_TEXT.layout(model.text).num_heads)):
            embeddings = model.class_embeddings.detach()
        else:
            embeddings = _text_class_embeddings(model.text, text_keep)
        zero_shot = replace(parts.zero_shot, class_embeddings=embeddings.to(model.class_embeddings))
        return replace(parts, zero_shot=zero_shot), keep[:image_layers]


OPENCLIP = OpenClipFamily()
