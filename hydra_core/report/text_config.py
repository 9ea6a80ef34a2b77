"""The text report's configuration (:class:`TextReportConfig`, full or quick) and its data: the
text benchmark at the configuration's sizes, the report sentences in order of length."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from hydra_core.analysis._maps import DEFAULT_OOD_AGGREGATE
from hydra_core.baselines import efficient
from hydra_core.baselines.shared_backbone import DEEP_HEADS
from hydra_core.data.benchmark import DEFAULT_PROTOCOL
from hydra_core.report.efficient_ensembles import check_efficient
from hydra_core.training.top import (
    DEFAULT_TOP_RECIPE,
    TopFinetuneConfig,
    quick_version,
    top_recipe,
)

if TYPE_CHECKING:
    from hydra_core.data.benchmark import Benchmark
    from hydra_core.data.text import TextSet


#: where the report goes unless told (never the committed docs/report/ by default)
DEFAULT_TEXT_OUT = Path("results") / "report" / "text"


#: the efficient ensembles that apply to a text model (fine-tuned from it; Packed-Ensembles and
#: MIMO are trained from scratch with a Hydra Lab checkpoint's recipe, docs/baselines.md)
TEXT_EFFICIENT = (efficient.BATCH, efficient.LORA)

#: fine-tuning after pruning, every pruned model and member: the default named recipe
#: (:data:`~hydra_core.training.top.TOP_RECIPES`; ``report --finetune-recipe`` picks another)
FINETUNE = top_recipe(DEFAULT_TOP_RECIPE)


@dataclass(frozen=True)
class TextReportConfig:
    """What the text report runs.

    Args:
        model: model source (see :func:`~hydra_core.zoo.registry.load_model`).
        repeats: runs of the seeded systems (search subsample, its three searches, pruning seeds
            and fine-tuning seed change together); the verdicts are taken over all of them.
        n_search: sentences per search part (ID validation, and each search OOD set). 256 + 256:
            at 128 + 128 the CircAvg search raised its objective on the search sentences and
            lowered it on every report set (it fitted its sample); at 256 + 256 a budget-36
            search on ``minilm-sentiment`` takes about 30 min on one CPU core, and a run makes
            three per repeat plus the stability runs: twice the sentences, twice that.
        n_report: sentences per report part: the ID test sentences and each report OOD set
            (None: all of them).
        ood_cap: at most this many sentences of each report OOD set (None: no cap).
        ood: report OOD sets by name (None: the five default text report sets).
        removed_per_layer: heads Taylor removes per layer; every circuit and member removes as
            many heads in all (None: half of a layer's heads, the paper's 6 of 12 kept).
        pool_fraction: members prune their heads from this share of the least useful heads.
        seeds: one pruning seed per member (and one seed per Deep Ensembles head).
        taylor_samples: ID search sentences the Taylor scores use.
        mc_passes, mc_seed: MC Dropout's passes T and the seed of its first pass.
        finetune: fine-tuning after pruning (None: zero-shot rows only).
        deep: how Deep Ensembles (D) is made: ``"train-text"`` (``minilm-sentiment`` only, other
            models fall back to ``"heads"``): its own training recipe once per seed, the shipped
            model being seed 0 (:func:`train_text_ensemble`); ``"heads"``: fresh heads on the
            shared encoder (:func:`deep_heads`); None: no Deep Ensembles row.
        deep_heads: how ``"heads"`` trains them.
        efficient: the paper's efficient ensembles looked for (default: the two that apply to a
            text model, ``"batch-ensemble"`` and ``"lora-ensembles"``, fine-tuned from it; the
            paper's Table 2 has LoRA Ensembles): each one whose trained copy of the model is
            stored in the cache (``train-baselines ... --model MODEL``) is a row of Table 2 and
            the cost table, and of the paper's statements about it; the report never trains one,
            it names the command that does. ``"packed-ensembles"`` and ``"mimo"`` are trained
            from scratch with a Hydra Lab checkpoint's recipe: for a text model they are left
            out with that reason (empty: none looked for).
        device, batch_size: where and in what batches to predict.
        latency_batch, latency_repeats: sentences per timed forward and timed calls per system.
        fusion_check: report sentences on which fused and separately run members are compared.
        stability_resamples: bootstrap resamples of the search data per circuit for its
            stability (0: none); held_out: unused search-role sentences per set scored after
            every step (:mod:`hydra_core.experiment.stability`).
        evidence_samples: report sentences per set for the per-head evidence (heads.csv).
        loso_set: the report set left out of a CircOOD search over halves of the other report
            sets (the transfer section's leave-one-set-out run; tweets: a near set in another
            register than movie reviews); when the run does not report on it, the first near
            report set (:func:`~hydra_core.report.transfer.left_out_set`); None skips it.
    """

    model: str = "minilm-sentiment"
    repeats: int = 3
    n_search: int | None = 256
    n_report: int | None = None  # all 1,500 test sentences
    ood_cap: int | None = 1000
    ood: tuple[str, ...] | None = None
    protocol: str = DEFAULT_PROTOCOL  # which data selects heads (docs/search-protocols.md)
    ood_aggregate: str = DEFAULT_OOD_AGGREGATE  # how the searches combine the OOD search sets
    candidates: int | None = None  # the guided search's K (None: exact; no stability runs)
    removed_per_layer: int | None = None
    pool_fraction: float = 2 / 3
    seeds: tuple[int, ...] = (0, 1, 2)
    taylor_samples: int | None = None  # every ID search sentence
    mc_passes: int = 5
    mc_seed: int = 0
    finetune: TopFinetuneConfig | None = FINETUNE
    deep: str | None = "train-text"
    deep_heads: TopFinetuneConfig = DEEP_HEADS
    efficient: tuple[str, ...] = TEXT_EFFICIENT
    device: str = "auto"
    batch_size: int = 128
    latency_batch: int = 32
    latency_repeats: int = 20
    fusion_check: int = 256
    stability_resamples: int = 3
    held_out: int | None = 256
    evidence_samples: int | None = 500
    loso_set: str | None = "tweets"

    def __post_init__(self) -> None:
        check_efficient(self.efficient)

    @classmethod
    def quick(cls, **overrides) -> TextReportConfig:
        """Tiny subsets, one optimiser step per training: every section in well under a minute
        on a tiny model."""
        settings = dict(
            n_search=16,
            n_report=24,
            repeats=2,
            ood_cap=None,
            taylor_samples=16,
            mc_passes=2,
            finetune=quick_version(FINETUNE),
            deep="heads",
            deep_heads=replace(DEEP_HEADS, steps=1, n_train=32, batch_size=16),
            latency_batch=4,
            latency_repeats=1,
            fusion_check=16,
            stability_resamples=2,
            held_out=16,
        )
        settings.update(overrides)
        return cls(**settings)


def text_config_from_args(
    quick: bool, finetune_recipe: str | None = None, **overrides
) -> TextReportConfig:
    """A :class:`TextReportConfig`, quick or full, with the given fields replaced (None = keep);
    ``finetune_recipe``: the named fine-tuning recipe (its quick version when quick)."""
    base = TextReportConfig.quick() if quick else TextReportConfig()
    if finetune_recipe is not None:
        recipe = top_recipe(finetune_recipe)
        base = replace(base, finetune=quick_version(recipe) if quick else recipe)
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})


def text_benchmark(config: TextReportConfig) -> Benchmark:
    """The text default benchmark at the configuration's sizes: each report OOD set cut to its
    first ``config.ood_cap`` sentences (a prefix of the fixed shuffle, so the same sentences as
    ``n_report=ood_cap`` would give)."""
    from hydra_core.data.benchmark import default_text_benchmark

    benchmark = default_text_benchmark(
        config.n_search,
        config.n_report,
        ood=list(config.ood) if config.ood else None,
        protocol=config.protocol,
    )
    if config.ood_cap is None:
        return benchmark
    capped = tuple(
        s if len(s) <= config.ood_cap else s.subset(torch.arange(config.ood_cap))
        for s in benchmark.ood_report
    )
    return replace(benchmark, ood_report=capped)


def sorted_report(benchmark: Benchmark, preprocess) -> Benchmark:
    """``benchmark`` with every report part in order of sentence length (:func:`by_length`)."""
    return replace(
        benchmark,
        id_report=by_length(benchmark.id_report, preprocess),
        ood_report=tuple(by_length(s, preprocess) for s in benchmark.ood_report),
    )


def by_length(data: TextSet, preprocess: Callable[[Sequence[str]], torch.Tensor]) -> TextSet:
    """``data`` with its sentences in order of token count (the same sentences: every metric is
    unchanged, batches need less padding)."""
    lengths = preprocess(data.inputs)[:, 1].sum(1)
    return data.subset(torch.argsort(lengths, stable=True))
