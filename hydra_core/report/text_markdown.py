"""The text report's ``report.md``, declared as its sections in order (:func:`text_markdown`) and
written by the one Markdown writer (:func:`~hydra_core.report.markdown.render`) from its tables
and setup alone: setup, the paper's headline statements against this run, the CircAvg
circuit, Table 2 with Tables 17-20, the agreements with the paper, fusion and cost, and what of
the paper's text experiments the report covers."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from hydra_core.report.claims import CIRCAVG, signed, verdict_counts
from hydra_core.report.efficient_ensembles import judged
from hydra_core.report.markdown import (
    headline,
    heads,
    markdown_table,
    render,
    score_gains_section,
    stability,
)
from hydra_core.report.text_markdown_setup import coverage_section, setup_section
from hydra_core.report.text_markdown_tables import (
    claims_section,
    efficient_claims_section,
    fusion_cost_section,
    table2_section,
)
from hydra_core.report.transfer import transfer_section


def text_markdown(tables: Mapping[str, pd.DataFrame], setup: dict) -> str:
    """The text of the text report's ``report.md``, from its tables and setup alone."""
    sections = (
        lambda tables, setup: setup_section(setup),
        lambda tables, setup: _summary_section(tables),
        _circuit_section,
        lambda tables, setup: transfer_section(tables["transfer"]) if "transfer" in tables else [],
        stability,
        heads,
        table2_section,
        lambda tables, setup: score_gains_section(tables.get("ood_gain_by_score")),
        lambda tables, setup: claims_section(tables["paper_claims"], setup, tables.get("repeats")),
        lambda tables, setup: efficient_claims_section(tables["paper_claims"], setup),
        fusion_cost_section,
        lambda tables, setup: coverage_section(setup),
    )
    return render(sections, tables, setup)


#: the paper's headline statements about Table 2, summarised first
HEADLINES = (
    "Hydra (Circ) raises OOD AUROC",
    "Hydra (Circ) beats Deep Ensembles (D) on AUROC",
    "Hydra (Circ) lowers NLL",
    "CircAvg beats Taylor on OOD AUROC",
    "Deep Ensembles (D) raise OOD AUROC",
    "MC Dropout raises OOD AUROC",
)


def _summary_section(tables: Mapping[str, pd.DataFrame]) -> list[str]:
    """The paper's headline statements against ours (pruned systems fine-tuned after pruning,
    as the paper's; zero-shot where no fine-tuned row exists), the verdict counts, and whether
    the search's gains reached the report split."""
    claims = judged(tables["paper_claims"], repeat_0=False)  # the efficient ones: their section
    rows = claims.set_index("claim", drop=False)
    lines = []
    for claim in HEADLINES:
        r = rows.loc[claim]
        form = "fine_tuned" if r["fine_tuned_verdict"] != "–" else "zero_shot"
        lines.append(headline(r, form, f"{form}_verdict", form.replace("_", "-")))
    return [
        "## Summary: the paper's statements against this run",
        "",
        "Differences in points for accuracy and OOD metrics; ours with the paired 95% interval. "
        "The full list, zero-shot and fine-tuned, is in the section on agreements below.",
        "",
        *lines,
        *verdict_counts(claims),
        *_transfer_line(tables),
        "",
    ]


def _transfer_line(tables: Mapping[str, pd.DataFrame]) -> list[str]:
    """Whether what the CircAvg search gained on its own sentences reached the report split:
    its scores on the search split against the zero-shot circuit's paired differences to the
    single model on the report split, the near and the far sets apart."""
    circuit = tables["circuit"].iloc[0]
    differences = tables["differences_to_single"].set_index("system")
    if CIRCAVG not in differences.index:
        return []
    d = 100 * differences.loc[CIRCAVG].drop("kind").astype(float)  # in points
    measures = ("accuracy", "near_auroc", "far_auroc")
    above = [d[f"{m}_lo"] > 0 for m in measures]
    below = [d[f"{m}_hi"] < 0 for m in measures]
    verdict = (
        "transferred"
        if all(above)
        else "did not transfer"
        if all(below)
        else "transferred only in part"
    )
    near, far = (signed("auroc", d[m], d[f"{m}_lo"], d[f"{m}_hi"]) for m in measures[1:])
    return [
        f"- **The search's gains {verdict}**: on its own search sentences the CircAvg circuit "
        f"moved accuracy from {100 * circuit['dense_search_accuracy']:.2f} to "
        f"{100 * circuit['search_accuracy']:.2f} and AUROC against the search OOD set from "
        f"{100 * circuit['dense_search_auroc']:.2f} to {100 * circuit['search_auroc']:.2f}; on "
        f"the report split (zero-shot) it changed accuracy by "
        f"{signed('accuracy', d['accuracy'], d['accuracy_lo'], d['accuracy_hi'])}, AUROC on "
        f"the near sets by {near} and on the far sets by {far} against the single model."
    ]


def _circuit_section(tables: Mapping[str, pd.DataFrame], setup: dict) -> list[str]:
    heads = tables["heads_per_layer"]
    return [
        "## The CircAvg circuit and the heads every pruned model keeps",
        "",
        markdown_table(tables["circuit"].drop(columns=["removed"])),
        "",
        "(scores on the search split; `circuit.csv` lists the removed heads in removal order.)",
        "",
        "Heads kept per layer (Taylor keeps the same number in every layer; CircAvg and the "
        "members keep what the search and the draws leave):",
        "",
        markdown_table(heads),
        "",
    ]
