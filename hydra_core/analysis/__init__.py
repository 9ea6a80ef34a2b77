"""Head analyses: greedy circuit extraction, importance maps, per-head representations, CAHP,
per-head evidence with intervals."""

from hydra_core.analysis.cahp import CAHPResult, cahp_select, jeffries_matusita_profiles
from hydra_core.analysis.compare import spearman, spearman_matrix
from hydra_core.analysis.evidence import HeadEvidence, head_evidence, read_stability
from hydra_core.analysis.greedy import (
    GreedyResult,
    GreedyStep,
    batched_auroc,
    greedy_cache_key,
    greedy_circuit,
    load_greedy,
    saved_searches,
    single_head_importance,
)
from hydra_core.analysis.importance import (
    ImportanceMap,
    ImportanceMaps,
    greedy_importance,
    importance_maps,
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
    "HeadEvidence",
    "ImportanceMap",
    "ImportanceMaps",
    "TaylorResult",
    "batched_auroc",
    "cahp_select",
    "centroid_distances",
    "distance_table_dense_vs_circuit",
    "greedy_cache_key",
    "greedy_circuit",
    "greedy_importance",
    "head_evidence",
    "head_cls_features",
    "importance_maps",
    "jeffries_matusita_profiles",
    "load_greedy",
    "most_and_least_important",
    "project_features",
    "read_stability",
    "saved_searches",
    "single_head_importance",
    "spearman",
    "spearman_matrix",
    "taylor_prune",
    "taylor_scores",
]
