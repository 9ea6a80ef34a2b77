"""The paper's sweeps, one short function each over the pipeline: heads removed per layer
(:func:`layers_sweep`), the number of Hydra members (:func:`members_sweep`) and corrupted ID data
(:func:`corruption_sweep`); each returns its table and its systems."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from types import SimpleNamespace

import pandas as pd
import torch

from hydra_core.baselines.deep_ensembles import DeepEnsemble, deep_ensemble_for
from hydra_core.baselines.shared_backbone import has_train_text_recipe
from hydra_core.baselines.systems import SharedBackboneBaseline
from hydra_core.data.corruptions import check_corruptions, corrupt_set, corruptions_for
from hydra_core.errors import InputError, choice
from hydra_core.evaluate import Evaluation, SetPredictions
from hydra_core.experiment.pipeline import Pipeline
from hydra_core.experiment.pruning import HYDRA_CIRC, Budgets
from hydra_core.experiment.results import SystemsReport
from hydra_core.experiment.systems import System
from hydra_core.hydra.members import (
    circuit_member,
    member_overlap,
    seed_sampled_members,
    taylor_member,
)
from hydra_core.hydra.systems import FinetunedPruned, Hydra, Pruned, Single
from hydra_core.report.sweep_config import ID_METRICS, METRICS, SweepConfig


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
    deep = deep_ensemble_system(run, config)
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
    deep = deep_ensemble_system(run, config)
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


def deep_ensemble_system(run: Pipeline, config: SweepConfig) -> tuple[System, int] | None:
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
