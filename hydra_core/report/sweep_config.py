"""The sweeps' configuration (:class:`SweepConfig`, full or quick) and what every sweep reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from hydra_core.baselines.shared_backbone import DEEP_HEADS
from hydra_core.data.corruptions import SEVERITIES
from hydra_core.hydra.finetune import FinetuneConfig
from hydra_core.models.modality import MODALITIES
from hydra_core.training.top import TopFinetuneConfig
from hydra_core.zoo.named import default_model

SWEEPS = ("layers", "members", "corruption")


#: where a sweep goes unless told: results/sweep/<kind> (the committed docs/report/sweeps only
#: when named with --overwrite)
DEFAULT_SWEEP_OUT = Path("results") / "sweep"


#: the summary columns every sweep reports (each with _lo and _hi)
METRICS = ("accuracy", "ece", "nll", "brier", "all_auroc", "all_fpr95", "near_auroc", "far_auroc")


ID_METRICS = ("accuracy", "ece", "nll", "brier")


#: a task's default model (the CLI's --task): the embedded image or text default
TASK_MODELS = {name: default_model(modality).name for name, modality in MODALITIES.items()}


@dataclass(frozen=True)
class SweepConfig:
    """What the sweeps run.

    Args:
        model: model source (:func:`~hydra_core.zoo.registry.load_model`); None: the task's
            default (the default ViT, or ``minilm-sentiment`` for ``task="text"``).
        task: ``"image"`` or ``"text"``: which default model (:data:`TASK_MODELS`) when
            ``model`` is None; the data is always the model's modality's embedded benchmark.
        n_search: items per search part (ID and each search OOD set): head selection only.
        n_report: items per report part (ID and each report OOD set).
        removed_per_layer: the layers sweep's points: heads removed in every layer (Taylor per
            layer, CircAvg as many in all); counts that would leave a layer no head are dropped.
        members: the members sweep's points, M.
        corruptions: corruption names (None: every one of the modality's, see
            :mod:`hydra_core.data.corruptions`); severities: their levels.
        n_corrupt: ID report items per corrupted set (a fixed prefix of the report split).
        corruption_seed: the corruptions' seed.
        finetune: fine-tuning of pruned models and members (None: zero-shot only).
        deep_ensemble: add Deep Ensembles: an image model's trained copies where they exist
            (never faked); a text model's Deep Ensembles (D), trained here once per seed of
            ``seeds`` (the text report's, from the same cache).
        deep_heads: how a text model other than ``minilm-sentiment`` trains its Deep Ensembles
            (D) heads.
        pool_fraction: members draw their pruned heads from this share of least useful heads.
        taylor_samples, batch_size, device: as the report's.
        latency_batch, latency_repeats: the members sweep's timing.
    """

    model: str | None = None
    task: str = "image"
    n_search: int | None = 256
    n_report: int | None = 2000
    removed_per_layer: tuple[int, ...] = (2, 4, 6, 8)
    members: tuple[int, ...] = (2, 3, 4, 5)
    corruptions: tuple[str, ...] | None = None
    severities: tuple[int, ...] = SEVERITIES
    n_corrupt: int | None = 1000
    corruption_seed: int = 0
    finetune: FinetuneConfig | None = field(default_factory=FinetuneConfig)
    deep_ensemble: bool = True
    deep_heads: TopFinetuneConfig = DEEP_HEADS
    seeds: tuple[int, ...] = (0, 1, 2)  # corruption: pruning seeds of the pipeline's members
    pool_fraction: float = 2 / 3
    taylor_samples: int | None = 256
    batch_size: int = 256
    device: str = "auto"
    latency_batch: int = 32
    latency_repeats: int = 10

    @classmethod
    def quick(cls, **overrides) -> SweepConfig:
        """Small subsets, two points per sweep, short fine-tuning: each sweep in minutes."""
        settings = dict(
            n_search=64,
            n_report=200,
            n_corrupt=100,
            removed_per_layer=(2, 4),
            members=(2, 3),
            severities=(1, 3, 5),
            taylor_samples=64,
            latency_repeats=3,
            finetune=FinetuneConfig(n_train=256, steps=4, batch_size=64, warmup_steps=1),
            deep_heads=replace(DEEP_HEADS, steps=1, n_train=32, batch_size=16),
        )
        settings.update(overrides)
        return cls(**settings)

    def without(self, part: str) -> SweepConfig:
        """This configuration without fine-tuning (``"finetune"``) or Deep Ensembles."""
        return replace(self, **{part: None if part == "finetune" else False})

    def model_source(self) -> str:
        return self.model or TASK_MODELS[self.task]


def config_json(config: SweepConfig) -> dict:
    found = asdict(config)
    found["model"] = config.model_source()
    return found


def sweep_config_from_args(quick: bool, **overrides) -> SweepConfig:
    """A :class:`SweepConfig`, quick or full, with the given fields replaced (None = keep)."""
    base = SweepConfig.quick() if quick else SweepConfig()
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})
