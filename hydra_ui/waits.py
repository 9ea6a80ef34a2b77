"""Progress for the waits of a page: predictions made in the page's own run (the model card), and
one estimate for the whole of a background job made of stages (the Hydra evaluation).

:class:`ItemCount` and :class:`WholeRun` are plain counters (tested without Streamlit);
:func:`items_bar` draws an ItemCount as a progress bar while the block under it runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import streamlit as st

from hydra_core.cache import model_fingerprint
from hydra_core.evaluate import predictions_cached
from hydra_ui.jobs import Job, format_seconds


class ItemCount:
    """Items predicted over several sets, counted as one wait: the share done and the time left
    at the rate so far. ``sizes``: the items of each set to predict (sets read from the cache
    left out: they take no time)."""

    def __init__(self, sizes: Mapping[str, int], clock: Callable[[], float] = time.monotonic):
        self.sizes = dict(sizes)
        self.total = sum(self.sizes.values())
        self.done = dict.fromkeys(self.sizes, 0)
        self.clock = clock
        self.started = clock()

    def update(self, name: str, done: int) -> None:
        if name in self.done:
            self.done[name] = min(done, self.sizes[name])

    @property
    def count(self) -> int:
        return sum(self.done.values())

    def fraction(self) -> float:
        return self.count / self.total if self.total else 1.0

    def elapsed(self) -> float:
        return self.clock() - self.started

    def seconds_left(self) -> float | None:
        """At the rate so far; None before the first batch."""
        if not self.count:
            return None
        return (self.total - self.count) * self.elapsed() / self.count

    def describe(self, what: str, noun: str) -> str:
        return (
            f"{what}: {self.count:,} of {self.total:,} {noun} · "
            f"{format_seconds(self.seconds_left())} left · {self.elapsed():.0f} s so far"
        )


def to_predict(cache, cache_parts: tuple, sets: Sequence, *, bf16: bool = False) -> dict[str, int]:
    """The items of each of ``sets`` whose predictions by the system ``cache_parts`` identify
    are not in ``cache`` (:func:`~hydra_core.evaluate.predictions_cached`), by set name."""
    return {
        s.name: len(s) for s in sets if not predictions_cached(cache, cache_parts, s, bf16=bf16)
    }


def card_to_predict(context, cache) -> dict[str, int]:
    """The report items the model card (:func:`~hydra_core.evaluate.model_card`) predicts, by
    set, those read from ``cache`` left out."""
    benchmark = context.benchmark
    parts = (model_fingerprint(context.loaded.model), None)  # the model, no head mask
    return to_predict(cache, parts, [benchmark.id_report, *benchmark.ood_report])


@contextmanager
def items_bar(
    what: str, sizes: Mapping[str, int], noun: str
) -> Iterator[Callable[[str, int, int], None] | None]:
    """A progress bar over the items of ``sizes`` while the block runs; yields the
    ``progress(set_name, done, total)`` callback to hand to the predictions (None, and no bar,
    when there is nothing to predict). The bar is removed when the block ends."""
    if not sum(sizes.values()):
        yield None
        return
    count = ItemCount(sizes)
    bar = st.progress(0.0, text=count.describe(what, noun))

    def progress(name: str, done: int, total: int) -> None:
        count.update(name, done)
        bar.progress(count.fraction(), text=count.describe(what, noun))

    try:
        yield progress
    finally:
        bar.empty()


class WholeRun:
    """A job made of stages counted as one run, each stage weighted by its estimated seconds:
    the job's share done and time left (:meth:`Job.eta_seconds`, at the rate so far) are those
    of the whole run, not of the stage under way.

    ``stages``: ``(name, seconds)`` in the order they run, ``name`` the stage's name as the
    work's ``progress(stage, done, total)`` gives it. A stage that reports nothing (its
    predictions read from the cache) counts as done when a later one reports; a stage not in
    the plan weighs nothing (the count stays where it was).
    """

    def __init__(self, job: Job, stages: Sequence[tuple[str, float]]) -> None:
        self.job = job
        self.names = [name for name, _ in stages]
        self.seconds = [max(0.0, float(s)) for _, s in stages]
        self.total = sum(self.seconds)
        self.current = 0
        self.done = 0.0
        job.begin(self.total)

    def units(self, stage: str, done: int, total: int) -> float:
        """The run's estimated seconds of work done at ``done`` of ``total`` of ``stage`` (never
        less than reported before)."""
        if stage in self.names[self.current :]:
            self.current = self.names.index(stage, self.current)
            share = min(1.0, done / total) if total else 1.0
            here = sum(self.seconds[: self.current]) + self.seconds[self.current] * share
            self.done = max(self.done, here)
        return self.done

    def report(self, payload, stage: str, done: int, total: int) -> None:
        self.job.report(payload, done=self.units(stage, done, total))


def whole_run_progress(
    job: Job, stages: Sequence[tuple[str, float]], label: Callable[[str, int, int], str]
) -> Callable[[str, int, int], None]:
    """A ``progress(stage, done, total)`` callback (hydra_core's long jobs made of stages) that
    publishes ``label(stage, done, total)`` as the job's progress and counts the work done over
    the whole run (:class:`WholeRun`), and ends the work at a stop: the time left the page
    shows is that of the whole run."""
    run = WholeRun(job, stages)

    def progress(stage: str, done: int, total: int) -> None:
        job.check()  # a stop ends the work here
        run.report(label(stage, done, total), stage, done, total)

    return progress
