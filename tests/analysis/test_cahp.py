"""The accuracy-knee CAHP variant: its parts against closed forms and obvious cases; the whole
selection is reproducible. (The official variant: ``test_cahp_official.py``.)"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hydra_core.analysis.cahp import (
    _bhattacharyya,
    cahp_k_grid,
    cahp_seeds,
    cahp_select,
    jeffries_matusita,
    jeffries_matusita_profiles,
    k_medoids,
    knee_from_polyfit,
    pairwise_distances,
)
from hydra_core.errors import InputError
from hydra_core.models.adapter import ablate
from tests.conftest import make_tiny_vit


def test_bhattacharyya_matches_the_1d_closed_form():
    mu1, mu2, s1, s2 = 0.3, 1.8, 0.7, 1.9
    var = s1**2 + s2**2
    expected = (mu1 - mu2) ** 2 / (4 * var) + 0.5 * math.log(var / (2 * s1 * s2))
    mean, cov = np.array([[mu1], [mu2]]), np.array([[[s1**2]], [[s2**2]]])
    assert _bhattacharyya(mean, cov) == pytest.approx([expected], rel=1e-12)
    assert jeffries_matusita(mean, cov) == pytest.approx([2 * (1 - math.exp(-expected))], rel=1e-12)


def test_jm_is_zero_for_identical_and_near_two_for_far_apart_classes():
    cov = np.stack([np.eye(3), np.eye(3), np.eye(3)])
    means = np.array([[0.0, 0, 0], [0, 0, 0], [50, 0, 0]])
    jm = jeffries_matusita(means, cov)  # pairs (0, 1), (0, 2), (1, 2)
    assert jm[0] == pytest.approx(0.0, abs=1e-12)
    assert jm[1:] == pytest.approx([2.0, 2.0], abs=1e-12)


def test_profiles_from_samples():
    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1, 2], 200)
    feats = rng.normal(size=(600, 1, 3, 2))  # (N, L, H, d_k)
    feats[labels == 2, 0, 1] += 30.0  # head 1 tells class 2 apart
    feats[:, 0, 2] = 0.0  # head 2 is ablated: zero for every class
    profiles = jeffries_matusita_profiles(torch.from_numpy(feats), torch.from_numpy(labels))
    assert profiles.shape == (3, 3)  # 3 heads, pairs (0,1), (0,2), (1,2)
    assert profiles[0] == pytest.approx([0, 0, 0], abs=0.03)  # noise only
    assert profiles[1] == pytest.approx([0, 2, 2], abs=0.03)
    assert profiles[2] == pytest.approx([0, 0, 0], abs=1e-9)
    with pytest.raises(ValueError, match="class 2 has 1 sample"):
        jeffries_matusita_profiles(feats[:401], labels[:401])


def test_k_medoids_recovers_obvious_clusters():
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    points = np.concatenate([c + rng.normal(scale=0.5, size=(8, 2)) for c in centres])
    order = rng.permutation(len(points))
    points = points[order]
    truth = np.repeat([0, 1, 2], 8)[order]
    medoids, labels = k_medoids(pairwise_distances(points), k=3, seed=1)
    assert len(medoids) == 3 and list(medoids) == sorted(medoids)
    for cluster in range(3):  # each found cluster is exactly one true cluster
        assert len(set(truth[labels == cluster])) == 1
    assert len(set(truth[medoids])) == 3
    same = k_medoids(pairwise_distances(points), k=3, seed=1)
    np.testing.assert_array_equal(same[0], medoids)
    # Without structure, the seed decides: different seeds find different local optima.
    noise = pairwise_distances(rng.normal(size=(30, 5)))
    found = {tuple(k_medoids(noise, k=6, seed=seed, n_init=1)[0]) for seed in range(5)}
    assert len(found) > 1
    everyone, own = k_medoids(pairwise_distances(points), k=len(points), seed=0)
    np.testing.assert_array_equal(everyone, np.arange(len(points)))
    np.testing.assert_array_equal(own, np.arange(len(points)))


def test_knee_of_a_piecewise_linear_saturating_curve():
    ks = np.arange(1, 41)
    values = np.minimum(ks, 20) / 20  # rises to k = 20, flat after
    assert knee_from_polyfit(ks, values, degree=3)[0] == 20
    # On a longer flat tail a cubic cannot follow the corner; its knee sits a little later.
    ks = np.arange(1, 73)
    assert 20 <= knee_from_polyfit(ks, np.minimum(ks, 20) / 20, degree=3)[0] <= 25


def test_knee_of_an_exponential_saturation():
    ks = np.arange(1, 73)
    values = 1 - np.exp(-ks / 5)
    # The rule on the exact curve: the chord's slope s equals the derivative exp(-k/5)/5 at
    # k* = -5 ln(5 s), s = (exp(-1/5) - exp(-72/5)) / 71, so k* = 14.27 -> 14.
    slope = (math.exp(-1 / 5) - math.exp(-72 / 5)) / 71
    assert -5 * math.log(5 * slope) == pytest.approx(14.27, abs=0.01)
    assert knee_from_polyfit(ks, values, degree=6)[0] == 14
    # The default cubic undershoots the fast rise and overshoots the plateau, so its knee is later.
    assert 14 < knee_from_polyfit(ks, values)[0] <= 24


def test_knee_without_diminishing_returns_is_the_largest_k():
    ks = np.arange(2, 31, 2)
    assert knee_from_polyfit(ks, 0.01 * ks)[0] == 30  # a straight line
    assert knee_from_polyfit(ks, (ks / 30) ** 3)[0] == 30  # convex
    with pytest.raises(ValueError, match="needs 4 or more distinct k"):
        knee_from_polyfit([1, 2, 3], [0.1, 0.2, 0.3])


def test_k_grid_steps_from_one_and_always_ends_with_every_head():
    assert cahp_k_grid(8) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert cahp_k_grid(12, 4) == [1, 5, 9, 12]
    assert cahp_k_grid(9, 4) == [1, 5, 9]  # the last step lands on every head: not repeated
    assert cahp_k_grid(144, 6)[-3:] == [133, 139, 144]
    assert cahp_k_grid(1, 3) == [1]
    with pytest.raises(ValueError, match="step must be a positive number of head counts, got 0"):
        cahp_k_grid(12, 0)
    with pytest.raises(ValueError, match="total_heads must be a positive number"):
        cahp_k_grid(0)


@pytest.fixture(scope="module")
def search_data():
    model = make_tiny_vit(depth=2)
    x = torch.randn(30, 1, 16, 16, generator=torch.Generator().manual_seed(5))
    return model, x, torch.arange(30) % 5


def test_cahp_select_is_reproducible_and_consistent(search_data):
    model, x, y = search_data
    calls = []
    first = cahp_select(
        model,
        x,
        y,
        variant="accuracy-knee",
        batch_size=32,
        progress=lambda done, total: calls.append((done, total)),
    )
    again = cahp_select(model, x, y, variant="accuracy-knee", seed=0, batch_size=32)
    assert (first.seed, first.degree, first.representative) == (0, 3, "medoid")
    assert calls == [(k, 8) for k in range(1, 9)]
    assert first.curve["k"].tolist() == list(range(1, 9)) and first.score_name == "accuracy"
    assert first.medoids == again.medoids and first.knee_k == again.knee_k
    assert torch.equal(first.keep, again.keep)
    np.testing.assert_array_equal(first.curve.to_numpy(), again.curve.to_numpy())
    assert first.profiles.shape == (8, 10)  # 8 heads, 5 * 4 / 2 class pairs
    assert first.heads == [(layer, head) for layer in range(2) for head in range(4)]
    # The kept heads are the knee's medoids and, for a layer none of them is in, its most
    # important head; a curve point is the accuracy of that mask.
    kept = sorted(map(tuple, first.keep.nonzero().tolist()))
    assert first.representatives == first.medoids[first.knee_k]
    assert kept == sorted(first.representatives + first.added)
    assert {layer for layer, _ in kept} == {0, 1}
    with torch.no_grad(), ablate(model, first.keep):
        accuracy = (model(x).argmax(-1) == y).float().mean().item()
    assert first.curve.set_index("k").loc[first.knee_k, "accuracy"] == pytest.approx(accuracy)
    fitted = np.polyval(first.coefficients, first.curve["k"])
    np.testing.assert_allclose(fitted, first.curve["fitted"], atol=1e-9)
    assert first.describe().startswith("CAHP accuracy-knee: knee of the accuracy curve")


def test_no_layer_loses_every_head(search_data):
    model, x, y = search_data
    result = cahp_select(model, x, y, variant="accuracy-knee", k_grid=[1, 2, 3, 4, 5, 8])
    # k = 1: one medoid, in one layer; the other layer keeps its most important head, so the
    # curve's first point is the accuracy with two heads
    (medoid,) = result.medoids[1]
    other = 1 - medoid[0]
    best = max(range(4), key=lambda h: result.importance[other * 4 + h])
    keep = torch.zeros(2, 4, dtype=torch.bool)
    keep[medoid] = keep[other, best] = True
    with torch.no_grad(), ablate(model, keep):
        accuracy = (model(x).argmax(-1) == y).float().mean().item()
    assert result.curve.loc[0, "accuracy"] == pytest.approx(accuracy)


def test_the_most_important_head_of_each_cluster(search_data):
    model, x, y = search_data
    by_medoid = cahp_select(model, x, y, variant="accuracy-knee", k_grid=[1, 3, 5, 8], degree=2)
    by_weight = cahp_select(
        model,
        x,
        y,
        variant="accuracy-knee",
        k_grid=[1, 3, 5, 8],
        degree=2,
        representative="importance",
    )
    assert by_weight.representative == "importance"
    np.testing.assert_array_equal(by_weight.importance, by_medoid.importance)
    np.testing.assert_array_equal(by_weight.distances, by_medoid.distances)  # same clusters
    from hydra_core.analysis.cahp import k_medoids

    medoids, labels = k_medoids(by_weight.distances, by_weight.knee_k, 0)
    expected = [
        by_weight.heads[max(np.flatnonzero(labels == c), key=lambda i: by_weight.importance[i])]
        for c in range(len(medoids))
    ]
    assert by_weight.representatives == expected


def test_cahp_rejects_a_bad_grid_and_bad_options(search_data):
    model, x, y = search_data
    with pytest.raises(ValueError, match="between 1 and 8"):
        cahp_select(model, x, y, variant="accuracy-knee", k_grid=[0, 3])
    with pytest.raises(InputError, match="not a cluster representative"):
        cahp_select(model, x, y, variant="accuracy-knee", representative="centroid")
    with pytest.raises(InputError, match="degree must be at least 1"):
        cahp_select(model, x, y, variant="accuracy-knee", degree=0)


def test_member_seeds_by_variant():
    assert cahp_seeds(3) == [42, 43, 44]
    assert cahp_seeds(2, "accuracy-knee") == [0, 1]
    with pytest.raises(InputError, match="not a CAHP variant"):
        cahp_seeds(2, "paper")
