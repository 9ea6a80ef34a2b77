"""Per-head evidence (hydra_core.analysis.evidence): every number against a plain computation.

ΔAUROC/Δaccuracy of each head against a full forward under ``ablate`` and sklearn's AUROC; the
intervals against the project's resamples (the same counts) recomputed plainly with sklearn
sample weights; the Mahalanobis detector against sklearn's Ledoit-Wolf and a plain inverse; the
ranking rule on a hand-made table; the stability file."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.covariance import LedoitWolf
from sklearn.metrics import roc_auc_score

import hydra_core as hc
from hydra_core.analysis.evidence import (
    COLUMNS,
    head_evidence,
    mahalanobis_scores,
    rank_heads,
    read_stability,
    single_head_ablations,
)
from hydra_core.analysis.representations import head_cls_features
from hydra_core.errors import InputError
from hydra_core.evaluate import callable_model
from hydra_core.metrics.bootstrap import BootstrapConfig, Resamples
from hydra_core.metrics.covariance import COVARIANCE_FLOOR
from hydra_core.models.adapter import ablate, head_layout
from hydra_core.models.text import pack
from tests.conftest import (
    clip_images,
    make_tiny_text,
    make_tiny_vit,
    make_tiny_zero_shot,
    text_batch,
)

N_BOOT = 40


def _images(n: int, seed: int, shift: float = 0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 1, 16, 16, generator=g) + shift).double()


def _texts(n: int, seed: int) -> torch.Tensor:
    return pack(*text_batch(seed, n, 10))


def _case(kind: str):
    """(model, fit_x, fit_y, report_id_x, report_id_y, report_ood) in float64."""
    if kind == "image":
        model = make_tiny_vit(depth=2, num_heads=3).double()
        data = [_images(14, 1), _images(16, 2), _images(11, 3, 1.5), _images(10, 4, -1.0)]
    elif kind == "text":
        model = make_tiny_text("bert").double()
        data = [_texts(14, 1), _texts(16, 2), _texts(11, 3), _texts(10, 4)]
    else:  # OpenCLIP zero-shot, image and text towers in one layout
        model = make_tiny_zero_shot(towers="both").double()
        data = [clip_images(n, seed=s).double() for n, s in ((14, 1), (16, 2), (11, 3), (10, 4))]
        data[2] = 1.5 * data[2] + 0.5
    classes = 3 if kind == "text" else 5
    fit_y = torch.arange(len(data[0])) % classes
    report_y = torch.arange(len(data[1])) % classes
    return model, data[0], fit_y, data[1], report_y, {"near": data[2], "far": data[3]}


def _plain_outputs(model, x, keep):
    with torch.no_grad(), ablate(model, keep):
        logits = callable_model(model)(x).double()
    probs = logits.softmax(-1)
    return probs.amax(-1).numpy(), probs.argmax(-1).numpy()


def _plain_auroc(msp, n_id, sizes, weights=None):
    """sklearn's AUROC (OOD positive, score -MSP) averaged over the OOD sets; ``weights``: the
    resample counts of the ID part and of each set."""
    bounds = np.cumsum([n_id, *sizes])
    parts = np.split(msp, bounds[:-1])
    values = []
    for k, ood in enumerate(parts[1:]):
        y = np.r_[np.zeros(n_id), np.ones(len(ood))]
        w = None if weights is None else np.r_[weights[0], weights[1 + k]]
        values.append(roc_auc_score(y, -np.r_[parts[0], ood], sample_weight=w))
    return float(np.mean(values))


@pytest.fixture(scope="module", params=["image", "text", "clip"])
def case(request):
    model, fit_x, fit_y, x, y, ood = _case(request.param)
    found = head_evidence(model, fit_x, fit_y, x, y, ood, n_boot=N_BOOT, seed=3)
    return request.param, model, fit_x, fit_y, x, y, ood, found


def test_ablation_effects_equal_full_forwards_and_sklearn(case):
    kind, model, _, _, x, y, ood, found = case
    sizes = [len(v) for v in ood.values()]
    everything = torch.cat(hc.models.adapter.model_and_inputs(model, x, *ood.values())[1:])
    layout = head_layout(model)
    dense_msp, dense_pred = _plain_outputs(model, everything, layout.all_kept())
    dense_acc = float((dense_pred[: len(x)] == y.numpy()).mean())
    dense_auroc = _plain_auroc(dense_msp, len(x), sizes)
    assert found.dense["accuracy"][0] == pytest.approx(dense_acc, abs=1e-12)
    assert found.dense["auroc"][0] == pytest.approx(dense_auroc, abs=1e-12)
    assert len(found.table) == layout.total_heads
    for row in found.table.itertuples():
        keep = layout.all_kept()
        keep[row.layer, row.head] = False
        msp, pred = _plain_outputs(model, everything, keep)
        accuracy = float((pred[: len(x)] == y.numpy()).mean())
        assert row.delta_accuracy == pytest.approx(accuracy - dense_acc, abs=1e-12)
        roc = _plain_auroc(msp, len(x), sizes)
        assert row.delta_auroc == pytest.approx(roc - dense_auroc, abs=1e-9)
    assert found.table["delta_auroc"].abs().max() > 0  # the heads matter in these models


def test_intervals_are_the_projects_resamples_recomputed_plainly(case):
    kind, model, _, _, x, y, ood, found = case
    sizes = [len(v) for v in ood.values()]
    resamples = Resamples.draw(y.numpy(), sizes, BootstrapConfig(n_boot=N_BOOT, seed=3))
    everything = torch.cat(hc.models.adapter.model_and_inputs(model, x, *ood.values())[1:])
    layout = head_layout(model)
    dense_msp, dense_pred = _plain_outputs(model, everything, layout.all_kept())
    rows = found.table.sample(4, random_state=0) if len(found.table) > 4 else found.table
    for row in rows.itertuples():
        keep = layout.all_kept()
        keep[row.layer, row.head] = False
        msp, pred = _plain_outputs(model, everything, keep)
        roc, acc = [], []
        for b in range(N_BOOT):
            weights = [resamples.id_counts[b], *(c[b] for c in resamples.ood_counts)]
            roc.append(
                _plain_auroc(msp, len(x), sizes, weights)
                - _plain_auroc(dense_msp, len(x), sizes, weights)
            )
            correct = (pred[: len(x)] == y.numpy()).astype(float)
            dense_correct = (dense_pred[: len(x)] == y.numpy()).astype(float)
            w = resamples.id_counts[b]
            acc.append((w @ correct - w @ dense_correct) / w.sum())
        lo, hi = np.quantile(roc, [0.025, 0.975])
        assert (row.delta_auroc_lo, row.delta_auroc_hi) == pytest.approx((lo, hi), abs=1e-9)
        assert row.delta_auroc_significant == (lo > 0 or hi < 0)
        lo, hi = np.quantile(acc, [0.025, 0.975])
        assert (row.delta_accuracy_lo, row.delta_accuracy_hi) == pytest.approx((lo, hi), abs=1e-12)


def test_detector_equals_sklearn_ledoit_wolf_and_a_plain_inverse(case):
    kind, model, fit_x, fit_y, x, y, ood, found = case
    sizes = [len(v) for v in ood.values()]
    everything = torch.cat(hc.models.adapter.model_and_inputs(model, x, *ood.values())[1:])
    fit = head_cls_features(model, fit_x).double().numpy()
    feats = head_cls_features(model, everything).double().numpy()
    labels = fit_y.numpy()
    resamples = Resamples.draw(y.numpy(), sizes, BootstrapConfig(n_boot=N_BOOT, seed=3))
    read = fit.shape[1]
    for row in found.table.itertuples():
        if row.layer >= read:  # a text tower's head sees the prompts, not the samples
            assert math.isnan(row.detector_auroc) and math.isnan(row.detector_auroc_lo)
            continue
        f, z = fit[:, row.layer, row.head], feats[:, row.layer, row.head]
        means = np.stack([f[labels == c].mean(0) for c in np.unique(labels)])
        centred = f - means[np.searchsorted(np.unique(labels), labels)]
        cov = LedoitWolf().fit(centred).covariance_
        d = cov.shape[0]
        cov = cov + COVARIANCE_FLOOR * (np.trace(cov) / d or 1.0) * np.eye(d)
        inverse = np.linalg.inv(cov)
        diff = z[:, None] - means[None]
        scores = -np.einsum("nkd,de,nke->nk", diff, inverse, diff).min(1)
        assert row.detector_auroc == pytest.approx(_plain_auroc(scores, len(x), sizes), abs=1e-9)
        if row.label == found.table["label"].iloc[0]:
            reps = [
                _plain_auroc(
                    scores,
                    len(x),
                    sizes,
                    [resamples.id_counts[b], *(c[b] for c in resamples.ood_counts)],
                )
                for b in range(N_BOOT)
            ]
            lo, hi = np.quantile(reps, [0.025, 0.975])
            assert (row.detector_auroc_lo, row.detector_auroc_hi) == pytest.approx((lo, hi))
            assert row.detector_auroc_significant == (lo > 0.5 or hi < 0.5)


def test_mahalanobis_scores_with_a_plain_covariance():
    g = np.random.default_rng(0)
    fit = g.normal(size=(30, 1, 2, 3))
    labels = np.arange(30) % 3
    x = g.normal(size=(8, 1, 2, 3))
    got = mahalanobis_scores(fit, labels, x, shrinkage=0.0)
    for head in range(2):
        f = fit[:, 0, head]
        means = np.stack([f[labels == c].mean(0) for c in range(3)])
        cov = np.cov(f - means[labels], rowvar=False)
        cov += COVARIANCE_FLOOR * np.trace(cov) / 3 * np.eye(3)
        inverse = np.linalg.inv(cov)
        expected = [-min((v - m) @ inverse @ (v - m) for m in means) for v in x[:, 0, head]]
        np.testing.assert_allclose(got[0, head], expected, rtol=1e-10)


def test_single_head_ablations_in_chunks_equal_one_pass(monkeypatch):
    import hydra_core.analysis.evidence as evidence

    model = make_tiny_vit(depth=2, num_heads=3).double()
    x = _images(11, 5)
    whole = single_head_ablations(model, x)
    monkeypatch.setattr(evidence, "CHUNK", 4)
    seen = []
    parts = single_head_ablations(model, x, progress=lambda done, total: seen.append((done, total)))
    np.testing.assert_allclose(parts.msp, whole.msp, rtol=1e-12)  # batch sizes round apart
    np.testing.assert_array_equal(parts.pred, whole.pred)
    assert seen[-1] == (18, 18)  # 6 heads, 3 chunks


def _table(**columns) -> pd.DataFrame:
    n = len(next(iter(columns.values())))
    base = {"label": [f"L0H{i}" for i in range(n)], "layer": [0] * n, "head": list(range(n))}
    base.update({c.key: [math.nan] * n for c in COLUMNS})
    base.update(columns)
    return pd.DataFrame(base)


def test_ranking_rule():
    table = rank_heads(
        _table(
            delta_auroc=[-0.10, 0.02, -0.03, 0.0],  # a drop = important: ranks 1, 4, 2, 3
            detector_auroc=[0.90, 0.55, 0.70, math.nan],  # highest first: 1, 3, 2, -
            keep_frequency=[0.1, 0.9, 0.5, 0.5],  # highest first: 4, 1, 2.5, 2.5
        )
    )
    assert table["rank_delta_auroc"].tolist() == [1, 4, 2, 3]
    assert table["rank_detector_auroc"].tolist()[:3] == [1, 3, 2]
    assert table["rank_keep_frequency"].tolist() == [4, 1, 2.5, 2.5]
    assert table["mean_rank"].tolist() == pytest.approx([2, 8 / 3, 6.5 / 3, 2.75])
    assert table["agreed_rank"].tolist() == [1, 3, 2, 4]
    assert table["disagreement"].tolist() == [3, 3, 0.5, 0.5]
    assert table["disagrees"].tolist() == [
        "keep frequency",
        "keep frequency",  # |1 - 8/3| = 1.67 > |4 - 8/3|, |3 - 8/3|
        "keep frequency",
        "ΔAUROC",  # a tie of distances goes to the first column
    ]
    agreeing = rank_heads(_table(delta_auroc=[-0.2, -0.1], detector_auroc=[0.9, 0.6]))
    assert agreeing["disagreement"].tolist() == [0, 0]
    assert agreeing["disagrees"].tolist() == ["", ""]


#: each ranked column's meaning, in the direction that makes a head more important
MORE_IMPORTANT = {
    "delta_auroc": -0.05,  # ablating it drops the AUROC: the model needs it
    "detector_auroc": 0.9,  # its own output separates OOD
    "keep_frequency": 1.0,  # no stability resample removed it
}
LESS_IMPORTANT = {"delta_auroc": 0.0, "detector_auroc": 0.5, "keep_frequency": 0.0}


@pytest.mark.parametrize("key", sorted(MORE_IMPORTANT))
def test_each_ranked_column_ranks_the_more_important_head_first(key):
    """Ties every ranked column's direction to its meaning: two heads equal on every other
    column, the one that matters more by this column ranks first (higher = more important)."""
    assert {c.key for c in COLUMNS if c.ranked} == set(MORE_IMPORTANT)
    columns = {k: [LESS_IMPORTANT[k]] * 2 for k in MORE_IMPORTANT}
    columns[key] = [LESS_IMPORTANT[key], MORE_IMPORTANT[key]]
    table = rank_heads(_table(**columns))
    assert table["agreed_rank"].tolist() == [2, 1]
    assert table[f"rank_{key}"].tolist() == [2, 1]


def test_a_head_no_resample_removes_ranks_above_one_every_resample_removes(tmp_path):
    """The stability file holds removal frequencies: removed by no resample (0) is kept by all,
    and ranks above a head every resample removed (1), all else equal."""
    removal = np.array([1.0, 0.0])  # L0H0 removed by every resample, L0H1 by none
    frame = _table(delta_auroc=[-0.02, -0.02], detector_auroc=[0.7, 0.7])
    frame["keep_frequency"] = 1.0 - removal
    ranked = rank_heads(frame).set_index("label")
    assert ranked.loc["L0H1", "agreed_rank"] == 1 and ranked.loc["L0H0", "agreed_rank"] == 2
    # and through head_evidence: the removal map of a stability file becomes keep frequency
    model, fit_x, fit_y, x, y, ood = _case("image")
    layout = head_layout(model)
    removal = np.zeros(layout.shape)
    removal[0, 0] = 1.0
    with_freq = head_evidence(model, fit_x, fit_y, x, y, ood, n_boot=10, frequency=removal)
    kept = with_freq.table.set_index("label")
    assert kept.loc["L0H0", "keep_frequency"] == 0.0 and kept.loc["L0H1", "keep_frequency"] == 1.0
    assert kept["rank_keep_frequency"].idxmax() == "L0H0"  # the last of the keep ranks


def test_frequency_joins_the_ranking_and_maps(tmp_path):
    model, fit_x, fit_y, x, y, ood = _case("image")
    layout = head_layout(model)
    frequency = [[0.0, 0.5, None], [1.0, 0.25, 0.75]]
    path = tmp_path / "stability.json"
    path.write_text(
        json.dumps({"format": "hydra-stability", "num_heads": [3, 3], "frequency": frequency})
    )
    read = read_stability(path, layout)
    found = head_evidence(model, fit_x, fit_y, x, y, ood, n_boot=10, frequency=read)
    got = found.map("keep_frequency")  # 1 - the file's removal frequency
    assert np.isnan(got[0, 2]) and got[1, 0] == 0.0 and got[0, 1] == 0.5 and got[0, 0] == 1.0
    ranks = found.table.set_index("label")["rank_keep_frequency"]
    assert ranks["L0H0"] == 1 and ranks["L1H0"] == 5  # kept by all first, removed by all last
    assert "keep_frequency" in [c.key for c in found.columns()]
    data = found.to_json()
    assert data["heads"][0]["agreed_rank"] == 1 and "rank_keep_frequency" in data["heads"][0]
    assert json.loads(json.dumps(data)) == data  # JSON-safe: NaN as null
    without = head_evidence(model, fit_x, fit_y, x, y, ood, n_boot=10)
    assert "keep_frequency" not in [c.key for c in without.columns()]


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("not json", "not a stability result"),
        ({"format": "hydra-masks"}, "not a stability result"),
        ({"format": "hydra-stability"}, "no frequency map"),
        ({"format": "hydra-stability", "frequency": [[0.1, 0.2], [0.3, 0.4]]}, "another model"),
        ({"format": "hydra-stability", "frequency": [[0.1, 2, 0], [0, 0, 0]]}, r"\[0, 1\]"),
        ({"format": "hydra-stability", "frequency": [[0.1, "a", 0], [0, 0, 0]]}, "not a number"),
    ],
)
def test_bad_stability_files_are_refused(tmp_path, content, match):
    layout = head_layout(make_tiny_vit(depth=2, num_heads=3))
    path = tmp_path / "s.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(InputError, match=match):
        read_stability(path, layout)
    with pytest.raises(InputError, match="does not exist"):
        read_stability(tmp_path / "missing.json", layout)


def test_the_ablations_are_cached_and_give_the_same_evidence(tmp_path, monkeypatch):
    import hydra_core.analysis.evidence as evidence
    from hydra_core.cache import DiskCache

    model, fit_x, fit_y, x, y, ood = _case("image")
    cache = DiskCache(tmp_path)
    first = head_evidence(model, fit_x, fit_y, x, y, ood, n_boot=10, cache=cache)

    def refuse(*args, **kwargs):
        raise AssertionError("recomputed instead of read from the cache")

    monkeypatch.setattr(evidence, "single_head_ablations", refuse)
    again = head_evidence(model, fit_x, fit_y, x, y, ood, n_boot=10, cache=cache)
    pd.testing.assert_frame_equal(first.table, again.table)
    with pytest.raises(AssertionError, match="recomputed"):  # other weights: another key
        head_evidence(
            make_tiny_vit(seed=1, depth=2, num_heads=3).double(),
            fit_x,
            fit_y,
            x,
            y,
            ood,
            cache=cache,
        )
