"""Rank correlation between importance maps, against scipy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from hydra_core.analysis.compare import spearman, spearman_matrix


def test_spearman_equals_scipy_on_the_heads_both_maps_score():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    a[0, 1] = np.nan  # removed in one map
    b[2, 3] = np.nan  # absent in the other
    both = ~(np.isnan(a) | np.isnan(b))
    expected = spearmanr(a[both], b[both]).statistic
    assert spearman(torch.from_numpy(a), b) == pytest.approx(expected, rel=1e-12)
    assert spearman(a, -a) == pytest.approx(-1.0)
    assert np.isnan(spearman(np.ones((2, 2)), a[:2, :2]))  # constant: undefined
    with pytest.raises(ValueError, match="differ in shape"):
        spearman(a, b[:2])


def test_spearman_matrix_is_symmetric_with_unit_diagonal():
    rng = np.random.default_rng(1)
    names = ("taylor", "single", "greedy")
    maps = {name: torch.from_numpy(rng.normal(size=(2, 5))) for name in names}
    table = spearman_matrix(maps)
    assert list(table.index) == list(table.columns) == ["taylor", "single", "greedy"]
    np.testing.assert_allclose(np.diag(table), 1.0)
    np.testing.assert_allclose(table.to_numpy(), table.to_numpy().T)
    expected = spearmanr(maps["taylor"].flatten(), maps["greedy"].flatten()).statistic
    assert table.loc["greedy", "taylor"] == pytest.approx(expected, rel=1e-12)
