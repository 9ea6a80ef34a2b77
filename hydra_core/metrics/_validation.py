"""Input checks shared by the metric modules: convert numpy arrays and torch tensors (any float
dtype, any device) to float64 numpy arrays, and reject bad input with a ValueError that names the
problem.

Undefined results (no samples, only one of ID/OOD, fewer than two members) are not errors: they go
through :func:`undefined`, which warns with :class:`UndefinedMetricWarning` and returns NaN.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import numpy as np
import torch

#: Rows of a probability matrix must sum to 1 within this tolerance (or within the input dtype's
#: machine epsilon where that is larger: a bfloat16 softmax is only good to about 4e-3).
PROB_SUM_TOL = 1e-3


class UndefinedMetricWarning(UserWarning):
    """A metric is undefined for these inputs (e.g. no samples, no OOD samples); it returns NaN."""


def undefined(metric: str, reason: str) -> float:
    """Warn that ``metric`` is undefined because of ``reason`` and return NaN. The warning points
    at the first caller outside this package."""
    frame, stacklevel = sys._getframe(0), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith(__package__):
        frame, stacklevel = frame.f_back, stacklevel + 1
    warnings.warn(
        f"{metric} is undefined: {reason}; returning NaN",
        UndefinedMetricWarning,
        stacklevel=stacklevel,
    )
    return float("nan")


def _input_eps(x: Any) -> float:
    """Machine epsilon of the input's own dtype (0 for non-float inputs)."""
    if isinstance(x, torch.Tensor):
        return torch.finfo(x.dtype).eps if x.is_floating_point() else 0.0
    dtype = np.asarray(x).dtype
    return float(np.finfo(dtype).eps) if np.issubdtype(dtype, np.floating) else 0.0


def as_float64(x: Any, name: str) -> np.ndarray:
    """``x`` (numpy array, torch tensor on any device, or nested lists) as a float64 numpy array;
    raises if it contains NaN."""
    if isinstance(x, torch.Tensor):
        x = x.detach().to(device="cpu", dtype=torch.float64).numpy()
    array = np.asarray(x, dtype=np.float64)
    n_nan = int(np.isnan(array).sum())
    if n_nan:
        raise ValueError(f"{name} contains {n_nan} NaN value(s); metrics need finite inputs")
    return array


def as_labels(labels: Any, n_classes: int) -> np.ndarray:
    """Integer class labels of shape (N,) as int64, each in [0, n_classes)."""
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    array = np.asarray(labels)
    if array.ndim != 1:
        raise ValueError(f"labels must be 1-D (N,), got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"labels must hold integer class indices, got dtype {array.dtype}")
    array = array.astype(np.int64)
    bad = (array < 0) | (array >= n_classes)
    if bad.any():
        raise ValueError(
            f"labels out of range [0, {n_classes}): found {array[bad][0]} "
            f"({int(bad.sum())} label(s) out of range)"
        )
    return array


_LAYOUTS = {2: "(N, C)", 3: "(N, M, C)"}


def check_probs(probs: Any, name: str = "probs", ndims: tuple[int, ...] = (2,)) -> np.ndarray:
    """Probabilities with classes on the last axis, as float64; every row must sum to 1.
    ``ndims``: the allowed numbers of dimensions, 2 for (N, C), 3 for members (N, M, C)."""
    array = as_float64(probs, name)
    if array.ndim not in ndims:
        layout = " or ".join(f"{d}-D {_LAYOUTS[d]}" for d in ndims)
        hint = (
            "; for an ensemble pass the mean of member probabilities, probs.mean(1)"
            if ndims == (2,) and array.ndim == 3
            else ""
        )
        raise ValueError(f"{name} must be {layout}, got shape {array.shape}{hint}")
    tol = max(PROB_SUM_TOL, _input_eps(probs))
    if array.size and (array.min() < -tol or array.max() > 1 + tol):
        raise ValueError(
            f"{name} must lie in [0, 1], found values in [{array.min():.4g}, "
            f"{array.max():.4g}]; did you pass logits? apply softmax first"
        )
    sums = array.sum(axis=-1)
    off = np.abs(sums - 1) > tol
    if off.any():
        raise ValueError(
            f"{name} rows must sum to 1 (tolerance {tol:.0e}), {int(off.sum())} do "
            f"not (e.g. {sums[off].flat[0]:.6g}); did you pass logits? apply softmax "
            "first"
        )
    return array


def check_classification(probs: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """``probs`` (N, C) and ``labels`` (N,) checked against each other."""
    p = check_probs(probs)
    y = as_labels(labels, n_classes=p.shape[1])
    if len(y) != len(p):
        raise ValueError(
            f"probs and labels disagree on the number of samples: probs has shape "
            f"{p.shape}, labels has shape {y.shape}"
        )
    return p, y


def check_scores(scores: Any, name: str) -> np.ndarray:
    """One OOD score per sample, shape (N,), float64."""
    array = as_float64(scores, name)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D (N,), got shape {array.shape}")
    return array


def check_logits(logits: Any) -> np.ndarray:
    """Logits (N, C) or, for an ensemble, (N, M, C), finite, as float64."""
    array = as_float64(logits, "logits")
    if array.ndim not in (2, 3):
        raise ValueError(
            f"logits must be (N, C) or, for an ensemble, (N, M, C); got shape {array.shape}"
        )
    if not np.isfinite(array).all():
        raise ValueError("logits contain infinite values")
    return array


def check_n_bins(n_bins: int) -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins!r}")
    return int(n_bins)
