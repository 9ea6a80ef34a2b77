"""The text report's tables: the rows of the paper's Table 2, its numbers, and the statements of the
paper our run tests, with their verdicts (:mod:`~hydra_core.report.text_claims`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pandas as pd

from hydra_core.baselines.efficient import NAMES as EFFICIENT_NAMES
from hydra_core.baselines.shared_backbone import DEEP
from hydra_core.baselines.systems import MC_DROPOUT
from hydra_core.experiment.results import SystemsReport
from hydra_core.masks import MemberMask, per_layer_counts
from hydra_core.report.claims import CIRCAVG, pick
from hydra_core.report.tables import (
    HYDRA_CIRC,
    HYDRA_CIRC_B5,
    HYDRA_CIRC_B5_FT,
    HYDRA_CIRC_FT,
    HYDRA_TAYLOR,
    HYDRA_TAYLOR_FT,
    NEAR_FAR,
    OOD_METRICS,
    circuits_table,
    fused,
)
from hydra_core.report.text_claims import (
    CIRCAVG_FT,
    SINGLE,
    TAYLOR,
    TAYLOR_FT,
    paper_claims,
    paper_table2,
)

if TYPE_CHECKING:
    from hydra_core.analysis.greedy import GreedyResult

#: the Hydra ensembles the report builds, by label, and their fine-tuned labels: Hydra (Circ) (one
#: circuit per criterion, the paper's method), its B.5 ablation and Hydra (Taylor)
HYDRAS = {
    HYDRA_TAYLOR: HYDRA_TAYLOR_FT,
    HYDRA_CIRC: HYDRA_CIRC_FT,
    HYDRA_CIRC_B5: HYDRA_CIRC_B5_FT,
}

#: the rows of Table 2, in the paper's order; zero-shot pruned rows first, fine-tuned after
MAIN_ROWS = (
    SINGLE,
    DEEP,
    MC_DROPOUT,
    *EFFICIENT_NAMES.values(),  # those whose stored copies were evaluated
    TAYLOR,
    CIRCAVG,
    fused(HYDRA_TAYLOR),
    fused(HYDRA_CIRC),
    fused(HYDRA_CIRC_B5),
    TAYLOR_FT,
    CIRCAVG_FT,
    fused(HYDRA_TAYLOR_FT),
    fused(HYDRA_CIRC_FT),
    fused(HYDRA_CIRC_B5_FT),
)
#: the summary columns the paired differences to the single model are reported on
DIFFERENCES = (
    "accuracy",
    "brier",
    "nll",
    "ece",
    "near_auroc",
    "far_auroc",
    "all_auroc",
    "all_fpr95",
)
MAIN_COLUMNS = (
    "accuracy",
    "brier",
    "nll",
    "ece",
    "adaptive_ece",
    *(f"all_{m}" for m in OOD_METRICS),
    "id_mi",
    "ood_mi",
)


def text_tables(
    systems: SystemsReport,
    circuits: Mapping[str, GreedyResult],
    pruned: Sequence[MemberMask],
    members: Mapping[str, Sequence[MemberMask]],
    fusion: pd.DataFrame,
    repeats: Sequence[SystemsReport] = (),
) -> dict[str, pd.DataFrame]:
    """Every table of the text report, by CSV name (the bootstrap intervals are computed here);
    ``repeats``: every repeat's systems (``systems`` first), over which the verdicts are taken."""
    summary = systems.summary()
    summary.insert(3, "trained_after_pruning", [_trained(s) for s in summary["system"]])
    rows = summary.set_index("system")
    main = rows.loc[[r for r in MAIN_ROWS if r in rows.index]].reset_index()
    table = systems.table()
    every = [*pruned, *(m for label in HYDRAS for m in members[label])]
    heads = per_layer_counts(every).rename_axis("layer").reset_index()
    return {
        "table2_systems": pick(
            main, ["system", "kind", "heads", "trained_after_pruning", *MAIN_COLUMNS]
        ),
        "table17_near_far": pick(main, ["system", "heads", *NEAR_FAR]),
        "per_set": table[table["group"] != "id"].drop(columns=["kind"]).reset_index(drop=True),
        "differences_to_single": systems.differences(SINGLE, list(DIFFERENCES)),
        "paper_table2": paper_table2(),
        "paper_claims": paper_claims(systems, repeats),
        "repeats": _repeat_rows(list(repeats) or [systems]),
        "heads_per_layer": heads,
        "circuit": circuits_table(circuits),
        "fusion_check": fusion,
        "table7_cost": systems.cost.reset_index(),
        "summary_all_systems": summary,
        "all_sets": table,
    }


def _trained(system: str) -> str:
    """Whether a row was fine-tuned after pruning ("–" for the systems that are not pruned)."""
    if system in (SINGLE, DEEP, MC_DROPOUT, *EFFICIENT_NAMES.values()):
        return "–"
    return "yes" if "fine-tuned" in system else "no"


def _repeat_rows(repeats: Sequence[SystemsReport]) -> pd.DataFrame:
    """Table 12's analogue: the rows of Table 2 in every repeat (summary columns, no intervals),
    one row per repeat and system."""
    columns = ["accuracy", "nll", "ece", "near_auroc", "far_auroc", "all_auroc", "all_fpr95"]
    frames = []
    for r, report in enumerate(repeats):
        summary = report.summary().set_index("system")
        shown = summary.loc[[s for s in MAIN_ROWS if s in summary.index], columns]
        frames.append(shown.reset_index().assign(repeat=r))
    frame = pd.concat(frames, ignore_index=True)
    return frame[["repeat", "system", *columns]]
