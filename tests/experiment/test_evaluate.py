from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import log_loss, roc_auc_score

from hydra_core import metrics
from hydra_core.cache import DiskCache
from hydra_core.data.benchmark import build_benchmark
from hydra_core.data.images import ImageSet
from hydra_core.evaluate import (
    ID_COLUMNS,
    OOD_COLUMNS,
    Evaluation,
    SetPredictions,
    evaluate_model,
    format_intervals,
    interval_columns,
    interval_json,
    masked,
    model_card,
    nest_intervals,
    ood_score,
    predict,
    probabilities,
    resolve_device,
)
from hydra_core.metrics.bootstrap import BootstrapConfig
from hydra_core.models.adapter import ablate
from hydra_core.zoo.registry import LoadedModel
from tests.conftest import make_tiny_vit, random_mask


def to_input(images: torch.Tensor) -> torch.Tensor:
    return images.float() / 255.0


def image_set(name: str, n: int, seed: int, group: str = "id", labelled: bool = True) -> ImageSet:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 1, 16, 16), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, 5, (n,), generator=g) if labelled else None
    return ImageSet(name, images, labels, group=group)


ID = image_set("id", 40, 0)
OOD = [image_set("near1", 30, 1, "near", False), image_set("far1", 25, 2, "far", False)]


def test_predict_is_independent_of_batch_size():
    model = make_tiny_vit()
    full = model(to_input(ID.images))
    for batch_size in (1, 7, 40, 100):
        torch.testing.assert_close(
            predict(model, ID.images, to_input, batch_size=batch_size), full, rtol=0, atol=1e-5
        )


def test_masked_system_equals_ablate():
    model = make_tiny_vit()
    keep = random_mask((3, 4), 3)
    with ablate(model, keep):
        expected = model(to_input(ID.images))
    got = predict(masked(model, keep), ID.images, to_input)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_ensemble_probabilities_are_mean_of_member_softmaxes():
    logits = torch.randn(6, 3, 5)
    expected = torch.stack([logits[:, m].softmax(-1) for m in range(3)]).mean(0)
    torch.testing.assert_close(probabilities(logits), expected)


def test_table_matches_direct_metric_computations():
    model = make_tiny_vit()
    evaluation = evaluate_model(model, to_input, ID, OOD, name="tiny", device="cpu")
    table = evaluation.table().set_index("set")
    id_probs = model(to_input(ID.images)).softmax(-1).detach()
    assert table.loc["id", "accuracy"] == pytest.approx(metrics.accuracy(id_probs, ID.labels))
    assert table.loc["id", "nll"] == pytest.approx(metrics.nll(id_probs, ID.labels))
    aurocs = []
    for s in OOD:
        ood_msp = model(to_input(s.images)).softmax(-1).max(-1).values.detach().numpy()
        id_msp = id_probs.max(-1).values.numpy()
        is_ood = np.r_[np.zeros(len(id_msp)), np.ones(len(ood_msp))]
        expected = roc_auc_score(is_ood, -np.r_[id_msp, ood_msp])
        assert table.loc[s.name, "auroc"] == pytest.approx(expected, abs=1e-9)
        aurocs.append(expected)
    assert table.loc["near-OOD average", "auroc"] == pytest.approx(aurocs[0])
    assert table.loc["OOD average", "auroc"] == pytest.approx(np.mean(aurocs))


def test_ensemble_rows_carry_diversity():
    logits = torch.randn(20, 3, 5)
    evaluation = Evaluation(
        "ens",
        SetPredictions("id", "id", logits, torch.randint(0, 5, (20,))),
        [SetPredictions("o", "far", torch.randn(10, 3, 5))],
    )
    table = evaluation.table().set_index("set")
    member_probs = logits.softmax(-1)
    assert table.loc["id", "mutual_information"] == pytest.approx(
        metrics.mutual_information(member_probs)
    )
    assert table.loc["o", "disagreement"] >= 0
    assert table.loc["far-OOD average", "disagreement"] == table.loc["o", "disagreement"]
    assert table.loc["id", "mutual_information_lo"] <= table.loc["id", "mutual_information_hi"]


def assert_interval(entry: dict) -> None:
    """``{"value": v, "ci95": [lo, hi]}`` with lo <= hi, plain floats."""
    assert set(entry) == {"value", "ci95"}
    lo, hi = entry["ci95"]
    assert all(isinstance(x, float) for x in (entry["value"], lo, hi)) and lo <= hi


