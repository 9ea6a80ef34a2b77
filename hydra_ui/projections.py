"""The representation scatter: each report sample's point in a 2-D projection of chosen heads'
outputs, one colour per set (ID blue), what the point is on hover.

- :func:`projection_scatter` and :func:`projection_pair` (paper Figure 4's most vs least
  important heads) are Plotly figures: what a text model's page shows (each point's sentence on
  hover, :func:`hover_text`) and what every PNG/SVG download draws.
- Plotly's hover labels take text only, so an image model's page draws the same points as a
  Vega-Lite chart, :func:`projection_spec`, whose tooltip shows a field named ``image`` as a
  picture (vega-tooltip, which Streamlit's ``st.vega_lite_chart`` uses):
  :func:`report_sample_images` gives the pictures of the report sample in the order of its
  features, and :func:`with_thumbnails` puts one small PNG per point into the projection.

No Streamlit here: figures and specs are built from plain data and checked in tests.
"""

from __future__ import annotations

import base64
import html
import io
import textwrap
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from PIL import Image
from plotly.subplots import make_subplots

from hydra_core.analysis.inputs import REPORT_SAMPLE
from hydra_core.data.benchmark import Benchmark
from hydra_core.data.images import take
from hydra_ui.figures import ID_COLOUR, OOD_COLOURS

HOVER_CHARS = 160  # a hover label shows at most this many characters of a text
HOVER_WIDTH = 60  # characters per line of a hover label


def hover_text(text: str, limit: int = HOVER_CHARS, width: int = HOVER_WIDTH) -> str:
    """``text`` for a Plotly hover label: cut to ``limit`` characters (ending in an ellipsis),
    HTML-escaped (Plotly reads labels as HTML) and broken into lines of ``width``."""
    short = text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
    return "<br>".join(html.escape(line, quote=False) for line in textwrap.wrap(short, width))


def set_colours(sets: Sequence[str]) -> dict[str, str]:
    """One colour per set: ID blue, the OOD sets in :data:`OOD_COLOURS` order."""
    others = [s for s in sets if s != "ID"]
    colours = {"ID": ID_COLOUR}
    colours.update({s: OOD_COLOURS[i % len(OOD_COLOURS)] for i, s in enumerate(others)})
    return colours


def _scatter_traces(
    frame: pd.DataFrame, colours: Mapping[str, str], showlegend: bool
) -> list[go.Scatter]:
    traces = []
    for name, part in frame.groupby("set", sort=False):
        # a text model's projection carries each sample's text: the hover label shows it
        texts = [hover_text(t) for t in part["text"]] if "text" in part else None
        traces.append(
            go.Scatter(
                x=part["x"],
                y=part["y"],
                mode="markers",
                name=str(name),
                legendgroup=str(name),
                showlegend=showlegend,
                marker={"color": colours[name], "size": 5, "opacity": 0.6},
                customdata=texts,
                hovertemplate=f"<b>{name}</b>"
                + ("<br>%{customdata}" if texts else "")
                + "<extra></extra>",
            )
        )
    return traces


def projection_scatter(frame: pd.DataFrame, *, title: str = "", method: str = "PCA") -> go.Figure:
    """2-D projection of per-head features (columns x, y, set), one colour per set, ID first; a
    ``text`` column (a text model's samples) is shown on hover."""
    colours = set_colours(list(dict.fromkeys(frame["set"])))
    fig = go.Figure(_scatter_traces(frame, colours, True))
    fig.update_layout(
        title=title,
        height=460,
        xaxis_title=f"{method} 1",
        yaxis_title=f"{method} 2",
        margin=dict(l=50, r=20, t=60, b=40),
    )
    return fig


def projection_pair(
    left: pd.DataFrame,
    right: pd.DataFrame,
    *,
    titles: tuple[str, str],
    method: str = "PCA",
    title: str = "",
) -> go.Figure:
    """Two projections side by side with the same set colours (paper Figure 4: most vs least
    important heads)."""
    sets = list(dict.fromkeys([*left["set"], *right["set"]]))
    colours = set_colours(sets)
    fig = make_subplots(rows=1, cols=2, subplot_titles=titles, horizontal_spacing=0.08)
    for col, frame in ((1, left), (2, right)):
        for trace in _scatter_traces(frame, colours, showlegend=col == 1):
            fig.add_trace(trace, row=1, col=col)
        fig.update_xaxes(title_text=f"{method} 1", row=1, col=col)
        fig.update_yaxes(title_text=f"{method} 2", row=1, col=col)
    fig.update_layout(title=title, height=460, margin=dict(l=50, r=20, t=80, b=40))
    return fig


# --- image points: thumbnails on hover ------------------------------------------------------


#: the longest side of a thumbnail in pixels (smaller images keep their size: the tooltip
#: scales them up, see :data:`TOOLTIP_CSS`)
THUMBNAIL = 64
#: the tooltip's picture at three times a 28 px image's size, its pixels kept sharp
TOOLTIP_CSS = (
    "<style>#vg-tooltip-element img {width: 84px; height: auto; "
    "image-rendering: pixelated;}</style>"
)


