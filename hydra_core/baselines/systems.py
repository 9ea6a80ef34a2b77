"""The baselines as systems that :func:`~hydra_core.experiment.evaluate.evaluate_systems`, the CLI
(``hydra --baselines``) and the app's Hydra page put beside Hydra: MC Dropout, temperature
scaling, for text models Deep Ensembles (D) on a shared backbone, and the paper's efficient
ensembles (Packed-Ensembles, MIMO, BatchEnsemble, LoRA Ensembles:
:mod:`~hydra_core.baselines.efficient`). (Deep Ensembles of independently trained copies is
:class:`~hydra_core.baselines.deep_ensembles.DeepEnsemble`.)"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from hydra_core.baselines import efficient
from hydra_core.baselines.mc_dropout import MCDropout, dropout_rate
from hydra_core.baselines.shared_backbone import (
    DEEP,
    DEEP_HEADS,
    deep_heads,
    train_text_ensemble,
)
from hydra_core.baselines.temperature import (
    TemperatureScaled,
    fitted_temperature,
    scaled_evaluation,
)
from hydra_core.cache import model_fingerprint
from hydra_core.data.provenance import ChosenOn
from hydra_core.experiment.run import STAGES, Run, SystemInfo
from hydra_core.experiment.systems import System
from hydra_core.hydra.finetune import members_training_items
from hydra_core.models.adapter import head_layout
from hydra_core.models.preprocess import untrimmed
from hydra_core.training.top import TopFinetuneConfig

MC_DROPOUT = "MC Dropout"
TEMPERATURE = "Temperature Scaling"
#: the names ``hydra --baselines`` and the Hydra page accept
BASELINES = ("mc-dropout", "temperature", "shared-backbone", *efficient.NAMES)


@dataclass
class MCDropoutBaseline(System):
    """MC Dropout: the source model's own dropout on at test time, ``passes`` forwards.

    Args:
        passes: T, forwards per input; seed: pass t is seeded ``seed + t`` at every batch.
        rate: None (the model's own dropout; the system is skipped, with the reason, for a model
            trained without dropout) or a rate every dropout module samples at during the passes:
            the post-hoc variant, named ``"MC Dropout (p=0.1, post hoc)"``.
    """

    passes: int = 5
    seed: int = 0
    rate: float | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            post_hoc = "" if self.rate is None else f" (p={self.rate:g}, post hoc)"
            self.name = MC_DROPOUT + post_hoc

    def add_to(self, run: Run) -> None:
        model = run.model
        if self.rate is None and dropout_rate(model) == 0.0:
            run.skipped[self.name] = (
                "the model has no dropout (it was trained without it): choose a post-hoc rate "
                "(--mc-dropout-rate) to sample dropout it never saw in training"
            )
            return
        mc = MCDropout(model, self.passes, self.seed, self.rate)
        parts = ("mc-dropout", model_fingerprint(model), self.passes, self.seed)
        parts += (run.options["batch_size"],)  # dropout is re-seeded per batch
        if self.rate is not None:
            parts += (self.rate,)
        evaluation = run.evaluate_module(self.name, mc, parts)
        heads = str(head_layout(model).total_heads)
        run.record(self.name, evaluation, SystemInfo("mc-dropout", heads, self.passes, [mc]))

    def describe(self) -> dict:
        return {"name": self.name, "passes": self.passes, "seed": self.seed, "rate": self.rate}


@dataclass
class TemperatureBaseline(System):
    """Temperature scaling: the source model's logits divided by one temperature, fitted to the
    NLL on the benchmark's ID *search* split (never on a reported item)."""

    name: str = TEMPERATURE
    temperature: float | None = field(default=None, init=False)

    def add_to(self, run: Run) -> None:
        data = run.benchmark.id_search
        self.temperature = run.timed(
            "fit temperature",
            lambda: fitted_temperature(
                run.model,
                data.inputs,
                data.labels,
                run.loaded.preprocess,
                device=run.device,
                batch_size=run.options["batch_size"],
                progress=None
                if run.progress is None
                else partial(run.progress, STAGES["temperature"]),
            ),
        )
        scaled = TemperatureScaled(run.model, self.temperature)
        source = run.source_evaluation()
        if source is not None and not run.options["bf16"]:
            # the source model's fp32 logits divided by T are what the scaled model predicts,
            # bit for bit: no second pass over the report items
            evaluation = scaled_evaluation(source, self.name, scaled.temperature)
        else:
            parts = ("temperature", model_fingerprint(run.model), self.temperature)
            evaluation = run.evaluate_module(self.name, scaled, parts)
        heads = str(head_layout(run.model).total_heads)
        run.record(self.name, evaluation, SystemInfo("temperature", heads, models=[scaled]))

    def describe(self) -> dict:
        return {"name": self.name, "temperature": self.temperature, "fitted_on": "ID search"}

    def chosen_on(self, run: Run) -> ChosenOn:
        return ChosenOn.of("temperature", [run.benchmark.id_search])


