"""Hydra fusion of OpenCLIP image towers (paper Section 4.2; zero-shot CLIP as in Section 5.3).

An open_clip ``VisionTransformer`` (``clip_model.visual``) is a pre-norm ViT that
:class:`~hydra_core.hydra.fused.HydraViT` expresses exactly, so its members get no fused model of
their own: their tensors are mapped onto HydraViT's and built by
:func:`~hydra_core.hydra.fused.assemble_vit`, with the same padding, sharing and MLP merging as
timm members.

- stem: ``conv1`` (no bias) -> the patch embedding; ``class_embedding`` -> the class token;
  ``positional_embedding`` (its row 0 is the class token's) -> the position embedding;
  ``ln_pre`` -> ``norm_pre``;
- blocks (``ResidualAttentionBlock``, ``x + ls_1(attn(ln_1(x)))``, then
  ``x + ls_2(mlp(ln_2(x)))``): the ``nn.MultiheadAttention``'s ``in_proj_weight`` / ``in_proj_bias``
  rows of the kept heads (q | k | v, head-major) -> Q/K/V; the ``out_proj`` columns of the kept
  heads, ``ls_1`` folded in -> W_O; ``ln_1`` / ``ln_2`` -> norm1 / norm2; ``ls_2`` -> ls2;
  ``mlp.c_fc`` / ``mlp.c_proj`` -> the merged MLP (GELU or QuickGELU);
- pooling: ``pool_type`` 'tok' -> the class token, 'avg' -> the mean of the patch tokens;
  ``ln_post`` before pooling (HydraViT's ``norm``) or, with ``final_ln_after_pool``, after it
  (``fc_norm``);
- head: ``proj`` (d, D) -> a linear layer with a zero bias.

So the fused tower gives the members' image embeddings, (B, M, D). Zero-shot classifiers
(:class:`~hydra_core.models.zero_shot.ZeroShotClassifier`) that share their class embeddings and
logit scale fuse into a :class:`HydraZeroShot`: the fused tower, then each member's embedding
against the class embeddings, (B, M, C). :func:`~hydra_core.hydra.fused.fuse_members` calls
:func:`fuse_clip_members` for OpenCLIP models; ``save_hydra`` / ``load_hydra`` store both kinds.

Refused, with one line saying why: attentional pooling (CoCa), ``pool_type='none'``, towers
without ``proj`` or returning their tokens, open_clip's custom blocks (q/k norm, scaled cosine
attention, head scaling), attention with extra key/value biases, norms other than LayerNorm.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from timm.layers import LayerScale as TimmLayerScale
from torch import nn

from hydra_core.hydra.fused import (
    ZERO_SHOT_ENTRY,
    BlockParts,
    HydraConfig,
    HydraViT,
    StemParts,
    activation_name,
    agreed_architecture,
    assemble_vit,
    block_tensors,
    head_tensors,
    hydra_config,
    kept_head_indices,
    norm_eps,
    norm_tensors,
    plain_patch_conv,
    register_clip_fusion,
    stem_tensors,
)
from hydra_core.models.adapter import HeadLayout, UnsupportedModelError, as_keep_mask, head_layout
from hydra_core.models.zero_shot import ZeroShotClassifier

#: open_clip's ``pool_type`` -> HydraViT's ``global_pool`` ('avg' leaves the class token out)
POOLS = {"tok": "token", "avg": "avg"}
#: the tensor of a saved :class:`HydraZeroShot` that holds its class embeddings
CLASS_EMBEDDINGS = f"{ZERO_SHOT_ENTRY}.class_embeddings"


class HydraZeroShot(nn.Module):
    """A fused OpenCLIP image tower with a zero-shot head: ``forward(images)`` -> (B, M, C), each
    member's ``logit_scale * cos(image embedding, class embedding)``, as
    :meth:`~hydra_core.models.zero_shot.ZeroShotClassifier.logits_from_embeddings` computes it.

    Args:
        visual: the fused tower, giving the members' embeddings (B, M, D).
        class_embeddings: (C, D), normalised (a ZeroShotClassifier's buffer, taken as it is).
        logit_scale: the multiplier of the cosine similarities.
        classes: the class names, index = label.
        templates: the prompt templates the class embeddings were made from.

    Attributes:
        config, num_members, kept_heads: the tower's (so code reading a fused model's config
            works on this one too; ``config.num_classes`` is the embedding width D).
        num_classes: C.
    """

    def __init__(
        self,
        visual: HydraViT,
        class_embeddings: torch.Tensor,
        logit_scale: float | torch.Tensor,
        classes: Sequence[str],
        templates: Sequence[str],
    ) -> None:
        super().__init__()
        width = visual.config.num_classes
        if tuple(class_embeddings.shape) != (len(classes), width):
            raise ValueError(
                f"class embeddings must have shape ({len(classes)}, {width}) for {len(classes)} "
                f"classes and {width}-wide image embeddings, got {tuple(class_embeddings.shape)}"
            )
        self.visual = visual
        self.register_buffer("class_embeddings", class_embeddings.detach().clone())
        self.register_buffer("logit_scale", torch.as_tensor(logit_scale).detach().float().clone())
        self.config: HydraConfig = visual.config
        self.num_members = visual.num_members
        self.kept_heads = visual.kept_heads
        self.classes = tuple(classes)
        self.templates = tuple(templates)
        self.num_classes = len(self.classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.logits_from_embeddings(self.visual(images))  # (B, M, D) -> (B, M, C)

    def logits_from_embeddings(self, embeddings: torch.Tensor) -> torch.Tensor:
        """Image embeddings (..., D) -> logits (..., C)."""
        weights = self.class_embeddings.to(embeddings.dtype)
        return self.logit_scale.to(embeddings.dtype) * F.normalize(embeddings, dim=-1) @ weights.T

    def member_head_counts(self) -> list[list[int]]:
        """Kept heads per member per layer, as counts."""
        return self.visual.member_head_counts()

    def file_parts(self) -> tuple[dict[str, torch.Tensor], dict]:
        """The zero-shot head as ``save_hydra`` stores it beside the tower: its tensors, and its
        header entry (logit scale, classes, templates)."""
        entry = {
            "logit_scale": float(self.logit_scale),  # fp32 -> float -> fp32 is exact
            "classes": list(self.classes),
            "templates": list(self.templates),
        }
        return {CLASS_EMBEDDINGS: self.class_embeddings}, entry

    @classmethod
    def from_file_parts(
        cls, visual: HydraViT, tensors: dict[str, torch.Tensor], entry: object
    ) -> HydraZeroShot:
        """The inverse of :meth:`file_parts`; a ValueError naming what is missing or unknown."""
        if not isinstance(entry, dict):
            raise ValueError("it is not a JSON object")
        expected = {"logit_scale", "classes", "templates"}
        if set(entry) != expected:
            raise ValueError(f"it has the fields {sorted(entry)}; expected {sorted(expected)}")
        if set(tensors) != {CLASS_EMBEDDINGS}:
            raise ValueError(
                f"the zero-shot tensors are {sorted(tensors)}; expected the one tensor "
                f"{CLASS_EMBEDDINGS!r}"
            )
        return cls(
            visual,
            tensors[CLASS_EMBEDDINGS],
            float(entry["logit_scale"]),
            [str(c) for c in entry["classes"]],
            [str(t) for t in entry["templates"]],
        )


def fuse_clip_members(
    members: Sequence[tuple[nn.Module, torch.Tensor]],
) -> HydraViT | HydraZeroShot:
    """Fuse M (model, keep) pairs of OpenCLIP image towers into one model.

    Each model is an open_clip ``VisionTransformer`` (``clip_model.visual``) - the same object M
    times for zero-shot members, or separately modified or structurally pruned copies - or a
    :class:`~hydra_core.models.zero_shot.ZeroShotClassifier` around one; ``keep`` is a head mask
    validated against that tower's own layout (its heads per layer, read from ``attn.num_heads``;
    True = kept). MLPs are averaged over members (member 0's when all are identical).

    Returns:
        For towers, a :class:`~hydra_core.hydra.fused.HydraViT` giving the members' image
        embeddings (B, M, D); for zero-shot classifiers, which must share their classes, prompt
        templates, class embeddings and logit scale, a :class:`HydraZeroShot` giving the members'
        logits (B, M, C).
    """
    members = list(members)
    if not members:
        raise ValueError("cannot fuse an empty list of members")
    parsed = [_parse_member(i, member) for i, member in enumerate(members)]
    classifiers = [classifier for _, classifier, _, _, _ in parsed]
    if len({c is None for c in classifiers}) > 1:
        listing = ", ".join(
            f"member {i} is {'a zero-shot classifier' if c is not None else 'an image tower'}"
            for i, c in enumerate(classifiers)
        )
        raise ValueError(
            f"members must be all zero-shot classifiers or all image towers: {listing}"
        )
    classifier = None if classifiers[0] is None else _shared_classifier(classifiers)
    spec = agreed_architecture([spec for _, _, spec, _, _ in parsed])
    heads = [kept_head_indices(keep, layout) for _, _, _, keep, layout in parsed]
    towers = [tower for tower, _, _, _, _ in parsed]
    tensors = stem_tensors([_stem(t) for t in towers])
    for layer in range(spec["depth"]):
        parts = [_block(t.transformer.resblocks[layer]) for t in towers]
        tensors.update(block_tensors(layer, parts, [h[layer] for h in heads], spec["head_dim"]))
    post = "fc_norm" if spec["final_ln_after_pool"] else "norm"
    tensors.update(norm_tensors(post, [t.ln_post for t in towers]))
    projections = [t.proj.detach() for t in towers]  # (d, D) each
    tensors.update(head_tensors([(p, p.new_zeros(p.shape[1])) for p in projections]))
    fused = assemble_vit(hydra_config(spec, heads), tensors)
    if classifier is None:
        return fused
    c = classifier
    return HydraZeroShot(fused, c.class_embeddings, c.logit_scale, c.classes, c.templates)


def check_clip_fusable(model: nn.Module) -> None:
    """Raise :class:`UnsupportedModelError` saying why members of ``model`` (an image tower or a
    zero-shot classifier) cannot be fused."""
    _architecture(None, model.visual if isinstance(model, ZeroShotClassifier) else model)


def _parse_member(
    index: int, member: object
) -> tuple[nn.Module, ZeroShotClassifier | None, dict, torch.Tensor, HeadLayout]:
    """(tower, zero-shot classifier or None, architecture, validated keep mask, layout)."""
    pair = isinstance(member, (tuple, list)) and len(member) == 2
    if not pair or not isinstance(member[0], nn.Module):
        raise TypeError(f"member {index} must be a (model, keep) pair, got {type(member).__name__}")
    model, keep = member
    classifier = model if isinstance(model, ZeroShotClassifier) else None
    tower = model.visual if classifier is not None else model
    spec, layout = _architecture(index, tower)
    try:
        keep = as_keep_mask(layout, keep)
    except (ValueError, TypeError) as error:
        raise type(error)(f"member {index}: {error}") from None
    return tower, classifier, spec, keep, layout


def _shared_classifier(classifiers: Sequence[ZeroShotClassifier]) -> ZeroShotClassifier:
    """Member 0's classifier, once every member is checked to have the same one."""
    first = classifiers[0]

    def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.shape == b.shape and torch.equal(a.cpu(), b.cpu())

    for i, other in enumerate(classifiers[1:], start=1):
        differences = (
            ("classes", first.classes == other.classes, f"{first.classes} vs {other.classes}"),
            ("prompt templates", first.templates == other.templates, ""),
            (
                "class embeddings",
                same_tensor(first.class_embeddings, other.class_embeddings),
                "",
            ),
            (
                "logit scale",
                same_tensor(first.logit_scale, other.logit_scale),
                f"{float(first.logit_scale):.6g} vs {float(other.logit_scale):.6g}",
            ),
        )
        for what, same, values in differences:
            if not same:
                detail = f" ({values})" if values else ""
                raise ValueError(
                    f"zero-shot members must share their classifier, but member {i} and member 0 "
                    f"differ in their {what}{detail}; build every member on the same class "
                    "embeddings"
                )
    return first


def _architecture(index: int | None, tower: nn.Module) -> tuple[dict, HeadLayout]:
    """What members must agree on, read from an open_clip VisionTransformer, and its head layout
    (the family's: a pruned tower's own head counts); refuses the unsupported."""
    from open_clip.transformer import LayerScale, QuickGELU

    where = "this model" if index is None else f"member {index}"

    def refuse(what: str) -> UnsupportedModelError:
        return UnsupportedModelError(
            f"{where} cannot be fused: {what}; Hydra fusion supports open_clip "
            "VisionTransformers (ResidualAttentionBlock with nn.MultiheadAttention, 'tok' or "
            "'avg' pooling)"
        )

    try:
        # the family refuses custom blocks, attentional pooling, pool_type 'none', returned tokens
        layout = head_layout(tower)
    except UnsupportedModelError as error:
        raise refuse(str(error)) from None
    if tower.proj is None:
        raise refuse("it has no output projection (proj is None)")
    conv = tower.conv1
    if not plain_patch_conv(conv):
        raise refuse("the patch embedding is not a plain non-overlapping Conv2d")
    tokens = tower.grid_size[0] * tower.grid_size[1] + 1
    if tuple(tower.positional_embedding.shape) != (tokens, layout.embed_dim):
        raise refuse(
            f"the position embedding has shape {tuple(tower.positional_embedding.shape)}; "
            f"expected ({tokens}, {layout.embed_dim}) for the class token and the patches"
        )
    eps = norm_eps(where, tower.ln_pre) | norm_eps(where, tower.ln_post)
    acts, hidden = set(), set()
    for layer, block in enumerate(tower.transformer.resblocks):
        for name in ("ls_1", "ls_2"):
            scale = getattr(block, name)
            if not isinstance(scale, (nn.Identity, LayerScale, TimmLayerScale)):
                raise refuse(f"block {layer}: {name} is a {type(scale).__name__}")
        mlp = block.mlp
        parts = dict(mlp.named_children()) if isinstance(mlp, nn.Sequential) else {}
        if list(parts) != ["c_fc", "gelu", "c_proj"] or not all(
            isinstance(parts[n], nn.Linear) for n in ("c_fc", "c_proj")
        ):
            raise refuse(f"block {layer}: the MLP is not open_clip's c_fc, activation, c_proj")
        act = parts["gelu"]
        acts.add("quick_gelu" if isinstance(act, QuickGELU) else activation_name(where, act))
        hidden.add(parts["c_fc"].out_features)
        for norm in (block.ln_1, block.ln_2):
            if not isinstance(norm, nn.LayerNorm):
                raise refuse(f"block {layer} uses {type(norm).__name__}; expected LayerNorm")
            eps |= norm_eps(where, norm)
    for name, values in (("MLP activations", acts), ("MLP widths", hidden), ("LayerNorm eps", eps)):
        if len(values) > 1:
            raise refuse(f"layers differ in {name} ({sorted(values)})")
    spec = {
        "embed_dim": layout.embed_dim,
        "depth": layout.num_layers,
        "head_dim": layout.head_dim,
        "num_classes": int(tower.proj.shape[1]),
        "global_pool": POOLS[tower.pool_type],
        "num_prefix_tokens": 1,
        "class_token": True,
        "reg_tokens": 0,
        "no_embed_class": False,
        "pool_include_prefix": False,
        "pos_embed": True,
        "img_size": tuple(int(s) for s in tower.image_size),
        "patch_size": tuple(int(p) for p in conv.kernel_size),
        "in_chans": int(conv.in_channels),
        "mlp_act": acts.pop(),
        "norm_eps": eps.pop() if eps else 1e-6,
        "final_ln_after_pool": bool(tower.final_ln_after_pool),
        "mlp_hidden": hidden.pop(),
    }
    return spec, layout


def _scale(module: nn.Module) -> torch.Tensor | None:
    """A layer scale's gamma (d,), detached; None for an Identity."""
    return None if isinstance(module, nn.Identity) else module.gamma.detach()


def _stem(tower: nn.Module) -> StemParts:
    bias = tower.conv1.bias
    return StemParts(
        patch_weight=tower.conv1.weight.detach(),  # (d, 3, p, p)
        patch_bias=None if bias is None else bias.detach(),
        cls_token=tower.class_embedding.detach()[None],  # (1, d)
        reg_token=None,
        pos_embed=tower.positional_embedding.detach(),  # (1 + patches, d)
        patch_norm=nn.Identity(),
        norm_pre=tower.ln_pre,
    )


def _block(block: nn.Module) -> BlockParts:
    attn = block.attn
    bias = attn.in_proj_bias
    out_bias = attn.out_proj.bias
    return BlockParts(
        num_heads=int(attn.num_heads),
        qkv_weight=attn.in_proj_weight.detach(),  # (3 * H * d_k, d): q | k | v, head-major
        qkv_bias=None if bias is None else bias.detach(),
        proj_weight=attn.out_proj.weight.detach(),  # (d, H * d_k)
        proj_bias=None if out_bias is None else out_bias.detach(),
        ls1=_scale(block.ls_1),
        ls2=_scale(block.ls_2),
        norm1=block.ln_1,
        norm2=block.ln_2,
        fc1=block.mlp.c_fc,
        fc2=block.mlp.c_proj,
    )


register_clip_fusion(fuse_clip_members, check_clip_fusable, HydraZeroShot)
