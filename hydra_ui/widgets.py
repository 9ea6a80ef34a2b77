"""Small Streamlit building blocks shared by the pages: errors as messages, tables with CSV,
figures with PNG/SVG."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from hydra_core.errors import InputError
from hydra_ui.export import figure_png, figure_svg
from hydra_ui.figures import add_head_picker
from hydra_ui.jobs import FAILED, STOPPED, Job, format_seconds


@contextmanager
def show_error(what: str) -> Iterator[None]:
    """Show an exception raised in the block as a message in the page, never as a traceback.

    The details stay one click away for bug reports. Streamlit's own control-flow exceptions
    (rerun, stop) pass through."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - every error becomes a message
        if type(exc).__module__.startswith("streamlit"):
            raise
        st.error(f"{what}: {exc}")
        if isinstance(exc, InputError):
            return  # the message names the input and the fix; a traceback adds nothing
        with st.expander("Details"):
            st.code("".join(traceback.format_exception(exc)), language="text")


def table_with_download(
    rows,
    filename: str,
    *,
    float_format: str | None = None,
    key: str | None = None,
    pinned: tuple[str, ...] = (),
) -> pd.DataFrame:
    """Show a table and a button that downloads it as CSV; ``pinned`` columns stay in view while
    a wide table scrolls sideways."""
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    styled = (
        frame.style.format(float_format, subset=frame.select_dtypes("floating").columns)
        if float_format
        else frame
    )
    config = {c: st.column_config.Column(pinned=True) for c in pinned if c in frame}
    st.dataframe(styled, hide_index=True, width="stretch", column_config=config or None)
    st.download_button(
        "Download CSV",
        frame.to_csv(index=False).encode(),
        file_name=filename,
        mime="text/csv",
        key=key or f"csv-{filename}",
    )
    return frame


def figure_with_download(
    fig: go.Figure,
    filename: str,
    *,
    key: str | None = None,
    on_select: Callable[[], None] | None = None,
) -> None:
    """Show a Plotly figure with buttons that download it as PNG and SVG.

    The files are drawn (with matplotlib) only when a button is clicked, not on every rerun.
    ``filename`` has no extension. ``on_select``: called when a point is clicked (its selection
    is in ``st.session_state[f"fig-{key}"]``)."""
    key = key or filename
    if on_select is None:
        st.plotly_chart(fig, key=f"fig-{key}", config={"displaylogo": False})
    else:
        st.plotly_chart(
            fig,
            key=f"fig-{key}",
            config={"displaylogo": False},
            on_select=on_select,
            selection_mode="points",
        )
    downloads(fig, filename, key)


def vega_with_download(spec: dict, fig: go.Figure, filename: str, *, key: str) -> None:
    """Show a Vega-Lite chart (what Plotly cannot draw, such as pictures on hover) with the PNG
    and SVG buttons of ``fig``, the same data as a Plotly figure."""
    st.vega_lite_chart(spec, key=f"vega-{key}", width="stretch")
    downloads(fig, filename, key)


#: the session-state key of the head last clicked on a head map
PICKED_HEAD = "picked_head"


def head_map_with_download(fig: go.Figure, filename: str, *, key: str | None = None) -> None:
    """A head map (:func:`figure_with_download`) on which a click picks a head: it becomes
    :data:`PICKED_HEAD`, the head the Representations page shows (one head)."""
    chart = f"fig-{key or filename}"

    def picked() -> None:
        points = st.session_state[chart]["selection"]["points"]
        labels = [p["customdata"][0] for p in points if p.get("customdata")]
        if labels:
            st.session_state[PICKED_HEAD] = labels[-1]

    figure_with_download(add_head_picker(fig), filename, key=key, on_select=picked)
    head = st.session_state.get(PICKED_HEAD)
    st.caption(
        "Click a head on any head map to see it on its own on the Representations page"
        + (f" (picked: **{head}**)." if head else ".")
    )


def downloads(fig: go.Figure, filename: str, key: str) -> None:
    """The PNG and SVG buttons of a figure (drawn with matplotlib only when clicked)."""
    left, right, _ = st.columns([1, 1, 6])
    left.download_button(
        "PNG",
        lambda: figure_png(fig),
        file_name=f"{filename}.png",
        mime="image/png",
        key=f"png-{key}",
        icon=":material/download:",
        on_click="ignore",
    )
    right.download_button(
        "SVG",
        lambda: figure_svg(fig),
        file_name=f"{filename}.svg",
        mime="image/svg+xml",
        key=f"svg-{key}",
        icon=":material/download:",
        on_click="ignore",
    )


def watch_job(job: Job, describe: Callable[[Job], str], *, left: str = "left") -> None:
    """While ``job`` runs: a progress bar with the time left (``left`` says of what) and the
    time so far, and a Stop button, redrawn every second without rerunning the page; when it
    ends, the whole page reruns to show the result."""

    @st.fragment(run_every=1.0)
    def view() -> None:
        if not job.running:
            st.rerun()
        eta = format_seconds(job.eta_seconds())
        st.progress(
            job.fraction(),
            text=f"{describe(job)} · {eta} {left} · {job.elapsed():.0f} s so far",
        )
        if st.button("Stop", icon=":material/stop:", key=f"stop-{job.name}", disabled=job.stopping):
            job.stop()
        if job.stopping:
            st.info("Stopping...")

    view()


def job_outcome(job: Job | None, what: str) -> None:
    """A message for a job that failed or was stopped (nothing while it runs or after success)."""
    if job is None or job.running:
        return
    if job.status == FAILED:
        st.error(f"{what} failed: {job.error}")
    elif job.status == STOPPED:
        st.warning(f"{what} was stopped.")
