"""The System protocol: what :func:`~hydra_core.experiment.evaluate.evaluate_systems` puts side
by side on a benchmark's report split.

A *system* is a :class:`System` subclass with a :attr:`System.name` (its row in every table) and
:meth:`System.add_to`, which evaluates it through the :class:`~hydra_core.experiment.run.Run` it is
handed (the source model, the benchmark, where and how to predict) and records it with a
:class:`~hydra_core.experiment.run.SystemInfo` (its kind, heads and the models that make it up,
for the cost). Every system
says what data chose it (:meth:`System.chosen_on`), and ``evaluate_systems`` refuses to report it
on a set that shares an item with them (:class:`~hydra_core.data.provenance.ChosenOn`).

The concrete systems live beside their mechanism: Hydra's own (single, pruned, Hydra ensembles) in
:mod:`hydra_core.hydra.systems`, the baselines in :mod:`hydra_core.baselines`. A new system is one
small class there.
"""

from __future__ import annotations

from hydra_core.data.provenance import ChosenOn
from hydra_core.experiment.run import Run


class System:
    """One system of an experiment. Subclasses set :attr:`name` (the system's row in every
    table) and implement :meth:`add_to`."""

    name: str

    def add_to(self, run: Run) -> None:
        """Evaluate the system on ``run``'s report split and record it (``run.record``,
        ``run.add_model``, ...), or ``run.skipped[name] = reason`` when it does not apply."""
        raise NotImplementedError

    def describe(self) -> dict:
        """What the system is, for the report's setup (JSON-safe)."""
        return {"name": self.name}

    def chosen_on(self, run: Run) -> ChosenOn:
        """The items that chose this system (none: the source model as it is)."""
        return ChosenOn()
