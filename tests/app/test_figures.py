"""The app's figure builders (hydra_ui.figures), their PNG/SVG export and the background jobs."""

from __future__ import annotations

import base64
import io
import threading
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest
import torch

from hydra_core.analysis.greedy import GreedyResult
from hydra_core.masks import MemberMask
from hydra_ui import figures, projections
from hydra_ui.export import figure_png, figure_svg, to_matplotlib
from hydra_ui.jobs import DONE, FAILED, STOPPED, Job, format_seconds, start_job, time_left

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def a_map() -> np.ndarray:
    values = np.arange(12, dtype=np.float64).reshape(3, 4) / 10
    values[2, 3] = np.nan  # a head that does not exist
    return values


def a_search() -> GreedyResult:
    """3 steps of a search on a 3 x 4 model: L1H2, then L0H0, then L2H1."""
    return GreedyResult(
        objective="avg",
        budget=5,
        order=[(1, 2), (0, 0), (2, 1)],
        scores=[0.80, 0.75, 0.70],
        accuracy=[0.90, 0.85, 0.81],
        auroc=[0.70, 0.65, 0.59],
        base_accuracy=0.92,
        base_auroc=0.72,
        base_score=0.82,
        candidate_scores=[torch.zeros(3, 4)] * 3,
        complete=False,
        seconds=1.5,
        num_heads=(4, 4, 4),
    )


def test_head_heatmap_shows_the_map_and_names_every_head():
    values = a_map()
    fig = figures.head_heatmap(values, value_name="Δacc", hover={"other": values * 2})
    trace = fig.data[0]
    np.testing.assert_array_equal(np.asarray(trace.z, dtype=float), values)  # NaN stays NaN
    assert list(trace.y) == ["L0", "L1", "L2"] and list(trace.x) == ["H0", "H1", "H2", "H3"]
    custom = np.asarray(trace.customdata)
    assert custom[1, 2, 0] == "L1H2"
    assert custom[1, 2, 1] == "Δacc: 0.6<br>other: 1.2"
    assert custom[2, 3, 1].startswith("Δacc: –")
    assert fig.layout.yaxis.autorange == "reversed"  # L0 at the top


def test_head_heatmap_rejects_a_vector():
    with pytest.raises(ValueError, match="layers, heads"):
        figures.head_heatmap(np.zeros(5))


def test_rank_percentile():
    out = figures.rank_percentile([[3.0, 1.0], [np.nan, 1.0]])
    np.testing.assert_allclose(
        out, [[1.0, 0.25], [np.nan, 0.25]]
    )  # ties share their mean rank, 1.5
    np.testing.assert_allclose(figures.rank_percentile([5.0, 1.0, 3.0]), [1.0, 0.0, 0.5])
    np.testing.assert_allclose(figures.rank_percentile([np.nan, 2.0]), [np.nan, 1.0])


def test_importance_heatmaps_share_one_colour_meaning():
    values = a_map()
    maps = {"a": values, "b": -values}
    fig = figures.importance_heatmaps(maps, raw={"b": ("Δacc", values)})
    assert [t.coloraxis for t in fig.data] == ["coloraxis", "coloraxis"]
    assert (fig.layout.coloraxis.cmin, fig.layout.coloraxis.cmax) == (0, 1)
    np.testing.assert_allclose(
        np.asarray(fig.data[0].z, dtype=float), figures.rank_percentile(values)
    )
    np.testing.assert_allclose(
        np.asarray(fig.data[1].z, dtype=float), figures.rank_percentile(-values)
    )
    custom_a, custom_b = np.asarray(fig.data[0].customdata), np.asarray(fig.data[1].customdata)
    assert custom_a[2, 2, 0] == "L2H2" and "rank (1 = most important): 1 of 11" in custom_a[2, 2, 1]
    assert "rank (1 = most important): 1 of 11" in custom_b[0, 0, 1]  # -values: L0H0 is largest
    assert "Δacc: 0" in custom_b[0, 0, 1]  # the raw value, not the oriented one


