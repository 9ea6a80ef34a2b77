"""Classification and calibration metrics: accuracy, NLL, Brier, ECE, adaptive ECE.

Conventions (docs/metrics.md):

- Signature ``name(probs, labels, *, options)``: ``probs`` (N, C) class probabilities, ``labels``
  (N,) integer class indices in [0, C). For an ensemble, ``probs`` is the mean of the members'
  softmax probabilities.
- Inputs may be numpy arrays or torch tensors of any float dtype on any device; everything is
  computed in float64 and returned as a Python float.
- Rows of ``probs`` must sum to 1 (tolerance 1e-3, or the dtype's epsilon if larger, e.g. bfloat16);
  logits are refused with a hint to apply softmax. Shape mismatches, labels out of range, NaN and
  wrong ndim raise ValueError.
- With no samples every metric warns with ``UndefinedMetricWarning`` and returns NaN.

Definitions:

- ``accuracy``: top-1 (argmax; ties go to the lowest class index). Higher is better.
- ``nll``: mean of -log p_y, with p_y clipped to [eps, 1 - eps] (eps = float64 machine epsilon,
  2.2e-16) before the log: scikit-learn's ``log_loss`` exactly. Lower is better. Where the logits
  are at hand, ``log_p_true`` (:func:`log_p_true`: log-softmax, or for an ensemble the log-mean-exp
  of the members' log-probabilities) gives the exact, always finite value instead.
- ``brier``: sum over classes of (p - onehot)^2, averaged over samples; range [0, 2]. Lower is
  better.
- ``ece``: top-label expected calibration error with ``n_bins`` (default 15) equal-width bins
  (0, 1/15], (1/15, 2/15], ..., (14/15, 1] over the confidence max_c p_c (the first bin also takes
  confidence 0): sum over bins of (n_b / N) |accuracy_b - mean confidence_b|. Lower is better.
- ``adaptive_ece``: the same gap with ``n_bins`` equal-mass bins: samples sorted by confidence and
  split into bins whose sizes differ by at most one (larger bins first, as ``np.array_split``).
  Samples with equal confidence are ordered wrong-before-right, so the value does not depend on
  the order of the input. Empty bins (N < n_bins) are skipped. Lower is better.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import torch

from hydra_core.metrics._validation import check_classification, check_n_bins, undefined

N_BINS = 15
#: p_y is clipped to [NLL_CLIP, 1 - NLL_CLIP] before the log in :func:`nll`, as scikit-learn's
#: ``log_loss`` does on float64 probabilities.
NLL_CLIP = float(np.finfo(np.float64).eps)


def _checked(metric: str, probs: Any, labels: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """Validated (probs, labels), or None after warning when there are no samples."""
    p, y = check_classification(probs, labels)
    if len(y) == 0:
        undefined(metric, "no samples")
        return None
    return p, y


def _top_label(p: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Confidence max_c p_c and correctness (1.0 / 0.0) of the top-1 prediction, per sample."""
    return p.max(axis=1), (p.argmax(axis=1) == y).astype(np.float64)


def _equal_width_bin(confidence: np.ndarray, n_bins: int) -> np.ndarray:
    """Bin index of each confidence for bins (k/n, (k+1)/n]; 0 goes to the first bin."""
    inner_edges = np.linspace(0.0, 1.0, n_bins + 1)[1:-1]
    return np.searchsorted(inner_edges, confidence, side="left")


