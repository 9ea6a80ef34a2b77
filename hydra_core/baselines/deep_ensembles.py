"""Deep Ensembles: independently trained copies of the default model, differing only in the seed.

The baseline of the paper's Table 1 (Lakshminarayanan et al., 2017): the same architecture and the
same recipe, trained from scratch with other random seeds. The recipe is the one the reference
checkpoint (by default the shipped one) was trained with, read from its metadata, so the copies
match it; only the seed changes. Each copy is stored as a Hydra Lab checkpoint under
``<cache>/deep_ensembles/seed{N}-{recipe}.safetensors``, where ``recipe`` hashes the architecture
and every training setting except the seed; a copy that is there is loaded, not trained again.

Training one copy of the default model takes about 30 minutes of one CPU core (12 epochs of about
145 s; two copies train at once on two cores under torchrun), so nothing here trains unless asked
(:func:`train_deep_ensemble`, CLI ``train-ensemble``); :func:`available_deep_ensemble` only
collects what exists. :func:`deep_ensemble_for` is how the
app, the CLI and the report find the Deep Ensemble of the model they loaded, and
:class:`DeepEnsemble` is the system that puts them beside Hydra.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from safetensors import safe_open
from torch import nn

from hydra_core import distributed
from hydra_core.cache import cache_key
from hydra_core.experiment.run import Run
from hydra_core.experiment.systems import System
from hydra_core.models.adapter import head_layout
from hydra_core.paths import cache_dir
from hydra_core.training.trainer import resume_path
from hydra_core.zoo.default import (
    DEFAULT_CHECKPOINT,
    TrainConfig,
    VitConfig,
    build_vit,
    load_checkpoint,
    save_checkpoint,
    train_vit,
)
from hydra_core.zoo.named import named_model

FOLDER = "deep_ensembles"
_NAME = re.compile(r"seed(\d+)-([0-9a-f]+)\.safetensors")


def recipe_of(checkpoint: str | Path = DEFAULT_CHECKPOINT) -> tuple[TrainConfig, VitConfig]:
    """The training recipe and architecture stored in a Hydra Lab checkpoint's metadata
    (:class:`TrainConfig` defaults for a checkpoint that lacks ``train_config``)."""
    path = Path(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(f"reference checkpoint {path} does not exist")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if "vit_config" not in meta:
        raise ValueError(
            f"{path} has no 'vit_config' metadata; Deep Ensembles need a Hydra Lab "
            "checkpoint (written by save_checkpoint) as the reference"
        )
    arch = VitConfig(**json.loads(meta["vit_config"]))
    known = {f.name for f in fields(TrainConfig)}
    stored = json.loads(meta.get("train_config", "{}"))
    return TrainConfig(**{k: v for k, v in stored.items() if k in known}), arch


def recipe_key(train_config: TrainConfig, arch: VitConfig) -> str:
    """A short hash of the architecture and every training setting except the seed."""
    settings = {k: v for k, v in asdict(train_config).items() if k != "seed"}
    return cache_key("deep-ensemble-1", settings, asdict(arch))[:12]


def copy_path(
    seed: int, train_config: TrainConfig, arch: VitConfig, root: str | Path | None = None
) -> Path:
    """Where the copy trained with ``seed`` and this recipe is stored."""
    folder = Path(root) if root is not None else cache_dir() / FOLDER
    return folder / f"seed{int(seed)}-{recipe_key(train_config, arch)}.safetensors"


def train_deep_ensemble(
    seeds: Sequence[int] = (1, 2),
    *,
    train_config: TrainConfig | None = None,
    arch: VitConfig | None = None,
    reference: str | Path = DEFAULT_CHECKPOINT,
    root: str | Path | None = None,
    progress: Callable[[int, int, int], None] | None = None,
    log: Callable[[str], None] = print,
) -> list[nn.Module]:
    """Train (or load, when stored) one copy of the model per seed.

    Args:
        seeds: one copy per seed; the shipped default was trained with seed 0.
        train_config: the recipe (its seed is replaced by each of ``seeds``); default: the
            reference checkpoint's recipe.
        arch: the architecture; default: the reference checkpoint's.
        reference: the checkpoint whose recipe and architecture the copies follow when
            ``train_config`` or ``arch`` is not given.
        root: the folder the copies are stored in (default ``<cache>/deep_ensembles``).
        progress: ``progress(seed, done, total)`` after every optimiser step.
        log: receives train_vit's per-epoch lines.

    Returns:
        The copies (eval mode, CPU), in the order of ``seeds``.

    In a distributed job (:mod:`hydra_core.distributed`) the seeds are shared out, about as many
    per process (one each when there are as many processes as seeds); each copy is stored by the
    process that trained it (on several machines, share ``root`` for later runs to find them
    all), and every process returns all the copies.
    """
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct and at least one, got {seeds}")
    if train_config is None or arch is None or Path(reference).is_file():
        stored_config, stored_arch = recipe_of(reference)
        train_config = train_config or stored_config
        arch = arch or stored_arch
        same_recipe = recipe_key(train_config, arch) == recipe_key(stored_config, stored_arch)
        if same_recipe and stored_config.seed in seeds:
            raise ValueError(
                f"seed {stored_config.seed} is the seed the reference checkpoint "
                f"{reference} was trained with; its copy would be the reference "
                "itself - choose other seeds"
            )
    mine = distributed.split([1.0] * len(seeds))[distributed.rank()]
    models = {}
    for seed in seeds[mine.start : mine.stop]:
        path = copy_path(seed, train_config, arch, root)
        if path.is_file():
            model, _ = load_checkpoint(path)
        else:
            cfg = replace(train_config, seed=seed)
            report = (
                None if progress is None else (lambda done, total, s=seed: progress(s, done, total))
            )
            resume = resume_path(path)  # an interrupted copy goes on from its last epoch
            model, summary = train_vit(cfg, arch, log=log, progress=report, resume=resume)
            save_checkpoint(model, path, arch, train_config=asdict(cfg), summary=summary)
            resume.unlink(missing_ok=True)
        models[seed] = model.eval()
    if distributed.active():
        models = _gathered(models, arch)
    return [models[seed] for seed in seeds]


def _gathered(models: dict[int, nn.Module], arch: VitConfig) -> dict[int, nn.Module]:
    """Every process's copies, by seed, on every process: their weights are gathered, so no
    process reads another's files."""
    found = {}
    for states in distributed.all_gather({s: m.state_dict() for s, m in models.items()}):
        for seed, state in states.items():
            found[seed] = build_vit(arch)
            found[seed].load_state_dict(state)
            found[seed].eval()
    return found