def test_removal_step_heatmap_fills_in_the_removed_heads():
    result = a_search()
    fig = figures.removal_step_heatmap(result)
    z = np.asarray(fig.data[0].z, dtype=float)
    expected = np.full((3, 4), np.nan)
    expected[1, 2], expected[0, 0], expected[2, 1] = 1, 2, 3
    np.testing.assert_array_equal(z, expected)
    assert (fig.data[0].zmin, fig.data[0].zmax) == (1, 5)  # the budget fixes the colours
    custom = np.asarray(fig.data[0].customdata)
    assert custom[0, 0, 0] == "L0H0"
    assert "accuracy after: 0.85" in custom[0, 0, 1] and "AUROC after: 0.65" in custom[0, 0, 1]


def test_greedy_curves_start_at_the_dense_model():
    result = a_search()
    fig = figures.greedy_curves({"avg": result})
    by_name = {t.name.split(" (")[0]: t for t in fig.data}
    assert list(by_name["accuracy"].y) == [0.92, 0.90, 0.85, 0.81]
    assert list(by_name["AUROC"].y) == [0.72, 0.70, 0.65, 0.59]
    assert list(by_name["objective"].y) == [0.82, 0.80, 0.75, 0.70]
    assert list(by_name["accuracy"].x) == [0, 1, 2, 3]
    acc_run = GreedyResult.from_dict({**result.to_dict(), "objective": "acc"})
    two = figures.greedy_curves({"avg": result, "acc": acc_run})
    assert len(two.data) == 3 + 2  # the acc run's objective is its accuracy curve
    assert {t.name for t in two.data} >= {"avg · accuracy", "acc · AUROC"}


def test_projection_scatter_has_one_trace_per_set():
    frame = pd.DataFrame(
        {"x": [0.0, 1, 2, 3], "y": [1.0, 2, 3, 4], "set": ["ID", "ID", "mnist", "noise"]}
    )
    fig = projections.projection_scatter(frame)
    assert [t.name for t in fig.data] == ["ID", "mnist", "noise"]
    assert list(fig.data[0].x) == [0.0, 1.0] and list(fig.data[2].y) == [4.0]
    assert fig.data[0].marker.color == figures.ID_COLOUR
    pair = projections.projection_pair(frame, frame, titles=("most", "least"))
    assert len(pair.data) == 6 and [t.showlegend for t in pair.data] == [True] * 3 + [False] * 3


def lab(colour: str) -> np.ndarray:
    """CIE L*a*b* (D65) of a #rrggbb colour."""
    rgb = np.array([int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = (
        np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
        @ linear
        / np.array([0.95047, 1.0, 1.08883])
    )
    f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_id_is_distinct_from_every_ood_colour():
    """ID is the only blue: no OOD colour lies in the blue family (HSV hue 150-250 degrees, from
    teal to blue: ID is 201, the teal of the old palette, animal_silhouettes', 164) unless it is
    a grey; and the five default report sets' colours lie far apart (CIE76 distance, about 2.3
    is just noticeable)."""
    import colorsys

    def hsv(colour: str) -> tuple[float, float, float]:
        return colorsys.rgb_to_hsv(*(int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)))

    def bluish(colour: str) -> bool:
        hue, saturation, _ = hsv(colour)
        return saturation > 0.2 and 150 <= hue * 360 <= 250

    assert bluish(figures.ID_COLOUR) and bluish("#009E73")
    assert not any(bluish(c) for c in figures.OOD_COLOURS)
    shown = [lab(c) for c in figures.OOD_COLOURS[:5]]
    assert min(np.linalg.norm(a - b) for i, a in enumerate(shown) for b in shown[i + 1 :]) > 30
    colours = projections.set_colours(["ID", "mnist", "animal_silhouettes"])
    assert colours == {"ID": figures.ID_COLOUR, "mnist": "#E41A1C", "animal_silhouettes": "#FF7F00"}


def test_image_points_carry_their_thumbnail():
    images = {
        "ID": torch.arange(2 * 28 * 28, dtype=torch.uint8).reshape(2, 1, 28, 28),
        "noise": torch.full((1, 3, 96, 96), 200, dtype=torch.uint8),
    }
    frame = pd.DataFrame({"x": [0.0, 1, 2], "y": [1.0, 2, 3], "set": ["ID", "ID", "noise"]})
    shown = projections.with_thumbnails(frame, images, ["noise"])
    from PIL import Image

    pictures = [
        Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1]))) for u in shown["image"]
    ]
    assert all(u.startswith("data:image/png;base64,") for u in shown["image"])
    assert [p.size for p in pictures] == [(28, 28), (28, 28), (64, 64)]  # large ones shrink
    np.testing.assert_array_equal(np.asarray(pictures[1]), images["ID"][1, 0].numpy())
    with pytest.raises(ValueError, match="made from another sample"):
        projections.with_thumbnails(frame.iloc[:2], images, ["noise"])
    spec = projections.projection_spec([("L5H0", shown)], method="PCA")
    assert {"field": "image", "type": "nominal"} in spec["encoding"]["tooltip"]
    assert spec["encoding"]["color"]["scale"]["range"] == [figures.ID_COLOUR, "#E41A1C"]
    assert [v["set"] for v in spec["data"]["values"]] == ["ID", "ID", "noise"]
    pair = projections.projection_spec([("most", shown), ("least", shown)])
    assert len(pair["hconcat"]) == 2 and pair["usermeta"]["embedOptions"]["renderer"] == "svg"


