"""Greedy circuit extraction: the fast path against the plain reference, resuming, the scores."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score
from timm.layers import SwiGLU

from hydra_core.analysis import (
    GreedyResult,
    _suffix,
    batched_auroc,
    greedy_cache_key,
    greedy_circuit,
    load_greedy,
    saved_searches,
    single_head_importance,
)
from hydra_core.analysis._suffix import SuffixEvaluator
from hydra_core.analysis.greedy import GREEDY_CACHE_KIND
from hydra_core.cache import CorruptCacheEntry, DiskCache
from hydra_core.models.adapter import ablate, head_layout, prune_heads
from tests.conftest import TINY_CONFIGS, make_tiny_vit

N_ID, N_OOD = 24, 24
TOL = 1e-6


def make_data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    id_x = torch.randn(N_ID, 1, 16, 16, generator=g)
    id_y = torch.randint(0, 5, (N_ID,), generator=g)
    ood_x = 1.5 * torch.randn(N_OOD, 1, 16, 16, generator=g) + 0.5
    return id_x, id_y, ood_x


@pytest.fixture(scope="module")
def data():
    return make_data()


def reference_scores(model, keep, id_x, id_y, ood_x) -> tuple[float, float]:
    """Accuracy and MSP AUROC (sklearn, OOD positive) of a full forward under ``ablate``."""
    with torch.inference_mode(), ablate(model, keep):
        logits = model(torch.cat([id_x, ood_x]).to(next(model.parameters()).dtype)).double()
    accuracy = float((logits[:N_ID].argmax(-1) == id_y).double().mean())
    msp = logits.softmax(-1).amax(-1).numpy()
    auroc = roc_auc_score(np.r_[np.zeros(N_ID), np.ones(N_OOD)], -msp)
    return accuracy, float(auroc)


def objective_of(objective: str, accuracy: float, auroc: float) -> float:
    return {"acc": accuracy, "ood": auroc, "avg": (accuracy + auroc) / 2}[objective]


def assert_same_search(a: GreedyResult, b: GreedyResult, tol: float = TOL) -> None:
    """Same candidate maps and scores; the same choice at every step, where a different choice
    counts as the same only if both candidates' scores tie (within ``tol``) at the top of both
    maps. After such a legitimate split the two searches are compared no further."""
    assert a.num_heads == b.num_heads
    assert a.base_score == pytest.approx(b.base_score, abs=tol)
    for t in range(min(a.steps, b.steps)):
        ca, cb = a.candidate_scores[t], b.candidate_scores[t]
        assert torch.equal(ca.isnan(), cb.isnan()), f"step {t}: different candidate sets"
        torch.testing.assert_close(ca, cb, rtol=0, atol=tol, equal_nan=True, msg=f"step {t}")
        if a.order[t] != b.order[t]:
            for scores in (ca, cb):
                top = float(scores.nan_to_num(-math.inf).max())
                assert abs(float(scores[a.order[t]]) - top) <= tol
                assert abs(float(scores[b.order[t]]) - top) <= tol
            break  # the removed sets differ from here on: their maps are other searches' maps
            return
        assert (a.scores[t], a.accuracy[t], a.auroc[t]) == pytest.approx(
            (b.scores[t], b.accuracy[t], b.auroc[t]), abs=tol
        )
    assert a.steps == b.steps


def assert_identical(a: GreedyResult, b: GreedyResult) -> None:
    """Bit-identical search results (timings aside)."""
    assert a.order == b.order
    assert (a.scores, a.accuracy, a.auroc) == (b.scores, b.accuracy, b.auroc)
    assert (a.base_accuracy, a.base_auroc, a.base_score) == (
        b.base_accuracy,
        b.base_auroc,
        b.base_score,
    )
    assert len(a.candidate_scores) == len(b.candidate_scores)
    for ca, cb in zip(a.candidate_scores, b.candidate_scores, strict=True):
        torch.testing.assert_close(ca, cb, rtol=0, atol=0, equal_nan=True)
    assert (a.complete, a.budget) == (b.complete, b.budget)


def state_snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_untouched(model, snapshot) -> None:
    state = model.state_dict()
    assert state.keys() == snapshot.keys()
    assert all(torch.equal(v, snapshot[k]) for k, v in state.items())
    assert sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules()) == 0


# --- fast == plain --------------------------------------------------------------------------------

# The searches are compared in float64: in float32 the two paths' logits differ by a few ulps
# (checked below), enough to swap two samples whose MSPs lie 1e-8 apart and so move an AUROC by
# one pair (1/576 here), which is float noise and not a different algorithm.


@pytest.fixture(scope="module")
def data64(data):
    return data[0].double(), data[1], data[2].double()


@pytest.fixture
def small_passes(monkeypatch):
    """Fast-path passes of 7 samples (7 x 17 token rows): ragged chunks, many passes."""
    monkeypatch.setattr(_suffix, "CPU_ROWS_PER_PASS", 7 * 17)
    monkeypatch.setattr(_suffix, "CPU_ROWS_PER_PASS_THREADED", 7 * 17)


@pytest.mark.parametrize("config", ["token-bias", "avgpool", "registers-noembedclass"])
@pytest.mark.parametrize("objective", ["acc", "ood"])
def test_fast_equals_plain_partial_budget(config, objective, data64, small_passes):
    model = make_tiny_vit(**TINY_CONFIGS[config]).double()
    fast = greedy_circuit(model, *data64, objective=objective, budget=5)
    plain = greedy_circuit(
        model, *data64, objective=objective, budget=5, method="plain", batch_size=10
    )
    assert_same_search(fast, plain)
    assert fast.steps == 5


def test_fast_equals_plain_on_structurally_pruned_model(data64):
    keep = torch.ones(3, 4, dtype=torch.bool)
    keep[0, 1] = keep[2, :3] = False  # layers of 3, 4 and 1 heads
    model = prune_heads(make_tiny_vit().double(), keep)
    fast, plain = (
        greedy_circuit(model, *data64, objective="avg", budget=8, method=m)
        for m in ("fast", "plain")
    )
    assert_same_search(fast, plain)
    assert fast.removal_step_map()[2, 1:].tolist() == [-1, -1, -1]  # absent heads


#: Beyond TINY_CONFIGS: a key norm (no folding of W_K into the CLS query) and a gated MLP (no
#: shared fc1); both take the fast path's general branches.
EXTRA_CONFIGS = {
    "qk-norm": dict(qk_norm=True),
    "swiglu": dict(mlp_layer=SwiGLU, act_layer=torch.nn.SiLU),
}


@pytest.mark.parametrize("config", sorted(EXTRA_CONFIGS))
def test_fast_candidate_logits_match_on_timm_configs_of_other_blocks(config, data):
    """(TINY_CONFIGS, as every family's: test_search_contract.py.)"""
    model = make_tiny_vit(**EXTRA_CONFIGS[config])
    inputs = torch.cat([data[0], data[2]])
    removed = [(0, 1), (1, 0), (1, 2), (2, 3), (2, 0), (2, 2)]  # layer 2 keeps one head
    with torch.inference_mode():
        evaluator = SuffixEvaluator(model, inputs, pairs_per_pass=9)
        evaluator.set_removed(removed)
        keep = torch.ones(3, 4, dtype=torch.bool)
        for layer, head in removed:
            keep[layer, head] = False
        with ablate(model, keep):
            torch.testing.assert_close(evaluator.logits, model(inputs), rtol=1e-5, atol=1e-5)
        seen = []
        for heads, logits in evaluator.candidate_logits():
            for (layer, head), got in zip(heads, logits, strict=True):
                one_less = keep.clone()
                one_less[layer, head] = False
                with ablate(model, one_less):
                    torch.testing.assert_close(got, model(inputs), rtol=1e-5, atol=1e-5)
                seen.append((layer, head))
    assert seen == [tuple(h) for h in keep.nonzero().tolist()]


@pytest.mark.parametrize(
    "method, objective", [("fast", "avg"), ("plain", "avg"), ("fast", "acc"), ("fast", "ood")]
)
def test_scores_are_those_of_the_ablated_model(method, objective, data64):
    data = data64
    model = make_tiny_vit(**TINY_CONFIGS["layerscale"]).double()
    result = greedy_circuit(model, *data, objective=objective, budget=6, method=method)
    base = reference_scores(model, torch.ones(3, 4, dtype=torch.bool), *data)
    assert (result.base_accuracy, result.base_auroc) == pytest.approx(base, abs=TOL)
    assert result.base_score == pytest.approx(objective_of(objective, *base), abs=TOL)
    for t in range(result.steps):
        accuracy, auroc = reference_scores(model, result.keep_mask(t + 1), *data)
        assert (result.accuracy[t], result.auroc[t]) == pytest.approx((accuracy, auroc), abs=TOL)
        assert result.scores[t] == pytest.approx(objective_of(objective, accuracy, auroc), abs=TOL)
        # the chosen head is the best candidate, ties going to the lowest (layer, head)
        scores = result.candidate_scores[t].nan_to_num(-math.inf)
        best = (scores == scores.max()).nonzero()[0].tolist()
        assert list(result.order[t]) == best


def test_single_head_importance_equals_a_loop_over_heads(data, tmp_path):
    model = make_tiny_vit(**TINY_CONFIGS["token-nobias"])
    got = single_head_importance(model, *data, batch_size=16)
    base_acc, base_roc = reference_scores(model, torch.ones(3, 4, dtype=torch.bool), *data)
    assert (got["base_accuracy"], got["base_auroc"]) == pytest.approx((base_acc, base_roc), abs=TOL)
    for layer in range(3):
        for head in range(4):
            keep = torch.ones(3, 4, dtype=torch.bool)
            keep[layer, head] = False
            acc, roc = reference_scores(model, keep, *data)
            assert float(got["delta_accuracy"][layer, head]) == pytest.approx(
                acc - base_acc, abs=TOL
            )
            assert float(got["delta_auroc"][layer, head]) == pytest.approx(roc - base_roc, abs=TOL)
            assert float(got["delta_avg"][layer, head]) == pytest.approx(
                (acc + roc - base_acc - base_roc) / 2, abs=TOL
            )
    cache = DiskCache(tmp_path)
    first = single_head_importance(model, *data, cache=cache)
    again = single_head_importance(model, *data, cache=cache)
    assert torch.equal(first["delta_avg"], again["delta_avg"])
    assert len(list((tmp_path / "head-importance").glob("*.pt"))) == 1


# --- resuming -------------------------------------------------------------------------------------


class Boom(Exception):
    pass


@pytest.fixture(scope="module")
def resume_setup(data):
    model = make_tiny_vit(**TINY_CONFIGS["token-bias"])
    full = greedy_circuit(model, *data, objective="avg", budget=7)
    return model, full


def record():
    steps: list[int] = []
    return steps, lambda step: steps.append(step.step)


@pytest.mark.parametrize("method", ["fast", "plain"])
def test_interrupted_run_resumes_exactly(method, data, tmp_path):
    model = make_tiny_vit(**TINY_CONFIGS["token-bias"])
    full = greedy_circuit(model, *data, objective="avg", budget=7, method=method)
    snapshot = state_snapshot(model)
    cache = DiskCache(tmp_path)

    def explode(step):
        if step.step == 2:
            raise Boom

    with pytest.raises(Boom):
        greedy_circuit(
            model, *data, objective="avg", budget=7, method=method, cache=cache, progress=explode
        )
    assert_untouched(model, snapshot)
    seen, progress = record()
    resumed = greedy_circuit(
        model, *data, objective="avg", budget=7, method=method, cache=cache, progress=progress
    )
    assert seen == [3, 4, 5, 6]  # steps 0..2 were saved before the callback raised
    assert_identical(resumed, full)


def test_should_stop_between_steps_and_inside_a_step(resume_setup, data, tmp_path):
    model, full = resume_setup
    cache = DiskCache(tmp_path)
    seen, progress = record()
    partial = greedy_circuit(
        model,
        *data,
        objective="avg",
        budget=7,
        cache=cache,
        progress=progress,
        should_stop=lambda: len(seen) == 3,
    )
    assert (partial.steps, partial.complete) == (3, False)
    assert (partial.order, partial.scores) == (full.order[:3], full.scores[:3])

    polls = []

    def stop_mid_step():  # polled between steps, then between passes: stop at step 4's second pass
        if len(seen) == 4:
            polls.append(1)
        return len(polls) >= 3

    stopped = greedy_circuit(
        model,
        *data,
        objective="avg",
        budget=7,
        cache=cache,
        progress=progress,
        should_stop=stop_mid_step,
    )
    assert (stopped.steps, stopped.complete) == (4, False)  # step 3 finished, step 4 abandoned
    resumed = greedy_circuit(
        model, *data, objective="avg", budget=7, cache=cache, progress=progress
    )
    assert seen == [0, 1, 2, 3, 4, 5, 6]
    assert_identical(resumed, full)


def test_keyboard_interrupt_inside_a_step_leaves_model_and_cache_usable(data, tmp_path):
    model = make_tiny_vit(**TINY_CONFIGS["avgpool"])
    snapshot = state_snapshot(model)
    cache = DiskCache(tmp_path)
    full = greedy_circuit(model, *data, objective="ood", budget=4, method="plain")
    polls = []

    def interrupt():
        polls.append(1)
        if (
            len(polls) == 20
        ):  # inside step 1 of the plain search (12 polls per step and one between)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        greedy_circuit(
            model,
            *data,
            objective="ood",
            budget=4,
            method="plain",
            cache=cache,
            should_stop=interrupt,
        )
    assert_untouched(model, snapshot)
    seen, progress = record()
    resumed = greedy_circuit(
        model, *data, objective="ood", budget=4, method="plain", cache=cache, progress=progress
    )
    assert seen == [1, 2, 3]
    assert_identical(resumed, full)


