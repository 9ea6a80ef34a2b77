"""The paper's statements about its Table 1 (ImageNet-1K) against the image report's repeats.

Each statement is a difference between two of the paper's rows ("Hydra (Circ) raises OOD AUROC
over the single model"); ours is the same difference between our systems, the mean over the
report's repeats with the two-level interval (repeats, then report images;
:func:`~hydra_core.report.claims.paired_claim`), so a verdict carries the seeds' variance as well
as the images'. The paper fine-tunes every pruned system (D.2) and compares the zero-shot circuits
in Table 4: our Hydras are taken fine-tuned, CircAvg and Taylor zero-shot (the forms every repeat
has). A statement whose interval holds 0 cannot be decided at this scale ("n.s.").

The paper's efficient ensembles (Packed-Ensembles, MIMO, BatchEnsemble, LoRA Ensembles) are one
stored copy each, not seeded per repeat, so its statements about them are judged on repeat 0
alone, with the paired bootstrap interval over the report items (:func:`efficient_claims`;
``judged_on`` says which form a row has).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from hydra_core.baselines.efficient import NAMES as EFFICIENT_NAMES
from hydra_core.experiment.results import SystemsReport
from hydra_core.report.claims import claim_columns, paper_rows
from hydra_core.report.efficient_ensembles import OVER_REPEATS, REPEAT_0
from hydra_core.report.tables import HYDRA_CIRC_FT, HYDRA_TAYLOR_FT, fused

#: The paper's Table 1, ImageNet-1K (ViT-B/16): accuracy and OOD metrics in percent, OOD averaged
#: over its report sets; ECE and aECE are 0.01-0.02 for every row, too coarse to compare.
PAPER_TABLE1_IMAGENET = """
system          | Acc   Brier NLL  AUROC FPR95
Single          | 80.67 0.27  0.71 84.40 50.25
Deep Ensembles  | 82.19 0.25  0.65 85.48 46.93
Taylor          | 80.68 0.28  0.79 84.38 54.51
CircAvg         | 80.22 0.28  0.77 85.71 50.23
Hydra (Taylor)  | 81.20 0.26  0.75 85.36 50.50
Hydra (Circ)    | 80.88 0.27  0.74 86.29 47.62
Packed-Ensembles| 79.23 0.29  0.78 83.26 51.65
MIMO            | 80.59 0.27  0.72 83.63 52.64
BatchEnsemble   | 80.53 0.27  0.72 84.34 50.38
LoRA Ensembles  | 80.68 0.27  0.71 84.24 50.59
"""
PAPER_COLUMNS = ("accuracy", "brier", "nll", "all_auroc", "all_fpr95")

#: the paper's rows as our systems (Hydras fine-tuned after pruning, circuits zero-shot)
OURS = {
    "Single": "single",
    "Deep Ensembles": "Deep Ensembles",
    "Taylor": "Taylor",
    "CircAvg": "CircAvg",
    "Hydra (Taylor)": fused(HYDRA_TAYLOR_FT),
    "Hydra (Circ)": fused(HYDRA_CIRC_FT),
    **{name: name for name in EFFICIENT_NAMES.values()},
}

#: (system, reference): the pairs the paper's text and Table 4 speak about
PAIRS = (
    ("Hydra (Circ)", "Single"),
    ("Hydra (Taylor)", "Single"),
    ("Deep Ensembles", "Single"),
    ("Hydra (Circ)", "Deep Ensembles"),
    ("Hydra (Circ)", "Hydra (Taylor)"),
    ("CircAvg", "Taylor"),
)

#: the efficient ensembles Hydra (Circ) is compared with (Table 1; "Compared with [...] adapter-
#: based methods and other efficient ensembles, Hydra Ensembles achieves better robustness", 5.1)
EFFICIENT_PAIRS = tuple(("Hydra (Circ)", name) for name in EFFICIENT_NAMES.values())


WORDS = {
    "accuracy": "accuracy",
    "brier": "Brier score",
    "nll": "NLL",
    "all_auroc": "OOD AUROC",
    "all_fpr95": "OOD FPR95",
}


def paper_table1() -> pd.DataFrame:
    """:data:`PAPER_TABLE1_IMAGENET` as a frame indexed by system, our column names."""
    rows = {
        name: dict(zip(PAPER_COLUMNS, map(float, values), strict=True))
        for name, *values in paper_rows(PAPER_TABLE1_IMAGENET)
    }
    return pd.DataFrame.from_dict(rows, orient="index")


def image_claims(repeats: Sequence[SystemsReport]) -> pd.DataFrame:
    """One row per statement: the paper's difference, ours (mean over ``repeats``, in points for
    accuracy and OOD metrics) with its two-level 95% interval, and the verdict ("–" where a
    system is missing from the run, e.g. Deep Ensembles without trained copies); the per-repeat
    differences and item parts that recompute it, and a statement over all OOD sets judged on
    the near and the far sets too (:func:`~hydra_core.report.claims.claim_columns`)."""
    return _claims(repeats, PAIRS, OVER_REPEATS)


def efficient_claims(systems: SystemsReport) -> pd.DataFrame:
    """The paper's Table 1 statements comparing Hydra (Circ) with each efficient ensemble that
    ``systems`` (repeat 0) evaluated, as :func:`image_claims` writes them but judged on this one
    run: the paired difference with its bootstrap interval over the report items (the stored
    copy is one model, not seeded per repeat, so no repeat-level interval exists). Empty when
    none was evaluated; the others are not judged (the report lists them)."""
    pairs = [(a, b) for a, b in EFFICIENT_PAIRS if OURS[b] in systems.info]
    return _claims(systems, pairs, REPEAT_0)


def _claims(
    systems: SystemsReport | Sequence[SystemsReport],
    pairs: Sequence[tuple[str, str]],
    judged_on: str,
) -> pd.DataFrame:
    """One row per pair and column of :data:`PAPER_COLUMNS` where the paper's rows differ."""
    paper = paper_table1()
    rows = []
    for system, reference in pairs:
        for column in PAPER_COLUMNS:
            difference = round(paper.loc[system, column] - paper.loc[reference, column], 4)
            if difference == 0:
                continue
            ours = claim_columns(systems, OURS[system], OURS[reference], column, difference, "ours")
            rising = "raises" if difference > 0 else "lowers"
            rows.append(
                {
                    "claim": f"{system} {rising} {WORDS[column]} over {reference}",
                    "system": OURS[system],
                    "reference": OURS[reference],
                    "metric": column,
                    "paper_difference": difference,
                    "judged_on": judged_on,
                    **ours,
                }
            )
    return pd.DataFrame(rows).rename(columns={"ours_verdict": "verdict"})
