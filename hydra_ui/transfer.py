"""The Headmap page's transfer matrix and shortcut check: a circuit searched on each OOD set alone,
measured on every set (:mod:`hydra_core.analysis.transfer`), computed in a background job and
read back from the disk cache; and the warning where surface features alone separate a search
set (:mod:`hydra_core.analysis.shortcut`)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from hydra_core.analysis.shortcut import benchmark_shortcuts
from hydra_core.analysis.transfer import TransferResult, every_set_options, transfer_matrix
from hydra_core.data.benchmark import Benchmark
from hydra_ui.context import cached_benchmark, disk_cache, results
from hydra_ui.figures import matrix_heatmap
from hydra_ui.jobs import start_job
from hydra_ui.widgets import figure_with_download, job_outcome, table_with_download, watch_job

JOB = "transfer"
OBJECTIVES = ("ood", "avg")  # the matrix's searches: CircOOD, CircAvg (S_acc uses S_avg)


def transfer_benchmark(context) -> Benchmark:
    """The setup's data with every OOD set (search and report sets, and your own) cut into a
    search part and a held-out part (loaded once per setup)."""
    config, modality = context.config, context.loaded.modality
    search = config.search_sets(modality) or modality.search_ood
    roles = every_set_options(
        modality,
        ood=config.report_sets(modality),
        search_ood=search,
        ood_sources=config.ood_sources,
    )
    return cached_benchmark(
        modality.name,
        id_source=config.id_source,
        ood=tuple(roles["ood"]),
        search_ood=None,
        ood_sources=tuple(roles["ood_sources"]),
        protocol=roles["protocol"],
        n_search=config.n_search,
        n_report=config.n_report,
        classes=None if config.classes is None else tuple(config.classes),
        model_classes=context.loaded.classes,
        image_format=context.loaded.image_format,
    )


#: where the page's shortcut warning sends the user: the matrix of this page's transfer section
CHECK_ON_PAGE = "its row of the transfer matrix below shows whether its circuit transfers"


@st.cache_data(show_spinner="Checking the search sets for surface shortcuts...", max_entries=8)
def shortcut_checks(setup_key: str, _context) -> dict:
    """The shortcut check of the setup's search sets, by set (``to_dict`` entries plus the
    warning line)."""
    checks = benchmark_shortcuts(
        _context.loaded, _context.benchmark, cache=disk_cache(), device=_context.device
    )
    return {
        name: {**c.to_dict(), "warning": c.warning(CHECK_ON_PAGE)} for name, c in checks.items()
    }


def shortcut_warnings(context) -> None:
    """One warning per search set that surface features separate as well as the model does."""
    for entry in shortcut_checks(context.config.key, context).values():
        if entry["warns"]:
            st.warning(entry["warning"])


def start_transfer(context, objective: str, budget: int, k: int | None = None) -> None:
    """The matrix in a background job: one search per set (cached, so a finished row is read
    back and a stopped one resumes), progress counted in heads removed over all rows; ``k``:
    every row as the guided search of K candidates per step (None: exact)."""
    benchmark = transfer_benchmark(context)
    sets = benchmark.search_names()

    def work(job):
        job.begin(len(sets) * budget)

        def progress(name: str, done: int, total: int) -> None:
            row = sets.index(name)
            job.report(f"searched on {name}: {done} of {total}", done=row * total + done)

        return transfer_matrix(
            context.loaded,
            benchmark,
            objective=objective,
            budget=budget,
            candidates=k,
            device=context.device,
            cache=disk_cache(),
            progress=progress,
            should_stop=job.should_stop,
        )

    info = {"objective": objective, "budget": budget, "sets": sets, "candidates": k}
    results()["jobs"][JOB] = start_job(JOB, work, info)


def matrix_table(result: TransferResult) -> pd.DataFrame:
    """The matrix as a readable table: a row per set searched on, a column per set reported on
    and the near / far averages, each cell ``+1.23 [-0.40, +2.80]`` in AUROC points (a set's own
    cell marked)."""

    def cell(value, lo, hi) -> str:
        return f"{value * 100:+.2f} [{lo * 100:+.2f}, {hi * 100:+.2f}]"

    cells = result.cells.set_index(["searched_on", "reported_on"])
    rows = []
    for name in result.sets:
        row = {"searched on": f"{name} ({result.groups[name]})"}
        for column in result.sets:
            c = cells.loc[(name, column)]
            mark = " (own, held out)" if column == name else ""
            row[f"on {column} ({result.groups[column]})"] = cell(c.delta_auroc, c.lo, c.hi) + mark
        for group in ("near", "far"):
            found = result.summary[name].get(group)
            row[f"{group} average"] = (
                "" if found is None else cell(found["delta_auroc"], found["lo"], found["hi"])
            )
        rows.append(row)
    return pd.DataFrame(rows)


def matrix_figure(result: TransferResult):
    """The heatmap of the matrix (Plotly): rows searched on, columns reported on, then the
    near and far averages; values in AUROC points."""
    table = result.matrix() * 100
    for group in ("near", "far"):
        table[f"{group} avg"] = [
            result.summary[s].get(group, {}).get("delta_auroc", float("nan")) * 100
            for s in result.sets
        ]
    return matrix_heatmap(
        table,
        title=result.title,
        value_name="ΔAUROC (points)",
        text_format="+.1f",
        diverging=True,
    )


def transfer_matrix_view(context, objective: str, budget: int, k: int | None = None) -> None:
    """The section: what the matrix is, the button that computes it (a background job), its
    progress, then the heatmap and the table. ``k``: the page's candidates per step (the guided
    search; None: exact), as for the search above."""
    st.subheader("Transfer across every OOD set")
    st.caption(
        "For every OOD set (search and report sets alike), a circuit is searched (the objective "
        "and budget chosen above; S_acc uses S_avg) on the ID search items and that set's search "
        "part alone, and its AUROC change against the dense model is measured on every set's "
        "held-out part, with paired 95% intervals. A set's own column (held-out items of the "
        "distribution searched on) is not in the row's near / far averages. With candidates "
        "per step chosen above, every row is that guided search. Searches are saved: a "
        "finished matrix comes back at once."
    )
    objective = objective if objective in OBJECTIVES else "avg"
    key = f"transfer-{objective}-{budget}-{k}"
    job = results()["jobs"].get(JOB)
    running = job is not None and job.running
    if st.button(
        "Compute the transfer matrix",
        icon=":material/grid_on:",
        disabled=running,
        help="One search per OOD set: as long as that many searches (saved ones are read back)",
    ):
        start_transfer(context, objective, budget, k)
        st.rerun()
    if running:
        watch_job(job, lambda j: str(j.progress or "starting the first search..."))
        return
    job_outcome(job, "The transfer matrix")
    if job is not None and job.result is not None:
        done = job.info
        results()[f"transfer-{done['objective']}-{done['budget']}-{done['candidates']}"] = (
            job.result
        )
    result = results().get(key)
    if result is None:
        return
    figure_with_download(matrix_figure(result), f"transfer_{objective}_{budget}", key=key)
    table_with_download(matrix_table(result), f"transfer_{objective}_{budget}.csv")
    with st.expander("Every cell (CSV as the command line writes it)"):
        table_with_download(
            result.cells, f"transfer_{objective}_{budget}_cells.csv", float_format="{:.4f}"
        )