def test_budgets_share_one_cache_entry(resume_setup, data, tmp_path):
    model, full = resume_setup
    cache = DiskCache(tmp_path)
    short = greedy_circuit(model, *data, objective="avg", budget=3, cache=cache)
    assert_identical(short, full.prefix(3))
    seen, progress = record()
    longer = greedy_circuit(model, *data, objective="avg", budget=7, cache=cache, progress=progress)
    assert seen == [3, 4, 5, 6]
    assert_identical(longer, full)
    prefix = greedy_circuit(model, *data, objective="avg", budget=2, cache=cache, progress=progress)
    assert seen == [3, 4, 5, 6]  # nothing recomputed
    assert_identical(prefix, full.prefix(2))
    assert len(list((tmp_path / GREEDY_CACHE_KIND).glob("*.pt"))) == 1
    other = greedy_circuit(model, *data, objective="acc", budget=2, cache=cache)
    assert other.objective == "acc"
    assert len(list((tmp_path / GREEDY_CACHE_KIND).glob("*.pt"))) == 2


def test_corrupt_or_foreign_cache_entries_are_recomputed(resume_setup, data, tmp_path):
    model, full = resume_setup
    cache = DiskCache(tmp_path)
    greedy_circuit(model, *data, objective="avg", budget=3, cache=cache)
    key = greedy_cache_key(model, *data, "avg", "fast")
    path = cache.path(GREEDY_CACHE_KIND, key)
    path.write_bytes(path.read_bytes()[:-10])  # truncated
    with pytest.warns(CorruptCacheEntry):
        again = greedy_circuit(model, *data, objective="avg", budget=3, cache=cache)
    assert_identical(again, full.prefix(3))
    cache.save(
        GREEDY_CACHE_KIND, key, {"format": "hydra-greedy", "order": "nonsense"}
    )  # valid file, bad content
    seen, progress = record()
    again = greedy_circuit(model, *data, objective="avg", budget=3, cache=cache, progress=progress)
    assert seen == [0, 1, 2]
    assert_identical(again, full.prefix(3))
    seen.clear()
    fresh = greedy_circuit(
        model, *data, objective="avg", budget=3, cache=cache, resume=False, progress=progress
    )
    assert seen == [0, 1, 2]
    assert_identical(fresh, full.prefix(3))


