"""Headmap search: greedy circuit extraction, watched live, stoppable and resumable."""

import copy

import pandas as pd
import streamlit as st

from hydra_core.analysis._maps import DEFAULT_OOD_AGGREGATE
from hydra_core.analysis.greedy import OBJECTIVES as SEARCH_ORDER
from hydra_core.analysis.greedy import OOD_AGGREGATES, GreedyResult, greedy_circuit
from hydra_core.analysis.holdout import FEW_SAMPLES
from hydra_core.evaluate import auroc_changes, format_intervals
from hydra_core.models.adapter import head_label, head_layout
from hydra_ui.analyses import describe_search, search_data, stored_greedy_runs
from hydra_ui.context import disk_cache, get_context, results
from hydra_ui.estimates import search_note, seconds_per_candidate
from hydra_ui.evidence import evidence_section
from hydra_ui.figures import greedy_curves, removal_step_heatmap
from hydra_ui.jobs import FAILED, STOPPED, format_seconds, start_job
from hydra_ui.stability import stability_view
from hydra_ui.transfer import shortcut_warnings, transfer_matrix_view
from hydra_ui.widgets import (
    figure_with_download,
    head_map_with_download,
    show_error,
    table_with_download,
)

JOB = "search"
OBJECTIVES = {
    "avg": "S_avg = (accuracy + AUROC) / 2",
    "acc": "S_acc: ID accuracy",
    "ood": "S_ood: OOD AUROC (MSP)",
}
AGGREGATES = {
    "pooled": "pooled: one AUROC against all OOD search items",
    "mean": "mean of the per-set AUROCs",
    "min": "worst set's AUROC",
}


def candidates(budget: int, total: int) -> list[int]:
    """Candidate evaluations of each step: step t tries the total - t heads left, so the steps
    get cheaper as the search goes (the time left is estimated from them)."""
    return [total - t for t in range(budget)]


def measured_step_cost(
    stored: dict[str, GreedyResult], objective: str, total: int
) -> tuple[float | None, str]:
    """Seconds of one candidate evaluation, as the saved search of ``objective`` (else any saved
    search of this setup) measured it, and which search that was."""
    for name in (objective, *stored):
        if name in stored:
            cost = seconds_per_candidate(stored[name].step_seconds, total)
            if cost is not None:
                return cost, f"the saved {name} search"
    return None, ""


def saved_searches_shown(context, inputs, job, aggregate: str) -> dict[str, GreedyResult]:
    """The saved searches by objective, for the OOD aggregate chosen: read from the disk cache
    once per setup and aggregate, then kept up to date from the search job (its latest step while
    it runs, its result once it ended) rather than read and hashed again on every rerun."""
    store = results()
    key = f"searches-{aggregate}"
    if key not in store:
        store[key] = stored_greedy_runs(context, inputs, aggregate)
    if job is not None and job.info["extends"] and job.info["aggregate"] == aggregate:
        latest = job.result if job.result is not None else getattr(job.progress, "result", None)
        if latest is not None:
            store[key][job.info["objective"]] = latest
    return {o: store[key][o] for o in SEARCH_ORDER if o in store[key]}


def start_search(
    context,
    inputs,
    objective: str,
    budget: int,
    resume: bool,
    previous: GreedyResult | None,
    k: int | None = None,
    aggregate: str = DEFAULT_OOD_AGGREGATE,
) -> None:
    """Run the search in a background job. It starts from ``previous`` (the saved search for
    ``objective``) when ``resume``; a saved search at least ``budget`` long only gives a prefix,
    and stays the saved one. ``k``: the guided search's candidates per step (its own saved
    search, resumed from the cache; it never replaces the exact one in the table)."""
    # The search gets its own copy: heads other pages ablate with hooks on the shared model
    # while it runs must not reach it. The copy has the same weights, so the same cache key.
    model = copy.deepcopy(context.loaded.model)
    total = head_layout(model).total_heads
    k = None if k is None or k >= total else k
    if k is not None:
        previous = None  # the exact search's progress is not the guided one's
    continued = resume and previous is not None
    done_before = min(previous.steps, budget) if continued else 0
    steps = candidates(budget, total)
    if k is not None:
        steps = [min(k, n) for n in steps]

    def work(job):
        job.begin_steps(steps, done=done_before)
        return greedy_circuit(
            model,
            inputs.id_x,
            inputs.id_y,
            inputs.ood_x,
            objective=objective,
            budget=budget,
            candidates=k,
            cache=disk_cache(),
            resume=resume,
            should_stop=job.should_stop,
            progress=lambda step: job.report(step, steps=step.step + 1),
            ood_sets=inputs.ood_sets,
            ood_aggregate=aggregate,
        )

    extends = k is None and (not continued or previous.steps < budget)
    info = {
        "objective": objective,
        "budget": budget,
        "extends": extends,
        "candidates": k,
        "aggregate": aggregate,
    }
    info["towers"] = head_layout(model).towers  # the heatmap's rows named by tower
    results()["jobs"][JOB] = start_job(JOB, work, info)


