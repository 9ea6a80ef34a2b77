"""Plotly figures for the app's pages, built from plain data (arrays, frames, results) and nothing
else: no Streamlit here, so every figure can be checked in a test and rendered anywhere.

Conventions shared by every head map: rows are layers (``L0`` at the top), columns are heads,
hovering a cell names the head (``L3H7``) and lists its values; NaN cells (heads that do not
exist, were never removed, or were not scored) stay blank. A model whose head layout spans towers
(CLIP pruned in both: ``towers`` as :attr:`hydra_core.models.family.HeadLayout.towers` gives
them) has its rows named by tower (``image L3``, ``text L0``), a line between the towers, and
both names in the hover box (``L15H2 · text L3H2``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from scipy.stats import rankdata

#: one colour per system, in order; colour-blind safe (Okabe-Ito)
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
#: marker shapes of the cost scatter, one per system: points at the same place stay apart
SYMBOLS = ("circle", "diamond-open", "square", "x", "triangle-up-open", "star", "cross", "hexagon")
#: ID is blue; the OOD sets take a qualitative palette without blue, cyan or teal (ColorBrewer
#: Set1 less its blue and yellow), so no OOD set can be taken for ID
ID_COLOUR = "#0072B2"
OOD_COLOURS = ("#E41A1C", "#FF7F00", "#4DAF4A", "#984EA3", "#A65628", "#F781BF", "#999999")
#: marks the invisible points that make a head map's cells clickable (left out of downloads)
HEAD_PICKER = "head-picker"
#: kept heads are dark, removed heads light, in every mask picture
MASK_COLOURS = ((0.0, "#f2f2f2"), (0.5, "#f2f2f2"), (0.5, "#1f4e79"), (1.0, "#1f4e79"))


#: a model's towers as its head layout names them: (name, layers), in order; () for one
Towers = Sequence[tuple[str, int]]


def layer_names(layers: int, towers: Towers = ()) -> list[str]:
    """``L0``, ``L1``, ...; with two towers or more ``image L0``, ..., ``text L0``, ...."""
    if len(towers) < 2 or sum(n for _, n in towers) != layers:
        return [f"L{layer}" for layer in range(layers)]
    return [f"{name} L{local}" for name, count in towers for local in range(count)]


def head_labels(shape: tuple[int, int], towers: Towers = ()) -> np.ndarray:
    """(L, H) array of head labels ``L{layer}H{head}`` (with towers, ``L15H2 · text L3H2``)."""
    layers, heads = shape
    names = layer_names(layers, towers)
    return np.array(
        [
            [
                f"L{layer}H{head}" + (f" · {names[layer]}H{head}" if " " in names[layer] else "")
                for head in range(heads)
            ]
            for layer in range(layers)
        ],
        dtype=object,
    )


def _mark_towers(fig: go.Figure, towers: Towers, layers: int, panels: int = 1) -> None:
    """A line between the towers' rows on every map of ``fig``; side by side (``panels``), the
    rows' (longer) names only left of the first map."""
    if " " not in layer_names(layers, towers)[0]:
        return
    for col in range(2, panels + 1):
        fig.update_yaxes(showticklabels=False, row=1, col=col)
    start = 0
    for _, count in list(towers)[:-1]:
        start += count
        fig.add_hline(y=start - 0.5, line={"color": "#d62728", "width": 2}, row="all", col="all")


def _as_map(values) -> np.ndarray:
    array = np.array(values, dtype=np.float64)  # copies: callers' tensors stay untouched
    if array.ndim != 2:
        raise ValueError(f"a head map has shape (layers, heads), got {array.shape}")
    return array


def _fmt(value: float, spec: str) -> str:
    return (
        "–"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else format(value, spec)
    )


def _hover_text(shape: tuple[int, int], lines: Mapping[str, np.ndarray], spec: str) -> np.ndarray:
    """(L, H) strings: one line "name: value" per entry of ``lines`` (numbers or strings)."""
    text = np.empty(shape, dtype=object)
    for index in np.ndindex(shape):
        parts = []
        for name, values in lines.items():
            value = values[index]
            parts.append(f"{name}: {value if isinstance(value, str) else _fmt(float(value), spec)}")
        text[index] = "<br>".join(parts)
    return text