@dataclass
class SharedBackboneBaseline(System):
    """Deep Ensembles (D), the paper's text baseline: one backbone, a head per seed.

    Args:
        seeds: one member per seed.
        how: ``"heads"``: fresh heads trained on the shared backbone's final states (any model;
            ``train_set`` and ``config`` say on what and how; left out, with the reason, when
            there is no training set, as for ID data of your own; a function giving the set
            loads it only when the system runs); ``"train-text"``
            (``minilm-sentiment``): its own training recipe once per seed, the shipped model
            being seed 0.
        validation_set: labelled items that choose the heads' epoch (default: the benchmark's
            ID search split, never reported).
    """

    seeds: Sequence[int] = (0, 1, 2)
    how: str = "heads"
    config: TopFinetuneConfig = DEEP_HEADS
    train_set: object = None
    validation_set: object = None
    name: str = DEEP
    runs: list = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.how not in ("heads", "train-text"):
            raise ValueError(f"how must be 'heads' or 'train-text', got {self.how!r}")

    def add_to(self, run: Run) -> None:
        model = run.model
        progress, cache = run.progress, run.options.get("cache")
        if self.how == "heads" and self.train_set is None:
            run.skipped[self.name] = (
                "fresh heads need labelled training items: the embedded ID set's training "
                "split, which ID data of your own does not have"
            )
            return
        validation = self._validation(run)
        if self.how == "train-text":
            deep, self.runs = train_text_ensemble(model, self.seeds, cache=cache, progress=progress)
        else:
            deep, self.runs = deep_heads(
                model,
                self._train(),
                self.config,
                preprocess=run.loaded.preprocess,
                seeds=self.seeds,
                validation_set=validation,
                device=run.device,
                cache=cache,
                progress=progress,
            )
        heads = str(head_layout(model).total_heads)
        info = SystemInfo("deep-ensemble", heads, len(self.seeds), [deep])
        parts = ("deep-ensemble", model_fingerprint(deep))
        run.record(self.name, run.evaluate_module(self.name, deep, parts), info)

    def describe(self) -> dict:
        return {"name": self.name, "seeds": list(self.seeds), "how": self.how}

    def chosen_on(self, run: Run) -> ChosenOn:
        chosen = ChosenOn.of("epoch", [self._validation(run)])
        if self.how == "heads" and self.train_set is not None:
            chosen = chosen | ChosenOn.of("heads trained", [self._train()])
        return chosen

    def _validation(self, run: Run):
        """The items that choose the heads' epoch: by default the ID search split."""
        return run.benchmark.id_search if self.validation_set is None else self.validation_set

    def _train(self):
        """The training items (a function giving them is called once)."""
        if callable(self.train_set):
            self.train_set = self.train_set()
        return self.train_set


