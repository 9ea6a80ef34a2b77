"""Rank agreement between head-importance maps (single-head ablation, Taylor, greedy rank, ...)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import torch
from scipy.stats import spearmanr


def _values(importance: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(importance, torch.Tensor):
        importance = importance.detach().cpu().double().numpy()
    return np.asarray(importance, dtype=np.float64).ravel()


def spearman(map_a: torch.Tensor | np.ndarray, map_b: torch.Tensor | np.ndarray) -> float:
    """Spearman rank correlation between two importance maps of the same shape, e.g. (L, H).

    Heads where either map is NaN (removed, absent or unscored) are left out of both. Returns NaN
    when fewer than two heads remain or one map is constant on them.
    """
    shape_a, shape_b = tuple(np.shape(map_a)), tuple(np.shape(map_b))
    if shape_a != shape_b:
        raise ValueError(f"importance maps differ in shape: {shape_a} and {shape_b}")
    a, b = _values(map_a), _values(map_b)
    both = ~(np.isnan(a) | np.isnan(b))
    a, b = a[both], b[both]
    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def spearman_matrix(maps: Mapping[str, torch.Tensor | np.ndarray]) -> pd.DataFrame:
    """Pairwise :func:`spearman` correlations between named importance maps (a symmetric table)."""
    names = list(maps)
    table = pd.DataFrame(np.nan, index=names, columns=names)
    for i, a in enumerate(names):
        for b in names[i:]:
            table.loc[a, b] = table.loc[b, a] = spearman(maps[a], maps[b])
    return table