@st.cache_data(show_spinner="Measuring the circuit on the report sets...", max_entries=16)
def transfer_table(setup_key: str, run_key: str, _context, _keep) -> pd.DataFrame:
    """AUROC change of the circuit ``_keep`` over the dense model on every report set."""
    return auroc_changes(
        _context.loaded,
        _context.benchmark,
        _keep,
        name=run_key,
        device=_context.device,
        cache=disk_cache(),
    )


#: the transfer table's columns as the page names them (auroc_changes' names stay in hydra_core)
TRANSFER_COLUMNS = {
    "set": "report set",
    "dense_auroc": "AUROC, dense model",
    "circuit_auroc": "AUROC, circuit",
    "delta_auroc": "circuit - dense",
    "significant": "significant",
}


def transfer_view(context, runs: dict, aggregate: str) -> None:
    """Does the search's OOD gain reach the report sets, which it never saw?"""
    st.subheader("Transfer to the report sets")
    st.caption(
        "AUROC (MSP) of each circuit shown above minus the dense model's, on the report split "
        "of every report OOD set, with the paired 95% bootstrap interval. The search never saw "
        "these sets (it selected heads on "
        + ", ".join(context.benchmark.search_names())
        + "), so this is how much of its gain transfers; n.s. = the interval contains 0. "
        f"Items: {len(context.benchmark.id_report):,} ID report {context.noun} and "
        + ", ".join(f"{s.name} {len(s):,}" for s in context.benchmark.ood_report)
        + " (the report split Setup sets; other views that sample fewer, such as the per-head "
        "evidence, give a slightly different dense AUROC). The near / far / all rows are means "
        "over their sets."
    )
    if not st.button("Measure on the report sets", icon=":material/query_stats:"):
        if "transfer" not in results():
            return
    results()["transfer"] = True
    for objective, run in runs.items():
        table = transfer_table(
            context.config.key, f"{objective}-{aggregate}-{run.steps}", context, run.keep_mask()
        )
        st.markdown(f"**{OBJECTIVES[objective]}**, {run.steps} heads removed")
        table_with_download(
            format_intervals(table, signed=True).rename(columns=TRANSFER_COLUMNS),
            f"transfer_{objective}_{run.steps}.csv",
        )


@st.fragment(run_every=1.5)
def live_view(job) -> None:
    """Redrawn every 1.5 s from the job's latest step while the search runs."""
    if not job.running:
        st.rerun()  # the whole page now shows the finished run
    step, info = job.progress, job.info
    removed = step.step + 1 if step is not None else 0
    st.progress(
        job.fraction(),
        text=f"**{info['objective']}** search: {removed} of {info['budget']} heads "
        f"removed · {format_seconds(job.eta_seconds())} left · {job.elapsed():.0f} s so far",
    )
    if st.button("Stop", icon=":material/stop:", disabled=job.stopping, key="stop-search"):
        job.stop()
    if job.stopping:
        st.info("Stopping: the current step is dropped, finished steps are saved.")
    if step is None:
        st.info("Scoring the dense model and the first round of candidates...")
        return
    left, right = st.columns(2)
    heatmap = removal_step_heatmap(step.result, budget=info["budget"], towers=info["towers"])
    # no toolbar on figures redrawn every 1.5 s: it covered the heatmap's title
    still = {"displayModeBar": False}
    left.plotly_chart(heatmap, key="live-heatmap", config=still)
    curves = greedy_curves({info["objective"]: step.result})
    right.plotly_chart(curves, key="live-curves", config=still)
    st.caption(
        f"Last removed: **{head_label(*step.head)}** (step {removed}, {step.seconds:.1f} s); "
        f"accuracy {step.accuracy:.4f}, AUROC {step.auroc:.4f}."
    )


