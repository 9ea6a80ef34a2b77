"""The report's tables: rows and columns picked from the evaluated systems and searches.

Each table is a DataFrame named as its CSV (``table4_zero_shot`` and so on); the numbers are the
ones :class:`~hydra_core.experiment.results.SystemsReport` computed, only selected and ordered here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from hydra_core.baselines.efficient import NAMES as EFFICIENT_NAMES
from hydra_core.evaluate import interval_columns
from hydra_core.experiment.pruning import HYDRA_CIRC, HYDRA_CIRC_B5, HYDRA_TAYLOR
from hydra_core.experiment.run import system_name
from hydra_core.hydra.members import CIRCUIT_NAMES

if TYPE_CHECKING:
    from hydra_core.analysis.greedy import GreedyResult
    from hydra_core.experiment.results import SystemsReport

#: the ensembles the report evaluates, by label (rows are named through ``system_name``)
HYDRA_IDENTICAL = "Hydra (Circ, identical members)"
HYDRA_CIRC_FT = f"{HYDRA_CIRC}, fine-tuned"
HYDRA_CIRC_B5_FT = f"{HYDRA_CIRC_B5}, fine-tuned"
HYDRA_TAYLOR_FT = f"{HYDRA_TAYLOR}, fine-tuned"
HYDRA_IDENTICAL_FT = f"{HYDRA_IDENTICAL}, fine-tuned"
HYDRA_IDENTICAL_ORDER_FT = f"{HYDRA_IDENTICAL}, batch order varied, fine-tuned"


def fused(label: str) -> str:
    """The row of the fused Hydra model of the ensemble ``label``."""
    return system_name(label, "fused")


OOD_METRICS = ("auroc", "fpr95", "aupr_in", "aupr_out")
#: the OOD metrics averaged over the near and the far OOD sets
NEAR_FAR = tuple(f"{g}_{m}" for g in ("near", "far") for m in OOD_METRICS)


def report_tables(
    systems: SystemsReport,
    table5: pd.DataFrame,
    circuits: Mapping[str, GreedyResult],
    deep: bool,
    finetuned: Sequence[str],
) -> dict[str, pd.DataFrame]:
    """Every table of the report, by CSV name, from the evaluated systems and searches.

    Args:
        systems: every evaluated system (zero-shot and fine-tuned), with costs measured.
        table5: the centroid distances, passed through as Table 5.
        circuits: the greedy search results by objective (``avg``, ``acc``, ``ood``).
        deep: whether the systems include Deep Ensembles.
        finetuned: labels of the fine-tuned Hydra variants in ``systems`` (empty when zero-shot).

    Tables pick their rows by system name and skip the ones that were not evaluated, so a
    zero-shot run or one without Deep Ensembles or an efficient ensemble gives the same tables
    minus those rows.
    """
    summary = systems.summary().set_index("system")
    return {
        "table4_zero_shot": _pick(
            _rows(summary, ["single", "Taylor", "CircAvg"]),
            ["system", "heads", "accuracy", "ece", *NEAR_FAR],
        ),
        "table5_distances": table5,
        "table6_circuits": _pick(
            _rows(summary, ["CircOOD", "CircAcc"]),
            ["system", "heads", "accuracy", *NEAR_FAR, *(f"all_{m}" for m in OOD_METRICS)],
        ),
        "table1_systems": _table1(summary, deep, finetuned),
        "table9_diversity": _table9(summary, deep, finetuned),
        "table11_fusion": _table11(systems, finetuned),
        "table7_cost": systems.cost.reset_index(),
        "circuits": circuits_table(circuits),
        "summary_all_systems": summary.reset_index(),
        "all_sets": systems.table(),
    }


def _pick(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """``columns`` of ``frame`` that it has, each metric followed by its interval (``_lo``,
    ``_hi``) where the frame carries one."""
    return frame[[c for c in interval_columns(columns) if c in frame]]


def _rows(summary: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """The summary rows of the named systems that were evaluated, in the order given."""
    return summary.loc[[n for n in names if n in summary.index]].reset_index()


def _table1(summary: pd.DataFrame, deep: bool, finetuned: Sequence[str]) -> pd.DataFrame:
    """Tables 1-2: the main systems on every metric."""
    main = ["single", "Taylor", "CircAvg"]
    main += [fused(HYDRA_TAYLOR), fused(HYDRA_CIRC), fused(HYDRA_CIRC_B5)]
    if deep:
        main.append("Deep Ensembles")
    main += list(EFFICIENT_NAMES.values())  # those whose stored copies were evaluated
    if HYDRA_CIRC_FT in finetuned:
        main += [
            "Taylor (fine-tuned)",
            "CircAvg (fine-tuned)",
            fused(HYDRA_TAYLOR_FT),
            fused(HYDRA_CIRC_FT),
            fused(HYDRA_CIRC_B5_FT),
        ]
    columns = [
        "system",
        "kind",
        "heads",
        "accuracy",
        "brier",
        "nll",
        "ece",
        "adaptive_ece",
        *(f"all_{m}" for m in OOD_METRICS),
        *NEAR_FAR,
        "id_mi",
        "id_di",
        "ood_mi",
        "ood_di",
    ]
    return _pick(_rows(summary, main), columns)


def _table9(summary: pd.DataFrame, deep: bool, finetuned: Sequence[str]) -> pd.DataFrame:
    """Table 9: diversity of members that differ by criterion (Hydra (Circ): one circuit per
    criterion), by pruning seed (the B.5 members of one ranking), by batch order, or by
    nothing."""
    diversity = [  # (system, pruning seed, batch order)
        ("CircAvg", "-", "-"),
        (fused(HYDRA_CIRC), "criterion", "-"),
        (fused(HYDRA_CIRC_B5), "varied", "-"),
        (fused(HYDRA_IDENTICAL), "fixed", "-"),
    ]
    if deep:
        diversity.insert(1, ("Deep Ensembles", "-", "-"))
    if finetuned:
        diversity += [
            (fused(HYDRA_CIRC_FT), "criterion", "fixed"),
            (fused(HYDRA_CIRC_B5_FT), "varied", "fixed"),
            (fused(HYDRA_IDENTICAL_ORDER_FT), "fixed", "varied"),
            (fused(HYDRA_IDENTICAL_FT), "fixed", "fixed"),
        ]
    table = _rows(summary, [d[0] for d in diversity])
    sources = {name: (seed, order) for name, seed, order in diversity}
    table.insert(1, "pruning_seed", [sources[n][0] for n in table["system"]])
    table.insert(2, "batch_order", [sources[n][1] for n in table["system"]])
    columns = ["system", "pruning_seed", "batch_order", "heads", "id_mi", "id_di", "ood_mi"]
    return _pick(table, [*columns, "ood_di", "accuracy", "all_auroc"])


def _table11(systems: SystemsReport, finetuned: Sequence[str]) -> pd.DataFrame:
    """Table 11: each Hydra variant fused and unfused, with the largest probability gap.

    The single model appears once, at the top; ``max_prob_diff`` is set on the fused rows only."""
    fusion = []
    labels = [HYDRA_CIRC, HYDRA_CIRC_B5, HYDRA_TAYLOR]
    labels += [f for f in finetuned if "identical" not in f]
    for label in labels:
        table = systems.fusion_table(label)
        gap = table.attrs["max_prob_diff"]
        for _, row in table.iterrows():
            if row["system"] == "single" and fusion:
                continue
            fused = row["kind"] == "fused"
            fusion.append({**row.to_dict(), "max_prob_diff": gap if fused else np.nan})
    return pd.DataFrame(fusion)[
        [
            "system",
            "heads",
            "accuracy",
            "brier",
            "nll",
            "ece",
            "adaptive_ece",
            "all_auroc",
            "all_fpr95",
            "all_aupr_in",
            "all_aupr_out",
            "ood_mi",
            "max_prob_diff",
        ]
    ]


def circuits_table(circuits: Mapping[str, GreedyResult]) -> pd.DataFrame:
    """One row per greedy search: its scores on the search split and the heads it removed."""
    return pd.DataFrame(
        [
            {
                "circuit": CIRCUIT_NAMES[o],
                "objective": o,
                "heads_removed": r.steps,
                "search_accuracy": r.accuracy[-1],
                "search_auroc": r.auroc[-1],
                "dense_search_accuracy": r.base_accuracy,
                "dense_search_auroc": r.base_auroc,
                "seconds": r.seconds,
                "removed": " ".join(r.labels()),
            }
            for o, r in circuits.items()
        ]
    )


def ood_gain_table(systems: SystemsReport, benchmark, names: Sequence[str]) -> pd.DataFrame:
    """Does each system's OOD gain hold under every score: for the systems ``names`` (Table 1's
    rows) and the unfused twin of each fused Hydra among them (the feature scores read per-model
    features, which a fused model has not), per OOD score of :data:`hydra_core.ood_scores.SCORES`
    the near- and far-OOD AUROC and its paired difference to the single model with the 95%
    interval (:func:`hydra_core.ood_scores.score_gains`). Feature scores are fitted on
    ``benchmark``'s ID search split."""
    from hydra_core.experiment.results import SystemsReport as Report
    from hydra_core.ood_scores import SCORES, rescore_report, score_gains

    chosen = [n for n in ["single", *names] if n in systems.evaluations]
    twins = {
        name: info
        for name, info in systems.info.items()
        if info.kind == "unfused" and name.replace("(unfused)", "(fused)") in chosen
    }
    chosen = list(dict.fromkeys([*chosen, *twins]))
    sub = Report(
        {n: systems.evaluations[n] for n in chosen},
        {n: systems.info[n] for n in chosen},
        systems.cost,
        systems.setup,
    )
    return score_gains(rescore_report(sub, SCORES, benchmark))
