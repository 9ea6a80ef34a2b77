"""Every page on a text model, driven the way a user drives it, with Streamlit's AppTest: a tiny
random BERT saved as a Hugging Face folder, with ID and OOD texts in CSV and JSONL files."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from hydra_core.data.benchmark import default_text_benchmark, text_file_benchmark
from hydra_core.data.ood import REPORT_OOD, SEARCH_OOD
from hydra_core.data.text import TEXT_REPORT_OOD, TEXT_SEARCH_OOD
from hydra_core.errors import InputError
from hydra_core.masks import MemberMask
from hydra_core.metrics.diversity import mutual_information
from hydra_core.zoo.registry import load_model
from hydra_ui.context import CONFIG_KEY, SetupConfig
from hydra_ui.projections import hover_text
from hydra_ui.texts import markdown_literal, report_sample_texts
from tests.app.conftest import (
    TEXT_CLASSES,
    TEXT_SIZES,
    array,
    button,
    figures,
    finish_job,
    open_page,
)
from tests.conftest import missing_data

CLASSES = TEXT_CLASSES
N_SEARCH, N_REPORT = TEXT_SIZES


@pytest.fixture(scope="module")
def files(text_files) -> dict[str, str]:
    return text_files


@pytest.fixture(scope="module")
def setup(text_setup) -> SetupConfig:
    return text_setup


@pytest.fixture(scope="module")
def reference(setup):
    """The model and data the pages use, built directly with hydra_core."""
    loaded = load_model(setup.model)
    benchmark = text_file_benchmark(
        id_file=setup.id_source,
        ood_files=setup.ood_sources,
        search_ood=(),
        n_search=N_SEARCH,
        n_report=N_REPORT,
        classes=loaded.classes,
    )
    return loaded, benchmark


def test_setup_shows_the_text_model_and_its_files(app):
    app.run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    assert app.radio[0].value == "Hugging Face folder (text)"
    values = {m.label: m.value for m in app.metric}
    assert values["Layers"] == "2" and values["Heads / layer"] == "4"
    ood = app.dataframe[0].value
    assert list(ood["OOD set"]) == ["tweets", "recipes"] and list(ood["group"]) == ["near", "far"]
    data = app.dataframe[1].value.set_index("name")
    assert data.loc["headlines", "role"] == "search" and data.loc["headlines", "n_report"] == 0
    assert data.loc["id", "n_search"] == N_SEARCH and data.loc["id", "n_report"] == N_REPORT
    labels = [n.label for n in app.number_input]
    assert labels == [
        "Search sentences per set (head selection)",
        "Report sentences per set (0 = all)",
    ]
    assert any("classes: neg, pos, mixed" in c.value for c in app.caption)


def test_setup_applies_text_files_and_refuses_bad_ones(app, files):
    app.run()
    app.text_area[0].set_value(f"near: {files['near']}\nsearch: {files['search']}")
    app.button[0].click()  # Apply
    app.run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    assert app.session_state[CONFIG_KEY].ood_sources == (
        f"near: {files['near']}",
        f"search: {files['search']}",
    )
    assert list(app.dataframe[0].value["OOD set"]) == ["tweets"]

    app.text_input(key="setup_id_file").set_value("/nowhere/mine.csv")
    app.button[0].click()
    app.run()
    assert not app.exception
    errors = [e.value for e in app.error]
    assert len(errors) == 1 and "/nowhere/mine.csv does not exist" in errors[0]
    assert "\n" not in errors[0] and not app.expander  # one line, no traceback


def test_hub_name_offline_is_one_error_line(app, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # as offline, at once
    app.run()
    app.radio[0].set_value("Hugging Face name (text, online)")
    app.run()
    assert any("needs the network" in c.value for c in app.caption)
    app.text_input(key="setup_model_name").set_value("textattack/bert-base-uncased-SST-2")
    app.button[0].click()
    app.run()
    assert not app.exception
    errors = [e.value for e in app.error]
    assert len(errors) == 1 and "needs the network" in errors[0] and "\n" not in errors[0]
    assert app.session_state[CONFIG_KEY].model.endswith("model")  # the setup was not applied


def test_a_model_under_the_wrong_source_is_refused(app, files, checkpoint):
    app.run()
    app.text_input(key="setup_model_name").set_value(checkpoint)  # a ViT file, not a folder
    app.button[0].click()
    app.run()
    assert [e.value for e in app.error] == [
        f"Model folder {checkpoint} not found: give the folder save_pretrained wrote (config.json, "
        "weights, tokenizer files)."
    ]
    app.radio[0].set_value("Checkpoint file")
    app.run()
    app.text_input(key="setup_model_name").set_value(files["model"])  # a text model
    app.button[0].click()
    app.run()
    assert not app.exception
    errors = [e.value for e in app.error]
    assert len(errors) == 1 and "is a model of sentences, not of images" in errors[0]
    assert app.session_state[CONFIG_KEY].id_source == files["id"]  # the setup was not applied


def test_each_modality_keeps_its_own_data_choices(app, setup, files):
    """One set of data fields serves both modalities: an image source starts from the image
    defaults, and the text files come back with a text source."""
    app.run()
    app.radio[0].set_value("Embedded default")
    app.run()
    assert (app.multiselect[0].value, app.multiselect[1].value) == (
        list(REPORT_OOD),
        list(SEARCH_OOD),
    )
    assert app.text_input(key="setup_id_folder").value == "" and app.text_area[0].value == ""
    app.multiselect[1].set_value(["photos"])
    app.button[0].click()  # Apply
    app.run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    image_setup = app.session_state[CONFIG_KEY]
    assert image_setup.model == "default" and image_setup.ood is None  # the image defaults
    assert (image_setup.search_ood, image_setup.id_source, image_setup.ood_sources) == (
        ("photos",),
        None,
        (),
    )

    app.radio[0].set_value("Hugging Face folder (text)")
    app.run()
    app.text_input(key="setup_model_name").set_value(files["model"])
    assert app.text_input(key="setup_id_file").value == files["id"]
    assert app.text_area[0].value == "\n".join(setup.ood_sources)
    assert (app.multiselect[0].value, app.multiselect[1].value) == ([], [])
    app.button[0].click()
    app.run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    assert app.session_state[CONFIG_KEY] == setup.replace(model=files["model"])


def test_search_fills_the_heatmap(app):
    open_page(app, "pages/2_headmap.py")
    app.number_input[0].set_value(2)  # budget
    button(app, "Run").click()
    app.run()
    finish_job(app, "search")
    heatmap = next(f for f in figures(app) if f.data[0].type == "heatmap")
    z = array(heatmap.data[0].z)
    assert z.shape == (2, 4) and sorted(z[np.isfinite(z)].tolist()) == [1.0, 2.0]
    assert app.dataframe[0].value.loc[0, "heads removed"] == 2
    caption = next(c.value for c in app.caption if c.value.startswith("Search data"))
    assert f"{N_SEARCH} ID + " in caption and "OOD search sentences (headlines)" in caption


def test_representations_show_each_sentence_on_hover(app, reference):
    open_page(app, "pages/4_representations.py")
    assert not app.error, [e.value for e in app.error]
    _, benchmark = reference
    texts = report_sample_texts(benchmark)
    scatter = next(f for f in figures(app) if f.data[0].type == "scatter")
    assert [t.name for t in scatter.data] == ["ID", "tweets", "recipes"]
    for trace in scatter.data:
        assert "%{customdata}" in trace.hovertemplate
        expected = [hover_text(t) for t in texts[trace.name]]
        assert list(trace.customdata) == expected and len(expected) == N_REPORT


def test_masks_are_built_from_taylor(app):
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
    assert [m.kept for m in members] == [6, 6, 6]


def test_hydra_shows_the_most_uncertain_sentences(app, setup, reference):
    keep = torch.ones(2, 4, dtype=torch.bool)
    first, second, third = keep.clone(), keep.clone(), keep.clone()
    first[0, 0], second[1, 2], third[0, 3] = False, False, False
    members = [MemberMask(n, "test", k) for n, k in zip("abc", (first, second, third), strict=True)]
    app.session_state["results"] = {"_setup": setup.key, "jobs": {}, "members": members}
    open_page(app, "pages/6_hydra.py")
    app.number_input[0].set_value(3)  # timed calls per system
    button(app, "Assemble and evaluate").click()
    app.run()
    finish_job(app, "hydra")
    assert not app.error, [e.value for e in app.error]
    summary = app.dataframe[0].value.set_index("system")
    assert list(summary.loc[["Hydra (unfused)", "Hydra (fused)"], "heads"]) == ["7x3", "7x3"]

    table = app.table[0].value
    assert len(table) == 20
    assert list(table.columns) == [
        "sentence",
        "set",
        "group",
        "MI (nats)",
        "prediction",
        "probability",
        "true class",
        "a",
        "b",
        "c",
    ]
    report = app.session_state["results"]["hydra"][0]
    fused = report.evaluations["Hydra (fused)"]
    logits = torch.cat([fused.id.logits, *(p.logits for p in fused.ood)])  # (N, M, C)
    mi = mutual_information(logits.double().softmax(-1), reduction="none")
    shown = table["MI (nats)"].astype(float)
    np.testing.assert_allclose(shown, np.sort(mi)[::-1][:20], atol=5e-4)
    _, benchmark = reference
    report_texts = {s.name: s.texts for s in [benchmark.id_report, *benchmark.ood_report]}
    for sentence, name in zip(table["sentence"], table["set"], strict=True):
        assert markdown_plain(sentence) in report_texts[name]
    assert set(table["set"]) <= {"id", "tweets", "recipes"}
    assert set(table[["prediction", "a", "b", "c"]].to_numpy().ravel()) <= set(CLASSES)
    assert (table.loc[table["set"] == "id", "true class"].isin(CLASSES)).all()

    where = next(s for s in app.selectbox if s.label == "Sentences from")
    where.set_value("tweets")
    app.run()
    only = app.table[0].value
    assert set(only["set"]) == {"tweets"} and (only["true class"] == "").all()


def markdown_plain(cell: str) -> str:
    """A table cell's Markdown with its backslash escapes undone: the text as shown."""
    return re.sub(r"\\(.)", r"\1", cell)


