"""Evaluation harness: batched predictions on any device, and the metrics table of SPEC section 6.

A *system* is anything that maps a batch of model inputs to logits: a single model (B, C), a model
under a head mask, or an ensemble returning member logits (B, M, C). Ensemble probabilities are the
mean of member softmax probabilities.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from hydra_core import metrics
from hydra_core.cache import DiskCache, cache_key, model_fingerprint
from hydra_core.data.images import ImageSet
from hydra_core.inference import predict, resolve_device
from hydra_core.models.adapter import ablate

ID_COLUMNS = ("accuracy", "nll", "brier", "ece", "adaptive_ece")
OOD_COLUMNS = ("auroc", "fpr95", "aupr_in", "aupr_out")
SCORES = ("msp", "max_logit", "energy", "entropy")


def masked(
    model: torch.nn.Module, keep: torch.Tensor | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``model`` as a system run under ``ablate(model, keep)`` (plainly when keep is None)."""

    def run(x: torch.Tensor) -> torch.Tensor:
        with ablate(model, keep) if keep is not None else nullcontext():
            return model(x)

    return run


def probabilities(logits: torch.Tensor) -> torch.Tensor:
    """(N, C) logits -> softmax; (N, M, C) member logits -> mean of member softmaxes (N, C)."""
    probs = logits.float().softmax(-1)
    return probs.mean(1) if probs.ndim == 3 else probs


def ood_score(logits: torch.Tensor, score: str = "msp") -> np.ndarray:
    """Per-sample "higher = more in-distribution" score; ensembles follow SPEC section 6."""
    if score not in SCORES:
        raise ValueError(f"unknown OOD score {score!r}; expected one of {', '.join(SCORES)}")
    mean_logits = logits.float().mean(1) if logits.ndim == 3 else logits.float()
    return metrics.ood_score(score, logits=mean_logits, probs=probabilities(logits))


@dataclass
class SetPredictions:
    """Logits of one system on one image set."""

    name: str
    group: str  # "id", "near" or "far"
    logits: torch.Tensor  # (N, C) or (N, M, C)
    labels: torch.Tensor | None = None


@dataclass
class Evaluation:
    """A system's predictions on the ID set and every OOD set, and the metrics from them."""

    system: str
    id: SetPredictions
    ood: list[SetPredictions]
    score: str = "msp"
    extra: dict = field(default_factory=dict)

    def id_metrics(self) -> dict[str, float]:
        probs = probabilities(self.id.logits)
        row = metrics.classification_metrics(probs, self.id.labels)
        if self.id.logits.ndim == 3 and self.id.logits.shape[1] > 1:
            row.update(metrics.diversity_metrics(self.id.logits.float().softmax(-1)))
        return row

    def ood_rows(self) -> list[dict]:
        id_scores = ood_score(self.id.logits, self.score)
        rows = []
        for s in self.ood:
            row = {"name": s.name, "group": s.group, "n": len(s.logits)}
            found = metrics.ood_metrics(id_scores, ood_score(s.logits, self.score))
            row.update({k: found[k] for k in OOD_COLUMNS})
            row["fpr95_tpr_id"] = found["fpr95_tpr_id"]
            if s.logits.ndim == 3 and s.logits.shape[1] > 1:
                row.update(metrics.diversity_metrics(s.logits.float().softmax(-1)))
            rows.append(row)
        return rows

    def table(self) -> pd.DataFrame:
        """One row per set: the ID set, each OOD set, then the near / far / all-OOD averages."""
        id_row = {
            "system": self.system,
            "set": self.id.name,
            "group": "id",
            "n": len(self.id.logits),
        }
        id_row.update(self.id_metrics())
        rows = [id_row]
        ood = self.ood_rows()
        for r in ood:
            rows.append({"system": self.system, "set": r.pop("name"), **r})
        rows += [{"system": self.system, **avg} for avg in group_averages(ood)]
        return pd.DataFrame(rows)

    def to_json(self, model_card: dict | None = None) -> dict:
        """The ``eval --json`` object: {"model", "id", "ood": [...]} (plus near/far averages)."""
        id_row = {"name": self.id.name, "n": len(self.id.logits)}
        id_row.update({k: float(v) for k, v in self.id_metrics().items()})
        ood = [
            {k: (float(v) if isinstance(v, (float, np.floating)) else v) for k, v in r.items()}
            for r in self.ood_rows()
        ]
        out = {
            "model": model_card or {"name": self.system},
            "score": self.score,
            "id": id_row,
            "ood": ood,
        }
        out["ood_average"] = {a["set"]: {k: a[k] for k in OOD_COLUMNS} for a in group_averages(ood)}
        return out