def _heatmap_trace(z: np.ndarray, hover: np.ndarray, towers: Towers = (), **kwargs) -> go.Heatmap:
    layers, heads = z.shape
    custom = np.stack([head_labels(z.shape, towers), hover], axis=-1)  # (L, H, 2)
    return go.Heatmap(
        z=z,
        x=[f"H{h}" for h in range(heads)],
        y=layer_names(layers, towers),
        customdata=custom,
        hovertemplate="<b>%{customdata[0]}</b><br>%{customdata[1]}<extra></extra>",
        hoverongaps=False,
        xgap=1,
        ygap=1,
        **kwargs,
    )


def _map_height(layers: int) -> int:
    return max(280, 140 + 30 * layers)  # room for the colour bar even with few layers


def head_heatmap(
    values,
    *,
    title: str = "",
    value_name: str = "value",
    hover: Mapping[str, np.ndarray] | None = None,
    value_format: str = ".4g",
    colorscale: str | Sequence = "Viridis",
    zmin: float | None = None,
    zmax: float | None = None,
    reverse_scale: bool = False,
    towers: Towers = (),
) -> go.Figure:
    """An (L, H) map as a heatmap, ``L0`` at the top.

    Args:
        values: (L, H) numbers; NaN cells stay blank.
        value_name: what the colour shows (colour bar title, first hover line).
        hover: more (L, H) arrays (numbers or strings) listed in the hover box under their names.
        towers: the model's towers (see the module docstring).
    """
    z = _as_map(values)
    lines = {value_name: z, **(hover or {})}
    fig = go.Figure(
        _heatmap_trace(
            z,
            _hover_text(z.shape, lines, value_format),
            towers,
            colorscale=colorscale,
            zmin=zmin,
            zmax=zmax,
            reversescale=reverse_scale,
            colorbar={"title": {"text": value_name}},
        )
    )
    fig.update_layout(
        title=title, height=_map_height(z.shape[0]), margin=dict(l=50, r=20, t=60, b=40)
    )
    fig.update_yaxes(autorange="reversed", title_text="layer")
    fig.update_xaxes(title_text="head")
    _mark_towers(fig, towers, z.shape[0])
    return fig


def rank_percentile(values) -> np.ndarray:
    """Each finite entry's rank among the finite entries, scaled to [0, 1] (0 = lowest, 1 = highest,
    ties share their mean rank); NaN stays NaN. A single finite entry gets 1."""
    array = np.array(values, dtype=np.float64)
    out = np.full(array.shape, np.nan)
    finite = np.isfinite(array)
    n = int(finite.sum())
    if n:
        ranks = rankdata(array[finite])  # 1..n, ties averaged
        out[finite] = (ranks - 1) / (n - 1) if n > 1 else 1.0
    return out


def importance_heatmaps(
    maps: Mapping[str, np.ndarray],
    *,
    raw: Mapping[str, tuple[str, np.ndarray]] | None = None,
    title: str = "Head importance (colour: rank within each criterion, higher = more important)",
    towers: Towers = (),
) -> go.Figure:
    """Importance maps side by side with one colour meaning: the head's importance rank within its
    criterion, scaled to [0, 1] (:func:`rank_percentile`). Every map must already be oriented
    "higher = more important".

    Args:
        maps: name -> (L, H) importance, higher = more important.
        raw: name -> (what the criterion measures, (L, H) values) shown in the hover box, e.g. the
            signed Δaccuracy behind the "higher = more important" map.
        towers: the model's towers (see the module docstring).
    """
    names = list(maps)
    if not names:
        raise ValueError("no importance maps to show")
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=names, horizontal_spacing=0.04)
    for col, name in enumerate(names, start=1):
        z = _as_map(maps[name])
        finite = np.isfinite(z)
        rank = np.full(z.shape, "–", dtype=object)
        rank[finite] = [
            f"{int(r)} of {int(finite.sum())}" for r in rankdata(-z[finite], method="min")
        ]
        lines = {"rank (1 = most important)": rank}
        if raw and name in raw:
            label, values = raw[name]
            lines[label] = _as_map(values)
        else:
            lines["importance"] = z
        fig.add_trace(
            _heatmap_trace(
                rank_percentile(z),
                _hover_text(z.shape, lines, ".4g"),
                towers,
                coloraxis="coloraxis",
            ),
            row=1,
            col=col,
        )
    fig.update_layout(
        title=title,
        height=_map_height(_as_map(maps[names[0]]).shape[0]) + 20,
        coloraxis={
            "colorscale": "Viridis",
            "cmin": 0,
            "cmax": 1,
            "colorbar": {
                "title": {"text": "importance<br>rank"},
                "tickvals": [0, 1],
                "ticktext": ["least", "most"],
            },
        },
        margin=dict(l=50, r=20, t=80, b=40),
    )
    fig.update_yaxes(autorange="reversed")
    fig.update_yaxes(title_text="layer", row=1, col=1)
    _mark_towers(fig, towers, _as_map(maps[names[0]]).shape[0], len(names))
    return fig


