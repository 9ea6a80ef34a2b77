"""The text report's stages beside the pipeline's: fused against separately run members, the
cost of one system of each kind, the training table, how Deep Ensembles (D) is made, the setup
(with the efficient ensembles': :mod:`~hydra_core.report.efficient_ensembles`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING

import pandas as pd
import torch
from torch import nn

from hydra_core.baselines.efficient import NAMES as EFFICIENT_NAMES
from hydra_core.baselines.shared_backbone import DEEP, has_train_text_recipe
from hydra_core.baselines.systems import MC_DROPOUT
from hydra_core.evaluate import callable_model, probabilities
from hydra_core.experiment.pipeline import Pipeline
from hydra_core.experiment.pruning import Budgets
from hydra_core.experiment.results import SystemsReport
from hydra_core.experiment.run import Run
from hydra_core.hydra.cost import cost_table, parameter_breakdown
from hydra_core.masks import MemberMask
from hydra_core.report.efficient_ensembles import efficient_facts
from hydra_core.report.tables import HYDRA_CIRC, HYDRA_CIRC_FT, HYDRA_TAYLOR, fused
from hydra_core.report.text_config import TextReportConfig
from hydra_core.report.text_tables import HYDRAS, SINGLE
from hydra_core.training.top import TopFinetuned, pruned_copy

if TYPE_CHECKING:
    from hydra_core.data.text import TextSet


def fixed_sample(data: TextSet, n: int, purpose: str) -> TextSet:
    """A fixed random ``n`` of ``data``'s sentences (the report sets are sorted by length)."""
    from hydra_core.data.images import take

    return take(data, min(n, len(data)), purpose=purpose)


@torch.no_grad()
def fusion_check(
    model: nn.Module,
    members: Mapping[str, Sequence[MemberMask]],
    hydras: Mapping[str, nn.Module],
    tuned_members: Mapping[str, Sequence[TopFinetuned]],
    run: Run,
    config: TextReportConfig,
) -> pd.DataFrame:
    """The fused models against their members run one by one (probabilities averaged), on a
    fixed sample of report sentences: float error for zero-shot members, the effect of MLP
    averaging for fine-tuned ones."""
    from hydra_core.inference import predict

    sample = fixed_sample(run.benchmark.id_report, config.fusion_check, "fusion-check")
    separate = {label: [pruned_copy(model, m.keep) for m in members[label]] for label in HYDRAS}
    for label, ft_label in HYDRAS.items():
        if label in tuned_members:
            separate[ft_label] = [t.model for t in tuned_members[label]]
    options = dict(device=run.device, batch_size=config.batch_size)
    rows = []
    for label, models in separate.items():
        hydra = hydras[label].to(run.device).eval()
        fused_p = probabilities(predict(hydra, sample.inputs, run.loaded.preprocess, **options))
        logits = [
            predict(
                callable_model(m.to(run.device).eval()),
                sample.inputs,
                run.loaded.preprocess,
                **options,
            )
            for m in models
        ]
        unfused_p = probabilities(torch.stack(logits, dim=1))  # (N, M, C) -> mean of softmaxes
        gap = (fused_p - unfused_p).abs()
        rows.append(
            {
                "system": label,
                "sentences": len(sample),
                "max_prob_diff": float(gap.max()),
                "mean_prob_diff": float(gap.mean()),
                "changed_predictions": int((fused_p.argmax(-1) != unfused_p.argmax(-1)).sum()),
            }
        )
    return pd.DataFrame(rows)


def text_cost(
    model: nn.Module,
    systems: SystemsReport,
    members: Mapping[str, Sequence[MemberMask]],
    pruned: Mapping[str, nn.Module],
    run: Run,
    config: TextReportConfig,
) -> pd.DataFrame:
    """Parameters, multiply-adds and latency of one system of each kind, each as the models it
    runs one after another, on a fixed sample of report sentences."""
    from hydra_core.experiment.run import system_name

    chosen = {SINGLE: [model], **{n: [m] for n, m in pruned.items()}}
    chosen[system_name(HYDRA_CIRC, "unfused")] = [
        pruned_copy(model, m.keep) for m in members[HYDRA_CIRC]
    ]
    others = (DEEP, MC_DROPOUT, *EFFICIENT_NAMES.values())  # the efficient: where evaluated
    for name in (fused(HYDRA_TAYLOR), fused(HYDRA_CIRC), fused(HYDRA_CIRC_FT), *others):
        if name in systems.info:
            chosen[name] = systems.info[name].models
    sample = fixed_sample(run.benchmark.id_report, config.latency_batch, "latency")
    precisions = {"latency": None}
    if run.device.type == "cuda":
        precisions["latency_bf16"] = torch.bfloat16
    return cost_table(
        chosen,
        run.loaded.preprocess(sample.inputs).to(run.device),
        precisions=precisions,
        repeats=config.latency_repeats,
    )


