"""Attribution patching of head ablation (hydra_core.analysis.attribution) and the guided greedy
search built on it (greedy_circuit(candidates=K)).

The estimates are checked against finite differences of the model itself (each head's output
scaled by 1 - eps at the input of W_O), per family; their ranking against exact single-head
ablation; the guided search against the exact search (K covering every head: bit for bit) and
against the ablated model's own scores.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr

from hydra_core.analysis.attribution import (
    attribution_importance,
    head_attribution,
    per_item,
    top_candidates,
)
from hydra_core.analysis.greedy import (
    greedy_cache_key,
    greedy_circuit,
    load_greedy,
    single_head_importance,
)
from hydra_core.cache import DiskCache
from hydra_core.masks import load_masks
from hydra_core.models.adapter import (
    ablate,
    head_layout,
    model_and_inputs,
    parse_head_label,
    scale_heads,
)
from hydra_core.zoo.registry import load_model
from tests.analysis.test_greedy import assert_identical, make_data, reference_scores
from tests.conftest import (
    clip_images,
    make_tiny_text,
    make_tiny_vit,
    make_tiny_zero_shot,
    text_batch,
)

EPS = 1e-4


def finite_difference(model, x, layer: int, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits change, log normaliser change) per unit of zeroing the head, to first order:
    (f(scale 1 - eps) - f(1)) / eps."""
    layout = head_layout(model)
    with torch.no_grad():
        base = model(x).double()
        scales = torch.ones(layout.shape, dtype=next(model.parameters()).dtype)
        scales[layer, head] = 1 - EPS
        with scale_heads(model, scales):
            moved = model(x).double()
    return (moved - base) / EPS, (moved.logsumexp(-1) - base.logsumexp(-1)) / EPS


def tiny_models():
    g = torch.Generator().manual_seed(0)
    return {
        "vit": (make_tiny_vit(num_classes=3).double(), torch.randn(10, 1, 16, 16, generator=g)),
        "vit-7-classes": (
            make_tiny_vit(num_classes=7).double(),
            torch.randn(10, 1, 16, 16, generator=g),
        ),
        "bert": (make_tiny_text("bert").double(), text_batch(batch=8)),
        "distilbert": (make_tiny_text("distilbert").double(), text_batch(batch=8)),
        "openclip": (make_tiny_zero_shot().double(), clip_images(8).double()),
    }


@pytest.mark.parametrize("name", ["vit", "vit-7-classes", "bert", "distilbert", "openclip"])
def test_estimate_is_the_first_order_change_of_the_ablation(name):
    model, x = tiny_models()[name]
    model, x = model_and_inputs(model, x)
    if x.is_floating_point():
        x = x.double()
    layout = head_layout(model)
    labels = torch.zeros(4, dtype=torch.long)
    found = head_attribution(model, x, labels=labels, batch_size=3)  # batches split the items
    assert found.delta.shape[:3] == (*layout.shape, len(x))
    for layer, head in [(0, 0), (layout.num_layers - 1, layout.num_heads[-1] - 1)]:
        logits, lse = finite_difference(model, x, layer, head)
        expected = logits.gather(1, found.classes)
        scale = expected.abs().max()
        assert scale > 1e-3  # the head does something
        torch.testing.assert_close(found.delta[layer, head], expected, atol=1e-4 * scale, rtol=0)
        if found.delta_lse is not None:
            torch.testing.assert_close(found.delta_lse[layer, head], lse, atol=1e-4, rtol=0)
    assert (found.delta_lse is not None) == (found.logits.shape[1] > 4)


def test_per_item_scores_are_first_order_exact():
    """The correct class's log-probability and the MSP, per item, from the estimated logits
    (tracked classes and the estimated normaliser) move as the model's own to first order."""
    model = make_tiny_vit(num_classes=7, scale=2.0).double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(12, 1, 16, 16, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 7, (6,), generator=g)
    found = head_attribution(model, x, labels=labels, batch_size=5)
    # a small step along the estimate: logits + eps * delta
    tiny = type(found)(found.logits, found.classes, found.delta * EPS, found.delta_lse * EPS)
    items = per_item(tiny, labels, 6)
    for layer, head in [(0, 2), (2, 1)]:
        logits, _ = finite_difference(model, x, layer, head)
        moved = found.logits + EPS * logits
        log_prob = moved[:6].log_softmax(-1).gather(1, labels[:, None])[:, 0]
        base_lp = found.logits[:6].log_softmax(-1).gather(1, labels[:, None])[:, 0]
        msp = moved.softmax(-1).amax(-1) - found.logits.softmax(-1).amax(-1)
        torch.testing.assert_close(
            items["log_prob"][layer, head], log_prob - base_lp, atol=1e-9, rtol=1e-3
        )
        torch.testing.assert_close(items["msp"][layer, head], msp, atol=1e-9, rtol=1e-3)


