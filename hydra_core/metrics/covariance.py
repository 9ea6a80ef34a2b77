"""The one regularised covariance of the house: Ledoit-Wolf shrinkage (or a ridge), plus a tiny
relative floor, so that a Mahalanobis distance is defined with fewer samples than dimensions or
for a constant feature. Used by the per-head centroid distances (Table 5), the per-head detectors,
CAHP's per-head statistics and the Mahalanobis OOD score on small fits."""

from __future__ import annotations

import numpy as np
from sklearn.covariance import ledoit_wolf

Shrinkage = str | float

#: added to every covariance's diagonal, relative to its mean variance (absolute when that is 0),
#: so that even a constant head has an invertible covariance.
COVARIANCE_FLOOR = 1e-9


def regularised_covariance(samples: np.ndarray, shrinkage: Shrinkage = "ledoit_wolf") -> np.ndarray:
    """The covariance (d, d) of ``samples`` (n, d), regularised so that it is always invertible.

    Args:
        shrinkage: ``"ledoit_wolf"`` (sklearn's Ledoit-Wolf estimate, shrunk towards a scaled
            identity by the data-driven amount), or a float a >= 0: the unbiased sample covariance
            plus a * (mean variance) on the diagonal (a = 0: the plain sample covariance).
    Either way, ``COVARIANCE_FLOOR`` times the mean variance is added to the diagonal.
    """
    x = np.asarray(samples, dtype=np.float64)
    n, d = x.shape
    if isinstance(shrinkage, str):
        if shrinkage != "ledoit_wolf":
            raise ValueError(f"shrinkage must be 'ledoit_wolf' or a float >= 0, got {shrinkage!r}")
        cov = ledoit_wolf(x)[0] if n > 1 else np.zeros((d, d))
    elif isinstance(shrinkage, (int, float)) and not isinstance(shrinkage, bool) and shrinkage >= 0:
        cov = np.cov(x, rowvar=False).reshape(d, d) if n > 1 else np.zeros((d, d))
        cov = cov + shrinkage * (np.trace(cov) / d) * np.eye(d)
    else:
        raise ValueError(f"shrinkage must be 'ledoit_wolf' or a float >= 0, got {shrinkage!r}")
    scale = np.trace(cov) / d
    return cov + COVARIANCE_FLOOR * (scale if scale > 0 else 1.0) * np.eye(d)
