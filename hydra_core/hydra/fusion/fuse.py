"""Fusing members of any family: each member's family reads it into canonical parts
(:meth:`~hydra_core.models.family.ModelFamily.fusion_parts`), and the parts' ``kind`` picks the
fused model (:data:`FUSED_MODELS`); nothing here asks which family a member is from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import nn

from hydra_core.hydra.fusion import post_norm, pre_norm
from hydra_core.hydra.fusion.config import agreed_architecture
from hydra_core.hydra.fusion.post_norm import HydraText
from hydra_core.hydra.fusion.pre_norm import HydraViT
from hydra_core.hydra.fusion.tensors import kept_head_indices
from hydra_core.hydra.fusion.zero_shot import HydraZeroShot, members_zero_shot_head
from hydra_core.models.adapter import HeadLayout, UnsupportedModelError, as_keep_mask, family_of
from hydra_core.models.parts import FusionParts


class FusedModel(NamedTuple):
    """How members of one block form become one model."""

    #: (parts, where) -> what members must agree on (raises naming what cannot be fused)
    architecture: Callable[[FusionParts, str], dict]
    #: (agreed architecture, each member's parts, each member's kept heads per layer) -> model
    fuse: Callable[[dict, Sequence[FusionParts], Sequence[Sequence[torch.Tensor]]], nn.Module]


#: the fused model of each block form (``FusionParts.kind``)
FUSED_MODELS: dict[str, FusedModel] = {
    "pre-norm": FusedModel(pre_norm.architecture, pre_norm.fuse),
    "post-norm": FusedModel(post_norm.architecture, post_norm.fuse),
}


def ensemble_probs(member_logits: torch.Tensor) -> torch.Tensor:
    """(B, M, C) member logits -> (B, C): the mean of the members' softmax probabilities (fp32)."""
    if member_logits.ndim != 3:
        raise ValueError(
            "member logits must have shape (batch, members, classes), "
            f"got {tuple(member_logits.shape)}"
        )
    return member_logits.float().softmax(dim=-1).mean(dim=1)


def fuse_members(
    members: Sequence[tuple[nn.Module, torch.Tensor]],
) -> HydraViT | HydraText | HydraZeroShot:
    """Fuse M (model, keep) pairs into one model that runs every member in one pass.

    Each model is the same object M times for zero-shot members, or separately fine-tuned (possibly
    already structurally pruned) models; ``keep`` is a head mask validated against that model's own
    layout (True = kept). Members must be of one family and agree on the architecture (embedding
    width, depth, head dim, outputs, pooling, prefix tokens, ...). MLPs are averaged over members;
    when they are all identical, member 0's weights are taken as they are, so zero-shot fusion
    reproduces every member's outputs. By the members' block form:

    - pre-norm (timm VisionTransformers, OpenCLIP image towers ``clip_model.visual``): a
      :class:`~hydra_core.hydra.fusion.pre_norm.HydraViT` giving the members' logits (B, M, C),
      or for towers their image embeddings (B, M, D). Zero-shot classifiers
      (:class:`~hydra_core.models.zero_shot.ZeroShotClassifier`), which must share their classes,
      prompt templates and logit scale, give a
      :class:`~hydra_core.hydra.fusion.zero_shot.HydraZeroShot`: the members' zero-shot logits
      (B, M, C), each against its own class embeddings (with the text tower in the layout, those
      its own pruned text tower makes).
    - post-norm (Hugging Face BERT, RoBERTa, MPNet, DistilBERT sequence classifiers, bare or in a
      TextClassifier): a :class:`~hydra_core.hydra.fusion.post_norm.HydraText` giving the
      members' logits (B, M, C).
    """
    members = list(members)
    if not members:
        raise ValueError("cannot fuse an empty list of members")
    pairs = [_as_pair(i, member) for i, member in enumerate(members)]
    families = []
    for i, (model, _) in enumerate(pairs):
        try:
            families.append(family_of(model))
        except UnsupportedModelError as error:
            raise UnsupportedModelError(f"member {i}: {error}") from None
    if any(family is not families[0] for family in families):
        listing = ", ".join(f"member {i} is a {f.name} model" for i, f in enumerate(families))
        raise ValueError(f"members disagree on the model family: {listing}")
    parts, heads, specs = [], [], []
    for i, ((model, keep), family) in enumerate(zip(pairs, families, strict=True)):
        where = f"member {i}"
        try:
            own = family.layout(model)
        except UnsupportedModelError:
            family.fusion_parts(model, where)  # raises, naming the member and the cause
            raise
        try:
            keep = as_keep_mask(own, keep)
        except (ValueError, TypeError) as error:
            raise type(error)(f"{where}: {error}") from None
        # a model with towers reads its other towers' kept heads into the parts (CLIP: the
        # member's class embeddings) and gives the mask of the tower that is fused
        member, keep = family.member_fusion_parts(model, keep, where)
        layout = HeadLayout(member.num_heads, member.head_dim, member.embed_dim)
        keep = as_keep_mask(layout, keep)
        parts.append(member)
        heads.append(kept_head_indices(keep, layout.num_heads))
        specs.append(FUSED_MODELS[member.kind].architecture(member, where))
    zero_shot = members_zero_shot_head([p.zero_shot for p in parts])
    spec = agreed_architecture(specs)
    fused = FUSED_MODELS[parts[0].kind].fuse(spec, parts, heads)
    if zero_shot is None:
        return fused
    z = zero_shot
    return HydraZeroShot(fused, z.class_embeddings, z.logit_scale, z.classes, z.templates)


def check_fusable(model: nn.Module) -> None:
    """Raise :class:`UnsupportedModelError` saying why members of ``model`` cannot be fused, so
    that a user learns it when choosing the model, not at the last step."""
    parts = family_of(model).fusion_parts(model)
    FUSED_MODELS[parts.kind].architecture(parts, "this model")


def _as_pair(index: int, member: object) -> tuple[nn.Module, object]:
    pair = isinstance(member, (tuple, list)) and len(member) == 2
    if not pair or not isinstance(member[0], nn.Module):
        raise TypeError(f"member {index} must be a (model, keep) pair, got {type(member).__name__}")
    return member[0], member[1]