def available_deep_ensemble(
    *,
    reference: str | Path = DEFAULT_CHECKPOINT,
    root: str | Path | None = None,
) -> list[nn.Module]:
    """The reference model followed by every stored copy trained with its recipe (other seeds),
    without training anything. Fewer than two models means no Deep Ensemble is available yet."""
    train_config, arch = recipe_of(reference)
    model, _ = load_checkpoint(reference)
    members = [model.eval()]
    for seed in _copy_seeds(train_config, arch, root):
        copy, _ = load_checkpoint(copy_path(seed, train_config, arch, root))
        members.append(copy.eval())
    return members


def stored_seeds(
    train_config: TrainConfig, arch: VitConfig, root: str | Path | None = None
) -> list[int]:
    """Seeds of the copies stored for this recipe, in increasing order."""
    folder = Path(root) if root is not None else cache_dir() / FOLDER
    key = recipe_key(train_config, arch)
    if not folder.is_dir():
        return []
    found = (_NAME.fullmatch(p.name) for p in folder.glob("seed*.safetensors"))
    return sorted(int(m.group(1)) for m in found if m is not None and m.group(2) == key)


def reference_checkpoint(model_source: str) -> Path | None:
    """The checkpoint whose copies make up the Deep Ensemble of a model source (as
    :func:`~hydra_core.zoo.registry.load_model` takes it): the shipped checkpoint for
    ``"default"`` / ``"fmnist-vit-default"``, the file itself for an existing ``.safetensors``
    checkpoint, None for anything else (DINOv2, timm names, other weight files)."""
    named = named_model(model_source)  # the shipped checkpoint of a named model, if it has one
    path = named.checkpoint if named is not None else Path(model_source).expanduser()
    return path if path is not None and path.suffix == ".safetensors" and path.is_file() else None


def stored_copies(model_source: str, *, root: str | Path | None = None) -> list[int]:
    """Seeds of the stored copies that would join the model in its Deep Ensemble, without loading
    them; empty when the model source has no Hydra Lab reference checkpoint."""
    reference = reference_checkpoint(model_source)
    if reference is None:
        return []
    try:
        return _copy_seeds(*recipe_of(reference), root)
    except ValueError:  # a .safetensors file without Hydra Lab metadata
        return []


def deep_ensemble_for(
    model_source: str,
    *,
    root: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> list[nn.Module] | None:
    """The Deep Ensemble of a model source: its reference checkpoint (see
    :func:`reference_checkpoint`) followed by the stored copies, or None when there is no
    reference or fewer than two models. ``log`` is told why there is none."""

    def skip(reason: str) -> None:
        if log is not None:
            log(reason)

    reference = reference_checkpoint(model_source)
    if reference is None:
        return skip("Deep Ensembles: only for Hydra Lab checkpoints; skipped")
    try:
        models = available_deep_ensemble(reference=reference, root=root)
    except ValueError as error:
        return skip(f"Deep Ensembles skipped: {error}")
    if len(models) < 2:
        return skip("Deep Ensembles: no trained copies found (python -m hydra_core train-ensemble)")
    return models


def _copy_seeds(train_config: TrainConfig, arch: VitConfig, root: str | Path | None) -> list[int]:
    """Seeds of the stored copies other than the reference itself (its own seed)."""
    return [s for s in stored_seeds(train_config, arch, root) if s != train_config.seed]


@dataclass
class DeepEnsemble(System):
    """Deep Ensembles as a system: independently trained full copies of the model (two or more),
    e.g. from :func:`available_deep_ensemble` or :func:`deep_ensemble_for`, their probabilities
    averaged."""

    copies: Sequence[nn.Module]
    name: str = "Deep Ensembles"

    def __post_init__(self) -> None:
        if len(self.copies) < 2:
            raise ValueError(
                f"Deep Ensembles need two or more independently trained models, got "
                f"{len(self.copies)}; train copies with train_deep_ensemble"
            )

    def add_to(self, run: Run) -> None:
        copies = [m.to(run.device).eval() for m in self.copies]
        parts = [run.evaluate(f"{self.name} member {i}", m) for i, m in enumerate(copies)]
        heads = [head_layout(m).total_heads for m in copies]
        run.add_ensemble(self.name, "deep-ensemble", parts, copies, heads)

    def describe(self) -> dict:
        return {"name": self.name, "copies": len(self.copies)}
