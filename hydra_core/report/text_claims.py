"""The text report's verdicts: the paper's Table 2 in our column names, and its statements
against our paired differences: those about Table 2's rows (:data:`CLAIMS`) over the run's repeats
(:func:`text_claims`), and those about LoRA Ensembles (:data:`EFFICIENT_CLAIMS`), one stored copy
not seeded per repeat, judged on repeat 0 alone (:func:`efficient_text_claims`)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from hydra_core.baselines import efficient
from hydra_core.baselines.shared_backbone import DEEP
from hydra_core.baselines.systems import MC_DROPOUT
from hydra_core.experiment.results import SystemsReport
from hydra_core.report.claims import CIRCAVG, claim_columns, paper_rows
from hydra_core.report.efficient_ensembles import OVER_REPEATS, REPEAT_0
from hydra_core.report.tables import HYDRA_CIRC, HYDRA_CIRC_FT, HYDRA_TAYLOR, HYDRA_TAYLOR_FT, fused

SINGLE = "single"
TAYLOR = "Taylor"
TAYLOR_FT, CIRCAVG_FT = "Taylor (fine-tuned)", "CircAvg (fine-tuned)"
LORA_ENSEMBLES = efficient.NAMES[efficient.LORA]

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
    LORA_ENSEMBLES: (LORA_ENSEMBLES, LORA_ENSEMBLES),  # one stored copy: not pruned
}

#: The paper's statements about LoRA Ensembles, its one efficient ensemble in Table 2: "Compared
#: to Deep Ensembles (D), classical lightweight approaches such as MC Dropout and LoRA Ensembles
#: are close in accuracy but show weaker OOD detection" (5.2; "close" is no direction, so not
#: judged), and Hydra (Circ) against it on OOD detection, as Table 2's rows have it.
EFFICIENT_CLAIMS = (
    (
        "LoRA Ensembles detect OOD worse than Deep Ensembles (D): AUROC",
        LORA_ENSEMBLES,
        "Deep Ensembles (D)",
        "all_auroc",
    ),
    (
        "LoRA Ensembles detect OOD worse than Deep Ensembles (D): FPR95",
        LORA_ENSEMBLES,
        "Deep Ensembles (D)",
        "all_fpr95",
    ),
    ("Hydra (Circ) beats LoRA Ensembles on AUROC", "Hydra (Circ)", LORA_ENSEMBLES, "all_auroc"),
    ("Hydra (Circ) beats LoRA Ensembles on FPR95", "Hydra (Circ)", LORA_ENSEMBLES, "all_fpr95"),
)


def text_claims(systems: SystemsReport | Sequence[SystemsReport]) -> pd.DataFrame:
    """Each of the paper's statements (:data:`CLAIMS`) against our paired difference, for the
    zero-shot and the fine-tuned form of pruned systems: the paper's difference, ours with its
    95% interval, and a verdict; over repeats (a list), the mean difference and its two-level
    interval, the per-repeat differences (``zero_shot_repeats``, ``fine_tuned_repeats``) and the
    item parts that recompute it, and the near and far sets apart for a statement over all OOD
    sets (:func:`~hydra_core.report.claims.claim_columns`)."""
    return _claims(systems, CLAIMS, OVER_REPEATS)


def efficient_text_claims(systems: SystemsReport) -> pd.DataFrame:
    """The paper's statements about its efficient ensembles (:data:`EFFICIENT_CLAIMS`) whose
    stored copy ``systems`` (repeat 0) evaluated, as :func:`text_claims` writes them but judged
    on this one run: the paired difference with its bootstrap interval over the report sentences
    (the stored copy is one model, not seeded per repeat). Empty when none ran; the others are
    not judged (:func:`not_judged` names them)."""
    present = [c for c in EFFICIENT_CLAIMS if _efficient_of(c) in systems.info]
    return _claims(systems, present, REPEAT_0)


def not_judged(systems_in_tables: Sequence[str]) -> list[str]:
    """The efficient ensembles the paper makes statements about that are not in the tables."""
    named = dict.fromkeys(_efficient_of(c) for c in EFFICIENT_CLAIMS)
    return [name for name in named if name not in systems_in_tables]


def _efficient_of(claim: tuple[str, str, str, str]) -> str:
    """The efficient ensemble a statement of :data:`EFFICIENT_CLAIMS` is about."""
    _, system, reference, _ = claim
    return OURS[reference if system == "Hydra (Circ)" else system][0]


def _claims(
    systems: SystemsReport | Sequence[SystemsReport],
    claims: Sequence[tuple[str, str, str, str]],
    judged_on: str,
) -> pd.DataFrame:
    """One row per statement of ``claims``, both forms, with ``judged_on``."""
    numbers = paper_table2().set_index("system")
    rows = []
    for claim, system, reference, column in claims:
        paper = numbers.loc[system, column] - numbers.loc[reference, column]
        row = {"claim": claim, "metric": column, "paper_difference": round(paper, 4)}
        row["judged_on"] = judged_on
        for form, position in (("zero_shot", 0), ("fine_tuned", 1)):
            a, b = OURS[system][position], OURS[reference][position]
            row.update(claim_columns(systems, a, b, column, paper, form))
        rows.append(row)
    return pd.DataFrame(rows)


def paper_claims(systems: SystemsReport, repeats: Sequence[SystemsReport] = ()) -> pd.DataFrame:
    """``paper_claims.csv``: :func:`text_claims` over ``repeats`` (``systems`` first; one run
    when fewer than two), then :func:`efficient_text_claims` on ``systems`` (repeat 0)."""
    over = text_claims(list(repeats) if len(repeats) > 1 else systems)
    about_efficient = efficient_text_claims(systems)
    if about_efficient.empty:
        return over
    return pd.concat([over, about_efficient], ignore_index=True)
