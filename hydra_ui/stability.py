"""The Headmap page's Stability view: would the heads come out again on another sample, and after
how many steps does the search start fitting its own?

One background job: the search split is cut into a search part and a held-out part (every ID class
and OOD search set within itself); the greedy search runs on the search part; its circuit is scored
on the held-out part after every step (:mod:`hydra_core.analysis.holdout`); the same search runs on
B bootstrap resamples of the search part (:mod:`hydra_core.analysis.stability`). Every piece is
saved in the disk cache as it finishes, so a stopped job resumes and a finished one comes back at
once. The figures are plain Plotly built from results (tested without Streamlit).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from hydra_core.analysis.greedy import GreedyResult, greedy_circuit
from hydra_core.analysis.holdout import (
    FEW_SAMPLES,
    HeldOutCurve,
    held_out_curve,
    holdout_split,
    jaccard_words,
)
from hydra_core.analysis.stability import STABLE_SHARE, StabilityResult, greedy_stability
from hydra_core.hydra import members
from hydra_core.models.adapter import head_label, head_layout
from hydra_ui.context import disk_cache, results
from hydra_ui.estimates import stability_note
from hydra_ui.figures import OBJECTIVE_NAMES, PALETTE, Towers, below_toolbar, head_heatmap
from hydra_ui.jobs import start_job
from hydra_ui.widgets import (
    figure_with_download,
    head_map_with_download,
    job_outcome,
    table_with_download,
    watch_job,
)

JOB = "stability"


@dataclass
class StabilityRun:
    """What the job found: the search on the search part, its held-out curve (None without a
    held-out part) and the resampled searches."""

    search: GreedyResult
    curve: HeldOutCurve | None
    stability: StabilityResult
    fraction: float
    n_id: int
    n_ood: int


# --- figures -------------------------------------------------------------------------------------


def frequency_heatmap(
    found: StabilityResult, search: GreedyResult, towers: Towers = ()
) -> go.Figure:
    """Keep frequency per head (share of resamples whose search kept it: 1 - the removal
    frequency; higher = more important, the convention of every ranking), the search's own
    removal step in the hover box."""
    keep = 1.0 - found.frequency().numpy()
    step = np.full(keep.shape, "kept", dtype=object)
    step[np.isnan(keep)] = ""
    for t, head in enumerate(search.order):
        step[head] = f"removed at step {t + 1}"
    fig = head_heatmap(
        keep,
        title=f"Kept through {found.steps} steps, share of {found.resamples} resamples",
        value_name="keep frequency",
        hover={"this search": step},
        value_format=".2f",
        colorscale="Viridis",
        zmin=0.0,
        zmax=1.0,
        towers=towers,
    )
    fig.update_layout(title=below_toolbar(fig.layout.title.text), margin={"t": 80})
    return fig


def held_out_figure(curve: HeldOutCurve) -> go.Figure:
    """The objective on the search part and on the held-out part against heads removed, the
    held-out 95% band, and the held-out peak (the suggested budget)."""
    x = list(range(len(curve.held_out)))
    name = OBJECTIVE_NAMES[curve.objective]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=x + x[::-1],
            y=curve.held_out_hi + curve.held_out_lo[::-1],
            fill="toself",
            fillcolor="rgba(230, 159, 0, 0.2)",
            mode="lines",
            line={"width": 0},
            hoverinfo="skip",
            name="held out, 95% interval",
        )
    )
    for label, y, colour in (
        ("search part", curve.search, PALETTE[0]),
        ("held out", curve.held_out, PALETTE[1]),
    ):
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                name=label,
                mode="lines+markers" if len(x) < 40 else "lines",
                line={"color": colour},
                marker={"size": 5},
                hovertemplate=f"{label}<br>heads removed: %{{x}}<br>%{{y:.4f}}<extra></extra>",
            )
        )
    peak = curve.peak
    fig.add_vline(x=peak, line_dash="dot", line_color="#555555")
    fig.add_annotation(
        x=peak, y=curve.held_out[peak], text=f"held-out peak: {peak}", showarrow=True, ay=-30
    )
    fig.update_layout(
        title=below_toolbar(f"{name}: search part vs held out"),
        height=400,
        xaxis={"title": "heads removed", "dtick": 1 if len(x) <= 13 else None},
        yaxis_title=name,
        legend={"orientation": "h", "y": -0.25},
        margin=dict(l=50, r=20, t=90, b=40),
    )
    return fig


def jaccard_figure(found: StabilityResult) -> go.Figure:
    """Mean pairwise Jaccard of the removed sets and the first-choice agreement, per step."""
    x = list(range(1, found.steps + 1))
    agreement = found.agreement()
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=x, y=found.jaccard_curve(), name="mean pairwise Jaccard", line={"color": PALETTE[2]}
        )
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[share for _, share in agreement],
            name="agreement on the step's removal",
            line={"color": PALETTE[4], "dash": "dash"},
            text=[head_label(*h) for h, _ in agreement],
            hovertemplate="step %{x}: %{text} by %{y:.0%}<extra></extra>",
        )
    )
    fig.update_layout(
        title=below_toolbar("Do the resamples agree?"),
        height=360,
        xaxis={"title": "heads removed", "dtick": 1 if len(x) <= 12 else None},
        yaxis={"title": "share", "range": [0, 1.05]},
        legend={"orientation": "h", "y": -0.3},
        margin=dict(l=50, r=20, t=90, b=40),
    )
    return fig


def stable_table(found: StabilityResult, search: GreedyResult) -> list[dict]:
    """Heads the search kept that at least STABLE_SHARE of the resamples kept (the stable
    circuit), then those it removed that at most 1 - STABLE_SHARE kept; "kept by resamples" is
    the keep frequency (higher = more important)."""
    keep = 1.0 - found.frequency()
    removed, kept = found.stable_heads()
    order = {h: t + 1 for t, h in enumerate(search.order)}
    rows = [
        {"head": head_label(*h), "this search": "kept", "kept by resamples": float(keep[h])}
        for h in kept
        if h not in order
    ]
    rows += [
        {
            "head": head_label(*h),
            "this search": f"removed at step {order[h]}",
            "kept by resamples": float(keep[h]),
        }
        for h in removed
        if h in order
    ]
    return rows


# --- the job -------------------------------------------------------------------------------------


def start_stability(
    context, inputs, objective: str, budget: int, resamples: int, fraction: float, seed: int
) -> None:
    """Search part, held-out curve and resamples, in one background job (each piece cached)."""
    model = copy.deepcopy(context.loaded.model)  # hooks other pages add must not reach it
    strata = inputs.ood_strata()
    if fraction > 0:
        split = holdout_split(inputs.id_y, strata, fraction, seed=seed)
        id_rows, ood_rows = split.id_search, split.ood_search
    else:
        split = None
        id_rows, ood_rows = torch_range(len(inputs.id_x)), torch_range(len(inputs.ood_x))
    data = (
        inputs.id_x[id_rows.to(inputs.id_x.device)],
        inputs.id_y[id_rows.to(inputs.id_y.device)],
        inputs.ood_x[ood_rows.to(inputs.ood_x.device)],
    )
    search_strata = [strata[i] for i in ood_rows.tolist()]
    total = head_layout(model).total_heads

    # one estimate for the whole run: its steps in one unit (candidate evaluations of the search
    # part), the search's, the held-out curve's (one evaluation of the held-out part per step)
    # and every resample's, in the order they run (resamples go step by step together)
    steps = [total - t for t in range(budget)]
    held = [(budget + 1) * fraction / (1 - fraction)] if split is not None else []
    resampled = [size for size in steps for _ in range(resamples)]
    stages = 3 if split is not None else 2

    def work(job):
        job.info["stage"] = f"stage 1 of {stages}, search on the search part"
        job.begin_steps(steps + held + resampled)
        search = greedy_circuit(
            model,
            *data,
            objective=objective,
            budget=budget,
            cache=disk_cache(),
            should_stop=job.should_stop,
            progress=lambda s: job.report(s, steps=s.step + 1),
        )
        if job.should_stop():
            return None
        curve = None
        job.report(search, steps=budget)  # a search read back from the cache reports no step
        if split is not None:
            job.info["stage"] = f"stage 2 of {stages}, held-out curve"
            held_data = (
                inputs.id_x[split.id_held_out.to(inputs.id_x.device)],
                inputs.id_y[split.id_held_out.to(inputs.id_y.device)],
                inputs.ood_x[split.ood_held_out.to(inputs.ood_x.device)],
            )
            held_strata = [strata[i] for i in split.ood_held_out.tolist()]
            curve = held_out_curve(model, search, *held_data, ood_strata=held_strata)
            job.report(curve, steps=budget + 1)
        job.info["stage"] = f"stage {stages} of {stages}, {resamples} resamples"
        first = budget + len(held)
        found = greedy_stability(
            model,
            *data,
            objective=objective,
            budget=budget,
            resamples=resamples,
            seed=seed,
            ood_strata=search_strata,
            cache=disk_cache(),
            should_stop=job.should_stop,
            progress=lambda p: job.report(p, steps=first + p.done),
        )
        if not found.complete:
            return None
        return StabilityRun(search, curve, found, fraction, len(data[0]), len(data[2]))

    info = {
        "objective": objective,
        "budget": budget,
        "resamples": resamples,
        "fraction": fraction,
        "seed": seed,
        "stage": "starting",
    }
    results()["jobs"][JOB] = start_job(JOB, work, info)


def torch_range(n: int):
    import torch

    return torch.arange(n)


# --- the view ------------------------------------------------------------------------------------


def _describe(job) -> str:
    return f"Stability ({job.info['objective']}, budget {job.info['budget']}): {job.info['stage']}"


def stability_view(
    context, inputs, objective: str, budget: int, measured: tuple[float | None, str] = (None, "")
) -> None:
    """Controls, the running job and the last finished run of this setup; ``measured``: the
    seconds of one candidate evaluation a saved search measured, and which one (for the time a
    run takes, said before it starts)."""
    st.subheader("Stability")
    st.caption(
        "Would these heads come out again on another sample, and where does the search start "
        "fitting its own? The search split is cut into a search part and a held-out part (every "
        "class and OOD search set within itself; no report set is used). The search runs on the "
        "search part, its circuit is scored on the held-out part after every step (a smaller "
        "budget is suggested only where the held-out peak beats the end beyond both 95% "
        "intervals), and the same search runs on B bootstrap resamples of the search part: a "
        "head's keep frequency is the share of resamples whose search kept it (higher = more "
        f"important, as on every page). Heads kept by at least {STABLE_SHARE:.0%} of the "
        "resamples form the stable circuit. Objective and budget are the search's above; a "
        "stopped run continues where it stopped when run again."
    )
    job = results()["jobs"].get(JOB)
    running = job is not None and job.running
    c1, c2, c3 = st.columns(3)
    resamples = int(c1.number_input("Resamples (B)", 2, 50, 5, disabled=running))
    fraction = c2.select_slider(
        "Held-out share",
        [0.0, 0.1, 0.2, 0.25, 0.3, 0.4, 0.5],
        0.25,
        disabled=running,
        help="0: no held-out part (no curve); the search and the resamples use the whole split",
    )
    seed = int(c3.number_input("Seed", 0, 10_000, 0, disabled=running))
    n = min(len(inputs.id_x), len(inputs.ood_x))
    if n >= FEW_SAMPLES > n * (1 - fraction):  # fewer, the page says so above
        st.warning(
            f"The search part holds about {int(n * (1 - fraction))} samples per side (fewer "
            f"than {FEW_SAMPLES}): its gains may not transfer to other samples; a smaller "
            "held-out share or more search samples (Setup) make the answer firmer."
        )
    if not running:
        total = head_layout(context.loaded.model).total_heads
        st.caption(stability_note(measured[0], total, budget, resamples, fraction, measured[1]))
    if st.button("Run stability", icon=":material/stacks:", disabled=running):
        start_stability(context, inputs, objective, budget, resamples, float(fraction), seed)
        st.rerun()
    if running:
        watch_job(job, _describe)
        return
    job_outcome(job, "The stability run")
    if job is None or job.result is None:
        st.info("No stability run yet for this setup: choose B and the held-out share, then Run.")
        return
    show_run(job.result, head_layout(context.loaded.model).towers)


def show_run(run: StabilityRun, towers: Towers = ()) -> None:
    found, search, curve = run.stability, run.search, run.curve
    summary = found.summary()
    line = (
        f"**{found.resamples} resamples** of {run.n_id} ID + {run.n_ood} OOD search samples, "
        f"budget {found.steps}: "
        f"{jaccard_words(summary['jaccard'], sum(found.num_heads), found.steps)}, "
        f"first removal agreed by {summary['first_step_agreement']:.0%}; "
        f"{summary['group_steps']} shared steps computed for {summary['independent_steps']}."
    )
    st.markdown(line)
    if curve is not None:
        peak = curve.peak
        text = (
            f"On the held-out part ({curve.n_id} ID + {curve.n_ood} OOD) the objective peaks after "
            f"**{peak}** removal{'s' * (peak != 1)}"
        )
        suggested = curve.suggested_budget(search.steps)
        if suggested is not None:
            st.warning(
                text + f", better than at the budget of {search.steps} beyond the interval "
                f"(peak minus budget [{curve.peak_gain_lo[search.steps]:+.4f}, "
                f"{curve.peak_gain_hi[search.steps]:+.4f}]): past the peak the search fits its "
                f"sample. Suggested budget: **{suggested}**."
            )
        elif curve.beyond_peak(search.steps):
            st.info(
                text + f", but within the interval of the objective at the budget of "
                f"{search.steps}: the held-out part cannot tell them apart, so no smaller budget "
                "is suggested."
            )
        else:
            st.success(text + f", at or beyond the budget of {search.steps}.")
    # two rows of two, so that no column stands empty beside a taller one
    left, right = st.columns(2)
    with left:
        head_map_with_download(
            frequency_heatmap(found, search, towers), "stability_frequency", key="stability-freq"
        )
    with right:
        if curve is not None:
            figure_with_download(held_out_figure(curve), "held_out_curve")
        else:
            figure_with_download(jaccard_figure(found), "stability_agreement")
    left, right = st.columns(2)
    if curve is not None:
        with left:
            figure_with_download(jaccard_figure(found), "stability_agreement")
    with right if curve is not None else left:
        st.markdown(
            "**Stable heads**: kept by this search and by most resamples, or removed by both"
        )
        table_with_download(stable_table(found, search), "stable_heads.csv", float_format="{:.2f}")


# --- for the Masks page --------------------------------------------------------------------------


def stable_ranking() -> tuple[str, list, dict, int] | None:
    """The ranking of this setup's last finished stability run, for building members from the
    stable heads: (name, every head most often removed first, provenance, steps), or None."""
    job = results()["jobs"].get(JOB)
    run = None if job is None or job.running else job.result
    if run is None:
        return None
    name, ranking, info = members.stable_ranking(run.stability, run.search.ranking())
    info["holdout"] = run.fraction  # the share of the search split it did not search on
    return name, ranking, info, run.stability.steps


def member_defaults(
    total: int, steps: int | None, pooled: bool, members: int = 3
) -> tuple[int, int]:
    """The Masks page's default B (heads each member prunes) and K (the pool seed sampling draws
    from; 0 without one): the paper's B = 1/3 and K = 2/3 of the ``total`` heads, held within
    the ``steps`` removals the chosen ranking's search made (None: a ranking of every head), so
    that the defaults do not reach past the search: the default budget-24 search of a 72-head
    model gives K = 24 and B = 12 (half the pool, as the paper's 24 of 48); without a pool,
    B = 24. ``pooled``: seed sampling, whose ``members`` must differ: a search too short to give
    that many distinct draws within it keeps the paper's sizes (and the page's reach warning)."""
    third, two_thirds = max(1, total // 3), max(2, 2 * total // 3)
    reach = two_thirds if steps is None else max(1, steps)
    if not pooled:
        return max(1, min(third, reach, total - 1)), 0
    pool = max(2, min(two_thirds, reach, total))
    budget = max(1, min(third, pool // 2))
    if math.comb(pool, budget) < members:
        return third, min(total, max(two_thirds, third + 1))
    return budget, pool


def reach_note(steps: int, budget: int, pool: int | None, what: str) -> str | None:
    """A warning when the members' budget B or pool K reaches past the ``steps`` a search made:
    beyond them a greedy ranking orders heads by one step's single-ablation scores, and a
    stability ranking by frequencies of 0."""
    reach = max(budget, pool or 0)
    if reach <= steps:
        return None
    asked = f"B = {budget}" + (f" and K = {pool}" if pool else "")
    return (
        f"{asked} reach past the {steps} removals the {what} made: the heads beyond them are "
        "not ordered by the search's removals. Run it to a budget of at least "
        f"{reach} on the Headmap page, or lower B{' and K' if pool else ''}."
    )
