"""The facts a report's files record beside its tables: the options that make a run's identity
(:func:`run_options`), the protocol (which items selected heads, which were reported, every
seed), where and how long it ran, and tables as ``report.json`` records."""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING

import pandas as pd
import torch

from hydra_core.evaluate import nest_intervals
from hydra_core.experiment.results import machine_description

if TYPE_CHECKING:
    from hydra_core.data.benchmark import Benchmark

#: config fields that change no result (where it ran, how many items per forward)
NOT_RESULTS = ("device", "batch_size", "model", "task")


def run_options(config, aliases: Mapping[str, str] | None = None) -> dict:
    """The options of a report's or sweep's ``config`` (a dataclass) that change its results, by
    the name the user gives them (``n_search`` -> ``--n-search``; ``aliases`` for fields the
    command names otherwise, such as the sweep's ``--points``): the run's identity beside its
    model and data (:func:`~hydra_core.outputs.claim_folder`)."""
    aliases = aliases or {}
    return {
        aliases.get(k, "--" + k.replace("_", "-")): v
        for k, v in asdict(config).items()
        if k not in NOT_RESULTS
    }


def protocol_facts(
    benchmark: Benchmark,
    seeds: Mapping[str, object],
    ood_aggregate: str = "pooled",
    *,
    candidates: int | None = None,
) -> dict:
    """``setup["protocol"]``: which samples selected heads and which were reported (and how:
    the searches' OOD aggregate, the guided search's K or None for the exact search), and the
    run's ``seeds``."""
    return {
        "name": benchmark.protocol,
        "note": benchmark.protocol_note(),
        "ood_aggregate": ood_aggregate,
        "candidates": candidates,
        "search_ood": benchmark.search_names(),
        "report_ood": benchmark.report_names(),
        "id_search_n": len(benchmark.id_search),
        "id_report_n": len(benchmark.id_report),
        "report_n": {s.name: len(s) for s in benchmark.ood_report},
        "seeds": dict(seeds),
    }


def run_facts(device: torch.device, seconds: Mapping[str, float], total: float) -> dict:
    """Where and how long a report ran: the entries every report's ``setup`` ends with."""
    return {
        "device": str(device),
        "machine": machine_description(device),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "total_seconds": round(total, 1),
    }


def records(frame: pd.DataFrame) -> list[dict]:
    """A table as JSON records, as ``report.json`` stores it: every metric with an interval as
    ``{"value": v, "ci95": [lo, hi]}``, NaN as null."""
    return [nest_intervals(row) for row in json.loads(frame.to_json(orient="records"))]


def nan_to_none(value: object) -> object:
    """``value`` with every NaN float, however deeply nested, replaced by None (JSON null)."""
    if isinstance(value, dict):
        return {k: nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [nan_to_none(v) for v in value]
    if isinstance(value, float) and value != value:
        return None
    return value
