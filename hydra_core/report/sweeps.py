"""The paper's sweeps, on the report pipeline: heads removed per layer (B.3, Figures 5-6), the
number of Hydra members (B.6, Table 10) and corrupted ID data at five severities (Tables 13-14).

Each sweep is one short function over a :class:`~hydra_core.experiment.pipeline.Pipeline` (which
loads the model and data, runs the greedy searches on the search split and evaluates systems on
the report split, every metric with its stratified-bootstrap 95% interval), and returns one table:
a row per system and point, each metric ``m`` with ``m_lo`` and ``m_hi``. :func:`run_sweep`
writes the table as CSV, a plot (PNG and SVG), ``report.md`` and ``report.json``.

Heads are chosen on the search split only: every system is a pipeline system (``Pruned``,
``FinetunedPruned``, ``Hydra``, ``DeepEnsemble``), so the guard of ``evaluate_systems`` checks
each against the report items.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import torch

from hydra_core.baselines.deep_ensembles import DeepEnsemble, deep_ensemble_for
from hydra_core.baselines.shared_backbone import DEEP_HEADS, has_train_text_recipe
from hydra_core.baselines.systems import SharedBackboneBaseline
from hydra_core.cache import DiskCache
from hydra_core.data.corruptions import (
    SEVERITIES,
    check_corruptions,
    corrupt_set,
    corruptions_for,
)
from hydra_core.errors import InputError, choice
from hydra_core.evaluate import Evaluation, SetPredictions
from hydra_core.experiment.facts import run_options
from hydra_core.experiment.pipeline import Pipeline
from hydra_core.experiment.pruning import HYDRA_CIRC, Budgets
from hydra_core.experiment.results import SystemsReport
from hydra_core.experiment.systems import System
from hydra_core.hydra.finetune import FinetuneConfig
from hydra_core.hydra.members import (
    circuit_member,
    member_overlap,
    seed_sampled_members,
    taylor_member,
)
from hydra_core.hydra.systems import FinetunedPruned, Hydra, Pruned, Single
from hydra_core.outputs import write_output
from hydra_core.report.sweep_files import markdown_sweep, plot_sweep
from hydra_core.training.top import TopFinetuneConfig
from hydra_core.types import Log, StageProgress

SWEEPS = ("layers", "members", "corruption")
#: where a sweep goes unless told: results/sweep/<kind> (the committed docs/report/sweeps only
#: when named with --overwrite)
DEFAULT_SWEEP_OUT = Path("results") / "sweep"
#: the summary columns every sweep reports (each with _lo and _hi)
METRICS = ("accuracy", "ece", "nll", "brier", "all_auroc", "all_fpr95", "near_auroc", "far_auroc")
ID_METRICS = ("accuracy", "ece", "nll", "brier")
#: a task's default model (the CLI's --task): the embedded image or text default
TASK_MODELS = {"image": "default", "text": "minilm-sentiment"}


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


def budgets(run: Pipeline, config: SweepConfig, per_layer: int | None = None) -> Budgets:
    """The report's budgets for ``per_layer`` heads removed in every layer (None: a third)."""
    shape = SimpleNamespace(removed_per_layer=per_layer, pool_fraction=config.pool_fraction)
    return Budgets.of(run.layout, shape)


def rows_of(systems: SystemsReport, names: Sequence[str], metrics=METRICS, **point) -> list[dict]:
    """One row per system of ``names`` (those the report holds): ``point``'s columns, the
    system, its heads, and every metric of ``metrics`` with its interval."""
    summary = systems.summary().set_index("system")
    columns = [c + s for c in metrics for s in ("", "_lo", "_hi")]
    return [
        {**point, "system": n, "heads": summary.loc[n, "heads"], **summary.loc[n, columns]}
        for n in names
        if n in summary.index
    ]


# --- the sweeps ---------------------------------------------------------------------------------


