"""The paper's efficient ensembles (Table 1, Appendix C.1.4), trained, stored and loaded.

- **Packed-Ensembles** (:mod:`~hydra_core.baselines.packed`, E = 3, alpha = 2) and **MIMO**
  (:mod:`~hydra_core.baselines.mimo`, E = 3, rho = 0.5, batch repeat 4) are trained from scratch
  with the recipe of the reference checkpoint (by default the shipped ViT's, read from its
  metadata as Deep Ensembles read it): the same epochs, batches, augmentation, AdamW, warm-up and
  cosine schedule, seed 0. The loss is every member's cross-entropy, averaged.
- **BatchEnsemble** (:mod:`~hydra_core.baselines.batch_ensemble`, E = 3) is applied to the trained
  model, then fine-tuned (every parameter but the embeddings); **LoRA Ensembles**
  (:mod:`~hydra_core.baselines.lora`, r = 4, alpha = 8, seeds 0, 1, 2) fine-tune one adapter per
  seed on the frozen model. Both fine-tune on the embedded ID set's training split
  (:data:`FINETUNE`, :data:`LORA_FINETUNE`), never on a search or report item.

Every trained copy is stored under ``<cache>/efficient_ensembles/`` in a safetensors file named by
the method and a key of everything its weights depend on (the settings, the recipe, the training
items, for the fine-tuned ones the source model's weights, preprocessing and seed): a copy that is
there is loaded, not trained again. While a copy trains, the training loop's resume file beside
it (:func:`~hydra_core.training.trainer.resume_path`) keeps its state after every epoch: stopped
(Ctrl-C), the same call goes on from the last complete epoch to the same weights. A LoRA
Ensemble is stored member by member, so a stopped run keeps its finished members too.
"""

from __future__ import annotations

import json
import math
import shlex
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from hydra_core.baselines.batch_ensemble import INIT_STD, batch_ensemble
from hydra_core.baselines.lora import ALPHA, RANK, LoRAEnsemble, adapter_state, lora_member
from hydra_core.baselines.mimo import MIMOViT, mimo_batch
from hydra_core.baselines.packed import PackedViT
from hydra_core.cache import cache_key, model_fingerprint
from hydra_core.evaluate import callable_model
from hydra_core.files import atomic_write
from hydra_core.hydra.finetune import (
    FinetuneConfig,
    members_training_items,
    schedule_of,
    trainer_config,
)
from hydra_core.models.adapter import family_of
from hydra_core.paths import cache_dir
from hydra_core.training import trainer
from hydra_core.training.schedules import warmup_cosine
from hydra_core.zoo.default import (
    DEFAULT_CHECKPOINT,
    TrainConfig,
    VitConfig,
    augment,
    draw_augmentation,
    preprocess,
)

FOLDER = "efficient_ensembles"
VERSION = "efficient-ensembles-1"
PACKED, MIMO, BATCH, LORA = "packed-ensembles", "mimo", "batch-ensemble", "lora-ensembles"
#: the methods, as ``hydra --baselines`` names them, and their rows in the tables
NAMES = {
    PACKED: "Packed-Ensembles",
    MIMO: "MIMO",
    BATCH: "BatchEnsemble",
    LORA: "LoRA Ensembles",
}
FROM_SCRATCH = (PACKED, MIMO)

#: BatchEnsemble's fine-tuning: every parameter but the embeddings, AdamW, two epochs over a
#: fixed 10,000 of the training split's images (156 steps; its r and s start from
#: TorchUncertainty's N(1, 0.5), so it needs more than Hydra's members' 40 steps), batches of
#: 129 = 43 images per member (the batch is split among them)
FINETUNE = FinetuneConfig(
    optimizer="adamw", lr=3e-4, epochs=2.0, batch_size=129, warmup_steps=15, n_train=10_000
)
#: LoRA Ensembles' fine-tuning of each member's adapters (B starts at zero: each member starts
#: as the model): AdamW, two epochs over the 5,000 images Hydra's members are fine-tuned on
LORA_FINETUNE = FinetuneConfig(
    optimizer="adamw", lr=1e-3, epochs=2.0, batch_size=128, warmup_steps=10, n_train=5_000
)