def report_sample_images(
    benchmark: Benchmark, n: int | None = REPORT_SAMPLE
) -> dict[str, torch.Tensor]:
    """The images (uint8, (N, C, H, W)) of :func:`~hydra_core.analysis.inputs.report_sample`
    (same ``n``), in its order: ``"ID"`` for the ID report part, then each report OOD set."""
    images = {"ID": take(benchmark.id_report, n, purpose="describe").inputs}
    images.update({s.name: take(s, n, purpose="describe").inputs for s in benchmark.ood_report})
    return images


def thumbnail(image: torch.Tensor) -> str:
    """One uint8 image (C, H, W), C = 1 or 3, as a PNG data URL, its longest side at most
    :data:`THUMBNAIL` pixels."""
    array = image.detach().cpu().numpy()
    if array.dtype != np.uint8:
        raise ValueError(f"thumbnails are made from uint8 images, got {array.dtype}")
    picture = Image.fromarray(array[0] if array.shape[0] == 1 else array.transpose(1, 2, 0))
    if max(picture.size) > THUMBNAIL:
        picture.thumbnail((THUMBNAIL, THUMBNAIL))
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def with_thumbnails(
    frame: pd.DataFrame, images: dict[str, torch.Tensor], sets: Sequence[str]
) -> pd.DataFrame:
    """A projection of the report sample (rows: ID, then each of ``sets``, as
    :func:`~hydra_core.analysis.representations.project_features` orders them) with each row's
    picture as a PNG data URL in an ``image`` column."""
    ordered = [image for name in ("ID", *sets) for image in images[name]]
    if len(ordered) != len(frame):
        raise ValueError(
            f"the projection has {len(frame)} rows but ID and {', '.join(sets)} have "
            f"{len(ordered)} images: it was made from another sample"
        )
    return frame.assign(image=[thumbnail(image) for image in ordered])


#: a click on a set in the legend shows that set alone (shift-click: several)
LEGEND_TOGGLE = {"name": "shown", "select": {"type": "point", "fields": ["set"]}, "bind": "legend"}


#: the width of each of several projections side by side (two, their axes and spacing fit the
#: main column of a 1,400-pixel window, about 930 pixels)
PANEL_WIDTH = 340


def projection_spec(
    panels: Sequence[tuple[str, pd.DataFrame]], *, method: str = "PCA", title: str = ""
) -> dict:
    """A Vega-Lite scatter of one or more projections side by side (columns x, y, set and
    ``image``), one colour per set as in :func:`~hydra_ui.figures.projection_scatter`, the
    point's set and picture on hover; the legend toggles sets, the mouse wheel zooms."""
    sets = list(dict.fromkeys(s for _, frame in panels for s in frame["set"]))
    colours = set_colours(sets)
    colour = {
        "field": "set",
        "type": "nominal",
        "scale": {"domain": sets, "range": [colours[s] for s in sets]},
        # side by side, the legend goes below: two panels and a legend on the right were wider
        # than the page (the right panel was cut off)
        "legend": {"title": "set", "orient": "right" if len(panels) == 1 else "bottom"},
    }
    tooltip = [{"field": "set", "type": "nominal"}]
    if all("image" in frame for _, frame in panels):
        tooltip.append({"field": "image", "type": "nominal"})

    def panel(index: int, name: str, frame: pd.DataFrame) -> dict:
        columns = ["x", "y", "set", *(["image"] if "image" in frame else [])]
        return {
            "title": name,
            "data": {"values": frame[columns].to_dict(orient="records")},
            "mark": {"type": "circle", "size": 28, "opacity": 0.6},
            "params": [
                {"name": f"zoom{index}", "select": "interval", "bind": "scales"},
                *([LEGEND_TOGGLE] if index == 0 else []),  # one legend for all panels
            ],
            "encoding": {
                "x": {"field": "x", "type": "quantitative", "title": f"{method} 1"},
                "y": {"field": "y", "type": "quantitative", "title": f"{method} 2"},
                "color": colour,
                "opacity": {"condition": {"param": "shown", "value": 0.6}, "value": 0.05},
                "tooltip": tooltip,
            },
            "width": "container" if len(panels) == 1 else PANEL_WIDTH,
            "height": 400,
        }

    charts = [panel(i, name, frame) for i, (name, frame) in enumerate(panels)]
    spec = {"$schema": "https://vega.github.io/schema/vega-lite/v5.json", "title": title}
    # svg: every point is an element (the browser test hovers one); thumbnails need no canvas
    spec["usermeta"] = {"embedOptions": {"renderer": "svg"}}
    if len(charts) == 1:
        return {**spec, **charts[0], "title": title or charts[0]["title"]}
    return {**spec, "hconcat": charts, "resolve": {"scale": {"color": "shared"}}}
