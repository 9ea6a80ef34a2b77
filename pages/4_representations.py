"""Representations: each head's CLS output for ID and OOD samples, projected and compared."""

import numpy as np
import streamlit as st

from hydra_core.analysis.representations import most_and_least_important
from hydra_core.cache import cache_key
from hydra_core.models.adapter import head_label, head_layout, parse_head_label
from hydra_ui.analyses import (
    dense_vs_circuit,
    describe_report,
    distances,
    features,
    projection,
    report_data,
    report_images,
    report_texts,
    search_data,
    stored_greedy_runs,
)
from hydra_ui.context import get_context, results
from hydra_ui.figures import head_heatmap, matrix_heatmap
from hydra_ui.projections import (
    TOOLTIP_CSS,
    projection_pair,
    projection_scatter,
    projection_spec,
    with_thumbnails,
)
from hydra_ui.texts import with_texts
from hydra_ui.widgets import (
    PICKED_HEAD,
    figure_with_download,
    head_map_with_download,
    show_error,
    table_with_download,
    vega_with_download,
)

st.title("Representations")
st.caption(
    "What each head writes: its output Z at the CLS token, before W_O (paper B.2), for a fixed "
    "sample of the report data: the ID report split and the report OOD sets, the distributions "
    "results are reported on (heads are selected on other data: the search sets). Heads whose ID "
    "and OOD outputs lie apart help tell them apart."
)


def project(heads: list[tuple[int, int]], sets: list[str], method: str, what: str):
    """The cached projection, or None while a UMAP has not been asked for (it is slow); a text
    model's carries each sentence, shown on hover."""
    request = (tuple(heads), tuple(sets))
    done = results().setdefault("umap", set())
    if method == "umap" and request not in done:
        if not st.button(
            f"Compute UMAP ({what})", key=f"umap-{what}", icon=":material/scatter_plot:"
        ):
            st.info("UMAP takes a while the first time (its compiler warms up); PCA is instant.")
            return None
    with st.spinner(f"{method.upper()} of {len(heads)} head(s)..."):
        frame = projection(context.config.key, request[0], request[1], method, feats)
    if method == "umap":
        done.add(request)
    if context.loaded.modality.shows_as_text:
        frame = with_texts(frame, report_texts(context), sets)
    else:
        frame = with_thumbnails(frame, report_images(context), sets)
    return frame


def scatter(frames: list[tuple[str, object]], title: str, filename: str, key: str) -> None:
    """The projection(s) with what each point is on hover: a text model's sentence (Plotly), an
    image model's picture (Vega-Lite, as Plotly's hover labels take text only)."""
    if len(frames) == 1:
        fig = projection_scatter(frames[0][1], method=method.upper(), title=title)
    else:
        titles = (frames[0][0], frames[1][0])
        fig = projection_pair(
            frames[0][1], frames[1][1], titles=titles, method=method.upper(), title=title
        )
    if context.loaded.modality.shows_as_text:
        figure_with_download(fig, filename, key=key)
    else:
        st.html(TOOLTIP_CSS)  # the pictures on hover at three times their size, pixels sharp
        spec = projection_spec(frames, method=method.upper(), title=title)
        vega_with_download(spec, fig, filename, key=key)


