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
    rows, filename: str, *, float_format: str | None = None, key: str | None = None
) -> pd.DataFrame:
    """Show a table and a button that downloads it as CSV."""
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    styled = (
        frame.style.format(float_format, subset=frame.select_dtypes("floating").columns)
        if float_format
        else frame
    )
    st.dataframe(styled, hide_index=True, width="stretch")
    st.download_button(
        "Download CSV",
        frame.to_csv(index=False).encode(),
        file_name=filename,
        mime="text/csv",
        key=key or f"csv-{filename}",
    )
    return frame


def figure_with_download(fig: go.Figure, filename: str, *, key: str | None = None) -> None:
    """Show a Plotly figure with buttons that download it as PNG and SVG.

    The files are drawn (with matplotlib) only when a button is clicked, not on every rerun.
    ``filename`` has no extension."""
    key = key or filename
    st.plotly_chart(fig, key=f"fig-{key}", config={"displaylogo": False})
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


def watch_job(job: Job, describe: Callable[[Job], str]) -> None:
    """While ``job`` runs: a progress bar with the time left and a Stop button, redrawn every
    second without rerunning the page; when it ends, the whole page reruns to show the result."""

    @st.fragment(run_every=1.0)
    def view() -> None:
        if not job.running:
            st.rerun()
        st.progress(
            job.fraction(), text=f"{describe(job)} · {format_seconds(job.eta_seconds())} left"
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
