"""A fused image tower with a zero-shot head: :class:`HydraZeroShot` (zero-shot CLIP, paper
Section 5.3).

Members that are zero-shot classifiers (an image tower, then ``logit_scale * cos(embedding, class
embedding)``; :class:`~hydra_core.models.parts.ZeroShotHead`) fuse into their towers' fused model
(:class:`~hydra_core.hydra.fusion.pre_norm.HydraViT`, giving each member's embedding, (B, M, D))
followed by the zero-shot head: member m's embedding against member m's class embeddings
(:func:`members_zero_shot_head`), (B, M, C). Members pruned in the image tower alone share one
set of class embeddings; members whose text heads were pruned too (the joint layout) each have
the class embeddings of their own pruned text tower. ``save_hydra`` stores it as the tower plus
the head: the class embeddings (M, C, D) as the tensor ``zero_shot.class_embeddings``, the logit
scale, classes and prompt templates as the header's ``zero_shot`` entry (JSON); a file written
before the class embeddings were per member holds one (C, D) matrix, which every member shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from hydra_core.hydra.fusion.pre_norm import HydraConfig, HydraViT
from hydra_core.models.parts import ZeroShotHead

#: the header entry (and tensor name prefix) of a zero-shot head saved with its image tower
ZERO_SHOT_ENTRY = "zero_shot"
#: the tensor of a saved :class:`HydraZeroShot` that holds its class embeddings
CLASS_EMBEDDINGS = f"{ZERO_SHOT_ENTRY}.class_embeddings"


class HydraZeroShot(nn.Module):
    """A fused OpenCLIP image tower with a zero-shot head: ``forward(images)`` -> (B, M, C), each
    member's ``logit_scale * cos(image embedding, class embedding)`` against its own class
    embeddings, as :meth:`~hydra_core.models.zero_shot.ZeroShotClassifier.logits_from_embeddings`
    computes it.

    Args:
        visual: the fused tower, giving the members' embeddings (B, M, D).
        class_embeddings: (M, C, D), each member's, normalised (ZeroShotClassifiers' buffers,
            taken as they are); (C, D): one matrix every member shares.
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
        width, members = visual.config.num_classes, visual.num_members
        if class_embeddings.ndim == 2:
            class_embeddings = class_embeddings.expand(members, *class_embeddings.shape)
        if tuple(class_embeddings.shape) != (members, len(classes), width):
            raise ValueError(
                f"class embeddings must have shape ({members}, {len(classes)}, {width}) for "
                f"{members} members, {len(classes)} classes and {width}-wide image embeddings, "
                f"got {tuple(class_embeddings.shape)}"
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
        """The members' image embeddings (B, M, D) -> logits (B, M, C)."""
        weights = self.class_embeddings.to(embeddings.dtype)  # (M, C, D)
        scale = self.logit_scale.to(embeddings.dtype)
        scaled = scale * F.normalize(embeddings, dim=-1).transpose(0, 1)  # (M, B, D)
        return (scaled @ weights.transpose(-1, -2)).transpose(0, 1)  # (M, B, C) -> (B, M, C)

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


def members_zero_shot_head(heads: Sequence[ZeroShotHead | None]) -> ZeroShotHead | None:
    """The members' zero-shot head: their class embeddings stacked (M, C, D), once every member
    is checked to have the same classes, prompt templates, logit scale and embedding width; None
    when no member has one. A ValueError names the members that differ, and in what."""
    if len({head is None for head in heads}) > 1:
        listing = ", ".join(
            f"member {i} is {'a zero-shot classifier' if h is not None else 'an image tower'}"
            for i, h in enumerate(heads)
        )
        raise ValueError(
            f"members must be all zero-shot classifiers or all image towers: {listing}"
        )
    first = heads[0]
    if first is None:
        return None

    def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.shape == b.shape and torch.equal(a.cpu(), b.cpu())

    for i, other in enumerate(heads[1:], start=1):
        differences = (
            ("classes", first.classes == other.classes, f"{first.classes} vs {other.classes}"),
            ("prompt templates", first.templates == other.templates, ""),
            (
                "class embeddings' shape",
                first.class_embeddings.shape == other.class_embeddings.shape,
                f"{tuple(first.class_embeddings.shape)} vs {tuple(other.class_embeddings.shape)}",
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
                    f"zero-shot members must share their classes, prompts and logit scale, but "
                    f"member {i} and member 0 differ in their {what}{detail}; build every member "
                    "on the same classifier"
                )
    device = first.class_embeddings.device
    stacked = torch.stack([h.class_embeddings.detach().to(device) for h in heads])  # (M, C, D)
    return replace(first, class_embeddings=stacked)
