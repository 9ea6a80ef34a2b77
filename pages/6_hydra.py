"""Hydra: fuse the members into one model, evaluate it against the alternatives, export it."""

import copy
import dataclasses
import json
import tempfile
import warnings
from pathlib import Path

import pandas as pd
import streamlit as st

from hydra_core.baselines.deep_ensembles import (
    deep_ensemble_for,
    reference_checkpoint,
    stored_copies,
)
from hydra_core.baselines.mc_dropout import dropout_modules, dropout_rate
from hydra_core.baselines.systems import (
    MCDropoutBaseline,
    SharedBackboneBaseline,
    TemperatureBaseline,
)
from hydra_core.evaluate import format_intervals
from hydra_core.experiment.evaluate import evaluate_systems, hydra_systems
from hydra_core.experiment.run import STAGES, system_name
from hydra_core.hydra.finetune import OPTIMIZERS, FinetuneConfig
from hydra_core.hydra.fused import save_hydra
from hydra_core.models.preprocess import describe
from hydra_core.ood_scores import SCORES, rescore_report
from hydra_ui.comparisons import ensembling_verdict
from hydra_ui.context import disk_cache, get_context, results
from hydra_ui.efficient import efficient_choices
from hydra_ui.figures import cost_scatter, difference_plot, reliability_diagram, roc_curves
from hydra_ui.hydra_wait import hydra_estimate
from hydra_ui.jobs import start_job
from hydra_ui.portable import onnx_export
from hydra_ui.sweeps import show_sweeps
from hydra_ui.texts import most_uncertain, readable
from hydra_ui.waits import whole_run_progress
from hydra_ui.widgets import (
    figure_with_download,
    job_outcome,
    show_error,
    table_with_download,
    watch_job,
)

JOB = "hydra"
COST_AXES = {
    "macs": "multiply-adds (batch)",
    "params": "parameters",
    "latency_ms": "latency (ms / batch)",
}
#: Summary columns compared with the single model, and how the page names them.
DIFFERENCES = {
    "accuracy": "accuracy",
    "nll": "NLL",
    "ece": "ECE",
    "near_auroc": "AUROC near",
    "far_auroc": "AUROC far",
    "all_auroc": "AUROC all (mean of sets)",
    "all_fpr95": "FPR@95 all",
    "ood_mi": "MI (OOD)",
}

st.title("Hydra")
st.caption(
    "The members are fused into one model (paper 4.2): their token streams are stacked, "
    "attention runs for every member's heads in one grouped call, the MLP is shared. It is "
    "evaluated on the report split, which head selection never saw, next to the single "
    "model, each member alone, the members run one by one (unfused) and the baselines "
    "(MC Dropout, temperature scaling, Deep Ensembles where copies exist)."
)


def start_evaluation(
    context,
    members,
    label: str,
    finetune,
    deep: bool,
    latency: bool,
    repeats: int,
    train_set,
    baselines: list,
    stages: list,
) -> None:
    # A private copy of the model: heads other pages ablate with hooks must not reach it.
    loaded = dataclasses.replace(context.loaded, model=copy.deepcopy(context.loaded.model))
    source = context.config.model

    def work(job):
        # one time left for the whole run, each stage weighed by its estimate (hydra_wait)
        named = lambda *step: stage_label(*step, noun=context.noun)  # noqa: E731
        progress = whole_run_progress(job, [(s.name, s.seconds) for s in stages], named)
        job.report("**Evaluation**: starting (predictions made before are read from the cache)")
        systems = hydra_systems(
            members,
            label=label,
            finetune=finetune,
            train_set=train_set,
            deep_ensemble=deep_ensemble_for(source) if deep else None,
        )
        return evaluate_systems(
            loaded,
            context.benchmark,
            systems + baselines,
            device=context.device,
            bf16=context.bf16,
            cache=disk_cache(),
            progress=progress,
            latency=latency,
            latency_repeats=repeats,
            latency_warmup=1,  # the page's quick look; the command line warms up 3 rounds
        )

    results()["jobs"][JOB] = start_job(
        JOB, work, {"members": [m.name for m in members], "label": label}
    )


#: the summary's columns a reader looks at first, in this order; the others follow
SUMMARY_FIRST = (
    "system",
    "heads",
    "accuracy",
    "near_auroc",
    "far_auroc",
    "all_auroc",
    "all_fpr95",
    "nll",
    "ece",
    "id_mi",
    "ood_mi",
)


