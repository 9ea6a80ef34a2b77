"""Evaluating systems side by side: :func:`evaluate_systems` puts any
:class:`~hydra_core.experiment.systems.System` (the single model, pruned models, Hydra ensembles,
the baselines) on a benchmark's report split, one after another, measures their cost and gives
one :class:`~hydra_core.experiment.results.SystemsReport`; :func:`hydra_systems` is the usual
list of them.

Every system says what data chose it (:meth:`~hydra_core.experiment.systems.System.chosen_on`:
the items its heads were searched on, its weights fine-tuned on, its temperature fitted on), and
:func:`evaluate_systems` refuses to report it on a set that shares an item with them
(:class:`~hydra_core.data.provenance.ChosenOn`), before anything is predicted.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from hydra_core import distributed
from hydra_core.baselines.deep_ensembles import DeepEnsemble
from hydra_core.cache import DiskCache
from hydra_core.evaluate import INTERVAL_METHOD, resolve_device
from hydra_core.experiment.results import SystemsReport, machine_description
from hydra_core.experiment.run import STAGES, Run
from hydra_core.experiment.systems import System
from hydra_core.hydra.finetune import FinetuneConfig, FinetunedMember
from hydra_core.hydra.systems import Hydra, Pruned, Single
from hydra_core.masks import MemberMask
from hydra_core.metrics.bootstrap import LEVEL, BootstrapConfig
from hydra_core.types import StageProgress


def hydra_systems(
    members: Sequence[MemberMask] | Sequence[FinetunedMember],
    *,
    label: str = "Hydra",
    pruned: dict[str, torch.Tensor] | None = None,
    finetune: FinetuneConfig | None = None,
    finetune_seeds: Sequence[int] | None = None,
    train_set=None,
    deep_ensemble: Sequence[nn.Module] | None = None,
) -> list[System]:
    """The usual experiment: the single model, the given pruned models, a Hydra ensemble of
    ``members`` and, when given, Deep Ensembles."""
    systems: list[System] = [Single()]
    systems += [Pruned(name, keep) for name, keep in (pruned or {}).items()]
    systems.append(Hydra(members, label, finetune, finetune_seeds, train_set))
    if deep_ensemble is not None:
        systems.append(DeepEnsemble(deep_ensemble))
    return systems


def evaluate_systems(
    loaded,
    benchmark,
    systems: Sequence[System] | Sequence[MemberMask] | Sequence[FinetunedMember],
    *,
    device: str | torch.device | None = "auto",
    bf16: bool = False,
    cache: DiskCache | None = None,
    progress: StageProgress | None = None,
    latency: bool = True,
    latency_batch: int = 32,
    latency_repeats: int = 20,
    latency_warmup: int = 3,
    batch_size: int = 256,
    score: str = "msp",
    bootstrap: BootstrapConfig | None = None,
    **shorthand,
) -> SystemsReport:
    """Evaluate ``systems`` on the report split, one after another, and measure their cost.

    Args:
        loaded: a :class:`~hydra_core.zoo.registry.LoadedModel` (the source model).
        benchmark: a :class:`~hydra_core.data.benchmark.Benchmark`; systems are reported on its
            report parts.
        systems: :class:`System` objects (the first is the reference of the paired intervals:
            put :class:`Single` first), e.g. ``[Single(), Hydra(members), MCDropoutBaseline()]``.
            Shorthand: member masks (or fine-tuned members) stand for :func:`hydra_systems` of
            them, with its keyword arguments (``label``, ``pruned``, ``finetune``,
            ``finetune_seeds``, ``train_set``, ``deep_ensemble``) passed here.
        device: "auto", "cpu" or "cuda"; bf16: predict under bfloat16 autocast (meant for CUDA).
        cache: predictions and fine-tuned weights are read from and saved to it.
        progress: ``progress(stage, done, total)`` through every stage (:data:`STAGES`):
            fine-tuning steps per member, report items predicted per system, models whose
            multiply-adds are counted, latency rounds, systems whose intervals are computed.
        latency: measure latency (otherwise params and multiply-adds only).
        latency_batch: items per forward when timing; latency_repeats: timed calls per system,
            after latency_warmup untimed rounds.
        batch_size: items per forward when predicting; score: the OOD score.
        bootstrap: resamples and seed of the 95% intervals (computed at the end, stage
            "intervals" of ``setup["seconds"]``).

    Systems that do not apply to the model (MC Dropout without dropout, ...) are left out and
    listed with their reason in ``setup["skipped"]``.

    In a distributed job (:mod:`hydra_core.distributed`) every process runs this call: each
    predicts a share of every set's items, every process gets all the predictions (so the
    metrics, intervals and AUROCs are those of all items), and rank 0 alone measures the cost.
    """
    systems = _as_systems(systems, shorthand)
    device = resolve_device(device)
    loaded.model.to(device).eval()
    bootstrap = bootstrap or BootstrapConfig()
    options = dict(
        device=device, cache=cache, batch_size=batch_size, score=score, bf16=bf16,
        bootstrap=bootstrap,
    )  # fmt: skip
    run = Run(loaded, benchmark, device, options, progress)
    for system in systems:  # refused before anything is predicted
        run.check_unseen(system)
    for system in systems:
        system.add_to(run)
    id_set, ood_sets = benchmark.id_report, list(benchmark.ood_report)
    hydras = [s for s in systems if isinstance(s, Hydra)]
    setup = {
        "device": str(device),
        "bf16": bf16,
        "score": score,
        "systems": [s.describe() for s in systems],
        "skipped": dict(run.skipped),
        "id_set": f"{id_set.name} (report split, n={len(id_set)})",
        "ood_sets": {s.name: {"group": s.group, "n": len(s)} for s in ood_sets},
        "latency_batch": latency_batch,
        "latency_repeats": latency_repeats,
        "latency_warmup": latency_warmup,
        "torch_threads": torch.get_num_threads(),
        "machine": machine_description(device),
        "bootstrap": {
            "n_boot": bootstrap.n_boot,
            "seed": bootstrap.seed,
            "level": LEVEL,
            "method": INTERVAL_METHOD,
        },
        "seconds": run.seconds,
    }
    if hydras:  # the first Hydra ensemble's facts, as reports and the app read them
        described = hydras[0].describe()
        setup.update(label=described["label"], members=described["members"])
        setup["finetune"] = described["finetune"]
        tuned = hydras[0].tuned
        if tuned is not None and hydras[0].finetune is not None:
            setup["finetune_seconds"] = {m.name: m.seconds for m in tuned}
            setup["finetune_cached"] = {m.name: m.cached for m in tuned}
    report = SystemsReport(run.evaluations, run.info, None, setup)
    items = loaded.preprocess(id_set.inputs[:latency_batch]).to(device)  # images or texts
    # in a distributed job rank 0 alone times, on a machine the other processes leave quiet
    measure = lambda: report.measure(
        items, latency=latency, repeats=latency_repeats, warmup=latency_warmup, progress=progress
    )
    report.cost = run.timed("cost", lambda: distributed.from_main(measure))
    stage = STAGES["intervals"]
    report_intervals = (lambda done, total: progress(stage, done, total)) if progress else None
    run.timed("intervals", lambda: report.compute_intervals(report_intervals))
    return report


def _as_systems(systems: Sequence, shorthand: dict) -> list[System]:
    """``systems`` as System objects: member masks or fine-tuned members stand for
    :func:`hydra_systems` of them (with the shorthand keywords)."""
    systems = list(systems)
    if not systems:
        raise ValueError(
            "no systems: pass the systems to evaluate (e.g. [Single(), Hydra(members)]) or the "
            "member masks"
        )
    if all(isinstance(s, System) for s in systems):
        if shorthand:
            raise TypeError(
                f"{', '.join(sorted(shorthand))}: these keywords describe member masks; with "
                "System objects, put them in the systems (Pruned, Hydra, DeepEnsemble, ...)"
            )
        return systems
    if any(isinstance(s, System) for s in systems):
        raise TypeError("pass System objects or member masks, not a mix")
    known = {"label", "pruned", "finetune", "finetune_seeds", "train_set", "deep_ensemble"}
    unknown = sorted(set(shorthand) - known)
    if unknown:
        raise TypeError(f"evaluate_systems() got unexpected keyword arguments {unknown}")
    return hydra_systems(systems, **shorthand)
