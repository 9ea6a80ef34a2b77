"""The report's section "Stability of the circuits", from ``stability.csv``
(:func:`~hydra_core.experiment.stability.circuit_stability` computes it)."""

from __future__ import annotations

import pandas as pd

from hydra_core.analysis.stability import STABLE_SHARE


def stability_section(table: pd.DataFrame | None, markdown_table) -> list[str]:
    """The report's section for ``stability.csv`` (none when the run skipped it)."""
    if table is None or table.empty:
        return []
    if "peak_beats_budget" in table:
        beyond = table.loc[table["peak_beats_budget"].astype(bool), "circuit"].tolist()
        verdict = (
            "No circuit's held-out peak beats its budget beyond the 95% interval of their paired "
            "difference, so no smaller budget is suggested."
            if not beyond
            else f"{', '.join(beyond)} go{'es' * (len(beyond) == 1)} past a held-out peak that "
            "beats the budget beyond the interval: their last removals raised the objective on "
            "the search sample and lowered it on held-out samples of the same sets."
        )
    else:  # a table written before the paired interval: the point values only
        beyond = table.loc[table["beyond_peak"].astype(bool), "circuit"].tolist()
        verdict = (
            "Every circuit's budget is at or before its held-out peak."
            if not beyond
            else f"{', '.join(beyond)} go{'es' * (len(beyond) == 1)} past the held-out peak "
            "(point values; no interval of the difference in this table)."
        )
    shown = table[
        [
            c
            for c in [
                "circuit",
                "budget",
                "jaccard",
                "jaccard_chance",
                "removed_frequency_mean",
                "removed_frequency_min",
                "stably_removed",
                "held_out_dense",
                "held_out_at_budget",
                "held_out_peak",
                "held_out_at_peak",
                "beyond_peak",
                "peak_beats_budget",
            ]
            if c in table
        ]
    ]
    n = table.iloc[0]
    return [
        "## Stability of the circuits",
        "",
        f"Each circuit's search repeated on {int(n['resamples'])} bootstrap resamples of its "
        "search data (ID within class, each OOD search set within itself): `jaccard` is the mean "
        "pairwise Jaccard of the resamples' removed sets, `jaccard_chance` that of two random "
        "sets of the same size from the same heads; `removed_frequency_*` the share of "
        "resamples that removed each of the circuit's heads (mean, and its least stable head); "
        f"`stably_removed` how many of its heads at least {STABLE_SHARE:.0%} of them removed. "
        f"`held_out_*`: the objective on {int(n['held_out_n_id'])} ID + "
        f"{int(n['held_out_n_ood'])} OOD items of the search sets that the search did not use "
        "(never a report set), dense, at the budget and at its peak (`held_out_peak` removals), "
        "with 95% intervals in `stability.csv`. " + verdict,
        "",
        markdown_table(shown),
        "",
    ]
