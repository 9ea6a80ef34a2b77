"""Masks: the heads each ensemble member keeps, built from a strategy, drawn by hand or imported."""

import copy
import json

import streamlit as st
import torch

from hydra_core.analysis.cahp import (
    CAHP_VARIANTS,
    REPRESENTATIVES,
    VARIANT_DEFAULTS,
    cahp_k_grid,
    cahp_seeds,
)
from hydra_core.analysis.taylor import taylor_global_ranking
from hydra_core.errors import InputError
from hydra_core.hydra.members import (
    CIRCUIT_NAMES,
    CIRCUIT_OBJECTIVES,
    MANUAL,
    TAYLOR_NAME,
    cahp_members,
    check_members,
    circuit_member,
    circuit_members,
    member_overlap,
    ranking_provenance,
    search_provenance,
    seed_sampled_members,
    taylor_member,
)
from hydra_core.masks import (
    MaskFileError,
    MemberMask,
    masks_to_json,
    read_masks,
)
from hydra_core.models.adapter import head_layout
from hydra_ui.analyses import search_data, stored_greedy_runs, taylor
from hydra_ui.context import get_context, results
from hydra_ui.figures import matrix_heatmap, member_masks_figure
from hydra_ui.jobs import start_job
from hydra_ui.portable import mask_downloads
from hydra_ui.stability import member_defaults, reach_note, stable_ranking
from hydra_ui.sweeps import show_sweeps
from hydra_ui.widgets import (
    figure_with_download,
    job_outcome,
    show_error,
    table_with_download,
    watch_job,
)

STRATEGIES = {
    "seed-sampling": "Seed sampling: each member prunes B heads drawn from the K least useful",
    "circuits": "Circuits (the paper's Hydra (Circ)): CircAcc, CircOOD and CircAvg, each without "
    "the B least useful heads of its own greedy search",
    "circuit": "Circuit: one member without the B least useful heads",
    "taylor": "Layer-wise Taylor: one member without the r lowest-scoring heads of each layer",
}

st.title("Masks")
st.caption(
    "Each ensemble member keeps some heads and drops the rest. Members must differ: the "
    "overlap below shows how much they share (Jaccard: heads kept by both / by either)."
)


def use_members(new: list[MemberMask], replace: bool) -> None:
    """Make ``new`` the members (or add them), refusing identical masks or clashing names."""
    members = list(new) if replace else [*results().get("members", []), *new]
    check_members(members, layout)
    results()["members"] = members


def set_manual(keep: torch.Tensor) -> None:
    """Callback: load a mask into the per-layer toggles."""
    for layer in range(keep.shape[0]):
        st.session_state[f"manual-L{layer}"] = [
            f"H{h}" for h in keep[layer].nonzero().flatten().tolist()
        ]


#: what each CAHP variant is, in a line
CAHP_VARIANT_HELP = {
    "official": "The authors' code, step by step: each head's attention maps (32x32) give "
    "per-value Jeffries-Matusita profiles of the class pairs; t-SNE to 2-D; FasterPAM for every "
    "number of clusters; the knee (degree-6 fit) of the mean simplified silhouette curve; in each "
    "cluster the head with the largest head-mask gradient; one head per layer at least.",
    "accuracy-knee": "Our reading of the abstract from before the code was public: CLS-output "
    "profiles, k-medoids, one head per cluster (medoid or most important), one per layer at "
    "least; the number of clusters from the knee of a polynomial fit to accuracy.",
}


def start_cahp(context, inputs, seeds: list[int], options: dict, replace: bool) -> None:
    model = copy.deepcopy(context.loaded.model)  # heads other pages ablate must not reach it
    searched = search_provenance(context.benchmark, inputs)

    def work(job):
        def progress(done: int, all_: int) -> None:
            job.check()  # a stop ends the run here
            job.report(done=done, total=all_)

        return cahp_members(
            model, inputs, seeds=seeds, **options, progress=progress, search=searched
        )

    info = {"seeds": seeds, "replace": replace, "variant": options["variant"]}
    results()["jobs"]["cahp"] = start_job("cahp", work, info)


