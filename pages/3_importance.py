"""Head importance: single-head ablation, Taylor and greedy rank side by side; how they agree."""

import numpy as np
import pandas as pd
import streamlit as st

from hydra_core.analysis.compare import spearman_matrix
from hydra_ui.analyses import search_data, single_head, stored_greedy_runs, taylor
from hydra_ui.context import get_context, results
from hydra_ui.figures import head_labels, importance_heatmaps, matrix_heatmap
from hydra_ui.widgets import figure_with_download, show_error, table_with_download

st.title("Head importance")
st.caption(
    "Four ways to say which heads matter, each turned so that **higher = more important**: "
    "the drop in ID accuracy and in OOD AUROC when the head alone is ablated (zeroed at the "
    "input of W_O), the Taylor score (mean |W ⊙ ∂L/∂W| over the head's Q/K/V rows, paper "
    "D.1.1), and the greedy search's rank (heads removed later matter more). Colours show "
    "each head's rank within its criterion, so the maps share one scale; hover a head for "
    "its values."
)

with show_error("Could not compute head importance"):
    context = get_context()
    inputs = search_data(context)
    key = context.config.key
    stored = stored_greedy_runs(context, inputs)
    c1, c2 = st.columns(2)
    n_taylor = int(
        c1.number_input(
            "Taylor: ID search images",
            8,
            len(inputs.id_x),
            min(512, len(inputs.id_x)),
            help="Gradients of the mean cross-entropy over these images",
        )
    )
    greedy = c2.selectbox(
        "Greedy rank from the saved search",
        list(stored) or ["(none saved yet)"],
        disabled=not stored,
        help="Run one on the Headmap search page",
    )
    if st.button("Compute importance maps", type="primary", icon=":material/calculate:"):
        results()["importance"] = True
    if not results().get("importance"):
        st.info(
            "Single-head ablation costs one greedy step; Taylor one backward pass per batch. "
            "Both are cached after the first time."
        )
        st.stop()

    single = single_head(key, context, inputs)
    taylor_map = taylor(key, n_taylor, context, inputs)
    maps = {
        "Δaccuracy": -single["delta_accuracy"],
        "ΔAUROC": -single["delta_auroc"],
        "Taylor": taylor_map,
    }
    raw = {
        "Δaccuracy": ("accuracy change when ablated", single["delta_accuracy"]),
        "ΔAUROC": ("AUROC change when ablated", single["delta_auroc"]),
        "Taylor": ("Taylor score", taylor_map),
    }
    if stored and greedy in stored:
        run = stored[greedy]
        position = np.full(taylor_map.shape, np.nan)
        for rank, (layer, head) in enumerate(run.ranking()):
            position[layer, head] = rank  # 0 = removed first = least important
        steps = run.removal_step_map().double().numpy()
        name = f"greedy {greedy}"
        maps[name] = position
        raw[name] = ("removed at step (– = kept)", np.where(steps >= 0, steps + 1, np.nan))
    st.caption(
        f"Dense model on the search split: accuracy {single['base_accuracy']:.4f}, "
        f"AUROC {single['base_auroc']:.4f}."
    )
    figure_with_download(importance_heatmaps(maps, raw=raw), "head_importance")

    left, right = st.columns([3, 2])
    with right:
        st.subheader("Rank agreement")
        correlations = spearman_matrix(maps)
        figure_with_download(
            matrix_heatmap(
                correlations,
                title="Spearman correlation between criteria",
                value_name="Spearman ρ",
                zmin=-1,
                zmax=1,
            ),
            "importance_spearman",
        )
        table_with_download(
            correlations.reset_index(names="criterion"),
            "importance_spearman.csv",
            float_format="{:.3f}",
        )
    with left:
        st.subheader("Per head")
        labels = head_labels(taylor_map.shape).ravel()
        table = pd.DataFrame(
            {"head": labels, **{label: values.ravel() for label, values in raw.values()}}
        )
        present = np.isfinite(taylor_map.ravel()) | np.isfinite(single["delta_accuracy"].ravel())
        table_with_download(table[present], "head_importance.csv", float_format="{:.4f}")