def training_table(
    deep_runs: Sequence[dict],
    tuned: Mapping[str, TopFinetuned],
    tuned_members: Mapping[str, Sequence[TopFinetuned]],
) -> pd.DataFrame:
    """One row per trained model: Deep Ensembles' members (train-text runs with their validation
    and test accuracy, or fresh heads), then every model fine-tuned after pruning."""
    rows = list(deep_runs)
    rows += [training_row(name, t) for name, t in tuned.items()]
    rows += [training_row(label, t) for label, ts in tuned_members.items() for t in ts]
    frame = pd.DataFrame(rows)
    for column in ("chosen_epoch", "steps"):  # counts, "–" where a kind of run has none
        if column in frame:
            frame[column] = [None if v != v else int(v) for v in frame[column]]
    return frame


def training_row(system: str, tuned: TopFinetuned) -> dict:
    """A training run of :func:`finetune_top`: seed, steps, last loss, chosen epoch, time."""
    steps = [h for h in tuned.history if "step" in h]
    chosen = next((h for h in tuned.history if "chosen_epoch" in h), {})
    return {
        "system": system,
        "model": tuned.name,
        "seed": tuned.seed,
        "steps": len(steps),
        "last_loss": steps[-1]["loss"] if steps else math.nan,
        "chosen_epoch": chosen.get("chosen_epoch", math.nan),
        "validation_nll": chosen.get("val_nll", math.nan),
        "seconds": round(tuned.seconds, 1),
        "cached": tuned.cached,
    }


def deep_kind_of(config: TextReportConfig, run: Pipeline) -> str | None:
    """How Deep Ensembles (D) is made for this model (see :class:`TextReportConfig`)."""
    if config.deep not in ("train-text", "heads", None):
        raise ValueError(f"deep must be 'train-text', 'heads' or None, got {config.deep!r}")
    name = run.loaded.name
    if config.deep == "train-text" and not has_train_text_recipe(name):
        run.log(f"{run.tag} {DEEP}: {name} has no train-text recipe; fresh heads instead")
        return "heads"
    return config.deep


def text_setup(
    run: Pipeline,
    config: TextReportConfig,
    budgets: Budgets,
    members: Mapping[str, Sequence[MemberMask]],
    deep: str | None,
    systems: SystemsReport,
) -> dict:
    """The run's description (``report.json``'s ``setup``); ``protocol`` says which sentences
    selected heads and which were reported, and every seed; ``efficient_ensembles`` which of
    them ``systems`` (repeat 0) evaluated and how to train the others."""
    m = len(config.seeds)
    seeds = {
        "pruning": list(config.seeds),
        "pruning_per_repeat": [
            [r * m + s for s in config.seeds] if r else list(config.seeds)
            for r in range(config.repeats)
        ],
        "search_subsample": [f"search-repeat-{r}" for r in range(1, config.repeats)],
        "deep_ensemble": list(config.seeds) if deep else [],
        "finetune_batch_order": 0,
        "finetune_seed_per_repeat": list(range(config.repeats)),
        "mc_dropout": [config.mc_seed + t for t in range(config.mc_passes)],
        "bootstrap": {"n_boot": 1000, "seed": 0, "level": 0.95},
    }
    setup = run.setup("text", budgets, seeds, members)
    setup.update(
        parameters=parameter_breakdown(run.loaded.model),
        config={k: v for k, v in asdict(config).items() if k not in ("finetune", "deep_heads")},
        finetune=None if config.finetune is None else asdict(config.finetune),
        deep=deep,
        deep_heads=asdict(config.deep_heads) if deep == "heads" else None,
        efficient_ensembles=efficient_facts(config, systems),
    )
    return run.finish(setup)
