"""A loaded model, whatever its source: the classifier, the preprocessing its inputs take, and
what the model card shows; and the checks of a model against an ID set (:func:`check_fit`,
:func:`chance_note`).

A :class:`LoadedModel` bundles the classifier with the preprocessing that turns a data set's
``inputs`` into its input: uint8 images (N, C, H, W) for image models, a tuple of strings for text
models (their tokenizer). So data sets stay model-agnostic and every caller preprocesses the same
way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from hydra_core.cache import model_fingerprint
from hydra_core.data.images import ImageSet
from hydra_core.errors import InputError
from hydra_core.masks import model_identity
from hydra_core.models.adapter import family_of, head_layout
from hydra_core.models.modality import IMAGE_MODALITY, TEXT_MODALITY, Modality
from hydra_core.models.preprocess import input_format
from hydra_core.models.text import hf_model
from hydra_core.models.zero_shot import ZeroShotClassifier

if TYPE_CHECKING:
    from hydra_core.data.text import TextSet


@dataclass
class LoadedModel:
    """A classifier ready for analysis.

    Args:
        name: identifier shown in the app and written into mask files.
        model: a timm VisionTransformer in eval mode (or, loaded from a file ``hydra`` exported,
            a fused :class:`~hydra_core.hydra.fused.HydraViT`, for evaluation only), or a
            Hugging Face text classifier in a :class:`~hydra_core.models.text.TextClassifier`.
        preprocess: a data set's inputs -> model input: uint8 images (N, C, H, W) -> float
            tensor, or a tuple of strings -> packed token ids and masks (N, 2, T).
        description: one line for the model card.
        classes: class names, index = label, when known.
        details: more entries for the model card (e.g. which layers were fine-tuned).
    """

    name: str
    model: nn.Module
    preprocess: Callable
    description: str = ""
    classes: tuple[str, ...] | None = None
    details: dict = field(default_factory=dict)

    def fingerprint(self) -> str:
        return model_fingerprint(self.model)

    def identity(self) -> dict:
        """The ``model`` block of a mask file: name, layers, heads and the weights' fingerprint."""
        return model_identity(self.name, head_layout(self.model), self.fingerprint())

    @property
    def modality(self) -> Modality:
        """What the model's preprocessing takes (images or texts), and the data that follows."""
        if self.is_fused:
            return TEXT_MODALITY if type(self.model).__name__ == "HydraText" else IMAGE_MODALITY
        return family_of(self.model).modality

    @property
    def image_format(self) -> tuple[int, int] | None:
        """(channels, size) of an image model's input, which image folders are brought to (the
        ``image_format`` of :meth:`~hydra_core.models.modality.Modality.benchmark`); None for a
        text model."""
        return input_format(self.model) if self.modality is IMAGE_MODALITY else None

    @property
    def is_zero_shot(self) -> bool:
        """An OpenCLIP zero-shot classifier: its classes are the ID set's, named in prompts."""
        return isinstance(self.model, ZeroShotClassifier)

    def num_outputs(self) -> int:
        """How many classes the model predicts (the width of its logits)."""
        if self.is_fused:  # a fused zero-shot model says C itself; its config's width is D
            return int(getattr(self.model, "num_classes", None) or self.model.config.num_classes)
        if self.modality is TEXT_MODALITY:
            return int(hf_model(self.model).config.num_labels)
        known = getattr(self.model, "num_classes", None)
        if isinstance(known, int) and known > 0:
            return known
        channels, size = input_format(self.model)
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            logits = self.model(torch.zeros(1, channels, size, size, device=device))
        return int(logits.shape[-1])

    @property
    def is_fused(self) -> bool:
        """A fused Hydra model (from a file ``hydra`` wrote): it can be evaluated, not analysed."""
        config = getattr(self.model, "config", None)
        # a Hugging Face model's config (PretrainedConfig) takes any key config.json holds
        hugging_face = type(config).__module__.startswith("transformers.")
        return hasattr(config, "kept_heads") and not hugging_face

    def check_analysable(self) -> None:
        """Refuse the head analyses on a fused Hydra model, with what to do instead."""
        if self.is_fused:
            raise InputError(
                f"{self.name} is a fused Hydra model: it can be evaluated (eval, info), but the "
                "head analyses need the model its members were pruned from; load that one"
            )

    def card(self) -> dict:
        """Family, layers, heads, parameters (and ``details``): the static part of the model
        card."""
        if self.is_fused:
            config = self.model.config
            return {
                "name": self.name,
                "members": config.num_members,
                "layers": config.depth,
                "heads": "+".join(str(sum(map(len, kept))) for kept in config.kept_heads),
                "head_dim": config.head_dim,
                "embed_dim": config.embed_dim,
                "params": sum(p.numel() for p in self.model.parameters()),
            }
        layout = head_layout(self.model)
        return {
            "name": self.name,
            "family": family_of(self.model).name,
            "layers": layout.num_layers,
            "heads": layout.max_heads,
            "head_dim": layout.head_dim,
            "embed_dim": layout.embed_dim,
            "params": sum(p.numel() for p in self.model.parameters()),
            **self.details,
        }