def test_head_picker_makes_every_cell_clickable_and_stays_out_of_downloads():
    fig = figures.add_head_picker(figures.importance_heatmaps({"a": a_map(), "b": a_map()}))
    pickers = [t for t in fig.data if t.meta == figures.HEAD_PICKER]
    assert len(pickers) == 2 and pickers[1].xaxis == "x2"
    custom = np.asarray(pickers[0].customdata)
    assert custom[0, 0] == "L0H0" and custom[7, 0] == "L1H3" and len(custom) == 12
    assert custom[7, 1] == np.asarray(fig.data[0].customdata)[1, 3, 1]  # the cell's hover text
    assert (pickers[0].x[7], pickers[0].y[7]) == ("H3", "L1")
    from matplotlib.collections import PathCollection

    drawn = to_matplotlib(fig)  # the heatmaps, without the picker's points
    assert not [c for ax in drawn.axes for c in ax.collections if isinstance(c, PathCollection)]
    assert sum(len(ax.images) for ax in drawn.axes) == 2


def test_dense_vs_circuit_scale_is_centred_at_zero():
    deltas = pd.DataFrame({"delta_euclidean": [0.5, -0.1], "delta_mahalanobis": [0.2, 0.05]})
    fig = figures.matrix_heatmap(deltas, colorscale="RdBu", diverging=True)
    assert (fig.data[0].zmin, fig.data[0].zmid, fig.data[0].zmax) == (-0.5, 0.0, 0.5)
    assert figures.matrix_heatmap(deltas).data[0].zmid is None


def test_wilson_interval_matches_scipy():
    from scipy.stats import binomtest

    correct, count = np.array([0, 3, 9, 0]), np.array([2, 10, 9, 0])
    bounds = figures.wilson_interval(correct, count)
    for i in range(3):
        expected = binomtest(int(correct[i]), int(count[i])).proportion_ci(method="wilson")
        assert bounds[:, i] == pytest.approx([expected.low, expected.high], abs=1e-6)
    assert np.isnan(bounds[:, 3]).all()


def test_member_masks_and_matrix():
    keep = torch.tensor([[True, False], [False, True]])
    members = [MemberMask("a", "test", keep), MemberMask("b", "test", ~keep)]
    fig = figures.member_masks_figure(members)
    np.testing.assert_array_equal(np.asarray(fig.data[1].z, dtype=float), (~keep).double().numpy())
    assert np.asarray(fig.data[0].customdata)[0, 1, 1] == "a: removed"
    frame = pd.DataFrame([[1.0, 0.25], [0.25, 1.0]], index=["a", "b"], columns=["a", "b"])
    matrix = figures.matrix_heatmap(frame, value_name="Jaccard")
    np.testing.assert_array_equal(np.asarray(matrix.data[0].z), frame.to_numpy())
    assert matrix.data[0].texttemplate == "%{z:.2f}"


