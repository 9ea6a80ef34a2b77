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


#: the AUROC columns a verdict is given on: near and far apart, then all sets (never all alone)
AUROC_GROUPS = (("near_auroc", "near OOD"), ("far_auroc", "far OOD"), ("all_auroc", "all sets"))


def _joined(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def ensembling_verdict(
    table: pd.DataFrame, groups: tuple[tuple[str, str], ...] = AUROC_GROUPS
) -> str:
    """One paragraph from a :meth:`~hydra_core.experiment.results.SystemsReport.comparisons` table:
    fused minus its best member on each of ``groups`` (column, name: by default the AUROC on near
    OOD, far OOD and all sets, apart) with the paired intervals, each with its cost, and what each
    means: a significant gain (interval above 0) is the ensembling's; a difference whose interval
    contains 0, or a loss, says the pruning (the best member alone) bought whatever the fused
    ensemble gains over the single model there. Empty without a best-member row."""
    best = table[table["role"] == "best member"]
    if best.empty:
        return ""
    row = best.iloc[0]
    present = [(c, name) for c, name in groups if c in table and pd.notna(row[c])]
    if not present:
        return ""
    fused, member = row["system"], row["against"]
    said = (
        f"**{fused}**{_cost(row, 'macs_ratio')} minus its best member **{member}**"
        f"{_cost(row, 'against_macs_ratio')}, AUROC (paired 95% intervals): "
        + "; ".join(f"{name} {_interval(row, c)}" for c, name in present)
        + "."
    )
    beats = [name for c, name in present if row[f"{c}_lo"] > 0]
    loses = [name for c, name in present if row[f"{c}_hi"] < 0]
    neither = [name for c, name in present if name not in beats and name not in loses]
    if beats:
        said += (
            f" The ensemble beats its best member on {_joined(beats)}: the ensembling adds to "
            "the pruning there."
        )
    if loses:
        said += (
            f" Its best member alone beats the ensemble on {_joined(loses)}: the pruning, not "
            "the ensembling, bought the gain there."
        )
    if neither:
        said += (
            f" Not significant on {_joined(neither)}: the best member alone does as well, so the "
            "pruning, not the ensembling, bought whatever the ensemble gains over the single "
            "model there."
        )
    return said