def layers_sweep(run: Pipeline, config: SweepConfig) -> tuple[pd.DataFrame, SystemsReport]:
    """B.3: Taylor (``r`` heads of every layer) and CircAvg (the first ``r`` x layers heads of
    one greedy search), zero-shot and fine-tuned, for each ``r`` of ``removed_per_layer``."""
    layout = run.layout
    counts = [r for r in config.removed_per_layer if 0 < r < min(layout.num_heads)]
    if not counts:
        raise InputError(
            f"no point of {choice('points')} {' '.join(map(str, config.removed_per_layer))} "
            f"leaves a head in every layer of this model ({min(layout.num_heads)} heads per "
            f"layer): ask for fewer than {min(layout.num_heads)} heads removed per layer"
        )
    dropped = sorted(set(config.removed_per_layer) - set(counts))
    if dropped:
        run.log(f"{run.tag} {dropped} heads per layer left out: the model has {layout.max_heads}")
    circuit = run.search("avg", max(counts) * layout.num_layers, batch_size=config.batch_size)
    ranking = circuit.ranking()
    systems, points = [Single()], {"single": (0, "dense")}
    for r in counts:
        taylor = taylor_member(
            run.loaded.model,
            run.inputs,
            per_layer=r,
            samples=config.taylor_samples,
            batch_size=config.batch_size,
        )
        circ = circuit_member(ranking, layout, budget=r * layout.num_layers, ranking_name="CircAvg")
        for method, keep in (("Taylor", taylor.keep), ("CircAvg", circ.keep)):
            systems.append(Pruned(f"{method} -{r}/layer", keep))
            points[systems[-1].name] = (r, "zero-shot")
            if config.finetune is not None:
                name = f"{method} -{r}/layer (fine-tuned)"
                systems.append(FinetunedPruned(name, keep, config.finetune))
                points[name] = (r, "fine-tuned")
    with run.stage("evaluate the pruned models"):
        report = run.evaluate(systems, batch_size=config.batch_size)
    rows = []
    for name, (r, setting) in points.items():
        method = name.split(" ")[0]
        point = dict(removed_per_layer=r, method=method, setting=setting)
        rows += rows_of(report, [name], **point)
    return pd.DataFrame(rows), report


def members_sweep(run: Pipeline, config: SweepConfig) -> tuple[pd.DataFrame, SystemsReport]:
    """B.6 / Table 10: Hydra with M members for each M of ``members`` (seed-sampled from the
    CircAvg ranking, the paper's B.5 members: M seeds 0..M-1, so each M's members are the
    smaller M's and one more), zero-shot and fine-tuned, beside the single model and Deep
    Ensembles; with parameters and latency."""
    b = budgets(run, config)
    ranking = run.search("avg", b.budget, batch_size=config.batch_size).ranking()
    largest = max(config.members)
    masks = seed_sampled_members(
        ranking, run.layout, budget=b.budget, pool=b.pool, seeds=range(largest),
        ranking_name="CircAvg",
        allow_identical=True,  # a tiny model's small pool may repeat a member: the Jaccard says so
    )  # fmt: skip
    systems, points = [Single()], {"single": (1, "dense")}
    for m in config.members:
        systems.append(Hydra(masks[:m], f"Hydra M={m}"))
        points[systems[-1].name] = (m, "zero-shot")
        if config.finetune is not None:
            systems.append(Hydra(masks[:m], f"Hydra M={m}, fine-tuned", config.finetune))
            points[systems[-1].name] = (m, "fine-tuned")
    deep = _deep_ensemble(run, config)
    if deep is not None:
        systems.append(deep[0])
        points[systems[-1].name] = (deep[1], "trained copies")
    with run.stage("evaluate the ensembles"):
        report = run.evaluate(systems, batch_size=config.batch_size)
    with run.stage("cost and latency"):
        items = run.loaded.preprocess(run.benchmark.id_report.inputs[: config.latency_batch])
        report.measure(items.to(run.device), systems=list(points), repeats=config.latency_repeats)
    cost = report.cost
    rows = []
    for name, (m, setting) in points.items():
        hydra = setting in ("zero-shot", "fine-tuned")
        jaccard = member_overlap(masks[:m])["mean_pairwise_jaccard"] if hydra else None
        point = dict(members=m, setting=setting, members_jaccard=jaccard)
        for row in rows_of(report, [name], **point):
            row.update(
                params=cost.loc[name, "params"],
                latency_ms=cost.loc[name, "latency_ms"],
                latency_ratio=cost.loc[name, "latency_ms"] / cost.loc["single", "latency_ms"],
            )
            rows.append(row)
    return pd.DataFrame(rows), report


