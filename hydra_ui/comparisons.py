"""What the Hydra page says about the fused ensemble against its baselines and its own best member
(:meth:`hydra_core.experiment.results.SystemsReport.comparisons` makes the numbers): whether the
gain over the single model came from the pruning (a member alone has it) or from the
ensembling."""

from __future__ import annotations

import math

import pandas as pd


def _interval(row: pd.Series, column: str) -> str:
    return f"{row[column]:+.4f} [{row[f'{column}_lo']:+.4f}, {row[f'{column}_hi']:+.4f}]"


def _cost(row: pd.Series, column: str) -> str:
    value = row.get(column, math.nan)
    return "" if pd.isna(value) else f" at {value:.2f}x the single model's multiply-adds"


def ensembling_verdict(table: pd.DataFrame, column: str = "all_auroc", what: str = "") -> str:
    """One paragraph from a :meth:`~hydra_core.experiment.results.SystemsReport.comparisons` table:
    fused minus its best member on ``column`` (named ``what``) with the paired interval, each
    with its cost, and what that means: a significant gain is the ensembling's; a difference
    whose interval contains 0, or a loss, says the pruning (the best member alone) bought
    whatever the fused ensemble gains over the single model. Empty without a best-member row."""
    best = table[table["role"] == "best member"]
    if best.empty or column not in table:
        return ""
    row = best.iloc[0]
    what = what or column
    fused, member = row["system"], row["against"]
    said = (
        f"**{fused}**{_cost(row, 'macs_ratio')} minus its best member **{member}**"
        f"{_cost(row, 'against_macs_ratio')}, {what}: {_interval(row, column)} (paired 95% "
        "interval)."
    )
    low, high = row[f"{column}_lo"], row[f"{column}_hi"]
    if low > 0:
        return said + " The ensemble beats its best member: the ensembling adds to the pruning."
    if high < 0:
        return (
            said + " Its best member alone beats the ensemble: the pruning, not the ensembling, "
            "bought the gain."
        )
    return (
        said + " Not significant: the best member alone does as well, so the pruning, not the "
        "ensembling, bought whatever the ensemble gains over the single model."
    )
