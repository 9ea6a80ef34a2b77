"""The text report: the paper's Table 2 (section 5.2, BERT on SST-2) on the offline text default.

``python -m hydra_core report --task text`` writes ``report.md``, ``report.json`` and one CSV per
table into ``results/report/text`` (committed: ``docs/report/text``). It runs the rows of Table 2
that need no training from scratch, every pruning method keeping half of the heads (6 of 12 per
layer for Taylor, 36 of 72 heads removed for every pruned model and member), with the image
report's protocol: heads are selected on the search split (Rotten Tomatoes validation sentences and
the search-role OOD set, Guardian headlines, the analogue of the paper's AG's News), every number
comes from the report split (the Rotten Tomatoes test sentences and the report-role OOD sets) with
its 95% bootstrap interval, and every system is compared with the single model on the same
resamples (paired intervals).

The systems:

- **Single**: the source model (``minilm-sentiment``: all-MiniLM-L6-v2, its encoder layers 4-5,
  pooler and classifier fine-tuned on Rotten Tomatoes by ``train-text``).
- **Deep Ensembles (D)** (the paper's text baseline: one fine-tuned backbone, three classifiers
  from different random seeds): for ``minilm-sentiment``, its own ``train-text`` recipe run once
  per seed, the shipped model being seed 0; the runs share what the recipe freezes (the wheel's
  embedding and encoder layers 0-3, stored and run once) and differ in what it trains (layers
  4-5, pooler, classifier) (:func:`train_text_ensemble`, :class:`SharedBackboneEnsemble`). Any
  other text model: fresh heads (the family's "head" parameters, BERT's pooler and classifier),
  re-initialised from each seed and trained on the shared encoder's final states
  (:func:`deep_heads`).
- **MC Dropout**: the source model with its own dropout on at test time, T passes (each pass
  re-seeds dropout with seed t at every batch, so predictions are reproducible), probabilities
  averaged (:class:`MCDropout`).
- **Taylor**: layer-wise Taylor pruning (paper D.1.1), the same number of heads in every layer.
- **CircAvg**: the greedy circuit of the S_avg objective (paper Algorithm 1); it removes as many
  heads in all, not necessarily as many per layer (the report lists what it keeps per layer).
- **Hydra (Taylor)**, **Hydra (Circ)**: M members, each pruning the budget's heads drawn with its
  own seed from the least useful heads of the Taylor global ranking or of the CircAvg greedy
  ranking (as the image report builds them), fused into one model with
  :func:`~hydra_core.hydra.fused.fuse_members`.

The pruned models and members appear twice: zero-shot (pruned, not trained) and fine-tuned after
pruning (paper D.2: AdamW with decoupled weight decay, a per-step linear warm-up over 10% of the
steps then linear decay to zero, gradient clipping at 1.0, no label smoothing, BERT's dropout
left on), with the named recipe :data:`FINETUNE` (by default ``paper-short``: every encoder layer,
the pooler and the classifier, lr 1e-5, at most 3 epochs of 2,000 training sentences, early
stopping on 600 held-out ones; ``fast``, the recipe below, trained the layers ``train-text``
trains; docs/text.md measures both and ``paper``) on the Rotten Tomatoes training sentences, each
model separately; fine-tuned
members are fused with their MLPs averaged (paper 4.2). Both trainings run on states cached once
per model: the frozen layers run once over the training sentences (:func:`finetune_top`).

Why the ``fast`` recipe's settings: D.2 takes the learning rate "best by
validation". The Taylor-pruned model (6 heads per layer, Taylor scores on the 128 ID search
sentences), fine-tuned for one epoch of 2,000 training sentences (63 steps of 32) at three peak
rates, scored on 512 Rotten Tomatoes validation sentences (held out of training; the split heads
are selected on, never reported); the lowest NLL chose the rate (the dense model: accuracy 82.42,
NLL 0.4047; the pruned model before fine-tuning: 78.32, 0.4763)::

    lr      accuracy  NLL     ECE
    3e-5    79.69     0.4463  0.0406
    1e-4    81.45     0.4494  0.0583
    3e-4    80.66     0.4426  0.0551   <- chosen

The three lie within 0.007 NLL of each other, a near-tie that another mask could reorder. Each
run took 64-92 s on two CPU cores shared with other jobs; all 6,030 training sentences would
take three times as long for each of the eight models the report fine-tunes.

Report sentences are evaluated in order of length with the unused padding of each batch removed
(:class:`TrimmedPreprocess`): padding never changes a result here, it only costs time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import torch
from torch import nn

from hydra_core.analysis._maps import DEFAULT_OOD_AGGREGATE
from hydra_core.analysis.inputs import SearchInputs, search_inputs
from hydra_core.baselines.shared_backbone import DEEP, DEEP_HEADS, has_train_text_recipe
from hydra_core.baselines.systems import (
    MC_DROPOUT,
    MCDropoutBaseline,
    SharedBackboneBaseline,
)
from hydra_core.cache import DiskCache
from hydra_core.data.benchmark import DEFAULT_PROTOCOL
from hydra_core.data.provenance import ChosenOn
from hydra_core.data.text import TEXT_OOD, load_rotten_tomatoes, load_text_ood_set
from hydra_core.evaluate import callable_model, probabilities
from hydra_core.hydra.cost import cost_table, parameter_breakdown
from hydra_core.hydra.experiment import Run
from hydra_core.hydra.fused import fuse_members
from hydra_core.hydra.systems import SystemsReport
from hydra_core.masks import MemberMask
from hydra_core.models.adapter import head_layout
from hydra_core.models.preprocess import TrimmedPreprocess
from hydra_core.report.claims import CIRCAVG
from hydra_core.report.heads import evidence_table
from hydra_core.report.pipeline import Budgets, Pipeline, run_options, search_repeat
from hydra_core.report.tables import (
    HYDRA_CIRC,
    HYDRA_CIRC_FT,
    HYDRA_TAYLOR,
    fused,
)
from hydra_core.report.text_markdown import text_markdown
from hydra_core.report.text_tables import (
    CIRCAVG_FT,
    HYDRAS,
    SINGLE,
    TAYLOR,
    TAYLOR_FT,
    text_tables,
)
from hydra_core.training.top import (
    DEFAULT_TOP_RECIPE,
    TopFinetuneConfig,
    TopFinetuned,
    finetune_top,
    pruned_copy,
    quick_version,
    top_recipe,
)
from hydra_core.types import Log, StageProgress

if TYPE_CHECKING:
    from hydra_core.data.benchmark import Benchmark
    from hydra_core.data.text import TextSet
    from hydra_core.zoo.registry import LoadedModel

#: where the report goes unless told (never the committed docs/report/ by default)
DEFAULT_TEXT_OUT = Path("results") / "report" / "text"

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
        device, batch_size: where and in what batches to predict.
        latency_batch, latency_repeats: sentences per timed forward and timed calls per system.
        fusion_check: report sentences on which fused and separately run members are compared.
        stability_resamples: bootstrap resamples of the search data per circuit for its
            stability (0: none); held_out: unused search-role sentences per set scored after
            every step (:mod:`hydra_core.report.stability`).
        evidence_samples: report sentences per set for the per-head evidence (heads.csv).
    """

    model: str = "minilm-sentiment"
    repeats: int = 3
    n_search: int | None = 256
    n_report: int | None = None  # all 1,500 test sentences
    ood_cap: int | None = 1000
    ood: tuple[str, ...] | None = None
    protocol: str = DEFAULT_PROTOCOL  # which data selects heads (docs/search-protocols.md)
    ood_aggregate: str = DEFAULT_OOD_AGGREGATE  # how the searches combine the OOD search sets
    removed_per_layer: int | None = None
    pool_fraction: float = 2 / 3
    seeds: tuple[int, ...] = (0, 1, 2)
    taylor_samples: int | None = None  # every ID search sentence
    mc_passes: int = 5
    mc_seed: int = 0
    finetune: TopFinetuneConfig | None = FINETUNE
    deep: str | None = "train-text"
    deep_heads: TopFinetuneConfig = DEEP_HEADS
    device: str = "auto"
    batch_size: int = 128
    latency_batch: int = 32
    latency_repeats: int = 20
    fusion_check: int = 256
    stability_resamples: int = 3
    held_out: int | None = 256
    evidence_samples: int | None = 500

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


