"""One repeat of the text report: its searches and pruning, then every system on the report
sentences (:func:`text_repeat`); repeat 0 gives every table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from hydra_core.analysis.inputs import SearchInputs
from hydra_core.baselines.shared_backbone import DEEP
from hydra_core.baselines.systems import (
    EfficientBaseline,
    MCDropoutBaseline,
    SharedBackboneBaseline,
)
from hydra_core.data.provenance import ChosenOn
from hydra_core.experiment.pipeline import Pipeline
from hydra_core.experiment.pruning import Budgets
from hydra_core.experiment.results import SystemsReport
from hydra_core.experiment.run import Run
from hydra_core.hydra.fused import fuse_members
from hydra_core.masks import MemberMask
from hydra_core.models.adapter import head_layout
from hydra_core.report.claims import CIRCAVG
from hydra_core.report.tables import fused
from hydra_core.report.text_config import TextReportConfig
from hydra_core.report.text_stages import training_row
from hydra_core.report.text_tables import CIRCAVG_FT, HYDRAS, SINGLE, TAYLOR, TAYLOR_FT
from hydra_core.training.top import TopFinetuned, finetune_top, pruned_copy

if TYPE_CHECKING:
    from hydra_core.data.benchmark import Benchmark
    from hydra_core.data.text import TextSet
    from hydra_core.zoo.registry import LoadedModel


@dataclass
class TextRepeat:
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


def text_repeat(
    run: Pipeline,
    config: TextReportConfig,
    budgets: Budgets,
    train_set: TextSet,
    trimmed: LoadedModel,
    benchmark: Benchmark,
    deep_kind: str | None,
    r: int,
    inputs: SearchInputs | None = None,
    efficients: Sequence[EfficientBaseline] = (),
) -> TextRepeat:
    """One repeat: the three searches and the pruning on ``inputs`` (default: the run's search
    tensors), then every system on the report split of ``benchmark`` (sorted by length), pruning
    seeds r*M .. r*M + M - 1 and fine-tuning seed r. Cached models and predictions make the
    systems that do not change between repeats (single, MC Dropout, Deep Ensembles) cheap.
    ``efficients``: the efficient ensembles' stored copies (repeat 0 alone: one copy each, not
    seeded per repeat; one not stored is left out, its reason in the report's ``skipped``)."""
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
                deep_runs = [training_row(DEEP, h) for h in deep.runs]
    for efficient in efficients:  # loaded, never trained by the report
        with stages(f"{efficient.name}: its stored copy, evaluated{tag}"):
            systems.check_unseen(efficient)
            efficient.add_to(systems)
    hydras = {}
    with stages("fuse and evaluate Hydra (Taylor), Hydra (Circ) and its B.5 ablation" + tag):
        for label in HYDRAS:
            hydras[label] = fuse_members([(model, mm.keep) for mm in members[label]])
            systems.add_fused(fused(label), hydras[label], kept_heads(members[label]))

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
                systems.add_fused(fused(ft_label), hydras[ft_label], kept_heads(members[label]))
    report = SystemsReport(systems.evaluations, systems.info, setup={"skipped": systems.skipped})
    return TextRepeat(
        systems, report, circuits, taylor, circavg, members, pruned, hydras, tuned, tuned_members,
        deep_runs,
    )  # fmt: skip


def kept_heads(members: Sequence[MemberMask]) -> list[int]:
    """Each member's number of kept heads."""
    return [int(m.keep.sum()) for m in members]