def test_estimated_ranking_follows_exact_single_head_ablation():
    id_x, id_y, ood_x = make_data()
    model = make_tiny_vit()
    exact = single_head_importance(model, id_x, id_y, ood_x)
    estimate = attribution_importance(model, id_x, id_y, ood_x, batch_size=16)
    assert estimate["base_accuracy"] == pytest.approx(exact["base_accuracy"])
    assert estimate["base_auroc"] == pytest.approx(exact["base_auroc"])
    rho = spearmanr(estimate["delta_avg"].flatten(), exact["delta_avg"].flatten()).statistic
    assert rho > 0.6


def test_removed_heads_and_other_towers_have_no_estimate():
    model = make_tiny_vit()
    keep = head_layout(model).all_kept()
    keep[1, 2] = False
    x = torch.randn(6, 1, 16, 16)
    found = head_attribution(model, x, keep=keep)
    assert torch.isnan(found.delta[1, 2]).all()
    assert found.estimated.sum() == 11
    # the joint CLIP layout: the text tower's heads see the prompts, not the items
    joint = make_tiny_zero_shot(towers="both")
    layout = head_layout(joint)
    found = head_attribution(joint, clip_images(4))
    text = layout.tower_layers()["text"]
    assert not found.estimated[list(text)].any()
    assert found.estimated[list(layout.input_layers)].all()
    # an unestimated head is always a candidate
    estimates = torch.where(
        found.estimated, torch.rand(layout.shape, dtype=torch.float64), math.nan
    )
    chosen = top_candidates(estimates, layout.all_kept(), 2)
    assert len(chosen) == 2 + sum(layout.num_heads[layer] for layer in text)


def test_top_candidates_prefers_high_estimates_and_breaks_ties_by_head():
    estimates = torch.tensor([[0.5, 0.9, 0.9], [0.1, 0.9, math.nan]], dtype=torch.float64)
    keep = torch.tensor([[True, True, True], [True, False, True]])
    assert top_candidates(estimates, keep, 2) == [(0, 1), (0, 2), (1, 2)]


# --- the guided search ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def data():
    return make_data()


@pytest.mark.parametrize("method", ["fast", "plain"])
def test_candidates_covering_every_head_is_the_exact_search(method, data, tmp_path):
    model = make_tiny_vit()
    exact = greedy_circuit(model, *data, budget=6, method=method)
    for k in (12, 50):
        guided = greedy_circuit(model, *data, budget=6, method=method, candidates=k)
        assert_identical(guided, exact)  # order, scores and candidate maps, bit for bit
        assert guided.candidates is None
    assert exact.evaluated == [12, 11, 10, 9, 8, 7]
    assert greedy_cache_key(model, *data, "avg", method, None) == greedy_cache_key(
        model, *data, "avg", method
    )


@pytest.mark.parametrize("objective", ["acc", "ood", "avg"])
def test_guided_steps_evaluate_k_candidates_and_score_the_ablated_model(objective, data):
    model = make_tiny_vit()
    k = 3
    result = greedy_circuit(model, *data, objective=objective, budget=10, candidates=k)
    assert result.candidates == k
    # K each step while more than K remain (12 - t), then every remaining head
    assert result.evaluated == [min(k, 12 - t) for t in range(10)]
    for t, candidates in enumerate(result.candidate_scores):
        assert int((~torch.isnan(candidates)).sum()) == result.evaluated[t]
        assert float(candidates[result.order[t]]) == float(candidates.nan_to_num(-1).max())
    keep = result.keep_mask()
    accuracy, auroc = reference_scores(model, keep, *data)
    assert result.accuracy[-1] == pytest.approx(accuracy, abs=1e-12)
    assert result.auroc[-1] == pytest.approx(auroc, abs=1e-12)
    plain = greedy_circuit(
        model, *data, objective=objective, budget=10, candidates=k, method="plain"
    )
    assert plain.order == result.order
    assert plain.scores == pytest.approx(result.scores, abs=1e-9)


