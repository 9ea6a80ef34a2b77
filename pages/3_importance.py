"""Head importance: single-head ablation, Taylor and greedy rank side by side; how they agree."""

import streamlit as st

from hydra_core.analysis.importance import importance_maps
from hydra_core.models.adapter import head_layout
from hydra_ui.analyses import attribution, search_data, single_head, stored_greedy_runs, taylor
from hydra_ui.context import get_context, results
from hydra_ui.figures import importance_heatmaps, matrix_heatmap
from hydra_ui.widgets import (
    figure_with_download,
    head_map_with_download,
    show_error,
    table_with_download,
)

st.title("Head importance")
st.caption(
    "Four ways to say which heads matter, each turned so that **higher = more important**: "
    "the drop in ID accuracy and in OOD AUROC when the head alone is ablated (zeroed at the "
    "input of W_O), the Taylor score (mean |W ⊙ ∂L/∂W| over the head's Q/K/V rows, paper "
    "D.1.1), and the greedy search's removal step (heads removed later matter more; the heads "
    "it kept tie as the most important). Colours show each head's rank within its criterion, "
    "so the maps share one scale; hover a head for its values."
)

with show_error("Could not compute head importance"):
    context = get_context()
    inputs = search_data(context)
    key = context.config.key
    stored = stored_greedy_runs(context, inputs)
    c1, c2 = st.columns(2)
    n_taylor = int(
        c1.number_input(
            f"Taylor: ID search {context.noun}",
            8,
            len(inputs.id_x),
            min(512, len(inputs.id_x)),
            help=f"Gradients of the mean cross-entropy over these {context.noun}",
        )
    )
    greedy = c2.selectbox(
        "Greedy rank from the saved search",
        list(stored) or ["(none saved yet)"],
        disabled=not stored,
        help="Run one on the Headmap search page",
    )
    estimate = st.checkbox(
        "Attribution estimate (AtP) beside the exact ablation",
        help="Each head's Δaccuracy and ΔAUROC estimated to first order from one forward and a "
        "few backward passes (attribution patching), with its rank agreement to the exact "
        "single-head ablation: where it agrees, the cheap map can stand in for the exact one "
        "(and guide the search, Candidates per step on the Headmap page)",
    )
    if st.button("Compute importance maps", type="primary", icon=":material/calculate:"):
        results()["importance"] = True
    if not results().get("importance"):
        st.info(
            "Single-head ablation costs one greedy step; Taylor one backward pass per batch. "
            "Both are cached after the first time."
        )
        st.stop()

    found = importance_maps(
        single_head(key, context, inputs),
        taylor(key, n_taylor, context, inputs),
        stored.get(greedy),
        attribution(key, context, inputs) if estimate else None,
    )
    st.caption(
        f"Dense model on the search split: accuracy {found.base_accuracy:.4f}, "
        f"AUROC {found.base_auroc:.4f}."
    )
    towers = head_layout(context.loaded.model).towers
    head_map_with_download(
        importance_heatmaps(found.maps, raw=found.raw, towers=towers), "head_importance"
    )

    if estimate:
        agreement = found.attribution_agreement()
        st.subheader("Where the attribution estimate can be trusted")
        st.caption(
            "Spearman ρ between the estimated and the exact single-head maps over the heads, and "
            "how many of the exact map's 10 most important heads the estimate's 10 hold. "
            "Near 1: the estimate ranks the heads as ablation does; low: use the exact maps."
        )
        table_with_download(agreement, "attribution_agreement.csv", float_format="{:.3f}")

    left, right = st.columns([3, 2])
    with right:
        st.subheader("Rank agreement")
        correlations = found.spearman()
        figure_with_download(
            matrix_heatmap(
                correlations,
                title="Spearman ρ between criteria",
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
        # 4 significant digits: a text model's Taylor scores are of the order of 1e-6
        table_with_download(found.per_head(), "head_importance.csv", float_format="{:.4g}")