#: how the page names the OOD scores (docs/ood-scores.md)
SCORE_NAMES = {
    "msp": "MSP (the paper's)",
    "max_logit": "max logit",
    "energy": "energy",
    "entropy": "entropy",
    "mutual_information": "mutual information (ensembles)",
    "mahalanobis": "Mahalanobis (fitted on the ID search split)",
    "vim": "ViM (fitted on the ID search split)",
    "knn": "KNN (fitted on the ID search split)",
}


def under_score(report, score: str, benchmark):
    """The report under the OOD score ``score`` (kept per score until the report changes), and
    the systems the score does not apply to."""
    if score == "msp":
        return report, []
    kept = results().get("hydra_scores")
    if kept is None or kept["report"] is not report:
        kept = results()["hydra_scores"] = {"report": report}
    if score not in kept:
        with st.spinner(f"Scoring every system with {SCORE_NAMES[score]}"):
            with warnings.catch_warnings(record=True) as caught:  # the fits' (ViM on few items)
                warnings.simplefilter("always", UserWarning)
                kept[score] = rescore_report(report, [score], benchmark).get(score)
        said = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
        kept[f"{score} warnings"] = list(dict.fromkeys(said))
    for message in kept[f"{score} warnings"]:
        st.warning(message)
    scored = kept[score]
    if scored is None:
        return None, report.systems
    return scored, [s for s in report.systems if s not in scored.evaluations]


def summary_order(summary: pd.DataFrame) -> list[str]:
    """The summary's columns with the AUROCs up front (a wide table scrolls; the system column
    stays pinned)."""
    first = [c for c in SUMMARY_FIRST if c in summary]
    rest = [c for c in summary if c not in first and not c.endswith(("_lo", "_hi"))]
    return first + rest


def stage_label(stage: str, done: int, total: int, noun: str) -> str:
    """What the progress bar says in each stage of the evaluation (hydra_core's STAGES)."""
    kind, _, what = stage.partition(": ")
    if kind == STAGES["evaluate"]:
        return f"**Evaluation** of {what}: {done:,} of {total:,} report {noun}"
    if kind == STAGES["temperature"]:
        return f"**Temperature** fit: {done:,} of {total:,} ID search {noun} predicted"
    if kind == STAGES["finetune"]:
        return f"**Fine-tuning** {what}: step {done:,} of {total:,}"
    if kind == STAGES["macs"]:
        return f"**Cost**: multiply-adds of model {done} of {total}"
    if kind == STAGES["intervals"]:
        return f"**Intervals**: bootstrap of system {done} of {total}"
    if kind.startswith(STAGES["latency"]):
        return f"**Latency**: timed round {done} of {total} (every system once per round)"
    return f"**{stage}**: {done} of {total}"


def roc_frame(report, system: str, ood_set: str) -> pd.DataFrame:
    fpr, tpr = report.roc(system, ood_set)
    frame = pd.DataFrame({"fpr": fpr, "tpr": tpr})
    auroc, lo, hi = report.roc_auroc(system, ood_set)
    frame.attrs.update(auroc=auroc, auroc_ci95=(lo, hi))
    return frame


def fused_file(hydra, loaded) -> bytes:
    """The fused model as a safetensors file: `load_model` evaluates it like its source (a text
    model's file names the source's tokenizer, which it loads again)."""
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder) / "hydra.safetensors"  # a download: the bytes, not a file on disk
        save_hydra(
            hydra,
            tmp,
            preprocess=describe(loaded.preprocess),
            source=loaded.name,
            classes=loaded.classes,
        )
        return tmp.read_bytes()


