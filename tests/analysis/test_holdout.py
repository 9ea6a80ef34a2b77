"""Tests of the held-out suggestion rule and the chance level of the stability Jaccard
(hydra_core.analysis.holdout)."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest

from hydra_core.analysis.holdout import HeldOutCurve, chance_jaccard, jaccard_words


def _curve(held_out, lo, hi, gain_lo=(), gain_hi=()) -> HeldOutCurve:
    n = len(held_out)
    return HeldOutCurve(
        objective="avg",
        order=[(0, i) for i in range(n - 1)],
        search=list(held_out),
        held_out=list(held_out),
        held_out_lo=list(lo),
        held_out_hi=list(hi),
        held_out_accuracy=list(held_out),
        held_out_auroc=list(held_out),
        n_id=10,
        n_ood=10,
        peak_gain_lo=list(gain_lo),
        peak_gain_hi=list(gain_hi),
    )


def test_a_peak_inside_the_noise_suggests_no_budget():
    # the case: a held-out band of about 0.70-0.85, the peak one step before the budget
    noisy = _curve(
        [0.76, 0.78, 0.77],
        [0.70, 0.71, 0.70],
        [0.83, 0.85, 0.84],
        gain_lo=[-0.03, 0.0, -0.01],
        gain_hi=[0.07, 0.0, 0.04],
    )
    assert noisy.beyond_peak(2)  # past the point value ...
    assert not noisy.peak_beats(2) and noisy.suggested_budget(2) is None  # ... but not beyond noise


def test_a_peak_better_than_the_end_beyond_the_interval_is_suggested():
    clear = _curve(
        [0.70, 0.80, 0.72],
        [0.68, 0.78, 0.70],
        [0.72, 0.82, 0.74],
        gain_lo=[0.06, 0.0, 0.05],
        gain_hi=[0.14, 0.0, 0.11],
    )
    assert clear.peak_beats(2) and clear.suggested_budget(2) == 1
    assert clear.suggested_budget(1) is None  # at the peak: nothing to suggest
    # a peak at 0 removals suggests the smallest budget a search takes
    at_zero = _curve([0.9, 0.5], [0.88, 0.45], [0.92, 0.55], [0.0, 0.35], [0.0, 0.45])
    assert at_zero.suggested_budget(1) == 1


def test_without_paired_intervals_the_steps_intervals_must_not_overlap():
    overlap = _curve([0.70, 0.80, 0.75], [0.6, 0.7, 0.65], [0.8, 0.9, 0.85])
    assert overlap.suggested_budget(2) is None
    apart = _curve([0.70, 0.90, 0.60], [0.65, 0.86, 0.55], [0.75, 0.94, 0.65])
    assert apart.suggested_budget(2) == 1
    assert apart.frame()["peak_gain_lo"].isna().all()  # written as missing, not invented


def test_held_out_curve_pairs_the_peak_with_each_step():
    """peak_gain_* of a real curve: the percentile interval of the per-resample differences."""
    import torch

    from hydra_core.analysis.greedy import greedy_circuit
    from hydra_core.analysis.holdout import held_out_curve
    from tests.conftest import make_tiny_vit

    torch.manual_seed(0)
    vit = make_tiny_vit(depth=2, num_heads=3)
    id_x, ood_x = torch.randn(24, 1, 16, 16), torch.randn(24, 1, 16, 16) * 3
    id_y = torch.arange(24) % 3
    result = greedy_circuit(vit, id_x[:12], id_y[:12], ood_x[:12], budget=3)
    curve = held_out_curve(vit, result, id_x[12:], id_y[12:], ood_x[12:], n_boot=200)
    assert len(curve.peak_gain_lo) == result.steps + 1
    assert curve.peak_gain_lo[curve.peak] == 0.0 == curve.peak_gain_hi[curve.peak]
    for step in range(result.steps + 1):
        gain = curve.held_out[curve.peak] - curve.held_out[step]
        assert curve.peak_gain_lo[step] <= gain + 1e-9 and gain - 1e-9 <= curve.peak_gain_hi[step]
    expected = max(curve.peak, 1) if curve.peak_gain_lo[result.steps] > 0 else None
    assert curve.suggested_budget(result.steps) == (expected if result.steps > curve.peak else None)


@pytest.mark.parametrize("n", [1, 2, 5, 7])
def test_chance_jaccard_is_exact_against_enumeration(n):
    heads = range(n)
    for k in range(1, n + 1):
        sets = [set(c) for c in combinations(heads, k)]
        mean = np.mean([len(a & b) / len(a | b) for a in sets for b in sets])
        assert chance_jaccard(n, k) == pytest.approx(mean, abs=1e-12)
    assert np.isnan(chance_jaccard(n, 0))
    with pytest.raises(ValueError, match="0 <= k <= n"):
        chance_jaccard(n, n + 1)


def test_chance_jaccard_matches_random_sets_at_the_default_size():
    rng = np.random.default_rng(0)
    n, k = 72, 24  # 6 layers of 12 heads, a budget of 24
    draws = [
        (set(rng.choice(n, k, replace=False)), set(rng.choice(n, k, replace=False)))
        for _ in range(20_000)
    ]
    simulated = np.mean([len(a & b) / len(a | b) for a, b in draws])
    assert chance_jaccard(n, k) == pytest.approx(simulated, abs=0.003)


def test_jaccard_words_put_the_observed_beside_chance():
    chance = chance_jaccard(72, 12)
    text = jaccard_words(0.62, 72, 12)
    assert f"against {chance:.2f} for two random sets of 12 of 72 heads" in text
    assert text.endswith(f"{0.62 / chance:.1f}x chance")
    assert jaccard_words(chance / 2, 72, 12).endswith("no more agreement than chance")
    # classes of one item, every head removed: agreement is forced, and the words say so
    assert "any two sets agree" in jaccard_words(1.0, 8, 8)
