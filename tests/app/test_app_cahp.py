"""The Masks page's CAHP tab, driven with Streamlit's AppTest: each variant, as a user runs it."""

from __future__ import annotations

import pytest
import torch
from streamlit.testing.v1 import AppTest

from hydra_core.analysis.cahp import cahp_select
from hydra_core.analysis.inputs import search_inputs
from hydra_core.data.benchmark import default_benchmark
from hydra_core.zoo.default import VitConfig
from hydra_core.zoo.registry import load_model
from hydra_ui.context import SetupConfig
from tests.app.conftest import N_REPORT, N_SEARCH, OOD, button, finish_job
from tests.conftest import write_tiny_checkpoint


@pytest.fixture(scope="module")
def checkpoint18(tmp_path_factory) -> str:
    """A tiny checkpoint with 3 x 6 = 18 heads: enough for t-SNE at perplexity 10."""
    config = VitConfig(embed_dim=24, depth=3, num_heads=6, mlp_ratio=2.0)
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "18heads.safetensors", config)


def masks_page(make_app, model: str) -> AppTest:
    setup = SetupConfig(model=model, ood=OOD, n_search=N_SEARCH, n_report=N_REPORT, device="cpu")
    return make_app(setup, page="pages/5_masks.py")


def reference_inputs(model: str):
    loaded = load_model(model)
    benchmark = default_benchmark(n_search=N_SEARCH, n_report=N_REPORT, ood=list(OOD))
    return loaded.model, search_inputs(loaded.preprocess, benchmark)


def test_official_cahp_is_the_default_and_names_its_variant(checkpoint18, make_app):
    app = masks_page(make_app, checkpoint18)
    assert app.radio(key="cahp-variant").value == "official"
    assert app.number_input(key="cahp-deg-official").value == 6
    app.number_input(key="cahp-members").set_value(2)
    app.run()
    button(app, "Run CAHP").click()
    app.run()
    finish_job(app, "cahp")
    app.run()
    assert not app.error, [e.value for e in app.error]
    members = app.session_state["results"]["members"]
    assert [m.name for m in members] == ["CAHP official seed 42", "CAHP official seed 43"]
    model, inputs = reference_inputs(checkpoint18)
    expected = cahp_select(model, inputs.id_x, inputs.id_y, seed=42)
    assert torch.equal(members[0].keep, expected.keep)
    assert members[0].source == expected.describe()
    shown = next(d.value for d in app.dataframe if "source" in d.value.columns)
    assert shown["source"].str.startswith("CAHP official").all()


def test_accuracy_knee_cahp_with_the_most_important_heads(checkpoint, make_app):
    app = masks_page(make_app, checkpoint)
    app.radio(key="cahp-variant").set_value("accuracy-knee")
    app.run()
    assert app.number_input(key="cahp-deg-accuracy-knee").value == 3
    app.number_input(key="cahp-members").set_value(1)
    next(r for r in app.radio if r.label == "Head kept per cluster").set_value("importance")
    app.run()
    button(app, "Run CAHP").click()
    app.run()
    finish_job(app, "cahp")
    app.run()
    (member,) = app.session_state["results"]["members"]
    assert member.name == "CAHP accuracy-knee seed 0"
    assert (
        member.source.startswith("CAHP accuracy-knee") and "importance per cluster" in member.source
    )


def test_official_cahp_on_a_model_too_small_says_why(checkpoint, make_app):
    app = masks_page(make_app, checkpoint)  # 8 heads
    button(app, "Run CAHP").click()
    app.run()
    finish_job(app, "cahp")
    assert any("perplexity 10" in e.value and "accuracy-knee" in e.value for e in app.error)
    assert not app.session_state["results"].get("members")