def steps_table(result) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "step": range(1, result.steps + 1),
            "head": result.labels(),
            "score": result.scores,
            "accuracy": result.accuracy,
            "auroc": result.auroc,
            "seconds": result.step_seconds or [float("nan")] * result.steps,
        }
    )


st.title("Headmap search")
st.caption(
    "Greedy circuit extraction (paper Algorithm 1): every step ablates each remaining head on "
    "its own, scores the model, and removes for good the head whose removal leaves the "
    "highest score. Steps are saved as they finish, so a stopped search resumes where it "
    "stopped and finished searches come back at once, also after a restart."
)

with show_error("Could not run the head search"):
    context = get_context()
    inputs = search_data(context)
    layout = head_layout(context.loaded.model)
    total = layout.total_heads
    job = results()["jobs"].get(JOB)
    running = job is not None and job.running
    aggregate = st.radio(
        "OOD search sets combined as",
        OOD_AGGREGATES,
        index=OOD_AGGREGATES.index(DEFAULT_OOD_AGGREGATE),
        format_func=AGGREGATES.get,
        horizontal=True,
        disabled=running,
        help="How the search's AUROC (S_ood, and S_avg through it) combines the OOD search sets: "
        "pooled scores ID against all of them at once; mean averages one AUROC per set; min "
        "takes the worst set's, so no one set can carry the search (docs/search-protocols.md). "
        "Which data searches is the Setup page's protocol.",
    )
    stored = saved_searches_shown(context, inputs, job, aggregate)

    leak = context.benchmark.protocol_note()  # None unless the search saw the report sets
    roles = (
        "" if leak else "; these OOD search sets select heads only, no reported number uses them"
    )
    st.caption(
        f"Search data: {describe_search(context, inputs)}{roles}; protocol "
        f"{context.benchmark.protocol} (sets, sizes and protocol are chosen on the Setup page). "
        f"{layout.describe()} = {total} heads."
    )
    if leak:
        st.warning(leak)
    shortcut_warnings(context)  # search sets that surface features alone separate
    if min(len(inputs.id_x), len(inputs.ood_x)) < FEW_SAMPLES:
        st.warning(
            f"The search chooses heads on {len(inputs.id_x)} ID and {len(inputs.ood_x)} OOD "
            f"samples (fewer than {FEW_SAMPLES} per side): its gains may not transfer to other "
            "samples. Check them with Stability below, or use more search samples (Setup)."
        )
    c1, c2, c3, c4 = st.columns([2, 1, 1, 1])
    objective = c1.radio(
        "Objective", list(OBJECTIVES), format_func=OBJECTIVES.get, horizontal=True, disabled=running
    )
    budget = int(
        c2.number_input(
            "Budget (heads to remove)",
            1,
            total - 1,  # a circuit keeps at least one head
            min(24, total - 1),
            disabled=running,
        )
    )
    k = int(
        c3.number_input(
            "Candidates per step (0 = all)",
            0,
            total,
            0,
            disabled=running,
            help="Guided search: evaluate exactly only the K heads whose attribution estimate "
            "(one forward and a few backward passes) is best, re-estimated after every removal. "
            "For large models on a laptop; 0 or every head is the exact search",
        )
    )
    fresh = c4.checkbox(
        "Start over",
        help="Ignore the saved search for this objective and run again",
        disabled=running,
    )
    previous = stored.get(objective)
    if not running:  # its time at this budget, from the step cost a saved search measured
        cost, where = measured_step_cost(stored, objective, total)
        done = previous.steps if previous is not None and not fresh else 0
        if note := search_note(cost, total, budget, done, where):
            st.caption(note)
    b1, b2, _ = st.columns([1, 1, 4])
    if b1.button("Run", type="primary", icon=":material/play_arrow:", disabled=running):
        start_search(
            context,
            inputs,
            objective,
            budget,
            resume=not fresh,
            previous=previous,
            k=k or None,
            aggregate=aggregate,
        )
        st.rerun()
    can_resume = previous is not None and not previous.complete and previous.steps < previous.budget
    if b2.button(
        "Resume",
        icon=":material/resume:",
        disabled=running or not can_resume,
        help="Continue the interrupted search for this objective up to its budget",
    ):
        start_search(
            context, inputs, objective, previous.budget, True, previous, aggregate=aggregate
        )
        st.rerun()

    if running:
        live_view(job)
    elif job is not None and job.status == FAILED:
        st.error(f"The search failed: {job.error}")
    elif job is not None and job.info.get("candidates") and job.result is not None:
        guided = job.result
        exact = sum(candidates(guided.steps, total))
        st.success(
            f"Guided search (K = {guided.candidates}): {guided.steps} heads removed with "
            f"{sum(guided.evaluated)} candidates evaluated exactly (the exact search evaluates "
            f"{exact}); accuracy {guided.accuracy[-1]:.4f}, AUROC {guided.auroc[-1]:.4f}, "
            f"{guided.seconds:.0f} s."
        )
        table_with_download(
            steps_table(guided).assign(evaluated=guided.evaluated),
            f"guided_{guided.objective}_k{guided.candidates}_steps.csv",
            float_format="{:.4f}",
        )
    elif job is not None and job.status == STOPPED and job.result is not None:
        st.info(
            f"Stopped after {job.result.steps} of {job.info['budget']} steps; Resume continues it."
        )

    st.subheader("Saved searches")
    if not stored:
        st.info(
            "No search saved yet for this model and search split: choose an objective and a "
            "budget, then Run."
        )
    else:
        table_with_download(
            [
                {
                    "objective": o,
                    "heads removed": r.steps,
                    "budget": r.budget,
                    "finished": r.complete,
                    "accuracy": r.accuracy[-1] if r.steps else r.base_accuracy,
                    "auroc": r.auroc[-1] if r.steps else r.base_auroc,
                    "dense accuracy": r.base_accuracy,
                    "dense auroc": r.base_auroc,
                    "compute s": r.seconds,
                }
                for o, r in stored.items()
            ],
            "greedy_runs.csv",
            float_format="{:.4f}",
        )
        compare = st.multiselect(
            "Compare",
            list(stored),
            format_func=OBJECTIVES.get,
            default=[objective] if objective in stored else list(stored)[:1],
        )
        if compare:
            longest = max(stored[o].steps for o in compare)
            shown = longest
            if longest > 1:
                shown = st.slider("Heads removed shown (compare budgets)", 1, longest, longest)
            runs = {o: stored[o].prefix(min(shown, stored[o].steps)) for o in compare}
            for column, (o, run) in zip(st.columns(len(runs)), runs.items(), strict=True):
                with column:
                    head_map_with_download(
                        removal_step_heatmap(run, budget=shown, towers=layout.towers),
                        f"headmap_{o}_{run.steps}",
                        key=f"headmap_{o}",
                    )
            figure_with_download(greedy_curves(runs), "greedy_curves_" + "_".join(runs))
            for o, run in runs.items():
                with st.expander(f"{o}: removal order ({run.steps} steps)"):
                    table_with_download(
                        steps_table(run), f"greedy_{o}_steps.csv", float_format="{:.4f}"
                    )
                    ranking = [head_label(*h) for h in stored[o].ranking()]
                    st.caption("Full ranking, least useful first: " + ", ".join(ranking))
            transfer_view(context, runs, aggregate)
    transfer_matrix_view(context, objective, budget, k if 0 < k < total else None)

    stability_view(context, inputs, objective, budget, measured_step_cost(stored, objective, total))
# --- Evidence: every head's evidence with intervals (hydra_ui/evidence.py) -----------------------
with show_error("Could not compute the evidence"):
    evidence_context = get_context()
    evidence_section(evidence_context, search_data(evidence_context))
