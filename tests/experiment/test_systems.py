"""Every system of a Hydra experiment, checked against plain computations on a tiny model."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from hydra_core import metrics
from hydra_core.data.benchmark import build_benchmark
from hydra_core.data.images import ImageSet
from hydra_core.evaluate import ID_COLUMNS, OOD_COLUMNS, evaluate_model, interval_columns
from hydra_core.experiment.evaluate import evaluate_systems
from hydra_core.experiment.results import SUMMARY_METRICS
from hydra_core.experiment.run import SystemInfo, system_name
from hydra_core.hydra.cost import count_params
from hydra_core.hydra.finetune import FinetuneConfig, finetune_members
from hydra_core.masks import MemberMask
from hydra_core.models.adapter import ablate, prune_heads
from hydra_core.zoo.registry import LoadedModel
from tests.conftest import make_tiny_vit

ATOL = 1e-5


def preprocess(images: torch.Tensor) -> torch.Tensor:
    return images.float() / 127.5 - 1.0


def image_set(name: str, n: int, group: str, seed: int, labelled: bool = False) -> ImageSet:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 1, 16, 16), generator=g, dtype=torch.uint8)
    labels = torch.arange(n) % 5 if labelled else None
    return ImageSet(name, images, labels, group)


@pytest.fixture(scope="module")
def benchmark():
    ood = [image_set("near_set", 30, "near", 2), image_set("far_set", 30, "far", 3)]
    return build_benchmark(image_set("id_set", 60, "id", 1, labelled=True), None, ood)


@pytest.fixture(scope="module")
def loaded():
    return LoadedModel("tiny", make_tiny_vit(depth=3, num_heads=4), preprocess)


@pytest.fixture(scope="module")
def members():
    masks = torch.ones(3, 3, 4, dtype=torch.bool)
    masks[0, 0, :2] = False
    masks[1, 1, 1:3] = False
    masks[2, 2, 0] = False
    masks[2, 0, 3] = False
    return [MemberMask(f"m{i}", "test", masks[i]) for i in range(3)]


@pytest.fixture(scope="module")
def report(loaded, benchmark, members):
    deep = [loaded.model, make_tiny_vit(seed=7, depth=3, num_heads=4)]
    taylor = torch.ones(3, 4, dtype=torch.bool)
    taylor[:, 3] = False
    return evaluate_systems(
        loaded,
        benchmark,
        members,
        pruned={"Taylor": taylor},
        deep_ensemble=deep,
        device="cpu",
        latency=True,
        latency_batch=4,
        latency_repeats=2,
    )


def test_systems_and_their_kinds(report):
    kinds = {name: info.kind for name, info in report.info.items()}
    assert kinds == {
        "single": "single",
        "Taylor": "pruned",
        "Hydra: m0": "member",
        "Hydra: m1": "member",
        "Hydra: m2": "member",
        "Hydra (unfused)": "unfused",
        "Hydra (fused)": "fused",
        "Deep Ensembles": "deep-ensemble",
    }
    assert report.info["Hydra (fused)"].heads == "10x3" and report.info["Taylor"].heads == "9"


def test_system_names_are_found_by_label_and_kind(report):
    assert report.find("Hydra", "fused") == system_name("Hydra", "fused") == "Hydra (fused)"
    assert report.find("Hydra", "unfused") == "Hydra (unfused)"
    assert report.find("Hydra", "member", "m1") == "Hydra: m1"
    with pytest.raises(KeyError, match="no fused system of the ensemble 'Pair'"):
        report.find("Pair", "fused")
    with pytest.raises(ValueError, match="kind must be one of member, unfused, fused"):
        system_name("Hydra", "single")
    with pytest.raises(ValueError, match="member's name for kind 'member'"):
        system_name("Hydra", "member")


def test_fused_equals_unfused_for_zero_shot_members(report):
    assert report.max_probability_gap("Hydra (fused)", "Hydra (unfused)") < ATOL
    fused, unfused = report.evaluations["Hydra (fused)"], report.evaluations["Hydra (unfused)"]
    torch.testing.assert_close(fused.id.logits, unfused.id.logits, rtol=0, atol=1e-4)
    table = report.fusion_table()
    assert list(table["system"]) == ["single", "Hydra (fused)", "Hydra (unfused)"]
    assert table.attrs["max_prob_diff"] < ATOL
    assert table.loc[1, "accuracy"] == table.loc[2, "accuracy"]


def test_member_rows_equal_evaluate_model_with_the_mask(report, loaded, benchmark, members):
    for member in members:
        expected = evaluate_model(
            loaded.model,
            preprocess,
            benchmark.id_report,
            benchmark.ood_report,
            keep=member.keep,
            name=f"Hydra: {member.name}",
            device="cpu",
        )
        got = report.evaluations[f"Hydra: {member.name}"]
        assert torch.equal(got.id.logits, expected.id.logits)
        numbers = ["system", "set", "group"]
        np.testing.assert_array_equal(
            got.table().drop(columns=numbers).to_numpy(float),
            expected.table().drop(columns=numbers).to_numpy(float),
        )


def test_ensemble_metrics_against_plain_numbers(report, loaded, benchmark, members):
    x = preprocess(benchmark.id_report.images)
    with torch.no_grad():
        member_probs = []
        for m in members:
            with ablate(loaded.model, m.keep):
                member_probs.append(loaded.model(x).softmax(-1))
    member_probs = torch.stack(member_probs, dim=1)  # (N, M, C)
    probs = member_probs.mean(1)
    summary = report.summary().set_index("system")
    row = summary.loc["Hydra (unfused)"]
    expected = metrics.classification_metrics(probs, benchmark.id_report.labels)
    for key, value in expected.items():
        assert row[key] == pytest.approx(value, abs=1e-6)
    assert row["id_mi"] == pytest.approx(metrics.mutual_information(member_probs), abs=1e-6)
    assert row["id_di"] == pytest.approx(metrics.disagreement(member_probs), abs=1e-9)
    assert np.isnan(summary.loc["single", "id_mi"]) and np.isnan(summary.loc["Hydra: m0", "ood_di"])
    # OOD diversity: the mean over the OOD sets of the per-set values
    table = report.table().set_index(["system", "set"])
    per_set = [
        table.loc[("Hydra (fused)", s), "mutual_information"] for s in ("near_set", "far_set")
    ]
    assert summary.loc["Hydra (fused)", "ood_mi"] == pytest.approx(np.mean(per_set))
    near = table.loc[("Hydra (fused)", "near_set"), "auroc"]  # the only near set: its average
    assert summary.loc["Hydra (fused)", "near_auroc"] == near


def test_deep_ensemble_averages_independent_models(report, loaded, benchmark):
    other = make_tiny_vit(seed=7, depth=3, num_heads=4)
    x = preprocess(benchmark.id_report.images)
    with torch.no_grad():
        probs = (loaded.model(x).softmax(-1) + other(x).softmax(-1)) / 2
    row = report.summary().set_index("system").loc["Deep Ensembles"]
    assert row["accuracy"] == pytest.approx(metrics.accuracy(probs, benchmark.id_report.labels))
    assert row["nll"] == pytest.approx(metrics.nll(probs, benchmark.id_report.labels), abs=1e-6)
    assert row["heads"] == "12x2"


def test_table_reliability_and_roc(report, benchmark):
    table = report.table()
    sets = ["id_set", "near_set", "far_set", "near-OOD average", "far-OOD average", "OOD average"]
    for system in report.systems:
        assert table[table["system"] == system]["set"].tolist() == sets
    ev = report.evaluations["Hydra (fused)"]
    mean_probs = ev.id.logits.softmax(-1).mean(1)
    expected = metrics.reliability_curve(mean_probs, benchmark.id_report.labels)
    got = report.reliability("Hydra (fused)")
    np.testing.assert_allclose(got.to_numpy(float), expected.to_numpy(float), equal_nan=True)
    fpr, tpr = report.roc("Hydra (fused)", "far_set")
    msp_id = mean_probs.max(-1).values
    msp_ood = ev.ood[1].logits.softmax(-1).mean(1).max(-1).values
    ref_fpr, ref_tpr = metrics.roc_curve_ood(msp_id, msp_ood)
    np.testing.assert_allclose(fpr, ref_fpr, atol=1e-12)
    np.testing.assert_allclose(tpr, ref_tpr, atol=1e-12)
    assert len(report.roc("single", "all")[0]) > 2
    # the AUROC of each drawn curve, with its interval: per set the table's, pooled its own
    row = table[(table["system"] == "Hydra (fused)") & (table["set"] == "far_set")].iloc[0]
    assert report.roc_auroc("Hydra (fused)", "far_set") == (
        row["auroc"],
        row["auroc_lo"],
        row["auroc_hi"],
    )
    value, lo, hi = report.roc_auroc("single", "all")
    assert value == pytest.approx(np.trapezoid(*report.roc("single", "all")[::-1]), abs=1e-12)
    assert lo <= value <= hi
    with pytest.raises(KeyError, match="no OOD set 'cifar'"):
        report.roc("single", "cifar")


def test_every_number_carries_its_interval(report):
    table = report.table()
    for metric in (*ID_COLUMNS, *OOD_COLUMNS, "fpr95_tpr_id", "mutual_information"):
        present = table[metric].notna()
        assert (table.loc[present, f"{metric}_lo"] <= table.loc[present, f"{metric}_hi"]).all()
        assert table.loc[~present, f"{metric}_lo"].isna().all()
    summary = report.summary().set_index("system")
    for column in SUMMARY_METRICS:
        assert {f"{column}_lo", f"{column}_hi"} <= set(summary.columns)
    row = table[(table["system"] == "Hydra (fused)") & (table["set"] == "near-OOD average")]
    assert summary.loc["Hydra (fused)", "near_auroc_lo"] == row["auroc_lo"].item()
    assert (
        summary.loc["Hydra (fused)", "ood_mi_hi"]
        == table.loc[
            (table["system"] == "Hydra (fused)") & (table["set"] == "OOD average"),
            "mutual_information_hi",
        ].item()
    )
    # every system of the report uses the same resamples: their differences are paired
    shared = report.evaluations["single"].resamples()
    assert all(ev.resamples() is shared for ev in report.evaluations.values())
    assert "intervals" in report.setup["seconds"] and report.setup["bootstrap"]["n_boot"] == 1000


def test_paired_differences_between_systems(report):
    same = report.difference("Hydra (fused)", "Hydra (fused)", "auroc", set="near")
    assert (same.value, same.lo, same.hi, same.significant) == (0.0, 0.0, 0.0, False)
    # zero-shot fusion computes what the members compute one by one: a (near) zero difference
    fusion = report.difference("Hydra (fused)", "Hydra (unfused)", "nll")
    assert abs(fusion.value) < 1e-5 and fusion.hi - fusion.lo < 1e-5
    summary = report.summary().set_index("system")
    found = report.difference("Hydra (fused)", "single", "auroc", set="near")
    expected = summary.loc["Hydra (fused)", "near_auroc"] - summary.loc["single", "near_auroc"]
    assert found.value == pytest.approx(expected, abs=1e-12)
    assert found.lo <= found.value <= found.hi
    assert found.significant == (found.lo > 0 or found.hi < 0)
    assert report.difference("Taylor", "single", "accuracy").value == pytest.approx(
        summary.loc["Taylor", "accuracy"] - summary.loc["single", "accuracy"]
    )
    table = report.differences("single", ["accuracy", "near_auroc", "id_mi"]).set_index("system")
    assert list(table.index) == [s for s in report.systems if s != "single"]
    assert list(table.columns) == ["kind", *interval_columns(["accuracy", "near_auroc", "id_mi"])]
    assert table.loc["Hydra (fused)", "near_auroc_lo"] == found.lo
    assert table["id_mi"].isna().all()  # the single model has no MI to compare with
    with pytest.raises(KeyError, match="no summary columns"):
        report.differences("single", ["auroc"])
    with pytest.raises(KeyError, match="no system 'nope'"):
        report.difference("nope", "single", "auroc")


def test_hydra_against_each_baseline_and_its_best_member(report):
    summary = report.summary().set_index("system")
    members = ["Hydra: m0", "Hydra: m1", "Hydra: m2"]
    best = max(members, key=lambda m: summary.loc[m, "all_auroc"])  # plain argmax
    assert report.best_member("Hydra") == best
    worst_nll = min(members, key=lambda m: summary.loc[m, "nll"])
    assert report.best_member("Hydra", "nll") == worst_nll  # lower NLL is better
    table = report.comparisons("Hydra", ["all_auroc", "nll"])
    assert list(table["against"]) == ["single", "Taylor", "Deep Ensembles", "Hydra (unfused)", best]
    assert list(table["role"]) == ["baseline"] * 3 + ["unfused", "best member"]
    assert set(table["system"]) == {"Hydra (fused)"}
    for row in table.itertuples():
        expected = summary.loc["Hydra (fused)", "all_auroc"] - summary.loc[row.against, "all_auroc"]
        assert row.all_auroc == pytest.approx(expected, abs=1e-12)
        paired = report.difference("Hydra (fused)", row.against, "auroc", "all")
        assert (row.all_auroc_lo, row.all_auroc_hi) == (paired.lo, paired.hi)
        assert row.against_macs_ratio == report.cost.loc[row.against, "macs_ratio"]
    assert (table["macs_ratio"] == report.cost.loc["Hydra (fused)", "macs_ratio"]).all()
    with pytest.raises(KeyError, match="no summary columns"):
        report.comparisons("Hydra", ["auroc"])
    with pytest.raises(ValueError, match="no better direction"):
        report.best_member("Hydra", "id_mi")


def test_cost(report, loaded, members):
    cost = report.cost
    assert cost.loc["single", "params"] == count_params(loaded.model)
    pruned = [prune_heads(loaded.model, m.keep) for m in members]
    assert cost.loc["Hydra: m1", "params"] == count_params(pruned[1])
    assert cost.loc["Hydra (unfused)", "params"] == sum(count_params(p) for p in pruned)
    assert cost.loc["Deep Ensembles", "params"] == 2 * count_params(loaded.model)
    assert cost.loc["single", "params_ratio"] == 1.0
    assert cost.loc["Hydra (unfused)", "macs"] > cost.loc["Hydra: m0", "macs"] > 0
    assert (cost["latency_ms"] > 0).all() and "latency_bf16_ms" not in cost  # CPU: fp32 only
    # the paper's per-layer count: 12 d^2 per layer at MLP ratio 4; ours is 2: 4d^2 + 4d^2 = 8 d^2
    assert cost.loc["single", "formula_params"] == 3 * 8 * 24**2
    summary = report.summary().set_index("system")
    assert summary.loc["Hydra (fused)", "params"] == cost.loc["Hydra (fused)", "params"]


def test_json_and_merge(report, loaded, benchmark, members):
    text = json.dumps(report.to_json(), allow_nan=False)
    data = json.loads(text)
    assert set(data["systems"]) == set(report.systems)
    assert data["setup"]["device"] == "cpu" and "evaluate" in data["setup"]["seconds"]
    fused = next(r for r in data["summary"] if r["system"] == "Hydra (fused)")
    assert set(fused["near_auroc"]) == {"value", "ci95"} and fused["heads"] == "10x3"
    assert "near_auroc_lo" not in fused
    single = next(r for r in data["summary"] if r["system"] == "single")
    assert single["id_mi"] == {"value": None, "ci95": [None, None]}
    differences = {r["system"]: r for r in data["differences_to_single"]}
    assert set(differences) == set(report.systems) - {"single"}
    found = report.difference("Hydra (fused)", "single", "auroc", set="all")
    entry = differences["Hydra (fused)"]["all_auroc"]
    assert entry == {
        "value": found.value,
        "ci95": [found.lo, found.hi],
        "significant": found.significant,
    }
    evaluation = data["systems"]["Hydra (fused)"]["evaluation"]
    assert set(evaluation["ood"][0]["mutual_information"]) == {"value", "ci95"}

    other = evaluate_systems(
        loaded, benchmark, members[:2], label="Pair", device="cpu", latency=False
    )
    merged = report.merge(other)
    assert "Pair (fused)" in merged.systems and merged.systems.count("single") == 1
    # both reports drew the same resamples of the same images: intervals survive the merge
    pd.testing.assert_frame_equal(
        merged.table().query("system in @report.systems").reset_index(drop=True), report.table()
    )
    assert "Pair (fused)" in merged.cost.index and "latency_ms" not in other.cost
    with pytest.raises(ValueError, match="already has a system named 'single'"):
        merged.add_system("single", other.evaluations["single"], SystemInfo("single", "12"))


def test_finetuned_members_are_evaluated_as_trained(loaded, benchmark, members, tmp_path):
    from hydra_core.cache import DiskCache

    train = image_set("train", 32, "id", 9, labelled=True)
    config = FinetuneConfig(n_train=32, batch_size=16, steps=2, warmup_steps=1, lr=1e-2)
    cache = DiskCache(tmp_path)
    report = evaluate_systems(
        loaded,
        benchmark,
        members,
        finetune=config,
        train_set=train,
        device="cpu",
        cache=cache,
        latency=False,
    )
    assert report.setup["finetune_cached"] == {"m0": False, "m1": False, "m2": False}
    again = evaluate_systems(
        loaded,
        benchmark,
        members,
        finetune=config,
        train_set=train,
        device="cpu",
        cache=cache,
        latency=False,
    )
    assert all(again.setup["finetune_cached"].values())
    member = again.info["Hydra: m1"].models[0]
    expected = evaluate_model(
        member, preprocess, benchmark.id_report, benchmark.ood_report, device="cpu"
    )
    assert torch.equal(again.evaluations["Hydra: m1"].id.logits, expected.id.logits)
    # fine-tuned MLPs differ, so fusion (MLPs averaged) is no longer the unfused ensemble
    gap = report.max_probability_gap("Hydra (fused)", "Hydra (unfused)")
    assert gap > 1e-4
    # Table 11 from already fine-tuned members (loaded from the cache)
    tuned = finetune_members(
        loaded.model, members, config, preprocess=preprocess, train_set=train, cache=cache
    )
    assert all(t.cached for t in tuned)
    table = evaluate_systems(
        loaded, benchmark, tuned, device="cpu", cache=cache, latency=False
    ).fusion_table()
    assert list(table["system"]) == ["single", "Hydra (fused)", "Hydra (unfused)"]
    assert table.attrs["max_prob_diff"] == pytest.approx(gap)


def test_bad_calls_are_explained(loaded, benchmark, members):
    with pytest.raises(ValueError, match="no systems"):
        evaluate_systems(loaded, benchmark, [], device="cpu")
    with pytest.raises(ValueError, match="two or more independently trained"):
        evaluate_systems(
            loaded, benchmark, members, deep_ensemble=[loaded.model], device="cpu", latency=False
        )


# --- the guard: no system is reported on data that chose it ------------------------------------


def test_a_system_chosen_on_report_items_is_refused_before_anything_is_predicted(
    loaded, benchmark, members, monkeypatch
):
    from hydra_core.data.provenance import ChosenOn
    from hydra_core.errors import InputError
    from hydra_core.experiment import run as experiment
    from hydra_core.hydra.systems import Hydra, Pruned, Single

    predicted = []
    real = experiment.evaluate_model
    monkeypatch.setattr(
        experiment, "evaluate_model", lambda *a, **k: predicted.append(k["name"]) or real(*a, **k)
    )
    # heads chosen on half of a report set (as a leave-one-set-out search on the other sets is)
    far = benchmark.ood_report[1]
    half = far.subset(torch.arange(10))
    chosen = ChosenOn.of("heads", [benchmark.id_search, half])
    keep = members[0].keep
    with pytest.raises(InputError, match=r"'leaky'.*far_set \(10 of 30 items\).*heads: far_set"):
        evaluate_systems(loaded, benchmark, [Single(), Pruned("leaky", keep, chosen)], device="cpu")
    assert predicted == []  # refused before the single model was even predicted
    with pytest.raises(InputError, match="'Hydra \\(fused\\)'.*far_set"):
        evaluate_systems(loaded, benchmark, [Hydra(members, chosen=chosen)], device="cpu")
    # the same circuit on the sets it never saw is reported
    from dataclasses import replace

    clean = replace(benchmark, ood_report=(benchmark.ood_report[0],))
    found = evaluate_systems(
        loaded, clean, [Single(), Pruned("leaky", keep, chosen)], device="cpu", latency=False
    )
    assert set(found.table()["set"]) >= {"near_set"}
    assert "far_set" not in set(found.table()["set"])


def test_systems_are_taken_as_chosen_on_the_search_split_and_it_must_not_reach_the_report(loaded):
    from hydra_core.errors import InputError
    from hydra_core.hydra.systems import Pruned, Single

    id_set = image_set("id_set", 60, "id", 1, labelled=True)
    ood = [image_set("near_set", 30, "near", 2), image_set("far_set", 30, "far", 3)]
    search_ood = [image_set("photos", 20, "far", 4)]
    # a search split holding a copy of five reported ID images (duplicates across the parts)
    searched = ImageSet("id_search", id_set.images[:25], id_set.labels[:25], "id")
    leaky = build_benchmark(
        searched, id_set.subset(torch.arange(20, 60)), ood, search_ood=search_ood
    )
    keep = torch.ones(3, 4, dtype=torch.bool)
    keep[0, 0] = False
    # the single model chose nothing: it is reported
    assert (
        evaluate_systems(loaded, leaky, [Single()], device="cpu", latency=False).table() is not None
    )
    with pytest.raises(InputError, match=r"'pruned'.*id_set \(5 of 40 items\)"):
        evaluate_systems(loaded, leaky, [Single(), Pruned("pruned", keep)], device="cpu")


def test_temperature_is_chosen_on_the_id_search_split(loaded, benchmark):
    from hydra_core.baselines.systems import TemperatureBaseline
    from hydra_core.data.provenance import item_keys
    from hydra_core.experiment.run import Run

    run = Run(loaded, benchmark, torch.device("cpu"), {})
    chosen = TemperatureBaseline().chosen_on(run)
    search = benchmark.id_search
    assert chosen.parts == (f"temperature: {search.name} (n={len(search)})",)
    assert chosen.seen(item_keys(search.images)) == len(search)
    assert chosen.seen(item_keys(benchmark.id_report.images)) == 0


def test_repeated_difference_is_the_mean_over_repeats_with_a_two_level_interval(
    loaded, benchmark, members
):
    from hydra_core.experiment.results import repeated_difference
    from hydra_core.hydra.systems import Pruned, Single
    from hydra_core.report.claims import paired_claim

    reports = [
        evaluate_systems(
            loaded, benchmark, [Single(), Pruned("pruned", m.keep)], device="cpu", latency=False
        )
        for m in members
    ]
    each = [r.difference("pruned", "single", "auroc", "all") for r in reports]
    found = repeated_difference(reports, "pruned", "single", "auroc", "all")
    assert found.value == pytest.approx(np.mean([d.value for d in each]))
    assert found.lo <= found.value <= found.hi
    one = repeated_difference(reports[:1], "pruned", "single", "auroc", "all")
    assert one.value == pytest.approx(each[0].value)
    claim = paired_claim(reports, "pruned", "single", "all_auroc", paper=1.0)
    assert claim["value"] == pytest.approx(100 * found.value)
    assert (claim["lo"], claim["hi"]) == pytest.approx((100 * found.lo, 100 * found.hi))
    with pytest.raises(KeyError, match="lack 'nope'"):
        repeated_difference(reports, "nope", "single", "auroc")
