"""Pages 2-6 driven the way a user drives them, with Streamlit's AppTest, on a tiny checkpoint."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df
from streamlit.testing.v1 import AppTest

from hydra_core.analysis import greedy
from hydra_core.analysis.inputs import report_sample
from hydra_core.analysis.representations import centroid_distances, head_cls_features
from hydra_core.data.benchmark import default_benchmark
from hydra_core.masks import MemberMask, masks_to_json
from hydra_core.models.adapter import HeadLayout
from hydra_core.zoo.registry import load_model
from hydra_ui.context import CONFIG_KEY, SetupConfig, disk_cache
from tests.app.conftest import (
    N_REPORT,
    N_SEARCH,
    OOD,
    array,
    button,
    figures,
    finish_job,
    new_app,
    open_page,
)


def test_search_fills_the_heatmap_and_comes_back_from_the_cache(app, setup):
    open_page(app, "pages/2_headmap.py")
    app.number_input[0].set_value(2)  # budget
    button(app, "Run").click()
    app.run()
    finish_job(app, "search")
    heatmap = next(f for f in figures(app) if f.data[0].type == "heatmap")
    z = array(heatmap.data[0].z)
    assert z.shape == (2, 4)
    assert sorted(z[np.isfinite(z)].tolist()) == [1.0, 2.0]  # two heads removed, at steps 1 and 2
    runs = app.dataframe[0].value
    assert runs.loc[0, "objective"] == "avg" and runs.loc[0, "heads removed"] == 2
    search_caption = next(c.value for c in app.caption if c.value.startswith("Search data"))
    assert "(photos, faces)" in search_caption and "no reported number uses them" in search_caption

    again = new_app(setup)  # a new visit, same disk cache
    open_page(again, "pages/2_headmap.py")
    assert again.dataframe[0].value.loc[0, "heads removed"] == 2
    same = next(f for f in figures(again) if f.data[0].type == "heatmap")
    np.testing.assert_array_equal(array(same.data[0].z), z)


def test_headmap_measures_the_circuit_on_the_report_sets(app, setup, reference):
    from hydra_core.evaluate import auroc_changes

    open_page(app, "pages/2_headmap.py")
    app.number_input[0].set_value(2)
    button(app, "Run").click()
    app.run()
    finish_job(app, "search")
    button(app, "Measure on the report sets").click()
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    shown = app.dataframe[-1].value
    assert list(shown["report set"][: len(OOD)]) == list(OOD)  # readable column names
    assert {"AUROC, dense model", "AUROC, circuit"} <= set(shown.columns)
    assert any(f"{N_REPORT:,} ID report images" in c.value for c in app.caption)
    result = app.session_state["results"]["jobs"]["search"].result
    loaded, _ = reference
    benchmark = default_benchmark(n_search=N_SEARCH, n_report=N_REPORT, ood=list(OOD))
    expected = auroc_changes(loaded, benchmark, result.keep_mask(), device="cpu")
    first = shown["circuit - dense"].iloc[0]
    assert first.startswith(f"{expected['delta_auroc'].iloc[0]:+.4f}")


def test_a_stopped_search_can_be_resumed(app, monkeypatch):
    real = greedy.greedy_circuit

    def slow_search(*args, progress, **kwargs):
        def slow_progress(step) -> None:
            time.sleep(0.3)  # a tiny model is fast: give the Stop click time to arrive
            progress(step)

        return real(*args, progress=slow_progress, **kwargs)

    monkeypatch.setattr(greedy, "greedy_circuit", slow_search)  # the page imports it on each run
    open_page(app, "pages/2_headmap.py")
    app.number_input[0].set_value(7)  # every head but one: a circuit keeps a head
    button(app, "Run").click()
    app.run()
    next(b for b in app.button if b.key == "stop-search").click()
    app.run()
    finish_job(app, "search")
    job = app.session_state["results"]["jobs"]["search"]
    assert job.status == "stopped" and job.result.steps < 7
    assert not button(app, "Resume").disabled
    button(app, "Resume").click()
    app.run()
    finish_job(app, "search")
    assert app.dataframe[0].value.loc[0, "heads removed"] == 7


def test_representations_distances_match_hydra_core(app, reference):
    """The page describes the report sets (a sample of the report data), never the search sets."""
    open_page(app, "pages/4_representations.py")
    loaded, _ = reference
    benchmark = default_benchmark(n_search=N_SEARCH, n_report=N_REPORT, ood=list(OOD))
    sample = report_sample(loaded.preprocess, benchmark)
    assert len(sample.id_x) == N_REPORT and list(sample.ood_per_set) == list(OOD)
    id_feats = head_cls_features(loaded.model, sample.id_x)
    expected = centroid_distances(
        id_feats, head_cls_features(loaded.model, sample.ood_per_set["noise"])
    )
    shown = next(d.value for d in app.dataframe if {"ood_set", "label"} <= set(d.value.columns))
    assert list(shown["ood_set"].unique()) == list(OOD)
    noise = shown[shown["ood_set"] == "noise"].reset_index(drop=True)
    np.testing.assert_allclose(noise["mahalanobis"], expected["mahalanobis"], rtol=1e-6)
    np.testing.assert_allclose(noise["euclidean"], expected["euclidean"], rtol=1e-6)


def test_representations_show_one_head_with_its_images_on_hover(app):
    """One head by default (the last layer's first, or the head picked on a head map); an
    image model's points carry their picture for the hover label; the head maps are
    clickable."""
    open_page(app, "pages/4_representations.py")
    mode = next(r for r in app.radio if r.label == "Heads shown")
    assert mode.value == "one head"
    head = next(s for s in app.selectbox if s.label.startswith("Head (or click one"))
    assert head.value == "L1H0"
    [chart] = app.get("vega_lite_chart")
    spec = json.loads(chart.proto.spec)
    assert spec["title"] == "PCA of L1H0"
    assert {"field": "image", "type": "nominal"} in spec["encoding"]["tooltip"]
    points = convert_arrow_bytes_to_pandas_df(chart.proto.data.data)  # Streamlit moves the data
    assert len(points) == N_REPORT * (1 + len(OOD)) and list(points["set"].unique()) == [
        "ID",
        *OOD,
    ]
    assert points["image"].str.startswith("data:image/png;base64,").all()
    distances = next(f for f in figures(app) if f.data[0].type == "heatmap")
    assert [t.meta for t in distances.data[1:]] == ["head-picker"]  # cells can be clicked

    app.session_state["picked_head"] = "L0H3"  # a click on any head map
    app.run()
    head = next(s for s in app.selectbox if s.label.startswith("Head (or click one"))
    assert head.value == "L0H3"
    assert json.loads(app.get("vega_lite_chart")[0].proto.spec)["title"] == "PCA of L0H3"
    mode = next(r for r in app.radio if r.label == "Heads shown")
    mode.set_value("several heads (their features concatenated)")
    app.run()
    assert not app.exception
    spec = json.loads(app.get("vega_lite_chart")[0].proto.spec)
    assert spec["title"] == "PCA of L1H0, L1H1, L1H2, L1H3"  # the last layer's first four


def test_masks_build_draw_export_and_import(app):
    open_page(app, "pages/5_masks.py")
    app.radio[0].set_value("seed-sampling")
    app.selectbox[0].set_value("Taylor")
    app.number_input[0].set_value(2)  # B
    app.number_input[1].set_value(6)  # K
    app.number_input[2].set_value(3)  # M
    button(app, "Build").click()
    app.run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    members = app.session_state["results"]["members"]
    assert [m.name for m in members] == ["Taylor seed 0", "Taylor seed 1", "Taylor seed 2"]
    assert all(m.kept == 8 - 2 for m in members)

    app.pills[0].set_value(["H1", "H2"])  # layer 0 keeps two heads; layer 1 keeps all four
    app.text_input[0].set_value("drawn")
    button(app, "Add member").click()
    app.run()
    drawn = app.session_state["results"]["members"][-1]
    assert drawn.name == "drawn" and drawn.keep.tolist() == [[False, True, True, False], [True] * 4]

    exported = exported_masks(app)
    assert [m["name"] for m in exported["members"]][-1] == "drawn"
    made = exported["members"][0]["provenance"]  # the file says how each member was made
    assert made["strategy"] == "seed-sampling"
    assert made["parameters"] == {"budget": 2, "pool": 6, "seed": 0}
    assert made["ranking"]["method"] == "taylor" and made["ranking"]["samples"] == N_SEARCH
    assert made["ranking"]["search"]["id"]["n"] == N_SEARCH
    assert set(made["ranking"]["search"]["ood"]) == {"photos", "faces"}
    assert exported["members"][-1]["provenance"] == {"strategy": "manual"}
    wrong = dict(exported, model={**exported["model"], "layers": 6, "heads": 12})
    app.file_uploader[0].set_value(("wrong.json", json.dumps(wrong).encode(), "application/json"))
    app.run()
    assert not app.exception
    assert any(
        "Cannot import wrong.json: the masks were made for" in e.value
        and "6 layers x 12 heads" in e.value
        for e in app.error
    )
    for name, content, message in (  # validated as the command line validates a mask file
        ("latin.json", '{"caf\xe9": 1}'.encode("latin-1"), "latin.json is not a mask file"),
        ("empty.json", b"  ", "empty.json is empty"),
        ("broken.json", b"{not json", "broken.json is not valid JSON"),
        ("list.json", b"[1, 2]", "list.json: a mask file holds a JSON object"),
    ):
        app.file_uploader[0].set_value((name, content, "application/json"))
        app.run()
        errors = [e.value for e in app.error]
        assert not app.exception and len(errors) == 1 and "\n" not in errors[0], errors
        assert errors[0].startswith(f"Cannot import {name}") and message in errors[0], errors

    app.file_uploader[0].set_value(
        ("masks.json", json.dumps(exported).encode(), "application/json")
    )
    app.run()
    assert any("4 member(s)" in s.value for s in app.success)


def exported_masks(at: AppTest) -> dict:
    """The mask file the page's export button downloads (built by the same call)."""
    loaded = load_model(at.session_state[CONFIG_KEY].model)
    identity = loaded.identity()
    return masks_to_json(at.session_state["results"]["members"], identity)


def test_hydra_assembles_and_shows_the_metrics_table(app, setup):
    keep = torch.ones(2, 4, dtype=torch.bool)
    first, second = keep.clone(), keep.clone()
    first[0, 0], second[1, 2] = False, False
    members = [MemberMask("a", "test", first), MemberMask("b", "test", second)]
    app.session_state["results"] = {"_setup": setup.key, "jobs": {}, "members": members}
    open_page(app, "pages/6_hydra.py")
    app.number_input[0].set_value(3)  # timed calls per system: enough for a test
    mc = next(c for c in app.checkbox if c.label == "MC Dropout")
    assert not mc.value  # the checkpoint was trained without dropout: post hoc, opt-in
    mc.check()
    app.run()
    button(app, "Assemble and evaluate").click()
    app.run()
    finish_job(app, "hydra")
    assert not app.error, [e.value for e in app.error]
    summary = app.dataframe[0].value.set_index("system")
    hydra = ["single", "Hydra: a", "Hydra: b", "Hydra (unfused)", "Hydra (fused)"]
    # temperature scaling by default, MC Dropout ticked: the checkpoint has dropout modules at
    # p = 0, so MC Dropout is the post-hoc variant, named so
    systems = [*hydra, "Temperature Scaling", "MC Dropout (p=0.1, post hoc)"]
    assert list(summary.index) == systems
    assert list(summary["heads"]) == ["8", "7", "7", "7x2", "7x2", "8", "8"]
    assert list(summary["kind"])[-2:] == ["temperature", "mc-dropout"]
    assert any("trained without dropout" in c.value for c in app.caption)
    # every number with its interval: "value ± half-width", from the report's own summary
    report = app.session_state["results"]["hydra"][0]
    numbers = report.summary().set_index("system")
    row = numbers.loc["Hydra (fused)"]
    half = (row["all_auroc_hi"] - row["all_auroc_lo"]) / 2
    assert summary.loc["Hydra (fused)", "all_auroc"] == f"{row['all_auroc']:.4f} ± {half:.4f}"
    assert "all_auroc_lo" not in summary
    # zero-shot fusion: the fused model computes exactly what the members compute one by one
    fused, unfused = numbers.loc["Hydra (fused)"], numbers.loc["Hydra (unfused)"]
    for column in ("accuracy", "nll", "all_auroc", "id_mi", "all_auroc_lo", "id_mi_hi"):
        assert fused[column] == pytest.approx(unfused[column], abs=1e-5)
    # differences to the single model: paired intervals, "(n.s.)" where they contain 0
    differences = app.dataframe[1].value.set_index("system")
    assert list(differences.index) == systems[1:]
    for system in systems[1:]:
        found = report.difference(system, "single", "auroc", set="all")
        cell = differences.loc[system, "AUROC all (mean of sets)"]
        assert cell.startswith(f"{found.value:+.4f}")
        assert cell.endswith("(n.s.)") == (not found.significant)
    # the fused ensemble against each baseline and its best member, paired
    against = app.dataframe[2].value.set_index("against")
    assert list(against.columns[:3]) == ["role", "AUROC all (mean of sets)", "AUROC near"]
    best = report.best_member("Hydra")
    assert list(against.index) == ["single", "Temperature Scaling", "MC Dropout (p=0.1, post hoc)",
                                   "Hydra (unfused)", best]  # fmt: skip
    assert best in ("Hydra: a", "Hydra: b") and against.loc[best, "role"] == "best member"
    for other in against.index:
        found = report.difference("Hydra (fused)", other, "auroc", set="all")
        cell = against.loc[other, "AUROC all (mean of sets)"]
        assert cell.startswith(f"{found.value:+.4f}")
        assert cell.endswith("(n.s.)") == (not found.significant)
    verdict = next(m.value for m in app.markdown if "minus its best member" in m.value)
    assert f"**{best}**" in verdict
    for group, name in (("near", "near OOD"), ("far", "far OOD"), ("all", "all sets")):
        found = report.difference("Hydra (fused)", best, "auroc", group)
        assert f"{name} {found.value:+.4f}" in verdict  # near and far apart, never all alone
    gains = [
        report.difference("Hydra (fused)", best, "auroc", g).lo > 0 for g in ("near", "far", "all")
    ]
    assert ("pruning, not the ensembling" in verdict) == (not all(gains))
    per_set = app.dataframe[3].value
    assert {"mnist", "noise", "near-OOD average", "far-OOD average"} <= set(per_set["set"])
    cost = app.dataframe[4].value.set_index("system")
    assert (cost["latency_ms"] > 0).all() and cost.loc["single", "params_ratio"] == 1
    # the progress named every stage; the last was the intervals
    job = app.session_state["results"]["jobs"]["hydra"]
    assert job.progress == "**Intervals**: bootstrap of system 7 of 7"
    assert report.setup["latency_warmup"] == 1 and report.setup["latency_repeats"] == 3
    # the summary shows the AUROCs right after accuracy, the system column pinned
    shown = list(app.dataframe[0].value.columns)
    assert shown[:6] == ["system", "heads", "accuracy", "near_auroc", "far_auroc", "all_auroc"]
    drawn = figures(app)  # difference to single, reliability, ROC, cost vs AUROC
    assert len(drawn) == 4
    assert drawn[0].data[0].name == "no difference"
    assert drawn[-1].data[0].error_y.arrayminus is not None  # AUROC with its interval


def test_hydra_page_compares_baselines_on_the_default_model(make_app):
    """On the shipped default ViT (trained without dropout): Hydra beside temperature scaling and
    the post-hoc MC Dropout, each with its paired difference to the single model."""
    from hydra_core.zoo.default import DEFAULT_CHECKPOINT

    if not DEFAULT_CHECKPOINT.is_file():
        pytest.skip("needs the shipped checkpoint")
    setup = SetupConfig(model="default", ood=OOD, n_search=N_SEARCH, n_report=N_REPORT)
    app = make_app(setup.replace(device="cpu"))
    keep = torch.ones(6, 12, dtype=torch.bool)
    first, second = keep.clone(), keep.clone()
    first[0, :4], second[5, 4:8] = False, False
    members = [MemberMask("a", "test", first), MemberMask("b", "test", second)]
    app.session_state["results"] = {
        "_setup": app.session_state[CONFIG_KEY].key,
        "jobs": {},
        "members": members,
    }
    open_page(app, "pages/6_hydra.py")
    app.number_input[0].set_value(3)
    next(c for c in app.checkbox if c.label == "MC Dropout").check()
    app.run()
    button(app, "Assemble and evaluate").click()
    app.run()
    finish_job(app, "hydra")
    assert not app.error, [e.value for e in app.error]
    summary = app.dataframe[0].value.set_index("system")
    baselines = ["Temperature Scaling", "MC Dropout (p=0.1, post hoc)"]
    assert list(summary.index)[-2:] == baselines
    report = app.session_state["results"]["hydra"][0]
    assert report.info["Temperature Scaling"].models[0].temperature > 0
    differences = app.dataframe[1].value.set_index("system")
    assert set(baselines) <= set(differences.index)


def test_masks_circuits_strategy_is_one_circuit_per_criterion(app, reference):
    """The paper's Hydra (Circ): the saved searches' circuits; refused while one is missing."""
    from hydra_core.analysis.greedy import greedy_circuit
    from hydra_core.hydra.members import circuit_member

    open_page(app, "pages/5_masks.py")
    app.radio[0].set_value("circuits")
    app.number_input[0].set_value(6)  # B
    button(app, "Build").click()
    app.run()
    assert not app.exception
    assert any("missing: CircAcc (greedy acc)" in e.value for e in app.error)
    assert (
        "members" not in app.session_state["results"] or not app.session_state["results"]["members"]
    )

    loaded, inputs = reference
    found = {
        o: greedy_circuit(
            loaded.model,
            inputs.id_x,
            inputs.id_y,
            inputs.ood_x,
            objective=o,
            budget=6,
            cache=disk_cache(),
        )
        for o in ("acc", "ood", "avg")
    }
    button(app, "Build").click()
    app.run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    members = app.session_state["results"]["members"]
    assert [m.name for m in members] == ["CircAcc-6", "CircOOD-6", "CircAvg-6"]
    layout = HeadLayout((4, 4), 6, 24)
    for member, objective in zip(members, ("acc", "ood", "avg"), strict=True):
        expected = circuit_member(found[objective].ranking(), layout, budget=6, ranking_name="x")
        assert torch.equal(member.keep, expected.keep)


def test_hydra_page_numbers_equal_the_command_lines(app, setup, checkpoint, tmp_path, monkeypatch):
    """The Hydra page (temperature scaling, post-hoc MC Dropout ticked with its default 5 passes)
    and `hydra` with the same members, sizes and baselines, each from its own empty cache: every
    system, every metric and every interval bound the same number."""
    from hydra_core.cli import main
    from hydra_core.masks import save_masks

    keep = torch.ones(2, 4, dtype=torch.bool)
    first, second = keep.clone(), keep.clone()
    first[0, 0], second[1, 2] = False, False
    members = [MemberMask("a", "test", first), MemberMask("b", "test", second)]
    app.session_state["results"] = {"_setup": setup.key, "jobs": {}, "members": members}
    open_page(app, "pages/6_hydra.py")
    next(c for c in app.checkbox if c.label == "MC Dropout").check()
    app.run()
    button(app, "Assemble and evaluate").click()
    app.run()
    finish_job(app, "hydra")
    page = app.session_state["results"]["hydra"][0].summary().set_index("system")

    masks, out = tmp_path / "members.json", tmp_path / "cli"
    save_masks(masks, members, load_model(checkpoint).identity())
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cli-cache"))  # predicted again
    argv = ["hydra", "--model", checkpoint, "--masks", str(masks), "--label", "Hydra"]
    argv += ["--n-search", str(N_SEARCH), "--n-report", str(N_REPORT), "--ood", *OOD]
    argv += ["--device", "cpu", "--baselines", "temperature", "mc-dropout"]
    argv += ["--mc-passes", "5", "--mc-dropout-rate", "0.1", "--no-latency", "--out", str(out)]
    assert main(argv) == 0
    cli = json.loads((out / "systems.json").read_text())["summary"]
    assert [row["system"] for row in cli] == list(page.index)
    compared = 0
    for row in cli:
        for metric, value in row.items():
            if not isinstance(value, dict):  # the numbers with an interval: every metric
                continue
            ours = page.loc[row["system"]]
            for got, want in zip(
                (ours[metric], ours[f"{metric}_lo"], ours[f"{metric}_hi"]),
                (value["value"], *value["ci95"]),
                strict=True,
            ):
                assert (np.isnan(got) and want is None) or got == want, (row["system"], metric)
                compared += 1
    assert compared > 7 * 20