# --- the run --------------------------------------------------------------------------------------


def run_text_report(
    config: TextReportConfig = TextReportConfig(),
    out: str | Path = DEFAULT_TEXT_OUT,
    *,
    cache: DiskCache | None = None,
    progress: StageProgress | None = None,
    log: Log = print,
    overwrite: bool = False,
) -> dict:
    """Run the text report and write ``report.md``, ``report.json`` and the CSVs into ``out``.

    Repeat 0 gives every table; repeats 1 .. ``config.repeats`` - 1 run the seeded systems again
    (another search subsample and its three searches, pruning seeds r*M .. r*M + M - 1,
    fine-tuning seed r) on the same report sentences, and the verdicts against the paper are
    taken over all repeats (two-level intervals: repeats, then sentences).

    Returns ``report.json``'s content: ``setup`` (with ``protocol``) and every table as records,
    each metric ``{"value": v, "ci95": [lo, hi]}``.
    """
    run = Pipeline(
        out, cache, config.device, progress, log, overwrite=overwrite, options=run_options(config)
    )
    run.ood_aggregate = config.ood_aggregate
    (train_set,) = run.load(lambda: _load(config))
    loaded, benchmark, stages = run.loaded, run.benchmark, run.stage
    model, layout = loaded.model, run.layout
    per_layer = config.removed_per_layer or layout.max_heads // 2
    budgets = Budgets.of(layout, replace(config, removed_per_layer=per_layer))
    # the report sentences by length, each batch trimmed to its longest: the same numbers, faster
    trimmed = replace(loaded, preprocess=TrimmedPreprocess(loaded.preprocess))
    report_set = sorted_report(benchmark, loaded.preprocess)
    deep_kind = _deep_kind(config, run)

    def later_repeats() -> Iterator[SystemsReport]:
        """Repeats 1 .. repeats - 1 (under torchrun: this process's share, rank 0 all)."""
        if config.repeats > 1:
            id_pool = load_rotten_tomatoes("validation")
            pools = [
                load_text_ood_set(s.name) if s.name in TEXT_OOD else s for s in benchmark.ood_search
            ]
        share = lambda: run.share_stability(budgets.budget, config.stability_resamples)  # noqa: E731
        for r in run.repeats(config.repeats, before_wait=share):
            sub = search_repeat(report_set, id_pool, pools, config.n_search, r)
            inputs = search_inputs(loaded.preprocess, sub).to(run.device)
            again = _repeat(run, config, budgets, train_set, trimmed, sub, deep_kind, r, inputs)
            yield again.report

    if run.rank > 0:  # under torchrun: this process's share of the repeats, then done
        for _ in later_repeats():
            pass
        return {}
    main = _repeat(run, config, budgets, train_set, trimmed, report_set, deep_kind, 0)
    reports = [main.report, *later_repeats()]
    stability = run.stability(
        main.circuits,
        text_benchmark(replace(config, n_search=None)),
        resamples=config.stability_resamples,
        held_out=config.held_out,
    )

    members = main.members
    with stages("fused vs separately run members"):
        fusion = _fusion_check(model, members, main.hydras, main.tuned_members, main.run, config)
    with stages("cost and latency"):
        main.report.cost = _cost(model, main.report, members, main.pruned, main.run, config)
    with stages("bootstrap intervals"):
        pruned = [main.taylor, main.circavg]
        tables = text_tables(main.report, main.circuits, pruned, members, fusion, reports)
    tables["training"] = _training_table(main.deep_runs, main.tuned, main.tuned_members)
    if stability is not None:
        tables["stability"] = stability
    with stages("per-head evidence (heads.csv)"):
        fit = run.inputs
        n, batch = config.evidence_samples, config.batch_size
        tables["heads"] = evidence_table(
            loaded, benchmark, fit.id_x, fit.id_y, n=n, batch_size=batch, cache=run.cache
        )
    setup = _setup(run, config, budgets, members, deep_kind)
    return run.write(tables, setup, main.report, text_markdown)


