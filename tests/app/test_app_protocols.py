"""Search protocols in the app: the Setup page's protocol reaches the Headmap search, and the
Headmap's OOD aggregate selector runs the search hydra_core runs, kept apart from the pooled one."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from hydra_core.analysis import greedy_circuit
from hydra_core.analysis.inputs import search_inputs
from hydra_core.data.benchmark import default_benchmark
from hydra_core.zoo.registry import load_model
from hydra_ui.context import SetupConfig
from tests.app.conftest import button, finish_job, open_page

OOD = ("mnist", "noise")
N_SEARCH, N_REPORT = 40, 60


def radio(at: AppTest, label: str):
    return next(r for r in at.radio if r.label == label)


def test_headmap_min_aggregate_is_the_hydra_core_search(checkpoint, make_app):
    config = SetupConfig(
        model=checkpoint, ood=OOD, n_search=N_SEARCH, n_report=N_REPORT, device="cpu"
    )
    app = make_app(config)
    open_page(app, "pages/2_headmap.py")
    radio(app, "OOD search sets combined as").set_value("min").run()
    radio(app, "Objective").set_value("ood").run()
    app.number_input[0].set_value(2)
    button(app, "Run").click()
    app.run()
    finish_job(app, "search")
    shown = app.session_state["results"]["jobs"]["search"].result
    loaded = load_model(checkpoint)
    benchmark = default_benchmark(n_search=N_SEARCH, n_report=N_REPORT, ood=list(OOD))
    inputs = search_inputs(loaded.preprocess, benchmark)
    expected = greedy_circuit(
        loaded.model,
        inputs.id_x,
        inputs.id_y,
        inputs.ood_x,
        objective="ood",
        budget=2,
        ood_sets=inputs.ood_sets,
        ood_aggregate="min",
    )
    assert shown.order == expected.order and shown.auroc == pytest.approx(expected.auroc)
    assert app.dataframe[0].value.loc[0, "heads removed"] == 2
    radio(app, "OOD search sets combined as").set_value("pooled").run()  # kept apart
    assert any("No search saved yet" in i.value for i in app.info)


@pytest.mark.parametrize(
    "protocol, searched", [("synthetic", "synthetic_pixel_permutation"), ("near-to-far", "mnist")]
)
def test_the_setup_protocol_reaches_the_headmap(checkpoint, make_app, protocol, searched):
    config = SetupConfig(
        model=checkpoint,
        n_search=N_SEARCH,
        n_report=N_REPORT,
        device="cpu",
        protocol=protocol,
    )
    app = make_app(config)
    open_page(app, "pages/2_headmap.py")
    assert not app.error, [e.value for e in app.error]
    caption = next(c.value for c in app.caption if c.value.startswith("Search data"))
    assert searched in caption and f"protocol {protocol}" in caption


def test_the_setup_page_offers_every_protocol(checkpoint, make_app):
    config = SetupConfig(model=checkpoint, n_search=N_SEARCH, n_report=N_REPORT, device="cpu")
    app = make_app(config)
    app.run()
    options = radio(app, "Protocol").options
    assert len(options) == 5 and any("synthetic" in o for o in options)
    assert all(o and o != "None" for o in options)
