"""The Headmap page's Stability view, driven as a user drives it (AppTest), against the library."""

from __future__ import annotations

import numpy as np
import pytest

from hydra_core.analysis.greedy import greedy_circuit
from hydra_core.analysis.holdout import held_out_curve, holdout_split
from hydra_core.analysis.stability import greedy_stability
from hydra_ui.stability import frequency_heatmap, held_out_figure, jaccard_figure, stable_table
from tests.app.conftest import (
    array,
    button,
    figures,
    finish_job,
    open_page,
)


def test_stability_view_runs_and_equals_the_library(app, reference):
    open_page(app, "pages/2_headmap.py")
    app.number_input[0].set_value(3)  # the search's budget, which the view uses
    app.run()
    resamples = next(n for n in app.number_input if n.label == "Resamples (B)")
    resamples.set_value(3)
    app.run()
    assert any("fewer than 300" in w.value for w in app.warning)  # 40 search images per side
    assert sum("fewer than 300" in w.value for w in app.warning) == 1  # said once
    # before any search, the view says how to get its time; after one, the time itself
    assert any("run the search above first" in c.value for c in app.caption)
    button(app, "Run").click()
    app.run()
    finish_job(app, "search")
    assert any("At B = 3 and budget 3: up to about" in c.value for c in app.caption)
    app.number_input[0].set_value(5)  # past the saved search: its 2 more steps' time is said
    app.run()
    assert any("At budget 5: about" in c.value and "(2 steps;" in c.value for c in app.caption)
    app.number_input[0].set_value(3)
    app.run()
    button(app, "Run stability").click()
    app.run()
    finish_job(app, "stability")
    assert not app.error, [e.value for e in app.error]
    job = app.session_state["results"]["jobs"]["stability"]
    run = job.result
    # one estimate for the whole run: its steps are those of all three stages, all done
    assert job.info["stage"] == "stage 3 of 3, 3 resamples"
    total = 8  # heads
    search_units = sum(total - t for t in range(3))
    assert job._total == pytest.approx(search_units * 4 + 4 * 0.25 / 0.75)
    assert job.fraction() == 1.0 and job.eta_seconds() == 0.0

    loaded, inputs = reference
    strata = inputs.ood_strata()
    split = holdout_split(inputs.id_y, strata, 0.25, seed=0)
    data = (
        inputs.id_x[split.id_search],
        inputs.id_y[split.id_search],
        inputs.ood_x[split.ood_search],
    )
    search = greedy_circuit(loaded.model, *data, budget=3)
    assert run.search.order == search.order
    found = greedy_stability(
        loaded.model,
        *data,
        budget=3,
        resamples=3,
        ood_strata=[strata[i] for i in split.ood_search.tolist()],
    )
    assert run.stability.orders == found.orders
    held = (
        inputs.id_x[split.id_held_out],
        inputs.id_y[split.id_held_out],
        inputs.ood_x[split.ood_held_out],
    )
    curve = held_out_curve(
        loaded.model, search, *held, ood_strata=[strata[i] for i in split.ood_held_out.tolist()]
    )
    assert run.curve.held_out == pytest.approx(curve.held_out)

    shown = figures(app)
    freq = next(f for f in shown if f.layout.title.text.startswith("Kept through 3 steps"))
    np.testing.assert_allclose(array(freq.data[0].z), 1 - found.frequency().numpy())
    assert any(f.layout.title.text.endswith("search part vs held out") for f in shown)
    messages = (*app.warning, *app.success, *app.info)
    peak_message = [m.value for m in messages if "held-out part" in m.value]
    suggested = run.curve.suggested_budget(run.search.steps)
    assert any(f"Suggested budget: **{suggested}**" in m for m in peak_message) == (
        suggested is not None
    )
    assert any("for two random sets of 3 of" in m.value for m in app.markdown)
    assert peak_message and f"after **{curve.peak}**" in peak_message[0]


def test_figures_from_results():
    from hydra_core.analysis.stability import StabilityResult

    orders = [[(0, 0), (1, 1)], [(0, 0), (1, 2)], [(0, 0), (1, 1)]]
    zeros = [[0.0, 0.0]] * 3
    found = StabilityResult("avg", 2, 0, "fast", (3, 3), 4, 4, orders, zeros, zeros, zeros)

    class Search:
        order = [(0, 0), (1, 1)]

    fig = frequency_heatmap(found, Search())
    z = array(fig.data[0].z)
    assert z[0, 0] == 0.0 and z[1, 1] == pytest.approx(1 / 3) and z[0, 1] == 1.0
    agreement = jaccard_figure(found)
    assert list(agreement.data[1].y) == pytest.approx([1.0, 2 / 3])
    rows = stable_table(found, Search())
    assert {"head": "L0H0", "this search": "removed at step 1", "kept by resamples": 0.0} in rows
    assert all(r["this search"] == "kept" for r in rows if r["head"] != "L0H0")

    class Curve:
        objective = "avg"
        held_out = [0.5, 0.7, 0.6]
        held_out_lo = [0.4, 0.6, 0.5]
        held_out_hi = [0.6, 0.8, 0.7]
        search = [0.5, 0.8, 0.9]
        peak = 1

    fig = held_out_figure(Curve())
    assert [t.name for t in fig.data] == ["held out, 95% interval", "search part", "held out"]


