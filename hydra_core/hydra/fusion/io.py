"""Fused models on disk: safetensors, with the model's description as JSON in the header.

The header's ``hydra`` entry is the model's config as JSON (``to_json`` of
:class:`~hydra_core.hydra.fusion.config.HeaderConfig`: format, version, then every field); its
format picks the config class and the ``assemble_*`` function that rebuilds the model from it and
the tensors, the same function fusion builds it with. A zero-shot head is stored beside its tower
(``zero_shot`` entry and tensors). Optional entries: ``preprocess``, ``source``, ``classes``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from hydra_core.files import atomic_write
from hydra_core.hydra.fusion import post_norm, pre_norm
from hydra_core.hydra.fusion.post_norm import HydraText, HydraTextConfig, assemble_text
from hydra_core.hydra.fusion.pre_norm import HydraConfig, HydraViT, assemble_vit
from hydra_core.hydra.fusion.zero_shot import ZERO_SHOT_ENTRY, HydraZeroShot


def save_hydra(
    hydra: HydraViT | HydraText | HydraZeroShot,
    path: str | Path,
    *,
    preprocess: dict | None = None,
    source: str | None = None,
    classes: Sequence[str] | None = None,
) -> None:
    """Write ``hydra`` as safetensors (atomically); the header's ``hydra`` entry (JSON) describes
    the model (format ``hydra-fused`` for a :class:`HydraViT`, ``hydra-fused-text`` for a
    :class:`HydraText`). A :class:`HydraZeroShot` is stored as its image tower (a
    ``hydra-fused`` model) plus its zero-shot head: the class embeddings as the tensor
    ``zero_shot.class_embeddings``, the logit scale, classes and prompt templates as the header's
    ``zero_shot`` entry (JSON); ``classes`` defaults to its classes.

    Args:
        hydra: the fused model.
        path: the file.
        preprocess: how images become its input (``size``, ``channels``, ``mean``, ``std``, as
            :func:`hydra_core.models.preprocess.describe` gives them); stored so that
            ``load_model(path)`` can evaluate the file like its source model.
        source: the name of the model the members were pruned from.
        classes: class names, index = label.
    """
    model, extra, header = hydra, {}, {}
    if isinstance(hydra, HydraZeroShot):
        model = hydra.visual
        extra, entry = hydra.file_parts()
        header[ZERO_SHOT_ENTRY] = json.dumps(entry)
        classes = classes or hydra.classes
    state = {k: v.detach().cpu().contiguous() for k, v in {**model.state_dict(), **extra}.items()}
    header["hydra"] = json.dumps(hydra.config.to_json())
    extras = {"preprocess": preprocess, "source": source, "classes": classes}
    header.update({k: json.dumps(list(v) if k == "classes" else v) for k, v in extras.items() if v})
    atomic_write(path, lambda tmp: save_file(state, str(tmp), metadata=header))


def load_hydra(
    path: str | Path, device: str | torch.device = "cpu"
) -> HydraViT | HydraText | HydraZeroShot:
    """Rebuild a :class:`HydraViT`, :class:`HydraText` or :class:`HydraZeroShot` (eval mode) from
    a file written by :func:`save_hydra`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iter)
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(f"{path} is not a readable safetensors file ({error})") from None
    if "hydra" not in meta:
        raise ValueError(
            f"{path} is a safetensors file but not a Hydra model (its header has no "
            "'hydra' entry); such files are written by save_hydra"
        )
    try:
        header = json.loads(meta["hydra"])
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: the 'hydra' header is not valid JSON ({error})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the 'hydra' header is not a JSON object")
    formats = {
        pre_norm.FORMAT: (pre_norm.FORMAT_VERSION, HydraConfig, assemble_vit),
        post_norm.FORMAT: (post_norm.FORMAT_VERSION, HydraTextConfig, assemble_text),
    }
    fmt, version = header.get("format"), header.get("version")
    if fmt not in formats or version != formats[fmt][0]:
        readable = [(f, v) for f, (v, _, _) in formats.items() if f == fmt] or [
            (f, v) for f, (v, _, _) in formats.items()
        ]
        raise ValueError(
            f"{path}: the header says format {fmt!r} version {version!r}; this code reads "
            + " or ".join(f"{f!r} version {v}" for f, v in readable)
        )
    _, config_class, assemble = formats[fmt]
    try:
        config = config_class.from_json(header)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{path}: the 'hydra' header is malformed ({error})") from None
    head = {k: tensors.pop(k) for k in list(tensors) if k.startswith(f"{ZERO_SHOT_ENTRY}.")}
    try:
        model = assemble(config, tensors)
    except (KeyError, TypeError) as error:
        raise ValueError(f"{path}: the 'hydra' header is malformed ({error!r})") from None
    if ZERO_SHOT_ENTRY not in meta:
        if head:
            raise ValueError(f"{path} holds zero-shot tensors but no 'zero_shot' header entry")
        return model.eval()
    if fmt != pre_norm.FORMAT:
        raise ValueError(
            f"{path}: a zero-shot head needs a {pre_norm.FORMAT!r} model, not format {fmt!r}"
        )
    try:
        entry = json.loads(meta[ZERO_SHOT_ENTRY])
        return HydraZeroShot.from_file_parts(model, head, entry).eval()
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"{path}: the 'zero_shot' header entry is malformed ({error})") from None