def test_saved_searches_are_read_back_without_running(resume_setup, data, tmp_path):
    model, full = resume_setup
    cache = DiskCache(tmp_path)
    assert saved_searches(model, *data, cache) == {}
    greedy_circuit(model, *data, objective="avg", budget=3, cache=cache)
    stopped = greedy_circuit(
        model, *data, objective="acc", budget=5, cache=cache, should_stop=lambda: True
    )
    found = saved_searches(model, *data, cache)
    assert list(found) == ["acc", "avg"]  # the order of OBJECTIVES; "ood" was never run
    assert_identical(found["avg"], full.prefix(3))
    assert (found["acc"].steps, found["acc"].budget, found["acc"].complete) == (0, 5, False)
    assert found["acc"].base_score == stopped.base_score
    assert_identical(load_greedy(model, *data, "avg", cache), full.prefix(3))
    assert load_greedy(model, *data, "ood", cache) is None
    other_data = make_data(seed=1)
    assert saved_searches(model, *other_data, cache) == {}
    with pytest.raises(ValueError, match="objective must be one of acc, ood, avg"):
        load_greedy(model, *data, "best", cache)


def test_load_greedy_removes_a_foreign_entry(resume_setup, data, tmp_path):
    model, _ = resume_setup
    cache = DiskCache(tmp_path)
    acc = greedy_circuit(model, *data, objective="acc", budget=2, cache=cache)
    key = greedy_cache_key(model, *data, "avg", "fast")
    cache.save(GREEDY_CACHE_KIND, key, acc.to_dict())  # an "acc" search under the "avg" key
    assert load_greedy(model, *data, "avg", cache) is None
    assert not cache.path(GREEDY_CACHE_KIND, key).exists()
    assert list(saved_searches(model, *data, cache)) == ["acc"]


