"""The app under Streamlit's AppTest: one factory for every test that drives the pages.

``make_app(setup, page=...)`` (a fixture) gives the app with a disk cache of its own, empty, under
the test's tmp_path; ``new_app(setup)`` a further visit of the same app (same disk cache, new
session). ``app`` is ``make_app(setup)`` on the ``setup`` fixture: the tiny checkpoint here, a
test file's own where it defines ``setup``. Tests outside tests/app/ import what they use from
here (``from tests.app.conftest import ...``)."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import plotly.io as pio
import pytest
from streamlit.testing.v1 import AppTest

from hydra_ui.context import CONFIG_KEY, SetupConfig, disk_cache

APP = Path(__file__).resolve().parents[2] / "app.py"
#: the tiny checkpoint's setup (``setup``): its OOD sets and sizes
OOD = ("mnist", "noise")
N_SEARCH, N_REPORT = 40, 60


def new_app(setup: SetupConfig | None = None, *, timeout: float = 180) -> AppTest:
    """A new visit of the app (``app.py`` under AppTest, not run yet), ``setup`` applied as the
    Setup page's Apply does (when given). The disk cache is the one HYDRA_LAB_CACHE names."""
    at = AppTest.from_file(str(APP), default_timeout=timeout)
    if setup is not None:
        at.session_state[CONFIG_KEY] = setup
    return at


@pytest.fixture
def app_cache(tmp_path, monkeypatch) -> Path:
    """An empty disk cache of the test's own (HYDRA_LAB_CACHE), every test starting empty."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(cache))
    disk_cache.clear()  # the next DiskCache() reads the variable
    return cache


@pytest.fixture
def make_app(app_cache):
    """The app factory: ``make_app(setup=None, *, page=None, timeout=180)`` gives :func:`new_app`
    on the test's own empty cache; with ``page``, opened there (run, switch, run, no
    exception)."""

    def make(
        setup: SetupConfig | None = None, *, page: str | None = None, timeout: float = 180
    ) -> AppTest:
        at = new_app(setup, timeout=timeout)
        return open_page(at, page) if page else at

    return make


@pytest.fixture
def setup(checkpoint) -> SetupConfig:
    """The tiny checkpoint with two small OOD sets, on the CPU."""
    return SetupConfig(
        model=checkpoint, ood=OOD, n_search=N_SEARCH, n_report=N_REPORT, device="cpu"
    )


@pytest.fixture
def app(make_app, setup) -> AppTest:
    return make_app(setup)


@pytest.fixture(scope="module")
def reference(checkpoint):
    """The model and search tensors the pages use on ``setup``, built directly with hydra_core."""
    from hydra_core.analysis.inputs import search_inputs
    from hydra_core.data.benchmark import default_benchmark
    from hydra_core.zoo.registry import load_model

    loaded = load_model(checkpoint)
    benchmark = default_benchmark(n_search=N_SEARCH, n_report=N_REPORT, ood=list(OOD))
    return loaded, search_inputs(loaded.preprocess, benchmark)


# --- reading and driving the pages ------------------------------------------------------------


def open_page(at: AppTest, page: str) -> AppTest:
    at.run()
    at.switch_page(page)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def button(at: AppTest, label: str):
    return next(b for b in at.button if b.label == label)


def figures(at: AppTest) -> list:
    return [pio.from_json(chart.proto.spec) for chart in at.get("plotly_chart")]


def array(value) -> np.ndarray:
    """A Plotly JSON array: a list, or the typed-array dict Plotly 6 writes (dtype, bdata)."""
    if isinstance(value, dict):
        data = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        return data.reshape([int(n) for n in str(value.get("shape", len(data))).split(",")])
    return np.asarray(value, dtype=float)


def finish_job(at: AppTest, name: str, timeout: float = 180) -> None:
    """Wait for a page's background job to end, then rerun the page as its timer would."""
    job = at.session_state["results"]["jobs"][name]
    assert job.wait(timeout), f"{name} still running after {timeout} s"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
