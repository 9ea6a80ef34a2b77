"""OOD detection metrics: AUROC, FPR@95, AUPR-In, AUPR-Out, and the classic FPR@95TPR.

Conventions (docs/metrics.md):

- Signature ``name(id_scores, ood_scores)``: one score per sample, shape (N,), where a **higher
  score means more in-distribution** (MSP by default; see :mod:`hydra_core.metrics.scores`).
- Inputs may be numpy arrays or torch tensors of any float dtype on any device; everything is
  computed in float64 and returned as a Python float. NaN or wrong ndim raise ValueError.
- With no ID or no OOD samples every metric warns with ``UndefinedMetricWarning`` and returns NaN.
- Following OpenOOD, **OOD is the positive class**: a sample is flagged OOD when its score is at or
  below a threshold.

Definitions:

- ``auroc``: P(score_ood < score_id) + 0.5 P(score_ood == score_id), the area under the ROC curve
  with OOD positive (equal to sklearn's ``roc_auc_score(is_ood, -score)``). Higher is better.
- ``fpr_at_95``: the share of ID samples flagged OOD at the first threshold (walking from the
  lowest score up) where at least 95% of OOD samples are caught. This is OpenOOD's
  ``fpr[argmax(tpr >= 0.95)]`` over ``roc_curve(is_ood, -score)``, evaluated at *every* distinct
  threshold. OpenOOD calls ``roc_curve`` with its default ``drop_intermediate=True``, which drops
  collinear points; with tied ID/OOD scores that can skip the first threshold reaching 95% and
  report a higher FPR. Without ties both agree. Lower is better.
- ``aupr_in``: average precision with ID as the positive class and the score as is; ``aupr_out``:
  average precision with OOD positive and the negated score. Both use sklearn's step-wise
  definition ``sum_k (R_k - R_{k-1}) P_k`` over distinct thresholds (``average_precision_score``),
  not the trapezoidal area. Higher is better.
- ``fpr_at_95_tpr_id``: the classic Hendrycks FPR@95TPR with **ID positive**: the share of OOD
  samples accepted as ID at the first threshold (walking from the highest score down) where at
  least 95% of ID samples are accepted. Lower is better.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hydra_core.metrics._validation import check_scores, undefined

#: The recall level of FPR@95.
RECALL_LEVEL = 0.95


def _checked(metric: str, id_scores: Any, ood_scores: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """Validated (id_scores, ood_scores), or None after warning when either set is empty."""
    s_id, s_ood = check_scores(id_scores, "id_scores"), check_scores(ood_scores, "ood_scores")
    if len(s_id) == 0 or len(s_ood) == 0:
        undefined(
            metric, f"it needs both ID and OOD samples, got {len(s_id)} ID and {len(s_ood)} OOD"
        )
        return None
    return s_id, s_ood


def _counts(positive: np.ndarray, negative: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(false positives, true positives) when every sample scoring >= t is called positive, for each
    distinct score t in decreasing order, preceded by (0, 0). Both must be non-empty."""
    scores = np.concatenate([positive, negative])
    is_positive = np.r_[np.ones(len(positive)), np.zeros(len(negative))]
    order = np.argsort(-scores, kind="stable")
    scores, is_positive = scores[order], is_positive[order]
    last_of_each_value = np.r_[np.flatnonzero(scores[1:] != scores[:-1]), len(scores) - 1]
    tps = np.cumsum(is_positive)[last_of_each_value]
    fps = last_of_each_value + 1 - tps
    return np.r_[0.0, fps], np.r_[0.0, tps]


def _ood_positive(s_id: np.ndarray, s_ood: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return _counts(-s_ood, -s_id)


def _id_positive(s_id: np.ndarray, s_ood: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return _counts(s_id, s_ood)


def _auroc(fps: np.ndarray, tps: np.ndarray) -> float:
    # The trapezoid over every distinct threshold counts a tie as half a correct pair.
    return float(np.trapezoid(tps / tps[-1], fps / fps[-1]))


def _fpr_at_recall(fps: np.ndarray, tps: np.ndarray) -> float:
    first = np.argmax(tps / tps[-1] >= RECALL_LEVEL)
    return float(fps[first] / fps[-1])


def _average_precision(fps: np.ndarray, tps: np.ndarray) -> float:
    precision = tps[1:] / (tps[1:] + fps[1:])
    return float(np.sum(np.diff(tps / tps[-1]) * precision))


def auroc(id_scores: Any, ood_scores: Any) -> float:
    """Area under the ROC curve, OOD positive: P(score_ood < score_id) + 0.5 P(tie)."""
    checked = _checked("auroc", id_scores, ood_scores)
    return _auroc(*_ood_positive(*checked)) if checked else float("nan")


def fpr_at_95(id_scores: Any, ood_scores: Any) -> float:
    """OpenOOD's FPR@95: share of ID samples flagged OOD when 95% of OOD samples are caught."""
    checked = _checked("fpr_at_95", id_scores, ood_scores)
    return _fpr_at_recall(*_ood_positive(*checked)) if checked else float("nan")


def aupr_in(id_scores: Any, ood_scores: Any) -> float:
    """Average precision (step-wise, as sklearn) with ID as the positive class."""
    checked = _checked("aupr_in", id_scores, ood_scores)
    return _average_precision(*_id_positive(*checked)) if checked else float("nan")


def aupr_out(id_scores: Any, ood_scores: Any) -> float:
    """Average precision (step-wise, as sklearn) with OOD as the positive class (score negated)."""
    checked = _checked("aupr_out", id_scores, ood_scores)
    return _average_precision(*_ood_positive(*checked)) if checked else float("nan")


def fpr_at_95_tpr_id(id_scores: Any, ood_scores: Any) -> float:
    """Hendrycks' FPR@95TPR, ID positive: share of OOD samples accepted as ID when 95% of ID
    samples are accepted."""
    checked = _checked("fpr_at_95_tpr_id", id_scores, ood_scores)
    return _fpr_at_recall(*_id_positive(*checked)) if checked else float("nan")


def ood_metrics(id_scores: Any, ood_scores: Any) -> dict[str, float]:
    """All OOD metrics at once (inputs checked and sorted once per positive class): keys auroc,
    fpr95, aupr_in, aupr_out, fpr95_tpr_id."""
    checked = _checked("ood metrics", id_scores, ood_scores)
    if checked is None:
        return dict.fromkeys(
            ("auroc", "fpr95", "aupr_in", "aupr_out", "fpr95_tpr_id"), float("nan")
        )
    ood_positive, id_positive = _ood_positive(*checked), _id_positive(*checked)
    return {
        "auroc": _auroc(*ood_positive),
        "fpr95": _fpr_at_recall(*ood_positive),
        "aupr_in": _average_precision(*id_positive),
        "aupr_out": _average_precision(*ood_positive),
        "fpr95_tpr_id": _fpr_at_recall(*id_positive),
    }


def roc_curve_ood(id_scores: Any, ood_scores: Any) -> tuple[np.ndarray, np.ndarray]:
    """ROC curve data with OOD positive (no plotting): (fpr, tpr) at every distinct threshold,
    starting at (0, 0) and ending at (1, 1). Empty arrays, with a warning, when either set is
    empty."""
    checked = _checked("roc_curve_ood", id_scores, ood_scores)
    if checked is None:
        return np.empty(0), np.empty(0)
    fps, tps = _ood_positive(*checked)
    return fps / fps[-1], tps / tps[-1]