def corruption_sweep(run: Pipeline, config: SweepConfig) -> tuple[pd.DataFrame, SystemsReport]:
    """Tables 13-14: single, Taylor, CircAvg, Hydra (Circ) (the paper's method: one circuit per
    criterion, zero-shot) and Deep Ensembles on ``n_corrupt`` ID report items under each
    corruption at each severity (severity 0: the clean items); rows ``corruption="all"`` pool
    every corruption's items at a severity (the paper's average over corruptions)."""
    from hydra_core.data.images import take

    names = config.corruptions or corruptions_for(run.benchmark.id_report)
    check_corruptions(names, run.benchmark.id_report)  # before any search
    b = budgets(run, config)
    pruning = run.circuits_and_members(
        b, list(config.seeds), taylor_samples=config.taylor_samples, batch_size=config.batch_size,
        search_batch_size=config.batch_size,
    )  # fmt: skip
    systems = [
        Single(),
        Pruned("Taylor", pruning.taylor.keep),
        Pruned("CircAvg", pruning.circavg.keep),
        Hydra(pruning.members[HYDRA_CIRC], HYDRA_CIRC),
    ]
    deep = _deep_ensemble(run, config)
    if deep is not None:
        systems.append(deep[0])
    wanted = [s.name for s in systems]
    clean = take(run.benchmark.id_report, config.n_corrupt, purpose="corruption")
    rows, reports, first = [], {}, None
    for name in names:
        for severity in (0, *config.severities):
            if severity == 0 and first is not None:
                continue  # the clean items once
            part = (
                clean
                if severity == 0
                else corrupt_set(clean, name, severity, seed=config.corruption_seed)
            )
            # one report OOD set rides along (a benchmark needs one; its predictions are cached):
            # only the ID metrics are read
            bench = replace(run.benchmark, id_report=part, ood_report=run.benchmark.ood_report[:1])
            with run.stage(f"evaluate {part.name}"):
                found = run.evaluate(systems, batch_size=config.batch_size, benchmark=bench)
            first = found if first is None else first
            corruption = "none" if severity == 0 else name
            rows += rows_of(found, wanted, ID_METRICS, corruption=corruption, severity=severity)
            reports.setdefault(severity, []).append(found)
    for severity in config.severities:  # every corruption's items at one severity, pooled
        pooled = pooled_report([r for r in reports[severity]], wanted)
        rows += rows_of(pooled, wanted, ID_METRICS, corruption="all", severity=severity)
    return pd.DataFrame(rows), first


def pooled_report(reports: Sequence[SystemsReport], names: Sequence[str]) -> SystemsReport:
    """One report whose ID set is the items of every report's ID set, for the systems
    ``names`` (their predictions concatenated; no OOD sets)."""
    evaluations, info = {}, {}
    for name in names:
        parts = [r.evaluations[name].id for r in reports]
        pooled = SetPredictions(
            "pooled",
            "id",
            torch.cat([p.logits for p in parts]),
            torch.cat([p.labels for p in parts]),
        )
        first = reports[0].evaluations[name]
        evaluations[name] = Evaluation(name, pooled, [], first.score, bootstrap=first.bootstrap)
        info[name] = reports[0].info[name]
    pooled = SystemsReport(evaluations, info)
    pooled.compute_intervals()
    return pooled