def _run_stability(at, budget: int, resamples: int) -> None:
    open_page(at, "pages/2_headmap.py")
    at.number_input[0].set_value(budget)
    at.run()
    next(n for n in at.number_input if n.label == "Resamples (B)").set_value(resamples)
    at.run()
    button(at, "Run stability").click()
    at.run()
    finish_job(at, "stability")


def test_masks_from_stable_heads_and_the_reach_warning(app):
    _run_stability(app, budget=2, resamples=3)
    run = app.session_state["results"]["jobs"]["stability"].result
    app.switch_page("pages/5_masks.py")
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    ranking = next(s for s in app.selectbox if s.label == "Ranking (least useful first)")
    assert "stable heads (3 resamples, greedy avg)" in ranking.options
    ranking.set_value("CircAvg-stable")
    app.run()
    # the defaults (B = 8 // 3 = 2, K = 5) reach past the 2 removals the run made
    warning = next(w.value for w in app.warning if "reach past" in w.value)
    assert "K = 5" in warning and "2 removals the stability run made" in warning
    next(n for n in app.number_input if n.label.startswith("K:")).set_value(2)
    app.run()
    assert not any("reach past" in w.value for w in app.warning)
    next(n for n in app.number_input if n.label.startswith("M:")).set_value(2)
    app.run()
    next(r for r in app.radio if r.label == "Strategy").set_value("circuit")
    app.run()
    button(app, "Build").click()
    app.run()
    members = app.session_state["results"]["members"]
    assert len(members) == 1
    expected = run.stability.ranking(run.search.ranking())[:2]
    removed = (~members[0].keep).nonzero().tolist()
    assert sorted(map(tuple, removed)) == sorted(expected)
    ranking_info = members[0].provenance["ranking"]
    assert ranking_info["method"] == "stability" and ranking_info["resamples"] == 3
    assert ranking_info["holdout"] == 0.25


def test_evidence_takes_the_frequencies_of_the_stability_run(app):
    _run_stability(app, budget=2, resamples=2)
    run = app.session_state["results"]["jobs"]["stability"].result
    assert any("from the Stability run above (2 resamples" in c.value for c in app.caption)
    button(app, "Compute evidence").click()
    app.run()
    finish_job(app, "evidence")
    found = app.session_state["results"]["jobs"]["evidence"].result
    keep = 1 - run.stability.frequency().numpy()
    np.testing.assert_array_equal(found.map("keep_frequency"), keep)


def test_member_defaults_stay_within_the_search():
    from hydra_ui.stability import member_defaults

    assert member_defaults(72, 24, pooled=True) == (12, 24)  # the default search: no warning
    assert member_defaults(72, 24, pooled=False) == (24, 0)
    assert member_defaults(72, None, pooled=True) == (24, 48)  # Taylor ranks every head
    assert member_defaults(72, 100, pooled=True) == (24, 48)  # the paper's 1/3 and 2/3
    # too short a search for three distinct members within it: the paper's sizes (and a warning)
    assert member_defaults(18, 2, pooled=True) == (6, 12)


def test_masks_page_opens_with_defaults_its_search_reaches(app, reference):
    from hydra_core.hydra.members import CIRCUIT_NAMES
    from hydra_ui.context import disk_cache

    loaded, inputs = reference
    greedy_circuit(  # a search as the Headmap page saves it, of budget 4 on the 8-head model
        loaded.model, inputs.id_x, inputs.id_y, inputs.ood_x, objective="avg", budget=4,
        cache=disk_cache(),
    )  # fmt: skip
    open_page(app, "pages/5_masks.py")
    app.radio[0].set_value("seed-sampling")
    app.selectbox[0].set_value(CIRCUIT_NAMES["avg"])
    app.run()
    assert not app.exception
    values = {n.label.split(":")[0]: n.value for n in app.number_input}
    assert (values["B"], values["K"]) == (2, 4)
    assert not any("reach past" in w.value for w in app.warning)
    next(n for n in app.number_input if n.label.startswith("K:")).set_value(5)
    app.run()
    assert any("reach past the 4 removals the search made" in w.value for w in app.warning)