with show_error("Could not build the masks"):
    context = get_context()
    inputs = search_data(context)
    layout = head_layout(context.loaded.model)
    identity = context.loaded.identity()
    members: list[MemberMask] = results().get("members", [])
    stored = stored_greedy_runs(context, inputs)
    total = layout.total_heads

    st.subheader("Build members")
    tabs = st.tabs(["From a ranking", "CAHP", "Draw by hand", "Import / export"])
    with tabs[0], show_error("Could not build these members"):
        c1, c2 = st.columns([2, 1])
        strategy = c1.radio("Strategy", list(STRATEGIES), format_func=STRATEGIES.get)
        greedy = {CIRCUIT_NAMES[o]: run for o, run in stored.items()}  # ranking name -> search
        labels = {CIRCUIT_NAMES[o]: f"greedy {o}" for o in stored} | {TAYLOR_NAME: "Taylor"}
        stable = stable_ranking()  # the Headmap page's last stability run, if any
        if stable is not None:
            labels[stable[0]] = f"stable heads ({stable[2]['resamples']} resamples, greedy "
            labels[stable[0]] += f"{stable[2]['objective']})"
        ranking_name = c2.selectbox(
            "Ranking (least useful first)",
            list(labels),
            format_func=labels.get,
            disabled=strategy in ("taylor", "circuits"),
            help="Greedy rankings come from saved searches (Headmap search); stable heads from "
            "the Headmap page's last Stability run (most often removed by its resamples first); "
            f"Taylor scores the heads on the ID search {context.noun}",
        )
        made = None  # the removals the chosen ranking's search made (None: every head ranked)
        if strategy in ("circuit", "seed-sampling") and ranking_name != TAYLOR_NAME:
            made = stable[3] if stable and ranking_name == stable[0] else greedy[ranking_name].steps
        elif strategy == "circuits" and stored:
            made = min(run.steps for run in stored.values())
        default_b, default_k = member_defaults(total, made, strategy == "seed-sampling")
        c1, c2, c3, c4 = st.columns(4)
        if strategy == "taylor":
            per_layer = int(
                c1.number_input(
                    "r: heads removed per layer",
                    1,
                    layout.max_heads - 1,
                    max(1, layout.max_heads // 3),
                )
            )
        else:
            budget = int(
                c1.number_input(
                    "B: heads to prune",
                    1,
                    total - 1,
                    default_b,
                    help="Default: a third of the heads, within the removals the ranking's "
                    "search made (half the pool K for seed sampling)",
                )
            )
        if strategy == "seed-sampling":
            pool = int(
                c2.number_input(
                    "K: pool of least useful heads",
                    1,
                    total,
                    max(default_k, min(total, budget + 1)),
                    help="Default: two thirds of the heads, within the removals the ranking's "
                    "search made",
                )
            )
            count = int(c3.number_input("M: members", 2, 16, 3))
            first_seed = int(c4.number_input("First seed", 0, 10_000, 0))
        if strategy in ("circuit", "seed-sampling") and ranking_name != TAYLOR_NAME:
            what = "stability run" if stable and ranking_name == stable[0] else "search"
            note = reach_note(made, budget, pool if strategy == "seed-sampling" else None, what)
            if note:
                st.warning(note)
        elif strategy == "circuits" and stored:
            if note := reach_note(made, budget, None, "shortest of the searches"):
                st.warning(note)
        replace = st.checkbox("Replace the current members", value=True, key="replace-ranking")
        if st.button("Build", type="primary", icon=":material/build:"):
            searched = search_provenance(context.benchmark, inputs)  # recorded in the members
            if strategy == "taylor":
                new = [
                    taylor_member(
                        context.loaded.model, inputs, per_layer=per_layer, search=searched
                    )
                ]
            elif strategy == "circuits":
                missing = [o for o in CIRCUIT_OBJECTIVES if o not in stored]
                if missing:
                    raise InputError(
                        "the circuits strategy needs a saved greedy search of every criterion; "
                        f"missing: {', '.join(f'{CIRCUIT_NAMES[o]} (greedy {o})' for o in missing)}"
                        ". Run them on the Headmap page first"
                    )
                rankings = {o: stored[o].ranking() for o in CIRCUIT_OBJECTIVES}
                info = {
                    o: ranking_provenance(
                        "greedy",
                        objective=o,
                        budget=stored[o].budget,
                        steps=stored[o].steps,
                        candidates=stored[o].candidates,
                        search=searched,
                    )
                    for o in CIRCUIT_OBJECTIVES
                }
                new = circuit_members(rankings, layout, budget=budget, ranking_info=info)
            else:
                if ranking_name == TAYLOR_NAME:
                    scores = taylor(context.config.key, len(inputs.id_x), context, inputs)
                    ranking = taylor_global_ranking(torch.from_numpy(scores))
                    info = ranking_provenance("taylor", samples=len(inputs.id_x), search=searched)
                elif stable is not None and ranking_name == stable[0]:
                    ranking, info = stable[1], {**stable[2], "search": searched}
                else:
                    run = greedy[ranking_name]
                    ranking = run.ranking()
                    info = ranking_provenance(
                        "greedy",
                        objective=run.objective,
                        budget=run.budget,
                        steps=run.steps,
                        candidates=run.candidates,
                        search=searched,
                    )
                if strategy == "circuit":
                    new = [
                        circuit_member(
                            ranking,
                            layout,
                            budget=budget,
                            ranking_name=ranking_name,
                            ranking_info=info,
                        )
                    ]
                else:
                    new = seed_sampled_members(
                        ranking,
                        layout,
                        budget=budget,
                        seeds=range(first_seed, first_seed + count),
                        ranking_name=ranking_name,
                        pool=pool,
                        ranking_info=info,
                    )
            use_members(new, replace)
            st.rerun()
        if stored:
            st.caption(
                "Circuit names follow the paper: "
                + ", ".join(f"{CIRCUIT_NAMES[o]} = greedy {o}" for o in stored)
                + "."
            )

    with tabs[1], show_error("CAHP failed"):
        variant = st.radio("CAHP variant", CAHP_VARIANTS, horizontal=True, key="cahp-variant")
        st.caption(CAHP_VARIANT_HELP[variant] + " One member per seed.")
        defaults = VARIANT_DEFAULTS[variant]
        job = results()["jobs"].get("cahp")
        c1, c2, c3 = st.columns(3)
        degree = int(
            c1.number_input("Polynomial degree", 1, 8, defaults.degree, key=f"cahp-deg-{variant}")
        )
        options = {"variant": variant, "degree": degree}
        count = int(c3.number_input("Members (M)", 1, 8, 3, key="cahp-members"))
        seeds = cahp_seeds(count, variant)
        if variant == "accuracy-knee":
            k_step = int(
                c2.number_input(
                    "Evaluate every k-th head count", 1, max(1, total // 2), max(1, total // 24)
                )
            )
            options["k_grid"] = cahp_k_grid(total, k_step)
            options["representative"] = st.radio(
                "Head kept per cluster", REPRESENTATIVES[::-1], horizontal=True
            )
        c3.caption(f"seeds {seeds[0]}..{seeds[-1]}")
        if job is not None and job.running:
            watch_job(job, lambda j: f"CAHP {j.info['variant']} for {len(j.info['seeds'])} seed(s)")
        else:
            job_outcome(job, "CAHP")
            if job is not None and job.result and not job.info.get("used"):
                job.info["used"] = True
                use_members(job.result, job.info["replace"])
                st.rerun()
            replace_cahp = st.checkbox(
                "Replace the current members", value=True, key="replace-cahp"
            )
            if st.button("Run CAHP", icon=":material/hub:"):
                start_cahp(context, inputs, seeds, options, replace_cahp)
                st.rerun()

    with tabs[2], show_error("Could not add this member"):
        start = st.selectbox(
            "Start from", ["every head", *[m.name for m in members]], key="manual-start"
        )
        base = (
            layout.all_kept()
            if start == "every head"
            else next(m.keep for m in members if m.name == start)
        )
        st.button(
            "Load into the grid", on_click=set_manual, args=(base,), icon=":material/grid_on:"
        )
        st.caption("Click a head to drop it or keep it (highlighted = kept); one row per layer.")
        keep = torch.zeros(layout.shape, dtype=torch.bool)
        for layer, n in enumerate(layout.num_heads):
            heads = [f"H{h}" for h in range(n)]
            state = f"manual-L{layer}"
            if state not in st.session_state:
                st.session_state[state] = heads
            name = layout.layer_names()[layer]  # "L3", or by tower: "image L3", "text L0"
            for label in st.pills(name, heads, selection_mode="multi", key=state):
                keep[layer, int(label[1:])] = True
        c1, c2 = st.columns([2, 1])
        name = c1.text_input("Member name", value=f"manual {len(members) + 1}").strip() or "manual"
        c2.metric("Heads kept", f"{int(keep.sum())} of {total}")
        if st.button("Add member", icon=":material/add:", disabled=not keep.any()):
            use_members([MemberMask(name, "drawn by hand", keep, MANUAL)], replace=False)
            st.rerun()

    with tabs[3]:
        upload = st.file_uploader(
            "Import a mask file (JSON; its format: docs/cli.md, Mask files)", type=["json"]
        )
        other = st.checkbox("Accept masks made for other weights of the same shape")
        if upload is not None:
            try:  # validated as the command line validates a mask file
                imported = read_masks(
                    upload.getvalue(), upload.name, layout, identity, allow_other_weights=other
                )
            except MaskFileError as exc:
                st.error(f"Cannot import {exc}")
            else:
                st.success(
                    f"{upload.name}: {len(imported)} member(s): "
                    + ", ".join(m.name for m in imported)
                )
                if st.button("Use the imported members", icon=":material/upload:"):
                    use_members(imported, replace=True)
                    st.rerun()
        if members:
            st.download_button(
                "Export the members (JSON)",
                lambda: json.dumps(masks_to_json(members, identity), indent=2),
                file_name="hydra_masks.json",
                mime="application/json",
                icon=":material/download:",
                on_click="ignore",
            )
            mask_downloads(members, context.loaded)

    st.subheader(f"Members ({len(members)})")
    if not members:
        st.info("No members yet: build them above, draw them by hand or import a mask file.")
    else:
        overlap = member_overlap(members)
        table_with_download(
            [{"member": m.name, "source": m.source, "heads kept": m.kept} for m in members],
            "members.csv",
        )
        c1, c2, c3 = st.columns(3)
        c1.metric(
            "Mean pairwise Jaccard",
            f"{overlap['mean_pairwise_jaccard']:.3f}" if len(members) > 1 else "–",
        )
        c2.metric("Heads kept by every member", len(overlap["kept_by_all"]))
        c3.metric("Heads kept by none", total - len(overlap["kept_by_any"]))
        figure_with_download(
            member_masks_figure(members, towers=layout.towers, num_heads=layout.num_heads),
            "member_masks",
        )
        left, right = st.columns(2)
        with left:
            st.caption("Kept heads per layer")
            table_with_download(
                overlap["per_layer"].reset_index(names="layer"), "members_per_layer.csv"
            )
        with right:
            figure_with_download(
                matrix_heatmap(
                    overlap["jaccard"],
                    title="Overlap (Jaccard)",
                    value_name="Jaccard",
                    colorscale="Blues",
                    zmin=0,
                    zmax=1,
                ),
                "members_jaccard",
            )
        drop = st.multiselect("Remove members", [m.name for m in members])
        if st.button("Remove", disabled=not drop, icon=":material/delete:"):
            results()["members"] = [m for m in members if m.name not in drop]
            st.rerun()
    show_sweeps(("layers",), context.loaded)
