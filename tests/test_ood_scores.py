"""OOD scores beyond MSP: each detector wired through Hydra Lab gives pytorch-ood's own scores on
the same logits or features (the fitted ones fitted on the same data), the feature detectors fit
on the ID search split only, and ECE / NLL equal TorchUncertainty's metrics."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest
import torch
from pytorch_ood.detector import KNN, EnergyBased, Entropy, Mahalanobis, MaxLogit, MaxSoftmax, ViM

from hydra_core import metrics
from hydra_core.data.benchmark import Benchmark
from hydra_core.errors import InputError
from hydra_core.evaluate import evaluate_model, ood_score
from hydra_core.experiment.evaluate import evaluate_systems
from hydra_core.masks import MemberMask
from hydra_core.ood_scores import (
    FEATURE_SCORES,
    KNN_K,
    SCORES,
    parse_scores,
    rescore,
    rescore_report,
    score_gains,
    scores_table,
)
from hydra_core.zoo.registry import LoadedModel
from tests.app.conftest import app, app_cache, make_app, setup  # noqa: F401  (the app fixtures)
from tests.conftest import make_tiny_vit
from tests.experiment.test_systems import image_set, preprocess

LOGIT_DETECTORS = {
    "msp": MaxSoftmax,
    "max_logit": MaxLogit,
    "energy": EnergyBased,
    "entropy": Entropy,
}


def logits_of(shape, seed=0, scale=3.0) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("score", sorted(LOGIT_DETECTORS))
def test_logit_scores_equal_pytorch_ood_on_a_single_model(score):
    logits = logits_of((64, 10))
    peer = LOGIT_DETECTORS[score](None).predict_logits(logits).double().numpy()
    # Hydra Lab's scores are "higher = more ID": pytorch-ood's outlier scores negated
    np.testing.assert_allclose(-ood_score(logits, score), peer, rtol=1e-6, atol=1e-6)


def test_msp_is_bit_identical_to_pytorch_ood_max_softmax():
    logits = logits_of((64, 10), seed=3)
    peer = MaxSoftmax(None).predict_logits(logits).double().numpy()
    np.testing.assert_array_equal(-ood_score(logits, "msp"), peer)


@pytest.mark.parametrize("score", sorted(LOGIT_DETECTORS))
def test_ensemble_logit_scores_equal_pytorch_ood_on_the_ensemble_prediction(score):
    members = logits_of((64, 3, 10), seed=1)
    if score in ("max_logit", "energy"):  # the mean member logits
        reduced = members.double().mean(1)
    else:  # logits whose softmax is the mean of member probabilities
        reduced = members.double().softmax(-1).mean(1).log()
    peer = LOGIT_DETECTORS[score](None).predict_logits(reduced).numpy()
    np.testing.assert_allclose(-ood_score(members, score), peer, rtol=1e-6, atol=1e-6)


def test_mutual_information_is_the_ensembles_and_torch_uncertaintys():
    from torch_uncertainty.metrics import MutualInformation

    members = logits_of((64, 3, 10), seed=2)
    p = members.double().softmax(-1)
    entropy = lambda q: -(q * q.log()).sum(-1)  # noqa: E731
    plain = entropy(p.mean(1)) - entropy(p).mean(1)
    np.testing.assert_allclose(-ood_score(members, "mutual_information"), plain, atol=1e-6)
    peer = MutualInformation(reduction="none")
    peer.update(members.softmax(-1))
    np.testing.assert_allclose(
        -ood_score(members, "mutual_information"), peer.compute().double(), atol=1e-5
    )
    with pytest.raises(ValueError, match="single model has none"):
        ood_score(members[:, 0], "mutual_information")


def test_ece_and_nll_equal_torch_uncertaintys_metrics():
    from torch_uncertainty.metrics import CalibrationError, CategoricalNLL

    logits = logits_of((500, 10), seed=4, scale=2.0)
    labels = torch.randint(0, 10, (500,), generator=torch.Generator().manual_seed(5))
    probs = logits.softmax(-1)
    ece = CalibrationError(task="multiclass", num_classes=10, num_bins=15, norm="l1")
    ece.update(probs, labels)
    assert metrics.ece(probs, labels) == pytest.approx(float(ece.compute()), abs=1e-6)
    nll = CategoricalNLL()
    nll.update(probs, labels)
    assert metrics.nll(probs, labels) == pytest.approx(float(nll.compute()), rel=1e-5)


def test_parse_scores():
    assert parse_scores("msp") == ("msp",)
    assert parse_scores("energy, msp,energy") == ("energy", "msp")
    assert parse_scores("all") == SCORES
    with pytest.raises(ValueError, match="unknown OOD score 'odin'; choose from msp"):
        parse_scores("msp,odin")


# --- feature-based detectors on a tiny model ----------------------------------------------------


@pytest.fixture(scope="module")
def benchmark():
    ood = [image_set("near_set", 30, "near", 2), image_set("far_set", 30, "far", 3)]
    id_pool = image_set("id_set", 120, "id", 1, labelled=True)
    search = image_set("search_ood", 20, "near", 9)
    from hydra_core.data.benchmark import build_benchmark

    return build_benchmark(id_pool, None, ood, search_ood=[search])


@pytest.fixture(scope="module")
def model():
    return make_tiny_vit(depth=3, num_heads=4)


def plain_features(model, images: torch.Tensor, keep=None) -> torch.Tensor:
    """Penultimate features the plain timm way: forward_head's pre-logits."""
    from hydra_core.models.adapter import ablate

    with torch.no_grad(), ablate(model, keep) if keep is not None else nullcontext():
        x = preprocess(images)
        return model.forward_head(model.forward_features(x), pre_logits=True)