@dataclass
class _Repeat:
    """What one repeat of the text report evaluated (repeat 0 gives every table)."""

    run: Run
    report: SystemsReport
    circuits: dict
    taylor: MemberMask
    circavg: MemberMask
    members: dict[str, list[MemberMask]]
    pruned: dict[str, nn.Module]
    hydras: dict[str, nn.Module]
    tuned: dict[str, TopFinetuned]
    tuned_members: dict[str, list[TopFinetuned]]
    deep_runs: list


def _repeat(
    run: Pipeline,
    config: TextReportConfig,
    budgets: Budgets,
    train_set: TextSet,
    trimmed: LoadedModel,
    benchmark: Benchmark,
    deep_kind: str | None,
    r: int,
    inputs: SearchInputs | None = None,
) -> _Repeat:
    """One repeat: the three searches and the pruning on ``inputs`` (default: the run's search
    tensors), then every system on the report split of ``benchmark`` (sorted by length), pruning
    seeds r*M .. r*M + M - 1 and fine-tuning seed r. Cached models and predictions make the
    systems that do not change between repeats (single, MC Dropout, Deep Ensembles) cheap."""
    model, device, stages = run.loaded.model, run.device, run.stage
    tag = f", repeat {r}" if r else ""
    m = len(config.seeds)
    seeds = [r * m + s for s in config.seeds] if r else list(config.seeds)
    pruning = run.circuits_and_members(
        budgets,
        seeds,
        taylor_samples=config.taylor_samples,
        batch_size=config.batch_size,
        inputs=inputs,
        repeat=tag,
    )
    circuits = pruning.circuits
    taylor, circavg, members = pruning.taylor, pruning.circavg, pruning.members
    if not r:
        run.save_members([taylor, circavg, *(mm for label in HYDRAS for mm in members[label])])

    options = dict(device=device, cache=run.cache, batch_size=config.batch_size)
    systems = Run(trimmed, benchmark, device, options, run.progress)
    # every pruned system was chosen on the search split, every fine-tuned one also on the
    # training sentences: refused before anything runs if a report sentence is among them
    systems.check_chosen("the pruned systems", systems.search_choice())
    if config.finetune is not None:
        tuning = ChosenOn.of("fine-tuning", [train_set])
        systems.check_chosen("the fine-tuned systems", systems.search_choice() | tuning)
    pruned = {TAYLOR: pruned_copy(model, taylor.keep), CIRCAVG: pruned_copy(model, circavg.keep)}
    with stages("evaluate the single model, Taylor and CircAvg" + tag):
        systems.add_model(SINGLE, "single", model)
        for name, pm in pruned.items():
            systems.add_model(name, "pruned", pm)
    with stages(f"MC Dropout ({config.mc_passes} passes){tag}"):
        MCDropoutBaseline(config.mc_passes, config.mc_seed).add_to(systems)
    deep_runs = []
    if deep_kind is not None:
        with stages(f"{DEEP}: {len(seeds)} members ({deep_kind}), trained and evaluated{tag}"):
            deep = SharedBackboneBaseline(
                config.seeds, deep_kind, config.deep_heads, train_set, benchmark.id_search
            )
            systems.check_unseen(deep)
            deep.add_to(systems)
            deep_runs = deep.runs
            if deep_kind == "heads":
                deep_runs = [_training_row(DEEP, h) for h in deep.runs]
    hydras = {}
    with stages("fuse and evaluate Hydra (Taylor), Hydra (Circ) and its B.5 ablation" + tag):
        for label in HYDRAS:
            hydras[label] = fuse_members([(model, mm.keep) for mm in members[label]])
            systems.add_fused(fused(label), hydras[label], _kept(members[label]))

    tuned: dict[str, TopFinetuned] = {}
    tuned_members: dict[str, list[TopFinetuned]] = {}
    if config.finetune is not None:
        train = dict(preprocess=run.loaded.preprocess, device=device, cache=run.cache, seed=r)

        def tune(name: str, keep: torch.Tensor) -> TopFinetuned:
            progress = run.fine_tune_progress(name + tag)
            return finetune_top(
                model, train_set, config.finetune, keep=keep, name=name, progress=progress, **train
            )

        n_members = sum(len(members[label]) for label in HYDRAS)
        with stages(f"fine-tune {2 + n_members} pruned models and members{tag}"):
            pairs = ((TAYLOR, taylor), (CIRCAVG, circavg))
            tuned = {name: tune(name, mm.keep) for name, mm in pairs}
            tuned_members = {
                label: [tune(mm.name, mm.keep) for mm in members[label]] for label in HYDRAS
            }
        with stages("evaluate the fine-tuned systems" + tag):
            for name, ft_name in ((TAYLOR, TAYLOR_FT), (CIRCAVG, CIRCAVG_FT)):
                systems.add_model(ft_name, "pruned", tuned[name].model)
            for label, ft_label in HYDRAS.items():
                parts = [(t.model, head_layout(t.model).all_kept()) for t in tuned_members[label]]
                hydras[ft_label] = fuse_members(parts)  # MLPs averaged over the members
                systems.add_fused(fused(ft_label), hydras[ft_label], _kept(members[label]))
    report = SystemsReport(systems.evaluations, systems.info)
    return _Repeat(
        systems, report, circuits, taylor, circavg, members, pruned, hydras, tuned, tuned_members,
        deep_runs,
    )  # fmt: skip


