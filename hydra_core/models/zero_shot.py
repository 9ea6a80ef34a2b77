"""Zero-shot CLIP classification (paper section 5.3): an OpenCLIP image tower whose classifier is
the text tower's embeddings of prompts, one per class.

``logits = logit_scale * cos(image embedding, class embedding)``, the computation of CLIP's own
zero-shot recipe: each prompt ("A photo of a {label}.") is embedded by the text tower and
normalised; with several templates, a class's normalised embeddings are averaged and normalised
again (OpenAI's prompt ensembling, as ``open_clip.build_zero_shot_classifier``).

:class:`ZeroShotClassifier` holds the image tower (``visual``, an open_clip ``VisionTransformer``)
and the class embeddings as a buffer. Which heads Hydra Lab prunes is the classifier's *towers*
(:data:`TOWERS`): ``"both"`` (the paper's D.3, the default) keeps the text tower too
(``text``, a :class:`~hydra_core.models.openclip_text.ClipTextTower` with the prompts), so that
the joint head layout holds the image tower's layers, then the text tower's, and a classifier
whose text heads are ablated or pruned computes its class embeddings through its own text tower
(once per pruned classifier, then stored in the buffer; at every forward while an ablation is
on, or gradients may flow into the tower); ``"image"`` leaves the text tower out: it is used
once, to build the embeddings, and only the image tower's heads are pruned.

Loading (:func:`open_openclip`, used by ``load_model("openclip:...")``): an open_clip model name
with a pretrained tag (``ViT-B-32/laion2b_s34b_b79k``; weights from the Hugging Face hub, so
online only) or a checkpoint file, ``hf-hub:org/repo`` (online), or ``local-dir:/path``: a folder
with ``open_clip_config.json`` (``model_cfg`` and optionally ``preprocess_cfg``) and the weights
(``open_clip_model.safetensors`` or ``open_clip_pytorch_model.bin``), as open_clip 3.3 reads it;
the only source that works offline. open_clip is imported here only when a model is opened.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from hydra_core.cache import DiskCache, cache_key
from hydra_core.data.sources import source_path
from hydra_core.errors import InputError
from hydra_core.hub import OPENCLIP_OFFLINE_HINT, from_hub, offline_refusal

#: version of the class embeddings' computation, part of their cache key
EMBEDDINGS_VERSION = 1
#: the paper's prompt (section 5.3)
DEFAULT_TEMPLATE = "A photo of a {label}."
#: named sets of prompt templates: the paper's one prompt, and open_clip's ImageNet sets (OpenAI's
#: 80 templates of CLIP's prompt ensembling, and the 7 of its "simple" subset)
PROMPT_SETS = ("paper", "openai", "simple")
#: which towers' heads a zero-shot classifier prunes: both (the paper's D.3: "we prune 24 attention
#: heads jointly from both encoders"), or the image tower alone (its Appendix E.3.2)
TOWERS = ("both", "image")
DEFAULT_TOWERS = "both"
#: a key of open_clip_config.json saying its weights are a random initialisation (no zero-shot
#: result): shown on the model card
RANDOM_WEIGHTS_KEY = "random_weights"
#: what to do without the network, in every message about a download
OFFLINE_HINT = OPENCLIP_OFFLINE_HINT


class ZeroShotClassifier(nn.Module):
    """An image tower with prompt embeddings as its classifier: ``forward(images)`` -> (B, C).

    Args:
        visual: the image tower (``clip_model.visual``), mapping images to embeddings (B, D).
        class_embeddings: (C, D), one embedding per class (normalised here); None with ``text``:
            computed by it.
        logit_scale: the multiplier of the cosine similarities (CLIP's ``logit_scale.exp()``).
        classes: the class names, index = label.
        templates: the prompt templates the embeddings were made from (``{label}`` marks the
            class name).
        text: the text tower with the prompts (:class:`~hydra_core.models.openclip_text.
            ClipTextTower`), whose heads then join the image tower's (towers "both"); None: the
            image tower's heads alone (towers "image").
    """

    def __init__(
        self,
        visual: nn.Module,
        class_embeddings: torch.Tensor | None,
        logit_scale: float,
        classes: Sequence[str],
        templates: Sequence[str] = (DEFAULT_TEMPLATE,),
        text: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if class_embeddings is None:
            if text is None:
                raise ValueError("give the class embeddings, or the text tower that makes them")
            with torch.no_grad():
                class_embeddings = text.class_embeddings()
        if class_embeddings.ndim != 2 or len(class_embeddings) != len(classes):
            raise ValueError(
                f"class_embeddings must have shape ({len(classes)}, D) for {len(classes)} "
                f"classes, got {tuple(class_embeddings.shape)}"
            )
        if text is not None and len(text.prompts) != len(classes) * len(templates):
            raise ValueError(
                f"the text tower holds {len(text.prompts)} prompts; {len(classes)} classes x "
                f"{len(templates)} templates need {len(classes) * len(templates)}"
            )
        self.visual = visual
        self.text = text
        self.register_buffer("class_embeddings", F.normalize(class_embeddings.detach(), dim=-1))
        self.register_buffer("logit_scale", torch.tensor(float(logit_scale)))
        self.classes = tuple(classes)
        self.templates = tuple(templates)
        self.num_classes = len(self.classes)

    @property
    def towers(self) -> str:
        """Whose heads are pruned: "both" with a text tower, else "image"."""
        return "image" if self.text is None else "both"

    def class_weights(self) -> torch.Tensor:
        """(C, D) normalised class embeddings: the stored ones, or the text tower's as it runs
        now while an intervention is on it or gradients may flow into it."""
        if self.text is not None and self.text.live():
            return self.text.class_embeddings()
        return self.class_embeddings

    @torch.no_grad()
    def refresh_class_embeddings(self) -> None:
        """Recompute the stored class embeddings with the text tower (after its blocks were
        replaced, or its weights changed)."""
        if self.text is not None:
            with torch.inference_mode(False):  # a buffer that stays usable outside
                self.class_embeddings = self.text.class_embeddings().detach().clone()

    def _apply(self, fn, recurse=True):
        """``.to()``, ``.double()``, ...: the stored class embeddings follow the device; a text
        tower whose dtype changes makes them again in the new precision."""
        before = None if self.text is None else next(self.text.parameters()).dtype
        super()._apply(fn, recurse)
        if before is not None and next(self.text.parameters()).dtype != before:
            self.refresh_class_embeddings()
        return self

    def logits_from_embeddings(
        self, embeddings: torch.Tensor, class_embeddings: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Image embeddings (..., D) -> logits (..., C), against ``class_embeddings`` (..., C, D),
        normalised (default: :meth:`class_weights`)."""
        weights = self.class_weights() if class_embeddings is None else class_embeddings
        weights = weights.to(embeddings.dtype)
        scale = self.logit_scale.to(embeddings.dtype)
        return scale * F.normalize(embeddings, dim=-1) @ weights.transpose(-1, -2)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.logits_from_embeddings(self.visual(images))


def class_words(name: str) -> str:
    """A class name as words for a prompt: underscores and hyphens of folder names become spaces
    (``golden_retriever`` -> ``golden retriever``)."""
    return re.sub(r"[_\-]+", " ", name).strip() or name


def prompts(label: str, templates: Sequence[str]) -> list[str]:
    """The prompts of one class: each template with ``{label}`` replaced by the class name as
    words (:func:`class_words`)."""
    words = class_words(label)
    return [template.replace("{label}", words) for template in templates]


def prompt_templates(prompts: str | Sequence[str] | None = None) -> tuple[str, ...]:
    """Templates from a set name or the user's own.

    Args:
        prompts: None or ``"paper"``: the paper's :data:`DEFAULT_TEMPLATE`; ``"openai"``:
            open_clip's ``OPENAI_IMAGENET_TEMPLATES`` (80); ``"simple"``: its
            ``SIMPLE_IMAGENET_TEMPLATES`` (7); else template strings, each containing
            ``{label}`` (a single string is one template).

    Raises:
        InputError: no templates, or a template without ``{label}``.
    """
    if prompts is None:
        prompts = "paper"
    given = (prompts,) if isinstance(prompts, str) else tuple(prompts)
    if len(given) == 1 and given[0] in PROMPT_SETS:
        return _prompt_set(given[0])
    if not given:
        raise InputError(
            f"no prompt templates given: name a set ({', '.join(PROMPT_SETS)}) or give templates "
            f"containing {{label}}, e.g. {DEFAULT_TEMPLATE!r}"
        )
    for template in given:
        if not isinstance(template, str) or "{label}" not in template:
            raise InputError(
                f"prompt template {template!r} has no {{label}} where the class name goes: write "
                f"e.g. {DEFAULT_TEMPLATE!r}, or name a set ({', '.join(PROMPT_SETS)})"
            )
    return given


def _prompt_set(name: str) -> tuple[str, ...]:
    if name == "paper":
        return (DEFAULT_TEMPLATE,)
    from open_clip import OPENAI_IMAGENET_TEMPLATES, SIMPLE_IMAGENET_TEMPLATES

    # open_clip's templates are functions of the class name: give them the placeholder
    chosen = OPENAI_IMAGENET_TEMPLATES if name == "openai" else SIMPLE_IMAGENET_TEMPLATES
    return tuple(template("{label}") for template in chosen)


def describe_templates(templates: Sequence[str]) -> str:
    """One line for a model card: the set's name, or the user's templates."""
    templates = tuple(templates)
    for name in PROMPT_SETS:
        if templates == _prompt_set(name):
            shown = repr(templates[0]) if len(templates) == 1 else f"{len(templates)} templates"
            return f"{name}: {shown}"
    shown = ", ".join(repr(t) for t in templates[:3]) + (", ..." if len(templates) > 3 else "")
    return f"{len(templates)} of your own: {shown}"


def folder_classes(folder: str | Path) -> tuple[str, ...]:
    """The class names of an image folder: its sub-folders' names in sorted order, the labels
    :func:`~hydra_core.data.generic.load_image_folder` gives them. ``folder`` may be an entry
    that names the set (``NAME=PATH``, :mod:`hydra_core.data.sources`)."""
    path = Path(source_path(str(folder))).expanduser()
    if not path.is_dir():
        raise InputError(f"image folder {path} does not exist (or is not a folder)")
    names = sorted(p.name for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not names:
        raise InputError(
            f"{path} has no class sub-folders: a zero-shot classifier takes its classes from "
            "them (one folder per class, named by the class, e.g. golden_retriever/)"
        )
    if len(names) < 2:
        raise InputError(
            f"{path} has one class folder ({names[0]}): a zero-shot classifier of one class "
            "gives every image probability 1, so no accuracy, calibration or OOD score means "
            "anything; give a folder of two classes or more"
        )
    return tuple(names)


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
        embedded = clip_model.encode_text(tokens)
        embedded = F.normalize(
            embedded.to(torch.promote_types(embedded.dtype, torch.float32)), dim=-1
        )
        rows.append(F.normalize(embedded.mean(0), dim=-1))
    return torch.stack(rows)


def check_towers(towers: str) -> str:
    """``towers`` if it is one of :data:`TOWERS`, else an InputError naming them."""
    if towers not in TOWERS:
        raise InputError(
            f"towers must be one of {', '.join(TOWERS)} (both: image and text heads pruned "
            f"jointly, the paper's D.3; image: the image tower alone), got {towers!r}"
        )
    return towers


def text_tower(
    clip_model: nn.Module,
    tokenizer: Callable[[list[str]], torch.Tensor],
    classes: Sequence[str],
    templates: Sequence[str] = (DEFAULT_TEMPLATE,),
) -> nn.Module:
    """The text tower of an open_clip model with the prompts of ``classes`` x ``templates``
    (class-major), sharing the model's modules; an InputError when Hydra Lab cannot prune it."""
    from hydra_core.models.family import UnsupportedModelError
    from hydra_core.models.openclip_text import OPENCLIP_TEXT, ClipTextTower

    texts = [text for label in classes for text in prompts(label, templates)]
    device = next(clip_model.parameters()).device
    try:
        tower = ClipTextTower.of(clip_model, tokenizer(texts).to(device), len(templates))
        OPENCLIP_TEXT.layout(tower)  # refuses blocks whose heads it cannot find
    except UnsupportedModelError as error:
        raise InputError(
            f"cannot prune the heads of this model's text tower: {error}; prune the image "
            "tower alone (towers='image', --towers image)"
        ) from None
    return tower


def zero_shot_classifier(
    clip_model: nn.Module,
    tokenizer: Callable[[list[str]], torch.Tensor],
    classes: Sequence[str],
    templates: Sequence[str] = (DEFAULT_TEMPLATE,),
    *,
    towers: str = DEFAULT_TOWERS,
) -> ZeroShotClassifier:
    """A :class:`ZeroShotClassifier` from an open_clip ``CLIP`` model (its ``visual`` and, with
    ``towers="both"``, its text tower are shared, not copied) and its tokenizer."""
    check_towers(towers)
    embeddings = class_embeddings(clip_model, tokenizer, classes, templates)
    scale = float(clip_model.logit_scale.detach().exp())
    text = None
    if towers == "both":
        text = text_tower(clip_model, tokenizer, classes, templates)
    return ZeroShotClassifier(clip_model.visual, embeddings, scale, classes, templates, text).eval()


# --- opening open_clip models -----------------------------------------------------------------


@dataclass
class OpenClipModel:
    """An open_clip model as loaded, with what the model card says about it.

    Args:
        clip: the open_clip ``CLIP`` (both towers), in eval mode, fp32.
        tokenizer: its tokenizer (prompts -> token ids).
        source: the source as given after ``openclip:``.
        architecture: the model's name (``ViT-B-32``), or where its configuration came from
            (``from /path``).
        weights: where the weights came from.
        random_weights: True where the folder's configuration says they are a random
            initialisation (:data:`RANDOM_WEIGHTS_KEY`): no zero-shot result.
    """

    clip: nn.Module
    tokenizer: Callable[[list[str]], torch.Tensor]
    source: str
    architecture: str
    weights: str
    random_weights: bool = False

    @property
    def logit_scale(self) -> float:
        return float(self.clip.logit_scale.detach().exp())

    @property
    def preprocess_cfg(self) -> dict:
        """open_clip's preprocessing settings of the image tower (size, mean, std, ...)."""
        return dict(getattr(self.clip.visual, "preprocess_cfg", {}) or {})


def open_openclip(source: str) -> OpenClipModel:
    """Load an open_clip model and its tokenizer.

    Args:
        source: ``NAME/TAG`` (an open_clip model name and a pretrained tag, or a checkpoint
            file's path as the part after the first "/"), ``hf-hub:ORG/REPO`` or
            ``local-dir:PATH``. Tags and hub repositories need the network.

    Raises:
        InputError: an unknown name or tag, no tag (random weights give no zero-shot result), a
            download that failed (offline), a folder without its configuration or weights,
            weights that do not fit, an image tower other than open_clip's VisionTransformer.
    """
    if refusal := offline_refusal(f"openclip:{source}"):  # offline: before importing open_clip
        raise InputError(refusal)
    import open_clip

    if not source.strip():
        raise InputError(
            "openclip: names no model: give openclip:NAME/TAG (e.g. "
            "openclip:ViT-B-32/laion2b_s34b_b79k), openclip:hf-hub:ORG/REPO or "
            "openclip:local-dir:PATH"
        )
    if source.startswith("local-dir:"):
        opened = _open_local_dir(Path(source.removeprefix("local-dir:")).expanduser(), source)
    elif source.startswith("hf-hub:"):
        opened = _open_hub(source.removeprefix("hf-hub:"), source)
    else:
        opened = _open_named(source)
    visual = opened.clip.visual
    if not isinstance(visual, open_clip.transformer.VisionTransformer):
        raise InputError(
            f"openclip:{source} has a {type(visual).__name__} image tower: Hydra Lab prunes the "
            "heads of open_clip's own VisionTransformer (ViT-B-32, ViT-L-14, ...); choose such "
            "a model"
        )
    opened.clip.eval()
    return opened


def _open_named(source: str) -> OpenClipModel:
    """``NAME/TAG`` or ``NAME/PATH``: a built-in open_clip architecture and its weights."""
    import open_clip

    name, _, pretrained = source.partition("/")
    models = open_clip.list_models()
    if name not in models:
        close = difflib.get_close_matches(name, models, n=5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise InputError(
            f"unknown open_clip model {name!r} in openclip:{source}{hint} (open_clip.list_models() "
            "names them all; the part after the first '/' is the pretrained tag)"
        )
    tags = open_clip.list_pretrained_tags_by_model(name)
    if not pretrained:
        example = f"openclip:{name}/{tags[0]}" if tags else "openclip:NAME/TAG"
        raise InputError(
            f"openclip:{source} names no pretrained weights, and random weights give no "
            f"zero-shot result: add a tag, e.g. {example} ({_tag_list(name, tags)}), or a "
            "checkpoint file after the '/'"
        )
    tag_cfg = open_clip.get_pretrained_cfg(name, pretrained)
    if tag_cfg:
        from open_clip.pretrained import download_pretrained

        def download() -> str:
            try:
                return download_pretrained(tag_cfg)
            except Exception as exc:
                raise InputError(
                    f"could not download openclip:{source}: {OFFLINE_HINT} ({_first_line(exc)})"
                ) from exc

        checkpoint = from_hub(download, f"openclip:{source}", OFFLINE_HINT)
        clip = _create(
            name,
            f"openclip:{source}",
            pretrained=checkpoint,
            # what the tag says beside its weights: its activation and normalisation
            force_quick_gelu=bool(tag_cfg.get("quick_gelu")),
            force_preprocess_cfg={k: tag_cfg[k] for k in _TAG_PREPROCESS if k in tag_cfg},
        )
        weights = f"pretrained {pretrained} (Hugging Face hub)"
    else:
        path = Path(pretrained).expanduser()
        if not path.is_file():
            raise InputError(
                f"{pretrained!r} is neither a pretrained tag of open_clip {name} nor a checkpoint "
                f"file; {_tag_list(name, tags)}"
            )
        clip = _create(name, f"openclip:{source}", pretrained=str(path))
        weights = f"checkpoint {path}"
    return OpenClipModel(clip, open_clip.get_tokenizer(name), source, name, weights)


#: the preprocessing settings a pretrained tag carries (open_clip's PreprocessCfg keys)
_TAG_PREPROCESS = ("mean", "std", "interpolation", "resize_mode")


def _open_hub(repo: str, source: str) -> OpenClipModel:
    """``hf-hub:ORG/REPO``: configuration and weights from a Hugging Face repository."""
    import open_clip
    from open_clip.pretrained import download_pretrained_from_hf

    def download() -> nn.Module:
        try:
            # open_clip would fall back to random weights (with a log line) where this fails
            download_pretrained_from_hf(repo)
        except Exception as exc:
            raise InputError(
                f"could not download openclip:{source}: {OFFLINE_HINT} ({_first_line(exc)})"
            ) from exc
        return _create(source, f"openclip:{source}")  # its configuration comes from the hub too

    clip = from_hub(download, f"openclip:{source}", OFFLINE_HINT)
    return OpenClipModel(
        clip, open_clip.get_tokenizer(source), source, repo, f"Hugging Face hub {repo}"
    )


def _open_local_dir(path: Path, source: str) -> OpenClipModel:
    """``local-dir:PATH``: open_clip_config.json and a weights file in a folder."""
    import open_clip
    from open_clip.factory import _find_checkpoint_in_dir

    layout = (
        'a folder with open_clip_config.json ({"model_cfg": ..., "preprocess_cfg": ...}) and '
        "the weights (open_clip_model.safetensors or open_clip_pytorch_model.bin), as a model's "
        "Hugging Face repository holds them"
    )
    if not path.is_dir():
        raise InputError(f"{path} is not a folder: openclip:local-dir: needs {layout}")
    config_path = path / "open_clip_config.json"
    if not config_path.is_file():
        raise InputError(f"{path} has no open_clip_config.json: openclip:local-dir: needs {layout}")
    try:
        config = json.loads(config_path.read_text())
    except (ValueError, OSError) as exc:
        raise InputError(f"cannot read {config_path} as JSON ({_first_line(exc)})") from exc
    if not isinstance(config, dict) or "model_cfg" not in config:
        raise InputError(
            f"{config_path} has no 'model_cfg': open_clip needs the architecture there "
            "(embed_dim, vision_cfg, text_cfg), as in a model's Hugging Face repository"
        )
    weights = _find_checkpoint_in_dir(path)
    if weights is None:
        raise InputError(
            f"{path} holds no weights (*.safetensors, *.bin, *.pth): random weights give no "
            "zero-shot result; put open_clip_model.safetensors or open_clip_pytorch_model.bin "
            "beside open_clip_config.json"
        )
    spec = f"local-dir:{path}"
    clip = _create(spec, f"openclip:{source}")
    return OpenClipModel(
        clip,
        open_clip.get_tokenizer(spec),
        source,
        f"from {path}",
        Path(weights).name,
        random_weights=bool(config.get(RANDOM_WEIGHTS_KEY, False)),
    )


def declares_random_weights(source: str) -> bool:
    """Whether ``source`` (a model source, e.g. ``openclip:local-dir:PATH``) is an open_clip
    folder whose open_clip_config.json says its weights are random (:data:`RANDOM_WEIGHTS_KEY`);
    read without loading anything, so that every page can say so. False for anything else or a
    folder that cannot be read (loading it says why)."""
    prefix = "openclip:local-dir:"
    if not source.startswith(prefix):
        return False
    path = Path(source.removeprefix(prefix)).expanduser() / "open_clip_config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get(RANDOM_WEIGHTS_KEY, False))


def _create(name: str, what: str, **kwargs) -> nn.Module:
    """``open_clip.create_model`` whose failures (weights that do not fit the architecture, a
    file that is not a checkpoint) are one line naming ``what``."""
    import open_clip

    try:
        return open_clip.create_model(name, **kwargs)
    except Exception as exc:
        raise InputError(
            f"cannot load {what}: {_first_line(exc)}; the weights must be those of the "
            "architecture named (open_clip's load_state_dict is strict)"
        ) from exc


def _tag_list(name: str, tags: Sequence[str]) -> str:
    if not tags:
        return f"open_clip has no pretrained tags for {name}"
    shown = ", ".join(tags[:8]) + (f", ... ({len(tags)} in all)" if len(tags) > 8 else "")
    return f"tags of {name}: {shown}"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def openclip_classifier(
    opened: OpenClipModel,
    classes: Sequence[str],
    templates: Sequence[str] = (DEFAULT_TEMPLATE,),
    *,
    cache: DiskCache | None = None,
    towers: str = DEFAULT_TOWERS,
) -> ZeroShotClassifier:
    """The zero-shot classifier of an opened model: its image tower (shared, not copied) and the
    class embeddings, computed once per model, classes and templates and then read from ``cache``
    (key: the source, the text tower's weights, the tokenizer, the classes and the templates);
    with ``towers="both"`` also its text tower with the prompts, whose heads join the image
    tower's."""
    check_towers(towers)
    classes, templates = tuple(classes), tuple(templates)
    if not classes:
        raise InputError("a zero-shot classifier needs at least one class name")
    tokenizer = opened.tokenizer
    # what the embeddings depend on: the text tower's weights (everything outside ``visual``)
    text_weights = {
        k: v for k, v in opened.clip.state_dict().items() if not k.startswith("visual.")
    }
    key = cache_key(
        "zero-shot-classes",
        EMBEDDINGS_VERSION,
        opened.source,
        text_weights,
        type(tokenizer).__name__,
        getattr(tokenizer, "context_length", None),
        list(classes),
        list(templates),
    )

    def compute() -> torch.Tensor:
        return class_embeddings(opened.clip, tokenizer, classes, templates).cpu()

    cache = cache if cache is not None else DiskCache()
    embeddings = cache.get_or_compute("zero-shot-classes", key, compute)
    text = None
    if towers == "both":
        text = text_tower(opened.clip, tokenizer, classes, templates)
    return ZeroShotClassifier(
        opened.clip.visual, embeddings, opened.logit_scale, classes, templates, text
    ).eval()