def test_reliability_roc_and_cost_figures():
    bins = pd.DataFrame(
        {"bin_lower": [0.2, 0.5, 0.8], "bin_upper": [0.4, 0.7, 1.0],
         "confidence": [0.3, np.nan, 0.9], "accuracy": [0.25, np.nan, 1.0], "count": [4, 0, 9]}
    )  # fmt: skip
    fig = figures.reliability_diagram({"single": bins})
    curve, counts = fig.data[1], fig.data[2]
    assert list(curve.x) == [0.3, 0.9]  # the empty bin is left out, not drawn at 0
    lo, hi = figures.wilson_interval(np.array([1, 9]), np.array([4, 9]))
    assert list(curve.error_y.arrayminus) == pytest.approx(list(np.array([0.25, 1.0]) - lo))
    assert list(curve.error_y.array) == pytest.approx(list(hi - np.array([0.25, 1.0])))
    assert counts.type == "bar" and list(counts.y) == [4, 0, 9] and counts.yaxis == "y2"
    assert list(counts.x) == pytest.approx([0.3, 0.6, 0.9])
    assert figure_png(fig).startswith(PNG_SIGNATURE)  # bars and error bars draw in downloads
    roc = pd.DataFrame({"fpr": [0.0, 0.5, 1.0], "tpr": [0.0, 0.8, 1.0]})
    roc.attrs["auroc"] = 0.65
    assert figures.roc_curves({"hydra": roc}).data[1].name == "hydra (AUROC 0.650)"
    cost = pd.DataFrame({"system": ["single", "Hydra"], "macs": [1e6, 2.5e6], "auroc": [0.8, 0.9]})
    scatter = figures.cost_scatter(cost, x="macs", log_x=True)
    assert [t.name for t in scatter.data] == ["single", "Hydra"]
    assert list(scatter.data[1].x) == [2.5e6] and scatter.layout.xaxis.type == "log"
    # named in a legend and on hover (labels of close points overlapped), each its own shape
    assert scatter.layout.showlegend and scatter.data[0].mode == "markers"
    assert scatter.data[0].marker.symbol != scatter.data[1].marker.symbol
    assert "single" in scatter.data[0].hovertemplate
    low, high = scatter.layout.xaxis.range
    assert low < 6 < np.log10(2.5e6) < high and scatter.data[0].cliponaxis is False
    y_low, y_high = scatter.layout.yaxis.range
    assert y_low < 0.8 and y_high > 0.9


def test_intervals_become_error_bars():
    cost = pd.DataFrame(
        {"system": ["single", "Hydra"], "macs": [1e6, 2.5e6], "auroc": [0.8, 0.9],
         "auroc_lo": [0.78, 0.85], "auroc_hi": [0.83, 0.92]}
    )  # fmt: skip
    scatter = figures.cost_scatter(cost, x="macs")
    bars = scatter.data[1].error_y
    assert list(bars.array) == pytest.approx([0.02]) and list(bars.arrayminus) == pytest.approx(
        [0.05]
    )  # asymmetric: the percentile interval is not centred on the value
    assert "customdata[0]" in scatter.data[0].hovertemplate
    roc = pd.DataFrame({"fpr": [0.0, 1.0], "tpr": [0.0, 1.0]})
    roc.attrs.update(auroc=0.65, auroc_ci95=(0.6, 0.7))
    assert figures.roc_curves({"h": roc}).data[1].name == "h (AUROC 0.650 [0.600, 0.700])"


def test_difference_plot_marks_intervals_that_contain_zero():
    frame = pd.DataFrame(
        {"system": ["Hydra", "Taylor", "member", "Deep"], "all_auroc": [0.03, -0.01, 0.0, np.nan],
         "all_auroc_lo": [0.01, -0.02, -0.01, np.nan], "all_auroc_hi": [0.05, 0.005, 0.01, np.nan]}
    )  # fmt: skip
    fig = figures.difference_plot(frame, "all_auroc", metric_title="AUROC")
    zero, significant, not_significant = fig.data
    assert list(zero.x) == ["Hydra", "Taylor", "member"] and set(zero.y) == {0.0}  # NaN left out
    assert list(significant.x) == ["Hydra"] and significant.name.startswith("significant")
    assert list(not_significant.x) == ["Taylor", "member"]
    assert not_significant.marker.symbol == "circle-open"
    assert list(not_significant.error_y.array) == pytest.approx([0.015, 0.01])
    assert list(not_significant.error_y.arrayminus) == pytest.approx([0.01, 0.01])
    assert "AUROC: difference to single" in fig.layout.title.text
    assert to_matplotlib(fig).axes  # the PNG / SVG export draws it
    with pytest.raises(ValueError, match="no system has a difference on 'all_auroc'"):
        figures.difference_plot(frame.iloc[3:], "all_auroc")


# --- export --------------------------------------------------------------------------------------