def _load(config: TextReportConfig):
    """The model (refused unless it is a text classifier with the benchmark's classes), the
    benchmark and the training sentences."""
    from hydra_core.data.text import load_rotten_tomatoes
    from hydra_core.errors import InputError
    from hydra_core.models.modality import TEXT_MODALITY
    from hydra_core.zoo.registry import load_model

    loaded = load_model(config.model)
    if loaded.modality is not TEXT_MODALITY:
        raise InputError(
            f"--task text needs a text classifier; {config.model!r} takes images (run the "
            "image report with --task image)"
        )
    benchmark = text_benchmark(config)
    train_set = load_rotten_tomatoes("train")
    if loaded.num_outputs() != len(train_set.classes):
        raise InputError(
            f"{config.model!r} predicts {loaded.num_outputs()} classes; the text benchmark "
            f"(Rotten Tomatoes) has {len(train_set.classes)}: pass a binary sentiment model"
        )
    return loaded, benchmark, train_set


def _kept(members: Sequence[MemberMask]) -> list[int]:
    """Each member's number of kept heads."""
    return [int(m.keep.sum()) for m in members]


def _sample(data: TextSet, n: int, purpose: str) -> TextSet:
    """A fixed random ``n`` of ``data``'s sentences (the report sets are sorted by length)."""
    from hydra_core.data.images import take

    return take(data, min(n, len(data)), purpose=purpose)