def matrix_heatmap(
    frame: pd.DataFrame,
    *,
    title: str = "",
    value_name: str = "value",
    colorscale: str | Sequence = "RdBu",
    zmin: float | None = None,
    zmax: float | None = None,
    text_format: str = ".2f",
    diverging: bool = False,
) -> go.Figure:
    """A labelled matrix (e.g. Spearman correlations, Jaccard overlap), its values written in.

    ``diverging``: a scale centred at 0, symmetric around it (differences such as circuit minus
    dense), unless ``zmin`` and ``zmax`` are given."""
    z = frame.to_numpy(dtype=np.float64)
    rows, cols = [str(i) for i in frame.index], [str(c) for c in frame.columns]
    if diverging and zmin is None and zmax is None:
        finite = np.abs(z[np.isfinite(z)])
        top = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
        zmin, zmax = -top, top
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=cols,
            y=rows,
            colorscale=colorscale,
            zmin=zmin,
            zmax=zmax,
            zmid=0.0 if diverging else None,
            texttemplate=f"%{{z:{text_format}}}",
            colorbar={"title": {"text": value_name}},
            hovertemplate=f"%{{y}} / %{{x}}<br>{value_name}: %{{z:{text_format}}}<extra></extra>",
        )
    )
    fig.update_layout(
        title=below_toolbar(title),
        height=200 + 40 * len(rows),
        margin=dict(l=60, r=20, t=90, b=40),
    )
    fig.update_yaxes(autorange="reversed")
    return fig


def below_toolbar(title: str) -> dict:
    """A title set below the chart's toolbar (the mode bar, top right), left-aligned, so that a
    long title in a narrow column does not run under it."""
    return {
        "text": title,
        "x": 0.0,
        "xanchor": "left",
        "xref": "container",
        "yref": "container",
        "y": 1.0,
        "yanchor": "top",
        "pad": {"t": 40, "l": 10},
    }


def add_head_picker(fig: go.Figure) -> go.Figure:
    """``fig`` (a head map: heatmaps with head columns ``H…`` and layer rows ``L…``) with an
    invisible point on every cell, carrying the head's label (``L3H7``) in ``customdata[0]``: a
    click on a cell then selects that head (Streamlit's point selection works on scatter points,
    not on heatmap cells). The points repeat the cell's hover label, and downloads leave them
    out."""
    for trace in [t for t in fig.data if t.type == "heatmap"]:
        layers, heads = np.asarray(trace.z).shape
        custom = np.asarray(trace.customdata) if trace.customdata is not None else None
        cells = [(layer, head) for layer in range(layers) for head in range(heads)]
        labels = [f"L{layer}H{head}" for layer, head in cells]
        hover = [custom[layer, head, 1] if custom is not None else "" for layer, head in cells]
        fig.add_trace(
            go.Scatter(
                x=[f"H{head}" for _, head in cells],
                y=[f"L{layer}" for layer, _ in cells],
                mode="markers",
                marker={"size": 14, "opacity": 0, "color": "#000000"},
                customdata=np.stack([labels, hover], axis=-1),
                hovertemplate="<b>%{customdata[0]}</b><br>%{customdata[1]}<extra></extra>",
                showlegend=False,
                name="pick a head",
                meta=HEAD_PICKER,
                xaxis=trace.xaxis,
                yaxis=trace.yaxis,
            )
        )
    return fig


# --- greedy search -------------------------------------------------------------------------------


