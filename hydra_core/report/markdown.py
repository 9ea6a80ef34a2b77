"""The one Markdown writer of every report: ``report.md`` from a report's declared sections
(:func:`render`), and how a table and its cells are shown (:func:`markdown_table`).

A report declares its Markdown as a sequence of sections, each ``(tables, setup) -> lines``
(:data:`Section`); the sections every report shares (:func:`stability`, :func:`heads`) are here.
Only formatting lives in the sections: every number comes from the tables, every sentence about
the run from its setup dict, so the same inputs always give the same text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from hydra_core.report.claims import signed
from hydra_core.report.heads import heads_section
from hydra_core.report.stability import stability_section

#: columns shown in percent with two decimals (also under a near_/far_/all_ prefix)
PERCENT = (
    "accuracy",
    "auroc",
    "fpr95",
    "aupr_in",
    "aupr_out",
    "search_accuracy",
    "search_auroc",
    "dense_search_accuracy",
    "dense_search_auroc",
)
#: columns shown with two decimals (times in ms, ratios) or one (seconds)
TWO_DECIMALS = (
    "latency_ms",
    "latency_iqr_ms",
    "latency_bf16_ms",
    "latency_bf16_iqr_ms",
    "params_ratio",
    "macs_ratio",
    "latency_ratio",
    "latency_bf16_ratio",
)
#: table headers; arrows say which way is better
HEADERS = {
    "system": "System",
    "kind": "Kind",
    "heads": "Heads",
    "accuracy": "Acc↑",
    "brier": "Brier↓",
    "nll": "NLL↓",
    "ece": "ECE↓",
    "adaptive_ece": "aECE↓",
    "auroc": "AUROC↑",
    "fpr95": "FPR95↓",
    "aupr_in": "AUPR-In↑",
    "aupr_out": "AUPR-Out↑",
    "id_mi": "ID MI",
    "id_di": "ID DI",
    "ood_mi": "OOD MI",
    "ood_di": "OOD DI",
    "pruning_seed": "Pruning seed",
    "batch_order": "Batch order",
    "max_prob_diff": "max |Δp|",
}


def jaccard_text(value) -> str:
    """A mean pairwise Jaccard for the text: ``0.412``, or what a one-member ensemble has
    instead of a number (no pair to compare)."""
    if value is None or value != value:
        return "– (one member: overlap needs two)"
    return f"{value:.3f}"


def column_header(column: str) -> str:
    """A column's table header: near/far prefixes kept, ``all_`` dropped (OOD averages)."""
    for prefix, label in (("near_", "near "), ("far_", "far "), ("all_", "")):
        if column.startswith(prefix) and column[len(prefix) :] in HEADERS:
            return label + HEADERS[column[len(prefix) :]]
    return HEADERS.get(column, column.replace("_", " "))


def _cell(column: str, value: object, magnitude: float | None = None) -> str:
    """One value as shown in the report; missing values (None, NaN) as a dash. ``magnitude``:
    the size that picks the digits of a plain number (default its own), so that an interval's
    bounds are shown with the digits of the value they belong to."""
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        base = column.split("_", 1)[1] if column.startswith(("near_", "far_", "all_")) else column
        if base in PERCENT:
            return f"{100 * value:.2f}"
        if column == "max_prob_diff":
            return f"{value:.1e}"
        if column in TWO_DECIMALS or column.endswith("(points)"):
            return f"{value:,.2f}"
        if column == "seconds":
            return f"{value:,.1f}"
        size = abs(value) if magnitude is None else magnitude
        return f"{value:.4f}" if size < 10 else f"{value:,.1f}"
    if isinstance(value, (int, np.integer)):
        return f"{value:,}"
    return str(value)


