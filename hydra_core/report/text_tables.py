"""The text report's tables: the rows of the paper's Table 2, its numbers, and the statements of the
paper our run tests (:data:`CLAIMS`), with their verdicts over the run's repeats."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pandas as pd

from hydra_core.baselines.shared_backbone import DEEP
from hydra_core.baselines.systems import MC_DROPOUT
from hydra_core.experiment.results import SystemsReport
from hydra_core.masks import MemberMask, per_layer_counts
from hydra_core.report.claims import CIRCAVG, claim_columns, paper_rows, pick
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

if TYPE_CHECKING:
    from hydra_core.analysis.greedy import GreedyResult

SINGLE = "single"
TAYLOR = "Taylor"
TAYLOR_FT, CIRCAVG_FT = "Taylor (fine-tuned)", "CircAvg (fine-tuned)"

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

#: The paper's Table 2 (bert-base-uncased on SST-2; accuracy and OOD metrics in percent, OOD
#: averaged over its 7 report sets) and its Table 17 (near: Yelp, Amazon; far: 20NG, TREC, MNLI,
#: RTE, WMT16). The paper's AUPR takes OOD as the positive class (its near-OOD AUPR of about 99%
#: with far more OOD than ID sentences says so): our AUPR-Out.
PAPER_TABLE2_TEXT = """
system             | H   | Acc Brier NLL ECE aECE AUROC FPR95 AUPR nearAUROC FPR95 farAUROC FPR95
Single             | 12  | 92.55 0.12 0.27 0.05 0.04 70.16 70.62 81.93 59.45 88.13 74.45 63.62
Deep Ensembles (D) | 12  | 93.00 0.11 0.24 0.04 0.04 74.81 62.69 84.90 61.42 85.89 80.16 53.41
MC Dropout         | 12  | 92.55 0.13 0.31 0.05 0.04 72.23 67.36 81.96 62.31 87.21 76.20 59.42
LoRA Ensembles     | 12  | 92.89 0.12 0.28 0.05 0.04 70.83 68.70 82.27 59.83 86.12 75.23 61.74
Taylor             | 6   | 92.43 0.13 0.35 0.06 0.06 70.95 68.57 82.11 58.64 90.54 75.88 59.79
CircAvg            | 6   | 92.78 0.13 0.33 0.05 0.05 75.04 56.22 84.18 63.26 75.23 79.76 48.62
Hydra (Taylor)     | 6x3 | 93.00 0.12 0.29 0.05 0.04 71.85 62.59 82.44 60.14 80.33 76.54 55.50
Hydra (Circ)       | 6x3 | 92.55 0.12 0.24 0.04 0.04 77.60 55.06 84.16 70.97 69.38 80.25 49.33
"""
#: our names of the paper's columns, in its order
PAPER_COLUMNS = (
    "heads",
    "accuracy",
    "brier",
    "nll",
    "ece",
    "adaptive_ece",
    "all_auroc",
    "all_fpr95",
    "all_aupr_out",
    "near_auroc",
    "near_fpr95",
    "far_auroc",
    "far_fpr95",
)


def paper_table2() -> pd.DataFrame:
    """:data:`PAPER_TABLE2_TEXT` as a frame: one row per system, our column names."""
    rows = [
        {"system": name, **dict(zip(PAPER_COLUMNS, [heads, *map(float, values)], strict=True))}
        for name, heads, *values in paper_rows(PAPER_TABLE2_TEXT)
    ]
    return pd.DataFrame(rows)


#: The paper's statements about Table 2 that our run can test: (what, system, reference, summary
#: column); the paper's difference comes from :func:`paper_table2`. Pruned systems are compared
#: in both forms (zero-shot and fine-tuned after pruning; the paper fine-tunes, D.2).
CLAIMS = (
    ("Deep Ensembles (D) raise accuracy", "Deep Ensembles (D)", "Single", "accuracy"),
    ("Deep Ensembles (D) lower NLL", "Deep Ensembles (D)", "Single", "nll"),
    ("Deep Ensembles (D) raise OOD AUROC", "Deep Ensembles (D)", "Single", "all_auroc"),
    ("Deep Ensembles (D) lower FPR95", "Deep Ensembles (D)", "Single", "all_fpr95"),
    ("MC Dropout raises OOD AUROC", "MC Dropout", "Single", "all_auroc"),
    ("MC Dropout raises NLL", "MC Dropout", "Single", "nll"),
    ("Taylor lowers accuracy", "Taylor", "Single", "accuracy"),
    ("Taylor raises NLL", "Taylor", "Single", "nll"),
    ("Taylor raises OOD AUROC", "Taylor", "Single", "all_auroc"),
    ("CircAvg raises accuracy", "CircAvg", "Single", "accuracy"),
    ("CircAvg raises NLL", "CircAvg", "Single", "nll"),
    ("CircAvg raises OOD AUROC", "CircAvg", "Single", "all_auroc"),
    ("CircAvg lowers FPR95", "CircAvg", "Single", "all_fpr95"),
    ("CircAvg beats Taylor on OOD AUROC", "CircAvg", "Taylor", "all_auroc"),
    ("Hydra (Taylor) raises accuracy", "Hydra (Taylor)", "Single", "accuracy"),
    ("Hydra (Taylor) raises OOD AUROC", "Hydra (Taylor)", "Single", "all_auroc"),
    ("Hydra (Circ) lowers NLL", "Hydra (Circ)", "Single", "nll"),
    ("Hydra (Circ) lowers ECE", "Hydra (Circ)", "Single", "ece"),
    ("Hydra (Circ) raises OOD AUROC", "Hydra (Circ)", "Single", "all_auroc"),
    ("Hydra (Circ) raises near-OOD AUROC", "Hydra (Circ)", "Single", "near_auroc"),
    ("Hydra (Circ) raises far-OOD AUROC", "Hydra (Circ)", "Single", "far_auroc"),
    ("Hydra (Circ) lowers FPR95", "Hydra (Circ)", "Single", "all_fpr95"),
    (
        "Hydra (Circ) beats Deep Ensembles (D) on AUROC",
        "Hydra (Circ)",
        "Deep Ensembles (D)",
        "all_auroc",
    ),
    (
        "Hydra (Circ) beats Deep Ensembles (D) on FPR95",
        "Hydra (Circ)",
        "Deep Ensembles (D)",
        "all_fpr95",
    ),
    ("Hydra (Circ) beats Hydra (Taylor) on AUROC", "Hydra (Circ)", "Hydra (Taylor)", "all_auroc"),
    ("Hydra (Circ) beats CircAvg on AUROC", "Hydra (Circ)", "CircAvg", "all_auroc"),
)
#: our systems by the paper's row name: (zero-shot, fine-tuned after pruning)
OURS = {
    "Single": (SINGLE, SINGLE),
    "Deep Ensembles (D)": (DEEP, DEEP),
    "MC Dropout": (MC_DROPOUT, MC_DROPOUT),
    "Taylor": (TAYLOR, TAYLOR_FT),
    "CircAvg": (CIRCAVG, CIRCAVG_FT),
    "Hydra (Taylor)": (fused(HYDRA_TAYLOR), fused(HYDRA_TAYLOR_FT)),
    "Hydra (Circ)": (fused(HYDRA_CIRC), fused(HYDRA_CIRC_FT)),
}


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
        "paper_claims": _claims(list(repeats) if len(repeats) > 1 else systems),
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
    if system in (SINGLE, DEEP, MC_DROPOUT):
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


def _claims(systems: SystemsReport | Sequence[SystemsReport]) -> pd.DataFrame:
    """Each of the paper's statements (:data:`CLAIMS`) against our paired difference, for the
    zero-shot and the fine-tuned form of pruned systems: the paper's difference, ours with its
    95% interval, and a verdict; over repeats (a list), the mean difference and its two-level
    interval, the per-repeat differences (``zero_shot_repeats``, ``fine_tuned_repeats``) and the
    item parts that recompute it, and the near and far sets apart for a statement over all OOD
    sets (:func:`~hydra_core.report.claims.claim_columns`)."""
    numbers = paper_table2().set_index("system")
    rows = []
    for claim, system, reference, column in CLAIMS:
        paper = numbers.loc[system, column] - numbers.loc[reference, column]
        row = {"claim": claim, "metric": column, "paper_difference": round(paper, 4)}
        for form, position in (("zero_shot", 0), ("fine_tuned", 1)):
            a, b = OURS[system][position], OURS[reference][position]
            row.update(claim_columns(systems, a, b, column, paper, form))
        rows.append(row)
    return pd.DataFrame(rows)
