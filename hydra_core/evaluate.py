"""Evaluation harness: batched predictions on any device, and the metrics table of
docs/metrics.md with a 95% bootstrap interval on every number (docs/intervals.md).

A *system* is anything that maps a batch of model inputs to logits: a single model (B, C), a model
under a head mask, or an ensemble returning member logits (B, M, C). Ensemble probabilities are the
mean of member softmax probabilities.

Sets are image sets or text sets (their ``inputs`` go through the model's ``preprocess``); a
model of a supported family runs in its callable form (a Hugging Face text classifier wrapped so
that it takes packed token ids).

Intervals: percentile bootstrap over the report samples, ID samples resampled within each true class
and each OOD set within itself, the same resamples for every system evaluated on the same samples
(so differences between systems are paired); see :mod:`hydra_core.metrics.bootstrap`. Tables carry
each metric ``m`` as three columns ``m``, ``m_lo``, ``m_hi``; JSON carries it as
``{"value": v, "ci95": [lo, hi]}``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from hydra_core import distributed, metrics
from hydra_core.cache import DiskCache, cache_key, model_fingerprint
from hydra_core.data.text import DataSet
from hydra_core.detectors import LOGIT_SCORES, FeatureSource, logit_outlier_scores
from hydra_core.inference import predict, resolve_device
from hydra_core.metrics.bootstrap import (
    LEVEL,
    BootstrapConfig,
    Resamples,
    blank_small_parts,
    classification_replicates,
    mean_replicates,
    ood_replicates_per_set,
    percentile_interval,
)
from hydra_core.models.adapter import UnsupportedModelError, ablate, family_of

ID_COLUMNS = ("accuracy", "nll", "brier", "ece", "adaptive_ece")
OOD_COLUMNS = ("auroc", "fpr95", "aupr_in", "aupr_out")
DIVERSITY_COLUMNS = ("mutual_information", "disagreement")
#: Every metric a table row may carry, in column order (``fpr95_tpr_id``: Hendrycks' FPR@95TPR
#: with ID positive, next to OpenOOD's ``fpr95``).
METRIC_COLUMNS = (*ID_COLUMNS, *OOD_COLUMNS, "fpr95_tpr_id", *DIVERSITY_COLUMNS)
#: The OOD averages: short name -> (row label, the groups averaged, unweighted over sets).
AVERAGES = {
    "near": ("near-OOD average", ("near",)),
    "far": ("far-OOD average", ("far",)),
    "all": ("OOD average", ("near", "far")),
}
#: The OOD scores computed from logits alone (:mod:`hydra_core.ood_scores` adds the feature-based
#: ones, fitted on the ID search split).
SCORES = LOGIT_SCORES
#: How the intervals are made, as ``to_json`` states it.
INTERVAL_METHOD = (
    "95% percentile bootstrap over the report samples; ID samples resampled within each true "
    "class, each OOD set within itself; the same resamples for every system (paired)"
)


def interval_columns(names: Iterable[str]) -> list[str]:
    """``[m, m_lo, m_hi, ...]`` for each metric name: the table layout of a value and its
    interval."""
    return [c for m in names for c in (m, f"{m}_lo", f"{m}_hi")]


def _json_number(value: float | None) -> float | None:
    if value is None:  # already JSON's null
        return None
    value = float(value)
    return None if math.isnan(value) else value


def interval_json(value: float, lo: float, hi: float) -> dict:
    """``{"value": v, "ci95": [lo, hi]}``, NaN as None: how JSON carries every reported metric."""
    return {"value": _json_number(value), "ci95": [_json_number(lo), _json_number(hi)]}


def nest_intervals(record: Mapping) -> dict:
    """A table row with ``m``, ``m_lo``, ``m_hi`` keys as JSON: each such metric becomes
    :func:`interval_json`; other keys stay (numbers as plain floats / ints, NaN as None)."""
    out = {}
    for key, value in record.items():
        if key.endswith(("_lo", "_hi")) and key[:-3] in record:
            continue
        if f"{key}_lo" in record and f"{key}_hi" in record:
            out[key] = interval_json(value, record[f"{key}_lo"], record[f"{key}_hi"])
        elif isinstance(value, (float, np.floating)):
            out[key] = _json_number(value)
        elif isinstance(value, np.integer):
            out[key] = int(value)
        else:
            out[key] = value
    return out


def format_intervals(frame: pd.DataFrame, *, digits: int = 4, signed: bool = False) -> pd.DataFrame:
    """A table for reading: each metric with ``_lo`` / ``_hi`` columns becomes one text column
    ``"v ± h"`` (h: half the interval's width; the percentile interval need not be symmetric, the
    exact bounds stay in the numeric table). ``signed`` (for differences): ``"+v ± h"``, and
    ``" (n.s.)"`` where the interval contains 0, ``" (no interval)"`` where it is NaN (too few
    items). NaN shows as "–"."""
    out = frame.copy()
    sign = "+" if signed else ""
    for column in list(frame.columns):
        lo, hi = f"{column}_lo", f"{column}_hi"
        if lo not in frame or hi not in frame:
            continue
        cells = []
        for value, low, high in zip(frame[column], frame[lo], frame[hi], strict=True):
            if pd.isna(value):
                cells.append("–")
                continue
            text = f"{value:{sign}.{digits}f}"
            if not (pd.isna(low) or pd.isna(high)):
                text += f" ± {(high - low) / 2:.{digits}f}"
                if signed and low <= 0 <= high:
                    text += " (n.s.)"
            elif signed:  # too few items or resamples: never read as significant
                text += " (no interval)"
            cells.append(text)
        out[column] = cells
        out = out.drop(columns=[lo, hi])
    return out


def callable_model(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` as a module mapping one input tensor to logits: its family's callable form (a
    Hugging Face text classifier wrapped to take packed token ids), or ``model`` itself when no
    family knows it (a fused ensemble, a probe)."""
    try:
        family = family_of(model)
    except UnsupportedModelError:
        return model
    return family.callable_model(model)


