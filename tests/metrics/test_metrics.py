"""Tests of hydra_core.metrics: reference values (scikit-learn and hand-worked examples),
invariances run over the METRICS registry (including the resampled form the bootstrap uses), error
messages, and undefined cases that warn and return NaN."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, log_loss, roc_auc_score, roc_curve

from hydra_core.metrics import (
    METRICS,
    UndefinedMetricWarning,
    accuracy,
    adaptive_ece,
    aupr_in,
    aupr_out,
    auroc,
    brier,
    classification_metrics,
    classification_replicates,
    disagreement,
    diversity_metrics,
    ece,
    energy,
    fpr_at_95,
    fpr_at_95_tpr_id,
    log_p_true,
    max_logit,
    mean_replicates,
    msp,
    mutual_information,
    neg_entropy,
    nll,
    ood_metrics,
    ood_replicates,
    ood_score,
    reliability_curve,
    roc_curve_ood,
)

# ---------------------------------------------------------------------------------------------
# Inputs


def random_probs(rng: np.random.Generator, shape: tuple[int, ...], concentration: float = 0.5):
    """Dirichlet rows (classes on the last axis) that sum to 1."""
    return rng.dirichlet(np.full(shape[-1], concentration), size=shape[:-1])


def classification_inputs(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """80 samples, 4 classes; the last 20 repeat earlier rows with other labels, so confidences
    tie between right and wrong predictions (the case where adaptive ECE could depend on order)."""
    rng = np.random.default_rng(seed)
    probs = random_probs(rng, (60, 4))
    labels = rng.integers(0, 4, 60)
    probs = np.vstack([probs, probs[:20]])
    labels = np.r_[labels, (labels[:20] + 1) % 4]
    return probs, labels


def ood_inputs(seed: int = 0, decimals: int | None = 1) -> tuple[np.ndarray, np.ndarray]:
    """ID scores ~ N(1, 1) and OOD scores ~ N(0, 1); rounding makes many ties, within and across."""
    rng = np.random.default_rng(seed)
    id_scores, ood_scores = rng.normal(1.0, 1.0, 300), rng.normal(0.0, 1.0, 200)
    if decimals is None:
        return id_scores, ood_scores
    return np.round(id_scores, decimals), np.round(ood_scores, decimals)


def diversity_inputs(seed: int = 0) -> tuple[np.ndarray]:
    return (random_probs(np.random.default_rng(seed), (50, 3, 4)),)


INPUTS = {"classification": classification_inputs, "ood": ood_inputs, "diversity": diversity_inputs}
EMPTY = {
    "classification": (np.zeros((0, 4)), np.zeros(0, dtype=np.int64)),
    "ood": (np.zeros(0), np.zeros(0)),
    "diversity": (np.zeros((0, 3, 4)),),
}


def permuted(kind: str, args: tuple, seed: int = 1) -> tuple:
    """The same samples in another order (ID and OOD scores each shuffled on their own)."""
    rng = np.random.default_rng(seed)
    if kind == "classification":
        order = rng.permutation(len(args[1]))
        return args[0][order], args[1][order]
    return tuple(a[rng.permutation(len(a))] for a in args)


def float_args(args: tuple, convert) -> tuple:
    """Apply ``convert`` to the float arrays of ``args``, leave the labels as they are."""
    return tuple(convert(a) if np.issubdtype(a.dtype, np.floating) else a for a in args)


def labels_of(scores_id: np.ndarray, scores_ood: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(is_ood, score) for scikit-learn."""
    return np.r_[np.zeros(len(scores_id)), np.ones(len(scores_ood))], np.r_[scores_id, scores_ood]


# ---------------------------------------------------------------------------------------------
# Invariances over the registry

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(METRICS))
def test_numpy_and_torch_inputs_agree(name, device):
    info = METRICS[name]
    args = INPUTS[info.kind]()
    as_tensors = tuple(torch.as_tensor(a, device=device) for a in args)
    assert info.fn(*as_tensors) == info.fn(*args)