def test_guided_search_resumes_and_has_its_own_cache_entry(data, tmp_path):
    model = make_tiny_vit()
    cache = DiskCache(tmp_path)
    whole = greedy_circuit(model, *data, budget=6, candidates=2)

    def explode(step):
        if step.step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        greedy_circuit(model, *data, budget=6, candidates=2, cache=cache, progress=explode)
    saved = load_greedy(model, *data, "avg", cache, candidates=2)
    assert saved is not None and saved.steps == 3 and saved.evaluated == [2, 2, 2]
    assert load_greedy(model, *data, "avg", cache) is None  # the exact search's entry: none
    assert load_greedy(model, *data, "avg", cache, candidates=3) is None
    resumed = greedy_circuit(model, *data, budget=6, candidates=2, cache=cache)
    assert resumed.order == whole.order and resumed.scores == whole.scores
    assert resumed.evaluated == whole.evaluated
    keys = {greedy_cache_key(model, *data, "avg", "fast", k) for k in (None, 2, 3)}
    assert len(keys) == 3


def test_guided_search_on_text_and_joint_clip():
    model = make_tiny_text("bert")
    ids, mask = text_batch(batch=10)
    ood = text_batch(seed=1, batch=10)
    labels = torch.arange(10) % 3
    result = greedy_circuit(model, (ids, mask), labels, ood, budget=3, candidates=2)
    assert result.evaluated == [2, 2, 2]
    wrapped, id_x, ood_x = model_and_inputs(model, (ids, mask), ood)
    with torch.inference_mode(), ablate(wrapped, result.keep_mask()):
        logits = wrapped(torch.cat([id_x, ood_x])).double()
    assert result.accuracy[-1] == float((logits[:10].argmax(-1) == labels).double().mean())
    joint = make_tiny_zero_shot(towers="both")
    g = torch.Generator().manual_seed(0)
    images = clip_images(12)
    clip_labels = torch.randint(0, 5, (6,), generator=g)
    found = greedy_circuit(joint, images[:6], clip_labels, images[6:] * 3, budget=2, candidates=2)
    text_heads = 2  # the tiny text tower's heads, always evaluated exactly
    assert found.evaluated == [2 + text_heads] * 2


def test_bad_candidates_are_refused(data):
    model = make_tiny_vit()
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="candidates must be a positive int"):
            greedy_circuit(model, *data, budget=2, candidates=bad)


# --- the command line ------------------------------------------------------------------------

CLI_DATA = ["--n-search", "40", "--n-report", "60", "--ood", "mnist", "noise", "--device", "cpu"]


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))


def test_cli_search_candidates(checkpoint, tmp_path, capsys, private_cache):
    from hydra_core.cli import main

    def search(*extra):
        argv = ["search", "--model", checkpoint, *CLI_DATA, "--budget", "3", "--json", *extra]
        assert main([*argv, "--out", str(tmp_path / "_".join(extra or ("exact",)))]) == 0
        return json.loads(capsys.readouterr().out)

    exact = search()
    assert exact["candidates"] is None and exact["evaluated"] == [8, 7, 6]
    covering = search("--candidates", "8")  # the tiny checkpoint's 8 heads: the exact search
    assert covering["order"] == exact["order"] and covering["scores"] == exact["scores"]
    guided = search("--candidates", "2")
    assert guided["candidates"] == 2 and guided["evaluated"] == [2, 2, 2]
    saved = json.loads((tmp_path / "--candidates_2" / "greedy_avg.json").read_text())
    assert saved["evaluated"] == [2, 2, 2] and saved["order"] == [
        list(parse_head_label(h)) for h in guided["order"]
    ]
    argv = ["search", "--model", checkpoint, *CLI_DATA, "--candidates", "2", "--stability", "3"]
    assert main([*argv, "--out", str(tmp_path / "refused")]) == 2
    assert "--stability resamples the exact search" in capsys.readouterr().err

    # masks --candidates: the members of the guided search the user ran (read from the cache);
    # at K = 1 it parts from the exact search on the tiny checkpoint
    guided = search("--candidates", "1")
    masks = ["masks", "--model", checkpoint, *CLI_DATA, "--budget", "3", "--m", "1"]
    out = tmp_path / "members.json"
    circuit = [*masks, "--strategy", "circuit", "--candidates", "1", "--out", str(out)]
    assert main(circuit) == 0
    capsys.readouterr()
    layout = head_layout(load_model(checkpoint).model)
    (member,) = load_masks(out, layout)
    removed = {(int(h), int(k)) for h, k in (~member.keep).nonzero().tolist()}
    assert removed == {parse_head_label(h) for h in guided["order"]}
    assert member.provenance["ranking"]["candidates"] == 1
    exact_file = tmp_path / "members-exact.json"
    assert main([*masks, "--strategy", "circuit", "--out", str(exact_file)]) == 0
    capsys.readouterr()
    (exact_member,) = load_masks(exact_file, layout)
    assert "candidates" not in exact_member.provenance["ranking"]
    exact_removed = {(int(h), int(k)) for h, k in (~exact_member.keep).nonzero().tolist()}
    assert exact_removed == {parse_head_label(h) for h in exact["order"]} != removed, (
        "the guided and the exact search should part on the tiny checkpoint, or the test cannot "
        "tell which search the members came from"
    )
    taylor = [*masks, "--strategy", "taylor", "--candidates", "2", "--out", str(tmp_path / "t")]
    assert main(taylor) == 2  # Taylor members run no greedy search: K would be ignored
    assert "--candidates is read only with a strategy whose members come from greedy" in (
        capsys.readouterr().err
    )


