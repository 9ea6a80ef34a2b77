"""Head analyses: greedy circuit extraction, importance maps, per-head representations, CAHP."""

from hydra_core.analysis.cahp import CAHPResult, cahp_select, jeffries_matusita_profiles
from hydra_core.analysis.compare import spearman, spearman_matrix
from hydra_core.analysis.greedy import (
    GreedyResult,
    GreedyStep,
    batched_auroc,
    greedy_cache_key,
    greedy_circuit,
    single_head_importance,
)
from hydra_core.analysis.representations import (
    centroid_distances,
    distance_table_dense_vs_circuit,
    head_cls_features,
    most_and_least_important,
    project_features,
)
from hydra_core.analysis.taylor import TaylorResult, taylor_prune, taylor_scores

__all__ = [
    "CAHPResult",
    "GreedyResult",
    "GreedyStep",
    "TaylorResult",
    "batched_auroc",
    "cahp_select",
    "centroid_distances",
    "distance_table_dense_vs_circuit",
    "greedy_cache_key",
    "greedy_circuit",
    "head_cls_features",
    "jeffries_matusita_profiles",
    "most_and_least_important",
    "project_features",
    "single_head_importance",
    "spearman",
    "spearman_matrix",
    "taylor_prune",
    "taylor_scores",
]
