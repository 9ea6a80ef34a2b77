"""The run of one experiment: what every system of one
:func:`~hydra_core.experiment.evaluate.evaluate_systems` call shares (the source model, the
benchmark, where and how to predict) and what the systems recorded.

A :class:`~hydra_core.experiment.systems.System` evaluates itself through the :class:`Run` it is
handed: :meth:`Run.add_model` (a model, under a head mask), :meth:`Run.add_fused` (a module giving
member logits), :meth:`Run.add_ensemble` (members evaluated apart, logits stacked), or
:meth:`Run.evaluate_module` and :meth:`Run.record` for anything else. Every system is evaluated on
the same report items: all intervals come from the same resamples, so differences between systems
are paired (:class:`~hydra_core.experiment.results.SystemsReport`). What a system records about
itself is a :class:`SystemInfo` (its kind, one of :data:`KINDS`; its heads; its models, for the
cost); the ensembles' systems are named by :func:`system_name`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from hydra_core.cache import model_fingerprint
from hydra_core.data.provenance import ChosenOn, item_keys
from hydra_core.evaluate import Evaluation, SetPredictions, evaluate_model, evaluate_system
from hydra_core.models.adapter import head_layout, prune_heads
from hydra_core.types import StageProgress

#: The stages of :func:`~hydra_core.experiment.evaluate.evaluate_systems` in the order they run,
#: as its ``progress`` names them: ``"fine-tuning: <member>"``, ``"evaluation: <system>"``, then
#: the others alone.
STAGES = {
    "finetune": "fine-tuning",
    "evaluate": "evaluation",
    "temperature": "temperature fit",
    "macs": "multiply-adds",
    "latency": "latency",
    "intervals": "intervals",
}


#: The kinds of system a report holds, in the order tables list them.
KINDS = (
    "single",
    "pruned",
    "member",
    "unfused",
    "fused",
    "deep-ensemble",
    "mc-dropout",
    "temperature",
    "efficient-ensemble",  # Packed-Ensembles, MIMO, BatchEnsemble, LoRA Ensembles
)
#: The kinds of system named after their ensemble's label (see :func:`system_name`).
LABELLED_KINDS = ("member", "unfused", "fused")


def system_name(label: str, kind: str, member: str | None = None) -> str:
    """The name :func:`~hydra_core.experiment.evaluate.evaluate_systems` gives a system of the
    ensemble ``label``: ``"<label>: <member>"`` for a member, ``"<label> (unfused)"`` and
    ``"<label> (fused)"`` for the ensembles. The app, the CLI and the report look systems up
    through it, so the names are written in one place."""
    if kind not in LABELLED_KINDS:
        raise ValueError(
            f"kind must be one of {', '.join(LABELLED_KINDS)} (the systems named after an "
            f"ensemble label), got {kind!r}"
        )
    if (kind == "member") != (member is not None):
        raise ValueError(
            f"pass the member's name for kind 'member' and only for it (kind {kind!r}, "
            f"member {member!r})"
        )
    return f"{label}: {member}" if kind == "member" else f"{label} ({kind})"


@dataclass
class SystemInfo:
    """What a system is: its kind (one of :data:`KINDS`), heads kept ("72", "48", "48x3",
    "47/48/50"), number of members, and the models that make it up (for the cost)."""

    kind: str
    heads: str
    members: int = 1
    models: list[nn.Module] = field(default_factory=list, repr=False)


@dataclass
class Run:
    """What every system of one :func:`~hydra_core.experiment.evaluate.evaluate_systems` call
    shares, and what they produced.

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

    def check_unseen(self, system) -> None:
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
        """The source model's own predictions in this run (a
        :class:`~hydra_core.hydra.systems.Single` system recorded before), or None."""
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