def test_png_and_svg_are_valid_files():
    fig = figures.head_heatmap(a_map(), title="a map")
    png = figure_png(fig)
    assert png.startswith(PNG_SIGNATURE)
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width > 500 and height > 300
    svg = figure_svg(figures.greedy_curves({"avg": a_search()}))
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg")


def test_matplotlib_rendering_draws_the_same_data():
    values = a_map()
    drawn = to_matplotlib(figures.head_heatmap(values, title="map"))
    image = drawn.axes[0].images[0].get_array()
    np.testing.assert_array_equal(image.filled(np.nan), values)
    assert drawn._suptitle.get_text() == "map"
    curves = to_matplotlib(figures.greedy_curves({"avg": a_search()}))
    lines = {line.get_label(): line for line in curves.axes[0].get_lines()}
    assert list(lines["accuracy"].get_ydata()) == [0.92, 0.90, 0.85, 0.81]
    panels = to_matplotlib(figures.importance_heatmaps({"a": values, "b": -values}))
    assert len([ax for ax in panels.axes if ax.images]) == 2  # and one shared colour bar
    assert len(panels.axes) == 3


def test_export_refuses_trace_types_it_cannot_draw():
    import plotly.graph_objects as go

    with pytest.raises(ValueError, match="'pie'"):
        figure_png(go.Figure(go.Pie(values=[1, 2])))


# --- jobs ----------------------------------------------------------------------------------------


def test_job_reports_progress_and_returns_its_result():
    gate = threading.Event()

    def work(job: Job) -> int:
        job.begin(10)
        job.report("half", done=5)
        gate.wait(5)
        return 42

    job = start_job("count", work, {"what": "test"})
    for _ in range(100):
        if job.progress == "half":
            break
        threading.Event().wait(0.01)
    assert job.running and job.progress == "half" and job.fraction() == 0.5
    gate.set()
    assert job.wait(5)
    assert (job.status, job.result, job.info) == (DONE, 42, {"what": "test"})