@torch.no_grad()
def _fusion_check(
    model: nn.Module,
    members: Mapping[str, Sequence[MemberMask]],
    hydras: Mapping[str, nn.Module],
    tuned_members: Mapping[str, Sequence[TopFinetuned]],
    run: Run,
    config: TextReportConfig,
) -> pd.DataFrame:
    """The fused models against their members run one by one (probabilities averaged), on a
    fixed sample of report sentences: float error for zero-shot members, the effect of MLP
    averaging for fine-tuned ones."""
    from hydra_core.inference import predict

    sample = _sample(run.benchmark.id_report, config.fusion_check, "fusion-check")
    separate = {label: [pruned_copy(model, m.keep) for m in members[label]] for label in HYDRAS}
    for label, ft_label in HYDRAS.items():
        if label in tuned_members:
            separate[ft_label] = [t.model for t in tuned_members[label]]
    options = dict(device=run.device, batch_size=config.batch_size)
    rows = []
    for label, models in separate.items():
        hydra = hydras[label].to(run.device).eval()
        fused_p = probabilities(predict(hydra, sample.inputs, run.loaded.preprocess, **options))
        logits = [
            predict(
                callable_model(m.to(run.device).eval()),
                sample.inputs,
                run.loaded.preprocess,
                **options,
            )
            for m in models
        ]
        unfused_p = probabilities(torch.stack(logits, dim=1))  # (N, M, C) -> mean of softmaxes
        gap = (fused_p - unfused_p).abs()
        rows.append(
            {
                "system": label,
                "sentences": len(sample),
                "max_prob_diff": float(gap.max()),
                "mean_prob_diff": float(gap.mean()),
                "changed_predictions": int((fused_p.argmax(-1) != unfused_p.argmax(-1)).sum()),
            }
        )
    return pd.DataFrame(rows)


