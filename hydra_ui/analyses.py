"""The analyses the pages show, cached: once per setup in memory (``st.cache_data`` /
``st.cache_resource``, keyed by the setup's key; unhashable arguments start with ``_``) and, where
hydra_core offers it, on disk (the :class:`DiskCache`), so nothing is computed twice.

Each function takes the page's :class:`~hydra_ui.context.Context`; the work itself is hydra_core's.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import streamlit as st
import torch

from hydra_core.analysis.greedy import GreedyResult, saved_searches, single_head_importance
from hydra_core.analysis.inputs import ReportSample, SearchInputs, report_sample, search_inputs
from hydra_core.analysis.representations import (
    centroid_distances,
    distance_table_dense_vs_circuit,
    head_cls_features,
    project_features,
)
from hydra_core.analysis.taylor import taylor_scores
from hydra_ui.context import Context, disk_cache
from hydra_ui.jobs import format_seconds
from hydra_ui.projections import report_sample_images
from hydra_ui.texts import report_sample_texts


@st.cache_resource(show_spinner="Preparing the search split...", max_entries=4)
def _search_inputs(setup_key: str, _context: Context) -> SearchInputs:
    return search_inputs(_context.loaded.preprocess, _context.benchmark).to(_context.device)


def search_data(context: Context) -> SearchInputs:
    """The preprocessed search data (ID with labels, the search-role OOD sets pooled and each on
    its own) on the device: what head selection sees."""
    return _search_inputs(context.config.key, context)


@st.cache_resource(show_spinner="Preparing a sample of the report data...", max_entries=4)
def _report_sample(setup_key: str, _context: Context) -> ReportSample:
    return report_sample(_context.loaded.preprocess, _context.benchmark).to(_context.device)


def report_data(context: Context) -> ReportSample:
    """A fixed sample of the report data (ID and each report-role OOD set, at most
    :data:`~hydra_core.analysis.inputs.REPORT_SAMPLE` images each) on the device: what the views
    that describe the reported distributions show."""
    return _report_sample(context.config.key, context)


def describe_search(context: Context, inputs: SearchInputs) -> str:
    """What the search data holds, in the model's own words ("images" or "sentences")."""
    sets = ", ".join(inputs.ood_per_set)
    return f"{len(inputs.id_x)} ID + {len(inputs.ood_x)} OOD search {context.noun} ({sets})"


def describe_report(context: Context, sample: ReportSample) -> str:
    """What the report sample holds, in the model's own words."""
    sets = ", ".join(f"{len(x)} {name}" for name, x in sample.ood_per_set.items())
    return f"{len(sample.id_x)} ID report {context.noun} and OOD report {context.noun} ({sets})"


@st.cache_resource(show_spinner=False, max_entries=4)
def _report_texts(setup_key: str, _context: Context) -> dict[str, tuple[str, ...]]:
    return report_sample_texts(_context.benchmark)


def report_texts(context: Context) -> dict[str, tuple[str, ...]]:
    """A text model's report sample as texts ("ID" and each report OOD set), in the order of
    :func:`report_data`'s tensors."""
    return _report_texts(context.config.key, context)


@st.cache_resource(show_spinner=False, max_entries=4)
def _report_images(setup_key: str, _context: Context) -> dict[str, torch.Tensor]:
    return report_sample_images(_context.benchmark)


def report_images(context: Context) -> dict[str, torch.Tensor]:
    """An image model's report sample as pictures (uint8; "ID" and each report OOD set), in the
    order of :func:`report_data`'s tensors."""
    return _report_images(context.config.key, context)


def stored_greedy_runs(
    context: Context, inputs: SearchInputs, ood_aggregate: str = "pooled"
) -> dict[str, GreedyResult]:
    """The greedy searches saved in the disk cache for this model and search split, by objective
    (finished or interrupted; read fresh each time, since a running search extends them), for
    one way of combining the OOD search sets (``ood_aggregate``)."""
    model = context.loaded.model
    return saved_searches(
        model,
        inputs.id_x,
        inputs.id_y,
        inputs.ood_x,
        disk_cache(),
        ood_sets=inputs.ood_sets,
        ood_aggregate=ood_aggregate,
    )


