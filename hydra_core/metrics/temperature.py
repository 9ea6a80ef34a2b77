"""Temperature scaling (Guo et al. 2017): one scalar T > 0 dividing every logit, fitted to minimise
the negative log-likelihood on held-out data; a calibration baseline (paper section 5.3 compares
zero-shot CLIP with it, fitted on the search split).

``NLL(T) = mean_i [logsumexp_c(z_ic / T) - z_iy / T]``. With beta = 1 / T this is convex in beta:
its derivative ``g(beta) = mean_i [E_{softmax(beta z_i)}[z_i] - z_iy]`` rises with beta (its own
derivative is the mean variance of the logits under the softmax). So the minimum is the root of
``g``, found here by bisection on ``log beta`` inside ``bounds``: no starting point, no step size,
exact to float64 whatever the scale of the logits. Where ``g`` does not change sign inside the
bounds the minimum is at a bound, which is returned with a warning (e.g. logits that carry no
information about the labels, whose NLL keeps falling as T grows).

Inputs are numpy arrays or torch tensors of any float dtype on any device; the fit runs in float64.
"""

from __future__ import annotations

import warnings
from typing import Any, TypeVar

import numpy as np
import torch

#: the interval the fitted temperature lies in
BOUNDS = (1e-3, 1e3)
#: bisection steps on log(1/T): the bracket shrinks by 2^-STEPS, below float64 resolution
STEPS = 200

ArrayLike = TypeVar("ArrayLike", np.ndarray, torch.Tensor)


def _checked(logits: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """``logits`` (N, C) float64 and ``labels`` (N,) int64, or a ValueError naming the problem."""
    if isinstance(logits, torch.Tensor):
        logits = logits.detach().to(device="cpu", dtype=torch.float64).numpy()
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    z, y = np.asarray(logits, dtype=np.float64), np.asarray(labels)
    if z.ndim != 2:
        raise ValueError(f"logits must be 2-D (N, C), got shape {z.shape}")
    if y.shape != (len(z),):
        raise ValueError(f"labels must have shape ({len(z)},) for logits {z.shape}, got {y.shape}")
    if len(z) == 0:
        raise ValueError(
            "cannot fit a temperature on no samples: pass the logits of a held-out set"
        )
    if z.shape[1] < 2:
        raise ValueError(
            f"cannot fit a temperature on {z.shape[1]} class: the softmax of one logit is 1 "
            "whatever the temperature"
        )
    if not np.isfinite(z).all():
        bad = int((~np.isfinite(z)).sum())
        raise ValueError(
            f"logits contain {bad} NaN or infinite value(s); temperature needs finite logits"
        )
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must hold integer class indices, got dtype {y.dtype}")
    y = y.astype(np.int64)
    if y.min() < 0 or y.max() >= z.shape[1]:
        raise ValueError(f"labels must lie in [0, {z.shape[1]}), found {y.min()} to {y.max()}")
    return z, y


def temperature_nll(logits: Any, labels: Any, temperature: float) -> float:
    """Mean negative log-likelihood of ``softmax(logits / temperature)`` at the labels."""
    z, y = _checked(logits, labels)
    scaled = z / _checked_temperature(temperature)
    shift = scaled.max(axis=1, keepdims=True)
    log_norm = shift[:, 0] + np.log(np.exp(scaled - shift).sum(axis=1))
    return float(np.mean(log_norm - scaled[np.arange(len(y)), y]))


def _slope(z: np.ndarray, z_true_mean: float, beta: float) -> float:
    """d NLL / d beta at beta = 1 / T: mean softmax-expected logit minus mean true logit."""
    scaled = beta * z
    p = np.exp(scaled - scaled.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return float(np.mean((p * z).sum(axis=1)) - z_true_mean)


def fit_temperature(logits: Any, labels: Any, *, bounds: tuple[float, float] = BOUNDS) -> float:
    """The temperature T in ``bounds`` that minimises the NLL of ``softmax(logits / T)``.

    Args:
        logits: (N, C) held-out logits (never those of the data the result is reported on).
        labels: (N,) integer labels in [0, C).
        bounds: (low, high), 0 < low < high; the result lies in it.

    Returns 1.0 when the temperature does not matter (every row of logits constant). Warns when
    the minimum is at a bound. Raises ValueError on no samples, one class, NaN or infinite logits,
    labels out of range."""
    z, y = _checked(logits, labels)
    low, high = (float(b) for b in bounds)
    if not 0 < low < high < np.inf:
        raise ValueError(f"bounds must satisfy 0 < low < high < inf, got {bounds}")
    if np.all(np.ptp(z, axis=1) == 0):
        return 1.0  # every softmax is uniform, at any temperature
    z_true_mean = float(np.mean(z[np.arange(len(y)), y]))
    # log beta = -log T; the slope rises with beta, so the root lies where it turns positive
    lo, hi = -np.log(high), -np.log(low)
    if _slope(z, z_true_mean, np.exp(lo)) >= 0:
        return _at_bound(high, "high")
    if _slope(z, z_true_mean, np.exp(hi)) <= 0:
        return _at_bound(low, "low")
    for _ in range(STEPS):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if _slope(z, z_true_mean, np.exp(mid)) < 0:
            lo = mid
        else:
            hi = mid
    return float(np.exp(-0.5 * (lo + hi)))


def _at_bound(value: float, which: str) -> float:
    example = (
        "grows (e.g. logits that say nothing about the labels)"
        if which == "high"
        else "shrinks (e.g. logits that separate the labels perfectly)"
    )
    warnings.warn(
        f"the fitted temperature is at its {which} bound {value:g}: the NLL keeps falling as T "
        f"{example}",
        stacklevel=3,
    )
    return value


def _checked_temperature(temperature: float) -> float:
    t = float(temperature)
    if not (np.isfinite(t) and t > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    return t


def apply_temperature(logits: ArrayLike, temperature: float) -> ArrayLike:
    """``logits / temperature``, of the input's own type (numpy array or torch tensor, any shape:
    members (N, M, C) too)."""
    t = _checked_temperature(temperature)
    if isinstance(logits, torch.Tensor):
        return logits / t
    return np.asarray(logits) / t
