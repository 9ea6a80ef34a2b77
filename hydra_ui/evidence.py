"""The Headmap page's "Evidence" section: every head's evidence with 95% intervals over the report
data, ranked by the evidence that agrees (:mod:`hydra_core.analysis.evidence`, the same function
as ``python -m hydra_core heads``), as a sortable table and a layer x head map. Picking a head
(a row of the table, a cell of the map) makes it the Representations page's head."""

from __future__ import annotations

import copy
import io
import json

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from hydra_core.analysis.evidence import (
    COLUMN,
    COLUMNS,
    RANKING_RULE,
    HeadEvidence,
    head_evidence,
    stability_frequency,
)
from hydra_core.analysis.inputs import REPORT_SAMPLE
from hydra_core.data.images import take
from hydra_core.metrics.bootstrap import MIN_BOOT
from hydra_core.models.adapter import head_label, head_layout
from hydra_core.outputs import data_identity
from hydra_ui.context import Context, disk_cache, results
from hydra_ui.figures import head_heatmap
from hydra_ui.jobs import staged_progress, start_job
from hydra_ui.widgets import PICKED_HEAD, head_map_with_download, job_outcome, watch_job

JOB = "evidence"
RESULT = "evidence"
REPRESENTATIONS = "pages/4_representations.py"
STAGES = {
    "ablations": "ablating each head on the report data",
    "detectors": "fitting each head's detector",
    "intervals": "bootstrap intervals",
}
#: what the map can show: label -> (table column, colour bar title)
MAP_CHOICES = {
    "agreed rank": ("agreed_rank", "agreed rank (1 = most important)"),
    "ΔAUROC": ("delta_auroc", "ΔAUROC when ablated"),
    "detector AUROC": ("detector_auroc", "detector AUROC"),
    "keep frequency": ("keep_frequency", "kept by share of resamples (higher = more important)"),
    "Δaccuracy": ("delta_accuracy", "Δaccuracy when ablated"),
}


def report_parts(context: Context, n: int = REPORT_SAMPLE):
    """At most ``n`` items of the ID report part (with labels) and of each report OOD set: a
    fixed sample (the Representations page's), preprocessed, on the device."""
    p, device = context.loaded.preprocess, context.device
    id_set = take(context.benchmark.id_report, n, purpose="describe")
    ood = {
        s.name: p(take(s, n, purpose="describe").inputs).to(device)
        for s in context.benchmark.ood_report
    }
    return p(id_set.inputs).to(device), id_set.labels, ood


def start_evidence(context: Context, fit, n_boot: int, frequency) -> None:
    """Compute the evidence in a background job (a copy of the model: other pages' hooks must
    not reach it)."""
    model = copy.deepcopy(context.loaded.model)
    report_x, report_y, report_ood = report_parts(context)

    def work(job):
        return head_evidence(
            model,
            fit.id_x,
            fit.id_y,
            report_x,
            report_y,
            report_ood,
            frequency=frequency,
            n_boot=n_boot,
            cache=disk_cache(),
            # a stop ends the work at the next progress report (after each pass of candidates)
            progress=staged_progress(job, lambda stage, done, total: STAGES[stage]),
        )

    results()["jobs"][JOB] = start_job(JOB, work, {"n_boot": n_boot})


def interval_text(value: float, lo: float, hi: float, *, signed: bool) -> str:
    """``+0.0123 [-0.0040, +0.0310]``; ``–`` for a head without this evidence."""
    if not np.isfinite(value):
        return "–"
    sign = "+" if signed else ""
    return f"{value:{sign}.4f} [{lo:{sign}.4f}, {hi:{sign}.4f}]"


def shown_table(found: HeadEvidence) -> pd.DataFrame:
    """The table the page shows: numbers stay numbers (the columns sort), each interval beside its
    value as text, ✱ where the interval excludes the null value."""
    table = found.table.sort_values("agreed_rank")
    out = pd.DataFrame({"rank": table["agreed_rank"], "head": table["label"]})
    for c in found.columns():
        if c.null is None:
            out[c.name] = table[c.key]
            out[f"rank by {c.name}"] = table[f"rank_{c.key}"]
            continue
        out[c.name] = table[c.key]
        out[f"{c.name} 95% CI"] = [
            interval_text(v, lo, hi, signed=c.null == 0.0)
            for v, lo, hi in zip(
                table[c.key], table[f"{c.key}_lo"], table[f"{c.key}_hi"], strict=True
            )
        ]
        out[f"{c.name} ✱"] = np.where(table[f"{c.key}_significant"], "✱", "")
        if c.ranked:
            out[f"rank by {c.name}"] = table[f"rank_{c.key}"]
    out["mean rank"] = table["mean_rank"]
    out["disagreement"] = table["disagreement"]
    out["disagrees"] = table["disagrees"]
    # every column's value first, in view without a sideways scroll (the detector AUROC and
    # the frequency, which reorder the ranking, were behind it); the intervals, marks and
    # per-column ranks after them
    first = ["rank", "head", *(c.name for c in found.columns())]
    return out[first + [c for c in out if c not in first]].reset_index(drop=True)


def evidence_map(found: HeadEvidence, choice: str, towers) -> go.Figure:
    """The layer x head map of one column; the hover lists every column of the head."""
    column, title = MAP_CHOICES[choice]
    hover = {"agreed rank": found.map("agreed_rank")}
    for c in found.columns():
        hover[c.name] = found.map(c.key)
    hover["disagreement"] = found.map("disagreement")
    reverse = column == "agreed_rank" or column.startswith("delta")  # low = important = bright
    return head_heatmap(
        found.map(column),
        title=f"{choice} per head (yellow = most important)",
        value_name=title,
        hover=hover,
        reverse_scale=reverse,
        towers=towers,
    )


