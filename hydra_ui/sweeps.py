"""The committed sweeps of the paper (docs/report/sweeps: heads removed per layer, members,
corruptions; docs/report/sweeps/text: those of the text default), shown on the pages they concern:
the plot, what it shows, the command and its wall time, and the table with its intervals. They
were made on the default model of the loaded model's modality; when another model is loaded, the
section says so."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import streamlit as st

from hydra_core.models.modality import IMAGE_MODALITY, Modality
from hydra_core.outputs import MANIFEST, describe_model, same_model
from hydra_core.paths import REPO_DIR
from hydra_ui.widgets import table_with_download

#: where ``python -m hydra_core sweep --kind K --out docs/report/sweeps/K`` writes (a text
#: model's sweeps: ``--task text --out docs/report/sweeps/text/K``)
SWEEPS_DIR = REPO_DIR / "docs" / "report" / "sweeps"

TITLES = {
    "layers": "Heads removed per layer: Taylor vs CircAvg, zero-shot and fine-tuned (paper B.3)",
    "members": "Number of members M (paper B.6, Table 10)",
    "corruption": "Corrupted ID data at five severities (paper Tables 13-14)",
}
SHOWS = {
    "layers": "Each point removes r heads in every layer (Taylor) or r x layers heads in all "
    "(CircAvg, one greedy search), evaluated as it is and after fine-tuning; the dashed line "
    "and grey band are the unpruned model.",
    "members": "Hydra with M members seed-sampled from the CircAvg ranking (each M's members "
    "are the smaller M's and one more), zero-shot and fine-tuned; latency is relative to the "
    "single model, on the machine that made the sweep.",
    "corruption": "Every corruption's items at a severity pooled (severity 0: the clean "
    "items); the table has each corruption on its own.",
}


def sweep_folder(kind: str, modality: Modality = IMAGE_MODALITY, root: Path | None = None) -> Path:
    """Where the committed sweep ``kind`` of ``modality``'s default model lies below ``root``
    (default :data:`SWEEPS_DIR`): ``<root>/<kind>`` for images, ``<root>/text/<kind>`` for text
    (``Modality.results_folder``)."""
    return (root or SWEEPS_DIR) / modality.results_folder / kind


def committed_sweep(
    kind: str, folder: Path | None = None, modality: Modality = IMAGE_MODALITY
) -> dict | None:
    """A committed sweep: its table, setup (report.json), plot path and manifest; None when
    the folder (:func:`sweep_folder`) does not hold it."""
    where = sweep_folder(kind, modality, folder)
    table, plot = where / f"{kind}.csv", where / f"{kind}.png"
    if not table.is_file() or not plot.is_file():
        return None
    setup = json.loads((where / "report.json").read_text()).get("setup", {})
    manifest = where / MANIFEST
    record = json.loads(manifest.read_text()) if manifest.is_file() else {}
    return {
        "table": pd.read_csv(table),
        "setup": setup,
        "plot": plot,
        "model": record.get("model"),
    }


def show_sweeps(kinds: tuple[str, ...], loaded=None, folder: Path | None = None) -> None:
    """An expander with the committed sweeps ``kinds``; ``loaded`` (the loaded model, or None)
    decides whether to say that they are another model's."""
    modality = IMAGE_MODALITY if loaded is None else loaded.modality
    default = f"default {modality.name} model"
    with st.expander(f"The paper's sweeps on the {default} (committed results)"):
        for kind in kinds:
            found = committed_sweep(kind, folder, modality)
            st.markdown(f"**{TITLES[kind]}**")
            if found is None:
                where = sweep_folder(kind, modality, Path("docs/report/sweeps")).as_posix()
                st.info(
                    f"No committed {kind} sweep of the {default} here: `python -m hydra_core "
                    f"sweep --kind {kind} --task {modality.name} --out {where} --overwrite` "
                    "makes it."
                )
                continue
            made_on = found["setup"].get("task", IMAGE_MODALITY.name)
            if modality != made_on:  # a folder holding another modality's sweep
                st.caption(f"The committed {kind} sweep there is of a {made_on} model: not shown.")
                continue
            if loaded is not None and not same_model(found["model"], loaded.identity()):
                st.caption(
                    f"Made on {describe_model(found['model'] or {})}, not on the loaded model "
                    f"({loaded.name}): these are the default model's numbers."
                )
            st.image(str(found["plot"]))
            setup = found["setup"]
            st.caption(
                f"{SHOWS[kind]} 95% stratified-bootstrap intervals. Made with "
                f"`{setup.get('command', '')}` in {setup.get('total_seconds', 0) / 60:.1f} min "
                f"on {setup.get('machine', '?')}."
            )
            table_with_download(found["table"], f"sweep_{kind}.csv", float_format="{:.4g}")
