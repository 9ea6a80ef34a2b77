"""How long the Hydra page's evaluation will take, said before it starts: one batch of the report
split timed on this machine through the source model, the fused model and (when chosen) one MC
Dropout pass, a count of the model's multiply-adds, and the bootstrap of one system timed on a
few resamples, scaled by the counts of the run (:func:`hydra_ui.estimates.hydra_stages`);
predictions already in the cache count nothing. Nothing here touches Streamlit.
"""

from __future__ import annotations

import copy
import math
import statistics
import time

import torch

from hydra_core.baselines.mc_dropout import MCDropout
from hydra_core.baselines.systems import (
    MCDropoutBaseline,
    SharedBackboneBaseline,
    TemperatureBaseline,
)
from hydra_core.cache import model_fingerprint
from hydra_core.evaluate import Evaluation, SetPredictions, predictions_cached
from hydra_core.hydra.fused import fuse_members
from hydra_core.hydra.systems import system_name
from hydra_core.inference import predict
from hydra_core.metrics.bootstrap import BootstrapConfig
from hydra_ui.estimates import (
    MINUTES,
    HydraRun,
    HydraUnits,
    Stage,
    hydra_stages,
    largest_within,
    total_seconds,
)
from hydra_ui.jobs import format_seconds

#: items timed through each model (after a warm-up call on a few), and how many times
TIMED_ITEMS = 32
TIMINGS = 3
#: resamples the bootstrap is timed on (scaled to the run's)
TIMED_RESAMPLES = 20
#: the report sizes per set offered when a run takes longer than :data:`MINUTES`
REPORT_SIZES = (250, 500, 1000, 2000, 5000)


def seconds_per_item(
    module, inputs, preprocess, device, bf16: bool = False, batch_size: int = 256
) -> tuple[float, float]:
    """Seconds per item of ``module``'s forward on ``device`` in batches of ``batch_size``, and
    in batches of ``len(inputs)``: the medians of :data:`TIMINGS` calls on a quarter of
    ``inputs`` and on all of them, after a warm-up call, extended along the line through both
    (a fixed part per call, then a cost per item: a batch of 256 costs less per item than one
    of 32). On a shared machine one call can land in a moment of more or less load, hence the
    medians."""

    def timed(items) -> float:
        seconds = []
        for _ in range(TIMINGS):
            start = time.perf_counter()
            predict(module, items, preprocess, batch_size=len(items), device=device, bf16=bf16)
            seconds.append(time.perf_counter() - start)
        return statistics.median(seconds)

    few, many = len(inputs) // 4, len(inputs)
    with torch.inference_mode():
        predict(module, inputs[:few], preprocess, batch_size=few, device=device, bf16=bf16)
        low, high = timed(inputs[:few]), timed(inputs)
    per_item = (high - low) / (many - few)
    if per_item <= 0:  # noise larger than the difference: the larger batch's own rate
        return high / many, high / many
    fixed = max(0.0, low - per_item * few)
    return per_item + fixed / batch_size, high / many


def interval_seconds(benchmark, classes: int, n_boot: int) -> float:
    """Seconds of one system's bootstrap intervals on the report split (``n_boot`` resamples):
    timed on random logits of the report sets' sizes at :data:`TIMED_RESAMPLES` and at four
    times as many resamples, and extended along the line through both (a fixed part, then a
    cost per resample)."""
    generator = torch.Generator().manual_seed(0)
    id_set, sets = benchmark.id_report, benchmark.ood_report

    def timed(resamples: int) -> float:
        evaluation = Evaluation(
            "timing",
            SetPredictions(
                id_set.name,
                "id",
                torch.randn(len(id_set), classes, generator=generator),
                id_set.labels,
            ),
            [
                SetPredictions(s.name, s.group, torch.randn(len(s), classes, generator=generator))
                for s in sets
            ],
            bootstrap=BootstrapConfig(n_boot=resamples),
        )
        start = time.perf_counter()
        evaluation.replicates()
        return time.perf_counter() - start

    few, more = TIMED_RESAMPLES, 4 * TIMED_RESAMPLES
    low, high = timed(few), timed(more)
    per_resample = max(0.0, high - low) / (more - few)
    return max(low, low + per_resample * (n_boot - few))


def macs_seconds(model, inputs, preprocess, device) -> float:
    """Seconds of counting one model's multiply-adds on a batch of 32 (as the run does)."""
    from hydra_core.hydra.cost import count_macs

    items = preprocess(inputs[:32]).to(device)
    start = time.perf_counter()
    with torch.inference_mode():
        count_macs(model, items)
    return time.perf_counter() - start


def measure_units(context, members, mc: MCDropoutBaseline | None) -> tuple[HydraUnits, str]:
    """The seconds per item of the source model, of the fused model of ``members`` and of one
    pass of ``mc`` on one batch of the report split, of counting the model's multiply-adds and
    of one system's intervals; and the fused model's fingerprint (which says whether its
    predictions are cached). The shared model is only read (other pages' jobs may use it)."""
    model, preprocess = context.loaded.model, context.loaded.preprocess
    inputs = context.benchmark.id_report.inputs[:TIMED_ITEMS]
    options = dict(device=context.device, bf16=context.bf16)
    fused = fuse_members([(model, m.keep) for m in members]).to(context.device).eval()
    mc_pass = (None, None)
    if mc is not None:
        mc_pass = seconds_per_item(
            # on a copy: the passes switch dropout on, which a job of another page using the
            # shared model must not see
            MCDropout(copy.deepcopy(model), 1, mc.seed, mc.rate),
            inputs,
            preprocess,
            **options,
        )
    single = seconds_per_item(model, inputs, preprocess, **options)
    ensemble = seconds_per_item(fused, inputs, preprocess, **options)
    units = HydraUnits(
        model=single[0],
        fused=ensemble[0],
        mc_pass=mc_pass[0],
        macs=macs_seconds(model, inputs, preprocess, context.device),
        intervals=interval_seconds(
            context.benchmark, context.loaded.num_outputs(), BootstrapConfig().n_boot
        ),
        small=(single[1], ensemble[1], mc_pass[1]),
    )
    return units, model_fingerprint(fused)