def markdown_table(frame: pd.DataFrame) -> str:
    """A DataFrame as a Markdown table; accuracy and OOD metrics in percent. A column ``m`` with
    ``m_lo`` and ``m_hi`` beside it shows as ``value [lo, hi]`` (its 95% interval)."""
    columns = [
        c for c in frame.columns if not (c.endswith(("_lo", "_hi")) and c[:-3] in frame.columns)
    ]
    lines = [
        "| " + " | ".join(column_header(c) for c in columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
    ]
    for _, row in frame.iterrows():
        lines.append("| " + " | ".join(_interval_cell(c, row) for c in columns) + " |")
    return "\n".join(lines)


def _interval_cell(column: str, row: pd.Series) -> str:
    """The cell of ``column``, with its interval when the row has ``column_lo`` / ``_hi``."""
    value, lo, hi = row[column], row.get(f"{column}_lo"), row.get(f"{column}_hi")
    shown = _cell(column, value)
    if lo is None or hi is None or shown == "–" or lo != lo or hi != hi:
        return shown
    numbers = [abs(v) for v in (value, lo, hi) if isinstance(v, (float, np.floating))]
    # one precision for the three: -9.6 [-10.1, -9.1], not -9.5938 [-10.1, -9.1061]
    size = max(numbers, default=None)
    return f"{_cell(column, value, size)} [{_cell(column, lo, size)}, {_cell(column, hi, size)}]"


#: Table 7's columns, in the order every report shows them (those a run measured)
COST_COLUMNS = (
    "system",
    "params",
    "formula_params",
    "macs",
    "latency_ms",
    "latency_iqr_ms",
    "latency_bf16_ms",
    "params_ratio",
    "macs_ratio",
    "latency_ratio",
    "latency_bf16_ratio",
)


def cost_columns(cost: pd.DataFrame) -> pd.DataFrame:
    """Table 7 with the columns of :data:`COST_COLUMNS` it has, in that order."""
    return cost[[c for c in COST_COLUMNS if c in cost]]


#: one section of ``report.md``: (the report's tables by CSV name, its setup) -> its lines
Section = Callable[[Mapping[str, pd.DataFrame], dict], list[str]]


def render(sections: Sequence[Section], tables: Mapping[str, pd.DataFrame], setup: dict) -> str:
    """The text of a report's ``report.md``: each of its ``sections`` in order."""
    return "\n".join(line for section in sections for line in section(tables, setup))


def stability(tables: Mapping[str, pd.DataFrame], setup: dict) -> list[str]:
    """The section "Stability of the circuits" (none when the run skipped it; a line saying why
    when its searches were guided)."""
    k = setup.get("protocol", {}).get("candidates")
    if "stability" not in tables and k is not None:
        return [
            "## Stability of the circuits",
            "",
            "Not measured: the stability runs resample the exact search, and this run's searches "
            f"are guided (K = {k}).",
            "",
        ]
    return stability_section(tables.get("stability"), markdown_table)


def searches_line(protocol: dict, stability: bool = True) -> list[str]:
    """The Setup's line on a guided run's searches (none for the exact search, the default);
    ``stability``: whether the report has stability runs otherwise."""
    k = protocol.get("candidates")
    if k is None:
        return []
    left_out = "; the stability runs, which resample the exact search, are left out" * stability
    return [
        f"- **Searches**: guided (K = {k}): each step of every greedy search evaluates exactly "
        f"only the K heads with the best attribution estimate (docs/guided-search.md){left_out}."
    ]


def heads(tables: Mapping[str, pd.DataFrame], setup: dict) -> list[str]:
    """The per-head evidence section (``heads.csv``; none when the run skipped it)."""
    return heads_section(tables.get("heads"))


def score_gains_section(gains: pd.DataFrame | None) -> list[str]:
    """Does each system's OOD gain hold under every score (``ood_gain_by_score.csv``)."""
    if gains is None or gains.empty:
        return []
    shown = pd.DataFrame({"score": gains["score"], "system": gains["system"]})
    for g in ("near", "far"):
        shown[f"{g}_auroc"] = gains[f"{g}_auroc"]
        for suffix in ("", "_lo", "_hi"):  # AUROC points, as the AUROCs are shown
            shown[f"{g} ΔAUROC (points){suffix}"] = 100 * gains[f"{g}_delta{suffix}"]
        shown[f"{g} gain holds"] = gains[f"{g}_holds"]
    return [
        "## Does each system's OOD gain hold under every score",
        "",
        "Near- and far-OOD AUROC of each system under every OOD score, and its difference to "
        "the single model under the same score with the paired 95% interval (in AUROC points); "
        "the gain holds where the interval lies above 0. Max logit, energy, entropy, "
        "Mahalanobis, ViM and KNN come from pytorch-ood; the last three read each model's "
        "penultimate features and are fitted on the ID search split only (Mahalanobis with a "
        "Ledoit-Wolf covariance where the split has fewer items than feature dimensions plus "
        "classes); a fused Hydra has no "
        "per-member features, so it has them through its unfused twin where the report "
        "evaluates one, and no row of theirs otherwise (docs/ood-scores.md). Mutual information "
        "has no single-model reference, so no row here (`ood_gain_by_score.csv`).",
        "",
        markdown_table(shown),
        "",
    ]


def headline(row: pd.Series, prefix: str, verdict_column: str, how: str) -> str:
    """A report summary's line for one statement: the paper's difference, ours (columns
    ``prefix``, ``prefix_lo``, ``prefix_hi``; ``how`` says what it is, e.g. "fine-tuned") with
    its verdict, and for a statement over all OOD sets its near and far difference and verdict
    beside it: a headline never stands on all OOD sets alone."""
    ours = signed(row["metric"], row[prefix], row[f"{prefix}_lo"], row[f"{prefix}_hi"])
    parts = []
    if row.get(f"{prefix}_near_verdict", "–") != "–":
        for group in ("near", "far"):
            key = f"{prefix}_{group}"
            value = signed(row["metric"], row[key], row[f"{key}_lo"], row[f"{key}_hi"])
            parts.append(f"{group} {value} **{row[f'{key}_verdict']}**")
    over = ", all OOD sets" if parts else ""
    near_far = "; " + ", ".join(parts) if parts else ""
    return (
        f"- {row['claim']}: paper {row['paper_difference']:+.2f}, ours {ours} ({how}{over}): "
        f"**{row[verdict_column]}**{near_far}."
    )