def test_cli_importance_attribution(checkpoint, tmp_path, capsys, private_cache):
    from hydra_core.cli import main

    out = tmp_path / "importance"
    argv = ["importance", "--model", checkpoint, *CLI_DATA, "--taylor-samples", "20"]
    assert main([*argv, "--attribution", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "attribution vs exact ablation, AUROC: Spearman" in printed
    agreement = pd.read_csv(out / "attribution_agreement.csv")
    assert list(agreement["score"]) == ["accuracy", "AUROC"]
    for score, stem in (("accuracy", "delta_accuracy"), ("AUROC", "delta_auroc")):
        exact = pd.read_csv(out / f"{stem}.csv", index_col=0).to_numpy().ravel()
        estimate = pd.read_csv(out / f"atp_{stem}.csv", index_col=0).to_numpy().ravel()
        rho = spearmanr(exact, estimate).statistic
        row = agreement.set_index("score").loc[score]
        assert row["spearman"] == pytest.approx(rho)
        assert row["heads"] == 8
    data = json.loads((out / "importance.json").read_text())
    assert {"AtP Δaccuracy", "AtP ΔAUROC"} <= set(data["maps"])
    assert len(data["attribution_agreement"]) == 2


def test_cli_heads_attribution(checkpoint, tmp_path, capsys, private_cache):
    from hydra_core.analysis.attribution import attribution_per_set
    from hydra_core.cli import build_parser, main
    from hydra_core.cli.common import load_for_cli
    from hydra_core.cli.heads import ATTRIBUTION_COLUMNS, CSV_COLUMNS

    data = ["--n-search", "40", "--n-report", "30", "--ood", "mnist", "noise", "--device", "cpu"]
    out = tmp_path / "heads"
    argv = ["heads", "--model", checkpoint, *data, "--boot", "50", "--out", str(out)]
    assert main([*argv, "--attribution"]) == 0
    assert "attribution (AtP) vs exact ablation, Spearman" in capsys.readouterr().out
    table = pd.read_csv(out / "heads.csv")
    assert list(table.columns) == [*CSV_COLUMNS, *ATTRIBUTION_COLUMNS]
    loaded, benchmark = load_for_cli(build_parser().parse_args(argv))
    p = loaded.preprocess
    expected = attribution_per_set(
        loaded.model,
        p(benchmark.id_report.inputs),
        benchmark.id_report.labels,
        {s.name: p(s.inputs) for s in benchmark.ood_report},
    )
    for key in ("delta_auroc", "delta_accuracy"):
        values = expected[key].numpy()[table["layer"], table["head"]]
        np.testing.assert_allclose(table[f"atp_{key}"], values, rtol=1e-9, atol=1e-12)
    saved = json.loads((out / "heads.json").read_text())["attribution"]
    rho = spearmanr(table["delta_auroc"], table["atp_delta_auroc"]).statistic
    assert saved["spearman_delta_auroc"] == pytest.approx(rho)