def _equal_mass_bin(confidence: np.ndarray, correct: np.ndarray, n_bins: int) -> np.ndarray:
    """Bin index of each sample for equal-mass bins over the sorted confidences."""
    n = len(confidence)
    sizes = np.full(n_bins, n // n_bins)
    sizes[: n % n_bins] += 1
    order = np.lexsort((correct, confidence))  # by confidence, ties: wrong before right
    bins = np.empty(n, dtype=np.int64)
    bins[order] = np.repeat(np.arange(n_bins), sizes)
    return bins


def _bin_sums(
    bins: np.ndarray, confidence: np.ndarray, correct: np.ndarray, n_bins: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per bin: sample count, sum of confidences, number correct."""
    return (
        np.bincount(bins, minlength=n_bins),
        np.bincount(bins, weights=confidence, minlength=n_bins),
        np.bincount(bins, weights=correct, minlength=n_bins),
    )


def _calibration_error(
    bins: np.ndarray, confidence: np.ndarray, correct: np.ndarray, n_bins: int
) -> float:
    # sum_b (n_b / N) |acc_b - conf_b| = sum_b |correct_b - confidence_sum_b| / N
    _, confidence_sum, correct_sum = _bin_sums(bins, confidence, correct, n_bins)
    return float(np.abs(correct_sum - confidence_sum).sum() / len(confidence))


def _checked_log_p(log_p_true: Any, n: int) -> np.ndarray | None:
    if log_p_true is None:
        return None
    out = np.asarray(log_p_true, dtype=np.float64)
    if out.shape != (n,) or np.isnan(out).any() or (out > 1e-9).any():
        raise ValueError(
            f"log_p_true must be {n} log-probabilities (<= 0, no NaN), got shape {out.shape}"
        )
    return np.minimum(out, 0.0)  # rounding can leave log(mean) a hair above 0


def _accuracy(p: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(p.argmax(axis=1) == y))


def per_sample_nll(
    p: np.ndarray, y: np.ndarray, log_p_true: np.ndarray | None = None
) -> np.ndarray:
    """(N,) -log p_y: from ``log_p_true`` when given (exact), else from the clipped p_y."""
    if log_p_true is not None:
        return -log_p_true
    return -np.log(np.clip(p[np.arange(len(y)), y], NLL_CLIP, 1.0 - NLL_CLIP))


def _nll(p: np.ndarray, y: np.ndarray, log_p_true: np.ndarray | None = None) -> float:
    return float(np.mean(per_sample_nll(p, y, log_p_true)))


def log_p_true(logits: Any, labels: Any) -> np.ndarray:
    """(N,) log-probability of the true class, in float64, from (N, C) logits (log-softmax) or
    (N, M, C) member logits: log of the mean of the members' softmaxes, computed as
    logsumexp over members of their log-probabilities minus log M, so it stays finite where the
    probability underflows."""
    z = torch.as_tensor(logits).detach().cpu().double()
    y = torch.as_tensor(labels).detach().cpu().long()
    if z.ndim not in (2, 3) or len(z) != len(y):
        raise ValueError(
            f"log_p_true: logits must be (N, C) or (N, M, C) with N = {len(y)} labels, "
            f"got shape {tuple(z.shape)}"
        )
    log_p = z.log_softmax(-1)
    if z.ndim == 3:
        log_p = torch.logsumexp(log_p, dim=1) - math.log(z.shape[1])
    return log_p[torch.arange(len(y)), y].numpy()


def _brier(p: np.ndarray, y: np.ndarray) -> float:
    onehot = np.zeros_like(p)
    onehot[np.arange(len(y)), y] = 1.0
    return float(np.mean(np.sum((p - onehot) ** 2, axis=1)))


def _ece(p: np.ndarray, y: np.ndarray, n_bins: int) -> float:
    confidence, correct = _top_label(p, y)
    return _calibration_error(_equal_width_bin(confidence, n_bins), confidence, correct, n_bins)


def _adaptive_ece(p: np.ndarray, y: np.ndarray, n_bins: int) -> float:
    confidence, correct = _top_label(p, y)
    bins = _equal_mass_bin(confidence, correct, n_bins)
    return _calibration_error(bins, confidence, correct, n_bins)


def accuracy(probs: Any, labels: Any) -> float:
    """Top-1 accuracy in [0, 1]."""
    checked = _checked("accuracy", probs, labels)
    return _accuracy(*checked) if checked else float("nan")


def nll(probs: Any, labels: Any) -> float:
    """Mean negative log-likelihood -log p_y (natural log; p_y clipped to [eps, 1 - eps] as
    scikit-learn's ``log_loss``)."""
    checked = _checked("nll", probs, labels)
    return _nll(*checked) if checked else float("nan")


def brier(probs: Any, labels: Any) -> float:
    """Brier score: sum over classes of (p - onehot)^2, mean over samples, in [0, 2]."""
    checked = _checked("brier", probs, labels)
    return _brier(*checked) if checked else float("nan")


def ece(probs: Any, labels: Any, *, n_bins: int = N_BINS) -> float:
    """Top-label expected calibration error with ``n_bins`` equal-width confidence bins."""
    n_bins = check_n_bins(n_bins)
    checked = _checked("ece", probs, labels)
    return _ece(*checked, n_bins) if checked else float("nan")


def adaptive_ece(probs: Any, labels: Any, *, n_bins: int = N_BINS) -> float:
    """Top-label calibration error with ``n_bins`` equal-mass bins over the sorted confidences."""
    n_bins = check_n_bins(n_bins)
    checked = _checked("adaptive_ece", probs, labels)
    return _adaptive_ece(*checked, n_bins) if checked else float("nan")


def classification_metrics(
    probs: Any, labels: Any, *, n_bins: int = N_BINS, log_p_true: Any = None
) -> dict[str, float]:
    """All classification metrics at once (inputs checked once): keys accuracy, nll, brier, ece,
    adaptive_ece. ``log_p_true``: (N,) exact log p_y (:func:`log_p_true`) for the NLL."""
    n_bins = check_n_bins(n_bins)
    checked = _checked("classification metrics", probs, labels)
    if checked is None:
        return dict.fromkeys(("accuracy", "nll", "brier", "ece", "adaptive_ece"), float("nan"))
    p, y = checked
    return {
        "accuracy": _accuracy(p, y),
        "nll": _nll(p, y, _checked_log_p(log_p_true, len(y))),
        "brier": _brier(p, y),
        "ece": _ece(p, y, n_bins),
        "adaptive_ece": _adaptive_ece(p, y, n_bins),
    }


def reliability_curve(probs: Any, labels: Any, n_bins: int = N_BINS) -> pd.DataFrame:
    """Data for a reliability diagram, the equal-width bins of :func:`ece` (no plotting).

    One row per bin, empty bins included: bin_lower, bin_upper, confidence (mean confidence in the
    bin), accuracy (share correct in the bin), count. Empty bins have count 0 and NaN confidence
    and accuracy.
    """
    n_bins = check_n_bins(n_bins)
    p, y = check_classification(probs, labels)
    confidence, correct = _top_label(p, y)
    count, confidence_sum, correct_sum = _bin_sums(
        _equal_width_bin(confidence, n_bins), confidence, correct, n_bins
    )
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    with np.errstate(invalid="ignore"):  # empty bins: 0 / 0 -> NaN
        return pd.DataFrame(
            {
                "bin_lower": edges[:-1],
                "bin_upper": edges[1:],
                "confidence": confidence_sum / count,
                "accuracy": correct_sum / count,
                "count": count,
            }
        )
