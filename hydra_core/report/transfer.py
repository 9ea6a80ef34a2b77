"""The reports' transfer table (image and text): how much of the circuits' AUROC gain reaches
report sets their search never saw, near and far apart."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

import pandas as pd
import torch

from hydra_core.analysis.greedy import GreedyResult
from hydra_core.data.benchmark import concatenate
from hydra_core.data.provenance import ChosenOn
from hydra_core.data.text import DataSet
from hydra_core.experiment.pipeline import Pipeline
from hydra_core.experiment.pruning import Budgets
from hydra_core.experiment.results import SystemsReport
from hydra_core.hydra.members import CIRCUIT_NAMES
from hydra_core.hydra.systems import Pruned, Single
from hydra_core.report.markdown import markdown_table

if TYPE_CHECKING:
    from hydra_core.zoo.registry import LoadedModel

#: the circuits whose transfer is reported: CircOOD and CircAvg
TRANSFERRED = ("ood", "avg")


def left_out_set(report_sets: Sequence[DataSet], preferred: str | None) -> DataSet | None:
    """The report set the leave-one-set-out search leaves out: ``preferred`` when the run reports
    on it, else the first near report set, else the first one; None when ``preferred`` is None
    or the run reports on fewer than two sets (no other set to search on)."""
    if preferred is None or len(report_sets) < 2:
        return None
    named = {s.name: s for s in report_sets}
    near = [s for s in report_sets if s.group == "near"]
    return named.get(preferred) or (near or list(report_sets))[0]


def circuits_report(
    run: Pipeline,
    circuits: Mapping[str, GreedyResult],
    *,
    benchmark=None,
    loaded: LoadedModel | None = None,
    batch_size: int,
) -> SystemsReport:
    """The single model and the transferred circuits on the report split (a report that did not
    evaluate them as systems of its own); their heads were chosen on the search split."""
    data = run.benchmark if benchmark is None else benchmark
    chosen = ChosenOn.of("heads", [data.id_search, *data.ood_search])
    pruned = [
        Pruned(CIRCUIT_NAMES[o], circuits[o].keep_mask(), chosen)
        for o in TRANSFERRED
        if o in circuits
    ]
    return run.evaluate([Single(), *pruned], benchmark=data, loaded=loaded, batch_size=batch_size)


def transfer_table(
    systems: SystemsReport,
    run: Pipeline,
    budgets: Budgets,
    loso: LeftOutSearch,
    *,
    benchmark=None,
    loaded: LoadedModel | None = None,
) -> pd.DataFrame:
    """How much of the circuits' AUROC gain over the dense model reaches sets the search never
    saw: per report set (its group, near or far), AUROC(circuit) - AUROC(single) with its paired
    95% interval, for CircOOD and CircAvg (``systems`` holds them and "single"; searched on the
    search sets only), and for one leave-one-set-out CircOOD (:func:`left_out_set`) searched on
    halves of the other report sets and measured on the one left out, and on it alone (never
    added to ``systems``: the other report sets chose its heads; ``loso``, whose batch size
    the evaluation takes too). ``benchmark`` and ``loaded``: the report split and the model's
    preprocessing to evaluate on (default: the run's)."""
    loaded = run.loaded if loaded is None else loaded
    benchmark = run.benchmark if benchmark is None else benchmark
    searched = ", ".join(benchmark.search_names())
    frame = systems.table()
    circuits = [CIRCUIT_NAMES[o] for o in TRANSFERRED if CIRCUIT_NAMES[o] in set(frame["system"])]
    table = frame.set_index(["system", "set"])
    rows = [
        _transfer_row(systems, table, circuit, searched, data)
        for circuit in circuits
        for data in benchmark.ood_report
    ]
    left_out_search = loso.search(run, budgets, benchmark)
    if left_out_search is not None:
        left_out, others, halves, circuit = left_out_search
        # the guard of evaluate_systems refuses any report set that shares an item with the
        # items that chose the circuit, so it is reported on the left-out set and the ID set
        name = f"CircOOD, {left_out.name} left out"
        chosen = ChosenOn.of("heads", [benchmark.id_search, *halves])
        found = run.evaluate(
            [Single(), Pruned(name, circuit.keep_mask(), chosen)],
            batch_size=loso.batch_size,
            benchmark=replace(benchmark, ood_report=(left_out,)),
            loaded=loaded,
        )
        searched_on = "halves of " + ", ".join(s.name for s in others)
        left_table = found.table().set_index(["system", "set"])
        rows.append(_transfer_row(found, left_table, name, searched_on, left_out))
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class LeftOutSearch:
    """The leave-one-set-out CircOOD of :func:`transfer_table`: the set it prefers to leave out
    (:func:`left_out_set`), the search items per report set it searches on, the batch size."""

    loso_set: str | None
    n_search: int | None
    batch_size: int

    @classmethod
    def of(cls, config) -> LeftOutSearch:
        """The search of a report's configuration (its ``loso_set``, ``n_search`` and
        ``batch_size``): one record for the table and the work shared before it."""
        return cls(config.loso_set, config.n_search, config.batch_size)

    def search(
        self, run: Pipeline, budgets: Budgets, benchmark
    ) -> tuple[DataSet, list[DataSet], list[DataSet], GreedyResult] | None:
        """(the report set left out, the other report sets, the halves of theirs it was searched
        on, its search), or None when no set is left out. The search is cached, so a process of
        the run can make it before the table needs it (:meth:`shared`)."""
        from hydra_core.analysis.inputs import SearchInputs
        from hydra_core.data.images import split_in_two

        left_out = left_out_set(benchmark.ood_report, self.loso_set)
        if left_out is None:
            return None
        others = [s for s in benchmark.ood_report if s is not left_out]
        per_set = max(1, (self.n_search or len(benchmark.id_search)) // len(others))
        halves = [split_in_two(s)[0] for s in others]
        halves = [h.subset(torch.arange(min(per_set, len(h)))) for h in halves]
        pool = concatenate(halves, name="halves of the other report sets", group="far")
        device = run.device
        ood_x = run.loaded.preprocess(pool.inputs).to(device)
        inputs = SearchInputs(
            run.loaded.preprocess(benchmark.id_search.inputs).to(device),
            benchmark.id_search.labels.to(device),
            ood_x,
            {pool.name: ood_x},
        )
        circuit = run.search(
            "ood", budgets.budget, batch_size=self.batch_size, inputs=inputs,
            repeat=f", {left_out.name} left out",
        )  # fmt: skip
        return left_out, others, halves, circuit

    def shared(self, run: Pipeline, budgets: Budgets, benchmark) -> dict[str, Callable[[], object]]:
        """The search as work a process under ``torchrun`` takes before it waits for the others
        (``shared`` of :meth:`~hydra_core.experiment.pipeline.Pipeline.search_repeats`), named
        after the set it leaves out; none when no set is left out."""
        left_out = left_out_set(benchmark.ood_report, self.loso_set)
        if left_out is None:
            return {}
        return {
            f"CircOOD search, {left_out.name} left out": partial(
                self.search, run, budgets, benchmark
            )
        }


def _transfer_row(
    systems: SystemsReport, table: pd.DataFrame, circuit: str, searched_on: str, data: DataSet
) -> dict:
    """One row of the transfer table: the circuit's AUROC on the set ``data`` against the single
    model's, with the paired interval of the difference."""
    d = systems.difference(circuit, "single", "auroc", data.name)
    return {
        "circuit": circuit,
        "searched_on": searched_on,
        "ood_set": data.name,
        "group": data.group,
        "single_auroc": table.loc[("single", data.name), "auroc"],
        "circuit_auroc": table.loc[(circuit, data.name), "auroc"],
        "delta_auroc": d.value,
        "delta_auroc_lo": d.lo,
        "delta_auroc_hi": d.hi,
        "significant": bool(d.significant),
    }


def transfer_section(transfer: pd.DataFrame) -> list[str]:
    """The reports' section "Does it transfer?": per circuit, the mean AUROC change over the
    near and over the far report sets with how many sets' intervals lie above or below 0, then
    the table."""
    lines = [
        "## Does it transfer? The circuits' OOD gain on sets the search never saw",
        "",
        "AUROC of each circuit minus the dense model's on every report set, with the paired 95% "
        "interval of the difference; `significant` = the interval excludes 0. CircOOD and CircAvg "
        "were searched on the search sets only, so every report set is unseen. The last row is a "
        "leave-one-set-out run: CircOOD searched on halves of the other report sets, measured on "
        "the set it left out. Near and far sets apart (means of the sets' changes, x100):",
        "",
    ]
    return [*lines, *transfer_lines(transfer), "", markdown_table(transfer), ""]


def transfer_lines(transfer: pd.DataFrame) -> list[str]:
    """One line per circuit of ``transfer.csv``: the mean AUROC change (x100) over its near and
    over its far report sets, with how many sets' intervals lie above or below 0."""
    lines = []
    for circuit, rows in transfer.groupby("circuit", sort=False):
        parts = []
        for group in ("near", "far"):
            part = rows[rows["group"] == group]
            if part.empty:
                continue
            up = int((part["delta_auroc_lo"] > 0).sum())
            down = int((part["delta_auroc_hi"] < 0).sum())
            parts.append(
                f"{group} {100 * part['delta_auroc'].mean():+.2f} ({len(part)} "
                f"set{'s' * (len(part) != 1)}: {up} up, {down} down)"
            )
        searched_on = rows["searched_on"].iloc[0]
        lines.append(f"- **{circuit}** (searched on {searched_on}): " + "; ".join(parts))
    return lines