def check_fit(
    loaded: LoadedModel, id_set: ImageSet | TextSet, *, own_folder: bool = False
) -> list[str]:
    """Check that the model's outputs are the ID set's classes; returns warnings to show.

    Raises :class:`InputError` when the model has no classifier or the numbers differ, except
    for an image folder of the user's own (``own_folder``) with fewer classes than the model has
    outputs (a subset of its classes: allowed, with a warning, since label i counts as output i).
    Warns when the set has a single class."""
    if getattr(loaded.model, "num_classes", None) == 0:
        raise InputError(
            f"{loaded.name} has no classifier (num_classes=0): Hydra Lab needs a model whose "
            "outputs are the in-distribution classes; load it with its trained head"
        )
    outputs, classes = loaded.num_outputs(), id_set.classes or ()
    where = f"the ID set {id_set.name!r}" + (f" ({id_set.source})" if own_folder else "")
    if outputs < 2:
        raise InputError(
            f"{loaded.name} has {outputs} output: a classifier of one class gives every input "
            "probability 1, so no accuracy, calibration or OOD score means anything; choose a "
            "model (or ID classes) of two classes or more"
        )
    if len(classes) > outputs or (len(classes) < outputs and not own_folder):
        raise InputError(
            f"{loaded.name} has {outputs} outputs but {where} has {len(classes)} classes: a "
            "classifier must predict the ID classes (is this the right model, with its trained "
            "head?); choose a model trained on these classes, or an ID set of its classes"
        )
    notes = []
    if len(classes) < outputs:
        notes.append(
            f"{where} has {len(classes)} classes and {loaded.name} {outputs} outputs: label i "
            "counts as output i; if the folder holds other classes than the model's first ones, "
            "give the model's classes in order (--classes / 'Class order' on Setup)"
        )
    present = sorted(set(id_set.labels.tolist())) if id_set.labels is not None else []
    if len(present) == 1:
        label = classes[present[0]] if present[0] < len(classes) else present[0]
        notes.append(
            f"{where} holds a single class ({label}): accuracy is trivial to reach for a guess, "
            "and calibration says little; give data of every class the model predicts"
        )
    return notes


def chance_note(accuracy: float, num_classes: int, *, zero_shot: bool = False) -> str | None:
    """A warning when an accuracy is near chance (at most 1.5 / classes), else None: the sign
    of labels that do not match the model's classes (for a ``zero_shot`` classifier, whose
    classes are the folder's own: of class names that do not describe the images)."""
    if num_classes > 1 and accuracy <= 1.5 / num_classes and zero_shot:
        return (
            f"ID accuracy {accuracy:.3f} is near chance (1/{num_classes} = {1 / num_classes:.3f}): "
            "a zero-shot classifier knows the classes only by name; check that the class folders' "
            "names say what the images show, and that the weights are pretrained"
        )
    if num_classes > 1 and accuracy <= 1.5 / num_classes:
        return (
            f"ID accuracy {accuracy:.3f} is near chance (1/{num_classes} = {1 / num_classes:.3f}): "
            "are the ID data's classes (folder names, or a file's labels) in the model's output "
            "order? Give the order with --classes (Setup: 'Class order')"
        )
    return None
