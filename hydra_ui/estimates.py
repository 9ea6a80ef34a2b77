"""How long a long run will take, said before it starts, from the measured cost of one step.

A greedy search step scores every head still in the circuit (one forward pass over the search
samples per candidate), so a step of a search with ``h`` heads left costs about ``h`` times one
candidate evaluation, and a candidate evaluation costs in proportion to the samples it scores.
The unit here is one candidate evaluation over the whole search split; its cost comes from the
steps a saved search of this setup measured (:attr:`GreedyResult.step_seconds`). The stability
run is its search on the search part (a ``1 - held-out share`` of the samples), the held-out
curve (one evaluation of the held-out part per step) and B resampled searches of the search part,
counted as if no two resamples shared a step: an upper bound (shared steps make it faster).
Nothing here touches Streamlit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hydra_ui.jobs import format_seconds

#: what the pages call "finishes in minutes"
MINUTES = 10 * 60.0


def seconds_per_candidate(step_seconds: Sequence[float], total: int) -> float | None:
    """Seconds of one candidate evaluation over the search split, from the measured seconds of a
    search's steps (step ``t`` scores ``total - t`` candidates); None without a measured step."""
    timed = [(t, s) for t, s in enumerate(step_seconds) if s == s and s > 0]  # NaN: not timed
    if not timed:
        return None
    return sum(s for _, s in timed) / sum(total - t for t, _ in timed)


def search_seconds(per_candidate: float, total: int, budget: int, done: int = 0) -> float:
    """Seconds of the search steps ``done`` .. ``budget - 1`` (of a model of ``total`` heads)."""
    return per_candidate * sum(total - t for t in range(done, budget))


def stability_seconds(
    per_candidate: float, total: int, budget: int, resamples: int, fraction: float
) -> float:
    """Seconds of a stability run: the search on the search part, the held-out curve (one
    evaluation of the held-out part per step and of the dense model) and ``resamples`` searches
    of the search part, none shared (so at most this)."""
    part = search_seconds(per_candidate * (1 - fraction), total, budget)
    held = per_candidate * fraction * (budget + 1)
    return part * (1 + resamples) + held


def largest_within(
    estimate: Callable[[int], float], values: Sequence[int], limit: float = MINUTES
) -> int | None:
    """The largest of ``values`` (ascending) whose ``estimate`` is at most ``limit`` seconds."""
    found = None
    for value in values:
        if estimate(value) <= limit:
            found = value
    return found


def search_note(
    per_candidate: float | None, total: int, budget: int, done: int, measured_on: str
) -> str | None:
    """What the Headmap page says before a search: its time at this budget (steps ``done``
    already saved), and the budget that finishes in minutes when this one does not."""
    if per_candidate is None or done >= budget:
        return None
    seconds = search_seconds(per_candidate, total, budget, done)
    text = (
        f"At budget {budget}: about **{format_seconds(seconds)}** "
        f"({budget - done} steps; {per_candidate * total:.1f} s for a step of all {total} heads, "
        f"measured on {measured_on})."
    )
    if seconds > MINUTES:
        fits = largest_within(
            lambda b: search_seconds(per_candidate, total, b, min(done, b)), range(1, budget + 1)
        )
        if fits:
            text += f" Budget {fits} finishes within {format_seconds(MINUTES)}."
    return text


def stability_note(
    per_candidate: float | None,
    total: int,
    budget: int,
    resamples: int,
    fraction: float,
    measured_on: str,
) -> str:
    """What the Stability view says before a run: its time at these sizes, and the resamples
    and budget that finish in minutes when these do not."""
    if per_candidate is None:
        return (
            "Time at these sizes: run the search above first; its measured step cost gives the "
            "estimate (a stability run is about B + 1 searches of this budget)."
        )
    seconds = stability_seconds(per_candidate, total, budget, resamples, fraction)
    text = (
        f"At B = {resamples} and budget {budget}: up to about **{format_seconds(seconds)}** "
        f"(1 + {resamples} searches of {budget} steps on {1 - fraction:.0%} of the search "
        f"samples, from the step cost measured on {measured_on}; resamples that share steps "
        "make it faster)."
    )
    if seconds > MINUTES:
        options = []
        b = largest_within(
            lambda r: stability_seconds(per_candidate, total, budget, r, fraction),
            range(2, resamples + 1),
        )
        if b:
            options.append(f"B = {b} at budget {budget}")
        k = largest_within(
            lambda k: stability_seconds(per_candidate, total, k, resamples, fraction),
            range(1, budget + 1),
        )
        if k:
            options.append(f"budget {k} at B = {resamples}")
        if options:
            text += f" Within {format_seconds(MINUTES)}: {' or '.join(options)}."
        else:
            text += " Fewer search samples (Setup) make it faster."
    return text
