"""PNG and SVG files of the app's Plotly figures, drawn with matplotlib from the figures' own data.

Plotly's static export needs kaleido and a browser; matplotlib needs neither. :func:`to_matplotlib`
redraws what the app's figures use - heatmaps (with shared colour axes and cell text), line and
marker scatters, subplot grids, titles, axis titles, log and reversed axes - so a downloaded
picture shows the same numbers as the interactive one, in a plainer style.
"""

from __future__ import annotations

import io
import math
import re

import numpy as np
import plotly.graph_objects as go
from matplotlib.colors import LinearSegmentedColormap, to_rgba
from matplotlib.figure import Figure

from hydra_ui.figures import HEAD_PICKER

DPI = 100
_TAG = re.compile(r"<[^>]+>")
_RGB = re.compile(r"rgba?\(([^)]*)\)")
_DASHES = {"solid": "-", "dash": "--", "dot": ":", "dashdot": "-.", "longdash": "--"}


def _plain(text: str | None) -> str:
    """Plotly's HTML-ish labels (``<br>``, ``<b>``) as plain text."""
    return _TAG.sub("", (text or "").replace("<br>", "\n"))


def _colour(value) -> tuple[float, float, float, float]:
    """A Plotly colour (``#hex``, ``rgb(..)``, ``rgba(..)`` or a CSS name) as an RGBA tuple."""
    match = _RGB.fullmatch(str(value).strip())
    if match:
        parts = [float(p) for p in match.group(1).split(",")]
        rgb = [p / 255 for p in parts[:3]]
        return (*rgb, parts[3] if len(parts) > 3 else 1.0)
    return to_rgba(value)


def _colormap(colorscale, reverse: bool = False) -> LinearSegmentedColormap:
    if isinstance(colorscale, str):
        colorscale = go.Heatmap(colorscale=colorscale).colorscale  # resolve a named scale
    stops = [(float(pos), _colour(c)) for pos, c in colorscale]
    if reverse:
        stops = [(1 - pos, c) for pos, c in reversed(stops)]
    return LinearSegmentedColormap.from_list("plotly", stops)


def _axis_name(ref: str | None, letter: str) -> str:
    """Trace axis reference ``x2`` -> layout key ``xaxis2``."""
    ref = ref or letter
    return f"{letter}axis{ref[1:]}"


def _domain(axis) -> tuple[float, float]:
    return tuple(axis.domain) if axis is not None and axis.domain is not None else (0.0, 1.0)


class _Canvas:
    """Maps Plotly's paper coordinates (subplot domains) onto a matplotlib figure."""

    LEFT, RIGHT, BOTTOM, TOP = 0.08, 0.90, 0.16, 0.86

    def __init__(self, fig: go.Figure) -> None:
        layout = fig.layout
        width, height = layout.width or 1000, layout.height or 450
        self.layout = layout
        self.figure = Figure(figsize=(width / DPI, max(height, 300) / DPI), dpi=DPI)
        self.axes: dict[tuple[str, str], object] = {}
        self.colorbars: set = set()  # colour axes (or traces) whose bar is drawn

    def paper(self, x: float, y: float) -> tuple[float, float]:
        return (
            self.LEFT + x * (self.RIGHT - self.LEFT),
            self.BOTTOM + y * (self.TOP - self.BOTTOM),
        )

    def axes_for(self, trace):
        key = (_axis_name(trace.xaxis, "x"), _axis_name(trace.yaxis, "y"))
        if key not in self.axes:
            xaxis, yaxis = self.layout[key[0]], self.layout[key[1]]
            (x0, x1), (y0, y1) = _domain(xaxis), _domain(yaxis)
            left, bottom = self.paper(x0, y0)
            right, top = self.paper(x1, y1)
            ax = self.figure.add_axes((left, bottom, right - left, top - bottom))
            ax.set_xlabel(_plain(xaxis.title.text))
            ax.set_ylabel(_plain(yaxis.title.text))
            if xaxis.type == "log":
                ax.set_xscale("log")
            if yaxis.type == "log":
                ax.set_yscale("log")
            if xaxis.range is not None:
                ax.set_xlim(*xaxis.range)
            if yaxis.range is not None:
                ax.set_ylim(*yaxis.range)
            self.axes[key] = ax
        return self.axes[key], self.layout[key[1]]