def _cost(
    model: nn.Module,
    systems: SystemsReport,
    members: Mapping[str, Sequence[MemberMask]],
    pruned: Mapping[str, nn.Module],
    run: Run,
    config: TextReportConfig,
) -> pd.DataFrame:
    """Parameters, multiply-adds and latency of one system of each kind, each as the models it
    runs one after another, on a fixed sample of report sentences."""
    from hydra_core.hydra.systems import system_name

    chosen = {SINGLE: [model], **{n: [m] for n, m in pruned.items()}}
    chosen[system_name(HYDRA_CIRC, "unfused")] = [
        pruned_copy(model, m.keep) for m in members[HYDRA_CIRC]
    ]
    for name in (fused(HYDRA_TAYLOR), fused(HYDRA_CIRC), fused(HYDRA_CIRC_FT), DEEP, MC_DROPOUT):
        if name in systems.info:
            chosen[name] = systems.info[name].models
    sample = _sample(run.benchmark.id_report, config.latency_batch, "latency")
    precisions = {"latency": None}
    if run.device.type == "cuda":
        precisions["latency_bf16"] = torch.bfloat16
    return cost_table(
        chosen,
        run.loaded.preprocess(sample.inputs).to(run.device),
        precisions=precisions,
        repeats=config.latency_repeats,
    )


def _training_table(
    deep_runs: Sequence[dict],
    tuned: Mapping[str, TopFinetuned],
    tuned_members: Mapping[str, Sequence[TopFinetuned]],
) -> pd.DataFrame:
    """One row per trained model: Deep Ensembles' members (train-text runs with their validation
    and test accuracy, or fresh heads), then every model fine-tuned after pruning."""
    rows = list(deep_runs)
    rows += [_training_row(name, t) for name, t in tuned.items()]
    rows += [_training_row(label, t) for label, ts in tuned_members.items() for t in ts]
    frame = pd.DataFrame(rows)
    for column in ("chosen_epoch", "steps"):  # counts, "–" where a kind of run has none
        if column in frame:
            frame[column] = [None if v != v else int(v) for v in frame[column]]
    return frame


def _training_row(system: str, tuned: TopFinetuned) -> dict:
    """A training run of :func:`finetune_top`: seed, steps, last loss, chosen epoch, time."""
    steps = [h for h in tuned.history if "step" in h]
    chosen = next((h for h in tuned.history if "chosen_epoch" in h), {})
    return {
        "system": system,
        "model": tuned.name,
        "seed": tuned.seed,
        "steps": len(steps),
        "last_loss": steps[-1]["loss"] if steps else math.nan,
        "chosen_epoch": chosen.get("chosen_epoch", math.nan),
        "validation_nll": chosen.get("val_nll", math.nan),
        "seconds": round(tuned.seconds, 1),
        "cached": tuned.cached,
    }


def _deep_kind(config: TextReportConfig, run: Pipeline) -> str | None:
    """How Deep Ensembles (D) is made for this model (see :class:`TextReportConfig`)."""
    if config.deep not in ("train-text", "heads", None):
        raise ValueError(f"deep must be 'train-text', 'heads' or None, got {config.deep!r}")
    name = run.loaded.name
    if config.deep == "train-text" and not has_train_text_recipe(name):
        run.log(f"{run.tag} {DEEP}: {name} has no train-text recipe; fresh heads instead")
        return "heads"
    return config.deep


def _setup(
    run: Pipeline,
    config: TextReportConfig,
    budgets: Budgets,
    members: Mapping[str, Sequence[MemberMask]],
    deep: str | None,
) -> dict:
    """The run's description (``report.json``'s ``setup``); ``protocol`` says which sentences
    selected heads and which were reported, and every seed."""
    m = len(config.seeds)
    seeds = {
        "pruning": list(config.seeds),
        "pruning_per_repeat": [
            [r * m + s for s in config.seeds] if r else list(config.seeds)
            for r in range(config.repeats)
        ],
        "search_subsample": [f"search-repeat-{r}" for r in range(1, config.repeats)],
        "deep_ensemble": list(config.seeds) if deep else [],
        "finetune_batch_order": 0,
        "finetune_seed_per_repeat": list(range(config.repeats)),
        "mc_dropout": [config.mc_seed + t for t in range(config.mc_passes)],
        "bootstrap": {"n_boot": 1000, "seed": 0, "level": 0.95},
    }
    setup = run.setup("text", budgets, seeds, members)
    setup.update(
        parameters=parameter_breakdown(run.loaded.model),
        config={k: v for k, v in asdict(config).items() if k not in ("finetune", "deep_heads")},
        finetune=None if config.finetune is None else asdict(config.finetune),
        deep=deep,
        deep_heads=asdict(config.deep_heads) if deep == "heads" else None,
    )
    return run.finish(setup)
