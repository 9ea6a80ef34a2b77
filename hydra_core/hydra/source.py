"""A fused Hydra file as a model source: :func:`~hydra_core.zoo.registry.load_model` loads the
files ``hydra`` / :func:`~hydra_core.hydra.fused.save_hydra` write, for evaluation, once this
module has registered their kind (:mod:`hydra_core.zoo.sources`). Importing
:mod:`hydra_core.hydra` registers it; so do ``hydra_core.load_model``, the CLI and the app."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

from hydra_core.errors import InputError
from hydra_core.hydra.fusion.io import load_hydra
from hydra_core.models.preprocess import normalize_images
from hydra_core.zoo.loaded import LoadedModel
from hydra_core.zoo.registry import load_model, text_preprocess
from hydra_core.zoo.sources import FileKind, register_file_kind

__all__ = ["FUSED_FILE", "load_fused", "load_model"]  # load_model: hydra_core.load_model


def load_fused(path: Path, meta: dict[str, str]) -> LoadedModel:
    """A Hydra model written by ``hydra`` / ``save_hydra``: evaluated like its source model
    (its logits are the members', (B, M, C)); the head analyses need the source model."""
    if "preprocess" not in meta:
        raise InputError(
            f"{path} is a fused Hydra model saved without its input preprocessing (an older "
            "export, or a source model whose preprocessing is not built on normalize_images); "
            "export it again with `hydra` or the Hydra page"
        )
    hydra = load_hydra(path)
    spec = json.loads(meta["preprocess"])
    if "tokenizer" in spec:
        preprocess = text_preprocess(spec, path)
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


#: a safetensors file whose header holds ``hydra`` (the fused model's configuration)
FUSED_FILE = register_file_kind(FileKind("hydra", "a fused Hydra model", load_fused))