# --- the result object ----------------------------------------------------------------------------


def test_result_maps_ranking_and_json_round_trip(resume_setup):
    _, full = resume_setup
    steps = full.removal_step_map()
    assert steps.shape == (3, 4) and sorted(steps[steps >= 0].tolist()) == list(range(7))
    for t, (layer, head) in enumerate(full.order):
        assert steps[layer, head] == t
    assert int(full.keep_mask(2).sum()) == 10 and int(full.keep_mask().sum()) == 5
    ranking = full.ranking()
    assert ranking[:7] == full.order and sorted(ranking) == [(lh // 4, lh % 4) for lh in range(12)]
    last = full.candidate_scores[-1]
    assert [float(last[h]) for h in ranking[7:]] == sorted(
        (float(last[h]) for h in ranking[7:]), reverse=True
    )
    restored = GreedyResult.from_dict(json.loads(json.dumps(full.to_dict(), allow_nan=False)))
    assert_identical(restored, full)
    with pytest.raises(ValueError, match="between 0 and 7"):
        full.keep_mask(8)
    with pytest.raises(ValueError, match="hydra-greedy"):
        GreedyResult.from_dict({"format": "other"})


def test_progress_reports_each_step(data):
    model = make_tiny_vit()
    got = []
    result = greedy_circuit(model, *data, objective="acc", budget=3, progress=got.append)
    assert [s.step for s in got] == [0, 1, 2]
    assert [s.head for s in got] == result.order
    assert [s.result.steps for s in got] == [1, 2, 3]
    assert got[1].score == result.scores[1] and got[1].candidate_scores.isnan().sum() == 1
    assert all(s.elapsed >= s.seconds > 0 for s in got)
    got[0].candidate_scores[0, 0] = 0.0  # ordinary tensors, usable outside inference mode


# --- AUROC and inputs -----------------------------------------------------------------------------


def test_batched_auroc_matches_sklearn_with_ties():
    g = torch.Generator().manual_seed(3)
    id_scores = torch.randint(0, 6, (5, 40), generator=g).double() / 5  # many ties
    ood_scores = torch.randint(0, 5, (5, 30), generator=g).double() / 5
    got = batched_auroc(id_scores, ood_scores)
    for row in range(5):
        scores = torch.cat([id_scores[row], ood_scores[row]]).numpy()
        expected = roc_auc_score(np.r_[np.zeros(40), np.ones(30)], -scores)
        assert float(got[row]) == pytest.approx(expected, abs=1e-12)
    assert float(batched_auroc(torch.ones(3), torch.ones(4))) == 0.5
    assert float(batched_auroc(torch.tensor([2.0, 3.0]), torch.tensor([1.0]))) == 1.0
    with pytest.raises(ValueError, match="leading"):
        batched_auroc(torch.ones(2, 3), torch.ones(3, 3))


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(objective="best"), ValueError, "objective must be one of acc, ood, avg"),
        (dict(method="quick"), ValueError, "method must be one of fast, plain"),
        (dict(budget=0), ValueError, r"budget must be an int between 1 and 12"),
        (dict(budget=13), ValueError, r"budget must be an int between 1 and 12"),
        (dict(budget=2.0), ValueError, "budget must be an int"),
        (dict(batch_size=0), ValueError, "batch_size must be a positive int"),
        (dict(id_y=torch.zeros(5, dtype=torch.long)), ValueError, "one label per id_x sample"),
        (dict(id_y=torch.zeros(N_ID)), TypeError, "integer tensor"),
        (dict(id_y=torch.full((N_ID,), 7)), ValueError, "class 7 but the model has 5 classes"),
        (
            dict(id_x=torch.randn(1, 1, 16, 16), id_y=torch.zeros(1, dtype=torch.long)),
            ValueError,
            "at least 2 samples",
        ),
        (dict(ood_x=torch.randn(0, 1, 16, 16)), ValueError, "ood_x must hold at least 2 samples"),
        (dict(ood_x=torch.randn(4, 1, 8, 8)), ValueError, "ood_x samples"),
        (dict(id_x=torch.zeros(N_ID, 1, 16, 16, dtype=torch.uint8)), TypeError, "preprocessed"),
    ],
)
def test_bad_inputs_are_refused(change, error, match, data):
    model = make_tiny_vit()
    snapshot = state_snapshot(model)
    args = dict(zip(("id_x", "id_y", "ood_x"), data, strict=True)) | dict(objective="avg", budget=2)
    args |= change
    with pytest.raises(error, match=match):
        greedy_circuit(model, args.pop("id_x"), args.pop("id_y"), args.pop("ood_x"), **args)
    assert_untouched(model, snapshot)


def test_training_mode_and_non_transformers_are_refused(data):
    with pytest.raises(ValueError, match="model.eval()"):
        greedy_circuit(make_tiny_vit().train(), *data, budget=1)
    with pytest.raises(ValueError, match="no `blocks`"):
        single_head_importance(torch.nn.Linear(3, 3), *data)


def test_model_is_untouched(data):
    model = make_tiny_vit(**TINY_CONFIGS["registers-noembedclass"])
    snapshot = state_snapshot(model)
    before = model(data[0])
    for method in ("fast", "plain"):
        greedy_circuit(model, *data, objective="avg", budget=12, method=method)
    single_head_importance(model, *data)
    assert_untouched(model, snapshot)
    assert torch.equal(model(data[0]), before)
    assert head_layout(model).num_heads == (4, 4, 4)