@st.cache_data(show_spinner=False, max_entries=4)
def single_head(setup_key: str, _context: Context, _inputs: SearchInputs) -> dict:
    """Single-head Δaccuracy / ΔAUROC maps (L, H) as numpy, and the dense scores; a progress bar
    while the heads are ablated (a cached result shows none)."""
    bar = st.empty()
    start = time.monotonic()

    def progress(done: int, total: int) -> None:
        seconds = time.monotonic() - start
        left = seconds * (total - done) / done if done else None
        bar.progress(
            done / total,
            text=f"Ablating every head on its own: {done} of {total} heads · "
            f"{format_seconds(left)} left · {seconds:.0f} s so far",
        )

    found = single_head_importance(
        _context.loaded.model,
        _inputs.id_x,
        _inputs.id_y,
        _inputs.ood_x,
        cache=disk_cache(),
        progress=progress,
    )
    bar.empty()
    return {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in found.items()}


@st.cache_data(
    show_spinner="Estimating every head's ablation (one forward and a few backward passes)...",
    max_entries=4,
)
def attribution(setup_key: str, _context: Context, _inputs: SearchInputs) -> dict:
    """Attribution estimates of the single-head Δaccuracy / ΔAUROC maps (L, H), as numpy."""
    from hydra_core.analysis.attribution import attribution_importance

    found = attribution_importance(
        _context.loaded.model, _inputs.id_x, _inputs.id_y, _inputs.ood_x, cache=disk_cache()
    )
    return {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in found.items()}


@st.cache_data(
    show_spinner="Computing Taylor scores (one backward pass per batch)...", max_entries=8
)
def taylor(setup_key: str, n_samples: int, _context: Context, _inputs: SearchInputs) -> np.ndarray:
    """Taylor importance (L, H) on the first ``n_samples`` ID search images."""
    x, y = _inputs.id_x[:n_samples], _inputs.id_y[:n_samples]
    return taylor_scores(_context.loaded.model, x, y, cache=disk_cache()).double().numpy()


@st.cache_resource(show_spinner="Reading every head's CLS output...", max_entries=4)
def _features(setup_key: str, _context: Context, _sample: ReportSample) -> dict[str, torch.Tensor]:
    model = _context.loaded.model
    feats = {"ID": head_cls_features(model, _sample.id_x)}  # (N, L, H, d_k)
    feats.update({name: head_cls_features(model, x) for name, x in _sample.ood_per_set.items()})
    return feats


def features(context: Context, sample: ReportSample) -> dict[str, torch.Tensor]:
    """Per-head CLS features (N, L, H, d_k) of the ID report sample and of each report OOD set."""
    return _features(context.config.key, context, sample)


@st.cache_data(show_spinner="Centroid distances...", max_entries=4)
def distances(setup_key: str, _feats: dict[str, torch.Tensor]) -> pd.DataFrame:
    """Per OOD set and head: Euclidean and Mahalanobis distance between ID and OOD centroids."""
    tables = [
        centroid_distances(_feats["ID"], feats).assign(ood_set=name)
        for name, feats in _feats.items()
        if name != "ID"
    ]
    return pd.concat(tables, ignore_index=True)


@st.cache_data(show_spinner=False, max_entries=32)
def projection(
    setup_key: str,
    heads: tuple[tuple[int, int], ...],
    sets: tuple[str, ...],
    method: str,
    _feats: dict[str, torch.Tensor],
) -> pd.DataFrame:
    """2-D PCA/UMAP of the chosen heads' features, ID and the chosen OOD sets together."""
    return project_features(
        _feats["ID"], {s: _feats[s] for s in sets}, heads=list(heads), method=method
    )


@st.cache_data(show_spinner="Comparing the circuit with the dense model...", max_entries=16)
def dense_vs_circuit(
    setup_key: str,
    keep_key: str,
    layer: int,
    _keep: torch.Tensor,
    _context: Context,
    _sample: ReportSample,
) -> pd.DataFrame:
    """The paper's Table 5 for the circuit ``_keep`` at ``layer`` (``keep_key`` identifies it), on
    the report sample."""
    return distance_table_dense_vs_circuit(
        _context.loaded.model, _keep, _sample.id_x, _sample.ood_per_set, layer=layer
    )