def _cell_format(template: str | None) -> str | None:
    """``"%{z:.2f}"`` -> ``".2f"``; other templates are not drawn."""
    match = re.fullmatch(r"%\{z(?::([^}]*))?\}", template or "")
    return None if match is None else (match.group(1) or "")


def _draw_heatmap(canvas: _Canvas, trace) -> None:
    ax, yaxis = canvas.axes_for(trace)
    z = np.array(trace.z, dtype=np.float64)
    rows, cols = z.shape
    colorscale, zmin, zmax, reverse, bar = (
        trace.colorscale,
        trace.zmin,
        trace.zmax,
        trace.reversescale,
        True,
    )
    if trace.coloraxis:
        shared = canvas.layout[trace.coloraxis]
        colorscale, zmin, zmax = shared.colorscale, shared.cmin, shared.cmax
        reverse, bar = bool(shared.reversescale), shared.showscale is not False
    finite = z[np.isfinite(z)]
    zmin = zmin if zmin is not None else (finite.min() if finite.size else 0.0)
    zmax = zmax if zmax is not None else (finite.max() if finite.size else 1.0)
    image = ax.imshow(
        np.ma.masked_invalid(z),
        cmap=_colormap(colorscale, bool(reverse)),
        vmin=zmin,
        vmax=zmax,
        aspect="auto",
        interpolation="nearest",
    )
    ax.set_xticks(
        range(cols),
        [str(v) for v in trace.x] if trace.x is not None else range(cols),
        rotation=90 if cols > 8 else 0,
        fontsize=7 if cols > 8 else 9,
    )
    ax.set_yticks(
        range(rows),
        [str(v) for v in trace.y] if trace.y is not None else range(rows),
        fontsize=7 if rows > 8 else 9,
    )
    if yaxis.autorange != "reversed":
        ax.invert_yaxis()  # Plotly draws row 0 at the bottom unless told otherwise
    spec = _cell_format(trace.texttemplate)
    if spec is not None:
        for (r, c), value in np.ndenumerate(z):
            if math.isfinite(value):
                ax.text(
                    c,
                    r,
                    format(value, spec),
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if (value - zmin) < 0.5 * (zmax - zmin) else "black",
                )
    if bar and (trace.coloraxis or trace.showscale is not False):
        key = trace.coloraxis or id(trace)
        if key not in canvas.colorbars:
            height = canvas.TOP - canvas.BOTTOM
            cax = canvas.figure.add_axes((canvas.RIGHT + 0.02, canvas.BOTTOM, 0.015, height))
            canvas.figure.colorbar(image, cax=cax)
            canvas.colorbars.add(key)


def _error(bar, n: int) -> np.ndarray | None:
    """Plotly's ``error_x`` / ``error_y`` (``array``, ``arrayminus``) as matplotlib's (2, n)."""
    if bar is None or bar.array is None or bar.visible is False:
        return None
    plus = np.asarray(bar.array, dtype=np.float64)
    minus = np.asarray(bar.arrayminus if bar.arrayminus is not None else bar.array, np.float64)
    return np.stack([minus, plus])[:, :n]


def _draw_error_bars(ax, trace, x: np.ndarray, y: np.ndarray, kwargs: dict) -> None:
    """The trace's error bars (the 95% intervals), as in the browser."""
    xerr, yerr = _error(trace.error_x, len(x)), _error(trace.error_y, len(y))
    if xerr is not None or yerr is not None:
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="none", elinewidth=0.8, **kwargs)


