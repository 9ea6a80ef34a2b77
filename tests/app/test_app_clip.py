"""Setup and every page on an OpenCLIP zero-shot classifier, driven the way a user drives them with
Streamlit's AppTest: a tiny random OpenCLIP model saved as an open_clip folder (local-dir, the
source that works offline), an ID image folder whose class folders are the zero-shot classes, and
OOD folders; heads pruned in both towers (the default) or the image tower alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

from hydra_ui.context import CONFIG_KEY, SetupConfig
from tests.app.conftest import CLIP_SIZES, array, button, figures, finish_job, open_page

N_SEARCH, N_REPORT = CLIP_SIZES


@pytest.fixture(scope="module")
def setup(clip_setup) -> SetupConfig:
    return clip_setup


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def test_setup_shows_the_zero_shot_model(app):
    app.run()
    assert not app.exception and not errors(app), errors(app)
    assert app.radio[0].value == "OpenCLIP (zero-shot)"
    assert app.text_input(key="setup_openclip_name").value.startswith("local-dir:")
    values = {m.label: m.value for m in app.metric}
    assert values["Layers"] == "4" and values["Heads / layer"] == "4"  # 3 image + 1 text layer
    assert app.radio(key="setup_towers").value.startswith("both")
    captions = " ".join(c.value for c in app.caption)
    assert "this needs the network" in captions and "Offline only a local folder works" in captions
    assert "Zero-shot classifier of 3 classes (cat, golden_retriever, sea-lion)" in captions
    assert "prompts paper: 'A photo of a {label}.'" in captions
    assert "Heads pruned in both: image 3 layers x 4 heads + text 1 layer x 2 heads" in captions
    assert any("random initialisation" in w.value for w in app.warning)  # never a real result
    assert not any("numbered" in w.value for w in app.warning)  # no class order to get wrong
    assert list(app.dataframe[0].value["OOD set"]) == ["toys", "noise"]


def test_prompts_are_chosen_and_applied(app):
    app.run()
    app.radio(key="setup_prompt_set").set_value(
        "openai: open_clip's 80 ImageNet templates (averaged)"
    )
    app.button[0].click()  # Apply
    app.run()
    assert not app.exception and not errors(app), errors(app)
    assert app.session_state[CONFIG_KEY].prompts == ("openai",)
    assert any("prompts openai: 80 templates" in c.value for c in app.caption)

    app.radio(key="setup_prompt_set").set_value("my own templates")
    app.text_area(key="setup_prompts").set_value("a blurry photo of a {label}.\na {label}")
    app.button[0].click()
    app.run()
    assert not app.exception and not errors(app), errors(app)
    assert app.session_state[CONFIG_KEY].prompts == ("a blurry photo of a {label}.", "a {label}")

    app.text_area(key="setup_prompts").set_value("a photo")
    app.button[0].click()
    app.run()
    assert len(errors(app)) == 1 and "has no {label}" in errors(app)[0]
    assert "\n" not in errors(app)[0] and not app.expander  # one line, no traceback
    assert app.session_state[CONFIG_KEY].prompts == ("a blurry photo of a {label}.", "a {label}")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("ViT-B-32/laion2b_s34b_b79k", "needs the network (Hugging Face hub); offline, use"),
        ("ViT-B-32", "names no pretrained weights"),
        ("local-dir:/nowhere", "/nowhere is not a folder"),
        ("", "Enter an open_clip model name and tag, or local-dir:PATH first."),
    ],
)
def test_bad_names_are_one_error_line_and_not_applied(app, setup, monkeypatch, name, message):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no downloads
    app.run()
    app.text_input(key="setup_openclip_name").set_value(name)
    app.button[0].click()
    app.run()
    assert not app.exception
    shown = errors(app)
    assert len(shown) == 1 and message in shown[0] and "\n" not in shown[0], shown
    assert app.session_state[CONFIG_KEY] == setup


def test_search_fills_the_heatmap_of_both_towers(app):
    open_page(app, "pages/2_headmap.py")
    app.number_input[0].set_value(2)  # budget
    button(app, "Run").click()
    app.run()
    finish_job(app, "search")
    heatmap = next(f for f in figures(app) if f.data[0].type == "heatmap")
    z = array(heatmap.data[0].z)
    assert z.shape == (4, 4) and sorted(z[np.isfinite(z)].tolist()) == [1.0, 2.0]
    assert torch.isfinite(torch.tensor(z[np.isfinite(z)])).all()
    assert list(heatmap.data[0].y) == ["image L0", "image L1", "image L2", "text L0"]
    assert [s.y0 for s in heatmap.layout.shapes] == [2.5]  # a line between the towers
    assert "3 layers x 4 heads + text 1 layer x 2 heads = 14 heads" in " ".join(
        c.value for c in app.caption
    )


def test_masks_page_names_the_layers_by_tower(app):
    open_page(app, "pages/5_masks.py")
    assert not errors(app), errors(app)
    labels = [p.label for p in app.get("button_group")]
    assert labels[:4] == ["image L0", "image L1", "image L2", "text L0"]


def test_the_image_tower_alone_is_chosen_on_setup(app):
    app.run()
    app.radio(key="setup_towers").set_value("image: the image tower's heads only")
    app.button[0].click()  # Apply
    app.run()
    assert not app.exception and not errors(app), errors(app)
    assert app.session_state[CONFIG_KEY].towers == "image"
    assert {m.label: m.value for m in app.metric}["Layers"] == "3"
    open_page(app, "pages/5_masks.py")
    assert not errors(app), errors(app)
    assert [p.label for p in app.get("button_group")][:3] == ["L0", "L1", "L2"]
