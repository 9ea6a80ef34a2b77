"""OOD scores per sample, all oriented so that a **higher score means more in-distribution**; feed
them to :mod:`hydra_core.metrics.ood` as ``id_scores`` / ``ood_scores``.

- ``msp(probs)``: maximum softmax probability max_c p_c.
- ``max_logit(logits)``: max_c z_c.
- ``energy(logits, temperature=T)``: T * logsumexp(z / T), the negative free energy.
- ``neg_entropy(probs)``: sum_c p_c log p_c (natural log; 0 log 0 = 0), i.e. minus the predictive
  entropy.
- ``ood_score(method, logits=..., probs=...)``: dispatch on "msp" | "max_logit" | "energy" |
  "entropy".

Inputs are numpy arrays or torch tensors of any float dtype on any device, (N, C) for one model or
(N, M, C) for an ensemble of M members (member axis 1). Outputs are float64 numpy arrays of shape
(N,). For an ensemble, MSP and entropy use the **mean of member probabilities** (the ensemble's
prediction), while max-logit and energy use the **mean of member logits**.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hydra_core.metrics._validation import check_logits, check_probs


def _mean_probs(probs: Any) -> np.ndarray:
    """(N, C) probabilities; an ensemble's (N, M, C) is averaged over members."""
    p = check_probs(probs, ndims=(2, 3))
    return p.mean(axis=1) if p.ndim == 3 else p


def _mean_logits(logits: Any) -> np.ndarray:
    """(N, C) logits; an ensemble's (N, M, C) is averaged over members."""
    array = check_logits(logits)
    return array.mean(axis=1) if array.ndim == 3 else array


def _logsumexp(z: np.ndarray) -> np.ndarray:
    top = z.max(axis=-1, keepdims=True)
    return (top + np.log(np.exp(z - top).sum(axis=-1, keepdims=True)))[..., 0]


def _softmax(logits: Any) -> np.ndarray:
    """Softmax over the last axis of finite logits, in float64 (member axis kept)."""
    z = check_logits(logits)
    return np.exp(z - _logsumexp(z)[..., None])


def msp(probs: Any) -> np.ndarray:
    """Maximum softmax probability per sample (higher = more ID)."""
    return _mean_probs(probs).max(axis=1)


def max_logit(logits: Any) -> np.ndarray:
    """Maximum logit per sample (higher = more ID)."""
    return _mean_logits(logits).max(axis=1)


def energy(logits: Any, temperature: float = 1.0) -> np.ndarray:
    """Negative free energy T * logsumexp(logits / T) per sample (higher = more ID)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature!r}")
    return temperature * _logsumexp(_mean_logits(logits) / temperature)


def neg_entropy(probs: Any) -> np.ndarray:
    """Minus the predictive entropy, sum_c p_c log p_c, per sample (higher = more ID)."""
    p = _mean_probs(probs)
    return np.sum(p * np.log(np.where(p > 0, p, 1.0)), axis=1)


#: method name -> (score function, the input it takes).
SCORE_METHODS: dict[str, tuple[Callable[[Any], np.ndarray], str]] = {
    "msp": (msp, "probs"),
    "max_logit": (max_logit, "logits"),
    "energy": (energy, "logits"),
    "entropy": (neg_entropy, "probs"),
}


def ood_score(method: str, *, logits: Any = None, probs: Any = None) -> np.ndarray:
    """The per-sample OOD score named ``method`` (higher = more ID).

    "msp" and "entropy" take ``probs``, or the softmax of ``logits`` when only logits are given;
    "max_logit" and "energy" (temperature 1) need ``logits``.
    """
    if method not in SCORE_METHODS:
        raise ValueError(
            f"unknown OOD score method {method!r}; valid methods: "
            f"{', '.join(repr(m) for m in SCORE_METHODS)}"
        )
    fn, needs = SCORE_METHODS[method]
    if needs == "logits":
        if logits is None:
            raise ValueError(
                f"OOD score {method!r} needs logits; probabilities cannot be turned "
                "back into logits"
            )
        return fn(logits)
    if probs is None:
        if logits is None:
            raise ValueError(f"OOD score {method!r} needs probs or logits")
        probs = _softmax(logits)
    return fn(probs)
