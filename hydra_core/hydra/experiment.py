"""Evaluating systems side by side: the single model, pruned models, Hydra ensembles, baselines.

A *system* is anything :func:`evaluate_systems` can put on the report split: a :class:`System`
subclass whose :meth:`System.add_to` evaluates it through the :class:`Run` it is handed (the
source model, the benchmark, where and how to predict) and records what it is. The systems of
this module are Hydra's own: :class:`Single`, :class:`Pruned`, :class:`Hydra` (members, the
unfused ensemble and the fused model) and :class:`DeepEnsemble` (independently trained copies).
The baselines that are not pruned (MC Dropout, temperature scaling, the shared-backbone ensemble
of text models) are systems of :mod:`hydra_core.baselines`; a new system is one small class.

Every system is evaluated on the same report items: all intervals come from the same resamples,
so differences between systems are paired (:class:`~hydra_core.hydra.systems.SystemsReport`).

Every system says what data chose it (:meth:`System.chosen_on`: the items its heads were searched
on, its weights fine-tuned on, its temperature fitted on), and :func:`evaluate_systems` refuses to
report it on a set that shares an item with them
(:class:`~hydra_core.data.provenance.ChosenOn`). Pruned models and Hydra members are taken to be
chosen on the benchmark's search split unless they say otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from hydra_core import distributed
from hydra_core.cache import DiskCache, model_fingerprint
from hydra_core.data.provenance import ChosenOn, item_keys
from hydra_core.evaluate import (
    INTERVAL_METHOD,
    Evaluation,
    SetPredictions,
    evaluate_model,
    evaluate_system,
    resolve_device,
)
from hydra_core.hydra.finetune import (
    FinetuneConfig,
    FinetunedMember,
    finetune_member,
    finetune_members,
    fuse_finetuned,
    members_training_items,
)
from hydra_core.hydra.fused import fuse_members
from hydra_core.hydra.systems import SystemInfo, SystemsReport, machine_description, system_name
from hydra_core.masks import MemberMask
from hydra_core.metrics.bootstrap import LEVEL, BootstrapConfig
from hydra_core.models.adapter import head_layout, prune_heads
from hydra_core.types import StageProgress

#: The stages of :func:`evaluate_systems` in the order they run, as its ``progress`` names them:
#: ``"fine-tuning: <member>"``, ``"evaluation: <system>"``, then the others alone.
STAGES = {
    "finetune": "fine-tuning",
    "evaluate": "evaluation",
    "temperature": "temperature fit",
    "macs": "multiply-adds",
    "latency": "latency",
    "intervals": "intervals",
}


@dataclass
class Run:
    """What every system of one :func:`evaluate_systems` call shares, and what they produced.

    Attributes:
        loaded: the source model (:class:`~hydra_core.zoo.registry.LoadedModel`), on ``device``.
        benchmark: the :class:`~hydra_core.data.benchmark.Benchmark`; systems are evaluated on its
            report parts, and may fit on its search parts only (temperature scaling).
        options: keyword arguments of every evaluation (device, cache, batch size, score, bf16,
            bootstrap).
        evaluations, info: what the systems recorded, by system name, in order.
        skipped: systems that do not apply to this model, with the reason (e.g. no dropout).
        seconds: time per stage ("evaluate", "fuse", "finetune", ...).
    """

    loaded: object
    benchmark: object
    device: torch.device
    options: dict
    progress: StageProgress | None = None
    evaluations: dict[str, Evaluation] = field(default_factory=dict)
    info: dict[str, SystemInfo] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    _report_keys: list | None = field(default=None, init=False, repr=False)
    _search_choice: ChosenOn | None = field(default=None, init=False, repr=False)

    @property
    def model(self) -> nn.Module:
        return self.loaded.model

    def search_choice(self) -> ChosenOn:
        """What heads chosen on the benchmark's search split were chosen on: its ID part and
        its OOD search sets."""
        if self._search_choice is None:
            b = self.benchmark
            self._search_choice = ChosenOn.of("heads", [b.id_search, *b.ood_search])
        return self._search_choice

    def check_unseen(self, system: System) -> None:
        """Refuse ``system`` when any report item is among the items that chose it."""
        self.check_chosen(system.name, system.chosen_on(self))

    def check_chosen(self, name: str, chosen: ChosenOn) -> None:
        """Refuse to report ``name`` when any report item is among the items ``chosen``."""
        if self._report_keys is None:
            parts = [self.benchmark.id_report, *self.benchmark.ood_report]
            self._report_keys = [(p.name, item_keys(p.inputs)) for p in parts]
        chosen.check(name, self._report_keys)

    def timed(self, stage: str, fn: Callable):
        start = time.perf_counter()
        value = fn()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start
        return value

    def stage_progress(self, name: str) -> Callable[[str, int, int], None] | None:
        """The run's progress for the predictions of system ``name``: stage
        ``"evaluation: <name>"``, counting the report items predicted over all sets."""
        if self.progress is None:
            return None
        sets = [self.benchmark.id_report, *self.benchmark.ood_report]
        before, count = {}, 0
        for s in sets:
            before[s.name], count = count, count + len(s)
        stage = f"{STAGES['evaluate']}: {name}"
        return lambda s, done, total: self.progress(stage, before[s] + done, count)

    def evaluate(self, name: str, model: nn.Module, keep: torch.Tensor | None = None) -> Evaluation:
        """Evaluate a model (under the head mask ``keep``); predictions cached under its weights."""
        return self.timed(
            "evaluate",
            lambda: evaluate_model(
                model,
                self.loaded.preprocess,
                self.benchmark.id_report,
                list(self.benchmark.ood_report),
                keep=keep,
                name=name,
                progress=self.stage_progress(name),
                **self.options,
            ),
        )

    def evaluate_module(self, name: str, module: nn.Module, cache_parts: tuple) -> Evaluation:
        """Evaluate any module mapping model inputs to logits, (B, C) or (B, M, C); predictions
        cached under ``cache_parts`` (what identifies the module's outputs)."""
        return self.timed(
            "evaluate",
            lambda: evaluate_system(
                module.eval(),
                self.loaded.preprocess,
                self.benchmark.id_report,
                list(self.benchmark.ood_report),
                name=name,
                cache_parts=cache_parts,
                progress=self.stage_progress(name),
                **self.options,
            ),
        )

    def source_evaluation(self) -> Evaluation | None:
        """The source model's own predictions in this run (a :class:`Single` system recorded
        before), or None."""
        for name, info in self.info.items():
            if info.kind == "single" and info.models and info.models[0] is self.model:
                return self.evaluations[name]
        return None

    def record(self, name: str, evaluation: Evaluation, info: SystemInfo) -> None:
        if name in self.evaluations:
            raise ValueError(f"two systems are named {name!r}: give one of them another name")
        self.evaluations[name] = evaluation
        self.info[name] = info

    def add_model(
        self, name: str, kind: str, model: nn.Module, keep: torch.Tensor | None = None
    ) -> int:
        """Evaluate one model (under the head mask ``keep``) as the system ``name`` and record
        it; its cost is that of the model pruned to ``keep``. Returns the number of heads kept."""
        evaluation = self.evaluate(name, model, keep)
        kept = head_layout(model).total_heads if keep is None else int(keep.sum())
        alone = model if keep is None else prune_heads(model, keep)
        self.record(name, evaluation, SystemInfo(kind, str(kept), models=[alone]))
        return kept

    def add_fused(self, name: str, hydra: nn.Module, kept: Sequence[int]) -> None:
        """Evaluate a fused Hydra model (its member logits (B, M, C) give the ensemble and its
        diversity) as the system ``name``; ``kept``: each member's heads. Predictions are cached
        under the fused model's weights."""
        hydra = hydra.to(self.device).eval()
        evaluation = self.evaluate_module(name, hydra, ("hydra", model_fingerprint(hydra)))
        self.record(name, evaluation, SystemInfo("fused", heads_label(kept), len(kept), [hydra]))

    def add_ensemble(
        self,
        name: str,
        kind: str,
        parts: Sequence[Evaluation],
        models: list[nn.Module],
        kept: list[int],
    ) -> None:
        """Record an ensemble whose members were evaluated as ``parts`` (logits stacked)."""
        info = SystemInfo(kind, heads_label(kept), len(parts), models=models)
        self.record(name, stacked(name, parts), info)


class System:
    """One system of an experiment. Subclasses set :attr:`name` (the system's row in every
    table) and implement :meth:`add_to`."""

    name: str

    def add_to(self, run: Run) -> None:
        """Evaluate the system on ``run``'s report split and record it (``run.record``,
        ``run.add_model``, ...), or ``run.skipped[name] = reason`` when it does not apply."""
        raise NotImplementedError

    def describe(self) -> dict:
        """What the system is, for the report's setup (JSON-safe)."""
        return {"name": self.name}

    def chosen_on(self, run: Run) -> ChosenOn:
        """The items that chose this system (none: the source model as it is)."""
        return ChosenOn()


@dataclass
class Single(System):
    """The source model as it is."""

    name: str = "single"

    def add_to(self, run: Run) -> None:
        run.add_model(self.name, "single", run.model)


@dataclass
class Pruned(System):
    """The source model under one head mask (e.g. Taylor's or a circuit's), cost as pruned.
    ``chosen``: the items its heads were chosen on (default: the benchmark's search split)."""

    name: str
    keep: torch.Tensor
    chosen: ChosenOn | None = None

    def add_to(self, run: Run) -> None:
        run.add_model(self.name, "pruned", run.model, self.keep)

    def chosen_on(self, run: Run) -> ChosenOn:
        return run.search_choice() if self.chosen is None else self.chosen

    def describe(self) -> dict:
        return {"name": self.name, "heads": int(self.keep.sum())}


@dataclass
class FinetunedPruned(System):
    """The source model pruned to ``keep`` and fine-tuned
    (:func:`~hydra_core.hydra.finetune.finetune_member`, cached), cost as pruned: the paper's
    fine-tuned Taylor and CircAvg rows. ``chosen``: as :class:`Pruned`; the fine-tuning items are
    added to it."""

    name: str
    keep: torch.Tensor
    finetune: FinetuneConfig
    train_set: object = None
    chosen: ChosenOn | None = None

    def add_to(self, run: Run) -> None:
        progress = None
        if run.progress is not None:
            stage = f"{STAGES['finetune']}: {self.name}"
            progress = lambda done, total: run.progress(stage, done, total)  # noqa: E731
        member = run.timed(
            "finetune",
            lambda: finetune_member(
                run.model,
                self.keep,
                self.finetune,
                preprocess=run.loaded.preprocess,
                train_set=self.train_set,
                name=self.name,
                device=run.device,
                cache=run.options.get("cache"),
                progress=progress,
            ),
        )
        run.add_model(self.name, "pruned", member.model.to(run.device).eval())

    def chosen_on(self, run: Run) -> ChosenOn:
        chosen = run.search_choice() if self.chosen is None else self.chosen
        items = members_training_items(run.model, self.finetune, self.train_set)
        return chosen | ChosenOn.of("fine-tuning", [items])

    def describe(self) -> dict:
        return {"name": self.name, "heads": int(self.keep.sum()), "finetune": asdict(self.finetune)}


@dataclass
class Hydra(System):
    """A Hydra ensemble: each member alone, the members run separately (probabilities averaged,
    ``"<label> (unfused)"``) and the fused model (``"<label> (fused)"``).

    Args:
        members: member masks (zero-shot members, or fine-tuned first when ``finetune`` is
            given) or already fine-tuned members.
        label: prefix of the system names (see :func:`~hydra_core.hydra.systems.system_name`).
        finetune: fine-tune each member separately with this configuration first.
        finetune_seeds: batch-order seed per member (default 0 for all).
        train_set: fine-tuning items (default: the family's training set).
        chosen: the items the members' heads were chosen on (default: the benchmark's search
            split); the fine-tuning items are added to them.
    """

    members: Sequence[MemberMask] | Sequence[FinetunedMember]
    label: str = "Hydra"
    finetune: FinetuneConfig | None = None
    finetune_seeds: Sequence[int] | None = None
    train_set: object = None
    chosen: ChosenOn | None = None
    tuned: list[FinetunedMember] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.members:
            raise ValueError(
                "no members: pass the member masks (or fine-tuned members) to evaluate"
            )
        given = [isinstance(m, FinetunedMember) for m in self.members]
        if any(given) and not all(given):
            raise TypeError("members must be all MemberMask or all FinetunedMember, not a mix")
        if all(given) and self.finetune is not None:
            raise ValueError("the members are already fine-tuned; pass finetune=None")
        self.name = system_name(self.label, "fused")

    def add_to(self, run: Run) -> None:
        tuned = self._finetuned(run)
        names, kept = [], []
        for member in self.members if tuned is None else tuned:
            # zero-shot: the source model under the member's mask; fine-tuned: its own model
            model, keep = (run.model, member.keep) if tuned is None else (member.model, None)
            names.append(system_name(self.label, "member", member.name))
            kept.append(run.add_model(names[-1], "member", model, keep))
        parts = [run.evaluations[n] for n in names]
        models = [run.info[n].models[0] for n in names]
        run.add_ensemble(system_name(self.label, "unfused"), "unfused", parts, models, kept)
        hydra = run.timed("fuse", lambda: self._fused(run.model, tuned))
        run.add_fused(self.name, hydra, kept)

    def chosen_on(self, run: Run) -> ChosenOn:
        chosen = run.search_choice() if self.chosen is None else self.chosen
        if self.finetune is None:
            return chosen
        items = members_training_items(run.model, self.finetune, self.train_set)
        return chosen | ChosenOn.of("fine-tuning", [items])

    def describe(self) -> dict:
        return {
            "name": self.name,
            "label": self.label,
            "members": [m.name for m in self.members],
            "finetune": None if self.finetune is None else asdict(self.finetune),
        }

    def _finetuned(self, run: Run) -> list[FinetunedMember] | None:
        """The fine-tuned members, or None for zero-shot members."""
        if isinstance(self.members[0], FinetunedMember):
            self.tuned = list(self.members)
        elif self.finetune is not None:
            report = None
            if run.progress is not None:
                stage = STAGES["finetune"]
                report = lambda name, done, total: run.progress(f"{stage}: {name}", done, total)
            self.tuned = run.timed(
                "finetune",
                lambda: finetune_members(
                    run.model,
                    self.members,
                    self.finetune,
                    preprocess=run.loaded.preprocess,
                    train_set=self.train_set,
                    seeds=self.finetune_seeds,
                    device=run.device,
                    cache=run.options.get("cache"),
                    progress=report,
                ),
            )
        return self.tuned

    def _fused(self, model: nn.Module, tuned: list[FinetunedMember] | None) -> nn.Module:
        """Zero-shot members fused out of the source model, or the fine-tuned members fused with
        their MLPs averaged."""
        if tuned is None:
            return fuse_members([(model, m.keep) for m in self.members])
        return fuse_finetuned(tuned)


@dataclass
class DeepEnsemble(System):
    """Independently trained full copies of the model (two or more), e.g. from
    :func:`~hydra_core.baselines.deep_ensembles.available_deep_ensemble`."""

    copies: Sequence[nn.Module]
    name: str = "Deep Ensembles"

    def __post_init__(self) -> None:
        if len(self.copies) < 2:
            raise ValueError(
                f"Deep Ensembles need two or more independently trained models, got "
                f"{len(self.copies)}; train copies with train_deep_ensemble"
            )

    def add_to(self, run: Run) -> None:
        copies = [m.to(run.device).eval() for m in self.copies]
        parts = [run.evaluate(f"{self.name} member {i}", m) for i, m in enumerate(copies)]
        heads = [head_layout(m).total_heads for m in copies]
        run.add_ensemble(self.name, "deep-ensemble", parts, copies, heads)

    def describe(self) -> dict:
        return {"name": self.name, "copies": len(self.copies)}


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


def stacked(name: str, evaluations: Sequence[Evaluation]) -> Evaluation:
    """An ensemble's evaluation from its members': member logits stacked to (N, M, C)."""
    first = evaluations[0]

    def stack(parts: Sequence[SetPredictions]) -> SetPredictions:
        logits = torch.stack([p.logits for p in parts], dim=1)  # (N, M, C)
        return SetPredictions(parts[0].name, parts[0].group, logits, parts[0].labels)

    ood = [stack([ev.ood[i] for ev in evaluations]) for i in range(len(first.ood))]
    id_part = stack([ev.id for ev in evaluations])
    ensemble = Evaluation(name, id_part, ood, score=first.score, bootstrap=first.bootstrap)
    sources = [ev.extra.get("feature_sources") for ev in evaluations]
    if all(sources):  # feature-based OOD scores average the members' (hydra_core.ood_scores)
        ensemble.extra["feature_sources"] = [s for member in sources for s in member]
    return ensemble


def heads_label(kept: Sequence[int]) -> str:
    """ "72", "48x3" (equal members) or "47/48/50"."""
    if len(set(kept)) == 1:
        return f"{kept[0]}x{len(kept)}" if len(kept) > 1 else str(kept[0])
    return "/".join(str(k) for k in kept)