def peer_detector(score, model, z, y):
    if score == "mahalanobis":
        return Mahalanobis(None).fit_features(z, y)
    if score == "vim":
        return ViM(None, d=z.shape[1] // 2, w=model.head.weight, b=model.head.bias).fit_features(
            z, y
        )
    return KNN(None, k=min(KNN_K, len(z))).fit_features(z, y)


@pytest.mark.parametrize("score", FEATURE_SCORES)
def test_feature_scores_equal_pytorch_ood_fitted_on_the_search_split(score, model, benchmark):
    evaluation = evaluate_model(
        model, preprocess, benchmark.id_report, benchmark.ood_report, device="cpu"
    )
    scored = rescore(evaluation, score, benchmark)
    fit = benchmark.id_search
    peer = peer_detector(score, model, plain_features(model, fit.images), fit.labels)
    sets = [benchmark.id_report, *benchmark.ood_report]
    for data, got in zip(sets, scored.set_scores(), strict=True):
        expected = peer.predict_features(plain_features(model, data.images)).double().numpy()
        np.testing.assert_allclose(-got, expected, rtol=1e-4, atol=1e-4)
    # the metrics come from those scores, ID vs each OOD set
    id_scores, near, _ = scored.set_scores()
    row = {r["set"]: r for r in scored.rows()}["near_set"]
    assert row["auroc"] == pytest.approx(metrics.auroc(id_scores, near))
    assert scored.resamples() is evaluation.resamples()  # paired with the MSP evaluation


