"""Uncertainty metrics of Hydra Lab (docs/metrics.md): classification and
calibration, OOD detection, OOD scores, ensemble diversity.

Conventions shared by every metric:

- Inputs are numpy arrays or torch tensors of any float dtype on any device; everything is
  computed in float64. Metrics return Python floats; per-sample values (OOD scores, diversity with
  ``reduction="none"``) are float64 numpy arrays.
- Classification: ``name(probs, labels, *, ...)`` with ``probs`` (N, C), ``labels`` (N,) int. An
  ensemble's probabilities are the mean of its members' softmax probabilities.
- OOD: ``name(id_scores, ood_scores)``, higher score = more in-distribution (MSP by default); OOD
  is the positive class, as in OpenOOD. ``fpr_at_95_tpr_id`` is the classic ID-positive variant.
- Diversity: ``name(member_probs, *, reduction="mean")`` with ``member_probs`` (N, M, C).
- Undefined cases (no samples, only ID or only OOD samples, fewer than two members for
  disagreement) warn with :class:`UndefinedMetricWarning` and return NaN; they never raise.
- Bad input (shape mismatch, rows of probabilities that do not sum to 1, labels out of range,
  NaN, wrong ndim) raises ValueError naming the problem.

The exact definitions are in each module's docstring. :data:`METRICS` lists every scalar metric
with its kind and direction, for code (and tests) that treat metrics generically.

Intervals (:mod:`hydra_core.metrics.bootstrap`): 95% percentile bootstrap, stratified (ID within
each class, each OOD set within itself) and paired between systems on the same images.
``bootstrap_interval(statistic, *data, strata=...)`` and ``paired_difference(statistic, data_a,
data_b, strata=...)`` work for any statistic; ``classification_replicates``, ``ood_replicates``
and ``mean_replicates`` compute the metrics above on all resamples at once (equal to the plain
metrics on the resampled data).

Temperature scaling (:mod:`hydra_core.metrics.temperature`): ``fit_temperature(logits, labels)``
minimises the NLL of ``softmax(logits / T)`` over T > 0 on held-out data; ``apply_temperature``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from hydra_core.metrics._validation import UndefinedMetricWarning
from hydra_core.metrics.bootstrap import (
    BootstrapConfig,
    Resamples,
    bootstrap_interval,
    bootstrap_replicates,
    classification_replicates,
    item_variance_parts,
    mean_replicates,
    ood_replicates,
    ood_replicates_per_set,
    paired_difference,
    percentile_interval,
    repeat_interval,
    stratified_counts,
    stratified_indices,
    two_level_interval,
)
from hydra_core.metrics.classification import (
    accuracy,
    adaptive_ece,
    brier,
    classification_metrics,
    ece,
    log_p_true,
    nll,
    reliability_curve,
)
from hydra_core.metrics.diversity import disagreement, diversity_metrics, mutual_information
from hydra_core.metrics.ood import (
    aupr_in,
    aupr_out,
    auroc,
    fpr_at_95,
    fpr_at_95_tpr_id,
    ood_metrics,
    roc_curve_ood,
)
from hydra_core.metrics.scores import (
    SCORE_METHODS,
    energy,
    max_logit,
    msp,
    neg_entropy,
    ood_score,
)
from hydra_core.metrics.temperature import apply_temperature, fit_temperature, temperature_nll

MetricKind = Literal["classification", "ood", "diversity"]


@dataclass(frozen=True)
class MetricInfo:
    """A scalar metric and how to read it.

    Args:
        fn: the metric; its arguments follow from ``kind``: (probs, labels), (id_scores,
            ood_scores) or (member_probs).
        kind: "classification", "ood" or "diversity".
        higher_is_better: True or False; None where neither direction is better (diversity).
    """

    fn: Callable[..., float]
    kind: MetricKind
    higher_is_better: bool | None


#: Every scalar metric by name.
METRICS: dict[str, MetricInfo] = {
    "accuracy": MetricInfo(accuracy, "classification", True),
    "nll": MetricInfo(nll, "classification", False),
    "brier": MetricInfo(brier, "classification", False),
    "ece": MetricInfo(ece, "classification", False),
    "adaptive_ece": MetricInfo(adaptive_ece, "classification", False),
    "auroc": MetricInfo(auroc, "ood", True),
    "fpr_at_95": MetricInfo(fpr_at_95, "ood", False),
    "aupr_in": MetricInfo(aupr_in, "ood", True),
    "aupr_out": MetricInfo(aupr_out, "ood", True),
    "fpr_at_95_tpr_id": MetricInfo(fpr_at_95_tpr_id, "ood", False),
    "mutual_information": MetricInfo(mutual_information, "diversity", None),
    "disagreement": MetricInfo(disagreement, "diversity", None),
}

__all__ = [
    "METRICS",
    "SCORE_METHODS",
    "BootstrapConfig",
    "MetricInfo",
    "Resamples",
    "UndefinedMetricWarning",
    "accuracy",
    "adaptive_ece",
    "apply_temperature",
    "aupr_in",
    "aupr_out",
    "auroc",
    "bootstrap_interval",
    "bootstrap_replicates",
    "brier",
    "classification_metrics",
    "classification_replicates",
    "disagreement",
    "diversity_metrics",
    "ece",
    "energy",
    "fit_temperature",
    "fpr_at_95",
    "fpr_at_95_tpr_id",
    "max_logit",
    "mean_replicates",
    "msp",
    "mutual_information",
    "neg_entropy",
    "log_p_true",
    "nll",
    "ood_metrics",
    "ood_replicates",
    "ood_replicates_per_set",
    "ood_score",
    "paired_difference",
    "percentile_interval",
    "reliability_curve",
    "roc_curve_ood",
    "stratified_counts",
    "stratified_indices",
    "item_variance_parts",
    "repeat_interval",
    "two_level_interval",
    "temperature_nll",
]
