"""Long work in a background thread, so a page stays responsive while it runs.

A :class:`Job` runs ``work(job)`` in a daemon thread. The work reports progress with
:meth:`Job.report` and polls :meth:`Job.should_stop` between steps (hydra_core's long functions take
``progress`` and ``should_stop`` callbacks for exactly this). The page keeps the job in its session
state and redraws from ``job.progress`` on a timer; nothing here touches Streamlit, so jobs can be
tested directly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
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
        self._thread = threading.Thread(target=self._run, name=f"hydra-job-{name}", daemon=True)

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

    def report(
        self, payload: Any = None, *, done: float | None = None, total: float | None = None
    ) -> None:
        """Publish the latest progress (``payload``) and, optionally, the work done so far and
        the total (for work that learns its total as it goes)."""
        with self._lock:
            self.progress = payload
            if done is not None:
                self._done = float(done)
            if total is not None:
                self._total = float(total)

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
        """Seconds left at the rate since :meth:`begin`; None until some work is reported."""
        with self._lock:
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


def start_job(name: str, work: Callable[[Job], Any], info: dict | None = None) -> Job:
    """Start ``work(job)`` in a background thread and return the job at once."""
    job = Job(name, work, info)
    job._thread.start()
    return job


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
