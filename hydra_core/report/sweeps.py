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

from pathlib import Path

import pandas as pd

from hydra_core.cache import DiskCache
from hydra_core.errors import InputError
from hydra_core.experiment.facts import run_options
from hydra_core.experiment.pipeline import Pipeline
from hydra_core.outputs import write_output
from hydra_core.report.sweep_config import (
    DEFAULT_SWEEP_OUT,
    SWEEPS,
    TASK_MODELS,
    SweepConfig,
    config_json,
)
from hydra_core.report.sweep_files import markdown_sweep, plot_sweep
from hydra_core.report.sweep_kinds import budgets, corruption_sweep, layers_sweep, members_sweep
from hydra_core.types import Log, StageProgress

# --- the sweeps ---------------------------------------------------------------------------------


SWEEP_FUNCTIONS = {"layers": layers_sweep, "members": members_sweep, "corruption": corruption_sweep}


def run_sweep(
    kind: str,
    config: SweepConfig = SweepConfig(),  # noqa: B008 (frozen: never changed)
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
    setup = run.finish({**setup, "sweep": kind, "config": config_json(config)})
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
