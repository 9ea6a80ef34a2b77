"""The image report's ``report.md``, declared as its sections in order
(:func:`markdown_report`); the one Markdown writer (:func:`~hydra_core.report.markdown.render`)
writes them. Only formatting lives here: every number comes from the tables, every sentence about
the run from its setup dict, so the same inputs always give the same text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from hydra_core.report.image_markdown_claims import summary_section
from hydra_core.report.image_markdown_setup import coverage_section, setup_section
from hydra_core.report.image_markdown_systems import cost_section, systems_sections
from hydra_core.report.markdown import heads, markdown_table, render, stability
from hydra_core.report.transfer import transfer_section


def markdown_report(
    tables: Mapping[str, pd.DataFrame], setup: dict, finetuned: Sequence[str]
) -> str:
    """The text of ``report.md``: setup, then every table with what it shows and how.

    Args:
        tables: the tables by CSV name, as :func:`~hydra_core.report.tables.report_tables` makes.
        setup: the run's description, as written to ``report.json`` (model, data, budgets,
            fine-tuning, timings).
        finetuned: labels of the fine-tuned Hydra variants (empty when zero-shot).
    """
    sections = (
        lambda tables, setup: setup_section(setup),
        lambda tables, setup: summary_section(tables, tables["table12_seeds"]["repeat"].nunique()),
        lambda tables, setup: _search_sections(tables),
        stability,
        heads,
        lambda tables, setup: systems_sections(tables, finetuned, setup),
        cost_section,
        lambda tables, setup: coverage_section(),
    )
    return render(sections, tables, setup)


def _search_sections(tables: Mapping[str, pd.DataFrame]) -> list[str]:
    """The greedy circuits, Table 4 (pruning), Table 5 (distances) and Table 6 (circuits)."""
    return [
        "## Circuits found by the greedy search",
        "",
        markdown_table(tables["circuits"].drop(columns=["removed"])),
        "",
        "(scores on the search split; `removed` lists the heads in removal order in "
        "`circuits.csv`.)",
        "",
        "## Table 4 - zero-shot pruning: Taylor vs CircAvg",
        "",
        markdown_table(tables["table4_zero_shot"]),
        "",
        _table4_ordering(tables["table4_zero_shot"]),
        "",
        "## Table 5 - ID/OOD centroid distances of the last layer's heads, CircOOD vs dense",
        "",
        "Mahalanobis with a Ledoit-Wolf regularised ID covariance, on the report images. In the "
        "paper's convention (first table) the distance is averaged over all H heads of the layer, "
        "so a head CircOOD removed counts with distance 0 (its output is zero for ID and OOD "
        "alike); in ours (second table) both columns average over the heads CircOOD keeps, so "
        "they differ only through the heads it removed in earlier layers.",
        "",
        markdown_table(_convention(tables["table5_distances"], "all")),
        "",
        markdown_table(_convention(tables["table5_distances"], "kept")),
        "",
        "## Table 6 - CircAcc vs CircOOD",
        "",
        markdown_table(tables["table6_circuits"]),
        "",
        *transfer_section(tables["transfer"]),
    ]


def _convention(table5: pd.DataFrame, how: str) -> pd.DataFrame:
    """Table 5's rows of one convention of averaging over heads."""
    return table5[table5["heads_averaged"] == how].drop(columns="heads_averaged")


def _table4_ordering(table4: pd.DataFrame) -> str:
    """One sentence comparing Table 4's accuracy ordering with the paper's (CircAvg above
    Taylor in accuracy on every model of its Table 4)."""
    accuracy = table4.set_index("system")["accuracy"]
    if not {"Taylor", "CircAvg"} <= set(accuracy.index):
        return ""
    circ, taylor = accuracy["CircAvg"], accuracy["Taylor"]
    if circ >= taylor:
        return (
            f"Accuracy: CircAvg {100 * circ:.2f}% vs Taylor {100 * taylor:.2f}%, the paper's "
            "ordering (CircAvg keeps accuracy better than Taylor)."
        )
    return (
        f"Accuracy: CircAvg {100 * circ:.2f}% vs Taylor {100 * taylor:.2f}%: the reverse of the "
        "paper's ordering, where CircAvg keeps accuracy better than Taylor. Here the greedy search "
        "trades accuracy for OOD separation (S_avg weighs both equally), while Taylor's "
        "gradient saliency is an accuracy criterion."
    )
