"""The guided search (Headmap page, Candidates per step) and the attribution map (Head importance
page) driven with Streamlit's AppTest on the tiny checkpoint, checked against hydra_core."""

from __future__ import annotations

import pandas as pd
import pytest

from hydra_core.analysis.attribution import attribution_importance
from hydra_core.analysis.greedy import greedy_circuit, single_head_importance
from hydra_core.analysis.importance import importance_maps
from hydra_core.analysis.taylor import taylor_scores
from tests.app.conftest import (
    button,
    figures,
    finish_job,
    open_page,
)


def test_guided_search_runs_from_the_headmap_page(app, reference):
    open_page(app, "pages/2_headmap.py")
    app.number_input[0].set_value(2)  # budget
    app.number_input[1].set_value(2)  # candidates per step
    button(app, "Run").click()
    app.run()
    finish_job(app, "search")
    result = app.session_state["results"]["jobs"]["search"].result
    assert result.candidates == 2 and result.evaluated == [2, 2]
    loaded, inputs = reference
    expected = greedy_circuit(
        loaded.model, inputs.id_x, inputs.id_y, inputs.ood_x, budget=2, candidates=2
    )
    assert result.order == expected.order and result.scores == expected.scores
    message = next(s.value for s in app.success if s.value.startswith("Guided search"))
    assert "K = 2" in message and "4 candidates evaluated exactly" in message
    assert "the exact search evaluates 15" in message  # 8 + 7 heads
    steps = app.dataframe[0].value
    assert list(steps["evaluated"]) == [2, 2]
    # the exact search's table is untouched: no saved exact search yet
    assert any("No search saved yet" in i.value for i in app.info)


def test_importance_page_shows_the_attribution_map_and_its_agreement(app, reference):
    open_page(app, "pages/3_importance.py")
    next(c for c in app.checkbox if c.label.startswith("Attribution estimate")).check()
    button(app, "Compute importance maps").click()
    app.run()
    assert not app.exception and not app.error
    panels = figures(app)[0]
    names = [a.text for a in panels.layout.annotations]
    assert names == ["Δaccuracy", "ΔAUROC", "Taylor", "AtP Δaccuracy", "AtP ΔAUROC"]
    loaded, inputs = reference
    data = (loaded.model, inputs.id_x, inputs.id_y, inputs.ood_x)
    expected = importance_maps(
        single_head_importance(*data),
        taylor_scores(loaded.model, inputs.id_x, inputs.id_y),
        None,
        attribution_importance(*data),
    ).attribution_agreement()
    shown = next(
        d.value for d in app.dataframe if "top-10 overlap" in list(d.value.columns)
    ).reset_index(drop=True)
    pd.testing.assert_frame_equal(shown, expected, check_dtype=False)
    assert shown["spearman"].between(-1, 1).all()
    assert pytest.approx(shown["heads"].tolist()) == [8, 8]