def removal_step_heatmap(
    result, *, budget: int | None = None, title: str | None = None, towers: Towers = ()
) -> go.Figure:
    """When each head was removed by a greedy search (1 = first); blank = not removed (yet).

    Args:
        result: a :class:`hydra_core.analysis.greedy.GreedyResult` (partial ones too).
        budget: the colour scale's top (default: the result's budget), so that a live search keeps
            its colours while it fills in.
        towers: the model's towers (see the module docstring).
    """
    steps = result.removal_step_map().double().numpy()
    z = np.where(steps >= 0, steps + 1, np.nan)
    after = {"accuracy after": np.full(z.shape, np.nan), "AUROC after": np.full(z.shape, np.nan)}
    for t, (layer, head) in enumerate(result.order):
        after["accuracy after"][layer, head] = result.accuracy[t]
        after["AUROC after"][layer, head] = result.auroc[t]
    top = budget or result.budget or max(result.steps, 1)
    return head_heatmap(
        z,
        title=title or f"Step at which each head was removed ({result.objective}; blank = kept)",
        value_name="removed at step",
        hover=after,
        zmin=1,
        zmax=max(top, 2),
        colorscale="Viridis",
        reverse_scale=True,
        towers=towers,
    )


OBJECTIVE_NAMES = {"acc": "accuracy", "ood": "AUROC", "avg": "(accuracy + AUROC) / 2"}


def greedy_curves(
    runs: Mapping[str, object], *, title: str = "Scores vs heads removed"
) -> go.Figure:
    """Accuracy, AUROC and the objective against the number of heads removed (0 = dense model).

    Args:
        runs: name -> GreedyResult. One run: a colour per metric; several: a colour per run and a
            line style per metric, so runs with other objectives or budgets can be compared.
    """
    fig = go.Figure()
    dashes = {"accuracy": "solid", "AUROC": "dash", "objective": "dot"}
    for i, (name, result) in enumerate(runs.items()):
        x = list(range(result.steps + 1))
        series = {
            "accuracy": [result.base_accuracy, *result.accuracy],
            "AUROC": [result.base_auroc, *result.auroc],
            "objective": [result.base_score, *result.scores],
        }
        if result.objective in ("acc", "ood"):
            series.pop("objective")  # the objective is one of the other two curves
        for j, (metric, y) in enumerate(series.items()):
            single = len(runs) == 1
            colour = PALETTE[j] if single else PALETTE[i % len(PALETTE)]
            label = metric if single else f"{name} · {metric}"
            if metric == "objective":
                label += f" ({OBJECTIVE_NAMES[result.objective]})"
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    name=label,
                    mode="lines+markers" if len(x) < 40 else "lines",
                    line={"color": colour, "dash": "solid" if single else dashes[metric]},
                    marker={"size": 5},
                    hovertemplate=f"{label}<br>heads removed: %{{x}}<br>%{{y:.4f}}<extra></extra>",
                )
            )
    fig.update_layout(
        title=title,
        height=380,
        xaxis_title="heads removed",
        yaxis_title="score",
        legend={"orientation": "h", "y": -0.25},
        margin=dict(l=50, r=20, t=60, b=40),
    )
    return fig


# --- masks ---------------------------------------------------------------------------------------


def member_masks_figure(
    members: Sequence,
    *,
    title: str = "Kept heads per member",
    towers: Towers = (),
    num_heads: Sequence[int] | None = None,
) -> go.Figure:
    """One small L x H grid per member (dark = kept), side by side.

    Args:
        members: objects with ``name`` and ``keep`` ((L, H) bool), e.g. MemberMask.
        towers: the model's towers (see the module docstring).
        num_heads: heads per layer, when layers differ (a text tower's fewer heads): the cells
            of heads a layer does not have stay blank instead of reading "removed".
    """
    if not members:
        raise ValueError("no members to show")
    cols = len(members)
    fig = make_subplots(
        rows=1,
        cols=cols,
        subplot_titles=[f"{m.name} ({int(np.asarray(m.keep).sum())})" for m in members],
        horizontal_spacing=0.02 if cols > 4 else 0.04,
    )
    for col, member in enumerate(members, start=1):
        keep = np.asarray(member.keep, dtype=bool)
        status = np.where(keep, "kept", "removed").astype(object)
        cells = keep.astype(np.float64)
        for layer, n in enumerate(num_heads or ()):
            cells[layer, n:], status[layer, n:] = np.nan, "–"
        fig.add_trace(
            _heatmap_trace(
                cells,
                _hover_text(keep.shape, {member.name: status}, ""),
                towers,
                coloraxis="coloraxis",
            ),
            row=1,
            col=col,
        )
    layers = np.asarray(members[0].keep).shape[0]
    fig.update_layout(
        title=title,
        height=_map_height(layers) + 20,
        coloraxis={"colorscale": MASK_COLOURS, "cmin": 0, "cmax": 1, "showscale": False},
        margin=dict(l=50, r=20, t=80, b=40),
    )
    fig.update_yaxes(autorange="reversed")
    _mark_towers(fig, towers, layers, cols)
    return fig


