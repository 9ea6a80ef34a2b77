"""Temperature scaling: the fitted T minimises the NLL (against scipy and a fine grid), the NLL
equals a hand computation, and bad input is refused with a message that names it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar

from hydra_core.metrics import apply_temperature, fit_temperature, nll, temperature_nll


def synthetic(n: int = 400, classes: int = 5, scale: float = 8.0, seed: int = 0):
    """Overconfident logits (a scaled-up signal plus noise) and labels that follow them 70% of
    the time."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    logits = rng.normal(size=(n, classes))
    predicted = np.where(rng.random(n) < 0.7, labels, rng.integers(0, classes, n))
    logits[np.arange(n), predicted] += 2.0
    return scale * logits, labels


def test_nll_at_a_temperature_equals_a_hand_computation():
    logits = np.array([[2.0, 0.0, -1.0], [0.5, 1.5, 0.0]])
    labels = np.array([0, 2])
    t = 2.0
    # row 0: z/T = (1, 0, -0.5); row 1: z/T = (0.25, 0.75, 0)
    row0 = math.log(math.e**1 + 1 + math.e**-0.5) - 1.0
    row1 = math.log(math.e**0.25 + math.e**0.75 + 1) - 0.0
    assert temperature_nll(logits, labels, t) == pytest.approx((row0 + row1) / 2, rel=1e-14)
    probs = torch.from_numpy(apply_temperature(logits, t)).softmax(-1)
    assert temperature_nll(logits, labels, t) == pytest.approx(nll(probs, labels), rel=1e-12)


@pytest.mark.parametrize(("scale", "seed"), [(8.0, 0), (0.3, 1), (100.0, 2), (1.0, 3)])
def test_fit_matches_scipy_and_a_fine_grid(scale, seed):
    logits, labels = synthetic(scale=scale, seed=seed)
    fitted = fit_temperature(logits, labels)
    reference = minimize_scalar(
        lambda log_t: temperature_nll(logits, labels, math.exp(log_t)),
        bounds=(math.log(1e-3), math.log(1e3)),
        method="bounded",
        options={"xatol": 1e-10},
    )
    assert math.log(fitted) == pytest.approx(reference.x, abs=1e-5)
    grid = np.exp(np.linspace(math.log(fitted) - 0.5, math.log(fitted) + 0.5, 2001))
    values = [temperature_nll(logits, labels, t) for t in grid]
    best = temperature_nll(logits, labels, fitted)
    assert best <= min(values) + 1e-12
    assert best < temperature_nll(logits, labels, 1.0) or fitted == pytest.approx(1.0)


def test_the_fit_undoes_a_scaling_of_the_logits():
    """Scaling the logits by k scales the fitted temperature by k: the calibrated output is the
    same."""
    logits, labels = synthetic()
    t = fit_temperature(logits, labels)
    assert fit_temperature(3.0 * logits, labels) == pytest.approx(3.0 * t, rel=1e-9)
    assert t > 1.0  # the synthetic logits are overconfident


def test_torch_input_of_any_dtype_gives_the_numpy_fit():
    logits, labels = synthetic(n=100)
    expected = fit_temperature(logits, labels)
    as_torch = torch.from_numpy(logits).to(torch.bfloat16)
    fitted = fit_temperature(as_torch, torch.from_numpy(labels))
    assert fitted == pytest.approx(fit_temperature(as_torch.double().numpy(), labels), rel=1e-12)
    assert fitted == pytest.approx(expected, rel=0.02)
    scaled = apply_temperature(as_torch, fitted)
    assert isinstance(scaled, torch.Tensor) and scaled.dtype == torch.bfloat16


def test_edge_cases_return_sensible_temperatures():
    uniform = np.zeros((4, 3))
    assert fit_temperature(uniform, np.array([0, 1, 2, 0])) == 1.0
    perfect = np.array([[5.0, 0.0], [0.0, 5.0]])
    with pytest.warns(UserWarning, match="low bound 0.001"):
        assert fit_temperature(perfect, np.array([0, 1])) == 1e-3
    wrong = -perfect
    with pytest.warns(UserWarning, match="high bound 1000"):
        assert fit_temperature(wrong, np.array([0, 1])) == 1e3
    with pytest.warns(UserWarning, match="high bound 0.02: the NLL keeps falling as T grows"):
        assert fit_temperature(*synthetic(), bounds=(0.01, 0.02)) == 0.02


@pytest.mark.parametrize(
    ("logits", "labels", "match"),
    [
        (np.zeros((0, 3)), np.zeros(0, dtype=int), "no samples"),
        (np.zeros((3, 1)), np.zeros(3, dtype=int), "1 class"),
        (np.array([[0.0, np.nan]]), np.array([0]), "1 NaN or infinite"),
        (np.zeros(3), np.zeros(3, dtype=int), r"2-D \(N, C\)"),
        (np.zeros((2, 3)), np.zeros(3, dtype=int), r"shape \(2,\)"),
        (np.zeros((2, 3)), np.array([0, 3]), r"\[0, 3\)"),
        (np.zeros((2, 3)), np.array([0.0, 1.0]), "integer class indices"),
    ],
)
def test_bad_input_is_refused(logits, labels, match):
    with pytest.raises(ValueError, match=match):
        fit_temperature(logits, labels)


@pytest.mark.parametrize("t", [0.0, -1.0, float("nan"), float("inf")])
def test_a_temperature_must_be_positive_and_finite(t):
    with pytest.raises(ValueError, match="finite number > 0"):
        apply_temperature(np.zeros((1, 2)), t)
    with pytest.raises(ValueError, match="bounds must satisfy"):
        fit_temperature(np.eye(2), np.array([0, 1]), bounds=(1.0, 1.0))