@dataclass
class EfficientBaseline(System):
    """One of the paper's efficient ensembles (:mod:`~hydra_core.baselines.efficient`): its
    members' logits (B, E, C), their probabilities averaged downstream.

    Args:
        method: ``"packed-ensembles"``, ``"mimo"`` (trained from scratch with the recipe of
            ``reference``), ``"batch-ensemble"`` or ``"lora-ensembles"`` (fine-tuned from the
            source model on the embedded ID set's training split, or ``train_set``).
        reference: the Hydra Lab checkpoint whose recipe the from-scratch methods follow (None:
            the source model has none, and they are left out with the reason).
        train: train a copy that is not stored (the fine-tuned methods take minutes; the
            from-scratch ones hours on a CPU, so by default they are only loaded, and left out
            with the command that trains them when absent).
        settings: the paper's E, alpha, rho, batch repeat, rank and LoRA alpha.
    """

    method: str
    reference: Path | str | None = None
    train: bool | None = None
    settings: efficient.EfficientSettings = field(default_factory=efficient.EfficientSettings)
    train_set: object = None
    root: Path | str | None = None
    name: str = ""

    def __post_init__(self) -> None:
        efficient.check_method(self.method)
        self.name = self.name or efficient.NAMES[self.method]
        if self.train is None:
            self.train = self.method not in efficient.FROM_SCRATCH

    def add_to(self, run: Run) -> None:
        module = run.timed("finetune", lambda: self._trained(run))
        if module is None:
            return
        module = module.to(run.device).eval()
        parts = ("efficient-ensemble", self.method, model_fingerprint(module))
        evaluation = run.evaluate_module(self.name, module, parts)
        members = efficient.members_of(self.method, self.settings)
        heads = head_layout(run.model).total_heads
        info = SystemInfo("efficient-ensemble", f"{heads}x{members}", members, [module])
        run.record(self.name, evaluation, info)

    def _trained(self, run: Run):
        """The trained copy, or None with the reason in ``run.skipped``."""
        method, progress = self.method, None
        if run.progress is not None:
            stage = f"{STAGES['finetune']}: {self.name}"
            progress = lambda done, total: run.progress(stage, done, total)  # noqa: E731
        if method in efficient.FROM_SCRATCH:
            if self.reference is None:
                run.skipped[self.name] = (
                    "trained from scratch with a Hydra Lab checkpoint's recipe (the default "
                    "ViT's); this model has none"
                )
                return None
            model = efficient.scratch_copy(
                method,
                reference=self.reference,
                settings=self.settings,
                root=self.root,
                train=self.train,
                progress=progress,
            )
            if model is None:
                run.skipped[self.name] = (
                    f"no trained copy is stored; train it with `{efficient.train_command(method)}`"
                )
            return model
        copy = efficient.batch_ensemble_copy if method == efficient.BATCH else efficient.lora_copy
        report = progress
        if method == efficient.LORA and progress is not None:
            report = lambda seed, done, total: progress(done, total)  # noqa: E731
        model = copy(
            run.model,
            untrimmed(run.loaded.preprocess),  # the key of the copy train-baselines stores
            settings=self.settings,
            train_set=self._train(),
            root=self.root,
            train=self.train,
            progress=report,
        )
        if model is None:
            run.skipped[self.name] = (
                f"no fine-tuned copy is stored; train it with `{efficient.train_command(method)}`"
            )
        return model

    def describe(self) -> dict:
        return {"name": self.name, "method": self.method, **self.settings.of(self.method)}

    def chosen_on(self, run: Run) -> ChosenOn:
        if self.method in efficient.FROM_SCRATCH:
            return ChosenOn()  # trained on the training split, as the single model
        config = efficient.FINETUNE if self.method == efficient.BATCH else efficient.LORA_FINETUNE
        items = members_training_items(run.model, config, self._train())
        return ChosenOn.of("fine-tuning", [items])

    def _train(self):
        if callable(self.train_set):
            self.train_set = self.train_set()
        return self.train_set


def baseline_systems(
    names: Sequence[str],
    *,
    mc_passes: int = 5,
    mc_rate: float | None = None,
    train_set: object = None,
    reference: Path | str | None = None,
    train_efficient: bool | None = None,
) -> list[System]:
    """The baselines ``names`` (of :data:`BASELINES`) as systems; a ValueError naming an unknown
    one and the choices. ``train_set``: the labelled items the shared-backbone heads train on
    (the embedded ID set's training split; None leaves that baseline out, with its reason).
    ``reference``: the checkpoint whose recipe Packed-Ensembles and MIMO are trained with;
    ``train_efficient``: train a missing efficient ensemble (None: the fine-tuned ones only)."""
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise ValueError(
            f"unknown baseline(s) {', '.join(map(repr, unknown))}; choose from "
            f"{', '.join(BASELINES)}"
        )
    made = {
        "mc-dropout": lambda: MCDropoutBaseline(passes=mc_passes, rate=mc_rate),
        "temperature": TemperatureBaseline,
        "shared-backbone": lambda: SharedBackboneBaseline(train_set=train_set),
    }
    for method in efficient.NAMES:
        made[method] = partial(EfficientBaseline, method, reference, train_efficient)
    return [made[n]() for n in dict.fromkeys(names)]