def test_markdown_literal_and_hover_text_show_texts_as_they_are():
    text = "a *b* _c_ $5 :red[x] [l](u) 1. # <b> \\ ok"
    assert markdown_plain(markdown_literal(text)) == text
    assert "*" not in markdown_literal(text).replace("\\*", "")
    assert hover_text("word " * 100).endswith("…") and len(hover_text("word " * 100)) < 200
    assert hover_text("a <b> & c") == "a &lt;b&gt; &amp; c"


def test_minilm_with_the_default_text_sets(make_app):
    """The offline text default, chosen on Setup the way a user chooses it (real wheel files)."""
    try:
        load_model("minilm-sentiment")
        report_sets = default_text_benchmark(n_search=1, n_report=1)
    except InputError as exc:
        missing_data(str(exc))
    assert [s.name for s in report_sets.ood_report] == list(TEXT_REPORT_OOD)
    app = make_app(SetupConfig(n_search=32, n_report=48, device="cpu"), timeout=300)
    app.run()
    app.radio[0].set_value("MiniLM sentiment (text)")
    app.run()
    assert [m.label for m in app.multiselect][:2] == [
        "Report OOD sets (every table and metric, never used to select heads)",
        "Search OOD sets (head selection only, never reported)",
    ]
    assert app.multiselect[0].value == list(TEXT_REPORT_OOD)
    assert app.multiselect[1].value == list(TEXT_SEARCH_OOD)
    app.button[0].click()  # Apply
    app.run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    assert app.session_state[CONFIG_KEY].model == "minilm-sentiment"
    values = {m.label: m.value for m in app.metric}
    assert values["Layers"] == "6" and values["Heads / layer"] == "12"
    assert list(app.dataframe[0].value["OOD set"]) == list(TEXT_REPORT_OOD)
    data = app.dataframe[1].value.set_index("name")
    assert data.loc["guardian", "role"] == "search" and data.loc["guardian", "n_report"] == 0
    assert data.loc["rotten_tomatoes", "n_report"] == 48


def test_hydra_page_shows_the_text_sweeps_or_how_to_make_them(app, tmp_path, monkeypatch):
    import hydra_ui.sweeps

    monkeypatch.setattr(hydra_ui.sweeps, "SWEEPS_DIR", tmp_path / "sweeps")  # none committed
    app.run()
    app.switch_page("pages/6_hydra.py")
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    assert any("sweeps on the default text model" in e.proto.label for e in app.expander)
    info = "\n".join(str(e.value) for e in app.info)
    make = "sweep --kind corruption --task text --out docs/report/sweeps/text/corruption"
    assert make in info
