from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from hydra_core import metrics
from hydra_core.cache import DiskCache
from hydra_core.data.images import ImageSet
from hydra_core.evaluate import (
    Evaluation,
    SetPredictions,
    evaluate_model,
    masked,
    predict,
    probabilities,
    resolve_device,
)
from hydra_core.models.adapter import ablate
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


def test_json_has_the_documented_shape():
    evaluation = evaluate_model(make_tiny_vit(), to_input, ID, OOD, name="tiny", device="cpu")
    out = evaluation.to_json({"name": "tiny", "layers": 3, "heads": 4, "params": 1})
    assert set(out["id"]) >= {"name", "n", "accuracy", "nll", "brier", "ece", "adaptive_ece"}
    assert [o["name"] for o in out["ood"]] == ["near1", "far1"]
    assert set(out["ood"][0]) >= {"name", "group", "n", "auroc", "fpr95", "aupr_in", "aupr_out"}
    assert out["ood"][1]["group"] == "far"


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
