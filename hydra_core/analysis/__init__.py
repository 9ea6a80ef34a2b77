"""Head analyses: greedy circuit extraction, importance maps, per-head representations, CAHP,
per-head evidence with intervals.

The names below are imported on first use (as :mod:`hydra_core`'s are), so that importing one
module of the package, as the command line does, does not import every analysis's libraries."""

from __future__ import annotations

from hydra_core.lazy import lazy_exports

_EXPORTS = {
    "hydra_core.analysis.cahp": (
        "CAHPResult",
        "cahp_select",
        "jeffries_matusita_profiles",
    ),
    "hydra_core.analysis.greedy": (
        "GreedyResult",
        "GreedyStep",
        "batched_auroc",
        "greedy_cache_key",
        "greedy_circuit",
        "load_greedy",
        "saved_searches",
        "single_head_importance",
    ),
    "hydra_core.analysis.evidence": (
        "HeadEvidence",
        "head_evidence",
        "read_stability",
    ),
    "hydra_core.analysis.importance": (
        "ImportanceMap",
        "ImportanceMaps",
        "greedy_importance",
        "importance_maps",
    ),
    "hydra_core.analysis.taylor": (
        "TaylorResult",
        "taylor_prune",
        "taylor_scores",
    ),
    "hydra_core.analysis.representations": (
        "centroid_distances",
        "distance_table_dense_vs_circuit",
        "head_cls_features",
        "most_and_least_important",
        "project_features",
    ),
    "hydra_core.analysis.compare": (
        "spearman",
        "spearman_matrix",
    ),
}
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
