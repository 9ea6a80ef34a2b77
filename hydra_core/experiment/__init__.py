"""Experiments: systems put side by side on one benchmark, and the pipeline every report runs.

- :mod:`~hydra_core.experiment.systems`: the :class:`System` protocol (``add_to(run)``,
  ``describe()``, ``chosen_on(run)``), :class:`SystemInfo`, the system kinds and names;
- :mod:`~hydra_core.experiment.run`: the :class:`Run` a system evaluates itself through;
- :mod:`~hydra_core.experiment.evaluate`: :func:`evaluate_systems` (every system on the report
  split, their cost, their intervals) and :func:`hydra_systems`, the usual list;
- :mod:`~hydra_core.experiment.results`: :class:`SystemsReport`, the results table of one
  experiment (metrics with paired intervals, cost, differences, repeats);
- :mod:`~hydra_core.experiment.pipeline`: the stages every report and sweep runs (load, search,
  prune, evaluate, repeat, write), with :mod:`~hydra_core.experiment.pruning` (head budgets, the
  Hydra variants' members), :mod:`~hydra_core.experiment.facts` (what a report's files record
  beside its tables) and :mod:`~hydra_core.experiment.stability` (the circuits' stability).

The concrete systems live beside their mechanism: :mod:`hydra_core.hydra.systems` (single,
pruned, Hydra) and :mod:`hydra_core.baselines` (Deep Ensembles, MC Dropout, temperature scaling,
the shared-backbone ensemble). ``systems`` and ``run`` sit below them in the layering (every
system builds on them); the rest of this package sits above them. Importing this package imports
none of its modules.
"""
