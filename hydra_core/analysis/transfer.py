"""Does a circuit transfer? The transfer matrix: search the circuit on one OOD set alone and
measure its AUROC change against the dense model on every other set.

Every OOD set available to the model, search-role and report-role alike, is cut once into two
disjoint parts by a fixed shuffle of its own (:func:`~hydra_core.data.images.split_in_two`: the
``"halves"`` protocol of :mod:`hydra_core.data.benchmark`): a *search* part and a *held-out*
part. Row ``S`` of the matrix is the circuit that a greedy search (:func:`greedy_circuit`,
CircOOD by default) finds on the ID search part and the search part of ``S`` alone; its cells are
AUROC(circuit) - AUROC(dense) on the ID report part and the held-out part of every set, with the
paired 95% bootstrap interval (:func:`~hydra_core.evaluate.auroc_changes`). Every column is
measured on the same items whatever the row, and no search ever sees them: the search of ``S``
saw no item of another set, and of ``S`` only its search part. The cell of ``S`` itself (group
``"seen"``) says how much of the gain holds on new items of the distribution searched on; the
near and far averages of a row leave it out (the mean of the row's other near / far cells, with
the interval of that mean over the same paired resamples).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch

from hydra_core.analysis.greedy import greedy_circuit
from hydra_core.analysis.inputs import search_inputs
from hydra_core.cache import DiskCache
from hydra_core.data.benchmark import Benchmark
from hydra_core.evaluate import auroc_changes
from hydra_core.metrics import UndefinedMetricWarning
from hydra_core.metrics.bootstrap import MIN_ITEMS, SMALL_PARTS, warn_small_parts
from hydra_core.models.adapter import head_label

#: the objectives a transfer row's search may take: CircOOD (the default) and CircAvg
OBJECTIVES = ("ood", "avg")
#: the cell group of a set's own column
SEEN = "seen"
#: the columns of :meth:`TransferResult.frame`
CELL_COLUMNS = (
    "searched_on",
    "reported_on",
    "group",
    "dense_auroc",
    "circuit_auroc",
    "delta_auroc",
    "lo",
    "hi",
    "significant",
)
__all__ = ["OBJECTIVES", "SEEN", "TransferResult", "row_benchmark", "transfer_matrix"]


@dataclass(frozen=True)
class TransferResult:
    """The transfer matrix: one cell per (searched on, reported on) pair, and per row the near
    and far averages of its cells other than the set's own.

    AUROC values and changes are fractions (0.0123 = 1.23 points), as the rest of the library
    gives them."""

    cells: pd.DataFrame  # columns CELL_COLUMNS, rows in matrix order
    summary: dict  # searched_on -> {"near"|"far": {"delta_auroc", "lo", "hi", "n_sets"}}
    objective: str
    budget: int
    sets: tuple[str, ...]  # every set, in matrix order (rows and columns)
    groups: dict  # set -> "near" | "far"
    removed: dict  # searched_on -> the heads the search removed, as labels
    seconds: float  # compute of the searches, summed
    candidates: int | None = None  # the guided search's K (None: the exact search)

    def matrix(self) -> pd.DataFrame:
        """AUROC changes as a table: rows searched on, columns reported on."""
        table = self.cells.pivot(index="searched_on", columns="reported_on", values="delta_auroc")
        return table.reindex(index=list(self.sets), columns=list(self.sets))

    @property
    def title(self) -> str:
        """What the matrix shows, for a figure's title: the circuit, its budget and, for the
        guided search, its K."""
        circuit = {"ood": "CircOOD", "avg": "CircAvg"}[self.objective]
        guided = "" if self.candidates is None else f" (guided, K = {self.candidates})"
        return f"{circuit}, {self.budget} heads removed{guided}: AUROC change vs dense"

    def to_json(self) -> dict:
        """``{"cells": [...], "summary": {...}}`` (``transfer --json``), plus what ran."""
        cells = [
            {
                "searched_on": r.searched_on,
                "reported_on": r.reported_on,
                "group": r.group,
                "delta_auroc": _number(r.delta_auroc),
                "lo": _number(r.lo),
                "hi": _number(r.hi),
            }
            for r in self.cells.itertuples()
        ]
        return {"cells": cells, "summary": self.summary}

    def summary_frame(self) -> pd.DataFrame:
        """One row per searched-on set: near and far mean changes with their intervals."""
        rows = []
        for name in self.sets:
            row = {"searched_on": name, "group": self.groups[name]}
            for group in ("near", "far"):
                found = self.summary[name].get(group)
                for key in ("delta_auroc", "lo", "hi"):
                    row[f"{group}_{key}"] = None if found is None else found[key]
            rows.append(row)
        return pd.DataFrame(rows)


def _number(value) -> float | None:
    value = float(value)
    return None if np.isnan(value) else value


def row_benchmark(benchmark: Benchmark, name: str) -> Benchmark:
    """Row ``name``'s data: the ID parts, and ``name``'s search part and held-out part alone
    (from a ``"halves"`` benchmark of every set). Its search parts are what the row's search
    sees."""
    names = benchmark.search_names()
    i = names.index(name)
    return replace(
        benchmark, ood_search=(benchmark.ood_search[i],), ood_report=(benchmark.ood_report[i],)
    )


def _check(benchmark: Benchmark, objective: str) -> None:
    if benchmark.protocol != "halves":
        raise ValueError(
            "the transfer matrix takes a 'halves' benchmark of every set (a search part and a "
            f"held-out part of each), got protocol {benchmark.protocol!r}"
        )
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if len(benchmark.ood_report) < 2:
        raise ValueError("a transfer matrix needs at least two OOD sets (one to report on)")


def transfer_matrix(
    loaded,
    benchmark: Benchmark,
    *,
    objective: str = "ood",
    budget: int = 24,
    batch_size: int = 256,
    method: str = "fast",
    candidates: int | None = None,
    device: str | torch.device | None = "auto",
    cache: DiskCache | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> TransferResult | None:
    """The transfer matrix of ``loaded`` (a :class:`~hydra_core.zoo.registry.LoadedModel`) on
    ``benchmark``, a ``"halves"`` benchmark whose OOD sets are every set to search on and report
    on (see the module docstring).

    Each row's search goes through :func:`greedy_circuit` with ``cache``: a finished row is read
    back, an interrupted one resumes; under torchrun the processes share every step's candidates
    and every prediction. ``candidates``: the guided search's K (None: the exact search; see
    :func:`greedy_circuit`). ``progress(set, done_steps, budget)`` is called after every step;
    ``should_stop`` stops between steps (returns None: the finished steps are saved).
    """
    _check(benchmark, objective)
    sets = tuple(benchmark.search_names())
    groups = {s.name: s.group for s in benchmark.ood_report}
    model = loaded.model
    rows, summary, removed, seconds, guided = [], {}, {}, 0.0, None
    # every row measures on the same held-out parts: one warning names the small ones
    sizes = [len(s) for s in benchmark.ood_report]
    warn_small_parts(len(benchmark.id_report), sizes, [s.name for s in benchmark.ood_report])
    with warnings.catch_warnings():
        small = re.escape(SMALL_PARTS.format(MIN_ITEMS))
        warnings.filterwarnings("ignore", small, UndefinedMetricWarning)
        for name in sets:
            data = row_benchmark(benchmark, name)
            inputs = search_inputs(loaded.preprocess, data)
            dev = next(model.parameters()).device
            step = None if progress is None else (lambda s, n=name: progress(n, s.step + 1, budget))
            result = greedy_circuit(
                model,
                inputs.id_x.to(dev),
                inputs.id_y.to(dev),
                inputs.ood_x.to(dev),
                objective=objective,
                budget=budget,
                batch_size=batch_size,
                method=method,
                candidates=candidates,
                cache=cache,
                progress=step,
                should_stop=should_stop,
            )
            if not result.complete:
                return None
            seconds += result.seconds
            guided = result.candidates  # None where K covers every head: the exact search
            removed[name] = [head_label(*h) for h in result.order]
            keep = result.keep_mask()
            options = dict(device=device, cache=cache, batch_size=batch_size)
            own = auroc_changes(loaded, data, keep, name=f"Circ-{name}", **options)
            i = sets.index(name)
            others = replace(
                benchmark,
                ood_search=benchmark.ood_search[:i] + benchmark.ood_search[i + 1 :],
                ood_report=benchmark.ood_report[:i] + benchmark.ood_report[i + 1 :],
            )
            other = auroc_changes(loaded, others, keep, name=f"Circ-{name}", **options)
            averages = _by_set(other)  # the near / far averages leave the set's own cell out
            by_set = {**averages, name: _by_set(own)[name]}
            for column in sets:
                r = by_set[column]
                group = SEEN if column == name else groups[column]
                rows.append(_cell(name, column, group, r))
            summary[name] = {
                group: {
                    "delta_auroc": float(r["delta_auroc"]),
                    "lo": float(r["delta_auroc_lo"]),
                    "hi": float(r["delta_auroc_hi"]),
                    "n_sets": sum(groups[c] == group for c in sets if c != name),
                }
                for group, r in ((g, averages.get(f"{g}-OOD average")) for g in ("near", "far"))
                if r is not None
            }
    cells = pd.DataFrame(rows, columns=list(CELL_COLUMNS))
    return TransferResult(cells, summary, objective, budget, sets, groups, removed, seconds, guided)


def _by_set(table: pd.DataFrame) -> dict[str, dict]:
    return {r["set"]: r for r in table.to_dict("records")}


def _cell(searched_on: str, reported_on: str, group: str, r: dict) -> dict:
    return {
        "searched_on": searched_on,
        "reported_on": reported_on,
        "group": group,
        "dense_auroc": float(r["dense_auroc"]),
        "circuit_auroc": float(r["circuit_auroc"]),
        "delta_auroc": float(r["delta_auroc"]),
        "lo": float(r["delta_auroc_lo"]),
        "hi": float(r["delta_auroc_hi"]),
        "significant": bool(r["significant"]),
    }


def plot_transfer(result: TransferResult):
    """The heatmap (a matplotlib Figure): rows searched on, columns reported on, each cell the
    AUROC change in points with its interval; a set's own cell framed; the row's near and far
    averages in two columns beside the matrix."""
    from matplotlib.figure import Figure

    sets = list(result.sets)
    values = result.matrix().to_numpy(dtype=float) * 100
    cells = result.cells.set_index(["searched_on", "reported_on"])
    averages = np.array(
        [
            [result.summary[s].get(g, {}).get("delta_auroc", np.nan) * 100 for g in ("near", "far")]
            for s in sets
        ]
    )
    n = len(sets)
    fig = Figure(figsize=(1.25 * (n + 2) + 2.5, 0.75 * n + 2.0), layout="constrained")
    ax = fig.subplots()
    shown = np.concatenate([values, averages], axis=1)
    bound = float(np.nanmax(np.abs(shown))) if np.isfinite(shown).any() else 1.0
    image = ax.imshow(shown, cmap="RdBu", vmin=-bound, vmax=bound, aspect="auto")
    for i, row in enumerate(sets):
        for j in range(n + 2):
            if j < n:
                c = cells.loc[(row, sets[j])]
                text = f"{c.delta_auroc * 100:+.1f}\n[{c.lo * 100:+.1f}, {c.hi * 100:+.1f}]"
            else:
                found = result.summary[row].get(("near", "far")[j - n])
                text = (
                    ""
                    if found is None
                    else (
                        f"{found['delta_auroc'] * 100:+.1f}\n"
                        f"[{found['lo'] * 100:+.1f}, {found['hi'] * 100:+.1f}]"
                    )
                )
            dark = np.isfinite(shown[i, j]) and abs(shown[i, j]) > 0.6 * bound
            ax.text(j, i, text, ha="center", va="center", fontsize=7,
                    color="white" if dark else "black")  # fmt: skip
        ax.add_patch(_frame(i, i))
    ax.axvline(n - 0.5, color="black", linewidth=1.5)
    labels = [f"{s} ({result.groups[s]})" for s in sets]
    ax.set_xticks(range(n + 2), [*labels, "near avg", "far avg"], rotation=30, ha="right")
    ax.set_yticks(range(n), labels)
    ax.set_xlabel("reported on (held-out items)")
    ax.set_ylabel("searched on")
    ax.set_title(f"{result.title} (points)")
    fig.colorbar(image, ax=ax, label="AUROC change (points)")
    return fig


def _frame(i: int, j: int):
    from matplotlib.patches import Rectangle

    return Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=1.5)


def every_set_options(
    modality, *, ood=None, search_ood=None, ood_sources=(), protocol: str = "dedicated"
) -> dict:
    """The :meth:`~hydra_core.models.modality.Modality.benchmark` options of a transfer matrix:
    every set named (``ood`` and ``search_ood``, else the modality's report and search sets) and
    every set of your own (``search:`` ones included) both searched on and reported on, each cut
    into a search and a held-out part (the ``"halves"`` protocol, whatever ``protocol`` was
    asked for: the matrix has no other)."""
    from hydra_core.data.sources import parse_source

    own_report = any(
        parse_source(e, files=modality.takes_files).role == "report" for e in ood_sources
    )
    report = list(ood) if ood is not None else ([] if own_report else list(modality.report_ood))
    search = list(search_ood) if search_ood is not None else list(modality.search_ood)
    if any(parse_source(e, files=modality.takes_files).role == "search" for e in ood_sources):
        search = list(search_ood or ())  # search: sources replace the default search sets
    sources = []
    for entry in ood_sources:
        if parse_source(entry, files=modality.takes_files).role == "search":
            entry = "far:" + entry.split(":", 1)[1]  # a search set's group is far
        sources.append(entry)
    named = list(dict.fromkeys([*report, *search]))
    return {"ood": named, "search_ood": None, "ood_sources": sources, "protocol": "halves"}
