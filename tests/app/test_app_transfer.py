"""The Headmap page's transfer matrix and shortcut warning, driven as a user drives them
(AppTest), against the library."""

from __future__ import annotations

import numpy as np

from hydra_core.analysis.shortcut import benchmark_shortcuts
from hydra_core.analysis.transfer import every_set_options, transfer_matrix
from hydra_core.data.benchmark import default_benchmark
from tests.app.conftest import (
    N_REPORT,
    N_SEARCH,
    OOD,
    array,
    button,
    figures,
    finish_job,
    open_page,
)


def test_the_matrix_is_computed_in_a_job_and_equals_the_library(app, reference):
    loaded, _ = reference
    open_page(app, "pages/2_headmap.py")
    # the shortcut check warns where the library says so (the tiny model barely separates)
    benchmark = default_benchmark(n_search=N_SEARCH, n_report=N_REPORT, ood=list(OOD))
    checks = benchmark_shortcuts(loaded, benchmark, device="cpu")
    shown = [w.value for w in app.warning if "surface features alone" in w.value]
    assert len(shown) == sum(c.warns for c in checks.values()) > 0
    next(r for r in app.radio if r.label == "Objective").set_value("ood")
    app.number_input[0].set_value(2)  # budget
    app.run()
    button(app, "Compute the transfer matrix").click()
    app.run()
    finish_job(app, "transfer")
    assert app.session_state["results"]["jobs"]["transfer"].status == "done"
    options = every_set_options(loaded.modality, ood=list(OOD), search_ood=["photos", "faces"])
    every = loaded.modality.benchmark(n_search=N_SEARCH, n_report=N_REPORT, **options)
    expected = transfer_matrix(loaded, every, objective="ood", budget=2, device="cpu")
    heatmap = next(f for f in figures(app) if "AUROC change vs dense" in f.layout.title.text)
    z = array(heatmap.data[0].z)
    assert list(heatmap.data[0].y) == list(expected.sets) == ["mnist", "noise", "photos", "faces"]
    assert list(heatmap.data[0].x)[-2:] == ["near avg", "far avg"]
    np.testing.assert_allclose(z[:, :4], expected.matrix().to_numpy() * 100, atol=1e-9)
    table = next(d.value for d in app.dataframe if "searched on" in d.value.columns)
    assert "on mnist (near)" in table.columns and "far average" in table.columns
    first = expected.cells.iloc[0]  # mnist's own cell
    own = table.loc[0, "on mnist (near)"]
    assert own.startswith(f"{first.delta_auroc * 100:+.2f} [") and own.endswith("(own, held out)")
    # the page's candidates per step make every row the guided search, as the command's
    # --candidates does
    next(n for n in app.number_input if n.label.startswith("Candidates")).set_value(2)
    app.run()
    button(app, "Compute the transfer matrix").click()
    app.run()
    finish_job(app, "transfer")
    guided = transfer_matrix(loaded, every, objective="ood", budget=2, candidates=2, device="cpu")
    heatmap = next(f for f in figures(app) if "(guided, K = 2)" in f.layout.title.text)
    np.testing.assert_allclose(
        array(heatmap.data[0].z)[:, :4], guided.matrix().to_numpy() * 100, atol=1e-9
    )
