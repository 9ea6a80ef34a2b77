"""The image report's transfer table: how much of the circuits' AUROC gain reaches report sets
their search never saw."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import torch

from hydra_core.data.provenance import ChosenOn
from hydra_core.errors import InputError
from hydra_core.experiment.pipeline import Pipeline
from hydra_core.experiment.pruning import Budgets
from hydra_core.experiment.results import SystemsReport
from hydra_core.hydra.systems import Pruned, Single
from hydra_core.report.image_config import ReportConfig


def transfer_table(
    systems: SystemsReport, run: Pipeline, budgets: Budgets, config: ReportConfig
) -> pd.DataFrame:
    """How much of the circuits' AUROC gain over the dense model reaches sets the search never
    saw: per report set, AUROC(circuit) - AUROC(single) with its paired 95% interval, for CircOOD
    and CircAvg (searched on the search sets only), and for one leave-one-set-out CircOOD searched
    on halves of the other report sets and measured on the one left out, and on it alone (never
    added to ``systems``: the other report sets chose its heads)."""
    from hydra_core.analysis.inputs import SearchInputs
    from hydra_core.data.images import split_in_two

    loaded, benchmark, device = run.loaded, run.benchmark, run.device
    searched = {
        "CircOOD": ", ".join(benchmark.search_names()),
        "CircAvg": ", ".join(benchmark.search_names()),
    }
    wanted = [(c, s.name) for c in searched for s in benchmark.ood_report]
    table = systems.table().set_index(["system", "set"])
    rows = [
        _transfer_row(systems, table, circuit, searched[circuit], set_name)
        for circuit, set_name in wanted
    ]
    if config.loso_set is not None:
        names = [s.name for s in benchmark.ood_report]
        if config.loso_set not in names:
            raise InputError(
                f"loso_set {config.loso_set!r} is not a report set ({', '.join(names)})"
            )
        left_out = benchmark.ood_report[names.index(config.loso_set)]
        others = [s for s in benchmark.ood_report if s is not left_out]
        per_set = max(1, (config.n_search or len(benchmark.id_search)) // len(others))
        halves = [split_in_two(s)[0] for s in others]
        halves = [h.subset(torch.arange(min(per_set, len(h)))) for h in halves]
        ood_x = loaded.preprocess(torch.cat([h.images for h in halves])).to(device)
        inputs = SearchInputs(
            loaded.preprocess(benchmark.id_search.images).to(device),
            benchmark.id_search.labels.to(device),
            ood_x,
            {"halves of the other report sets": ood_x},
        )
        circuit = run.search(
            "ood",
            budgets.budget,
            batch_size=config.batch_size,
            inputs=inputs,
            repeat=f", {config.loso_set} left out",
        )
        # the guard of evaluate_systems refuses any report set that shares an item with the
        # images that chose the circuit, so it is reported on the left-out set and the ID set
        name = f"CircOOD, {config.loso_set} left out"
        chosen = ChosenOn.of("heads", [benchmark.id_search, *halves])
        found = run.evaluate(
            [Single(), Pruned(name, circuit.keep_mask(), chosen)],
            batch_size=config.batch_size,
            benchmark=replace(benchmark, ood_report=(left_out,)),
        )
        searched_on = "halves of " + ", ".join(s.name for s in others)
        left_table = found.table().set_index(["system", "set"])
        rows.append(_transfer_row(found, left_table, name, searched_on, left_out.name))
    return pd.DataFrame(rows)


def _transfer_row(
    systems: SystemsReport, table: pd.DataFrame, circuit: str, searched_on: str, set_name: str
) -> dict:
    """One row of the transfer table: the circuit's AUROC on ``set_name`` against the single
    model's, with the paired interval of the difference."""
    d = systems.difference(circuit, "single", "auroc", set_name)
    return {
        "circuit": circuit,
        "searched_on": searched_on,
        "ood_set": set_name,
        "single_auroc": table.loc[("single", set_name), "auroc"],
        "circuit_auroc": table.loc[(circuit, set_name), "auroc"],
        "delta_auroc": d.value,
        "delta_auroc_lo": d.lo,
        "delta_auroc_hi": d.hi,
        "significant": bool(d.significant),
    }
