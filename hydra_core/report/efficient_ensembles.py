"""The paper's efficient ensembles in the image and text reports: the stored copies a report looks
for (:func:`efficient_systems`; a report never trains one), what its setup records of them
(:func:`efficient_facts`), the setup's lines in ``report.md`` (:func:`efficient_lines`), and the
split of ``paper_claims.csv`` into the statements judged over the repeats and those about the
efficient ensembles, judged on repeat 0 alone (:func:`judged`: one stored copy each, not seeded per
repeat)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from hydra_core.baselines import efficient
from hydra_core.baselines.deep_ensembles import reference_checkpoint
from hydra_core.baselines.systems import EfficientBaseline
from hydra_core.zoo.default import DEFAULT_CHECKPOINT

if TYPE_CHECKING:
    from hydra_core.experiment.pipeline import Pipeline
    from hydra_core.experiment.results import SystemsReport

#: ``judged_on``: how a statement's interval was formed
OVER_REPEATS = "repeats: mean, two-level interval (repeats, then report items)"
REPEAT_0 = (
    "repeat 0: paired bootstrap over the report items (one stored copy, not seeded per repeat)"
)


def check_efficient(methods: Sequence[str]) -> None:
    """A ValueError naming the unknown efficient ensembles of ``methods`` and the choices."""
    unknown = [m for m in methods if m not in efficient.NAMES]
    if unknown:
        raise ValueError(
            f"efficient: unknown efficient ensemble(s) {', '.join(map(repr, unknown))}; "
            f"choose from {', '.join(efficient.NAMES)}"
        )


def efficient_systems(config, run: Pipeline) -> list[EfficientBaseline]:
    """The efficient ensembles ``config.efficient`` names, each loaded from its copy of
    ``config.model`` stored under the run's cache (``<cache>/efficient_ensembles``), never
    trained: one that is not stored is left out by the system, its reason in the run's
    ``skipped``."""
    reference = reference_checkpoint(config.model)
    root = Path(run.cache.root) / efficient.FOLDER
    return [EfficientBaseline(m, reference, train=False, root=root) for m in config.efficient]


def efficient_facts(config, systems: SystemsReport) -> dict:
    """``setup["efficient_ensembles"]``: the ensembles ``config.efficient`` looked for, those in
    the tables, and per one left out why and the command that trains it for ``config.model``
    (None where none can: Packed-Ensembles and MIMO follow a Hydra Lab checkpoint's recipe)."""
    skipped = systems.setup.get("skipped", {})
    reference = reference_checkpoint(config.model)
    has_recipe = reference is not None
    model = None if reference == DEFAULT_CHECKPOINT else config.model  # the default: no flag
    not_run = {}
    for method in config.efficient:
        name = efficient.NAMES[method]
        if name in systems.info:
            continue
        trainable = method not in efficient.FROM_SCRATCH or has_recipe
        not_run[name] = {
            "method": method,
            "reason": skipped.get(name, "not evaluated"),
            "command": efficient.train_command(method, model=model) if trainable else None,
        }
    return {
        "looked_for": list(config.efficient),
        "included": [
            efficient.NAMES[m] for m in config.efficient if efficient.NAMES[m] in systems.info
        ],
        "not_run": not_run,
    }


def efficient_lines(facts: dict | None, which: str) -> list[str]:
    """The setup's lines: which efficient ensembles are in the tables (``which``: the paper's
    ones, in words), and one line per one not run, with the command that trains it (a report
    loads stored copies only, it never trains one)."""
    if not facts or not facts["looked_for"]:
        return []
    included = ", ".join(facts["included"]) or "none"
    lines = [
        f"- **Efficient ensembles** ({which}): in the tables: {included}. The report loads their "
        "stored trained copies and never trains one."
    ]
    for name, why in facts["not_run"].items():
        if why["command"]:
            lines.append(
                f"- **{name}**: not run, no trained copy is stored; train it with "
                f"`{why['command']}` and run the report again."
            )
        else:
            lines.append(f"- **{name}**: not run: {why['reason']}.")
    return lines


def judged(claims: pd.DataFrame | None, repeat_0: bool) -> pd.DataFrame | None:
    """The statements judged on repeat 0 alone (the efficient ensembles'), or the others."""
    if claims is None or "judged_on" not in claims:
        return None if repeat_0 else claims
    return claims[(claims["judged_on"] == REPEAT_0) == repeat_0]
