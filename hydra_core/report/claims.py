"""The paper's statements against a run: paired differences, verdicts and the shared pieces of
the reports' tables (metric columns with their intervals, the circuit's search record, the paper's
numbers in our scale).

A *claim* is a statement the paper's table makes about a pair of its rows ("Hydra (Circ) lowers
ECE"); :func:`paired_claim` sets our paired difference with its 95% interval beside the paper's,
and :func:`verdict` says whether they agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from hydra_core.evaluate import interval_columns
from hydra_core.experiment.results import SUMMARY_METRICS, SystemsReport, repeated_difference
from hydra_core.metrics.bootstrap import item_variance_parts, repeat_interval

CIRCAVG = "CircAvg"


def paired_claim(
    systems: SystemsReport | Sequence[SystemsReport], a: str, b: str, column: str, paper: float
) -> dict[str, float | str]:
    """Our side of the claim "``a`` minus ``b`` on ``column``" (a summary column): the paired
    difference with its 95% interval (accuracy and OOD metrics in points) and the verdict against
    the paper's difference; NaN and "–" when the run lacks either system.

    ``systems``: one run, or the repeats of a run (a list): then the difference is the mean over
    the repeats and its interval a Student t interval over the repeats that adds the items'
    sampling (:func:`~hydra_core.metrics.bootstrap.two_level_interval`), so a verdict survives
    the seeds or is not issued. Also returned, so that the verdict can be recomputed from the
    file alone (:func:`recomputed_claim`): ``repeats``, the per-repeat paired differences joined
    by ``;``, and ``item_var`` / ``item_between``, the item parts of the interval
    (:func:`~hydra_core.metrics.bootstrap.item_variance_parts`; with one repeat, its replicates'
    variance and NaN), in the same scale."""
    nan = float("nan")
    repeats = [systems] if isinstance(systems, SystemsReport) else list(systems)
    if any(a not in r.info or b not in r.info for r in repeats) or a == b:
        return dict(_BLANK)
    metric, which = claim_metric(column)
    if isinstance(systems, SystemsReport):
        d = systems.difference(a, b, metric, which)
    else:
        d = repeated_difference(repeats, a, b, metric, which)
    found = [r.difference_replicates(a, b, metric, which) for r in repeats]
    replicates = [reps for _, reps in found]
    scale = 100 if metric in PERCENT else 1
    if len(found) > 1 and all(len(x) > 1 for x in replicates):
        item_var, item_between = item_variance_parts(replicates)
    else:
        item_var, item_between = float(np.var(replicates[0], ddof=1)), nan
    return {
        "value": scale * d.value,
        "lo": scale * d.lo,
        "hi": scale * d.hi,
        "verdict": verdict(paper, d.value, d.lo, d.hi),
        "repeats": ";".join(repr(float(scale * v)) for v, _ in found),
        "item_var": scale**2 * item_var,
        "item_between": scale**2 * item_between,
    }


#: the parts of a claim written per form, after the form's prefix (the value has none)
CLAIM_PARTS = ("", "_lo", "_hi", "_verdict", "_repeats", "_item_var", "_item_between")


def claim_columns(
    systems: SystemsReport | Sequence[SystemsReport],
    a: str,
    b: str,
    column: str,
    paper: float,
    prefix: str,
) -> dict[str, float | str]:
    """:func:`paired_claim` as the columns ``prefix`` + :data:`CLAIM_PARTS`; a statement over all
    OOD sets (``all_auroc``, ``all_fpr95``, ...) is also judged on the near and the far sets apart
    (the same paper difference), as ``prefix_near`` + parts and ``prefix_far`` + parts, blank for
    other statements."""
    group, _, metric = column.partition("_")
    apart = group == "all" and f"near_{metric}" in SUMMARY_METRICS
    out: dict[str, float | str] = {}
    for tag, col in (("", column), ("_near", f"near_{metric}"), ("_far", f"far_{metric}")):
        found = paired_claim(systems, a, b, col, paper) if tag == "" or apart else _BLANK
        out.update({f"{prefix}{tag}{part}": found[key] for part, key in _KEYS_OF.items()})
    return out


_KEYS_OF = dict(
    zip(
        CLAIM_PARTS,
        ("value", "lo", "hi", "verdict", "repeats", "item_var", "item_between"),
        strict=True,
    )
)
_BLANK = {
    "value": float("nan"),
    "lo": float("nan"),
    "hi": float("nan"),
    "verdict": "–",
    "repeats": "",
    "item_var": float("nan"),
    "item_between": float("nan"),
}


def recomputed_claim(
    paper: float, repeats: str, item_var: float, item_between: float
) -> dict[str, float | str]:
    """A claim's value, interval and verdict recomputed from its row of ``paper_claims.csv``
    alone (the columns ``*_repeats``, ``*_item_var``, ``*_item_between`` of
    :func:`claim_columns`): with 2 or more repeats exactly the interval the report wrote
    (:func:`~hydra_core.metrics.bootstrap.repeat_interval`); with one, the normal approximation
    value +- 1.96 sqrt(item_var) of the written percentile interval."""
    nan = float("nan")
    text = "" if repeats != repeats else str(repeats)
    values = [float(v) for v in text.split(";") if v]
    if not values:
        return {"value": nan, "lo": nan, "hi": nan, "verdict": "–"}
    value = float(np.mean(values))
    if len(values) == 1:
        half = 1.959963984540054 * float(np.sqrt(item_var))
        lo, hi = value - half, value + half
    else:
        lo, hi = repeat_interval(values, float(item_var), float(item_between))
    return {"value": value, "lo": lo, "hi": hi, "verdict": verdict(paper, value, lo, hi)}


#: the repeat-level interval in one sentence, for the reports' Markdown
INTERVAL_METHOD = (
    "Over repeats, an interval is a Student t interval on the repeats' paired differences, its "
    "variance the repeats' spread (less the item noise already in it) over R plus the report "
    "items' sampling variance of the mean, with Satterthwaite degrees of freedom (95% coverage "
    "at 3, 5 and 10 repeats in simulation; docs/intervals.md); `paper_claims.csv` carries each "
    "statement's per-repeat differences and item parts, so every verdict can be recomputed."
)


def near_far_verdicts(claims: pd.DataFrame, prefix: str) -> list[str]:
    """Per row, "near: V / far: V" for a statement over all OOD sets (:func:`claim_columns`
    judged it on the near and far sets apart), "–" for the others."""
    near, far = f"{prefix}_near_verdict", f"{prefix}_far_verdict"
    if near not in claims or far not in claims:
        return ["–"] * len(claims)
    return [
        "–" if n == "–" and f == "–" else f"near: {n} / far: {f}"
        for n, f in zip(claims[near], claims[far], strict=True)
    ]


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
