"""Ensemble diversity: mutual information and pairwise disagreement of the members.

Conventions (docs/metrics.md):

- Input ``member_probs`` of shape (N, M, C): the softmax probabilities of each of M members for N
  samples; every row must sum to 1. Numpy arrays or torch tensors of any float dtype on any device,
  computed in float64.
- ``reduction="mean"`` (default) returns the mean over samples as a Python float;
  ``reduction="none"`` returns the per-sample values as a float64 numpy array of shape (N,).
- Undefined cases warn with ``UndefinedMetricWarning`` and return NaN (an array of NaN for
  ``reduction="none"``): no samples (mean only), no members, disagreement with fewer than two
  members.
- Higher means more diverse members; neither direction is "better" in general (diversity on OOD
  data is wanted, on ID data it usually costs accuracy).

Definitions:

- ``mutual_information``: H(mean_m p_m) - mean_m H(p_m), natural log (nats), 0 log 0 = 0. The
  epistemic part of the predictive entropy; in [0, log C]. One member gives 0.
- ``disagreement``: 1 - sum_c C(n_c, 2) / C(M, 2), where n_c is the number of members whose top-1
  prediction is class c: the chance that two distinct members, drawn at random, predict different
  classes. In [0, 1].
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from hydra_core.metrics._validation import check_probs, undefined

Reduction = Literal["mean", "none"]


def _entropy(p: np.ndarray) -> np.ndarray:
    """Entropy (nats) over the last axis, with 0 log 0 = 0."""
    return -np.sum(p * np.log(np.where(p > 0, p, 1.0)), axis=-1)


def _check_reduction(reduction: str) -> None:
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")


def _reduce(metric: str, per_sample: np.ndarray, reduction: Reduction) -> float | np.ndarray:
    if reduction == "none":
        return per_sample
    if len(per_sample) == 0:
        return undefined(metric, "no samples")
    return float(per_sample.mean())


def _mutual_information(p: np.ndarray) -> np.ndarray:
    mi = _entropy(p.mean(axis=1)) - _entropy(p).mean(axis=1)
    return np.maximum(mi, 0.0)  # >= 0 by Jensen; clip rounding below zero


def _disagreement(p: np.ndarray) -> np.ndarray:
    m, c = p.shape[1:]
    votes = (p.argmax(axis=2)[..., None] == np.arange(c)).sum(axis=1)  # (N, C) members per class
    agreeing_pairs = np.sum(votes * (votes - 1), axis=1) / 2
    return 1.0 - agreeing_pairs / (m * (m - 1) / 2)


def mutual_information(member_probs: Any, *, reduction: Reduction = "mean") -> float | np.ndarray:
    """H(mean of member probabilities) - mean of member entropies, in nats."""
    _check_reduction(reduction)
    p = check_probs(member_probs, "member_probs", ndims=(3,))
    if p.shape[1] == 0:
        undefined("mutual_information", "no members")
        return np.full(len(p), np.nan) if reduction == "none" else float("nan")
    return _reduce("mutual_information", _mutual_information(p), reduction)


def disagreement(member_probs: Any, *, reduction: Reduction = "mean") -> float | np.ndarray:
    """1 - sum_c C(n_c, 2) / C(M, 2): the share of member pairs whose top-1 predictions differ."""
    _check_reduction(reduction)
    p = check_probs(member_probs, "member_probs", ndims=(3,))
    if p.shape[1] < 2:
        undefined("disagreement", f"it needs at least 2 members, got {p.shape[1]}")
        return np.full(len(p), np.nan) if reduction == "none" else float("nan")
    return _reduce("disagreement", _disagreement(p), reduction)


def diversity_metrics(member_probs: Any) -> dict[str, float]:
    """Both diversity metrics, averaged over samples: keys mutual_information, disagreement."""
    return {
        "mutual_information": mutual_information(member_probs),
        "disagreement": disagreement(member_probs),
    }
