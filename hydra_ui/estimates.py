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
from dataclasses import dataclass

from hydra_core.baselines.shared_backbone import DEEP
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


# --- the Hydra page's evaluation -----------------------------------------------------------------

#: a training step counted as this many forwards of its items (forward, backward, update)
TRAIN_FORWARDS = 3.0


@dataclass(frozen=True)
class Stage:
    """One stage of a run: ``name`` as the run's progress names it, what the page calls it, and
    its estimated seconds."""

    name: str
    label: str
    seconds: float


@dataclass(frozen=True)
class HydraUnits:
    """What one batch timed on this machine gave, in seconds per item: the source model's
    forward, the fused model's, one MC Dropout pass's (None: not timed, not chosen); and the
    seconds of the bootstrap intervals of one system and of counting one model's multiply-adds
    (None: as one forward of the batch)."""

    model: float
    fused: float
    mc_pass: float | None = None
    intervals: float = 0.0
    macs: float | None = None
    #: the same seconds per item in the latency's batches of 32 (None: as in the run's batches)
    small: tuple[float, float, float | None] | None = None


@dataclass(frozen=True)
class HydraRun:
    """The counts of one Hydra evaluation, as the page is set to run it.

    Attributes:
        items: report items over all sets (each system predicts them all once).
        search_items: ID search items (the temperature fit predicts them).
        members: each member's system name, and whether its predictions are cached.
        fused: the fused system's name, and whether its predictions are cached.
        single_cached: whether the single model's predictions are cached.
        finetune: per member, the items of its fine-tuning (epochs x training items; 0: none).
        temperature: temperature scaling chosen.
        mc: the MC Dropout system's name and passes (None: not chosen), and whether cached.
        copies: Deep Ensembles of independently trained copies (0: none).
        shared: Deep Ensembles (D) on the shared backbone: its training items (0: none).
        latency_rounds: timed rounds (warm-up included; 0: latency not measured), each system a
            batch of ``latency_batch`` items.
    """

    items: int
    search_items: int
    members: tuple[tuple[str, bool], ...]
    fused: tuple[str, bool]
    single_cached: bool = False
    finetune: int = 0
    temperature: bool = False
    mc: tuple[str, int, bool] | None = None
    copies: int = 0
    shared: int = 0
    latency_rounds: int = 0
    latency_batch: int = 32


def hydra_stages(run: HydraRun, units: HydraUnits) -> list[Stage]:
    """The stages of a Hydra evaluation in the order they run, each its count of items times
    the measured seconds per item of what predicts them (0 for predictions read from the
    cache); the names are those its progress gives (hydra_core.hydra.experiment.STAGES)."""
    t, n = units.model, run.items
    # latency rounds run batches of 32, dearer per item than the run's batches of 256
    lt, lf, lm = units.small or (units.model, units.fused, units.mc_pass)

    def predicted(name: str, label: str, per_item: float, cached: bool = False) -> Stage:
        return Stage(f"evaluation: {name}", label, 0.0 if cached else per_item * n)

    stages = [predicted("single", "single model", t, run.single_cached)]
    systems, models = 1, 1  # systems with intervals; models whose multiply-adds are counted
    per_round = lt  # seconds per latency item of every system once
    if run.finetune:
        for name, _ in run.members:
            stages.append(
                Stage(f"fine-tuning: {name}", "fine-tuning", TRAIN_FORWARDS * t * run.finetune)
            )
    for name, cached in run.members:
        stages.append(predicted(name, "members", t, cached and not run.finetune))
    name, cached = run.fused
    stages.append(predicted(name, "fused model", units.fused, cached and not run.finetune))
    systems += len(run.members) + 2  # the members, unfused and fused
    models += len(run.members) + 1
    per_round += 2 * lt * len(run.members) + lf  # members alone, unfused, fused
    for i in range(run.copies):
        stages.append(predicted(f"Deep Ensembles member {i}", "Deep Ensembles", t))
    if run.copies:
        systems, models, per_round = systems + 1, models + run.copies, per_round + lt * run.copies
    if run.shared:  # the backbone's features of the training items, then the report split
        stages.append(Stage(f"{DEEP} head 0", "Deep Ensembles (D) training", t * run.shared))
        stages.append(predicted(DEEP, "Deep Ensembles (D)", t))
        systems, models, per_round = systems + 1, models + 1, per_round + lt
    if run.temperature:  # its report predictions are the single model's logits over T
        stages.append(Stage("temperature fit", "temperature fit", t * run.search_items))
        systems, models, per_round = systems + 1, models + 1, per_round + lt
    if run.mc is not None:
        name, passes, cached = run.mc
        per_pass = t if units.mc_pass is None else units.mc_pass
        stages.append(predicted(name, "MC Dropout", per_pass * passes, cached))
        small_pass = lt if lm is None else lm
        systems, models, per_round = systems + 1, models + 1, per_round + small_pass * passes
    count = t * run.latency_batch if units.macs is None else units.macs
    stages.append(Stage("multiply-adds", "multiply-adds", count * models))
    if run.latency_rounds:
        seconds = per_round * run.latency_batch * run.latency_rounds
        stages.append(Stage("latency", "latency", seconds))
    stages.append(Stage("intervals", "intervals", units.intervals * systems))
    return stages


def total_seconds(stages: Sequence[Stage]) -> float:
    return sum(s.seconds for s in stages)
