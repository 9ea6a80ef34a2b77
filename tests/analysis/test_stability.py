"""Stability of a greedy search under bootstrap resamples, and the held-out curve: exact against
independent searches and plain computations."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from hydra_core.analysis._maps import Scorer, WeightedScorer
from hydra_core.analysis.greedy import greedy_circuit
from hydra_core.analysis.holdout import held_out_curve, holdout_split
from hydra_core.analysis.stability import (
    Resamples,
    StabilityResult,
    greedy_stability,
    load_stability,
)
from hydra_core.cache import DiskCache
from hydra_core.errors import InputError
from hydra_core.models.adapter import ablate, head_layout
from tests.analysis.test_greedy import make_data
from tests.analysis.test_text_search import text_data
from tests.conftest import make_tiny_text, make_tiny_vit

STRATA = ("a",) * 12 + ("b",) * 12


@pytest.fixture(scope="module")
def vit():
    return make_tiny_vit().eval()


@pytest.fixture(scope="module")
def data():
    return make_data()


# --- the weighted scorer -------------------------------------------------------------------------


def test_weighted_scorer_equals_the_scorer_on_the_written_out_resample():
    g = torch.Generator().manual_seed(0)
    n_id, n_ood, classes = 9, 7, 4
    logits = torch.randn(3, n_id + n_ood, classes, generator=g)
    logits[:, 2] = logits[:, n_id + 1]  # an exact MSP tie between an ID and an OOD sample
    labels = torch.randint(0, classes, (n_id,), generator=g)
    id_index = torch.randint(0, n_id, (5, n_id), generator=g)
    ood_index = torch.randint(0, n_ood, (5, n_ood), generator=g)
    id_counts = torch.stack([torch.bincount(r, minlength=n_id) for r in id_index])
    ood_counts = torch.stack([torch.bincount(r, minlength=n_ood) for r in ood_index])
    acc, roc = WeightedScorer(labels, id_counts, ood_counts)(logits)
    assert acc.shape == roc.shape == (3, 5)
    for b in range(5):
        rows = torch.cat([id_index[b], ood_index[b] + n_id])
        expected_acc, expected_roc = Scorer(labels[id_index[b]], n_id)(logits[:, rows])
        assert torch.equal(acc[:, b], expected_acc)  # bit for bit
        assert torch.equal(roc[:, b], expected_roc)
        msp = logits[:, rows].softmax(-1).amax(-1).double().numpy()
        for c in range(3):
            truth = np.r_[np.zeros(n_id), np.ones(n_ood)]
            assert roc[c, b].item() == pytest.approx(roc_auc_score(truth, -msp[c]), abs=1e-12)


def test_resamples_are_stratified(data):
    _, id_y, _ = data
    draws = Resamples.draw(id_y, STRATA, 20, seed=1)
    for b in range(20):
        assert torch.equal(id_y[draws.id_index[b]].sort().values, id_y.sort().values)
        drawn_sets = sorted(STRATA[i] for i in draws.ood_index[b])
        assert drawn_sets == sorted(STRATA)
    again = Resamples.draw(id_y, STRATA, 20, seed=1)
    assert np.array_equal(draws.id_index, again.id_index)
    assert not np.array_equal(draws.id_index, Resamples.draw(id_y, STRATA, 20, 2).id_index)


# --- exact against independent searches -----------------------------------------------------------


@pytest.mark.parametrize("objective", ["acc", "ood", "avg"])
def test_every_path_equals_an_independent_search(vit, data, objective):
    id_x, id_y, ood_x = data
    found = greedy_stability(
        vit, *data, objective=objective, budget=6, resamples=5, seed=3, ood_strata=STRATA
    )
    draws = Resamples.draw(id_y, STRATA, 5, 3)
    for b in range(5):
        alone = greedy_circuit(
            vit, *draws.inputs(b, id_x, id_y, ood_x), objective=objective, budget=6
        )
        assert found.orders[b] == alone.order, f"resample {b}"
        assert found.scores[b] == pytest.approx(alone.scores, abs=1e-9)
        assert found.accuracy[b] == pytest.approx(alone.accuracy, abs=1e-9)
        assert found.auroc[b] == pytest.approx(alone.auroc, abs=1e-9)
    assert found.complete and found.steps == 6
    assert found.step_groups[0] == 1  # every resample starts from the dense model together
    assert found.group_steps == sum(found.step_groups) <= 5 * 6


def test_plain_method_gives_the_same_paths(vit, data):
    fast = greedy_stability(vit, *data, objective="avg", budget=4, resamples=3, seed=0)
    plain = greedy_stability(
        vit, *data, objective="avg", budget=4, resamples=3, seed=0, method="plain"
    )
    assert fast.orders == plain.orders


@pytest.mark.parametrize("objective", ["acc", "ood", "avg"])
def test_text_paths_equal_independent_searches(objective):
    model = make_tiny_text("bert", depth=3)
    id_x, id_y, ood_x = text_data(seed=1, n=16)
    found = greedy_stability(
        model, id_x, id_y, ood_x, objective=objective, budget=4, resamples=4, seed=5
    )
    draws = Resamples.draw(id_y, ["ood"] * 16, 4, 5)
    for b in range(4):
        alone = greedy_circuit(
            model, *draws.inputs(b, id_x, id_y, ood_x), objective=objective, budget=4
        )
        assert found.orders[b] == alone.order, f"resample {b}"


# --- what the paths say ---------------------------------------------------------------------------


def _result(orders, num_heads=(3, 3)) -> StabilityResult:
    zeros = [[0.0] * len(o) for o in orders]
    return StabilityResult(
        objective="avg",
        budget=len(orders[0]),
        seed=0,
        method="fast",
        num_heads=num_heads,
        n_id=4,
        n_ood=4,
        orders=orders,
        scores=zeros,
        accuracy=zeros,
        auroc=zeros,
    )


def test_frequency_agreement_and_jaccard_by_hand():
    orders = [[(0, 0), (1, 2)], [(0, 0), (1, 1)], [(1, 2), (0, 0)], [(0, 0), (1, 2)]]
    r = _result(orders)
    freq = r.frequency()
    assert freq[0, 0] == 1.0 and freq[1, 2] == 0.75 and freq[1, 1] == 0.25 and freq[0, 1] == 0
    assert r.frequency(1)[0, 0] == 0.75
    assert r.agreement() == [((0, 0), 0.75), ((1, 2), 0.5)]
    sets = [set(o) for o in orders]
    expected = np.mean([len(a & b) / len(a | b) for a, b in combinations(sets, 2)])
    assert r.jaccard() == pytest.approx(expected)
    assert r.jaccard_curve()[0] == pytest.approx(
        np.mean([len(a & b) / len(a | b) for a, b in combinations([{o[0]} for o in orders], 2)])
    )
    removed, kept = r.stable_heads(0.75)
    assert removed == [(0, 0), (1, 2)]
    assert (0, 1) in kept and (1, 1) in kept and (0, 0) not in kept
    assert math.isnan(_result(orders, (3, 2)).frequency()[1, 2])


def test_round_trip_and_malformed_files():
    r = _result([[(0, 0), (1, 2)], [(0, 1), (1, 1)]])
    back = StabilityResult.from_dict(r.to_dict())
    assert back.orders == r.orders and back.num_heads == r.num_heads
    assert r.to_dict()["frequency"][0][0] == 0.5
    bad = r.to_dict()
    bad["orders"][0].append([5, 0])
    with pytest.raises(ValueError, match="malformed"):
        StabilityResult.from_dict(bad)
    with pytest.raises(ValueError, match="hydra-stability"):
        StabilityResult.from_dict({"format": "hydra-greedy"})


# --- resuming -------------------------------------------------------------------------------------


def test_stopped_run_resumes_to_the_same_paths(vit, data, tmp_path):
    cache = DiskCache(tmp_path)
    whole = greedy_stability(vit, *data, budget=5, resamples=4, seed=2)
    calls = {"n": 0}

    def stop_after_three() -> bool:
        calls["n"] += 1
        return calls["n"] > 3

    partial = greedy_stability(
        vit, *data, budget=5, resamples=4, seed=2, cache=cache, should_stop=stop_after_three
    )
    assert not partial.complete
    saved = load_stability(vit, *data, cache, objective="avg", resamples=4, seed=2)
    assert saved is not None and saved.orders == partial.orders
    resumed = greedy_stability(vit, *data, budget=5, resamples=4, seed=2, cache=cache)
    assert resumed.complete and resumed.orders == whole.orders
    shorter = greedy_stability(vit, *data, budget=3, resamples=4, seed=2, cache=cache)
    assert shorter.orders == [o[:3] for o in whole.orders]
    longer = greedy_stability(vit, *data, budget=7, resamples=4, seed=2, cache=cache)
    assert [o[:5] for o in longer.orders] == whole.orders


def test_bad_arguments_are_refused(vit, data):
    with pytest.raises(InputError, match="resamples"):
        greedy_stability(vit, *data, budget=3, resamples=1)
    with pytest.raises(InputError, match="budget"):
        greedy_stability(vit, *data, budget=0, resamples=3)
    with pytest.raises(ValueError, match="ood_strata"):
        greedy_stability(vit, *data, budget=2, resamples=3, ood_strata=["a"] * 3)


# --- held-out curve -------------------------------------------------------------------------------


def test_holdout_split_is_stratified_and_disjoint(data):
    _, id_y, _ = data
    split = holdout_split(id_y, STRATA, 0.25)
    assert set(split.id_search.tolist()).isdisjoint(split.id_held_out.tolist())
    assert sorted(split.id_search.tolist() + split.id_held_out.tolist()) == list(range(24))
    for c in id_y.unique():
        held = (id_y[split.id_held_out] == c).sum()
        assert 1 <= held < (id_y == c).sum()
    held_sets = [STRATA[i] for i in split.ood_held_out]
    assert held_sets.count("a") == held_sets.count("b") == 3
    with pytest.raises(InputError, match="strictly between 0 and 1"):
        holdout_split(id_y, STRATA, 1.0)
    # a class of one sample stays in the search part; nothing to hold out is refused
    lone = holdout_split(torch.tensor([0, 1, 1, 2, 2]), ["a"] * 4, 0.5)
    assert 0 in lone.id_search.tolist() and len(lone.id_held_out) == 2
    with pytest.raises(InputError, match="would hold 1 ID sample"):
        holdout_split(torch.tensor([0, 1, 1]), ["a", "a"], 0.5)


def test_held_out_curve_equals_plain_forwards(vit, data):
    id_x, id_y, ood_x = data
    split = holdout_split(id_y, STRATA, 0.5, seed=1)
    result = greedy_circuit(
        vit, id_x[split.id_search], id_y[split.id_search], ood_x[split.ood_search], budget=5
    )
    hx, hy, hood = id_x[split.id_held_out], id_y[split.id_held_out], ood_x[split.ood_held_out]
    strata = [STRATA[i] for i in split.ood_held_out]
    curve = held_out_curve(vit, result, hx, hy, hood, ood_strata=strata, n_boot=200)
    assert curve.search == [result.base_score, *result.scores]
    truth = np.r_[np.zeros(len(hx)), np.ones(len(hood))]
    for step in range(result.steps + 1):
        with torch.inference_mode(), ablate(vit, result.keep_mask(step)):
            logits = vit(torch.cat([hx, hood])).double()
        accuracy = float((logits[: len(hx)].argmax(-1) == hy).double().mean())
        auroc = roc_auc_score(truth, -logits.softmax(-1).amax(-1).numpy())
        assert curve.held_out_accuracy[step] == pytest.approx(accuracy, abs=1e-12)
        assert curve.held_out_auroc[step] == pytest.approx(auroc, abs=1e-6)
        assert curve.held_out[step] == pytest.approx((accuracy + auroc) / 2, abs=1e-6)
        assert curve.held_out_lo[step] <= curve.held_out[step] + 1e-9
        assert curve.held_out[step] - 1e-9 <= curve.held_out_hi[step]
    assert curve.peak == int(np.argmax(curve.held_out))
    assert curve.frame().shape[0] == result.steps + 1
    assert curve.beyond_peak(curve.peak + 1) and not curve.beyond_peak(curve.peak)


def test_the_bench_work_ratio_counts_each_groups_union_of_items(vit, data):
    """bench/stability.py's floor: the first step costs the union of the resamples' items; a
    whole run costs at least that step and at most what the resamples would cost alone."""
    from bench.stability import work_ratio

    id_x, id_y, ood_x = data
    total, n = sum(head_layout(vit).num_heads), (len(id_x), len(ood_x))
    draws = Resamples.draw(id_y, ("ood",) * len(ood_x), 3, 0)
    id_counts, ood_counts = draws.counts(*n)

    def ratio(budget: int) -> float:
        found = greedy_stability(vit, *data, budget=budget, resamples=3, seed=0)
        return work_ratio(found, draws, *n, total)

    union = int((id_counts.sum(0) > 0).sum() + (ood_counts.sum(0) > 0).sum()) / sum(n)
    assert ratio(1) == pytest.approx(union)  # one step: one group, every drawn item
    first = total / sum(total - t for t in range(4))  # the first step's share of the work
    singles = sum(
        (len(set(draws.id_index[b])) + len(set(draws.ood_index[b]))) / sum(n) for b in range(3)
    )
    assert union * first <= ratio(4) <= singles + 1e-12