@dataclass(frozen=True)
class EfficientSettings:
    """The paper's settings of the four methods (Appendix C.1.4)."""

    estimators: int = 3  # E, every method
    alpha: float = 2.0  # Packed-Ensembles' width multiplier
    rho: float = 0.5  # MIMO: share of each batch all members see together
    batch_repeat: int = 4  # MIMO
    init_std: float = INIT_STD  # BatchEnsemble: r, s ~ N(1, init_std)
    rank: int = RANK  # LoRA
    lora_alpha: float = ALPHA  # LoRA
    seeds: tuple[int, ...] = (0, 1, 2)  # LoRA: one member per seed

    def of(self, method: str) -> dict:
        """The settings that change ``method``'s weights."""
        fields = {
            PACKED: ("estimators", "alpha"),
            MIMO: ("estimators", "rho", "batch_repeat"),
            BATCH: ("estimators", "init_std"),
            LORA: ("rank", "lora_alpha"),
        }[method]
        return {f: getattr(self, f) for f in fields}


def check_method(method: str) -> None:
    if method not in NAMES:
        raise ValueError(f"unknown efficient ensemble {method!r}; choose from {', '.join(NAMES)}")


# --- where copies are stored ------------------------------------------------------------------


def folder(root: str | Path | None = None) -> Path:
    return Path(root) if root is not None else cache_dir() / FOLDER


def scratch_path(
    method: str,
    settings: EfficientSettings,
    train_config: TrainConfig,
    arch: VitConfig,
    data_key: str = "fashion_mnist",
    root: str | Path | None = None,
) -> Path:
    """Where a from-scratch copy (Packed-Ensembles, MIMO) of this recipe is stored."""
    key = cache_key(
        VERSION, method, settings.of(method), asdict(train_config), asdict(arch), data_key
    )[:12]
    return folder(root) / f"{method}-{key}.safetensors"


def finetune_path(
    method: str,
    settings: EfficientSettings,
    config: FinetuneConfig,
    model: nn.Module,
    data,
    preprocess_fn: Callable,
    seed: int,
    root: str | Path | None = None,
) -> Path:
    """Where a fine-tuned copy (BatchEnsemble; a LoRA member: ``seed``) is stored: keyed by the
    settings, the recipe, the source weights, the training items, the preprocessing (its output
    on the first items) and the seed."""
    probe = preprocess_fn(data.inputs[:4])
    own = settings.of(method)
    if method == BATCH and (blocks := batch_blocks(model)) is not None:
        own = {**own, "top_blocks": blocks}  # absent for every layer: the keys stored before it
    parts = (own, asdict(config), model_fingerprint(model), data.fingerprint())
    key = cache_key(VERSION, method, *parts, probe, seed=int(seed))[:12]
    stem = f"{method}-seed{int(seed)}" if method == LORA else method
    return folder(root) / f"{stem}-{key}.safetensors"


def _write(path: Path, state: dict[str, torch.Tensor], meta: dict) -> None:
    state = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    header = {k: json.dumps(v) for k, v in meta.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: save_file(state, str(tmp), metadata=header))


def read_meta(path: str | Path) -> dict:
    """The metadata stored beside a copy's weights (method, settings, recipe, summary)."""
    with safe_open(str(path), framework="pt") as f:
        return {k: json.loads(v) for k, v in (f.metadata() or {}).items()}


# --- training from scratch: Packed-Ensembles and MIMO ------------------------------------------


def build_scratch(method: str, arch: VitConfig, settings: EfficientSettings) -> nn.Module:
    """A fresh Packed-Ensemble or MIMO ViT of ``arch`` (the global random state draws it)."""
    if method == PACKED:
        return PackedViT(arch, settings.estimators, settings.alpha)
    if method == MIMO:
        return MIMOViT(arch, settings.estimators)
    raise ValueError(f"{method!r} is not trained from scratch; choose from {FROM_SCRATCH}")