def group_averages(ood_rows: Sequence[dict]) -> list[dict]:
    """Near-OOD, far-OOD and all-OOD means of the OOD metric columns (unweighted over sets)."""
    out = []
    for label, groups in (
        ("near-OOD average", ("near",)),
        ("far-OOD average", ("far",)),
        ("OOD average", ("near", "far")),
    ):
        chosen = [r for r in ood_rows if r["group"] in groups]
        if not chosen:
            continue
        avg = {"set": label, "group": "+".join(groups), "n": sum(r["n"] for r in chosen)}
        for col in (*OOD_COLUMNS, "fpr95_tpr_id"):
            avg[col] = float(np.mean([r[col] for r in chosen]))
        out.append(avg)
    return out


def _system_predictions(
    system: Callable[[torch.Tensor], torch.Tensor],
    image_set: ImageSet,
    preprocess: Callable[[torch.Tensor], torch.Tensor],
    *,
    cache: DiskCache | None,
    key_parts: tuple | None,
    **kwargs,
) -> torch.Tensor:
    if cache is None or key_parts is None:
        return predict(system, image_set.images, preprocess, **kwargs)
    key = cache_key(
        "predictions-v1", *key_parts, image_set.fingerprint(), kwargs.get("bf16", False)
    )
    return cache.get_or_compute(
        "predictions", key, lambda: predict(system, image_set.images, preprocess, **kwargs)
    )


def evaluate_system(
    system: Callable[[torch.Tensor], torch.Tensor],
    preprocess: Callable[[torch.Tensor], torch.Tensor],
    id_set: ImageSet,
    ood_sets: Sequence[ImageSet],
    *,
    name: str = "model",
    score: str = "msp",
    batch_size: int = 256,
    device: torch.device | str = "cpu",
    bf16: bool = False,
    cache: DiskCache | None = None,
    cache_parts: tuple | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> Evaluation:
    """Predict on ``id_set`` and every OOD set, and return an :class:`Evaluation`.

    ``cache_parts`` identify the system (e.g. model fingerprint and mask); predictions are cached
    under them plus each set's fingerprint when ``cache`` is given.
    """
    if id_set.labels is None:
        raise ValueError(
            f"the ID set {id_set.name!r} has no labels; accuracy and calibration need them"
        )

    def run(s: ImageSet) -> torch.Tensor:
        report = (lambda done, total: progress(s.name, done, total)) if progress else None
        return _system_predictions(
            system,
            s,
            preprocess,
            cache=cache,
            key_parts=cache_parts,
            batch_size=batch_size,
            device=device,
            bf16=bf16,
            progress=report,
        )

    id_pred = SetPredictions(id_set.name, "id", run(id_set), id_set.labels)
    ood = [SetPredictions(s.name, s.group, run(s)) for s in ood_sets]
    return Evaluation(name, id_pred, ood, score=score)


def evaluate_model(
    model: torch.nn.Module,
    preprocess: Callable[[torch.Tensor], torch.Tensor],
    id_set: ImageSet,
    ood_sets: Sequence[ImageSet],
    *,
    keep: torch.Tensor | None = None,
    name: str | None = None,
    device: torch.device | str | None = "auto",
    cache: DiskCache | None = None,
    **kwargs,
) -> Evaluation:
    """Evaluate a single model, optionally under a head mask, on the device it is moved to."""
    device = resolve_device(device)
    model = model.to(device).eval()
    parts = (model_fingerprint(model), keep)
    return evaluate_system(
        masked(model, keep),
        preprocess,
        id_set,
        ood_sets,
        name=name or "model",
        device=device,
        cache=cache,
        cache_parts=parts,
        **kwargs,
    )


def model_card(
    loaded,
    benchmark,
    *,
    cache: DiskCache | None = None,
    device: str | None = "auto",
    batch_size: int = 256,
) -> dict:
    """Layers, heads, parameters, ID accuracy and MSP AUROC per OOD set on the report split.

    ``loaded`` is a :class:`hydra_core.models.registry.LoadedModel`, ``benchmark`` a
    :class:`hydra_core.data.benchmark.Benchmark`; predictions come from ``cache`` when present."""
    evaluation = evaluate_model(
        loaded.model,
        loaded.preprocess,
        benchmark.id_report,
        benchmark.ood_report,
        name=loaded.name,
        device=device,
        cache=cache,
        batch_size=batch_size,
    )
    card = loaded.card()
    card["id_set"] = f"{benchmark.id_report.name} (report split, n={len(benchmark.id_report)})"
    card["id_accuracy"] = evaluation.id_metrics()["accuracy"]
    card["ood_auroc"] = {r["name"]: r["auroc"] for r in evaluation.ood_rows()}
    return card
