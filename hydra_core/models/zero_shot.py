"""Zero-shot CLIP classification (paper section 5.3): an OpenCLIP image tower whose classifier is
the text tower's embeddings of prompts, one per class.

``logits = logit_scale * cos(image embedding, class embedding)``, the computation of CLIP's own
zero-shot recipe: each prompt ("A photo of a {label}.") is embedded by the text tower and
normalised; with several templates, a class's normalised embeddings are averaged and normalised
again (OpenAI's prompt ensembling, as ``open_clip.build_zero_shot_classifier``).

:class:`ZeroShotClassifier` holds the image tower (``visual``, an open_clip ``VisionTransformer``,
whose heads Hydra Lab prunes) and the class embeddings as a buffer: the text tower is used once,
to build them, and is not part of the classifier.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

#: the paper's prompt (section 5.3)
DEFAULT_TEMPLATE = "A photo of a {label}."


class ZeroShotClassifier(nn.Module):
    """An image tower with prompt embeddings as its classifier: ``forward(images)`` -> (B, C).

    Args:
        visual: the image tower (``clip_model.visual``), mapping images to embeddings (B, D).
        class_embeddings: (C, D), one embedding per class (normalised here).
        logit_scale: the multiplier of the cosine similarities (CLIP's ``logit_scale.exp()``).
        classes: the class names, index = label.
        templates: the prompt templates the embeddings were made from (``{label}`` marks the
            class name).
    """

    def __init__(
        self,
        visual: nn.Module,
        class_embeddings: torch.Tensor,
        logit_scale: float,
        classes: Sequence[str],
        templates: Sequence[str] = (DEFAULT_TEMPLATE,),
    ) -> None:
        super().__init__()
        if class_embeddings.ndim != 2 or len(class_embeddings) != len(classes):
            raise ValueError(
                f"class_embeddings must have shape ({len(classes)}, D) for {len(classes)} "
                f"classes, got {tuple(class_embeddings.shape)}"
            )
        self.visual = visual
        self.register_buffer("class_embeddings", F.normalize(class_embeddings.detach(), dim=-1))
        self.register_buffer("logit_scale", torch.tensor(float(logit_scale)))
        self.classes = tuple(classes)
        self.templates = tuple(templates)
        self.num_classes = len(self.classes)

    def logits_from_embeddings(self, embeddings: torch.Tensor) -> torch.Tensor:
        """Image embeddings (..., D) -> logits (..., C)."""
        weights = self.class_embeddings.to(embeddings.dtype)
        return self.logit_scale.to(embeddings.dtype) * F.normalize(embeddings, dim=-1) @ weights.T

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.logits_from_embeddings(self.visual(images))


def prompts(label: str, templates: Sequence[str]) -> list[str]:
    """The prompts of one class: each template with ``{label}`` replaced by ``label``."""
    return [template.replace("{label}", label) for template in templates]


@torch.no_grad()
def class_embeddings(
    clip_model: nn.Module,
    tokenizer: Callable[[list[str]], torch.Tensor],
    classes: Sequence[str],
    templates: Sequence[str] = (DEFAULT_TEMPLATE,),
) -> torch.Tensor:
    """(C, D) normalised class embeddings from CLIP's text tower: per class, the normalised
    embeddings of its prompts averaged and normalised again."""
    device = next(clip_model.parameters()).device
    rows = []
    for label in classes:
        tokens = tokenizer(prompts(label, templates)).to(device)
        embedded = F.normalize(clip_model.encode_text(tokens).float(), dim=-1)
        rows.append(F.normalize(embedded.mean(0), dim=-1))
    return torch.stack(rows)


def zero_shot_classifier(
    clip_model: nn.Module,
    tokenizer: Callable[[list[str]], torch.Tensor],
    classes: Sequence[str],
    templates: Sequence[str] = (DEFAULT_TEMPLATE,),
) -> ZeroShotClassifier:
    """A :class:`ZeroShotClassifier` from an open_clip ``CLIP`` model (its ``visual`` is shared,
    not copied) and its tokenizer."""
    embeddings = class_embeddings(clip_model, tokenizer, classes, templates)
    scale = float(clip_model.logit_scale.detach().exp())
    return ZeroShotClassifier(clip_model.visual, embeddings, scale, classes, templates).eval()