def baseline_choices(context, running: bool, train_split: bool) -> list:
    """The baselines the user ticks: temperature scaling, MC Dropout with the model's own dropout
    or, for a model trained without dropout, a post-hoc rate, and Deep Ensembles (D) on a shared
    backbone when the ID set has a training split."""
    st.markdown("**Baselines** (evaluated on the same report split, paired intervals)")
    modality = context.loaded.modality
    if st.checkbox(
        "Deep Ensembles (D): three fresh heads on the model's backbone",
        value=False,
        disabled=running or not train_split,
        help=f"The paper's text baseline: the backbone shared, one head per seed trained on the "
        f"{modality.default_id} training {modality.noun} (3 epochs, the epoch of lowest NLL on "
        "the ID search split kept)"
        if train_split
        else "Needs the embedded ID set's training split; ID data of your own has none",
    ):
        shared = [SharedBackboneBaseline(train_set=lambda: modality.load_id("train"))]
    else:
        shared = []
    c1, c2, c3 = st.columns(3)
    chosen = shared
    if c1.checkbox(
        "Temperature scaling",
        value=True,
        disabled=running,
        help="The single model's logits divided by one temperature fitted to the NLL on the ID "
        "search split (never on a reported item)",
    ):
        chosen.append(TemperatureBaseline())
    model = context.loaded.model
    own = dropout_rate(model)
    # ticked when the model has dropout of its own; post hoc (a model trained without dropout,
    # the default ViT) it is a variant the model never saw and most of the page's time: opt-in
    mc = c2.checkbox(
        "MC Dropout",
        value=own > 0,
        disabled=running,
        help="Off by default for a model trained without dropout: post-hoc MC Dropout samples a "
        "rate it never saw, and its passes (attention leaves the fused kernel with dropout on) "
        "took 59 % of this page's time on the default ViT at Setup's default sizes",
    )
    passes = int(c3.number_input("MC Dropout passes", 2, 50, 5, disabled=running or not mc))
    if not mc:
        return chosen
    if own > 0:
        st.caption(f"MC Dropout samples the model's own dropout (p = {own:g}) on every pass.")
        chosen.append(MCDropoutBaseline(passes=passes))
    elif dropout_modules(model):
        rate = st.number_input("Post-hoc dropout rate", 0.01, 0.9, 0.1, step=0.05, disabled=running)
        st.caption(
            "This model was trained without dropout (its dropout modules have p = 0): MC "
            f"Dropout samples dropout at p = {rate:g} it never saw in training, the post-hoc "
            "variant, named so in the tables."
        )
        chosen.append(MCDropoutBaseline(passes=passes, rate=rate))
    else:
        st.caption("MC Dropout: this model has no dropout modules to sample.")
    return chosen


#: the comparisons' columns shown first
COMPARED_FIRST = ("all_auroc", "near_auroc", "far_auroc", "all_fpr95")


def against_baselines(report, label: str) -> None:
    """The fused ensemble minus each baseline, its unfused members and its best member, paired."""
    st.subheader(f"{label} (fused) against the baselines and its best member")
    table = report.comparisons(label, list(DIFFERENCES))
    shown = format_intervals(table, signed=True).rename(columns=DIFFERENCES)
    shown = shown.rename(
        columns={"macs_ratio": "MACs ratio", "against_macs_ratio": "its MACs ratio"}
    )
    # the AUROCs first, in view without a sideways scroll; the fused system is the heading's
    first = ["against", "role", *(DIFFERENCES[c] for c in COMPARED_FIRST)]
    shown = shown[first + [c for c in shown if c not in first and c != "system"]]
    table_with_download(shown, "hydra_against_baselines.csv", pinned=("against",))
    st.caption(
        "Fused ensemble minus the system named in *against*, on the same items, with the paired "
        "95% interval; **(n.s.)**: the interval contains 0. The best member is the member with "
        "the highest AUROC all (mean over the OOD sets). MACs ratios: multiply-adds over the "
        "single model's."
    )
    st.markdown(ensembling_verdict(table))  # near and far apart, then all sets


def uncertain_view(context, report) -> None:
    """A text model's report sentences on which the fused ensemble is most uncertain, with what
    each member predicts: the texts behind the mutual information in the tables."""
    setup = report.setup
    fused = report.find(setup["label"], "fused")
    st.subheader("Where the ensemble is most uncertain")
    c1, c2 = st.columns([3, 1])
    everywhere = "all report sets"
    where = c1.selectbox(
        "Sentences from",
        [everywhere, context.benchmark.id_report.name, *setup["ood_sets"]],
        format_func=lambda n: n if n in setup["ood_sets"] or n == everywhere else f"{n} (ID)",
    )
    top = int(c2.number_input("Sentences shown", 5, 500, 20, step=5))
    table = most_uncertain(
        report.evaluations[fused],
        context.benchmark,
        members=setup["members"],
        classes=context.loaded.classes,
        sets=None if where == everywhere else [where],
        top=top,
    )
    st.table(readable(table), hide_index=True)  # a static table wraps the sentences
    st.download_button(
        "Download CSV",
        table.to_csv(index=False).encode(),
        file_name="hydra_most_uncertain.csv",
        mime="text/csv",
        key="csv-hydra_most_uncertain",
    )
    st.caption(
        f"{fused} on the report split, sorted by mutual information: the entropy of the "
        "ensemble's prediction (mean of the member probabilities) minus the members' mean "
        "entropy, in nats; high where the members disagree. prediction and probability are the "
        "ensemble's, true class is known for ID sentences only; one column per member gives its "
        "predicted class."
    )


