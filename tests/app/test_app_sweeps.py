"""The committed sweeps on the Masks and Hydra pages (hydra_ui.sweeps), with Streamlit's AppTest:
the plot and the table of a sweep folder, a note when they were made on another model than the
loaded one, and how to make a sweep that is missing."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

import hydra_ui.sweeps
from hydra_core.cache import DiskCache
from hydra_core.report.sweeps import SweepConfig, run_sweep
from hydra_ui.context import SetupConfig
from tests.conftest import write_tiny_checkpoint


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory, checkpoint):
    """A sweeps folder holding a layers sweep of the tiny checkpoint (zero-shot, one point)."""
    root = tmp_path_factory.mktemp("sweeps")
    config = SweepConfig.quick(
        model=checkpoint, device="cpu", n_search=16, n_report=24, removed_per_layer=(1,),
        finetune=None,
    )  # fmt: skip
    run_sweep(
        "layers", config, root / "layers", cache=DiskCache(root / "cache"), log=lambda _: None
    )
    return root


def page(make_app, monkeypatch, model: str, sweeps_dir, name: str) -> AppTest:
    monkeypatch.setattr(hydra_ui.sweeps, "SWEEPS_DIR", sweeps_dir)
    setup = SetupConfig(model=model, ood=("noise",), n_search=16, n_report=24, device="cpu")
    return make_app(setup, page=name)


def texts(at: AppTest, kind: str) -> str:
    return "\n".join(str(e.value) for e in at.get(kind))


def test_masks_page_shows_the_committed_layers_sweep(make_app, monkeypatch, checkpoint, sweeps):
    at = page(make_app, monkeypatch, checkpoint, sweeps, "pages/5_masks.py")
    assert any("sweeps on the default image model" in e.proto.label for e in at.expander)
    assert len(at.get("image")) == 1
    shown = at.dataframe[0].value
    assert list(shown["removed_per_layer"]) == [0, 1, 1]
    assert "95% stratified-bootstrap intervals. Made with" in texts(at, "caption")
    assert "not on the loaded model" not in texts(at, "caption")


def test_another_model_is_told_the_sweeps_are_the_default_models(
    make_app, monkeypatch, sweeps, tmp_path
):
    other = write_tiny_checkpoint(tmp_path / "other.safetensors", seed=4)
    at = page(make_app, monkeypatch, other, sweeps, "pages/5_masks.py")
    assert "not on the loaded model (file:other.safetensors)" in texts(at, "caption")


def test_hydra_page_says_how_to_make_a_missing_sweep(make_app, monkeypatch, checkpoint, sweeps):
    at = page(make_app, monkeypatch, checkpoint, sweeps, "pages/6_hydra.py")
    info = texts(at, "info")
    for kind in ("members", "corruption"):
        assert f"sweep --kind {kind} --task image --out docs/report/sweeps/{kind}" in info