def gaussian_fit(n: int, dims: int, classes: int, seed: int = 0):
    """``n`` labelled items of ``dims`` dimensions, one Gaussian per class (its own mean), and
    fresh ID items and OOD items (the class means shifted) to score."""
    g = torch.Generator().manual_seed(seed)
    means = 4 * torch.randn(classes, dims, generator=g)

    def draw(count: int, shift: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.arange(count) % classes
        return means[y] + shift + torch.randn(count, dims, generator=g), y

    return draw(n), draw(200)[0], draw(200, shift=1.5)[0]


def test_mahalanobis_fitted_on_fewer_items_than_dimensions_uses_a_ledoit_wolf_covariance():
    """30 items of 48 dimensions: the class-centred scatter is singular. The detector is then
    the plain Gaussian score with scikit-learn's Ledoit-Wolf covariance; pytorch-ood's own (its
    1e-6 ridge rules the null space) measures the distance outside the fit items' span, which
    fresh ID and OOD items share, and tells them apart no better than chance."""
    from sklearn.covariance import LedoitWolf
    from sklearn.metrics import roc_auc_score

    from hydra_core.detectors import feature_outlier_scores, fit_detector

    (z, y), id_items, ood_items = gaussian_fit(30, 48, 3)
    detector = fit_detector("mahalanobis", z, y)
    test = torch.cat([id_items, ood_items])
    mu = np.stack([z[y == k].double().mean(0).numpy() for k in range(3)])
    centred = z.double().numpy() - mu[y.numpy()]
    precision = np.linalg.inv(LedoitWolf(assume_centered=True).fit(centred).covariance_ * 30)
    d = test.double().numpy()[:, None, :] - mu[None]
    expected = 0.5 * np.einsum("ikd,de,ike->ik", d, precision, d).min(1)
    got = feature_outlier_scores(detector, test)
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    is_ood = np.r_[np.zeros(200), np.ones(200)]
    ridge = feature_outlier_scores(Mahalanobis(None).fit_features(z, y), test)
    assert roc_auc_score(is_ood, got) > 0.95 and roc_auc_score(is_ood, ridge) < 0.65


def test_mahalanobis_fitted_on_more_items_than_dimensions_is_pytorch_oods_own():
    from hydra_core.detectors import feature_outlier_scores, fit_detector

    (z, y), id_items, _ = gaussian_fit(300, 48, 3)
    peer = Mahalanobis(None).fit_features(z, y).predict_features(id_items).double().numpy()
    assert np.array_equal(feature_outlier_scores(fit_detector("mahalanobis", z, y), id_items), peer)


def test_vim_fitted_on_fewer_items_than_its_subspace_lowers_it_and_says_so():
    from hydra_core.detectors import feature_outlier_scores, fit_detector, vim_dimension

    (z, y), id_items, _ = gaussian_fit(20, 48, 3)
    head = torch.nn.Linear(48, 3)
    with pytest.warns(UserWarning, match="20 fit items span at most 19 of the 24 principal"):
        detector = fit_detector("vim", z, y, head)
    peer = ViM(None, d=19, w=head.weight.detach(), b=head.bias.detach()).fit_features(z, y)
    np.testing.assert_allclose(
        feature_outlier_scores(detector, id_items),
        peer.predict_features(id_items).double().numpy(),
        rtol=1e-5,
    )
    assert vim_dimension(25, 48) == 24 and vim_dimension(512, 192) == 96  # D // 2 otherwise


def test_feature_scores_of_a_masked_model_read_the_masked_features(model, benchmark):
    keep = torch.ones(3, 4, dtype=torch.bool)
    keep[1, :3] = False
    evaluation = evaluate_model(
        model, preprocess, benchmark.id_report, benchmark.ood_report, keep=keep, device="cpu"
    )
    scored = rescore(evaluation, "mahalanobis", benchmark)
    fit = benchmark.id_search
    peer = Mahalanobis(None).fit_features(plain_features(model, fit.images, keep), fit.labels)
    z = plain_features(model, benchmark.id_report.images, keep)
    np.testing.assert_allclose(
        -scored.set_scores()[0], peer.predict_features(z).double().numpy(), rtol=1e-4, atol=1e-4
    )


def test_the_fit_never_sees_a_report_item(model, benchmark):
    # a benchmark whose search split is its report split: the detectors refuse to fit on it
    leaky = Benchmark(
        benchmark.id_report, benchmark.id_report, benchmark.ood_search, benchmark.ood_report
    )
    evaluation = evaluate_model(model, preprocess, leaky.id_report, leaky.ood_report, device="cpu")
    with pytest.raises(InputError, match="would be reported on data that chose it"):
        rescore(evaluation, "knn", leaky)


@pytest.fixture(scope="module")
def report(model, benchmark):
    masks = torch.ones(2, 3, 4, dtype=torch.bool)
    masks[0, 0, :2] = False
    masks[1, 2, 1:3] = False
    members = [MemberMask(f"m{i}", "test", masks[i]) for i in range(2)]
    loaded = LoadedModel("tiny", model, preprocess)
    return evaluate_systems(loaded, benchmark, members, device="cpu", latency=False)


@pytest.fixture(scope="module")
def scored(report, benchmark):
    return rescore_report(report, SCORES, benchmark)


def test_every_score_for_every_system_it_applies_to(report, scored):
    assert list(scored) == list(SCORES)
    assert scored["msp"] is report  # MSP: the report as it was
    assert "single" not in scored["mutual_information"].systems  # no members, no MI
    assert "Hydra (unfused)" in scored["mutual_information"].systems
    for score in FEATURE_SCORES:  # no per-model features in the fused model
        assert "Hydra (fused)" not in scored[score].systems
        assert {"single", "Hydra: m0", "Hydra (unfused)"} <= set(scored[score].systems)


def test_an_ensembles_feature_score_is_the_mean_of_its_members(scored):
    report = scored["vim"]
    members = [report.evaluations[f"Hydra: m{i}"].set_scores() for i in range(2)]
    ensemble = report.evaluations["Hydra (unfused)"].set_scores()
    for k, got in enumerate(ensemble):
        np.testing.assert_allclose(got, (members[0][k] + members[1][k]) / 2)


def test_scores_table_and_gains_hold_the_paired_differences(scored):
    table = scores_table(scored)
    assert set(table["score"]) == set(SCORES)
    assert "id" not in set(table["group"])
    row = table[(table["score"] == "energy") & (table["system"] == "single")]
    row = row.set_index("set").loc["near_set"]
    ev = scored["energy"].evaluations["single"]
    id_scores, near, _ = ev.set_scores()
    assert row["auroc"] == pytest.approx(metrics.auroc(id_scores, near))
    gains = score_gains(scored)
    assert "single" not in set(gains["system"])
    for score in ("msp", "knn"):
        got = gains[(gains["score"] == score) & (gains["system"] == "Hydra (unfused)")].iloc[0]
        found = scored[score].difference("Hydra (unfused)", "single", "auroc", "far")
        assert got["far_delta"] == pytest.approx(found.value)
        assert (got["far_delta_lo"], got["far_delta_hi"]) == pytest.approx(found.bounds)
        assert got["far_holds"] == (found.lo > 0)


# --- the commands -------------------------------------------------------------------------------

DATA = ["--n-search", "60", "--n-report", "40", "--ood", "mnist", "noise", "--device", "cpu"]


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))


