"""The search objective over several OOD search sets: pooled (one AUROC), the mean or the worst
set's AUROC; fast and plain make the same choices, ``pooled`` is today's search bit for bit, and
the cache never mixes two aggregates."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from hydra_core.analysis import greedy_cache_key, greedy_circuit
from hydra_core.analysis._maps import Scorer, aggregate_auroc
from hydra_core.cache import DiskCache
from hydra_core.models.adapter import ablate
from tests.analysis.test_greedy import assert_identical, assert_same_search
from tests.conftest import TINY_CONFIGS, make_tiny_vit

N_ID, N_OOD = 24, 30
SETS = ("a",) * 10 + ("b",) * 12 + ("c",) * 8  # three OOD sets of unequal size


def make_data():
    g = torch.Generator().manual_seed(3)
    id_x = torch.randn(N_ID, 1, 16, 16, generator=g, dtype=torch.float64)
    id_y = torch.randint(0, 5, (N_ID,), generator=g)
    scale = torch.tensor([0.5] * 10 + [1.5] * 12 + [3.0] * 8, dtype=torch.float64)
    ood_x = scale[:, None, None, None] * torch.randn(N_OOD, 1, 16, 16, generator=g).double()
    order = torch.randperm(N_OOD, generator=g)  # sets interleaved, as a pooled sample is
    return id_x, id_y, ood_x[order], tuple(SETS[i] for i in order.tolist())


@pytest.fixture(scope="module")
def data():
    return make_data()


def per_set_auroc(model, keep, id_x, ood_x, sets) -> dict[str, float]:
    """sklearn's MSP AUROC of the ID items against each OOD set, the model ablated by ``keep``."""
    with torch.inference_mode(), ablate(model, keep):
        msp = model(torch.cat([id_x, ood_x])).double().softmax(-1).amax(-1).numpy()
    found = {}
    for name in dict.fromkeys(sets):
        rows = N_ID + np.flatnonzero(np.array(sets) == name)
        scores = np.r_[msp[:N_ID], msp[rows]]
        found[name] = roc_auc_score(np.r_[np.zeros(N_ID), np.ones(len(rows))], -scores)
    return found


def test_aggregate_auroc_matches_sklearn_per_set():
    g = torch.Generator().manual_seed(0)
    id_scores = torch.rand(4, 20, generator=g).round(decimals=1)  # ties on purpose
    ood_scores = torch.rand(4, 15, generator=g).round(decimals=1)
    groups = torch.tensor([0] * 5 + [1] * 6 + [2] * 4)[torch.randperm(15, generator=g)]
    for c in range(4):
        per_set = [
            roc_auc_score(
                np.r_[np.zeros(20), np.ones(int((groups == k).sum()))],
                -np.r_[id_scores[c].numpy(), ood_scores[c, groups == k].numpy()],
            )
            for k in range(3)
        ]
        mean = aggregate_auroc(id_scores, ood_scores, groups, "mean")[c]
        worst = aggregate_auroc(id_scores, ood_scores, groups, "min")[c]
        assert float(mean) == pytest.approx(np.mean(per_set), abs=1e-12)
        assert float(worst) == pytest.approx(min(per_set), abs=1e-12)
    pooled = aggregate_auroc(id_scores, ood_scores, groups, "pooled")
    assert torch.equal(pooled, aggregate_auroc(id_scores, ood_scores, None, "pooled"))


@pytest.mark.parametrize("aggregate", ["mean", "min"])
@pytest.mark.parametrize("objective", ["ood", "avg"])
def test_fast_equals_plain_and_scores_are_the_aggregate(aggregate, objective, data):
    id_x, id_y, ood_x, sets = data
    model = make_tiny_vit(**TINY_CONFIGS["layerscale"]).double()
    options = dict(objective=objective, budget=6, ood_sets=sets, ood_aggregate=aggregate)
    fast = greedy_circuit(model, id_x, id_y, ood_x, method="fast", **options)
    plain = greedy_circuit(model, id_x, id_y, ood_x, method="plain", **options)
    assert_same_search(fast, plain)
    combine = np.mean if aggregate == "mean" else min
    keep = torch.ones(3, 4, dtype=torch.bool)
    assert fast.base_auroc == pytest.approx(
        combine(list(per_set_auroc(model, keep, id_x, ood_x, sets).values())), abs=1e-9
    )
    for t in range(fast.steps):
        expected = combine(
            list(per_set_auroc(model, fast.keep_mask(t + 1), id_x, ood_x, sets).values())
        )
        assert fast.auroc[t] == pytest.approx(expected, abs=1e-9)
        if objective == "avg":
            assert fast.scores[t] == pytest.approx((fast.accuracy[t] + expected) / 2, abs=1e-9)