with show_error("Could not compute the representations"):
    context = get_context()
    sample = report_data(context)
    layout = head_layout(context.loaded.model)
    feats = features(context, sample)
    key = context.config.key
    ood_names = list(sample.ood_per_set)
    what = "read its sentence" if context.loaded.modality.shows_as_text else "see its image"
    st.caption(f"Shown: {describe_report(context, sample)}. Hover a point to {what}.")
    if note := context.benchmark.protocol_note():
        st.warning(note)
    readable = layout.input_layers  # with CLIP's towers: the image tower's (text heads see prompts)
    last = readable[-1]
    c1, c2 = st.columns([3, 1])
    sets = c1.multiselect("OOD sets shown", ood_names, default=ood_names)
    method = c2.radio("Projection", ["pca", "umap"], format_func=str.upper, horizontal=True)

    tabs = st.tabs(
        ["Chosen heads", "Most vs least important", "Centroid distances", "Dense vs circuit"]
    )
    with tabs[0]:
        every = [head_label(layer, h) for layer in readable for h in range(layout.num_heads[layer])]
        several = st.radio(
            "Heads shown",
            ["one head", "several heads (their features concatenated)"],
            horizontal=True,
        ).startswith("several")
        if several:
            layers = st.multiselect(
                "Layers",
                readable,
                default=[last],
                format_func=lambda layer: f"L{layer}",
            )
            options = [h for h in every if parse_head_label(h)[0] in layers]
            chosen = st.multiselect("Heads", options, default=options[:4])
        else:
            picked = st.session_state.get(PICKED_HEAD)
            start = picked if picked in every else head_label(last, 0)
            chosen = [
                st.selectbox(
                    "Head (or click one on any head map: the distances below, Head importance, "
                    "Headmap search)",
                    every,
                    index=every.index(start),
                )
            ]
        if chosen and sets:
            heads = [parse_head_label(h) for h in chosen]
            frame = project(heads, sets, method, "chosen heads")
            if frame is not None:
                title = f"{method.upper()} of {', '.join(chosen)}"
                scatter([(title, frame)], title, f"{method}_{'_'.join(chosen[:6])}", "chosen")
        else:
            st.info("Choose at least one head and one OOD set.")

    with tabs[1]:
        stored = stored_greedy_runs(context, search_data(context))
        if not stored:
            st.info("This view ranks heads by a greedy search: run one on the Headmap search page.")
        elif sets:
            c1, c2 = st.columns(2)
            objective = c1.selectbox("Ranking from the saved search", list(stored))
            k = int(
                c2.slider(
                    "Heads per side",
                    1,
                    max(1, layout.total_heads // 2),
                    min(6, layout.total_heads // 2),
                )
            )
            ranking = [h for h in stored[objective].ranking() if h[0] in readable]
            most, least = most_and_least_important(ranking, k)
            pair = [
                project(group, sets, method, which)
                for group, which in ((most, "most"), (least, "least"))
            ]
            if all(p is not None for p in pair):
                titles = (
                    f"most important: {', '.join(head_label(*h) for h in most)}",
                    f"least important: {', '.join(head_label(*h) for h in least)}",
                )
                scatter(
                    list(zip(titles, pair, strict=True)),
                    f"Most vs least important heads ({objective})",
                    f"most_vs_least_{objective}_{k}",
                    "most-least",
                )
            st.caption(
                "As in the paper's Figure 4: the heads the search removed last (most important) "
                "against those it removed first."
            )

    with tabs[2]:
        table = distances(key, feats)
        c1, c2 = st.columns(2)
        metric = c1.radio(
            "Distance", ["mahalanobis", "euclidean"], horizontal=True, format_func=str.capitalize
        )
        where = c2.selectbox("OOD set", ["mean over OOD sets", *ood_names])
        part = table if where == "mean over OOD sets" else table[table["ood_set"] == where]
        per_head = part.groupby(["layer", "head"])[["euclidean", "mahalanobis"]].mean()
        shape = (len(readable), layout.max_heads)
        grid = {m: np.full(shape, np.nan) for m in ("euclidean", "mahalanobis")}
        for (layer, head), row in per_head.iterrows():
            for m in grid:
                grid[m][layer, head] = row[m]
        other = "euclidean" if metric == "mahalanobis" else "mahalanobis"
        head_map_with_download(
            head_heatmap(
                grid[metric],
                value_name=metric,
                hover={other: grid[other]},
                title=f"ID/OOD centroid distance per head ({where})",
            ),
            f"distances_{metric}_{where.replace(' ', '_')}",
            key="distances",
        )
        st.caption(
            "Mahalanobis uses each head's ID covariance, regularised (Ledoit-Wolf) so it is "
            "always defined."
        )
        summary = table.groupby("ood_set", sort=False)[["euclidean", "mahalanobis"]].mean()
        table_with_download(
            summary.reset_index(), "distances_per_ood_set.csv", float_format="{:.4f}"
        )
        table_with_download(table, "distances_per_head.csv", float_format="{:.4f}")

    with tabs[3]:
        stored = stored_greedy_runs(context, search_data(context))
        members = results().get("members", [])
        circuits = {f"greedy {o}": o for o in stored} | {f"member {m.name}": m for m in members}
        if not circuits:
            st.info(
                "Compare a circuit with the dense model: run a search (Headmap search) or build "
                "masks (Masks) first."
            )
        else:
            c1, c2, c3 = st.columns(3)
            source = c1.selectbox("Circuit", list(circuits))
            if source.startswith("greedy"):
                run = stored[circuits[source]]
                removed = (
                    int(c2.number_input("Heads removed", 1, run.steps, run.steps))
                    if run.steps > 1
                    else 1
                )
                keep = run.keep_mask(removed)
            else:
                keep = circuits[source].keep
                c2.metric("Heads kept", int(keep.sum()))
            layer = int(c3.selectbox("Layer", readable, index=last, format_func=lambda x: f"L{x}"))
            if st.button("Compare dense vs circuit", icon=":material/compare_arrows:"):
                results()["table5"] = (cache_key(keep), layer)
            if results().get("table5") == (cache_key(keep), layer):
                table5 = dense_vs_circuit(key, cache_key(keep), layer, keep, context, sample)
                table_with_download(table5, "dense_vs_circuit.csv", float_format="{:.4f}")
                deltas = table5.set_index("dataset")[["delta_euclidean", "delta_mahalanobis"]]
                figure_with_download(
                    matrix_heatmap(
                        deltas,
                        title="Circuit minus dense (0 = white: no change)",
                        value_name="Δ distance",
                        colorscale="RdBu",
                        text_format=".3f",
                        diverging=True,
                    ),
                    "dense_vs_circuit_delta",
                )
                st.caption(
                    f"Paper Table 5: mean distance over the heads the circuit keeps in layer "
                    f"{layer} ({', '.join(table5.attrs.get('heads', []))})."
                )