def test_eval_reports_every_ood_metric_per_score(checkpoint, private_cache, capsys):
    import json

    from hydra_core.cli import main

    assert main(["eval", "--model", checkpoint, *DATA, "--json"]) == 0
    msp_only = json.loads(capsys.readouterr().out)
    assert "scores" not in msp_only  # the default output as it was
    assert main(["eval", "--model", checkpoint, *DATA, "--scores", "all", "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert "mutual_information score does not apply" in captured.err  # a single model
    assert list(out["scores"]) == [s for s in SCORES if s != "mutual_information"]
    assert out["scores"]["msp"]["ood"] == msp_only["ood"]  # MSP as before, to the bit
    assert out["ood"] == msp_only["ood"]
    for score, found in out["scores"].items():
        assert [o["name"] for o in found["ood"]] == ["mnist", "noise"]
        assert set(found["ood"][0]) >= {"auroc", "fpr95", "aupr_in", "aupr_out"}
        assert 0 <= found["ood_average"]["near-OOD average"]["auroc"]["value"] <= 1, score
    assert main(["eval", "--model", checkpoint, *DATA, "--scores", "energy,knn"]) == 0
    table = capsys.readouterr().out
    assert "OOD metrics per score" in table and "knn" in table and "energy" in table
    assert main(["eval", "--model", checkpoint, *DATA, "--scores", "odin"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "argument --scores: unknown OOD score 'odin'" in err


def test_hydra_writes_the_gains_under_every_score(checkpoint, private_cache, tmp_path, capsys):
    import json

    import pandas as pd

    from hydra_core.cli import main
    from hydra_core.masks import save_masks
    from hydra_core.zoo.registry import load_model

    keep = torch.ones(2, 4, dtype=torch.bool)
    keep[0, 0] = keep[1, 3] = False
    other = keep.clone()
    other[0, 1] = False
    masks = tmp_path / "members.json"
    members = [MemberMask("a", "test", keep), MemberMask("b", "test", other)]
    save_masks(masks, members, load_model(checkpoint).identity())
    out = tmp_path / "hydra"
    args = ["hydra", "--model", checkpoint, *DATA, "--masks", str(masks), "--no-latency"]
    assert main([*args, "--out", str(out), "--scores", "msp,energy,vim,mutual_information"]) == 0
    printed = capsys.readouterr().out
    assert "does each system's OOD gain hold under every score" in printed
    gains = pd.read_csv(out / "score_gains.csv")
    # mutual information: no single model to compare with, so no gain; its metrics are tabled
    assert set(gains["score"]) == {"msp", "energy", "vim"}
    assert "Hydra (fused)" not in set(gains[gains["score"] == "vim"]["system"])
    msp = gains[(gains["score"] == "msp")].set_index("system")
    summary = pd.read_csv(out / "summary.csv").set_index("system")
    expected = summary.loc["Hydra (fused)", "near_auroc"] - summary.loc["single", "near_auroc"]
    assert msp.loc["Hydra (fused)", "near_delta"] == pytest.approx(expected)
    table = pd.read_csv(out / "scores_table.csv")
    assert {"score", "system", "set", "auroc", "auroc_lo", "fpr95", "aupr_in"} <= set(table)
    mi = table[table["score"] == "mutual_information"]
    assert set(mi["system"]) == {"Hydra (unfused)", "Hydra (fused)"}
    saved = json.loads((out / "systems.json").read_text())["scores"]
    assert saved["requested"] == ["msp", "energy", "vim", "mutual_information"]
    assert len(saved["gains"]) == len(gains)


def test_hydra_page_tables_and_roc_follow_the_score_selector(app, setup, monkeypatch):  # noqa: F811
    from hydra_core.data.benchmark import default_benchmark
    from tests.app.conftest import (
        N_REPORT,
        N_SEARCH,
        OOD,
        array,
        button,
        figures,
        finish_job,
        open_page,
    )

    keep = torch.ones(2, 4, dtype=torch.bool)
    first, second = keep.clone(), keep.clone()
    first[0, 0], second[1, 2] = False, False
    members = [MemberMask("a", "test", first), MemberMask("b", "test", second)]
    app.session_state["results"] = {"_setup": setup.key, "jobs": {}, "members": members}
    open_page(app, "pages/6_hydra.py")
    app.number_input[0].set_value(2)
    button(app, "Assemble and evaluate").click()
    app.run()
    finish_job(app, "hydra")
    msp = app.dataframe[0].value.set_index("system")
    assert "Hydra (fused)" in msp.index  # MSP: every system, as before
    next(s for s in app.selectbox if s.label == "OOD score").set_value("knn")
    app.run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    assert any("needs the fused model" in c.value for c in app.caption)  # no comparison table
    shown = app.dataframe[0].value.set_index("system")
    assert list(shown.index) == ["single", "Hydra: a", "Hydra: b", "Hydra (unfused)"]
    assert any("Hydra (fused)" in i.value and "Temperature Scaling" in i.value for i in app.info)
    report = app.session_state["results"]["hydra"][0]
    benchmark = default_benchmark(n_search=N_SEARCH, n_report=N_REPORT, ood=list(OOD))
    knn = rescore_report(report, ["knn"], benchmark)["knn"].summary().set_index("system")
    row = knn.loc["Hydra (unfused)"]
    half = (row["all_auroc_hi"] - row["all_auroc_lo"]) / 2
    assert shown.loc["Hydra (unfused)", "all_auroc"] == f"{row['all_auroc']:.4f} ± {half:.4f}"
    assert shown.loc["single", "all_auroc"] != msp.loc["single", "all_auroc"]
    roc = next(f for f in figures(app) if f.layout.title.text.startswith("ROC"))
    single = next(t for t in roc.data if t.name and t.name.startswith("single"))
    fpr, tpr = rescore_report(report, ["knn"], benchmark)["knn"].roc("single", "all")
    np.testing.assert_allclose(array(single.x), fpr)
    np.testing.assert_allclose(array(single.y), tpr)
    assert not app.warning  # KNN's fits said nothing
    # a fit's warning (ViM on fewer items than its subspace) reaches the page, once
    from hydra_core import detectors

    real = detectors.vim_dimension

    def warning_dimension(n: int, dims: int) -> int:
        import warnings

        warnings.warn("ViM: too few fit items (a test)", stacklevel=2)
        return real(n, dims)

    monkeypatch.setattr(detectors, "vim_dimension", warning_dimension)
    next(s for s in app.selectbox if s.label == "OOD score").set_value("vim")
    app.run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    assert [w.value for w in app.warning].count("ViM: too few fit items (a test)") == 1


@pytest.mark.parametrize("kind", ["bert", "roberta", "mpnet", "distilbert"])
def test_text_models_give_the_input_of_their_classifier_layer(kind):
    from hydra_core.models.text import pack
    from hydra_core.ood_scores import FeatureSource, classifier_layer
    from tests.conftest import make_tiny_text, text_batch

    model = make_tiny_text(kind)
    ids, mask = text_batch(batch=6)

    class Packed:  # a data set of packed token ids, as a text preprocess makes them
        inputs = pack(ids, mask)

        def fingerprint(self) -> str:
            return "packed"

    features = FeatureSource(model, None, lambda x: x, batch_size=4).features(Packed())
    assert features.shape == (6, 24)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(classifier_layer(model)(features), expected, atol=1e-5, rtol=0)


def test_the_image_reports_gain_table_covers_table1_and_the_unfused_twins(report, benchmark):
    from hydra_core.report.image_markdown_systems import score_gains_section
    from hydra_core.report.tables import ood_gain_table

    gains = ood_gain_table(report, benchmark, ["single", "Hydra (fused)", "not evaluated"])
    assert set(gains["system"]) == {"Hydra (fused)", "Hydra (unfused)"}  # members left out
    assert set(gains["score"]) == set(SCORES) - {"mutual_information"}
    assert set(gains[gains["system"] == "Hydra (fused)"]["score"]) == {
        "msp",
        "max_logit",
        "energy",
        "entropy",
    }
    knn = gains[(gains["score"] == "knn")].iloc[0]
    found = rescore_report(report, ["knn"], benchmark)["knn"].difference(
        "Hydra (unfused)", "single", "auroc", "near"
    )
    assert knn["near_delta"] == pytest.approx(found.value)
    text = "\n".join(score_gains_section(gains))
    assert "Does each system's OOD gain hold under every score" in text and "| knn |" in text