def test_pooled_is_todays_search_bit_for_bit(data, tmp_path):
    id_x, id_y, ood_x, sets = data
    model = make_tiny_vit().double()
    today = greedy_circuit(model, id_x, id_y, ood_x, objective="avg", budget=5)
    pooled = greedy_circuit(
        model, id_x, id_y, ood_x, objective="avg", budget=5, ood_sets=sets, ood_aggregate="pooled"
    )
    assert_identical(today, pooled)
    # the same cache entry as before: pooled keeps today's key, sets or not
    key = greedy_cache_key(model, id_x, id_y, ood_x, "avg")
    assert greedy_cache_key(model, id_x, id_y, ood_x, "avg", ood_sets=sets) == key


def test_every_aggregate_and_set_assignment_has_its_own_cache_entry(data, tmp_path):
    id_x, id_y, ood_x, sets = data
    model = make_tiny_vit().double()
    other_sets = tuple("b" if s == "c" else s for s in sets)
    keys = {
        greedy_cache_key(model, id_x, id_y, ood_x, "ood", ood_sets=s, ood_aggregate=a)
        for a in ("pooled", "mean", "min")
        for s in (sets, other_sets)
    }
    assert len(keys) == 5  # pooled ignores the sets; mean/min x two set assignments
    cache = DiskCache(tmp_path)
    runs = {
        a: greedy_circuit(
            model,
            id_x,
            id_y,
            ood_x,
            objective="ood",
            budget=3,
            ood_sets=sets,
            ood_aggregate=a,
            cache=cache,
        )
        for a in ("pooled", "mean", "min")
    }
    for a, run in runs.items():  # each read back under its own key, not another's
        again = greedy_circuit(
            model,
            id_x,
            id_y,
            ood_x,
            objective="ood",
            budget=3,
            ood_sets=sets,
            ood_aggregate=a,
            cache=cache,
        )
        assert again.base_auroc == run.base_auroc
    assert runs["min"].base_auroc <= runs["mean"].base_auroc


def test_bad_aggregate_or_sets_are_refused(data):
    id_x, id_y, ood_x, sets = data
    model = make_tiny_vit().double()
    with pytest.raises(ValueError, match="ood_aggregate must be one of"):
        greedy_circuit(model, id_x, id_y, ood_x, budget=1, ood_sets=sets, ood_aggregate="max")
    with pytest.raises(ValueError, match="give ood_sets"):
        greedy_circuit(model, id_x, id_y, ood_x, budget=1, ood_aggregate="mean")
    with pytest.raises(ValueError, match="ood_sets names 29"):
        greedy_circuit(model, id_x, id_y, ood_x, budget=1, ood_sets=sets[1:], ood_aggregate="min")
    with pytest.raises(ValueError, match="needs the OOD items"):
        Scorer(id_y, N_ID, None, "mean")


def test_mean_equals_pooled_when_every_set_gives_as_many_items():
    """Pooled AUROC is the per-set AUROCs' mean weighted by set size: on a balanced pool (what
    search_inputs builds) ``mean`` and ``pooled`` are the same number, and only ``min`` differs."""
    g = torch.Generator().manual_seed(1)
    id_scores, ood_scores = torch.rand(3, 16, generator=g), torch.rand(3, 12, generator=g)
    balanced = torch.tensor([0, 1, 2] * 4)
    pooled = aggregate_auroc(id_scores, ood_scores, balanced, "pooled")
    torch.testing.assert_close(aggregate_auroc(id_scores, ood_scores, balanced, "mean"), pooled)
    unbalanced = torch.tensor([0] * 8 + [1] * 3 + [2])
    assert not torch.allclose(aggregate_auroc(id_scores, ood_scores, unbalanced, "mean"), pooled)