@pytest.mark.parametrize("name", sorted(METRICS))
def test_sample_order_does_not_matter(name):
    info = METRICS[name]
    args = INPUTS[info.kind]()
    expected = info.fn(*args)
    assert info.fn(*permuted(info.kind, args)) == pytest.approx(expected, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("name", sorted(METRICS))
def test_float32_inputs_are_computed_in_float64(name):
    info = METRICS[name]
    args32 = float_args(INPUTS[info.kind](), lambda a: a.astype(np.float32))
    value32 = info.fn(*args32)
    assert value32 == info.fn(*float_args(args32, lambda a: a.astype(np.float64)))
    assert isinstance(value32, float)
    assert value32 == info.fn(*float_args(args32, torch.from_numpy))


@pytest.mark.parametrize("name", sorted(METRICS))
def test_empty_input_warns_and_returns_nan(name):
    info = METRICS[name]
    with pytest.warns(UndefinedMetricWarning, match=f"{name} is undefined"):
        assert math.isnan(info.fn(*EMPTY[info.kind]))


@pytest.mark.parametrize(
    "name", sorted(n for n, info in METRICS.items() if info.higher_is_better is not None)
)
def test_direction_matches_higher_is_better(name):
    info = METRICS[name]
    if info.kind == "classification":
        labels = np.array([0, 1, 2, 0])
        good = np.full((4, 3), 0.05)
        good[np.arange(4), labels] = 0.9
        bad = np.roll(good, 1, axis=1)  # the same confidence on a wrong class
        good_args, bad_args = (good, labels), (bad, labels)
    else:
        good_args, bad_args = ([1.0, 2.0, 3.0], [-1.0, -2.0]), ([-1.0, -2.0], [1.0, 2.0, 3.0])
    better, worse = info.fn(*good_args), info.fn(*bad_args)
    assert (better > worse) if info.higher_is_better else (better < worse)


#: The key of each OOD metric in the dicts of ``ood_metrics`` and ``ood_replicates``.
OOD_KEYS = {"fpr_at_95": "fpr95", "fpr_at_95_tpr_id": "fpr95_tpr_id"}


def resampled_values(name: str, args: tuple, counts: list[np.ndarray]) -> np.ndarray:
    """The metric ``name`` on every resample of ``counts`` (one (B, N) array per input set), by
    the vectorised functions of hydra_core.metrics.bootstrap."""
    kind = METRICS[name].kind
    if kind == "classification":
        return classification_replicates(*args, counts[0])[name]
    if kind == "ood":
        return ood_replicates(*args, *counts)[OOD_KEYS.get(name, name)]
    return mean_replicates(METRICS[name].fn(*args, reduction="none"), counts[0])


@pytest.mark.parametrize("name", sorted(METRICS))
def test_every_metric_has_an_equal_resampled_form(name):
    # the bootstrap computes each metric on all resamples at once; on every resample it must
    # equal the metric itself on the resampled samples
    info = METRICS[name]
    args = INPUTS[info.kind]()
    sets = args if info.kind == "ood" else args[:1]  # ID and OOD scores are resampled apart
    rng = np.random.default_rng(0)
    counts = [rng.integers(0, 3, size=(6, len(a))) for a in sets]
    found = resampled_values(name, args, counts)
    for b in range(6):
        index = [np.repeat(np.arange(len(a)), c[b]) for a, c in zip(sets, counts, strict=True)]
        if info.kind == "ood":
            resampled = tuple(a[i] for a, i in zip(args, index, strict=True))
        else:
            resampled = tuple(a[index[0]] for a in args)
        assert found[b] == pytest.approx(info.fn(*resampled), abs=1e-9)


def test_bfloat16_probabilities_are_accepted():
    # A bfloat16 softmax sums to 1 only within ~4e-3, so the row check allows the dtype's epsilon;
    # the same values in float64 would be refused.
    logits = torch.randn(200, 10, generator=torch.Generator().manual_seed(0)) * 3
    probs = logits.to(torch.bfloat16).softmax(dim=1)
    labels = torch.randint(0, 10, (200,), generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="rows must sum to 1"):
        nll(probs.double(), labels)
    p_true = probs.double()[torch.arange(200), labels]
    assert nll(probs, labels) == pytest.approx(-p_true.log().mean().item(), rel=1e-12)
    assert accuracy(probs, labels) == (probs.argmax(dim=1) == labels).double().mean().item()


# ---------------------------------------------------------------------------------------------
# OOD metrics


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auroc_and_aupr_match_sklearn_with_ties(seed):
    s_id, s_ood = ood_inputs(seed)
    is_ood, score = labels_of(s_id, s_ood)
    assert auroc(s_id, s_ood) == pytest.approx(roc_auc_score(is_ood, -score), abs=1e-12)
    assert aupr_out(s_id, s_ood) == pytest.approx(
        average_precision_score(is_ood, -score), abs=1e-12
    )
    assert aupr_in(s_id, s_ood) == pytest.approx(
        average_precision_score(1 - is_ood, score), abs=1e-12
    )


def test_auroc_is_the_pairwise_probability_with_half_ties():
    s_id, s_ood = ood_inputs(3, decimals=0)
    pairs = s_ood[:, None] - s_id[None, :]
    expected = np.mean(pairs < 0) + 0.5 * np.mean(pairs == 0)
    assert auroc(s_id, s_ood) == pytest.approx(expected, abs=1e-12)


def first_fpr_at_95(positive: np.ndarray, score: np.ndarray, drop_intermediate: bool) -> float:
    fpr, tpr, _ = roc_curve(positive, score, drop_intermediate=drop_intermediate)
    return fpr[np.argmax(tpr >= 0.95)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fpr95_match_roc_curve_at_every_threshold(seed):
    s_id, s_ood = ood_inputs(seed)
    is_ood, score = labels_of(s_id, s_ood)
    assert fpr_at_95(s_id, s_ood) == first_fpr_at_95(is_ood, -score, drop_intermediate=False)
    assert fpr_at_95_tpr_id(s_id, s_ood) == first_fpr_at_95(
        1 - is_ood, score, drop_intermediate=False
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fpr95_equals_openood_code_without_ties(seed):
    s_id, s_ood = ood_inputs(seed, decimals=None)
    is_ood, score = labels_of(s_id, s_ood)
    # OpenOOD: fpr, tpr, _ = roc_curve(is_ood, -score); fpr[argmax(tpr >= 0.95)]
    assert fpr_at_95(s_id, s_ood) == first_fpr_at_95(is_ood, -score, drop_intermediate=True)


@pytest.mark.parametrize(
    ("s_id", "s_ood", "fpr95", "fpr95_tpr_id", "area"),
    [
        # Flag OOD when score <= t. Catching 95% of 4 OOD means all 4: t = 0.6, which flags the ID
        # score 0.3 -> 1/4. ID positive: accepting all 4 ID needs t = 0.3, which accepts the OOD
        # scores 0.6, 0.5, 0.4 -> 3/4. AUROC: 0.9, 0.8, 0.7 beat all 4 OOD, 0.3 beats only 0.2
        # -> (4 + 4 + 4 + 1) / 16.
        ([0.9, 0.8, 0.7, 0.3], [0.6, 0.5, 0.4, 0.2], 0.25, 0.75, 13 / 16),
        # 20 OOD: 19 of them at 0, 0.02, .., 0.36, one at 0.98. 95% = 19 OOD are caught at t = 0.36,
        # which flags only the ID score 0.31 -> 1/4 (catching all 20 would flag 3/4). ID positive:
        # accepting 4 of 4 ID (3 of 4 is below 95%) needs t = 0.31, which accepts the OOD scores
        # 0.32, 0.34, 0.36, 0.98 -> 4/20. AUROC: 0.31 beats the 16 OOD scores 0 .. 0.30, 0.5 and
        # 0.97 beat 19 each, 0.99 beats all 20 -> 74 / 80.
        ([0.31, 0.5, 0.97, 0.99], list(np.arange(19) * 0.02) + [0.98], 0.25, 0.2, 74 / 80),
    ],
)
def test_ood_metrics_hand_examples(s_id, s_ood, fpr95, fpr95_tpr_id, area):
    assert fpr_at_95(s_id, s_ood) == pytest.approx(fpr95)
    assert fpr_at_95_tpr_id(s_id, s_ood) == pytest.approx(fpr95_tpr_id)
    assert auroc(s_id, s_ood) == pytest.approx(area)


def test_fpr95_takes_the_first_threshold_where_openood_code_skips_it():
    # 20 OOD, 10 ID. Walking up from the lowest score: 17 OOD alone (scores 0 .. 0.16), then three
    # thresholds 0.5, 0.6, 0.7 each holding one OOD and one ID score. At 0.6, 19/20 = 95% of OOD
    # are caught and 2 of 10 ID flagged -> FPR@95 = 0.2. sklearn's roc_curve (drop_intermediate)
    # drops the collinear points (1, 18), (2, 19), so OpenOOD's code reports the next one, 0.3.
    s_ood = np.r_[np.arange(17) * 0.01, 0.5, 0.6, 0.7]
    s_id = np.r_[0.5, 0.6, 0.7, np.full(7, 0.9)]
    is_ood, score = labels_of(s_id, s_ood)
    assert fpr_at_95(s_id, s_ood) == pytest.approx(0.2)
    assert first_fpr_at_95(is_ood, -score, drop_intermediate=True) == pytest.approx(0.3)


def test_auroc_and_aupr_hand_example_with_a_tie():
    # Pairs (ID, OOD): (1, 1) tie = 1/2, (1, 0), (2, 1), (2, 0) ID higher -> 3.5 / 4.
    assert auroc([1.0, 2.0], [1.0, 0.0]) == pytest.approx(0.875)
    # ID positive, thresholds 3 (ID): P = 1, R = 1/2; 2 (OOD): P = 1/2, R = 1/2;
    # 1 (ID): P = 2/3, R = 1. AP = 1/2 * 1 + 0 * 1/2 + 1/2 * 2/3 = 5/6.
    assert aupr_in([3.0, 1.0], [2.0]) == pytest.approx(5 / 6)
    # OOD positive on -score: -1 (ID): P = 0, R = 0; -2 (OOD): P = 1/2, R = 1. AP = 1/2.
    assert aupr_out([3.0, 1.0], [2.0]) == pytest.approx(0.5)


def test_roc_curve_ood_matches_sklearn():
    s_id, s_ood = ood_inputs(4)
    is_ood, score = labels_of(s_id, s_ood)
    fpr, tpr = roc_curve_ood(s_id, s_ood)
    ref_fpr, ref_tpr, _ = roc_curve(is_ood, -score, drop_intermediate=False)
    np.testing.assert_allclose(fpr, ref_fpr, atol=1e-15)
    np.testing.assert_allclose(tpr, ref_tpr, atol=1e-15)
    assert np.trapezoid(tpr, fpr) == pytest.approx(auroc(s_id, s_ood))


def test_ood_metrics_dict_matches_each_metric():
    s_id, s_ood = ood_inputs(5)
    assert ood_metrics(s_id, s_ood) == {
        "auroc": auroc(s_id, s_ood),
        "fpr95": fpr_at_95(s_id, s_ood),
        "aupr_in": aupr_in(s_id, s_ood),
        "aupr_out": aupr_out(s_id, s_ood),
        "fpr95_tpr_id": fpr_at_95_tpr_id(s_id, s_ood),
    }


def test_infinite_scores_are_ordinary_extremes():
    # Pairs (ID, OOD): (inf, -inf) 1, (inf, inf) tie 1/2, (1, -inf) 1, (1, inf) 0 -> 2.5 / 4.
    assert auroc([np.inf, 1.0], [-np.inf, np.inf]) == pytest.approx(0.625)


# ---------------------------------------------------------------------------------------------
# Classification metrics

# Five samples, two classes (confidence, right/wrong):
# 0.9 right, 0.75 wrong, 0.7 right, 0.55 right, 0.95 wrong.
HAND_PROBS = np.array([[0.9, 0.1], [0.25, 0.75], [0.7, 0.3], [0.45, 0.55], [0.95, 0.05]])
HAND_LABELS = np.array([0, 0, 0, 1, 1])


@pytest.mark.parametrize(
    ("metric", "n_bins", "expected"),
    [
        # 5 bins, edges 0.2 apart: (0.8, 1] holds 0.9 R, 0.95 W: |0.5 - 0.925| = 0.425, weight 2/5;
        # (0.6, 0.8] holds 0.75 W, 0.7 R: |0.5 - 0.725| = 0.225, weight 2/5; (0.4, 0.6] holds
        # 0.55 R: |1 - 0.55| = 0.45, weight 1/5. ECE = (0.85 + 0.45 + 0.45) / 5 = 0.35.
        (ece, 5, 0.35),
        # 15 bins (k/15 edges) put every sample alone: ECE = mean |correct - confidence|
        # = (0.1 + 0.75 + 0.3 + 0.45 + 0.95) / 5 = 0.51.
        (ece, 15, 0.51),
        # 1 bin: |accuracy - mean confidence| = |3/5 - 3.85/5| = 0.17.
        (ece, 1, 0.17),
        # 2 equal-mass bins over sorted confidence, sizes 3 and 2: {0.55 R, 0.7 R, 0.75 W}: accuracy
        # 2/3 = mean confidence 2/3 -> gap 0; {0.9 R, 0.95 W}: |0.5 - 0.925| = 0.425, weight 2/5.
        # Adaptive ECE = 0.17.
        (adaptive_ece, 2, 0.17),
        # 5 equal-mass bins of one sample each: 0.51 as above.
        (adaptive_ece, 5, 0.51),
        # 15 equal-mass bins for 5 samples: 10 empty bins are skipped, the same 0.51.
        (adaptive_ece, 15, 0.51),
    ],
)
def test_calibration_errors_hand_examples(metric, n_bins, expected):
    assert metric(HAND_PROBS, HAND_LABELS, n_bins=n_bins) == pytest.approx(expected)


def test_adaptive_ece_ties_are_ordered_wrong_before_right():
    # Confidences 0.6 R, 0.8 R, 0.8 W, 0.9 W in 2 equal-mass bins; the tie at 0.8 straddles the
    # split. Wrong first: {0.6 R, 0.8 W}: |0.5 - 0.7| = 0.2; {0.8 R, 0.9 W}: |0.5 - 0.85| = 0.35
    # -> (0.2 + 0.35) / 2 = 0.275, whichever of the two 0.8 samples comes first in the input.
    probs = np.array([[0.6, 0.4], [0.8, 0.2], [0.8, 0.2], [0.9, 0.1]])
    assert adaptive_ece(probs, [0, 0, 1, 1], n_bins=2) == pytest.approx(0.275)
    assert adaptive_ece(probs, [0, 1, 0, 1], n_bins=2) == pytest.approx(0.275)


def test_ece_confidence_one_falls_in_the_last_bin():
    probs = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert ece(probs, [0, 0]) == pytest.approx(0.5)  # last bin: |1/2 - 1|
    assert reliability_curve(probs, [0, 0])["count"].iloc[-1] == 2


def test_reliability_curve_hand_example_and_ece_from_it():
    table = reliability_curve(HAND_PROBS, HAND_LABELS, n_bins=5)
    assert list(table.columns) == ["bin_lower", "bin_upper", "confidence", "accuracy", "count"]
    np.testing.assert_allclose(table["bin_lower"], [0, 0.2, 0.4, 0.6, 0.8])
    np.testing.assert_allclose(table["bin_upper"], [0.2, 0.4, 0.6, 0.8, 1.0])
    assert list(table["count"]) == [0, 0, 1, 2, 2]
    np.testing.assert_allclose(table["confidence"], [np.nan, np.nan, 0.55, 0.725, 0.925])
    np.testing.assert_allclose(table["accuracy"], [np.nan, np.nan, 1.0, 0.5, 0.5])
    probs, labels = classification_inputs()
    table = reliability_curve(probs, labels)
    from_table = np.nansum(table["count"] * (table["accuracy"] - table["confidence"]).abs())
    assert from_table / len(labels) == pytest.approx(ece(probs, labels))


@pytest.mark.parametrize("seed", [0, 1])
def test_nll_matches_sklearn_log_loss(seed):
    probs, labels = classification_inputs(seed)
    probs = 0.9 * probs + 0.1 / 4
    assert nll(probs, labels) == pytest.approx(log_loss(labels, probs, labels=range(4)), rel=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_nll_matches_sklearn_log_loss_on_very_confident_wrong_predictions(seed):
    # softmax of large logits: p_y far below 1e-12, down to 0 in float64, where the old 1e-12 floor
    # gave a lower NLL than scikit-learn (which clips at float64 eps only)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(200, 4, generator=g, dtype=torch.float64) * 40
    probs = logits.softmax(-1).numpy()
    labels = torch.randint(0, 4, (200,), generator=g).numpy()
    assert (probs[np.arange(200), labels] < 1e-12).any()
    expected = log_loss(labels, probs, labels=range(4))
    assert nll(probs, labels) == pytest.approx(expected, rel=1e-12)
    assert classification_metrics(probs, labels)["nll"] == pytest.approx(expected, rel=1e-12)


def test_nll_clips_at_float_eps_like_sklearn():
    eps = np.finfo(np.float64).eps
    assert nll([[1.0, 0.0]], [1]) == pytest.approx(-math.log(eps))
    assert nll([[1.0, 0.0]], [1]) == pytest.approx(log_loss([1], [[1.0, 0.0]], labels=[0, 1]))


def test_log_p_true_is_log_softmax_and_log_mean_exp_of_members():
    g = torch.Generator().manual_seed(0)
    single = torch.randn(50, 5, generator=g, dtype=torch.float64) * 3
    members = torch.randn(50, 3, 5, generator=g, dtype=torch.float64) * 3
    y = torch.randint(0, 5, (50,), generator=g)
    rows = torch.arange(50)
    np.testing.assert_allclose(
        log_p_true(single, y), single.softmax(-1)[rows, y].log().numpy(), rtol=1e-12
    )
    mean_p = members.softmax(-1).mean(1)[rows, y]
    np.testing.assert_allclose(log_p_true(members, y), mean_p.log().numpy(), rtol=1e-12)
    # where every member's p_y underflows to 0, the log-mean-exp stays finite and exact
    extreme = torch.tensor([[[0.0, 800.0], [0.0, 900.0]]], dtype=torch.float64)
    value = log_p_true(extreme, torch.tensor([0]))[0]
    assert np.isfinite(value)
    assert value == pytest.approx(-800.0 - math.log(2.0), rel=1e-12)
    with pytest.raises(ValueError, match="logits must be"):
        log_p_true(single[:, None, None], y)


def test_classification_metrics_take_exact_log_p_true():
    probs = torch.tensor([[1.0, 0.0], [0.5, 0.5]], dtype=torch.float64)
    exact = np.array([-700.0, math.log(0.5)])
    found = classification_metrics(probs, [1, 0], log_p_true=exact)
    assert found["nll"] == pytest.approx(350.0 - math.log(0.5) / 2)
    with pytest.raises(ValueError, match="log_p_true must be 2 log-probabilities"):
        classification_metrics(probs, [1, 0], log_p_true=[0.5, -1.0])


@pytest.mark.parametrize(
    ("probs", "labels", "expected"),
    [
        ([[0.7, 0.2, 0.1]], [0], 0.3**2 + 0.2**2 + 0.1**2),  # 0.14
        ([[1.0, 0.0]], [0], 0.0),  # perfect
        ([[1.0, 0.0]], [1], 2.0),  # confidently wrong: the top of the range
        ([[0.5, 0.5], [0.2, 0.8]], [0, 1], (0.5 + 0.08) / 2),
    ],
)
def test_brier_hand_examples(probs, labels, expected):
    assert brier(probs, labels) == pytest.approx(expected)


def test_brier_matches_the_formula_on_random_data():
    probs, labels = classification_inputs(2)
    onehot = np.eye(4)[labels]
    assert brier(probs, labels) == pytest.approx(np.mean(np.sum((probs - onehot) ** 2, 1)))


def test_accuracy_is_top1_with_ties_to_the_lowest_class():
    assert accuracy([[0.5, 0.5], [0.2, 0.8], [0.6, 0.4]], [0, 1, 1]) == pytest.approx(2 / 3)


def test_classification_metrics_dict_matches_each_metric():
    probs, labels = classification_inputs(3)
    assert classification_metrics(probs, labels, n_bins=10) == {
        "accuracy": accuracy(probs, labels),
        "nll": nll(probs, labels),
        "brier": brier(probs, labels),
        "ece": ece(probs, labels, n_bins=10),
        "adaptive_ece": adaptive_ece(probs, labels, n_bins=10),
    }


# ---------------------------------------------------------------------------------------------
# Diversity


def entropy(p) -> float:
    return -sum(x * math.log(x) for x in p if x > 0)


@pytest.mark.parametrize(
    ("members", "mi", "dis"),
    [
        # Two members that agree exactly: nothing epistemic, no disagreement.
        ([[0.7, 0.3], [0.7, 0.3]], 0.0, 0.0),
        # Two confident members on different classes: H(0.5, 0.5) - 0 = log 2; the one pair differs.
        ([[1.0, 0.0], [0.0, 1.0]], math.log(2), 1.0),
        # M = 3 predicting (0, 0, 1): 1 - C(2, 2) / C(3, 2) = 1 - 1/3. Mean probs (2/3, 1/3).
        (
            [[0.9, 0.1], [0.9, 0.1], [0.2, 0.8]],
            entropy([2 / 3, 1 / 3]) - (2 * entropy([0.9, 0.1]) + entropy([0.2, 0.8])) / 3,
            1 - 1 / 3,
        ),
        # M = 4 predicting (0, 0, 1, 2): 1 - C(2, 2) / C(4, 2) = 5/6.
        (
            [[0.8, 0.1, 0.1], [0.6, 0.2, 0.2], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]],
            entropy([0.4, 0.3, 0.3])
            - (entropy([0.8, 0.1, 0.1]) * 3 + entropy([0.6, 0.2, 0.2])) / 4,
            5 / 6,
        ),
    ],
)
def test_diversity_hand_examples(members, mi, dis):
    member_probs = np.array([members])  # one sample
    assert mutual_information(member_probs) == pytest.approx(mi, abs=1e-12)
    assert disagreement(member_probs) == pytest.approx(dis)


def test_diversity_per_sample_values_and_ranges():
    (member_probs,) = diversity_inputs()
    mi = mutual_information(member_probs, reduction="none")
    dis = disagreement(member_probs, reduction="none")
    assert mi.shape == dis.shape == (50,)
    assert np.all(mi >= 0) and np.all(mi <= math.log(4) + 1e-12)
    assert set(np.round(dis * 3, 9)) <= {0.0, 2.0, 3.0}  # 3 members: 0, 2/3 or 1
    assert mutual_information(member_probs) == pytest.approx(mi.mean())
    assert diversity_metrics(member_probs) == {
        "mutual_information": mutual_information(member_probs),
        "disagreement": disagreement(member_probs),
    }


def test_single_member_has_zero_mutual_information():
    assert mutual_information(random_probs(np.random.default_rng(0), (5, 1, 3))) == 0.0


# ---------------------------------------------------------------------------------------------
# OOD scores


def test_scores_match_their_formulas():
    logits = torch.randn(6, 5, generator=torch.Generator().manual_seed(0)) * 2
    probs = logits.softmax(dim=1)
    np.testing.assert_allclose(msp(probs), probs.max(dim=1).values.double(), rtol=1e-6)
    np.testing.assert_allclose(max_logit(logits), logits.max(dim=1).values.double())
    np.testing.assert_allclose(energy(logits), torch.logsumexp(logits.double(), dim=1))
    np.testing.assert_allclose(
        energy(logits, temperature=2.0), 2 * torch.logsumexp(logits.double() / 2, dim=1)
    )
    expected = (probs.double() * probs.double().log()).sum(dim=1)
    np.testing.assert_allclose(neg_entropy(probs), expected, rtol=1e-6)
    assert neg_entropy(np.full((1, 4), 0.25))[0] == pytest.approx(-math.log(4))
    assert neg_entropy([[1.0, 0.0]])[0] == 0.0


@pytest.mark.parametrize("method", ["msp", "max_logit", "energy", "entropy"])
def test_every_score_ranks_a_confident_sample_above_a_flat_one(method):
    logits = np.array([[8.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    confident, flat = ood_score(method, logits=logits)
    assert confident > flat


def test_ensemble_scores_average_probs_for_msp_and_entropy_and_logits_for_the_rest():
    logits = torch.randn(7, 3, 5, generator=torch.Generator().manual_seed(2)) * 3  # (N, M, C)
    probs = logits.double().softmax(dim=2)
    mean_probs, mean_logits = probs.mean(dim=1), logits.double().mean(dim=1)
    np.testing.assert_allclose(msp(probs), msp(mean_probs))
    np.testing.assert_allclose(neg_entropy(probs), neg_entropy(mean_probs))
    np.testing.assert_allclose(max_logit(logits), max_logit(mean_logits))
    np.testing.assert_allclose(energy(logits), energy(mean_logits))
    np.testing.assert_allclose(ood_score("msp", logits=logits), msp(mean_probs))
    np.testing.assert_allclose(ood_score("entropy", probs=probs), neg_entropy(mean_probs))
    np.testing.assert_allclose(ood_score("energy", logits=logits), energy(mean_logits))


# ---------------------------------------------------------------------------------------------
# Errors and undefined cases

P2 = np.array([[0.6, 0.4], [0.3, 0.7], [0.5, 0.5]])
Y2 = np.array([0, 1, 1])


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: accuracy(P2, [0, 1]), r"probs has shape \(3, 2\), labels has shape \(2,\)"),
        (
            lambda: nll(np.log(P2) * 3, Y2),
            r"must lie in \[0, 1\].*did you pass logits\? apply softmax",
        ),
        (lambda: brier(P2 * 0.9, Y2), r"rows must sum to 1 .*did you pass logits\? apply softmax"),
        (lambda: ece(P2, [0, 1, 2]), r"labels out of range \[0, 2\): found 2"),
        (lambda: ece(P2, [0, -1, 1]), r"labels out of range \[0, 2\): found -1"),
        (lambda: accuracy(P2, [0.0, 1.0, 1.0]), r"integer class indices, got dtype float64"),
        (lambda: accuracy(P2, [[0, 1, 1]]), r"labels must be 1-D"),
        (lambda: accuracy(np.where(P2 == 0.5, np.nan, P2), Y2), r"probs contains 2 NaN"),
        (lambda: accuracy(P2[:, None, :], Y2), r"2-D \(N, C\).*mean of member probabilities"),
        (lambda: accuracy(P2[0], Y2), r"probs must be 2-D \(N, C\), got shape \(2,\)"),
        (lambda: ece(P2, Y2, n_bins=0), r"n_bins must be a positive integer, got 0"),
        (lambda: adaptive_ece(P2, Y2, n_bins=2.5), r"n_bins must be a positive integer"),
        (lambda: auroc([0.1, np.nan], [0.2]), r"id_scores contains 1 NaN"),
        (lambda: fpr_at_95([0.1], [[0.2]]), r"ood_scores must be 1-D \(N,\), got shape \(1, 1\)"),
        (
            lambda: mutual_information(P2),
            r"member_probs must be 3-D \(N, M, C\), got shape \(3, 2\)",
        ),
        (lambda: disagreement(P2[:, None] * 2), r"member_probs must lie in \[0, 1\]"),
        (lambda: disagreement(P2[:, None], reduction="sum"), r"reduction must be 'mean' or 'none'"),
        (
            lambda: ood_score("mahalanobis", probs=P2),
            r"unknown OOD score method 'mahalanobis'; valid methods: 'msp', 'max_logit', 'energy', "
            r"'entropy'",
        ),
        (lambda: ood_score("energy", probs=P2), r"'energy' needs logits"),
        (lambda: ood_score("msp"), r"'msp' needs probs or logits"),
        (lambda: energy(P2, temperature=0.0), r"temperature must be positive, got 0.0"),
        (lambda: max_logit([[0.0, np.inf]]), r"logits contain infinite values"),
        (
            lambda: max_logit([0.0, 1.0]),
            r"logits must be \(N, C\) or, for an ensemble, \(N, M, C\)",
        ),
        (lambda: msp(P2 * 2), r"probs must lie in \[0, 1\].*apply softmax"),
    ],
)
def test_bad_input_raises_a_named_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: auroc([0.1, 0.2], []), r"auroc is undefined: .* got 2 ID and 0 OOD"),
        (lambda: aupr_in([], [0.3]), r"aupr_in is undefined: .* got 0 ID and 1 OOD"),
        (lambda: fpr_at_95_tpr_id([0.1], []), r"fpr_at_95_tpr_id is undefined"),
        (
            lambda: disagreement(P2[:, None]),
            r"disagreement is undefined: .* at least 2 members, got 1",
        ),
        (
            lambda: mutual_information(np.zeros((3, 0, 2))),
            r"mutual_information is undefined: no members",
        ),
        (lambda: nll(np.zeros((0, 3)), []), r"nll is undefined: no samples"),
    ],
)
def test_undefined_cases_warn_and_return_nan(call, match):
    with pytest.warns(UndefinedMetricWarning, match=match) as record:
        assert math.isnan(call())
    assert record[0].filename == __file__  # the warning points at the caller


