"""The image report's repeats of its seeded systems (Table 12, the differences over repeats and the
paper's Table 1 statements with their verdicts)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from torch import nn

from hydra_core.baselines.deep_ensembles import DeepEnsemble
from hydra_core.data.benchmark import NAMED_SEARCH
from hydra_core.data.fashion_mnist import load_fashion_mnist
from hydra_core.experiment.pipeline import Pipeline
from hydra_core.experiment.pruning import Budgets
from hydra_core.experiment.results import SystemsReport, repeated_differences
from hydra_core.hydra.systems import Hydra, Pruned, Single
from hydra_core.report.image_claims import image_claims
from hydra_core.report.image_config import ReportConfig
from hydra_core.report.image_stages import DEEP_ENSEMBLES, DIFFERENCE_COLUMNS
from hydra_core.report.tables import (
    HYDRA_CIRC,
    HYDRA_CIRC_B5,
    HYDRA_CIRC_B5_FT,
    HYDRA_CIRC_FT,
    HYDRA_TAYLOR,
    HYDRA_TAYLOR_FT,
    fused,
)
from hydra_core.report.transfer import LeftOutSearch

#: the seeded systems Table 12 repeats, and the summary columns it reports
SEEDED_METRICS = ("accuracy", "nll", "ece", "near_auroc", "far_auroc", "all_auroc", "ood_mi")


def seeded_repeats(
    systems: SystemsReport | None,
    run: Pipeline,
    budgets: Budgets,
    config: ReportConfig,
    deep: Sequence[nn.Module] | None,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame] | None:
    """Table 12: every seeded system over ``config.repeats`` repeats, one row per repeat; every
    seeded system minus the single model (and, with Deep Ensembles, every Hydra minus Deep
    Ensembles) over the repeats, with the two-level interval (repeats, then report items) that
    the verdicts use; and the paper's Table 1 statements with those verdicts
    (:func:`~hydra_core.report.image_claims.image_claims`).

    Repeat 0 is the main run (its rows come from ``systems``). Repeat r > 0 changes every source
    of randomness together: another subsample of the search images (ID and search OOD; the same
    images in another order when ``n_search`` takes them all, which leaves the search unchanged),
    the three greedy searches (CircAcc, CircOOD, CircAvg) and the Taylor ranking on it, pruning
    seeds r*M .. r*M + M - 1, and fine-tuning batch order r. The report images stay the same, so
    the spread is the seeds' alone. Each repeat's systems are taken as chosen on its own search
    subsample (the guard of ``evaluate_systems`` checks them against the report items).

    Under ``torchrun`` the processes share the repeats (:meth:`Pipeline.repeats`); a process other
    than rank 0 gives ``systems`` None, runs its share into the cache and returns None."""
    from hydra_core.data.ood import OOD_SETS, load_ood_set

    benchmark = run.benchmark
    m, b, n = len(config.seeds), config.batch_size, config.taylor_samples
    labels = [(HYDRA_CIRC, HYDRA_CIRC_FT), (HYDRA_CIRC_B5, HYDRA_CIRC_B5_FT)]
    labels.append((HYDRA_TAYLOR, HYDRA_TAYLOR_FT))
    families = [fused(label) for label, _ in labels] + ["CircAvg", "Taylor"]
    if config.finetune is not None:
        families += [fused(tuned) for _, tuned in labels]
    rows, reports = [], [systems]
    if systems is not None:
        main = systems.summary().set_index("system")
        rows = [{"repeat": 0, "system": f, **main.loc[f, list(SEEDED_METRICS)]} for f in families]
    train_set = load_fashion_mnist("train") if config.finetune is not None else None

    def pools() -> tuple:  # the ID search pool, one pool per OOD search set
        named = benchmark.protocol in NAMED_SEARCH
        ood = [
            load_ood_set(s.name) if s.name in OOD_SETS and named else s
            for s in benchmark.ood_search
        ]
        return load_fashion_mnist("validation"), ood

    stability = (budgets.budget, config.stability_resamples)
    shared = LeftOutSearch.of(config).shared(run, budgets, benchmark)  # the transfer table's
    repeats = run.search_repeats(
        config.repeats, benchmark, config.n_search, pools, stability=stability, shared=shared
    )
    for r, sub, inputs in repeats:
        seeds = [r * m + i for i in range(m)]
        pruning = run.circuits_and_members(
            budgets,
            seeds,
            taylor_samples=n,
            batch_size=b,
            search_batch_size=b,
            inputs=inputs,
            repeat=f", repeat {r}",
        )
        members, taylor = pruning.members, pruning.taylor
        repeat = [
            Single(),
            Pruned("CircAvg", pruning.circavg.keep),
            Pruned("Taylor", taylor.keep),
            *(Hydra(members[label], label) for label, _ in labels),
            *([] if deep is None else [DeepEnsemble(deep)]),
        ]
        if config.finetune is not None:
            for label, tuned in labels:
                ft_seeds = [r] * m
                repeat.append(Hydra(members[label], tuned, config.finetune, ft_seeds, train_set))
        found = run.evaluate(repeat, batch_size=config.batch_size, benchmark=sub)
        reports.append(found)
        summary = found.summary().set_index("system")
        rows += [
            {"repeat": r, "system": f, **summary.loc[f, list(SEEDED_METRICS)]} for f in families
        ]
    if systems is None:
        return None
    over = repeated_differences(reports, families, "single", DIFFERENCE_COLUMNS)
    if deep is not None:
        hydras = [f for f in families if f.startswith("Hydra")]
        against = repeated_differences(reports, hydras, DEEP_ENSEMBLES, DIFFERENCE_COLUMNS)
        over = pd.concat(
            [over.assign(reference="single"), against.assign(reference=DEEP_ENSEMBLES)]
        )
    else:
        over = over.assign(reference="single")
    return pd.DataFrame(rows), over, image_claims(reports)
