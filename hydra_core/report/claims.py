"""The paper's statements against a run: paired differences, verdicts and the shared pieces of
the reports' tables (metric columns with their intervals, the circuit's search record, the paper's
numbers in our scale).

A *claim* is a statement the paper's table makes about a pair of its rows ("Hydra (Circ) lowers
ECE"); :func:`paired_claim` sets our paired difference with its 95% interval beside the paper's,
and :func:`verdict` says whether they agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd

from hydra_core.evaluate import interval_columns
from hydra_core.hydra.systems import SUMMARY_METRICS, SystemsReport, repeated_difference

if TYPE_CHECKING:
    pass

CIRCAVG = "CircAvg"


def paired_claim(
    systems: SystemsReport | Sequence[SystemsReport], a: str, b: str, column: str, paper: float
) -> dict[str, float | str]:
    """Our side of the claim "``a`` minus ``b`` on ``column``" (a summary column): the paired
    difference with its 95% interval (accuracy and OOD metrics in points) and the verdict against
    the paper's difference; NaN and "–" when the run lacks either system.

    ``systems``: one run, or the repeats of a run (a list): then the difference is the mean over
    the repeats and its interval a two-level bootstrap (repeats, then items;
    :func:`~hydra_core.hydra.systems.repeated_difference`), so a verdict survives the seeds or
    is not issued."""
    nan = float("nan")
    repeats = [systems] if isinstance(systems, SystemsReport) else list(systems)
    if any(a not in r.info or b not in r.info for r in repeats) or a == b:
        return {"value": nan, "lo": nan, "hi": nan, "verdict": "–"}
    metric, which = claim_metric(column)
    if isinstance(systems, SystemsReport):
        d = systems.difference(a, b, metric, which)
    else:
        d = repeated_difference(repeats, a, b, metric, which)
    scale = 100 if metric in PERCENT else 1
    return {
        "value": scale * d.value,
        "lo": scale * d.lo,
        "hi": scale * d.hi,
        "verdict": verdict(paper, d.value, d.lo, d.hi),
    }


#: summary columns shown in percent
PERCENT = ("accuracy", "auroc", "fpr95", "aupr_in", "aupr_out")


def paper_rows(table: str) -> list[list[str]]:
    """The rows of a table transcribed from the paper (a header line, then a line per system
    whose cells are split at ``|``, the last cell holding the numbers split at white space):
    each row's cells as text, its numbers last."""
    rows = []
    for line in table.strip().splitlines()[1:]:
        *cells, numbers = (part.strip() for part in line.split("|"))
        rows.append([*cells, *numbers.split()])
    return rows


def pick(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """``columns`` of ``frame`` that it has, each metric followed by its interval."""
    return frame[[c for c in interval_columns(columns) if c in frame]]


def claim_metric(column: str) -> tuple[str, str]:
    """A summary column as (metric, set): ``near_auroc`` -> ("auroc", "near")."""
    return SUMMARY_METRICS[column]


def verdict(paper: float, value: float, lo: float, hi: float) -> str:
    """The verdict on one statement: "agrees" (same sign, interval excludes 0), "disagrees"
    (opposite sign, interval excludes 0), or the direction and "n.s." when our interval contains
    0 ("no difference" when ours is exactly 0)."""
    if paper == 0 or value != value:
        return "–"
    if value == 0:
        return "no difference"
    same = (paper > 0) == (value > 0)
    if lo > 0 or hi < 0:
        return "agrees" if same else "disagrees"
    return "same direction, n.s." if same else "opposite direction, n.s."


def paper_frame(paper: pd.DataFrame) -> pd.DataFrame:
    """The paper's numbers (in percent already) in our column scale (fractions), so that the
    table formats them as ours."""
    frame = paper.copy()
    for column in frame.columns:
        if column.split("_")[-1] in ("accuracy", "auroc", "fpr95", "out"):
            frame[column] = frame[column] / 100
    return frame


def signed(metric: str, value: float, lo: float, hi: float) -> str:
    if value != value:
        return "–"
    digits = 2 if metric.split("_")[-1] in PERCENT else 4
    return f"{value:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


def verdict_counts(claims: pd.DataFrame) -> list[str]:
    """One line per form: how many statements agree, disagree or are not significant, and
    which disagree."""
    lines = []
    for form, label in (("fine_tuned", "fine-tuned"), ("zero_shot", "zero-shot")):
        tally = verdict_tally(claims["claim"], claims[f"{form}_verdict"])
        if tally:
            lines.append(f"- **{label}**: of {tally}")
    return lines


def verdict_tally(statements: pd.Series, verdicts: pd.Series) -> str:
    """ "N statements, a agree, b same direction, n.s., ...; disagreeing: ..." over the
    statements that have a verdict ("–": not tested); empty when none has."""
    counted = verdicts[verdicts != "–"]
    if counted.empty:
        return ""
    counts = counted.value_counts()
    against = statements[verdicts == "disagrees"].tolist()
    return (
        f"{len(counted)} statements, "
        + ", ".join(f"{counts.get(v, 0)} {PLURAL.get(v, v)}" for v in VERDICTS)
        + (f"; disagreeing: {'; '.join(against)}." if against else ".")
    )


VERDICTS = (
    "agrees",
    "same direction, n.s.",
    "no difference",
    "opposite direction, n.s.",
    "disagrees",
)


PLURAL = {"agrees": "agree", "disagrees": "disagree"}
