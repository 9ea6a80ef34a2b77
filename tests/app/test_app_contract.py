"""The pages' contract, for every kind of model the app loads (``modality``: the tiny image
checkpoint, a tiny BERT with text files of one's own, a tiny OpenCLIP zero-shot classifier with
image folders): every page renders without an error, and the Head importance page shows the
library's own maps.

What only one kind of model shows stays in its file: test_app_pages.py (images),
test_app_text.py, test_app_clip.py."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from hydra_core.analysis.greedy import single_head_importance
from hydra_core.analysis.inputs import search_inputs
from hydra_core.data.benchmark import default_benchmark, folder_benchmark, text_file_benchmark
from hydra_core.models.zero_shot import folder_classes
from hydra_core.zoo.registry import load_model
from hydra_ui.context import SetupConfig
from hydra_ui.figures import rank_percentile
from tests.app.conftest import PAGES, array, button, figures

#: the setup fixture (tests/app/conftest.py) of each kind of model
SETUPS = {"image": "setup", "text": "text_setup", "openclip": "clip_setup"}


@dataclass(frozen=True)
class Case:
    name: str
    setup: SetupConfig


@pytest.fixture(params=sorted(SETUPS))
def case(request) -> Case:
    return Case(request.param, request.getfixturevalue(SETUPS[request.param]))


def search_reference(case: Case):
    """The model and the search tensors the pages use, built directly with hydra_core."""
    setup = case.setup
    if case.name == "image":
        loaded = load_model(setup.model)
        benchmark = default_benchmark(
            n_search=setup.n_search, n_report=setup.n_report, ood=list(setup.ood)
        )
    elif case.name == "text":
        loaded = load_model(setup.model)
        benchmark = text_file_benchmark(
            id_file=setup.id_source,
            ood_files=setup.ood_sources,
            search_ood=(),
            n_search=setup.n_search,
            n_report=setup.n_report,
            classes=loaded.classes,
        )
    else:
        loaded = load_model(setup.model, classes=folder_classes(setup.id_source))
        benchmark = folder_benchmark(
            id_folder=setup.id_source,
            ood_folders=setup.ood_sources,
            search_ood=(),
            size=32,
            channels=3,
            n_search=setup.n_search,
            n_report=setup.n_report,
        )
    return loaded, search_inputs(loaded.preprocess, benchmark)


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_without_errors(make_app, case, page):
    app = make_app(case.setup, page=page)
    assert not app.error, [e.value for e in app.error]
    assert app.title[0].value
    if case.name == "text":
        shown = " ".join(c.value for c in app.caption) + " ".join(n.label for n in app.number_input)
        assert " images" not in shown  # a text model's pages speak of sentences


def test_importance_maps_match_hydra_core(make_app, case):
    app = make_app(case.setup, page="pages/3_importance.py")
    button(app, "Compute importance maps").click()
    app.run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    panels = figures(app)[0]
    assert [a.text for a in panels.layout.annotations] == ["Δaccuracy", "ΔAUROC", "Taylor"]
    loaded, inputs = search_reference(case)
    single = single_head_importance(loaded.model, inputs.id_x, inputs.id_y, inputs.ood_x)
    np.testing.assert_allclose(
        array(panels.data[0].z), rank_percentile(-single["delta_accuracy"].numpy())
    )
    np.testing.assert_allclose(
        array(panels.data[1].z), rank_percentile(-single["delta_auroc"].numpy())
    )
    if case.name == "image":
        assert np.asarray(panels.data[0].customdata)[1, 3, 0] == "L1H3"