def train_scratch(
    method: str,
    train_config: TrainConfig,
    arch: VitConfig,
    settings: EfficientSettings = EfficientSettings(),
    *,
    train_set=None,
    validation_set=None,
    log: Callable[[str], None] = print,
    progress: Callable[[int, int], None] | None = None,
    resume: str | Path | None = None,
) -> tuple[nn.Module, dict]:
    """Train a Packed-Ensemble or MIMO ViT with the default ViT's recipe
    (:func:`~hydra_core.zoo.default.train_vit`'s batches, augmentation, optimiser and schedule).

    Args:
        train_set, validation_set: image sets (default: Fashion-MNIST's training and validation
            splits, as the default ViT); the validation accuracy (of the members' mean
            probabilities) is logged after every epoch.
        resume: the training loop's resume file (an interrupted run goes on from its last epoch).

    Returns the model (eval mode) and a summary (history, seconds, threads).
    """
    if train_set is None or validation_set is None:
        from hydra_core.data.fashion_mnist import load_fashion_mnist

        train_set = train_set or load_fashion_mnist("train")
        validation_set = validation_set or load_fashion_mnist("validation")
    cfg, e = train_config, settings.estimators
    torch.manual_seed(cfg.seed)  # the initialisation
    model = build_scratch(method, arch, settings)
    steps_per_epoch = math.ceil(len(train_set) / cfg.batch_size)
    total = cfg.epochs * steps_per_epoch

    def epoch_batches(generator: torch.Generator) -> list:
        order = torch.randperm(len(train_set), generator=generator)
        batches = []
        for index in order.split(cfg.batch_size):
            draws = draw_augmentation(len(index), generator, cfg)
            shuffle = 0  # MIMO's shuffles of the batch are drawn from this seed
            if method == MIMO:
                shuffle = int(torch.randint(2**31 - 1, (1,), generator=generator))
            batches.append((index, draws, shuffle))
        return batches

    def logits_and_labels(batch):
        index, draws, shuffle = batch
        x = augment(preprocess(train_set.images[index]), draws, cfg)
        labels = train_set.labels[index]
        if method == MIMO:
            x, labels = mimo_batch(x, labels, e, settings.rho, settings.batch_repeat, shuffle)
            return model.grouped(x), labels
        return model(x).reshape(-1, arch.num_classes), labels.repeat_interleave(e)

    start = time.perf_counter()

    def record(epoch: trainer.EpochRecord) -> None:
        log(
            f"{NAMES[method]} epoch {epoch.epoch}/{cfg.epochs}  loss {epoch.loss:.4f}  val acc "
            f"{epoch.scores['accuracy']:.4f}  ({time.perf_counter() - start:.0f} s)"
        )

    result = trainer.train(
        model,
        dict(model.named_parameters()),
        logits_and_labels,
        epoch_batches,
        trainer.TrainerConfig(steps=total, lr=cfg.lr, weight_decay=cfg.weight_decay, seed=cfg.seed),
        warmup_cosine(cfg.lr, int(cfg.warmup_epochs * steps_per_epoch), total),
        validate=lambda: {"accuracy": ensemble_accuracy(model, validation_set)},
        on_epoch=record,
        progress=progress,
        resume=resume,
    )
    history = [
        {"epoch": r.epoch, "loss": r.loss, "val_accuracy": r.scores["accuracy"]}
        for r in result.epochs
    ]
    summary = {
        "history": history,
        "train_seconds": round(result.seconds, 1),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    return model.eval(), summary


@torch.inference_mode()
def ensemble_accuracy(model: nn.Module, images, batch_size: int = 1000) -> float:
    """Top-1 accuracy of the members' mean probabilities on a Fashion-MNIST-style image set."""
    model.eval()
    correct = 0
    for start in range(0, len(images), batch_size):
        logits = model(preprocess(images.images[start : start + batch_size]))
        probs = logits.softmax(-1).mean(1)
        correct += (probs.argmax(-1) == images.labels[start : start + batch_size]).sum().item()
    return correct / len(images)


def scratch_copy(
    method: str,
    *,
    reference: str | Path = DEFAULT_CHECKPOINT,
    settings: EfficientSettings = EfficientSettings(),
    epochs: int | None = None,
    root: str | Path | None = None,
    train: bool = True,
    train_set=None,
    validation_set=None,
    log: Callable[[str], None] = print,
    progress: Callable[[int, int], None] | None = None,
) -> nn.Module | None:
    """The Packed-Ensemble or MIMO copy of the reference checkpoint's recipe: loaded when
    stored, else trained and stored (``train``), else None.

    ``epochs`` overrides the recipe's (another copy, stored under its own key); ``train_set`` and
    ``validation_set`` replace Fashion-MNIST's splits (tests; part of the key)."""
    from hydra_core.baselines.deep_ensembles import recipe_of

    train_config, arch = recipe_of(reference)
    if epochs is not None:
        train_config = replace(train_config, epochs=int(epochs))
    data_key = "fashion_mnist" if train_set is None else train_set.fingerprint()
    path = scratch_path(method, settings, train_config, arch, data_key, root)
    if path.is_file():
        model = build_scratch(method, arch, settings)
        model.load_state_dict(load_file(str(path)))
        return model.eval()
    if not train:
        return None
    resume = trainer.resume_path(path)
    if resume.is_file():
        log(f"{NAMES[method]}: going on from the interrupted run kept in {resume}")
    model, summary = train_scratch(
        method,
        train_config,
        arch,
        settings,
        train_set=train_set,
        validation_set=validation_set,
        log=log,
        progress=progress,
        resume=resume,
    )
    meta = {
        "method": method,
        "settings": settings.of(method),
        "train_config": asdict(train_config),
        "vit_config": asdict(arch),
        "summary": summary,
    }
    _write(path, model.state_dict(), meta)
    resume.unlink(missing_ok=True)
    return model


# --- fine-tuning from the trained model: BatchEnsemble and LoRA Ensembles ----------------------


def _finetune(
    model: nn.Module,
    parameters: dict[str, nn.Parameter],
    call: Callable,
    data,
    config: FinetuneConfig,
    preprocess_fn: Callable,
    seed: int,
    progress: Callable[[int, int], None] | None,
    resume: Path,
    multiple: int = 1,
) -> trainer.TrainResult:
    """The training loop over ``data`` (a new order every epoch from ``seed``), cross-entropy of
    ``call(inputs)``; only ``parameters`` are trained. Each batch is cut to a ``multiple`` of
    items (BatchEnsemble's, split among its members: the epoch's last batch loses at most
    ``multiple - 1``)."""
    n = len(data)
    total = config.total_steps(n)

    def shuffled(generator: torch.Generator):
        return torch.randperm(n, generator=generator).split(config.batch_size)

    def logits_and_labels(index: torch.Tensor):
        index = index[: len(index) - len(index) % multiple]
        if isinstance(data.inputs, torch.Tensor):
            items = data.inputs[index]
        else:
            items = tuple(data.inputs[i] for i in index.tolist())
        return call(preprocess_fn(items)), data.labels[index]

    return trainer.train(
        model,
        parameters,
        logits_and_labels,
        shuffled,
        trainer_config(config, total, seed),
        schedule_of(config, total),
        progress=progress,
        resume=resume,
    )


def batch_blocks(model: nn.Module) -> int | None:
    """The top blocks BatchEnsemble converts in ``model`` (None: every linear layer), as its
    modality says (:attr:`~hydra_core.models.modality.Modality.batch_ensemble_blocks`)."""
    return family_of(model).modality.batch_ensemble_blocks


def _embedding(name: str) -> bool:
    """Parameters BatchEnsemble's fine-tuning leaves as they are: patch, token and position
    embeddings (a ViT's ``patch_embed``, ``cls_token``, ``pos_embed``; a text encoder's
    ``embeddings``)."""
    return any(k in name for k in ("patch_embed", "cls_token", "pos_embed", "embeddings"))


def _finetuned_summary(result: trainer.TrainResult) -> dict:
    return {
        "steps": len(result.steps),
        "final_loss": result.steps[-1].loss,
        "train_seconds": round(result.seconds, 1),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


def batch_ensemble_copy(
    model: nn.Module,
    preprocess_fn: Callable,
    *,
    settings: EfficientSettings = EfficientSettings(),
    config: FinetuneConfig = FINETUNE,
    train_set=None,
    seed: int = 0,
    root: str | Path | None = None,
    train: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> nn.Module | None:
    """BatchEnsemble applied to ``model`` and fine-tuned (``seed``: r and s, batch order):
    loaded when stored, else trained and stored (``train``), else None."""
    if config.batch_size % settings.estimators:
        raise ValueError(
            f"BatchEnsemble splits each batch among its {settings.estimators} members: the "
            f"batch size {config.batch_size} must be a multiple of it"
        )
    data = members_training_items(model, config, train_set)
    path = finetune_path(BATCH, settings, config, model, data, preprocess_fn, seed, root)
    blocks = batch_blocks(model)
    ensemble = batch_ensemble(model, settings.estimators, seed, settings.init_std, blocks)
    if path.is_file():
        ensemble.load_state_dict(load_file(str(path)))
        return ensemble.eval()
    if not train:
        return None
    parameters = {
        n: p for n, p in ensemble.named_parameters() if p.requires_grad and not _embedding(n)
    }
    resume = trainer.resume_path(path)
    result = _finetune(
        ensemble,
        parameters,
        ensemble,
        data,
        config,
        preprocess_fn,
        seed,
        progress,
        resume,
        multiple=settings.estimators,
    )
    meta = {
        "method": BATCH,
        "settings": {**settings.of(BATCH), "top_blocks": blocks},
        "finetune": asdict(config),
        "source": model_fingerprint(model),
        "seed": seed,
        "summary": _finetuned_summary(result),
    }
    _write(path, ensemble.state_dict(), meta)
    resume.unlink(missing_ok=True)
    return ensemble.eval()


def lora_copy(
    model: nn.Module,
    preprocess_fn: Callable,
    *,
    settings: EfficientSettings = EfficientSettings(),
    config: FinetuneConfig = LORA_FINETUNE,
    train_set=None,
    root: str | Path | None = None,
    train: bool = True,
    progress: Callable[[int, int, int], None] | None = None,
) -> nn.Module | None:
    """The LoRA Ensemble of ``model``: one adapter per seed of ``settings.seeds``, each loaded
    when stored, else fine-tuned and stored (``train``); None when one is missing and ``train``
    is off. ``progress(seed, done, total)``."""
    data = members_training_items(model, config, train_set)
    adapters = []
    for seed in settings.seeds:
        path = finetune_path(LORA, settings, config, model, data, preprocess_fn, seed, root)
        if path.is_file():
            adapters.append(load_file(str(path)))
            continue
        if not train:
            return None
        member = lora_member(model, seed, settings.rank, settings.lora_alpha)
        parameters = {n: p for n, p in member.named_parameters() if p.requires_grad}
        report = None if progress is None else (lambda d, t, s=seed: progress(s, d, t))
        call = callable_model(member.base_model.model)
        resume = trainer.resume_path(path)
        result = _finetune(
            member, parameters, call, data, config, preprocess_fn, seed, report, resume
        )
        state = adapter_state(member)
        meta = {
            "method": LORA,
            "settings": settings.of(LORA),
            "finetune": asdict(config),
            "source": model_fingerprint(model),
            "seed": seed,
            "summary": _finetuned_summary(result),
        }
        _write(path, state, meta)
        resume.unlink(missing_ok=True)
        adapters.append(state)
    return LoRAEnsemble(model, adapters, settings.rank, settings.lora_alpha).eval()


def stored_paths(method: str, root: str | Path | None = None) -> list[Path]:
    """Every stored copy of ``method`` (any key), newest first."""
    check_method(method)
    found = folder(root).glob(f"{method}-*.safetensors") if folder(root).is_dir() else []
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def train_command(method: str, epochs: int | None = None, model: str | None = None) -> str:
    """The command that trains (or fine-tunes) ``method``'s copy of ``model`` (a model source as
    ``train-baselines --model`` takes it; None: the default model, which needs no flag)."""
    check_method(method)
    extra = "" if model is None else f" --model {shlex.quote(str(model))}"
    extra += "" if epochs is None else f" --epochs {epochs}"
    return f"python -m hydra_core train-baselines {method}{extra}"


def members_of(method: str, settings: EfficientSettings = EfficientSettings()) -> int:
    """How many members the method's ensemble has."""
    return len(settings.seeds) if method == LORA else settings.estimators


def stored_copy(
    method: str,
    model: nn.Module,
    preprocess_fn: Callable,
    *,
    reference: str | Path | None = None,
    settings: EfficientSettings = EfficientSettings(),
    train_set=None,
    root: str | Path | None = None,
) -> list[Path] | None:
    """The files of ``method``'s stored copy for this model (one per LoRA member), or None when
    it is not (all) stored or does not apply (a from-scratch method without a ``reference``
    checkpoint); nothing is loaded or trained."""
    check_method(method)
    if method in FROM_SCRATCH:
        if reference is None:
            return None
        from hydra_core.baselines.deep_ensembles import recipe_of

        train_config, arch = recipe_of(reference)
        paths = [scratch_path(method, settings, train_config, arch, root=root)]
    else:
        config = FINETUNE if method == BATCH else LORA_FINETUNE
        data = members_training_items(model, config, train_set)
        seeds = settings.seeds if method == LORA else (0,)
        paths = [
            finetune_path(method, settings, config, model, data, preprocess_fn, s, root)
            for s in seeds
        ]
    return paths if all(p.is_file() for p in paths) else None
