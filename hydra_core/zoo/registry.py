"""One entry point for every model source: the named models (:mod:`hydra_core.zoo.named`: the
Fashion-MNIST ViT, DINOv2-S, the MiniLM and MPNet sentiment classifiers), a timm name, a file, a
Hugging Face name or folder, an OpenCLIP model as a zero-shot classifier (``openclip:...``), and
the kinds of file registered from above (:mod:`hydra_core.zoo.sources`: a fused Hydra file,
registered by :mod:`hydra_core.hydra.source`, which ``hydra_core.load_model``, the CLI and the app
import).

Every source becomes a :class:`~hydra_core.zoo.loaded.LoadedModel`: the classifier with the
preprocessing its inputs take.
"""

from __future__ import annotations

import difflib
import inspect
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from hydra_core.errors import InputError, choice
from hydra_core.hub import from_hub, offline_refusal, timm_offline_hint
from hydra_core.models import hf
from hydra_core.models.adapter import head_layout
from hydra_core.models.preprocess import input_format, model_preprocess
from hydra_core.zoo.loaded import LoadedModel, chance_note, check_fit
from hydra_core.zoo.named import named_model, named_models
from hydra_core.zoo.sources import HUGGING_FACE, OPENCLIP, OPENCLIP_PREFIX, TIMM, file_kind

__all__ = [
    "OPENCLIP_PREFIX",
    "LoadedModel",
    "chance_note",
    "check_fit",
    "load_model",
    "parse_arch_kwargs",
    "text_preprocess",
]


def _load_named(name: str, options: dict) -> LoadedModel:
    """A named model, with the options its loader takes (an InputError naming the others)."""
    loader = named_model(name).loader
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
    opened = open_openclip(OPENCLIP.name_of(source))
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
        TIMM.source(name), model.eval(), model_preprocess(model), f"timm {name}, pretrained"
    )


def _check_timm_name(name: str) -> None:
    import timm

    if name not in timm.list_models():
        close = difflib.get_close_matches(name, timm.list_models(), n=5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise InputError(
            f"unknown model {name!r}: not a built-in ({_built_in_names()}), not a file "
            f"or folder, and not a timm model name{hint}; Hugging Face text models: hf:NAME"
        )


def _built_in_names() -> str:
    """The built-in models' names, as the refusals of an unknown model list them."""
    return ", ".join(m.name for m in named_models())


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
    kind = file_kind(meta)
    if kind is not None:
        if arch or arch_kwargs:
            raise InputError(f"{path} is {kind.what}, which says its architecture itself")
        return kind.load(path, meta)
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


def text_preprocess(spec: dict, path: Path):
    """The tokenizer a fused text Hydra file at ``path`` names (its source model's: a named
    model, a Hugging Face name or folder), ready to use; ``spec``: its ``preprocess`` header
    entry (``tokenizer``, ``max_length``)."""
    from hydra_core.models.text import TextPreprocess

    source = spec["tokenizer"]
    named = named_model(source)
    if named is not None and named.tokenizer is not None:
        return TextPreprocess(named.tokenizer(), spec["max_length"], source=named.name)
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
    if OPENCLIP.names(source):
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
    text = HUGGING_FACE.names(source) or hf.is_hf_folder(path)
    named = named_model(source) is not None
    if (named or text) and (arch or arch_kwargs):
        raise InputError(f"--arch and --arch-kwargs apply to checkpoint files, not to {source!r}")
    if named:
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
            raise InputError(
                f"checkpoint file {path} does not exist; check the path, or give a model folder "
                f"or a built-in model ({_built_in_names()})"
            )
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
    if hf.is_hub_name(source) and not TIMM.names(source):
        return _from_hf(hf.load_hub(source))
    return _load_timm(TIMM.name_of(source), arch_kwargs)