# --- Hydra evaluation ----------------------------------------------------------------------------


def _diagonal(name: str) -> go.Scatter:
    """The dotted y = x reference line of reliability diagrams and ROC plots."""
    return go.Scatter(
        x=[0, 1],
        y=[0, 1],
        mode="lines",
        name=name,
        line={"color": "#999999", "dash": "dot"},
        hoverinfo="skip",
    )


def wilson_interval(correct: np.ndarray, count: np.ndarray, z: float = 1.959964) -> np.ndarray:
    """The Wilson score interval (95% by default) of a share ``correct / count``, per entry:
    (2, n) lower and upper bounds; NaN where ``count`` is 0. A bin of a reliability diagram
    holding a handful of samples gets a wide interval, not a dot at 0 or 1 that looks certain."""
    k, n = np.asarray(correct, dtype=np.float64), np.asarray(count, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = k / n
        centre = (k + z**2 / 2) / (n + z**2)
        half = z * np.sqrt(share * (1 - share) * n + z**2 / 4) / (n + z**2)
    bounds = np.stack([centre - half, centre + half])
    bounds[:, n == 0] = np.nan
    return np.clip(bounds, 0.0, 1.0)


def reliability_diagram(
    curves: Mapping[str, pd.DataFrame], *, title: str = "Reliability diagram"
) -> go.Figure:
    """Accuracy against confidence per bin for each system, with the diagonal of calibration and
    each bin's 95% Wilson interval; below it, how many samples each bin holds.

    Args:
        curves: system -> frame with columns ``bin_lower``, ``bin_upper``, ``confidence`` (mean
            confidence of the bin), ``accuracy`` (accuracy in the bin) and ``count`` (samples in
            the bin), e.g. :func:`~hydra_core.metrics.reliability_curve`. Empty bins are left
            out of the curve (a line never drops to 0 where there is nothing to measure).
    """
    fig = make_subplots(
        rows=2, cols=1, shared_xaxes=True, row_heights=[0.72, 0.28], vertical_spacing=0.05
    )
    diagonal = _diagonal("perfect calibration")
    fig.add_trace(diagonal, row=1, col=1)
    for i, (name, frame) in enumerate(curves.items()):
        colour = PALETTE[i % len(PALETTE)]
        part = frame[frame["count"] > 0]
        count = part["count"].to_numpy(dtype=np.float64)
        accuracy = part["accuracy"].to_numpy(dtype=np.float64)
        lo, hi = wilson_interval(np.round(accuracy * count), count)
        fig.add_trace(
            go.Scatter(
                x=part["confidence"],
                y=accuracy,
                mode="lines+markers",
                name=name,
                legendgroup=name,
                line={"color": colour},
                marker={"size": 6},
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": hi - accuracy,
                    "arrayminus": accuracy - lo,
                    "thickness": 1,
                    "width": 3,
                    "color": colour,
                },
                customdata=np.stack([count, lo, hi], axis=-1),
                hovertemplate=f"{name}<br>confidence %{{x:.3f}}<br>accuracy %{{y:.3f}} "
                "[%{customdata[1]:.3f}, %{customdata[2]:.3f}]<br>"
                "%{customdata[0]:.0f} samples<extra></extra>",
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Bar(
                x=(frame["bin_lower"] + frame["bin_upper"]) / 2,
                y=frame["count"],
                width=(frame["bin_upper"] - frame["bin_lower"]) * 0.9,
                name=name,
                legendgroup=name,
                showlegend=False,
                marker={"color": colour},
                opacity=0.45,
                hovertemplate=f"{name}<br>confidence %{{x:.2f}} ± bin<br>%{{y}} samples"
                "<extra></extra>",
            ),
            row=2,
            col=1,
        )
    fig.update_layout(
        title=title,
        height=520,
        barmode="overlay",
        margin=dict(l=50, r=20, t=60, b=40),
        legend={"orientation": "h", "y": -0.18},
    )
    fig.update_xaxes(range=[0, 1], row=1, col=1)
    fig.update_xaxes(range=[0, 1], title_text="confidence", row=2, col=1)
    fig.update_yaxes(range=[0, 1.02], title_text="accuracy", row=1, col=1)
    fig.update_yaxes(title_text="samples", row=2, col=1)
    return fig


def roc_curves(
    curves: Mapping[str, pd.DataFrame],
    *,
    title: str = "ROC (OOD = positive)",
    auroc_name: str = "AUROC",
) -> go.Figure:
    """ROC curves (false positive rate vs true positive rate, OOD positive), one per system.

    Args:
        curves: system -> frame with columns ``fpr`` and ``tpr`` (and optionally, in
            ``frame.attrs``, ``auroc`` and its 95% interval ``auroc_ci95`` for the legend).
        auroc_name: what the legend calls the area ("pooled AUROC" for a curve over the items
            of several OOD sets at once, which is not the mean of the sets' AUROCs).
    """
    fig = go.Figure(_diagonal("chance"))
    for i, (name, frame) in enumerate(curves.items()):
        auroc, interval = frame.attrs.get("auroc"), frame.attrs.get("auroc_ci95")
        label = name
        if auroc is not None:
            bounds = f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval is not None else ""
            label = f"{name} ({auroc_name} {auroc:.3f}{bounds})"
        fig.add_trace(
            go.Scatter(
                x=frame["fpr"],
                y=frame["tpr"],
                mode="lines",
                name=label,
                line={"color": PALETTE[i % len(PALETTE)]},
                hovertemplate=f"{name}<br>FPR %{{x:.3f}}<br>TPR %{{y:.3f}}<extra></extra>",
            )
        )
    fig.update_layout(
        title=below_toolbar(title),  # in a half-width column the toolbar covered the title
        height=520,
        xaxis_title="false positive rate (ID flagged OOD)",
        yaxis_title="true positive rate (OOD caught)",
        legend={"orientation": "h", "y": -0.2},  # under the plot: a narrow column keeps its width
        margin=dict(l=50, r=20, t=90, b=40),
    )
    return fig


def _error_bar(frame: pd.DataFrame, column: str) -> dict | None:
    """Plotly error bars from ``<column>_lo`` / ``<column>_hi`` (the tables' interval columns),
    or None when the frame has none. Percentile intervals need not be symmetric."""
    lo, hi = f"{column}_lo", f"{column}_hi"
    if lo not in frame or hi not in frame:
        return None
    value = frame[column].to_numpy(dtype=np.float64)
    return {
        "type": "data",
        "symmetric": False,
        "array": frame[hi].to_numpy(dtype=np.float64) - value,
        "arrayminus": value - frame[lo].to_numpy(dtype=np.float64),
        "thickness": 1.5,
        "width": 4,
    }


def cost_scatter(
    frame: pd.DataFrame,
    *,
    x: str,
    y: str = "auroc",
    x_title: str | None = None,
    y_title: str = "OOD AUROC",
    title: str = "Cost vs OOD AUROC",
    log_x: bool = False,
) -> go.Figure:
    """One labelled point per system: a cost column against a quality column, with the quality's
    95% interval as an error bar when the frame has ``<y>_lo`` and ``<y>_hi`` columns.

    Args:
        frame: one row per system, a ``system`` column plus ``x`` and ``y``.
    """
    fig = go.Figure()
    bounds = [f"{y}_lo", f"{y}_hi"]
    has_interval = all(b in frame for b in bounds)
    interval = " [%{customdata[0]:.4f}, %{customdata[1]:.4f}]" if has_interval else ""
    for i in range(len(frame)):
        row = frame.iloc[i : i + 1]
        name = str(row["system"].item())
        fig.add_trace(
            go.Scatter(
                x=row[x],
                y=row[y],
                error_y=_error_bar(row, y),
                customdata=row[bounds].to_numpy() if has_interval else None,
                mode="markers",  # named in the legend and on hover: labels of close points
                name=name,  # (single and temperature scaling share a cost) overlapped
                cliponaxis=False,  # a point near the edge is drawn whole
                marker={
                    "size": 11,
                    "color": PALETTE[i % len(PALETTE)],
                    "symbol": SYMBOLS[i % len(SYMBOLS)],
                },
                hovertemplate=f"{name}<br>{x_title or x}: %{{x:.4g}}<br>"
                f"{y_title}: %{{y:.4f}}{interval}<extra></extra>",
            )
        )
    fig.update_layout(
        title=title,
        height=480,
        xaxis_title=x_title or x,
        yaxis_title=y_title,
        showlegend=True,
        legend={"orientation": "h", "y": -0.25, "title": {"text": "system"}},
        margin=dict(l=60, r=30, t=60, b=50),
    )
    fig.update_xaxes(type="log" if log_x else "linear", range=_padded(frame[x], log_x, 0.12))
    bounds = [frame[b] for b in (f"{y}_lo", f"{y}_hi") if b in frame]
    fig.update_yaxes(range=_padded(pd.concat([frame[y], *bounds]), False, 0.15))
    return fig


def _padded(values: pd.Series, log: bool, share: float) -> list[float] | None:
    """An axis range around ``values`` with ``share`` of its span added on each side (room for
    the points' labels); on a log axis, in log10 units. None when there is nothing to show."""
    data = np.asarray(values, dtype=np.float64)
    data = data[np.isfinite(data) & ((data > 0) if log else True)]
    if not data.size:
        return None
    if log:
        data = np.log10(data)
    low, high = float(data.min()), float(data.max())
    span = high - low or (abs(high) * 0.1 if high else 1.0)
    return [low - share * span, high + share * span]


#: How a difference whose 95% interval excludes 0, and one whose interval contains it, are drawn.
SIGNIFICANCE_STYLE = {
    True: ("significant (95% interval excludes 0)", {"color": PALETTE[0], "symbol": "circle"}),
    False: (
        "not significant (interval contains 0)",
        {"color": "#999999", "symbol": "circle-open", "line": {"width": 2}},
    ),
}


def difference_plot(
    frame: pd.DataFrame,
    column: str,
    *,
    reference: str = "single",
    metric_title: str | None = None,
    title: str | None = None,
) -> go.Figure:
    """Each system's difference to ``reference`` on one metric, with its paired 95% interval as an
    error bar, and the zero line: a point whose bar crosses 0 is drawn hollow and grey ("not
    significant").

    Args:
        frame: one row per system: ``system``, ``column`` (the difference), ``<column>_lo`` and
            ``<column>_hi`` (e.g. :meth:`~hydra_core.experiment.results.SystemsReport.differences`).
    """
    shown = frame.dropna(subset=[column, f"{column}_lo", f"{column}_hi"])
    if shown.empty:
        raise ValueError(f"no system has a difference on {column!r} to show")
    label = metric_title or column
    systems = [str(s) for s in shown["system"]]
    fig = go.Figure(
        go.Scatter(
            x=systems,  # every system, in order: it fixes the category order of the axis
            y=np.zeros(len(systems)),
            mode="lines",
            name="no difference",
            line={"color": "#555555", "dash": "dot"},
            hoverinfo="skip",
        )
    )
    significant = (shown[f"{column}_lo"] > 0) | (shown[f"{column}_hi"] < 0)
    for flag in (True, False):
        part = shown[significant == flag]
        if part.empty:
            continue
        name, marker = SIGNIFICANCE_STYLE[flag]
        fig.add_trace(
            go.Scatter(
                x=[str(s) for s in part["system"]],
                y=part[column],
                error_y={**_error_bar(part, column), "color": marker["color"]},
                customdata=part[[f"{column}_lo", f"{column}_hi"]].to_numpy(),
                mode="markers",
                name=name,
                marker={"size": 10, **marker},
                hovertemplate=f"%{{x}}<br>{label} − {reference}: %{{y:+.4f}}<br>"
                "95% interval [%{customdata[0]:+.4f}, %{customdata[1]:+.4f}]<extra></extra>",
            )
        )
    fig.update_layout(
        title=title or f"{label}: difference to {reference} (paired 95% bootstrap interval)",
        height=440,
        yaxis_title=f"{label} − {label} of {reference}",
        legend={"orientation": "h", "y": -0.35},
        margin=dict(l=60, r=20, t=60, b=40),
    )
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=systems)
    return fig
