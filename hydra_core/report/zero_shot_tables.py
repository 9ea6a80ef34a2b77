"""The zero-shot report's tables: Table 3 of this run beside the paper's, the differences to the
single model, and the paper's claims about Table 3 as data (:data:`CLAIMS`) with their verdicts."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from hydra_core.baselines.systems import TEMPERATURE
from hydra_core.experiment.results import SystemsReport
from hydra_core.report.claims import claim_columns, pick
from hydra_core.report.tables import HYDRA_CIRC, HYDRA_TAYLOR, NEAR_FAR, circuits_table, fused
from hydra_core.report.zero_shot_config import CIRCAVG, SINGLE, TAYLOR

#: the rows of Table 3, in the paper's order (Hydra (Taylor) is not in the paper's table)
MAIN_ROWS = (SINGLE, TEMPERATURE, TAYLOR, CIRCAVG, fused(HYDRA_TAYLOR), fused(HYDRA_CIRC))


MAIN_COLUMNS = (
    "accuracy",
    "brier",
    "nll",
    "ece",
    "adaptive_ece",
    "all_auroc",
    "all_fpr95",
    "all_aupr_in",
    "all_aupr_out",
)


DIFFERENCES = ("accuracy", "nll", "ece", "near_auroc", "far_auroc", "all_auroc", "all_fpr95")


PAPER_COLUMNS = (
    "system",
    "heads",
    "accuracy",
    "brier",
    "nll",
    "ece",
    "adaptive_ece",
    "all_auroc",
    "all_fpr95",
    "all_aupr_out",
)


#: our systems by the paper's row name
OURS = {
    "Single": SINGLE,
    "Temperature Scaling": TEMPERATURE,
    "Taylor": TAYLOR,
    "CircAvg": CIRCAVG,
    "Hydra (Taylor)": fused(HYDRA_TAYLOR),
    "Hydra (Circ)": fused(HYDRA_CIRC),
}


#: the statements Table 3 makes about pairs of its rows: (claim, system, reference, column)
CLAIMS = (
    ("Temperature Scaling lowers NLL", "Temperature Scaling", "Single", "nll"),
    ("Temperature Scaling lowers ECE", "Temperature Scaling", "Single", "ece"),
    ("Taylor lowers accuracy", "Taylor", "Single", "accuracy"),
    ("Taylor lowers OOD AUROC", "Taylor", "Single", "all_auroc"),
    ("CircAvg lowers accuracy", "CircAvg", "Single", "accuracy"),
    ("CircAvg beats Taylor on accuracy", "CircAvg", "Taylor", "accuracy"),
    ("CircAvg lowers ECE", "CircAvg", "Single", "ece"),
    ("CircAvg raises OOD AUROC", "CircAvg", "Single", "all_auroc"),
    ("CircAvg lowers FPR95", "CircAvg", "Single", "all_fpr95"),
    ("Hydra (Circ) raises accuracy", "Hydra (Circ)", "Single", "accuracy"),
    ("Hydra (Circ) lowers NLL", "Hydra (Circ)", "Single", "nll"),
    ("Hydra (Circ) lowers ECE", "Hydra (Circ)", "Single", "ece"),
    ("Hydra (Circ) raises OOD AUROC", "Hydra (Circ)", "Single", "all_auroc"),
    ("Hydra (Circ) lowers FPR95", "Hydra (Circ)", "Single", "all_fpr95"),
    ("Hydra (Circ) beats Temperature Scaling on ECE", "Hydra (Circ)", "Temperature Scaling", "ece"),
    (
        "Hydra (Circ) beats Temperature Scaling on AUROC",
        "Hydra (Circ)",
        "Temperature Scaling",
        "all_auroc",
    ),
)


def paper_table3() -> pd.DataFrame:
    """The paper's Table 3 rows Hydra Lab runs, in its units (ECE as a fraction)."""
    return pd.DataFrame(PAPER_TABLE3, columns=PAPER_COLUMNS)


def zero_shot_tables(systems: SystemsReport, circuits: Mapping) -> dict[str, pd.DataFrame]:
    """Every table of the zero-shot report, by CSV name (the bootstrap intervals are computed
    here)."""
    summary = systems.summary()
    rows = summary.set_index("system")
    main = rows.loc[[r for r in MAIN_ROWS if r in rows.index]].reset_index()
    table = systems.table()
    return {
        "table3_systems": pick(main, ["system", "kind", "heads", *MAIN_COLUMNS]),
        "near_far": pick(main, ["system", "heads", *NEAR_FAR]),
        "per_set": table[table["group"] != "id"].drop(columns=["kind"]).reset_index(drop=True),
        "differences_to_single": systems.differences(SINGLE, list(DIFFERENCES)),
        "paper_table3": paper_table3(),
        "paper_claims": zero_shot_claims(systems),
        "circuit": circuits_table(circuits),
        "table7_cost": systems.cost.reset_index(),
        "summary_all_systems": summary,
        "all_sets": table,
    }


def zero_shot_claims(systems: SystemsReport) -> pd.DataFrame:
    """Each statement of :data:`CLAIMS` against our paired difference and its 95% interval."""
    numbers = paper_table3().set_index("system")
    rows = []
    for claim, system, reference, column in CLAIMS:
        paper = float(numbers.loc[system, column] - numbers.loc[reference, column])
        row = {"claim": claim, "metric": column, "paper_difference": round(paper, 4)}
        row.update(claim_columns(systems, OURS[system], OURS[reference], column, paper, "ours"))
        rows.append(row)
    return pd.DataFrame(rows).rename(columns={"ours_verdict": "verdict"})


#: the paper's Table 3 (OpenCLIP ViT-B/32, nine data sets averaged; ImageNet-1k OOD; ECE and aECE
#: in percent there, as fractions here; both towers pruned), the rows Hydra Lab runs
PAPER_TABLE3 = (
    ("Single", "12", 73.65, 0.36, 0.98, 0.0868, 0.0857, 70.76, 75.20, 37.73),
    ("Temperature Scaling", "12", 73.65, 0.36, 0.90, 0.0403, 0.0380, 70.76, 75.20, 37.73),
    ("Taylor", "10", 60.75, 0.53, 1.65, 0.1376, 0.1367, 67.44, 79.41, 33.64),
    ("CircAvg", "10", 71.91, 0.38, 0.99, 0.0400, 0.0411, 76.88, 68.26, 47.64),
    ("Hydra (Circ)", "10x3", 74.00, 0.36, 0.93, 0.0349, 0.0335, 76.82, 68.05, 47.85),
)