with show_error("Could not assemble or evaluate the Hydra ensemble"):
    context = get_context()
    members = results().get("members", [])
    job = results()["jobs"].get(JOB)
    running = job is not None and job.running
    if not members:
        st.info("No members yet: build the members' head masks on the Masks page first.")
        show_sweeps(("members", "corruption"), context.loaded)
        st.stop()
    st.markdown("**Members:** " + ", ".join(f"{m.name} ({m.kept} heads)" for m in members))

    c1, c2, c3 = st.columns(3)
    label = c1.text_input("Ensemble name", "Hydra", disabled=running).strip() or "Hydra"
    latency = c2.checkbox(
        "Measure latency",
        value=True,
        disabled=running,
        help=f"On {context.device.type}, {context.config.precision}, batches of 32 {context.noun}",
    )
    repeats = int(
        c3.number_input(
            "Timed calls per system",
            3,
            200,
            5,
            disabled=running,
            help="Latency is the median of these calls, after one untimed round; the command "
            "line (`hydra --latency-repeats`) takes 20. Each call of MC Dropout is all its passes.",
        )
    )
    # members train on the embedded ID set's training split; data of your own has none
    modality = context.loaded.modality
    can_tune = context.config.id_source is None
    tune = st.toggle(
        "Fine-tune each member first (paper 4.3)",
        disabled=running or not can_tune,
        help=None
        if can_tune
        else f"Needs a training split: the embedded ID set ({modality.default_id}) has one, "
        "ID data of your own does not",
    )
    finetune, train_set = None, None
    if tune:
        train_set = modality.load_id("train")
        d = FinetuneConfig()  # the recipe selected on validation images (hydra.finetune)
        c1, c2, c3, c4, c5 = st.columns(5)
        optimizer = c1.selectbox(
            "Optimizer", OPTIMIZERS, index=OPTIMIZERS.index(d.optimizer), disabled=running
        )
        lr = c2.number_input("Learning rate", 1e-6, 1.0, d.lr, format="%.0e", disabled=running)
        epochs = c3.number_input("Epochs", 0.05, 20.0, float(d.epochs), step=0.25, disabled=running)
        smoothing = c4.number_input(
            "Label smoothing", 0.0, 0.5, d.label_smoothing, step=0.05, disabled=running
        )
        most = len(train_set)
        n_train = int(
            c5.number_input(
                f"Training {context.noun}",
                128,
                most,
                min(d.n_train, most),
                step=1000,
                disabled=running,
            )
        )
        finetune = FinetuneConfig(
            optimizer=optimizer,
            lr=lr,
            epochs=epochs,
            label_smoothing=smoothing,
            n_train=n_train,
        )
        st.caption(
            f"Each member is trained separately on {modality.default_id} training "
            f"{modality.noun} (apart from the search and report splits), then fused with the "
            "MLPs averaged; fine-tuned weights are cached. The defaults were chosen on "
            "Fashion-MNIST validation images for the default ViT (held out of training, never "
            "reported; label smoothing 0.1, the paper's, made the averaged members "
            "under-confident there, see hydra_core.hydra.finetune): for another model, a "
            "starting point."
        )
    copies = stored_copies(context.config.model)
    use_deep = False
    if copies:
        use_deep = st.checkbox(
            f"Include Deep Ensembles ({len(copies) + 1} independently trained models)",
            value=True,
            disabled=running,
        )
    else:
        trainable = reference_checkpoint(context.config.model) is not None
        st.caption(
            "Deep Ensembles: no independently trained copies of this model are stored"
            + (" (train them with `python -m hydra_core train-ensemble`)." if trainable else ".")
        )

    baselines = baseline_choices(context, running, can_tune)
    baselines += efficient_choices(context, running)

    stages = []
    if not running:  # its time at these sizes, from one batch timed on this machine
        shared = any(isinstance(b, SharedBackboneBaseline) for b in baselines)
        train_items = 0
        if tune or shared:
            train_items = len(train_set if train_set is not None else modality.load_id("train"))
        with st.spinner("Timing one batch of each model for the estimate..."):
            stages, note = hydra_estimate(
                context,
                members,
                label,
                results(),
                cache=disk_cache(),
                finetune=finetune,
                train_items=train_items,
                copies=len(copies) + 1 if use_deep else 0,
                baselines=baselines,
                latency=latency,
                repeats=repeats,
            )
        st.caption(note)
    if st.button(
        "Assemble and evaluate", type="primary", icon=":material/merge:", disabled=running
    ):
        start_evaluation(
            context,
            members,
            label,
            finetune,
            use_deep,
            latency,
            repeats,
            train_set,
            baselines,
            stages,
        )
        st.rerun()
    if running:
        starting = "**Evaluation**: starting"
        watch_job(job, lambda j: j.progress or starting, left="left of the whole run")
    else:
        job_outcome(job, "The evaluation")
        if job is not None and job.result is not None and not job.info.get("stored"):
            job.info["stored"] = True
            results()["hydra"] = (job.result, job.info["members"])

    found = results().get("hydra")
    if found is not None and not running:
        report, used = found
        if used != [m.name for m in members]:
            st.warning(
                f"These results are for the members {', '.join(used)}; the members have "
                "changed since. Evaluate again to update them."
            )
        setup = report.setup
        st.caption(
            f"Report split: {setup['id_set']}; OOD: "
            + ", ".join(f"{n} ({s['group']}, n={s['n']})" for n, s in setup["ood_sets"].items())
            + f". Device: {setup['device']}{' (bf16)' if setup['bf16'] else ''}; "
            + f"{setup['machine']}."
        )
        for name, reason in setup.get("skipped", {}).items():
            st.info(f"{name} left out: {reason}")
        score = st.selectbox(
            "OOD score",
            list(SCORES),
            format_func=SCORE_NAMES.get,
            help="The score the OOD metrics (AUROC, FPR@95, AUPR) and the ROC use; higher = more "
            "OOD. Feature scores read each model's penultimate features and are fitted on the ID "
            "search split only.",
        )
        full = report
        report, left_out = under_score(full, score, context.benchmark)
        if report is None:
            st.warning(f"No system here has the {SCORE_NAMES[score]} score.")
            report = full
        elif left_out:
            st.info(
                f"{', '.join(left_out)}: no {SCORE_NAMES[score]} score (mutual information needs "
                "an ensemble's members; feature scores a model's own penultimate features, which "
                "a fused Hydra model, MC Dropout and temperature scaling do not give one by one)."
            )
        st.subheader("Summary")
        summary = report.summary()
        table_with_download(
            format_intervals(summary)[summary_order(summary)],
            "hydra_summary.csv",
            float_format="{:.4g}",
            pinned=("system",),
        )
        st.caption(
            "Accuracy, NLL, Brier, ECE and adaptive ECE on ID; AUROC, FPR@95, AUPR-In/Out "
            f"(OOD = positive, score = {SCORE_NAMES[report.setup.get('score', 'msp')]}) averaged "
            "over near, far and all OOD sets (the mean of the per-set values, each set counting "
            "alike; the ROC plot's pooled AUROC puts the items of all sets in one curve instead, "
            "so it differs a little); MI and "
            "disagreement are the ensembles' diversity on ID and OOD. ± is half the width of the "
            f"95% bootstrap interval ({setup['bootstrap']['n_boot']} resamples of the report "
            f"{context.noun}, ID within each class, each OOD set within itself); the exact bounds "
            "are in the JSON report."
        )
        if modality.shows_as_text:
            uncertain_view(context, report)
        if "single" in report.systems:
            st.subheader("Difference to the single model")
            differences = report.differences("single", list(DIFFERENCES))
            shown = format_intervals(differences, signed=True).rename(columns=DIFFERENCES)
            table_with_download(shown, "hydra_differences_to_single.csv", pinned=("system",))
            st.caption(
                f"System minus single model on the same {context.noun}; ± is half the width of "
                "the paired 95% bootstrap interval (both systems resampled alike). **(n.s.)**: not "
                "significant, the interval contains 0."
            )
            column = st.selectbox(
                "Difference shown", list(DIFFERENCES), index=5, format_func=DIFFERENCES.get
            )
            if differences[column].notna().any():
                figure_with_download(
                    difference_plot(differences, column, metric_title=DIFFERENCES[column]),
                    f"hydra_difference_{column}",
                )
            if system_name(setup["label"], "fused") in report.systems:
                against_baselines(report, setup["label"])
            else:  # a feature score: the fused model gives no features of its own (see above)
                st.caption(
                    "The comparison of the fused ensemble with its baselines and best member "
                    "needs the fused model, which this score does not apply to: choose MSP or a "
                    "logit score for it."
                )
        with st.expander("Every metric per OOD set", expanded=True):
            table_with_download(format_intervals(report.table()), "hydra_metrics_per_set.csv")

        systems = report.systems
        fused, unfused = (
            full.find(setup["label"], "fused"),
            full.find(setup["label"], "unfused"),
        )
        baseline_kinds = ("deep-ensemble", "mc-dropout", "temperature", "efficient-ensemble")
        default = ["single", fused, unfused] + [
            s for s in systems if report.info[s].kind in baseline_kinds
        ]
        default = [s for s in default if s in systems]
        chosen = st.multiselect("Systems in the plots", systems, default=default)
        if chosen:
            left, right = st.columns(2)
            with left:
                figure_with_download(
                    reliability_diagram(
                        {s: report.reliability(s) for s in chosen},
                        title="Reliability (ID report split)",
                    ),
                    "hydra_reliability",
                )
            with right:
                ood_names = list(setup["ood_sets"])
                where = st.selectbox(
                    "ROC against",
                    ["all", *ood_names],
                    format_func=lambda n: "all OOD sets pooled" if n == "all" else n,
                )
                pooled = where == "all"
                figure_with_download(
                    roc_curves(
                        {s: roc_frame(report, s, where) for s in chosen},
                        title=f"ROC, OOD = positive ({'all OOD sets pooled' if pooled else where})",
                        auroc_name="pooled AUROC" if pooled else "AUROC",
                    ),
                    f"hydra_roc_{where}",
                )

        if report.cost is not None:
            st.subheader("Cost")
            table_with_download(report.cost.reset_index(), "hydra_cost.csv", float_format="{:.4g}")
            st.caption(
                f"Parameters, multiply-adds for a batch of {setup['latency_batch']} "
                f"{context.noun}, and "
                f"latency (median of {setup['latency_repeats']} round-robin calls) on "
                f"{setup['device']}; ratios are to the single model."
            )
            axes = [a for a in COST_AXES if a in summary]
            axis = st.radio("Cost axis", axes, format_func=COST_AXES.get, horizontal=True)
            points = summary[["system", axis, "all_auroc", "all_auroc_lo", "all_auroc_hi"]]
            points = points.dropna()
            figure_with_download(
                cost_scatter(
                    points,
                    x=axis,
                    y="all_auroc",
                    x_title=COST_AXES[axis],
                    y_title="OOD AUROC (mean over sets, 95% bars)",
                ),
                f"hydra_cost_vs_auroc_{axis}",
            )

        st.subheader("Export")
        c1, c2 = st.columns(2)
        hydra = full.info[fused].models[0]
        c1.download_button(
            "Fused model (safetensors)",
            lambda: fused_file(hydra, context.loaded),
            file_name="hydra.safetensors",
            mime="application/octet-stream",
            icon=":material/download:",
            on_click="ignore",
        )
        c2.download_button(
            "Report (JSON)",
            lambda: json.dumps(full.to_json(), indent=2),
            file_name="hydra_report.json",
            mime="application/json",
            icon=":material/download:",
            on_click="ignore",
        )
        st.caption(
            "The fused model loads back with its source's preprocessing "
            f"({context.loaded.name}): `python -m hydra_core eval --model hydra.safetensors`, "
            "or `hydra_core.load_model(path)`; its forward gives each member's logits (B, M, C) "
            "from the model inputs its source takes."
        )
        onnx_export(hydra, context.loaded, used, results())
    show_sweeps(("members", "corruption"), context.loaded)
