"""The Headmap page's Evidence section, driven with AppTest on a tiny checkpoint and a tiny BERT:
its table equals :func:`~hydra_core.analysis.evidence.head_evidence` on the same data, a stability
file joins its frequencies (another model's is refused in one line), and a picked head links to
the Representations page."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from hydra_core.analysis.evidence import head_evidence
from hydra_core.analysis.inputs import search_inputs
from hydra_core.data.benchmark import default_benchmark, text_file_benchmark
from hydra_core.data.images import take
from hydra_core.zoo.registry import load_model
from hydra_ui.context import SetupConfig
from hydra_ui.widgets import PICKED_HEAD

OOD = ("mnist", "noise")
N_SEARCH, N_REPORT = 40, 30
PAGE = "pages/2_headmap.py"


@pytest.fixture
def app(checkpoint, make_app) -> AppTest:
    setup = SetupConfig(
        model=checkpoint, ood=OOD, n_search=N_SEARCH, n_report=N_REPORT, device="cpu"
    )
    return make_app(setup, page=PAGE)


def _compute(at: AppTest, n_boot: int = 50) -> None:
    next(n for n in at.number_input if n.label == "Resamples").set_value(n_boot)
    next(b for b in at.button if b.label == "Compute evidence").click()
    at.run()
    job = at.session_state["results"]["jobs"]["evidence"]
    assert job.wait(180), "the evidence job is still running"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def _expected(checkpoint, n_boot: int, frequency=None):
    loaded = load_model(checkpoint)
    benchmark = default_benchmark(n_search=N_SEARCH, n_report=N_REPORT, ood=list(OOD))
    fit = search_inputs(loaded.preprocess, benchmark)
    p = loaded.preprocess
    report = take(benchmark.id_report, 512, purpose="describe")
    ood = {s.name: p(take(s, 512, purpose="describe").inputs) for s in benchmark.ood_report}
    return head_evidence(
        loaded.model,
        fit.id_x,
        fit.id_y,
        p(report.inputs),
        report.labels,
        ood,
        n_boot=n_boot,
        frequency=frequency,
    )


def _table(at: AppTest):
    return next(d.value for d in at.dataframe if "disagreement" in d.value.columns)


def test_evidence_table_and_map_match_hydra_core(app, checkpoint):
    assert any(s.value.startswith("Evidence") for s in app.subheader)
    _compute(app)
    shown = _table(app)
    expected = _expected(checkpoint, 50).table.sort_values("agreed_rank")
    assert shown["head"].tolist() == expected["label"].tolist()
    np.testing.assert_allclose(shown["ΔAUROC"], expected["delta_auroc"], rtol=1e-12)
    np.testing.assert_allclose(shown["detector AUROC"], expected["detector_auroc"], rtol=1e-12)
    first = expected.iloc[0]
    text = f"{first.delta_auroc:+.4f} [{first.delta_auroc_lo:+.4f}, {first.delta_auroc_hi:+.4f}]"
    assert shown["ΔAUROC 95% CI"].iloc[0] == text
    assert shown["ΔAUROC ✱"].iloc[0] == ("✱" if first.delta_auroc_significant else "")
    assert "keep frequency" not in shown.columns  # no stability result given
    titles = [json.loads(c.proto.spec)["layout"].get("title", {}) for c in app.get("plotly_chart")]
    assert {"text": "agreed rank per head (yellow = most important)"} in titles
    # a head picked (a row of the table, a cell of the map) opens on the Representations page
    app.session_state[PICKED_HEAD] = "L1H2"
    app.run()
    links = app.get("page_link")
    assert any("L1H2" in link.proto.label for link in links)
    assert any("representations" in link.proto.page.lower() for link in links), [
        link.proto.page for link in links
    ]


def test_a_stability_file_joins_the_evidence(app, checkpoint, monkeypatch):
    """The uploader's bytes go through the library's reader (AppTest cannot upload a file, so
    the uploaded value is given as Streamlit would give it)."""
    from streamlit.delta_generator import DeltaGenerator

    frequency = [[0.1, 0.9, 0.0, 0.5], [1.0, 0.2, 0.3, None]]
    good = json.dumps({"format": "hydra-stability", "frequency": frequency}).encode()
    other = json.dumps({"format": "hydra-stability", "frequency": [[0.5] * 3]}).encode()

    class Upload:
        def __init__(self, data: bytes) -> None:
            self.name, self._data = "stability.json", data

        def getvalue(self) -> bytes:
            return self._data

    upload = {"file": Upload(other)}
    monkeypatch.setattr(DeltaGenerator, "file_uploader", lambda *a, **k: upload["file"])
    app.run()
    assert any("another model" in e.value for e in app.error)
    upload["file"] = Upload(good)
    app.run()
    _compute(app)
    shown = _table(app)
    as_array = np.array([[np.nan if v is None else v for v in r] for r in frequency])
    expected = _expected(checkpoint, 50, as_array).table.sort_values("agreed_rank")
    np.testing.assert_allclose(shown["keep frequency"], expected["keep_frequency"])
    kept = dict(zip(shown["head"], shown["keep frequency"], strict=True))
    assert kept["L1H0"] == 0.0 and kept["L0H2"] == 1.0  # removed by every resample / by none
    np.testing.assert_allclose(shown["mean rank"], expected["mean_rank"])


def test_evidence_on_a_text_model(text_files, make_app):
    """The same section on a tiny BERT with files of one's own: the table equals the library's
    on the same sentences."""
    setup = SetupConfig(
        model=text_files["model"],
        id_source=text_files["id"],
        ood_sources=(
            f"near: {text_files['near']}",
            f"far: {text_files['far']}",
            f"search: {text_files['search']}",
        ),
        ood=(),
        search_ood=(),
        n_search=20,
        n_report=30,
        device="cpu",
    )
    at = make_app(setup, page=PAGE)
    _compute(at)
    shown = _table(at)
    loaded = load_model(setup.model)
    benchmark = text_file_benchmark(
        id_file=setup.id_source,
        ood_files=setup.ood_sources,
        search_ood=(),
        n_search=20,
        n_report=30,
        classes=loaded.classes,
    )
    fit = search_inputs(loaded.preprocess, benchmark)
    p = loaded.preprocess
    report = take(benchmark.id_report, 512, purpose="describe")
    ood = {s.name: p(take(s, 512, purpose="describe").inputs) for s in benchmark.ood_report}
    found = head_evidence(
        loaded.model, fit.id_x, fit.id_y, p(report.inputs), report.labels, ood, n_boot=50
    )
    expected = found.table.sort_values("agreed_rank")
    assert shown["head"].tolist() == expected["label"].tolist()
    np.testing.assert_allclose(shown["ΔAUROC"], expected["delta_auroc"], rtol=1e-12)
    np.testing.assert_allclose(shown["detector AUROC"], expected["detector_auroc"], rtol=1e-12)


def test_a_stopped_evidence_job_ends_as_stopped(app, monkeypatch):
    """Stop ends the work at its next progress report (here a stand-in that reports until then,
    so the job cannot finish first)."""
    import time

    import hydra_ui.evidence

    def endless(*args, progress, **kwargs):
        for _ in range(3000):
            progress("ablations", 0, 1)
            time.sleep(0.05)
        raise AssertionError("never stopped")

    monkeypatch.setattr(hydra_ui.evidence, "head_evidence", endless)
    next(n for n in app.number_input if n.label == "Resamples").set_value(50)
    next(b for b in app.button if b.label == "Compute evidence").click()
    app.run()
    job = app.session_state["results"]["jobs"]["evidence"]
    job.stop()
    assert job.wait(180)
    app.run()
    assert job.status == "stopped" and job.result is None
    assert any("stopped" in w.value for w in app.warning)
    assert not app.error


def test_the_table_shows_every_value_before_the_intervals():
    """The values of all columns come right after rank and head, so that the ones that reorder
    the ranking are in view in a wide table; intervals, marks and per-column ranks follow."""
    from hydra_core.analysis.evidence import COLUMNS
    from hydra_ui.evidence import shown_table

    class Found:
        table = pd.DataFrame(
            {"label": ["L0H0", "L0H1"], "agreed_rank": [2, 1], "mean_rank": [1.5, 1.0],
             "disagreement": [0.0, 0.0], "disagrees": ["", ""]}
        )  # fmt: skip
        for c in COLUMNS:
            table[c.key] = [0.1, 0.2]
            table[f"rank_{c.key}"] = [2.0, 1.0]
            table[f"{c.key}_lo"], table[f"{c.key}_hi"] = [0.0, 0.1], [0.2, 0.3]
            table[f"{c.key}_significant"] = [False, True]

        def columns(self):
            return COLUMNS

    shown = shown_table(Found())
    names = [c.name for c in COLUMNS]
    assert list(shown.columns[: 2 + len(names)]) == ["rank", "head", *names]
    assert list(shown["head"]) == ["L0H1", "L0H0"]  # by agreed rank