def test_json_has_the_documented_shape():
    evaluation = evaluate_model(make_tiny_vit(), to_input, ID, OOD, name="tiny", device="cpu")
    out = json.loads(
        json.dumps(
            evaluation.to_json({"name": "tiny", "layers": 3, "heads": 4, "params": 1}),
            allow_nan=False,
        )
    )
    assert set(out) == {"model", "score", "bootstrap", "id", "ood", "ood_average"}
    assert out["bootstrap"]["n_boot"] == 1000 and out["bootstrap"]["level"] == 0.95
    assert set(out["id"]) == {"name", "n", *ID_COLUMNS}
    assert [o["name"] for o in out["ood"]] == ["near1", "far1"]
    assert set(out["ood"][0]) == {"name", "group", "n", *OOD_COLUMNS, "fpr95_tpr_id"}
    assert out["ood"][1]["group"] == "far"
    assert list(out["ood_average"]) == ["near-OOD average", "far-OOD average", "OOD average"]
    entries = [out["id"][m] for m in ID_COLUMNS]
    for row in [*out["ood"], *out["ood_average"].values()]:
        entries += [row[m] for m in (*OOD_COLUMNS, "fpr95_tpr_id")]
    for entry in entries:
        assert_interval(entry)
    table = evaluation.table().set_index("set")
    assert out["id"]["accuracy"]["value"] == table.loc["id", "accuracy"]
    assert out["ood"][1]["auroc"]["ci95"] == [table.loc["far1", f"auroc_{b}"] for b in ("lo", "hi")]


def test_intervals_are_percentiles_of_the_plain_metrics_on_the_resamples():
    config = BootstrapConfig(n_boot=60, seed=3)
    evaluation = evaluate_model(make_tiny_vit(), to_input, ID, OOD, device="cpu", bootstrap=config)
    table = evaluation.table().set_index("set")
    resamples = evaluation.resamples()
    assert resamples.n_boot == 60
    probs = probabilities(evaluation.id.logits)
    scores = [ood_score(s.logits) for s in (evaluation.id, *evaluation.ood)]
    accuracy, near_auroc, average_fpr = [], [], []
    for b in range(60):
        id_rows = np.repeat(np.arange(len(probs)), resamples.id_counts[b])
        accuracy.append(metrics.accuracy(probs[id_rows], ID.labels[id_rows]))
        fpr = []
        for k, counts in enumerate(resamples.ood_counts):
            ood_rows = np.repeat(np.arange(len(counts[b])), counts[b])
            found = metrics.ood_metrics(scores[0][id_rows], scores[k + 1][ood_rows])
            fpr.append(found["fpr95"])
            if k == 0:
                near_auroc.append(found["auroc"])
        average_fpr.append(np.mean(fpr))
    for row, column, values in (
        ("id", "accuracy", accuracy),
        ("near1", "auroc", near_auroc),
        ("OOD average", "fpr95", average_fpr),
    ):
        lo, hi = np.quantile(values, [0.025, 0.975])
        assert table.loc[row, f"{column}_lo"] == pytest.approx(lo, abs=1e-9)
        assert table.loc[row, f"{column}_hi"] == pytest.approx(hi, abs=1e-9)
    # each part is stratified: every resample keeps the class counts and the set sizes
    for c in range(5):
        in_class = (ID.labels == c).numpy()
        assert (resamples.id_counts[:, in_class].sum(1) == in_class.sum()).all()
    assert [c.sum(1).tolist() for c in resamples.ood_counts] == [[30] * 60, [25] * 60]


def test_table_and_json_helpers():
    frame = pd.DataFrame(
        {"system": ["a", "b"], "auroc": [0.81234, -0.01], "auroc_lo": [0.8, -0.03],
         "auroc_hi": [0.83, 0.02], "n": [3, 4]}
    )  # fmt: skip
    assert interval_columns(["auroc", "nll"]) == [
        "auroc", "auroc_lo", "auroc_hi", "nll", "nll_lo", "nll_hi"
    ]  # fmt: skip
    shown = format_intervals(frame, digits=3)
    assert list(shown.columns) == ["system", "auroc", "n"]
    assert list(shown["auroc"]) == ["0.812 ± 0.015", "-0.010 ± 0.025"]
    signed = format_intervals(frame, digits=2, signed=True)
    assert list(signed["auroc"]) == ["+0.81 ± 0.01", "-0.01 ± 0.03 (n.s.)"]
    assert nest_intervals(frame.iloc[0].to_dict()) == {
        "system": "a",
        "auroc": {"value": 0.81234, "ci95": [0.8, 0.83]},
        "n": 3,
    }
    assert interval_json(float("nan"), 0.1, 0.2) == {"value": None, "ci95": [0.1, 0.2]}


def test_model_card_carries_intervals():
    loaded = LoadedModel("tiny", make_tiny_vit(), to_input)
    benchmark = build_benchmark(image_set("pool", 80, 5), None, [image_set("o", 40, 6, "far")])
    card = model_card(loaded, benchmark, device="cpu")
    lo, hi = card["id_accuracy_ci95"]
    assert lo <= card["id_accuracy"] <= hi
    assert list(card["ood_auroc_ci95"]) == list(card["ood_auroc"]) == ["o"]
    lo, hi = card["ood_auroc_ci95"]["o"]
    assert lo <= card["ood_auroc"]["o"] <= hi