def hydra_run(
    context,
    members,
    label: str,
    fused: str,
    *,
    cache,
    finetune=None,
    train_items: int = 0,
    copies: int = 0,
    baselines=(),
    latency: bool = True,
    repeats: int = 5,
    batch_size: int = 256,
) -> HydraRun:
    """The counts of the evaluation the page is set to run, and which predictions the cache
    holds already (``fused``: the fused model's fingerprint)."""
    benchmark, model, bf16 = context.benchmark, context.loaded.model, context.bf16
    sets = [benchmark.id_report, *benchmark.ood_report]

    def cached(parts: tuple) -> bool:
        return all(predictions_cached(cache, parts, s, bf16=bf16) for s in sets)

    source = model_fingerprint(model)
    tuned = 0
    if finetune is not None:
        steps = finetune.steps or math.ceil(
            finetune.epochs
            * math.ceil(min(finetune.n_train or train_items, train_items) / finetune.batch_size)
        )
        tuned = steps * finetune.batch_size
    mc = None
    for system in baselines:
        if isinstance(system, MCDropoutBaseline):
            parts = ("mc-dropout", source, system.passes, system.seed, batch_size)
            parts += () if system.rate is None else (system.rate,)
            mc = (system.name, system.passes, cached(parts))
    return HydraRun(
        items=sum(len(s) for s in sets),
        search_items=len(benchmark.id_search),
        members=tuple(
            (system_name(label, "member", m.name), cached((source, m.keep))) for m in members
        ),
        fused=(system_name(label, "fused"), cached(("hydra", fused))),
        single_cached=cached((source, None)),
        finetune=tuned,
        temperature=any(isinstance(s, TemperatureBaseline) for s in baselines),
        mc=mc,
        copies=copies,
        shared=train_items if any(isinstance(s, SharedBackboneBaseline) for s in baselines) else 0,
        latency_rounds=1 + repeats if latency else 0,
    )


def hydra_note(
    stages: list[Stage], units: HydraUnits, run: HydraRun, noun: str, per_set: int
) -> str:
    """What the page says before the run: the time at these sizes by stage, what was timed, and
    what finishes within :data:`MINUTES` when this does not (``per_set``: the report items of
    the largest set, the size Setup cuts every set to)."""
    seconds = total_seconds(stages)
    parts: dict[str, float] = {}
    for stage in stages:
        parts[stage.label] = parts.get(stage.label, 0.0) + stage.seconds
    cached = run.single_cached + sum(c for _, c in run.members) + run.fused[1]
    shown = ", ".join(f"{label} {format_seconds(s)}" for label, s in parts.items() if s >= 0.5)
    read = f"; {cached} of the systems' predictions read from the cache" if cached else ""
    text = (
        f"At these sizes: about **{format_seconds(seconds)}** on this machine ({shown}{read}), "
        f"from calls timed here: {units.model * 1e3:.1f} ms per report item for the model, "
        f"{units.fused * 1e3:.1f} ms for the fused model (in batches of 256), {run.items:,} "
        f"report {noun} in all. "
        "The tables appear when it ends."
    )
    if seconds <= MINUTES:
        return text
    options = []
    for label in ("MC Dropout", "latency", "fine-tuning"):
        without = seconds - parts.get(label, 0.0)
        if parts.get(label) and without <= MINUTES:
            options.append(f"without {label}: {format_seconds(without)}")
    fits = largest_within(
        lambda size: scaled_seconds(stages, size / per_set),
        [size for size in REPORT_SIZES if size < per_set],
    )
    if fits:
        took = scaled_seconds(stages, fits / per_set)
        options.append(f"{fits:,} report {noun} per set (Setup): {format_seconds(took)}")
    if options:
        text += f" Within {format_seconds(MINUTES)}: {'; '.join(options)}."
    return text


def scaled_seconds(stages: list[Stage], share: float) -> float:
    """The run's seconds with every report set cut to ``share`` of its items: the predictions
    and the intervals scale with it, the fits, the cost and latency do not."""
    fixed = (
        "fine-tuning",
        "Deep Ensembles (D) training",
        "temperature fit",
        "latency",
        "multiply-adds",
    )
    return sum(s.seconds * (1 if s.label in fixed else min(1.0, share)) for s in stages)


def hydra_estimate(context, members, label: str, store: dict, **settings) -> tuple[list, str]:
    """The stages of the evaluation the page is set to run with their estimated seconds, and
    the note the page shows before it starts. The timings are made once per members and
    baselines and kept in ``store`` (the page's results of this setup); ``settings``: those of
    :func:`hydra_run`."""
    mc = next((s for s in settings.get("baselines", ()) if isinstance(s, MCDropoutBaseline)), None)
    key = (
        tuple((m.name, tuple(m.keep.flatten().tolist())) for m in members),
        None if mc is None else (mc.rate, mc.seed),
    )
    timed = store.setdefault("hydra_timings", {})
    if key not in timed:
        timed[key] = measure_units(context, members, mc)
    units, fused = timed[key]
    run = hydra_run(context, members, label, fused, **settings)
    stages = hydra_stages(run, units)
    per_set = max(len(s) for s in [context.benchmark.id_report, *context.benchmark.ood_report])
    return stages, hydra_note(stages, units, run, context.noun, per_set)
