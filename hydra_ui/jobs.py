"""Long work in a background thread, so a page stays responsive while it runs.

A :class:`Job` runs ``work(job)`` in a daemon thread. The work reports progress with
:meth:`Job.report` and polls :meth:`Job.should_stop` between steps (hydra_core's long functions take
``progress`` and ``should_stop`` callbacks for exactly this). The page keeps the job in its session
state and redraws from ``job.progress`` on a timer; nothing here touches Streamlit, so jobs can be
tested directly.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

RUNNING, DONE, STOPPED, FAILED = "running", "done", "stopped", "failed"


class Cancelled(Exception):
    """Raised by :meth:`Job.check` when a stop was asked: ends work that has a progress callback
    but no ``should_stop`` of its own."""


class Job:
    """One piece of work running in a background thread.

    Attributes:
        name: what the page calls it.
        status: ``"running"``, then ``"done"``, ``"stopped"`` (stop was asked and the work returned)
            or ``"failed"`` (the work raised; see ``error``).
        progress: the latest payload given to :meth:`report` (e.g. a GreedyStep).
        result: what ``work`` returned.
        error: the exception ``work`` raised, if it failed.
        info: what the page wants to remember about the job (its settings, for display).
    """

    def __init__(self, name: str, work: Callable[[Job], Any], info: dict | None = None) -> None:
        self.name = name
        self.info = dict(info or {})
        self.status = RUNNING
        self.progress: Any = None
        self.result: Any = None
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.finished: float | None = None
        self._work = work
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._done = self._total = 0.0
        self._base = 0.0  # work already done when the count began (a resumed run)
        self._since = self.started  # when the count began
        self._steps: list[float] | None = None  # the size of every step, for work done in steps
        self._timed: list[tuple[float, float]] = []  # (seconds, size) of the steps timed here
        self._steps_done = 0
        self._last = self.started  # when the latest step ended
        # the job's messages speak to the app's user, as the page that started it does
        run = contextvars.copy_context().run
        self._thread = threading.Thread(
            target=lambda: run(self._run), name=f"hydra-job-{name}", daemon=True
        )

    def _run(self) -> None:
        try:
            self.result = self._work(self)
            status = STOPPED if self._stop.is_set() else DONE
        except Cancelled:
            status = STOPPED
        except Exception as exc:  # noqa: BLE001 - the page shows it as a message
            self.error, status = exc, FAILED
        self.finished = time.monotonic()
        self.status = status

    # --- used by the work -------------------------------------------------------------------------

    def should_stop(self) -> bool:
        return self._stop.is_set()

    def check(self) -> None:
        """Raise :class:`Cancelled` if a stop was asked (call it from a progress callback)."""
        if self._stop.is_set():
            raise Cancelled

    def begin(self, total: float, done: float = 0.0) -> None:
        """Declare how much work there is (in any unit) and how much of it is already done; the
        time left is estimated from the rate since this call. Call it again for each stage of
        work that comes in stages."""
        with self._lock:
            self._total, self._done, self._base = float(total), float(done), float(done)
            self._since = time.monotonic()
            self._steps = None

    def begin_steps(self, sizes: Sequence[float], done: int = 0) -> None:
        """Declare work made of steps whose cost grows with a known size (a greedy search step
        costs about one candidate evaluation per head left, so its steps get cheaper as it goes),
        of which the first ``done`` are already done. Report finished steps with
        ``report(..., steps=n)``; the time left is then :func:`time_left` of the steps timed."""
        with self._lock:
            self._steps = [float(s) for s in sizes]
            self._steps_done = done
            self._timed = []
            self._total = sum(self._steps)
            self._done = self._base = sum(self._steps[:done])
            self._since = self._last = time.monotonic()

    def report(
        self,
        payload: Any = None,
        *,
        done: float | None = None,
        total: float | None = None,
        steps: int | None = None,
    ) -> None:
        """Publish the latest progress (``payload``) and, optionally, the work done so far and
        the total (for work that learns its total as it goes), or the number of steps done (for
        work declared with :meth:`begin_steps`)."""
        with self._lock:
            self.progress = payload
            if done is not None:
                self._done = float(done)
            if total is not None:
                self._total = float(total)
            if steps is not None and self._steps is not None and steps > self._steps_done:
                now = time.monotonic()
                size = sum(self._steps[self._steps_done : steps])
                self._timed.append((now - self._last, size))
                self._steps_done, self._last = steps, now
                self._done = sum(self._steps[:steps])

    # --- used by the page -------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.status == RUNNING

    def stop(self) -> None:
        """Ask the work to stop at its next check; it returns what it has."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self.running and self._stop.is_set()

    def fraction(self) -> float:
        """Share of the declared work done, 0..1 (0 before :meth:`begin`)."""
        with self._lock:
            return min(1.0, self._done / self._total) if self._total > 0 else 0.0

    def elapsed(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    def eta_seconds(self) -> float | None:
        """Seconds left: for work in steps (:meth:`begin_steps`), from the cost of the latest
        steps and the sizes of the steps left, counting down while a step runs; otherwise at the
        rate since :meth:`begin`. None until some work is reported."""
        with self._lock:
            if self._steps is not None:
                left = self._steps[self._steps_done :]
                return time_left(self._timed, left, time.monotonic() - self._last)
            done_here = self._done - self._base
            left = self._total - self._done
            since = self._since
        if done_here <= 0 or self._total <= 0:
            return None
        return max(0.0, left) * (time.monotonic() - since) / done_here

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the work has returned (True) or ``timeout`` seconds passed (False)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()


def time_left(
    timed: Sequence[tuple[float, float]],
    sizes_left: Sequence[float],
    into_step: float = 0.0,
    *,
    recent: int = 3,
) -> float | None:
    """Seconds left of work done in steps whose cost grows with their size.

    Args:
        timed: ``(seconds, size)`` of the steps done so far, in order.
        sizes_left: the size of each step still to do, the one under way first.
        into_step: seconds already spent on the step under way.
        recent: the cost per unit of size is that of the last ``recent`` steps (a search's
            early steps, slower per candidate, stop counting as it goes).

    Returns the cost per unit times the sizes left, less ``into_step`` (the step under way never
    counts below 0, so the estimate falls while a step runs and never grows because time passed);
    None before any step was timed.
    """
    if not timed:
        return None
    chosen = timed[-recent:]
    units = sum(size for _, size in chosen)
    if units <= 0:
        return None
    per_unit = sum(seconds for seconds, _ in chosen) / units
    if not sizes_left:
        return 0.0
    current, *later = sizes_left
    return max(0.0, per_unit * current - into_step) + per_unit * sum(later)


def start_job(name: str, work: Callable[[Job], Any], info: dict | None = None) -> Job:
    """Start ``work(job)`` in a background thread and return the job at once."""
    job = Job(name, work, info)
    job._thread.start()
    return job


def staged_progress(
    job: Job, label: Callable[[str, int, int], str]
) -> Callable[[str, int, int], None]:
    """A ``progress(stage, done, total)`` callback (hydra_core's long jobs made of stages) that
    publishes ``label(stage, done, total)`` as the job's progress, restarts the count at each new
    stage (the time left is then the stage's) and ends the work at a stop."""
    current = {"stage": None}

    def progress(stage: str, done: int, total: int) -> None:
        job.check()  # a stop ends the work here
        if stage != current["stage"]:
            current["stage"] = stage
            job.begin(total)
        job.report(label(stage, done, total), done=done, total=total)

    return progress


def format_seconds(seconds: float | None) -> str:
    """``75`` -> ``"1 min 15 s"``; None -> ``"estimating..."``."""
    if seconds is None:
        return "estimating..."
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"
