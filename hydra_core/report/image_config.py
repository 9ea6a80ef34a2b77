"""The image report's configuration: what it runs (:class:`ReportConfig`), full or quick."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from hydra_core.analysis._maps import DEFAULT_OOD_AGGREGATE
from hydra_core.baselines.efficient import NAMES as EFFICIENT_NAMES
from hydra_core.data.benchmark import DEFAULT_PROTOCOL
from hydra_core.hydra.finetune import FinetuneConfig
from hydra_core.report.efficient_ensembles import check_efficient

#: where the report goes unless told (never the committed docs/report/ by default)
DEFAULT_OUT = Path("results") / "report"


@dataclass(frozen=True)
class ReportConfig:
    """What the report runs.

    The defaults are sized for about half an hour on two CPU cores the first time (most of it the
    three greedy searches, about 24 steps x 72 candidates x 512 images each; they are cached, as
    are fine-tuned weights and predictions, so a second run takes a few minutes). Larger
    ``n_search`` / ``n_report`` give less noisy rankings and tables at a proportional cost.

    Args:
        model: model source (see :func:`~hydra_core.zoo.registry.load_model`).
        n_search: images per search part (ID and each OOD set): head selection only; the greedy
            search scores candidates on n_search ID + n_search pooled OOD images.
        n_report: images per report part: every table (None: the whole Fashion-MNIST test set
            and every image of each report OOD set).
        ood: report OOD sets by name (None: the five default report sets).
        search_ood: search OOD sets by name, used only to select heads and never reported
            (None: the default search sets, see :data:`hydra_core.data.ood.SEARCH_OOD`).
        protocol: which data selects heads (:data:`~hydra_core.data.benchmark.PROTOCOLS`,
            docs/search-protocols.md): ``"dedicated"`` (search sets apart from report sets, the
            paper's), ``"synthetic"``, ``"far-to-near"``, ``"near-to-far"``, or ``"halves"``
            (halves of the report sets, which leaks them into head selection; the report says so
            at the top).
        ood_aggregate: how the greedy searches' AUROC combines the OOD search sets (``pooled``,
            ``mean``, ``min``); the stability resamples score the pooled AUROC.
        candidates: K of the guided search (docs/guided-search.md) for every greedy search of
            the report; None: the exact search. The stability runs resample the exact search,
            so a guided report has none.
        repeats: how often the seeded systems are repeated (search subsample, pruning seeds and
            fine-tuning batch order change together); their mean ± std is Table 12.
        loso_set: the report set left out of a CircOOD search over halves of the other report
            sets (the transfer table's leave-one-set-out run); when the run does not report on
            it, the first near report set (:func:`~hydra_core.report.transfer.left_out_set`);
            None skips it.
        removed_per_layer: heads Taylor removes per layer; every circuit and every member removes
            as many heads in all (None: a third of the heads of a layer, rounded: 4 of 12, i.e. 8
            kept as in the paper's ViT-B experiments).
        pool_fraction: members prune their heads from the ``pool_fraction`` least useful share of
            all heads (the paper draws 48 of the 100 least useful of 144 heads: about 2/3).
        seeds: one pruning seed per member (M = len(seeds); the paper uses M = 3).
        taylor_samples: ID search images the Taylor scores use.
        finetune: how members and pruned models are fine-tuned (None: zero-shot only).
        deep_ensemble: include Deep Ensembles when trained copies of the model exist.
        efficient: the paper's efficient ensembles looked for (``"packed-ensembles"``,
            ``"mimo"``, ``"batch-ensemble"``, ``"lora-ensembles"``): each one whose trained copy
            is stored in the cache (``train-baselines``) is a row of Tables 1-2 and 7 and of the
            paper's statements about it; the report never trains one, it names the command that
            does (empty: none looked for).
        distance_samples: images per set for the centroid distances (Table 5).
        evidence_samples: images per report set for the per-head evidence (heads.csv; None:
            all).
        device, batch_size: where and in what batches to predict.
        latency_batch, latency_repeats: images per timed forward and timed calls per system.
        stability_resamples: bootstrap resamples of the search data per circuit for its
            stability (0: none); held_out: unused search-role images per set scored after every
            step (:mod:`hydra_core.experiment.stability`).
    """

    model: str = "default"
    n_search: int | None = 256
    n_report: int | None = None
    ood: tuple[str, ...] | None = None
    search_ood: tuple[str, ...] | None = None
    protocol: str = DEFAULT_PROTOCOL
    ood_aggregate: str = DEFAULT_OOD_AGGREGATE
    candidates: int | None = None
    repeats: int = 5
    loso_set: str | None = "mnist"
    removed_per_layer: int | None = None
    pool_fraction: float = 2 / 3
    seeds: tuple[int, ...] = (0, 1, 2)
    taylor_samples: int | None = 256
    finetune: FinetuneConfig | None = FinetuneConfig()
    deep_ensemble: bool = True
    efficient: tuple[str, ...] = tuple(EFFICIENT_NAMES)
    distance_samples: int | None = 1000
    evidence_samples: int | None = 1000
    device: str = "auto"
    batch_size: int = 256
    latency_batch: int = 32
    latency_repeats: int = 20
    stability_resamples: int = 5
    held_out: int | None = 512

    def __post_init__(self) -> None:
        check_efficient(self.efficient)

    @classmethod
    def quick(cls, **overrides) -> ReportConfig:
        """Small subsets and short fine-tuning: every section in a couple of minutes."""
        settings = dict(
            n_search=64,
            n_report=200,
            repeats=2,
            taylor_samples=64,
            distance_samples=200,
            latency_repeats=3,
            stability_resamples=2,
            held_out=64,
            finetune=FinetuneConfig(n_train=256, steps=4, batch_size=64, warmup_steps=1),
        )
        settings.update(overrides)
        return cls(**settings)


def config_from_args(quick: bool, **overrides) -> ReportConfig:
    """A :class:`ReportConfig`, quick or full, with the given fields replaced (None = keep)."""
    base = ReportConfig.quick() if quick else ReportConfig()
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})
