"""Hydra's own systems, as :func:`~hydra_core.experiment.evaluate.evaluate_systems` puts them
beside the baselines: :class:`Single` (the source model), :class:`Pruned` and
:class:`FinetunedPruned` (one head mask, zero-shot or fine-tuned) and :class:`Hydra` (each member,
the unfused ensemble and the fused model). Each is a
:class:`~hydra_core.experiment.systems.System`: it evaluates itself through the
:class:`~hydra_core.experiment.run.Run` it is handed.

Pruned models and Hydra members are taken to be chosen on the benchmark's search split unless
they say otherwise (``chosen``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from hydra_core.data.provenance import ChosenOn
from hydra_core.experiment.run import STAGES, Run, system_name
from hydra_core.experiment.systems import System
from hydra_core.hydra.finetune import (
    FinetuneConfig,
    FinetunedMember,
    finetune_member,
    finetune_members,
    fuse_finetuned,
    members_training_items,
)
from hydra_core.hydra.fused import fuse_members
from hydra_core.masks import MemberMask


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
        label: prefix of the system names (see :func:`~hydra_core.experiment.run.system_name`).
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
