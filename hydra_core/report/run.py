"""The image report (Tables 1, 4-12 on the default ViT), declared: :func:`run_report` runs the
pipeline's stages (:class:`~hydra_core.experiment.pipeline.Pipeline`) on its configuration
(:mod:`~hydra_core.report.image_config`) with its systems (listed here), and writes its tables
(:mod:`~hydra_core.report.tables`), its claims (:mod:`~hydra_core.report.image_claims`) and its
Markdown (:mod:`~hydra_core.report.image_markdown`). Its other stages: the fine-tuned systems,
distances and setup (:mod:`~hydra_core.report.image_stages`), the repeats of the seeded systems
(:mod:`~hydra_core.report.image_repeats`) and the transfer table
(:mod:`~hydra_core.report.transfer`).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from hydra_core.baselines.deep_ensembles import DeepEnsemble
from hydra_core.baselines.systems import MCDropoutBaseline
from hydra_core.cache import DiskCache
from hydra_core.errors import InputError
from hydra_core.experiment.facts import run_options
from hydra_core.experiment.pipeline import Pipeline
from hydra_core.experiment.pruning import Budgets
from hydra_core.hydra.members import CIRCUIT_NAMES
from hydra_core.hydra.systems import Hydra, Pruned, Single
from hydra_core.masks import MemberMask
from hydra_core.report.efficient_ensembles import efficient_systems
from hydra_core.report.heads import evidence_table
from hydra_core.report.image_claims import efficient_claims
from hydra_core.report.image_config import DEFAULT_OUT, ReportConfig
from hydra_core.report.image_markdown import markdown_report
from hydra_core.report.image_repeats import seeded_repeats
from hydra_core.report.image_stages import (
    DIFFERENCE_COLUMNS,
    cost_systems,
    deep_ensemble_of,
    distances_table,
    finetuned_systems,
    image_setup,
    write_overlaps,
)
from hydra_core.report.tables import (
    HYDRA_CIRC,
    HYDRA_CIRC_B5,
    HYDRA_CIRC_B5_FT,
    HYDRA_CIRC_FT,
    HYDRA_IDENTICAL,
    HYDRA_IDENTICAL_FT,
    HYDRA_IDENTICAL_ORDER_FT,
    HYDRA_TAYLOR,
    HYDRA_TAYLOR_FT,
    ood_gain_table,
    report_tables,
)
from hydra_core.report.transfer import LeftOutSearch, transfer_table
from hydra_core.types import Log, StageProgress


def run_report(
    config: ReportConfig = ReportConfig(),  # noqa: B008 (frozen: never changed)
    out: str | Path = DEFAULT_OUT,
    *,
    cache: DiskCache | None = None,
    progress: StageProgress | None = None,
    log: Log = print,
    overwrite: bool = False,
) -> dict:
    """Run every analysis and write ``report.md``, ``report.json`` and the CSVs into ``out``.

    Returns the key numbers (also in ``report.json``): per table, the rows written.
    """
    from hydra_core.data.benchmark import default_benchmark
    from hydra_core.zoo.registry import load_model

    run = Pipeline(
        out, cache, config.device, progress, log, overwrite=overwrite, options=run_options(config)
    )
    run.ood_aggregate = config.ood_aggregate
    run.candidates = config.candidates
    device, cache, stages = run.device, run.cache, run.stage

    def benchmark_of(n_search: int | None):
        return default_benchmark(
            n_search=n_search,
            n_report=config.n_report,
            ood=list(config.ood) if config.ood else None,
            search_ood=list(config.search_ood) if config.search_ood else None,
            protocol=config.protocol,
        )

    def loader():
        from hydra_core.models.modality import IMAGE_MODALITY

        loaded = load_model(config.model)
        if loaded.modality is not IMAGE_MODALITY:
            raise InputError(
                f"--task image (the default) needs an image classifier; {config.model!r} takes "
                f"{loaded.modality.name}: pass --task {loaded.modality.name}"
            )
        return loaded, benchmark_of(config.n_search)

    run.load(loader)
    loaded, benchmark, layout = run.loaded, run.benchmark, run.layout
    budgets = Budgets.of(layout, config)
    seeds = list(config.seeds)
    if run.rank > 0:  # under torchrun: this process's share of the repeats, then done
        seeded_repeats(None, run, budgets, config, deep_ensemble_of(config, run))
        return {}

    pruning = run.circuits_and_members(
        budgets,
        seeds,
        taylor_samples=config.taylor_samples,
        batch_size=config.batch_size,
        search_batch_size=config.batch_size,
    )
    circuits, taylor, members = pruning.circuits, pruning.taylor, pruning.members
    masks = {"Taylor": taylor.keep}
    masks.update({CIRCUIT_NAMES[o]: r.keep_mask() for o, r in circuits.items()})
    circ_members = members[HYDRA_CIRC]  # CircAcc, CircOOD, CircAvg: the paper's method
    b5_members, taylor_members = members[HYDRA_CIRC_B5], members[HYDRA_TAYLOR]
    identical = [
        MemberMask(f"CircAvg copy {i}", "the CircAvg circuit", pruning.circavg.keep)
        for i in range(len(seeds))
    ]
    run.save_members([*circ_members, *b5_members, *taylor_members])

    deep = deep_ensemble_of(config, run)
    efficients = efficient_systems(config, run)  # stored copies only: the report never trains
    zero_shot = [
        Single(),
        MCDropoutBaseline(),  # the model's own dropout; a model without any: skipped, why said
        *(Pruned(name, keep) for name, keep in masks.items()),
        Hydra(circ_members, HYDRA_CIRC),
        Hydra(b5_members, HYDRA_CIRC_B5),
        *([] if deep is None else [DeepEnsemble(deep)]),
        *efficients,
        Hydra(taylor_members, HYDRA_TAYLOR),
        Hydra(identical, HYDRA_IDENTICAL),
    ]
    with stages("evaluate zero-shot systems"):
        systems = run.evaluate(zero_shot, batch_size=config.batch_size)

    finetuned_labels = []
    if config.finetune is not None:
        variants = [  # (label, members, fine-tuning seeds: None = the same batch order for all)
            (HYDRA_TAYLOR_FT, taylor_members, None),
            (HYDRA_CIRC_FT, circ_members, None),
            (HYDRA_CIRC_B5_FT, b5_members, None),
            (HYDRA_IDENTICAL_ORDER_FT, identical, seeds),
            (HYDRA_IDENTICAL_FT, identical, None),
        ]
        with stages("fine-tune and evaluate"):
            systems = finetuned_systems(systems, run, masks, variants, config)
        finetuned_labels = [label for label, _, _ in variants]

    with stages("cost and latency"):
        images = loaded.preprocess(benchmark.id_report.images[: config.latency_batch]).to(device)
        others = [e.name for e in efficients]
        timed = cost_systems(systems, circ_members, deep is not None, finetuned_labels, others)
        systems.measure(images, systems=timed, repeats=config.latency_repeats)

    with stages("centroid distances (Table 5)"):
        table5 = distances_table(loaded, benchmark, masks["CircOOD"], config)

    with stages("per-head evidence (heads.csv)"):
        heads = evidence_table(
            loaded,
            benchmark,
            run.inputs.id_x,
            run.inputs.id_y,
            n=config.evidence_samples,
            batch_size=config.batch_size,
            cache=cache,
        )

    with stages(f"seeded systems over {config.repeats} repeats (Table 12)"):
        repeated, over_repeats, claims = seeded_repeats(systems, run, budgets, config, deep)
    stability = run.stability(
        circuits,
        benchmark_of(None),
        resamples=config.stability_resamples,
        held_out=config.held_out,
    )
    with stages("transfer of the circuits' AUROC gain"):
        transfer = transfer_table(systems, run, budgets, LeftOutSearch.of(config))

    tables = report_tables(systems, table5, circuits, deep is not None, finetuned_labels)
    tables["table12_seeds"] = repeated
    tables["differences_over_repeats"] = over_repeats
    about_efficient = efficient_claims(systems)  # repeat 0 alone: one stored copy each
    if not about_efficient.empty:
        claims = pd.concat([claims, about_efficient], ignore_index=True)
    tables["paper_claims"] = claims
    tables["transfer"] = transfer
    if stability is not None:
        tables["stability"] = stability
    tables["heads"] = heads
    tables["differences_to_single"] = systems.differences("single", list(DIFFERENCE_COLUMNS))
    with stages("OOD gain under every score"):
        table1 = tables["table1_systems"]["system"]
        tables["ood_gain_by_score"] = ood_gain_table(systems, benchmark, list(table1))
    setup = image_setup(run, config, budgets, members, deep, systems)
    write_overlaps(run.out, members)
    markdown = lambda tables, setup: markdown_report(tables, setup, finetuned_labels)  # noqa: E731
    payload = run.write(tables, setup, systems, markdown)
    return {k: v for k, v in payload.items() if k != "systems"}


# --- stages of the run --------------------------------------------------------------------------


# --- setup and writing --------------------------------------------------------------------------