def pick_from_table(key: str, heads: list[str]):
    """A callback: the table's selected row becomes the picked head."""

    def picked() -> None:
        rows = st.session_state[key]["selection"]["rows"]
        if rows:
            st.session_state[PICKED_HEAD] = heads[rows[-1]]

    return picked


def page_stability():
    """The StabilityResult of the Headmap page's last finished Stability run, or None."""
    from hydra_ui.stability import JOB as STABILITY_JOB

    job = results()["jobs"].get(STABILITY_JOB)
    run = None if job is None or job.running else job.result
    return None if run is None else run.stability


def evidence_section(context: Context, fit) -> None:
    """The section: a note on the columns, the controls, the job, then the map and the table."""
    st.subheader("Evidence: which heads drive OOD separation, and how sure")
    st.caption(
        "Every head's evidence side by side, each with a 95% interval over the report data "
        f"(a fixed sample of at most {REPORT_SAMPLE} {context.noun} per set; the project's "
        "stratified bootstrap: ID within class, each OOD set within itself); ✱ = the interval "
        "excludes 0 (0.5 for the detector). Also `python -m hydra_core heads`."
    )
    with st.expander("What each column means, and how the heads are ranked"):
        for c in COLUMNS:
            st.markdown(f"- **{c.name}**: {c.meaning}.")
        st.markdown(f"**Agreed rank**: {RANKING_RULE}. Δaccuracy is shown, not ranked.")
    layout = head_layout(context.loaded.model)
    job = results()["jobs"].get(JOB)
    running = job is not None and job.running
    c1, c2 = st.columns([1, 2])
    n_boot = int(c1.number_input("Resamples", MIN_BOOT, 5000, 1000, step=50, disabled=running))
    upload = c2.file_uploader(
        "Stability result (optional, JSON of format hydra-stability)",
        type=["json"],
        disabled=running,
        help="Greedy searches on bootstrap resamples of the search split: the share of them that "
        "kept each head (1 - the file's removal frequency) joins the evidence and the ranking, "
        "higher = more important",
    )
    frequency = None
    if upload is not None:
        frequency = stability_frequency(  # another model's or other data's file is refused
            upload.getvalue(),
            layout,
            name=upload.name,
            model=context.loaded.identity(),
            data=data_identity(context.benchmark, "search"),
            hint="upload the stability result of a search on this page's data (the Setup "
            "page's sample sizes and OOD sets), or run Stability above",
            warn=st.warning,
        )
    elif (found := page_stability()) is not None:  # the Stability section's last run
        frequency = found.frequency().numpy()
        st.caption(
            "Keep frequencies (1 - removal frequency) from the Stability run above "
            f"({found.resamples} resamples, greedy {found.objective}, {found.steps} steps); an "
            "uploaded file replaces them."
        )
    if st.button("Compute evidence", icon=":material/query_stats:", disabled=running):
        start_evidence(context, fit, n_boot, frequency)
        st.rerun()
    if running:
        watch_job(job, lambda j: f"Evidence: {j.progress or 'starting'}")
        return
    job_outcome(job, "The evidence")
    if job is not None and job.result is not None:
        results()[RESULT] = job.result
    found: HeadEvidence | None = results().get(RESULT)
    if found is None:
        st.info("Compute evidence to see every head's evidence with its interval.")
        return
    show_evidence(found, layout)


def show_evidence(found: HeadEvidence, layout) -> None:
    """The dense model's numbers, the map, the table, and the way to the Representations page."""
    (acc, acc_lo, acc_hi), (roc, roc_lo, roc_hi) = found.dense["accuracy"], found.dense["auroc"]
    st.caption(
        f"Dense model on the report data: accuracy {acc:.4f} [{acc_lo:.4f}, {acc_hi:.4f}], "
        f"AUROC {roc:.4f} [{roc_lo:.4f}, {roc_hi:.4f}] (mean over {', '.join(found.ood_sets)}); "
        f"{found.n_id} ID, {' + '.join(map(str, found.n_ood))} OOD; detectors fitted on "
        f"{found.n_fit} ID search items; {found.n_boot} resamples."
    )
    present = {c.key for c in found.columns()}
    choices = [k for k, (col, _) in MAP_CHOICES.items() if col not in COLUMN or col in present]
    choice = st.radio("Map of", choices, horizontal=True, key="evidence-map")
    head_map_with_download(
        evidence_map(found, choice, layout.towers), "evidence_map", key="evidence-map-fig"
    )
    table = shown_table(found)
    key = "evidence-table"
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        key=key,
        on_select=pick_from_table(key, table["head"].tolist()),
        selection_mode="single-row",
        column_config={"head": st.column_config.Column(pinned=True)},
    )
    buffer = io.StringIO()
    found.table.sort_values("agreed_rank").to_csv(buffer, index=False)
    left, right, _ = st.columns([1, 1, 4])
    left.download_button("Download CSV", buffer.getvalue(), "heads.csv", "text/csv")
    right.download_button(
        "Download JSON", json.dumps(found.to_json(), indent=2), "heads.json", "application/json"
    )
    picked = st.session_state.get(PICKED_HEAD)
    readable = {  # the heads that see the samples (with towers, the image tower's)
        head_label(layer, head)
        for layer in layout.input_layers
        for head in range(layout.num_heads[layer])
    }
    if picked in readable:
        st.page_link(
            REPRESENTATIONS,
            label=f"Open {picked}'s PCA on the Representations page",
            icon=":material/scatter_plot:",
        )
    else:
        st.caption(
            "Select a row (or click a cell of the map) to open that head's PCA on the "
            "Representations page (a head that sees the samples: with towers, an image head)."
        )
