"""Head-importance maps: orientation, the greedy convention, and one set of numbers for the Head
importance page and the ``importance`` command."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from hydra_core.analysis import importance
from hydra_core.analysis.compare import spearman_matrix
from hydra_core.analysis.greedy import GreedyResult
from hydra_core.analysis.importance import greedy_importance, importance_maps
from hydra_core.cli import main
from hydra_ui.context import SetupConfig, disk_cache
from hydra_ui.figures import rank_percentile
from tests.app.conftest import (
    N_REPORT,
    N_SEARCH,
    OOD,
    array,
    button,
    figures,
    new_app,
    open_page,
)

NAN = math.nan


def search(order: list[tuple[int, int]], num_heads: tuple[int, ...]) -> GreedyResult:
    """A greedy result that removed ``order``; the scores do not matter here."""
    shape = (len(num_heads), max(num_heads))
    steps = len(order)
    return GreedyResult(
        objective="avg",
        budget=steps,
        order=order,
        scores=[0.5] * steps,
        accuracy=[0.5] * steps,
        auroc=[0.5] * steps,
        base_accuracy=0.9,
        base_auroc=0.8,
        base_score=0.85,
        candidate_scores=[torch.full(shape, 0.5, dtype=torch.float64) for _ in order],
        complete=True,
        seconds=0.0,
        num_heads=num_heads,
    )


@pytest.fixture
def single() -> dict:
    """A single-head result as :func:`single_head_importance` returns it, for 2 x 3 heads."""
    return {
        "delta_accuracy": torch.tensor(
            [[-0.2, 0.0, 0.1], [-0.05, -0.3, 0.02]], dtype=torch.float64
        ),
        "delta_auroc": torch.tensor([[0.01, -0.1, -0.02], [0.0, -0.2, 0.03]], dtype=torch.float64),
        "delta_avg": torch.zeros(2, 3, dtype=torch.float64),
        "base_accuracy": 0.75,
        "base_auroc": 0.8,
    }


TAYLOR = torch.tensor([[3.0, 1.0, 2.0], [0.5, 4.0, 0.25]])


def test_maps_are_named_and_turned_higher_is_more_important(single):
    found = importance_maps(single, TAYLOR)
    assert list(found.maps) == ["Δaccuracy", "ΔAUROC", "Taylor"]
    assert [c.file_stem for c in found.criteria] == ["delta_accuracy", "delta_auroc", "taylor"]
    np.testing.assert_array_equal(found.maps["Δaccuracy"], -single["delta_accuracy"].numpy())
    np.testing.assert_array_equal(found.maps["ΔAUROC"], -single["delta_auroc"].numpy())
    np.testing.assert_array_equal(found.maps["Taylor"], TAYLOR.double().numpy())
    label, values = found.raw["Δaccuracy"]
    assert label == "accuracy change when ablated"
    np.testing.assert_array_equal(values, single["delta_accuracy"].numpy())
    assert (found.base_accuracy, found.base_auroc) == (0.75, 0.8)
    pd.testing.assert_frame_equal(found.spearman(), spearman_matrix(found.maps))
    # arrays (the UI's cached form) give the same maps as tensors
    as_arrays = {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in single.items()}
    again = importance_maps(as_arrays, TAYLOR.numpy())
    for name, values in found.maps.items():
        np.testing.assert_array_equal(again.maps[name], values)


def test_greedy_map_ties_the_heads_a_budget_limited_search_kept():
    # layer 1 has 2 of 3 heads (a pruned model): (1, 2) is absent
    result = search([(0, 1), (1, 0), (0, 2)], num_heads=(3, 2))
    np.testing.assert_array_equal(greedy_importance(result), [[4.0, 1.0, 3.0], [2.0, 4.0, NAN]])


def test_greedy_map_of_a_complete_search_is_the_ranking():
    order = [(1, 1), (0, 0), (1, 2), (0, 2), (1, 0), (0, 1)]
    result = search(order, num_heads=(3, 3))
    position = np.full((2, 3), NAN)
    for rank, head in enumerate(result.ranking()):
        position[head] = rank
    np.testing.assert_array_equal(greedy_importance(result), position + 1)


def test_greedy_criterion_and_per_head_table(single):
    result = search([(1, 1), (0, 0)], num_heads=(3, 3))
    found = importance_maps(single, TAYLOR, result)
    assert list(found.maps)[-1] == "greedy avg"
    greedy = found.criteria[-1]
    assert (greedy.file_stem, greedy.raw_label) == ("greedy_avg_step", "removed at step (– = kept)")
    np.testing.assert_array_equal(greedy.importance, [[2, 3, 3], [3, 1, 3]])
    np.testing.assert_array_equal(greedy.raw, [[2, NAN, NAN], [NAN, 1, NAN]])
    # the kept heads tie: Spearman sees them at their mean rank
    expected = pd.Series(greedy.importance.ravel()).corr(
        pd.Series(found.maps["Taylor"].ravel()), method="spearman"
    )
    assert found.spearman().loc["greedy avg", "Taylor"] == pytest.approx(expected)

    table = found.per_head()
    assert list(table.columns) == [
        "head",
        "accuracy change when ablated",
        "AUROC change when ablated",
        "Taylor score",
        "removed at step (– = kept)",
    ]
    assert table["head"].tolist() == ["L0H0", "L0H1", "L0H2", "L1H0", "L1H1", "L1H2"]
    assert table.loc[4, "removed at step (– = kept)"] == 1


def test_absent_heads_are_left_out_of_the_per_head_table(single):
    single = dict(single, delta_accuracy=single["delta_accuracy"].clone())
    single["delta_accuracy"][1, 2] = NAN
    single["delta_auroc"] = single["delta_auroc"].masked_fill(
        torch.isnan(single["delta_accuracy"]), NAN
    )
    taylor = TAYLOR.clone()
    taylor[1, 2] = NAN
    table = importance_maps(single, taylor).per_head()
    assert table["head"].tolist() == ["L0H0", "L0H1", "L0H2", "L1H0", "L1H1"]


def test_maps_of_different_models_are_refused(single):
    with pytest.raises(ValueError, match=r"different models: .*Taylor \(3, 3\)"):
        importance_maps(single, torch.ones(3, 3))
    with pytest.raises(ValueError, match=r"greedy avg \(2, 4\)"):
        importance_maps(single, TAYLOR, search([(0, 0)], num_heads=(4, 4)))


# --- the page and the command agree -------------------------------------------------------------

DATA = ["--n-search", str(N_SEARCH), "--n-report", str(N_REPORT), "--ood", *OOD, "--device", "cpu"]


def test_page_shows_the_maps_and_correlations_the_command_writes(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))
    disk_cache.clear()  # the app's DiskCache reads the variable again
    searched, written = tmp_path / "search", tmp_path / "importance"
    model = ["--model", checkpoint, *DATA]
    assert main(["search", *model, "--budget", "3", "--out", str(searched)]) == 0
    greedy_json = ["--greedy", str(searched / "greedy_avg.json")]
    assert (
        main(["importance", *model, *greedy_json, "--taylor-samples", "20", "--out", str(written)])
        == 0
    )

    shown = []  # what the page computed, caught on its way to the screen
    real = importance.importance_maps

    def recorded(*args):
        shown.append(real(*args))
        return shown[-1]

    monkeypatch.setattr(importance, "importance_maps", recorded)  # the page imports it each run
    app = new_app(
        SetupConfig(model=checkpoint, ood=OOD, n_search=N_SEARCH, n_report=N_REPORT, device="cpu")
    )
    open_page(app, "pages/3_importance.py")
    app.number_input[0].set_value(20)  # Taylor images, as --taylor-samples
    assert app.selectbox[0].options == ["avg"]  # the command's search, found in the cache
    button(app, "Compute importance maps").click()
    app.run()
    assert not app.exception and not app.error, [e.value for e in app.error]

    files = json.loads((written / "importance.json").read_text())["files"]
    names = ["Δaccuracy", "ΔAUROC", "Taylor", "greedy avg"]
    assert list(files) == names
    page_maps = shown[-1].maps
    assert list(page_maps) == names
    panels = figures(app)[0]
    assert [a.text for a in panels.layout.annotations] == names
    maps = [t for t in panels.data if t.type == "heatmap"]  # the rest: the head pickers
    for trace, name in zip(maps, names, strict=True):
        written_map = pd.read_csv(written / files[name], index_col=0).to_numpy()
        np.testing.assert_array_equal(page_maps[name], written_map)
        np.testing.assert_allclose(array(trace.z), rank_percentile(written_map))
    greedy_map = page_maps["greedy avg"]
    assert sorted(greedy_map.ravel()) == [1, 2, 3] + [4] * 5  # 3 of 8 heads removed, 5 tied

    table = next(d.value for d in app.dataframe if "criterion" in d.value.columns)
    spearman = pd.read_csv(written / "spearman.csv", index_col=0)
    pd.testing.assert_frame_equal(table.set_index("criterion"), spearman, check_names=False)


def test_single_head_importance_reports_its_progress():
    """The ablation of every head says how many heads it scored (the page's progress bar), and
    gives the maps it gives without a callback."""
    from hydra_core.analysis.greedy import single_head_importance
    from tests.conftest import make_tiny_vit

    model = make_tiny_vit(depth=2, num_heads=3)
    generator = torch.Generator().manual_seed(0)
    id_x, ood_x = torch.randn(12, 1, 16, 16, generator=generator), torch.randn(10, 1, 16, 16)
    id_y = torch.randint(0, 5, (12,), generator=generator)
    seen = []
    found = single_head_importance(model, id_x, id_y, ood_x, progress=lambda *p: seen.append(p))
    plain = single_head_importance(model, id_x, id_y, ood_x)
    assert seen[-1] == (6, 6) and all(total == 6 for _, total in seen)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    torch.testing.assert_close(found["delta_auroc"], plain["delta_auroc"], equal_nan=True)