def test_predictions_are_cached(tmp_path):
    cache = DiskCache(tmp_path)
    model = make_tiny_vit()
    first = evaluate_model(model, to_input, ID, OOD, device="cpu", cache=cache)
    calls = []

    def counting(x):
        calls.append(len(x))
        return to_input(x)

    second = evaluate_model(model, counting, ID, OOD, device="cpu", cache=cache)
    assert calls == []
    torch.testing.assert_close(second.id.logits, first.id.logits, rtol=0, atol=0)
    evaluate_model(model, counting, ID, OOD, keep=random_mask((3, 4), 1), device="cpu", cache=cache)
    assert calls, "a different mask must not reuse the dense predictions"


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(images=torch.zeros(0, 1, 16, 16, dtype=torch.uint8)), "empty"),
        (dict(batch_size=0), "batch_size"),
    ],
)
def test_predict_errors(bad, match):
    kwargs = dict(images=ID.images, batch_size=8) | bad
    with pytest.raises(ValueError, match=match):
        predict(make_tiny_vit(), kwargs["images"], to_input, batch_size=kwargs["batch_size"])


def test_unlabelled_id_set_is_refused():
    with pytest.raises(ValueError, match="no labels"):
        evaluate_model(make_tiny_vit(), to_input, OOD[0], OOD, device="cpu")


def test_cuda_request_without_gpu_is_explained():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        resolve_device("cuda")
    assert resolve_device("auto").type == "cpu"


def test_auroc_changes_of_a_circuit_against_the_dense_model():
    from hydra_core.evaluate import auroc_changes

    loaded = LoadedModel("tiny", make_tiny_vit(), to_input)
    benchmark = build_benchmark(
        image_set("pool", 80, 5),
        None,
        [image_set("o", 40, 6, "far"), image_set("p", 30, 7, "near")],
    )
    everything = torch.ones(3, 4, dtype=torch.bool)
    same = auroc_changes(loaded, benchmark, everything, device="cpu")
    assert list(same["set"][:2]) == ["o", "p"]
    assert (same["delta_auroc"] == 0).all() and (same["delta_auroc_hi"] == 0).all()
    assert not same["significant"].any()  # a model against itself: exactly 0, never significant
    keep = random_mask((3, 4), seed=3)
    changed = auroc_changes(loaded, benchmark, keep, device="cpu").set_index("set")
    direct = evaluate_model(
        loaded.model, to_input, benchmark.id_report, benchmark.ood_report, keep=keep, device="cpu"
    )
    auroc = {r["name"]: r["auroc"] for r in direct.ood_rows()}
    assert changed.loc["o", "circuit_auroc"] == pytest.approx(auroc["o"])
    delta = changed.loc["o", "circuit_auroc"] - changed.loc["o", "dense_auroc"]
    assert changed.loc["o", "delta_auroc"] == pytest.approx(delta)
    assert changed.loc["o", "delta_auroc_lo"] <= delta <= changed.loc["o", "delta_auroc_hi"]


def test_ensemble_nll_is_log_mean_exp_of_members_exact_and_finite():
    # member 0 is sure of the wrong class: its p_y underflows to 0 in float32; the ensemble's NLL
    # comes from the members' log-probabilities, exact (not a clip) and equal to scikit-learn's
    # log_loss wherever p_y is representable
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(40, 3, 4, generator=g) * 4
    labels = torch.randint(0, 4, (40,), generator=g)
    logits[0, :, labels[0]] = -200.0
    evaluation = Evaluation(
        "ens",
        SetPredictions("id", "id", logits, labels),
        [SetPredictions("o", "far", torch.randn(10, 3, 4, generator=g))],
        bootstrap=BootstrapConfig(n_boot=50),
    )
    log_p = (torch.logsumexp(logits.double().log_softmax(-1), dim=1) - np.log(3))[
        torch.arange(40), labels
    ]
    expected = -log_p.mean().item()
    found = evaluation.id_metrics()["nll"]
    assert np.isfinite(found) and found == pytest.approx(expected, rel=1e-12)
    assert found > 200 / 40  # the sure-and-wrong item counts in full, not clipped
    rest = evaluation._sets()[0].probs[1:]
    rest = rest / rest.sum(1, keepdims=True)
    assert metrics.nll(rest, labels[1:]) == pytest.approx(
        log_loss(labels[1:].numpy(), rest, labels=range(4)), rel=1e-9
    )
    # every resample's NLL is the count-weighted mean of the same per-item values
    counts = evaluation.resamples().id_counts
    per_item = -log_p.numpy()
    np.testing.assert_allclose(
        evaluation.replicates()["id"]["nll"], counts @ per_item / counts.sum(1), rtol=1e-10
    )