def _draw_scatter(canvas: _Canvas, trace) -> None:
    ax, _ = canvas.axes_for(trace)
    x = np.asarray(trace.x if trace.x is not None else range(len(trace.y)))
    y = np.asarray(trace.y, dtype=np.float64)
    mode = trace.mode or "lines+markers"
    line_colour = trace.line.color if trace.line is not None else None
    marker_colour = trace.marker.color if trace.marker is not None else None
    colour = line_colour or (marker_colour if isinstance(marker_colour, str) else None)
    label = _plain(trace.name) if trace.showlegend is not False and trace.name else None
    kwargs = {"color": _colour(colour)} if colour else {}
    if "lines" in mode:
        dash = _DASHES.get(trace.line.dash or "solid", "-") if trace.line is not None else "-"
        ax.plot(
            x,
            y,
            linestyle=dash,
            marker="o" if "markers" in mode else None,
            markersize=3,
            label=label,
            **kwargs,
        )
    elif "markers" in mode:
        size = trace.marker.size if trace.marker is not None and trace.marker.size else 6
        opacity = trace.marker.opacity if trace.marker is not None else None
        alpha = 1.0 if opacity is None else float(opacity)
        ax.scatter(x, y, s=float(size) ** 2 / 2, alpha=alpha, label=label, linewidths=0, **kwargs)
    _draw_error_bars(ax, trace, x, y, kwargs)
    if "text" in mode and trace.text is not None:
        texts = [trace.text] * len(x) if isinstance(trace.text, str) else list(trace.text)
        for xi, yi, text in zip(x, y, texts, strict=False):
            ax.annotate(
                str(text),
                (xi, yi),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=8,
            )


def _draw_bar(canvas: _Canvas, trace) -> None:
    """Vertical bars (e.g. the samples per bin under a reliability diagram)."""
    ax, _ = canvas.axes_for(trace)
    x = np.asarray(trace.x, dtype=np.float64)
    width = np.asarray(trace.width, dtype=np.float64) if trace.width is not None else 0.8
    colour = trace.marker.color if trace.marker is not None else None
    kwargs = {"color": _colour(colour)} if isinstance(colour, str) else {}
    alpha = 1.0 if trace.opacity is None else float(trace.opacity)
    ax.bar(x, np.asarray(trace.y, dtype=np.float64), width=width, alpha=alpha, **kwargs)


def to_matplotlib(fig: go.Figure) -> Figure:
    """A matplotlib Figure drawing the data of ``fig`` (heatmaps, scatters and bars, any subplot
    grid); the invisible points that make a head map clickable are left out."""
    canvas = _Canvas(fig)
    for trace in fig.data:
        if trace.meta == HEAD_PICKER:
            continue
        if trace.type == "heatmap":
            _draw_heatmap(canvas, trace)
        elif trace.type == "scatter":
            _draw_scatter(canvas, trace)
        elif trace.type == "bar":
            _draw_bar(canvas, trace)
        else:
            raise ValueError(
                f"cannot draw a Plotly {trace.type!r} trace; only heatmap, scatter and bar"
            )
    for shape in fig.layout.shapes or ():
        # a horizontal line across a map (the line between a model's towers)
        if shape.type == "line" and shape.y0 == shape.y1 and (shape.xref or "").endswith("domain"):
            for (_, yname), ax in canvas.axes.items():
                if yname == _axis_name(shape.yref, "y"):
                    ax.axhline(shape.y0, color=shape.line.color or "black", linewidth=1.5)
    for ax in canvas.axes.values():
        if any(not label.startswith("_") for label in ax.get_legend_handles_labels()[1]):
            ax.legend(fontsize=8, loc="best")
    for note in fig.layout.annotations or ():
        if note.xref == "paper" and note.yref == "paper":  # subplot titles
            x, y = canvas.paper(note.x, note.y)
            canvas.figure.text(
                x, y + 0.01, _plain(note.text), ha="center", va="bottom", fontsize=10
            )
    title = fig.layout.title.text if fig.layout.title is not None else None
    if title:
        canvas.figure.suptitle(_plain(title), fontsize=12)
    return canvas.figure


def _render(fig: go.Figure, fmt: str) -> bytes:
    buffer = io.BytesIO()
    to_matplotlib(fig).savefig(buffer, format=fmt, dpi=DPI * (2 if fmt == "png" else 1))
    return buffer.getvalue()


def figure_png(fig: go.Figure) -> bytes:
    """``fig`` as PNG bytes (200 dpi)."""
    return _render(fig, "png")


def figure_svg(fig: go.Figure) -> bytes:
    """``fig`` as SVG bytes."""
    return _render(fig, "svg")