def _deep_ensemble(run: Pipeline, config: SweepConfig) -> tuple[System, int] | None:
    """Deep Ensembles as a system, with its number of models, or None (one line says why: never
    a stand-in). An image model: its trained copies (``train-ensemble``). A text model: the text
    report's Deep Ensembles (D), one model per seed of ``config.seeds`` sharing the frozen
    encoder (``minilm-sentiment``: its ``train-text`` recipe per seed, the shipped model being
    seed 0; another model: fresh heads trained on the embedded ID set's training split, Rotten
    Tomatoes', as ``config.deep_heads`` says); trained once, then read from the cache. Which of
    the two a model gets is its modality's (``Modality.deep_ensemble``)."""
    if not config.deep_ensemble:
        return None
    modality = run.loaded.modality
    if modality.deep_ensemble == "shared-backbone":
        how = "train-text" if has_train_text_recipe(run.loaded.name) else "heads"
        train = lambda: modality.load_id("train")  # noqa: E731
        deep = SharedBackboneBaseline(config.seeds, how, config.deep_heads, train_set=train)
        return deep, len(config.seeds)
    copies = deep_ensemble_for(config.model_source(), log=lambda why: run.log(f"{run.tag} {why}"))
    return None if copies is None else (DeepEnsemble(copies), len(copies))


SWEEP_FUNCTIONS = {"layers": layers_sweep, "members": members_sweep, "corruption": corruption_sweep}


def run_sweep(
    kind: str,
    config: SweepConfig = SweepConfig(),
    out: str | Path | None = None,
    *,
    cache: DiskCache | None = None,
    progress: StageProgress | None = None,
    log: Log = print,
    overwrite: bool = False,
) -> pd.DataFrame:
    """Run the sweep ``kind`` (one of :data:`SWEEPS`) and write ``<kind>.csv``, ``<kind>.png``,
    ``<kind>.svg``, ``report.md`` and ``report.json`` into ``out`` (default
    ``results/sweep/<kind>``); returns the table."""
    if kind not in SWEEPS:
        raise InputError(f"unknown sweep {kind!r}; choose one of {', '.join(SWEEPS)}")
    if config.task not in TASK_MODELS:
        raise InputError(f"task must be one of {', '.join(TASK_MODELS)}, got {config.task!r}")
    out = Path(out) if out is not None else DEFAULT_SWEEP_OUT / kind
    points = {"layers": {"removed_per_layer": "--points"}, "members": {"members": "--points"}}
    run = Pipeline(
        out,
        cache,
        config.device,
        progress,
        log,
        overwrite=overwrite,
        command=f"sweep {kind}",
        options=run_options(config, points.get(kind)),
    )
    run.load(lambda: _load(config))
    table, systems = SWEEP_FUNCTIONS[kind](run, config)
    seeds = {
        "members": list(range(max(config.members))),  # the members sweep's pruning seeds
        "corruption_pruning": list(config.seeds),  # the pipeline's seed-sampled members
        "corruption": config.corruption_seed,
        "bootstrap": {"n_boot": 1000, "seed": 0, "level": 0.95},
    }
    setup = run.setup(config.task, budgets(run, config), seeds, {})
    setup = run.finish({**setup, "sweep": kind, "config": _config_json(config)})
    figure = plot_sweep(kind, table, setup)
    write_output(run.out / f"{kind}.png", lambda tmp: figure.savefig(tmp, dpi=120, format="png"))
    write_output(run.out / f"{kind}.svg", lambda tmp: figure.savefig(tmp, format="svg"))
    run.write(
        {kind: table}, setup, systems, lambda tables, s: markdown_sweep(kind, tables[kind], s)
    )
    return table


def _load(config: SweepConfig) -> tuple:
    """The model and its modality's embedded benchmark (the data the reports use)."""
    from hydra_core.zoo.registry import load_model

    loaded = load_model(config.model_source())
    if loaded.modality.name != config.task:  # --model contradicts --task: say so, never guess
        raise InputError(
            f"--model {config.model_source()} takes {loaded.modality.name}, but --task is "
            f"{config.task}: pass --task {loaded.modality.name}"
        )
    benchmark = loaded.modality.benchmark(
        n_search=config.n_search, n_report=config.n_report, image_format=loaded.image_format
    )
    return loaded, benchmark


def _config_json(config: SweepConfig) -> dict:
    found = asdict(config)
    found["model"] = config.model_source()
    return found


def sweep_config_from_args(quick: bool, **overrides) -> SweepConfig:
    """A :class:`SweepConfig`, quick or full, with the given fields replaced (None = keep)."""
    base = SweepConfig.quick() if quick else SweepConfig()
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})