def masked(
    model: torch.nn.Module, keep: torch.Tensor | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``model`` as a system run under ``ablate(model, keep)`` (plainly when keep is None)."""
    system = callable_model(model)

    def run(x: torch.Tensor) -> torch.Tensor:
        with ablate(model, keep) if keep is not None else nullcontext():
            return system(x)

    return run


def probabilities(logits: torch.Tensor) -> torch.Tensor:
    """(N, C) logits -> softmax; (N, M, C) member logits -> mean of member softmaxes (N, C)."""
    probs = logits.float().softmax(-1)
    return probs.mean(1) if probs.ndim == 3 else probs


def ood_score(logits: torch.Tensor, score: str = "msp") -> np.ndarray:
    """Per-sample "higher = more in-distribution" score; ensembles as docs/metrics.md
    says. MSP is Hydra Lab's own; the other logit scores are pytorch-ood's outlier
    scores negated (:func:`hydra_core.detectors.logit_outlier_scores`)."""
    if score not in SCORES:
        raise ValueError(
            f"unknown OOD score {score!r} for logits; expected one of {', '.join(SCORES)} (the "
            "feature scores come from hydra_core.ood_scores.rescore)"
        )
    if score != "msp":
        return -logit_outlier_scores(score, logits)
    mean_logits = logits.float().mean(1) if logits.ndim == 3 else logits.float()
    return metrics.ood_score(score, logits=mean_logits, probs=probabilities(logits))


@dataclass
class SetPredictions:
    """Logits of one system on one set of images or texts."""

    name: str
    group: str  # "id", "near" or "far"
    logits: torch.Tensor  # (N, C) or (N, M, C)
    labels: torch.Tensor | None = None


@dataclass(frozen=True)
class Difference:
    """metric(a) - metric(b) of two systems on the same samples, and the paired percentile
    bootstrap interval of that difference. Not significant (at 95%) when it contains 0."""

    value: float
    lo: float
    hi: float

    @property
    def significant(self) -> bool:
        return bool(self.lo > 0 or self.hi < 0)

    @property
    def bounds(self) -> tuple[float, float]:
        return self.lo, self.hi


@dataclass(frozen=True)
class _SetArrays:
    """What every metric of one set is computed from, derived from its logits once."""

    scores: np.ndarray  # (N,) OOD score, higher = more in-distribution
    probs: np.ndarray  # (N, C) the system's probabilities (an ensemble's: mean over members)
    diversity: dict[str, np.ndarray]  # metric -> (N,) per sample; ensembles of 2+ members only
    log_p_true: np.ndarray | None = None  # (N,) exact log p_y from the logits; labelled sets only

    @classmethod
    def of(
        cls,
        logits: torch.Tensor,
        score: str,
        labels: torch.Tensor | None = None,
        scores: np.ndarray | None = None,
    ) -> _SetArrays:
        diversity = {}
        if logits.ndim == 3 and logits.shape[1] > 1:
            members = logits.float().softmax(-1)  # (N, M, C)
            diversity = {
                "mutual_information": metrics.mutual_information(members, reduction="none"),
                "disagreement": metrics.disagreement(members, reduction="none"),
            }
        probs = probabilities(logits).detach().cpu().double().numpy()
        log_p = None if labels is None else metrics.log_p_true(logits, labels)
        scores = ood_score(logits, score) if scores is None else np.asarray(scores, np.float64)
        return cls(scores, probs, diversity, log_p)

    def diversity_means(self) -> dict[str, float]:
        return {m: float(v.mean()) for m, v in self.diversity.items()}


@dataclass
class Evaluation:
    """A system's predictions on the ID set and every OOD set, and the metrics from them.

    The metrics and their bootstrap resamples are computed on first use and kept (the predictions
    are not expected to change afterwards). Systems evaluated on the same samples share their
    resamples through :meth:`use_resamples`, which pairs them for :func:`compare`."""

    system: str
    id: SetPredictions
    ood: list[SetPredictions]
    score: str = "msp"
    extra: dict = field(default_factory=dict)
    bootstrap: BootstrapConfig = field(default_factory=BootstrapConfig)
    #: per set (the ID set, then each OOD set) the OOD score, higher = more in-distribution, when
    #: it does not come from the logits (feature scores: :func:`hydra_core.ood_scores.rescore`)
    given_scores: list[np.ndarray] | None = None
    _arrays: list[_SetArrays] | None = field(default=None, init=False, repr=False, compare=False)
    _rows: list[dict] | None = field(default=None, init=False, repr=False, compare=False)
    _resamples: Resamples | None = field(default=None, init=False, repr=False, compare=False)
    _replicates: dict | None = field(default=None, init=False, repr=False, compare=False)

    def _sets(self) -> list[_SetArrays]:
        """Scores, probabilities and per-sample diversity of the ID set, then each OOD set."""
        if self._arrays is None:
            sets = (self.id, *self.ood)
            if self.given_scores is None and self.score not in SCORES:
                raise ValueError(
                    f"the OOD score {self.score!r} is not computed from logits: make the "
                    "evaluation with hydra_core.ood_scores.rescore"
                )
            given = self.given_scores or [None] * len(sets)
            self._arrays = [
                _SetArrays.of(s.logits, self.score, s.labels, g)
                for s, g in zip(sets, given, strict=True)
            ]
        return self._arrays

    def set_scores(self) -> list[np.ndarray]:
        """The OOD score (higher = more in-distribution) of every item of the ID set, then of
        each OOD set."""
        return [a.scores for a in self._sets()]

    def id_metrics(self) -> dict[str, float]:
        """Classification metrics on the ID set (and diversity for an ensemble)."""
        arrays = self._sets()[0]
        row = metrics.classification_metrics(
            arrays.probs, self.id.labels, log_p_true=arrays.log_p_true
        )
        return {**row, **arrays.diversity_means()}

    def ood_rows(self) -> list[dict]:
        """Per OOD set: name, group, n, the OOD metrics (and diversity for an ensemble)."""
        id_arrays, *ood_arrays = self._sets()
        rows = []
        for s, arrays in zip(self.ood, ood_arrays, strict=True):
            found = metrics.ood_metrics(id_arrays.scores, arrays.scores)
            row = {"name": s.name, "group": s.group, "n": len(s.logits)}
            row.update({k: found[k] for k in (*OOD_COLUMNS, "fpr95_tpr_id")})
            rows.append({**row, **arrays.diversity_means()})
        return rows

    def rows(self) -> list[dict]:
        """The point values: one row per set (set, group, n and the metrics that apply), the ID
        set first, then each OOD set, then the near / far / all-OOD averages."""
        if self._rows is None:
            id_row = {"set": self.id.name, "group": "id", "n": len(self.id.logits)}
            ood = [{"set": r.pop("name"), **r} for r in self.ood_rows()]
            self._rows = [{**id_row, **self.id_metrics()}, *ood, *group_averages(ood)]
        return [dict(r) for r in self._rows]

    def set_label(self, which: str) -> str:
        """The row label of ``which``: "id" (the ID set), "near", "far" or "all" (the OOD
        averages), or an OOD set's name."""
        labels = {"id": self.id.name, **{k: label for k, (label, _) in AVERAGES.items()}}
        names = [s.name for s in self.ood]
        if which in labels:
            return labels[which]
        if which in names:
            return which
        raise KeyError(
            f"no set {which!r}; expected 'id', 'near', 'far', 'all' or an OOD set "
            f"({', '.join(names)})"
        )

    def _resamples_key(self) -> tuple:
        return Resamples.key_for(self.id.labels, [len(s.logits) for s in self.ood], self.bootstrap)

    def resamples(self) -> Resamples:
        """The bootstrap resamples of this evaluation's samples (drawn once, or shared)."""
        if self._resamples is None:
            sizes = [len(s.logits) for s in self.ood]
            self._resamples = Resamples.draw(self.id.labels, sizes, self.bootstrap)
        return self._resamples

    def use_resamples(self, resamples: Resamples) -> None:
        """Use ``resamples`` drawn for another system on the same samples (the same counts this
        evaluation would draw, without drawing them again)."""
        if resamples.key != self._resamples_key():
            raise ValueError(
                f"{self.system!r} was not evaluated on the samples these resamples were drawn "
                "for (ID labels, OOD set sizes or bootstrap settings differ)"
            )
        # equal keys mean equal counts: resample values already computed stay valid
        self._resamples = resamples

    def replicates(self) -> dict[str, dict[str, np.ndarray]]:
        """Every row's metrics on every resample: set label -> metric -> (B,) values, the same
        sets and metrics as :meth:`rows` (averages: means over the sets of each resample)."""
        if self._replicates is None:
            self._replicates = self._compute_replicates(self.resamples())
        return self._replicates

    def _compute_replicates(self, resamples: Resamples) -> dict[str, dict[str, np.ndarray]]:
        id_arrays, *ood_arrays = self._sets()
        id_reps = classification_replicates(
            id_arrays.probs, self.id.labels, resamples.id_counts, log_p_true=id_arrays.log_p_true
        )
        per_set = ood_replicates_per_set(
            id_arrays.scores,
            [a.scores for a in ood_arrays],
            resamples.id_counts,
            resamples.ood_counts,
        )
        counts = [resamples.id_counts, *resamples.ood_counts]
        for reps, arrays, c in zip([id_reps, *per_set], self._sets(), counts, strict=True):
            if arrays.diversity:
                means = mean_replicates(np.column_stack(list(arrays.diversity.values())), c)
                reps.update(zip(arrays.diversity, means.T, strict=True))
        sizes, names = [len(s.logits) for s in self.ood], [s.name for s in self.ood]
        blank_small_parts(id_reps, per_set, len(self.id.labels), sizes, names)  # NaN, warned
        out = {self.id.name: id_reps}
        out.update({s.name: reps for s, reps in zip(self.ood, per_set, strict=True)})
        for label, groups in AVERAGES.values():
            chosen = [out[s.name] for s in self.ood if s.group in groups]
            if chosen:
                shared = set.intersection(*(set(r) for r in chosen))
                out[label] = {m: np.mean([r[m] for r in chosen], axis=0) for m in shared}
        return out

    def metric_values(self, metric: str, label: str) -> tuple[float, np.ndarray]:
        """(point value, (B,) resample values) of ``metric`` on the row ``label``; NaN where the
        row has no such metric (e.g. diversity of a single model) or there is no such row (e.g.
        the far-OOD average when every OOD set is near)."""
        row = {r["set"]: r for r in self.rows()}.get(label, {})
        if metric not in row:
            return math.nan, np.full(self.resamples().n_boot, math.nan)
        return row[metric], self.replicates()[label][metric]

    def intervals(self, level: float = LEVEL) -> dict[str, dict[str, tuple[float, float]]]:
        """Set label -> metric -> (lo, hi), the percentile interval of :meth:`replicates`."""
        return {
            label: {m: percentile_interval(v, level) for m, v in reps.items()}
            for label, reps in self.replicates().items()
        }

    def table(self) -> pd.DataFrame:
        """One row per set: the ID set, each OOD set, then the near / far / all-OOD averages;
        each metric ``m`` with its 95% interval in ``m_lo`` and ``m_hi``."""
        intervals = self.intervals()
        rows = []
        for row in self.rows():
            for m in METRIC_COLUMNS:
                if m in row:
                    row[f"{m}_lo"], row[f"{m}_hi"] = intervals[row["set"]][m]
            rows.append({"system": self.system, **row})
        frame = pd.DataFrame(rows)
        present = [m for m in METRIC_COLUMNS if m in frame]
        return frame.reindex(columns=["system", "set", "group", "n", *interval_columns(present)])

    def to_json(self, model_card: dict | None = None) -> dict:
        """The ``eval --json`` object: {"model", "score", "bootstrap", "id", "ood": [...],
        "ood_average"}; every metric as ``{"value": v, "ci95": [lo, hi]}`` (NaN as null)."""
        intervals = self.intervals()
        rows = {r["set"]: r for r in self.rows()}

        def entry(label: str, keys: Sequence[str]) -> dict:
            row = rows[label]
            out = {k: row[k] for k in keys}
            for m in METRIC_COLUMNS:
                if m in row:
                    out[m] = interval_json(row[m], *intervals[label][m])
            return out

        return {
            "model": model_card or {"name": self.system},
            "score": self.score,
            "bootstrap": {
                "n_boot": self.bootstrap.n_boot,
                "seed": self.bootstrap.seed,
                "level": LEVEL,
                "method": INTERVAL_METHOD,
            },
            "id": {"name": self.id.name, **entry(self.id.name, ("n",))},
            "ood": [{"name": s.name, **entry(s.name, ("group", "n"))} for s in self.ood],
            "ood_average": {
                label: entry(label, ("group", "n"))
                for label, _ in AVERAGES.values()
                if label in rows
            },
        }


def paired_replicates(
    a: Evaluation, b: Evaluation, metric: str, set: str | None = None
) -> tuple[float, np.ndarray]:
    """metric(a) - metric(b) on one set, and its value on every paired resample (both systems
    resampled with the same resamples: ``b`` takes ``a``'s); arguments as :func:`compare`."""
    if metric not in METRIC_COLUMNS:
        raise KeyError(f"no metric {metric!r}; expected one of {', '.join(METRIC_COLUMNS)}")
    which = set or ("all" if metric in (*OOD_COLUMNS, "fpr95_tpr_id") else "id")
    label = a.set_label(which)
    if b.set_label(which) != label:
        raise ValueError(f"{a.system!r} and {b.system!r} name the set {which!r} differently")
    b.use_resamples(a.resamples())
    (value_a, reps_a), (value_b, reps_b) = (ev.metric_values(metric, label) for ev in (a, b))
    return value_a - value_b, reps_a - reps_b


def compare(a: Evaluation, b: Evaluation, metric: str, set: str | None = None) -> Difference:
    """metric(a) - metric(b) on one set, with the paired interval: both systems are resampled
    with the same resamples (``b`` takes ``a``'s).

    Args:
        metric: a column of :meth:`Evaluation.table` (e.g. "accuracy", "auroc").
        set: "id", "near", "far", "all" or an OOD set's name; default "id" for ID and
            diversity metrics, "all" for OOD metrics.
    """
    value, replicates = paired_replicates(a, b, metric, set)
    return Difference(value, *percentile_interval(replicates))


def auroc_changes(
    loaded,
    benchmark,
    keep: torch.Tensor,
    *,
    name: str = "circuit",
    device: str | torch.device | None = "auto",
    cache: DiskCache | None = None,
    batch_size: int = 256,
) -> pd.DataFrame:
    """How a circuit's OOD detection compares with the dense model's on each report set (and the
    near / far / all averages): AUROC (MSP) of both, and circuit minus dense with its paired 95%
    bootstrap interval; ``significant`` = the interval excludes 0. The report sets are never
    used to select heads, so this is how much of a search's gain transfers to them.

    ``loaded`` is a :class:`~hydra_core.zoo.registry.LoadedModel`, ``benchmark`` a
    :class:`~hydra_core.data.benchmark.Benchmark`; predictions come from ``cache`` when present.
    """
    options = dict(device=device, cache=cache, batch_size=batch_size)
    sets = (benchmark.id_report, benchmark.ood_report)
    dense = evaluate_model(loaded.model, loaded.preprocess, *sets, name=loaded.name, **options)
    circuit = evaluate_model(
        loaded.model, loaded.preprocess, *sets, keep=keep, name=name, **options
    )
    rows = []
    for which in [s.name for s in benchmark.ood_report] + ["near", "far", "all"]:
        label = dense.set_label(which)
        if label not in {r["set"] for r in dense.rows()}:
            continue  # an average over a group without sets
        change = compare(circuit, dense, "auroc", which)
        rows.append(
            {
                "set": label,
                "dense_auroc": dense.metric_values("auroc", label)[0],
                "circuit_auroc": circuit.metric_values("auroc", label)[0],
                "delta_auroc": change.value,
                "delta_auroc_lo": change.lo,
                "delta_auroc_hi": change.hi,
                "significant": change.significant,
            }
        )
    return pd.DataFrame(rows)


def group_averages(ood_rows: Sequence[dict]) -> list[dict]:
    """Near-OOD, far-OOD and all-OOD means (unweighted over sets) of every metric that each
    averaged set has; rows are labelled as in :data:`AVERAGES`."""
    out = []
    for label, groups in AVERAGES.values():
        chosen = [r for r in ood_rows if r["group"] in groups]
        if not chosen:
            continue
        avg = {"set": label, "group": "+".join(groups), "n": sum(r["n"] for r in chosen)}
        for col in METRIC_COLUMNS:
            if all(col in r for r in chosen):
                avg[col] = float(np.mean([r[col] for r in chosen]))
        out.append(avg)
    return out


def _system_predictions(
    system: Callable[[torch.Tensor], torch.Tensor],
    data: DataSet,
    preprocess: Callable[[torch.Tensor], torch.Tensor],
    *,
    cache: DiskCache | None,
    key_parts: tuple | None,
    **kwargs,
) -> torch.Tensor:
    def run() -> torch.Tensor:
        return _shared_predict(system, data.inputs, preprocess, **kwargs)

    if cache is None or key_parts is None:
        return run()
    key = cache_key("predictions-v1", *key_parts, data.fingerprint(), kwargs.get("bf16", False))
    # in a distributed job rank 0's cache decides, the processes predict together, rank 0 stores
    stored = distributed.from_main(lambda: cache.load("predictions", key))
    if stored is None:
        stored = run()
        if distributed.is_main():
            cache.save("predictions", key, stored)
    return stored


def predictions_cached(
    cache: DiskCache | None, cache_parts: tuple, data: DataSet, *, bf16: bool = False
) -> bool:
    """Whether ``cache`` holds the predictions of the system ``cache_parts`` identify on
    ``data`` (:func:`evaluate_system` would read them instead of predicting): what an estimate
    of a run's time leaves out. For a model under a head mask ``keep`` the parts are
    ``(model_fingerprint(model), keep)``, as :func:`evaluate_model` gives them."""
    if cache is None:
        return False
    key = cache_key("predictions-v1", *cache_parts, data.fingerprint(), bf16)
    return cache.path("predictions", key).is_file()


def _shared_predict(system, inputs, preprocess, **kwargs) -> torch.Tensor:
    """:func:`predict`, data-parallel in a distributed job: each process predicts a run of whole
    batches (:func:`hydra_core.distributed.shard`) and every process gets all the logits, in
    order; each batch is the batch of a single process, so the logits are the same."""
    if not distributed.active() or len(inputs) == 0:
        return predict(system, inputs, preprocess, **kwargs)
    mine = distributed.shard(len(inputs), kwargs.get("batch_size", 256))
    part = predict(system, inputs[mine], preprocess, **kwargs) if mine.stop > mine.start else None
    return torch.cat([p for p in distributed.all_gather(part) if p is not None])


def evaluate_system(
    system: Callable[[torch.Tensor], torch.Tensor],
    preprocess: Callable[[torch.Tensor], torch.Tensor],
    id_set: DataSet,
    ood_sets: Sequence[DataSet],
    *,
    name: str = "model",
    score: str = "msp",
    batch_size: int = 256,
    device: torch.device | str = "cpu",
    bf16: bool = False,
    cache: DiskCache | None = None,
    cache_parts: tuple | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    bootstrap: BootstrapConfig | None = None,
) -> Evaluation:
    """Predict on ``id_set`` and every OOD set, and return an :class:`Evaluation`.

    ``cache_parts`` identify the system (e.g. model fingerprint and mask); predictions are cached
    under them plus each set's fingerprint when ``cache`` is given. ``bootstrap``: resamples and
    seed of the intervals (default :class:`~hydra_core.metrics.bootstrap.BootstrapConfig`).
    """
    if id_set.labels is None:
        raise ValueError(
            f"the ID set {id_set.name!r} has no labels; accuracy and calibration need them"
        )

    def run(s: DataSet) -> torch.Tensor:
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
    return Evaluation(name, id_pred, ood, score=score, bootstrap=bootstrap or BootstrapConfig())


def evaluate_model(
    model: torch.nn.Module,
    preprocess: Callable[[torch.Tensor], torch.Tensor],
    id_set: DataSet,
    ood_sets: Sequence[DataSet],
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
    evaluation = evaluate_system(
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
    batch_size = kwargs.get("batch_size", 256)
    source = FeatureSource(model, keep, preprocess, device, batch_size, cache)
    evaluation.extra["feature_sources"] = [source]  # what feature-based OOD scores read
    return evaluation


def model_card(
    loaded,
    benchmark,
    *,
    cache: DiskCache | None = None,
    device: str | None = "auto",
    batch_size: int = 256,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """Layers, heads, parameters, ID accuracy and MSP AUROC per OOD set on the report split, with
    their 95% intervals: ``id_accuracy_ci95`` [lo, hi] and ``ood_auroc_ci95`` {set: [lo, hi]}.

    ``loaded`` is a :class:`hydra_core.zoo.registry.LoadedModel`, ``benchmark`` a
    :class:`hydra_core.data.benchmark.Benchmark`; predictions come from ``cache`` when present.
    ``progress(set_name, done, total)``: after each batch predicted (none for cached sets)."""
    evaluation = evaluate_model(
        loaded.model,
        loaded.preprocess,
        benchmark.id_report,
        benchmark.ood_report,
        name=loaded.name,
        device=device,
        cache=cache,
        batch_size=batch_size,
        progress=progress,
    )
    table = evaluation.table().set_index("set")
    card = loaded.card()
    card["id_set"] = f"{benchmark.id_report.name} (report split, n={len(benchmark.id_report)})"
    card["id_accuracy"] = float(table.loc[benchmark.id_report.name, "accuracy"])
    card["id_accuracy_ci95"] = _bounds(table, benchmark.id_report.name, "accuracy")
    names = [s.name for s in benchmark.ood_report]
    card["ood_auroc"] = {n: float(table.loc[n, "auroc"]) for n in names}
    card["ood_auroc_ci95"] = {n: _bounds(table, n, "auroc") for n in names}
    return card


def _bounds(table: pd.DataFrame, row: str, metric: str) -> list[float]:
    return [float(table.loc[row, f"{metric}_lo"]), float(table.loc[row, f"{metric}_hi"])]
