"""Per-head CLS features against a direct computation; centroid distances against scipy/numpy;
projections and the dense-vs-circuit table."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch
from scipy.spatial.distance import mahalanobis
from sklearn.covariance import ledoit_wolf

from hydra_core.analysis.representations import (
    average_distances,
    centroid_distances,
    distance_table_dense_vs_circuit,
    head_cls_features,
    most_and_least_important,
    project_features,
)
from hydra_core.models.adapter import ablate, block_heads, embed
from tests.conftest import make_tiny_vit, random_mask


def direct_cls_heads(model, x) -> torch.Tensor:
    """Every block's per-head CLS output, block by block with the adapter's ``block_heads``."""
    outputs = []
    with torch.no_grad():
        tokens = embed(model, x)
        for block in model.blocks:
            outputs.append(block_heads(block, tokens, queries=slice(0, 1))[:, 0])  # (B, H, d_k)
            tokens = block(tokens)
    return torch.stack(outputs, dim=1)  # (B, L, H, d_k)


def test_cls_features_equal_direct_computation(tiny_vit, images):
    feats = head_cls_features(tiny_vit, images, batch_size=3)
    assert feats.shape == (8, 3, 4, 6)
    torch.testing.assert_close(feats, direct_cls_heads(tiny_vit, images), rtol=1e-5, atol=1e-5)
    picked = head_cls_features(tiny_vit, images, layers=[-1, 0])
    torch.testing.assert_close(picked, feats[:, [2, 0]])


def test_cls_features_under_mask_zero_the_ablated_heads(images):
    model = make_tiny_vit()
    keep = random_mask((3, 4), seed=4)
    feats = head_cls_features(model, images, keep=keep)
    assert feats[:, ~keep].abs().max() == 0
    with ablate(model, keep):  # later layers see the ablated stream
        expected = direct_cls_heads(model, images)
    torch.testing.assert_close(feats[:, keep], expected[:, keep], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(feats[:, 2], head_cls_features(model, images, layers=[2])[:, 0])


@pytest.fixture
def gaussian_sets():
    rng = np.random.default_rng(0)
    ids = rng.normal(size=(300, 3, 4)) @ np.diag([1.0, 2.0, 0.5, 1.5])  # (N, H, d_k)
    oods = rng.normal(loc=0.7, size=(200, 3, 4))
    return ids, oods


def test_distances_equal_scipy_and_numpy(gaussian_sets):
    ids, oods = gaussian_sets
    plain = centroid_distances(ids, oods, shrinkage=0.0, layers=5)
    default = centroid_distances(torch.from_numpy(ids), torch.from_numpy(oods), layers=[5])
    assert plain["label"].tolist() == ["L5H0", "L5H1", "L5H2"]
    for head in range(3):
        a, b = ids[:, head].mean(0), oods[:, head].mean(0)
        assert plain.loc[head, "euclidean"] == pytest.approx(np.linalg.norm(a - b), rel=1e-12)
        inverse = np.linalg.inv(np.cov(ids[:, head], rowvar=False))
        assert plain.loc[head, "mahalanobis"] == pytest.approx(mahalanobis(a, b, inverse), rel=1e-6)
        shrunk = np.linalg.inv(ledoit_wolf(ids[:, head])[0])
        expected = mahalanobis(a, b, shrunk)
        assert default.loc[head, "mahalanobis"] == pytest.approx(expected, rel=1e-6)
    ridge = centroid_distances(ids, oods, shrinkage=0.5)
    assert (ridge["mahalanobis"] < plain["mahalanobis"]).all()  # a ridge only shrinks distances


def test_singular_covariances_do_not_fail():
    rng = np.random.default_rng(1)
    ids = rng.normal(size=(3, 2, 8))  # fewer samples than dimensions
    oods = rng.normal(size=(5, 2, 8))
    ids[:, 1] = 0  # an ablated head: zero for ID and OOD alike
    oods[:, 1] = 0
    for shrinkage in ("ledoit_wolf", 0.0, 0.1):
        table = centroid_distances(ids, oods, shrinkage=shrinkage)
        assert np.isfinite(table[["euclidean", "mahalanobis"]].to_numpy()).all()
        assert table.loc[1, "mahalanobis"] == 0 and table.loc[0, "mahalanobis"] > 0


def test_average_distances_over_all_or_chosen_heads(gaussian_sets):
    table = centroid_distances(*gaussian_sets)
    assert average_distances(table)["euclidean"] == pytest.approx(table["euclidean"].mean())
    chosen = average_distances(table, [(0, 2), "L0H0"])
    assert chosen["mahalanobis"] == pytest.approx(table.loc[[0, 2], "mahalanobis"].mean())
    with pytest.raises(ValueError, match="L3H0"):
        average_distances(table, [(3, 0)])


def test_dense_vs_circuit_table():
    model = make_tiny_vit()
    x = torch.randn(24, 1, 16, 16, generator=torch.Generator().manual_seed(2))
    ood = {"shifted": x + 1.5, "scaled": 3 * x}
    keep = torch.ones(3, 4, dtype=torch.bool)
    keep[2, 1] = False
    # Removing a head of the read layer only: the other heads of that layer see the same input.
    table = distance_table_dense_vs_circuit(model, keep, x, {"shifted": ood["shifted"]})
    assert table["dataset"].tolist() == ["shifted", "Average"]
    assert table.attrs["heads"] == ["L2H0", "L2H2", "L2H3"]
    np.testing.assert_allclose(table[["delta_euclidean", "delta_mahalanobis"]], 0, atol=1e-6)
    keep[0, 0] = keep[1, 3] = False
    table = distance_table_dense_vs_circuit(model, keep, x, ood, layer=2, shrinkage=0.1)
    heads = [(2, 0), (2, 2), (2, 3)]
    for variant, mask in (("circuit", keep), ("dense", None)):  # the "scaled" row, by hand
        by_hand = centroid_distances(
            head_cls_features(model, x, keep=mask),
            head_cls_features(model, ood["scaled"], keep=mask),
            shrinkage=0.1,
        )
        for metric, expected in average_distances(by_hand, heads).items():
            assert table.loc[1, f"{variant}_{metric}"] == pytest.approx(expected, rel=1e-5)
    assert table.loc[2, "delta_euclidean"] == pytest.approx(table.loc[:1, "delta_euclidean"].mean())
    assert (table["delta_euclidean"].abs() > 1e-4).all()
    # The paper's convention: the mean over all 4 heads of the layer; the circuit's removed head
    # counts with distance 0, the dense model's with its own distance.
    paper = distance_table_dense_vs_circuit(
        model, keep, x, ood, layer=2, shrinkage=0.1, average_over="all"
    )
    dense_all = centroid_distances(
        head_cls_features(model, x), head_cls_features(model, ood["scaled"]), shrinkage=0.1
    )
    dense_all = dense_all[dense_all["layer"] == 2]
    for metric in ("euclidean", "mahalanobis"):
        assert paper.loc[1, f"circuit_{metric}"] == pytest.approx(
            table.loc[1, f"circuit_{metric}"] * 3 / 4
        )
        assert paper.loc[1, f"dense_{metric}"] == pytest.approx(dense_all[metric].mean(), rel=1e-5)
    no_layer_1 = keep & (torch.arange(3) != 1)[:, None]
    with pytest.raises(ValueError, match="keeps no head in layer 1"):
        distance_table_dense_vs_circuit(model, no_layer_1, x, ood, layer=1)


def test_pca_separates_separated_sets():
    rng = np.random.default_rng(0)
    ids = rng.normal(size=(40, 2, 3, 4))  # (N, L, H, d_k)
    far = rng.normal(size=(30, 2, 3, 4))
    far[:, 1, 2] += 10.0  # only head L1H2 moves
    frame = project_features(ids, {"far": far}, heads=[(1, 2), (0, 0)])
    assert list(frame.columns) == ["x", "y", "set", "group"] and len(frame) == 70
    assert frame["set"].tolist() == ["ID"] * 40 + ["far"] * 30
    x_id, x_far = frame.loc[frame.group == "ID", "x"], frame.loc[frame.group == "OOD", "x"]
    assert x_id.max() < x_far.min() or x_far.max() < x_id.min()
    three = project_features(
        torch.from_numpy(ids), torch.from_numpy(far), heads=[(0, 0)], n_components=3
    )
    assert list(three.columns) == ["x", "y", "z", "set", "group"]
    assert set(three["set"]) == {"ID", "OOD"}
    with pytest.raises(ValueError, match="L2H0"):
        project_features(ids, far, heads=[(2, 0)])


def test_umap_is_called_with_the_seed(monkeypatch):
    calls = {}

    class FakeUMAP:
        def __init__(self, **kwargs):
            calls.update(kwargs)

        def fit_transform(self, data):
            calls["rows"] = len(data)
            return data[:, : calls["n_components"]]

    monkeypatch.setitem(sys.modules, "umap", types.SimpleNamespace(UMAP=FakeUMAP))
    ids = np.zeros((5, 1, 2, 3))
    frame = project_features(ids, ids + 1, heads=[(0, 1)], method="umap", seed=7)
    assert calls == {"n_components": 2, "random_state": 7, "n_neighbors": 9, "rows": 10}
    assert frame["x"].tolist() == [0.0] * 5 + [1.0] * 5


@pytest.mark.slow  # umap-learn compiles with numba on first use: ~40 s
def test_real_umap_is_reproducible():
    rng = np.random.default_rng(0)
    ids, oods = rng.normal(size=(30, 1, 1, 4)), rng.normal(loc=6.0, size=(30, 1, 1, 4))
    first = project_features(ids, oods, heads=[(0, 0)], method="umap", seed=3)
    again = project_features(ids, oods, heads=[(0, 0)], method="umap", seed=3)
    np.testing.assert_array_equal(first[["x", "y"]], again[["x", "y"]])
    centres = first.groupby("group")[["x", "y"]].mean()
    assert np.linalg.norm(centres.loc["ID"] - centres.loc["OOD"]) > 1.0


def test_most_and_least_important():
    ranking = [(0, 0), (1, 2), (0, 3), (2, 1), (1, 0)]  # least important first
    most, least = most_and_least_important(ranking, k=2)
    assert most == [(2, 1), (1, 0)] and least == [(0, 0), (1, 2)]
    with pytest.raises(ValueError, match="between 1 and"):
        most_and_least_important(ranking, k=6)