def test_undefined_per_sample_values_are_nan_arrays():
    with pytest.warns(UndefinedMetricWarning, match="at least 2 members"):
        values = disagreement(P2[:, None], reduction="none")
    assert values.shape == (3,) and np.isnan(values).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an empty per-sample result is well defined
        assert disagreement(np.zeros((0, 2, 3)), reduction="none").shape == (0,)


@pytest.mark.parametrize(
    ("call", "keys"),
    [
        (
            lambda: classification_metrics(np.zeros((0, 2)), []),
            ["accuracy", "nll", "brier", "ece", "adaptive_ece"],
        ),
        (lambda: ood_metrics([0.5], []), ["auroc", "fpr95", "aupr_in", "aupr_out", "fpr95_tpr_id"]),
        (lambda: diversity_metrics(np.zeros((0, 2, 3))), ["mutual_information", "disagreement"]),
    ],
)
def test_metric_dicts_of_undefined_inputs_are_nan(call, keys):
    with pytest.warns(UndefinedMetricWarning):
        result = call()
    assert list(result) == keys and all(math.isnan(v) for v in result.values())


def test_roc_curve_ood_without_ood_samples_is_empty():
    with pytest.warns(UndefinedMetricWarning, match="roc_curve_ood is undefined"):
        fpr, tpr = roc_curve_ood([0.1, 0.2], [])
    assert fpr.shape == tpr.shape == (0,)