def test_job_time_left_counts_only_its_own_work(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("hydra_ui.jobs.time.monotonic", lambda: now[0])
    job = Job("resumed", lambda job: None)
    assert job.eta_seconds() is None and job.fraction() == 0
    job.begin(10, done=2)  # 2 of 10 were done by an earlier run
    now[0] += 4
    job.report(done=4)  # 2 units in 4 s: the 6 left take 12 s
    assert job.eta_seconds() == pytest.approx(12.0)
    assert job.fraction() == pytest.approx(0.4)
    job.report(done=4, total=20)  # work that learns its total as it goes
    assert job.eta_seconds() == pytest.approx(32.0)


def test_time_left_of_steps_that_get_cheaper():
    """A greedy search of 72 heads, budget 4: step t tries 72 - t candidates at 0.1 s each."""
    sizes = [72, 71, 70, 69]
    assert time_left([], sizes) is None  # nothing timed yet: no estimate
    # one step done in 7.2 s: the three left take (71 + 70 + 69) x 0.1 s
    assert time_left([(7.2, 72)], sizes[1:]) == pytest.approx(21.0)
    # 3 s into the second step: the estimate counts down instead of growing with the wait
    assert time_left([(7.2, 72)], sizes[1:], into_step=3.0) == pytest.approx(18.0)
    # a step that runs long stops at what the later steps take, never below
    assert time_left([(7.2, 72)], sizes[1:], into_step=60.0) == pytest.approx(13.9)
    # the cost per candidate of the latest steps counts, not the first step's
    timed = [(20.0, 72), (7.1, 71), (7.0, 70), (6.9, 69)]
    assert time_left(timed, [68, 67]) == pytest.approx(13.5)
    assert time_left(timed, []) == 0.0


def test_job_in_steps_counts_down_from_the_steps_done(monkeypatch):
    now = [0.0]
    monkeypatch.setattr("hydra_ui.jobs.time.monotonic", lambda: now[0])
    job = Job("search", lambda job: None)
    job.begin_steps([10, 9, 8, 7], done=1)  # a resumed search: its first step was done before
    assert job.eta_seconds() is None and job.fraction() == pytest.approx(10 / 34)
    now[0] += 9.0
    job.report("step 2", steps=2)  # 9 candidates in 9 s
    assert job.eta_seconds() == pytest.approx(15.0) and job.fraction() == pytest.approx(19 / 34)
    now[0] += 5.0
    assert job.eta_seconds() == pytest.approx(10.0)  # 5 s into the 8-candidate step
    job.report("step 2 again", steps=2)  # the same step reported twice changes nothing
    assert job.eta_seconds() == pytest.approx(10.0)
    now[0] += 3.0
    job.report("step 3", steps=3)
    assert job.eta_seconds() == pytest.approx(7.0)  # 17 candidates in 17 s: 7 left


def test_job_stop_and_failure():
    def until_stopped(job: Job) -> str:
        while not job.should_stop():
            threading.Event().wait(0.005)
        return "partial"

    job = start_job("loop", until_stopped)
    job.stop()
    assert job.wait(5) and (job.status, job.result) == (STOPPED, "partial")

    def checks(job: Job) -> None:
        job.stop()
        job.check()  # raises Cancelled

    cancelled = start_job("check", checks)
    assert cancelled.wait(5) and cancelled.status == STOPPED and cancelled.error is None

    def fails(job: Job) -> None:
        raise RuntimeError("out of memory")

    failed = start_job("fail", fails)
    assert failed.wait(5) and failed.status == FAILED and str(failed.error) == "out of memory"


def test_format_seconds():
    assert format_seconds(None) == "estimating..."
    assert format_seconds(42.4) == "42 s"
    assert format_seconds(75) == "1 min 15 s"
    assert format_seconds(3 * 3600 + 60 * 5) == "3 h 05 min"


def test_exported_pictures_keep_the_error_bars():
    """The 95% intervals drawn in the browser are in the PNG/SVG downloads too."""
    import plotly.graph_objects as go

    fig = go.Figure(
        go.Scatter(
            x=[1.0, 2.0],
            y=[0.8, 0.7],
            mode="markers",
            error_y=dict(type="data", array=[0.02, 0.03], arrayminus=[0.01, 0.05]),
        )
    )
    mpl = to_matplotlib(fig)
    (ax,) = mpl.axes
    bars = [c for c in ax.collections if c.__class__.__name__ == "LineCollection"]
    assert bars, "no error bars drawn"
    segments = np.concatenate([np.asarray(s) for s in bars[0].get_segments()])
    assert segments[:, 1].min() == pytest.approx(0.65) and segments[:, 1].max() == pytest.approx(
        0.82
    )


def test_head_maps_name_the_layers_of_each_tower():
    towers = (("image", 3), ("text", 2))
    z = np.arange(20, dtype=float).reshape(5, 4)
    z[3:, 2:] = np.nan  # the text tower's layers have fewer heads
    for fig in (
        figures.head_heatmap(z, towers=towers),
        figures.importance_heatmaps({"a": z, "b": -z}, towers=towers),
        figures.member_masks_figure([MemberMask("m", "test", torch.tensor(z > 5))], towers=towers),
    ):
        for trace in fig.data:
            assert list(trace.y) == ["image L0", "image L1", "image L2", "text L0", "text L1"]
            assert trace.customdata[3][1][0] == "L3H1 · text L0H1"
        lines = [s for s in fig.layout.shapes]
        assert len(lines) == len(fig.data) and {s.y0 for s in lines} == {2.5}
        to_matplotlib(fig)  # the line is drawn in the downloads too
    masks = figures.member_masks_figure(
        [MemberMask("m", "test", torch.tensor(z > 5))], towers=towers, num_heads=(4, 4, 4, 2, 2)
    )
    cells = np.array(masks.data[0].z, dtype=float)
    assert np.isnan(cells[3:, 2:]).all() and not np.isnan(cells[:3]).any()  # absent: blank
    assert masks.layout.yaxis.showticklabels is not False  # the first map names the rows
    many = figures.importance_heatmaps({"a": z, "b": -z}, towers=towers)
    assert many.layout.yaxis2.showticklabels is False  # the next maps' rows are the same
    plain = figures.head_heatmap(z)  # a model of one transformer: as before
    assert list(plain.data[0].y) == [f"L{i}" for i in range(5)] and not plain.layout.shapes
    assert plain.data[0].customdata[3][1][0] == "L3H1"
    image_only = figures.head_heatmap(z[:3], towers=(("image", 3),))
    assert list(image_only.data[0].y) == ["L0", "L1", "L2"] and not image_only.layout.shapes
