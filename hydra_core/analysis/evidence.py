"""Which heads drive OOD separation, and how sure: every head's evidence side by side, each with a
95% interval over the report data, and one ranking by the evidence that agrees.

Per head (one row of :attr:`HeadEvidence.table`):

- ``delta_auroc`` / ``delta_accuracy``: the MSP AUROC (OOD positive, the mean over the report OOD
  sets, as the reports' "OOD average") and the ID accuracy with that head **alone** ablated, minus
  the dense model's, on the report data. Paired: both models on the same resamples, the interval is
  that of the per-resample differences. A drop (negative) means the model needs the head.
- ``detector_auroc``: the AUROC of a detector that sees only that head's CLS output (its Z before
  W_O, :func:`~hydra_core.analysis.representations.head_cls_features`): the score of a sample is
  minus its smallest squared Mahalanobis distance to the ID class means, under one covariance
  shared by the classes (the covariance of the class-centred features, regularised by
  :func:`~hydra_core.metrics.covariance.regularised_covariance`). Means and covariance are
  **fitted on the search split** (its ID part), the AUROC is **scored on the report split** (ID vs
  each report OOD set, averaged). 0.5 = the head's output tells nothing about OOD.
- ``keep_frequency`` (optional): the share of greedy searches on bootstrap resamples of the search
  split that **kept** the head within their budget, 1 minus the removal frequency a
  ``hydra-stability`` file holds (the search removes the heads it judges least useful, so a head
  no resample removes has keep frequency 1). No interval: it is itself a resampling result.

Intervals: the project's stratified bootstrap (:mod:`hydra_core.metrics.bootstrap`: ID resampled
within each true class, each OOD set within itself; the same resamples for every head and the
dense model). ``*_significant`` marks an interval that excludes the null value (0 for the Δ
columns, 0.5 for the detector).

Ranking (the rule, :func:`rank_heads`), one convention: 1 = most important, each column read in
its direction of importance (:attr:`Column.important_first`): the largest drop of AUROC when
ablated (``delta_auroc`` ascending: a negative Δ means the model needs the head), the highest
detector AUROC, the highest keep frequency; ties share their mean rank. A head's ``mean_rank`` is
the mean of its ranks over the columns it has (a head without a detector, a text tower's, has
two); ``agreed_rank`` orders the heads by it (ties: lowest layer, then head). ``disagreement``
is the spread of the head's ranks (largest minus smallest): 0 when every column puts it at the
same place; ``disagrees`` names the column furthest from the mean rank. Δaccuracy is shown, not
ranked: the question is OOD separation.

The single-head ablations are the fast candidate evaluation the greedy search uses (one greedy
step's worth: each head alone, only the layers after it recomputed), exact against a full forward
under :func:`~hydra_core.models.adapter.ablate` (the tests check it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from hydra_core.analysis._towers import fast_evaluator
from hydra_core.analysis.representations import head_cls_features, model_device
from hydra_core.cache import DiskCache, cache_key, model_fingerprint
from hydra_core.errors import InputError
from hydra_core.metrics.bootstrap import (
    LEVEL,
    MIN_ITEMS,
    BootstrapConfig,
    Resamples,
    blank_small_parts,
    mean_replicates,
    ood_replicates_per_set,
    percentile_interval,
)
from hydra_core.metrics.covariance import Shrinkage, regularised_covariance
from hydra_core.metrics.ood import auroc
from hydra_core.models.adapter import HeadLayout, head_label, head_layout, model_and_inputs
from hydra_core.types import StageProgress

#: samples per run of the fast evaluator (it keeps every layer's residual stream of its samples)
CHUNK = 4096
#: what a stability file says it is
STABILITY_FORMAT = "hydra-stability"
#: changes whenever the single-head ablation outputs change; part of their cache key
EVIDENCE_VERSION = "evidence-1"
#: the cache kind (folder) of the single-head ablation outputs
EVIDENCE_CACHE_KIND = "head-evidence"


@dataclass(frozen=True)
class Column:
    """One kind of evidence: its column in the table and how it is read."""

    key: str  # column name in the table, e.g. "delta_auroc"
    name: str  # display name, e.g. "ΔAUROC"
    null: float | None  # the value of "no effect"; its interval is marked when it excludes it
    important_first: bool  # True: higher = more important; False: lower (a drop) = more important
    ranked: bool  # whether it counts in the agreed rank
    meaning: str  # one line for the page, the CLI and the report


COLUMNS = (
    Column(
        "delta_auroc",
        "ΔAUROC",
        0.0,
        False,
        True,
        "MSP AUROC (OOD positive, mean over the report OOD sets) with this head alone ablated, "
        "minus the dense model's; negative = the model needs the head to separate OOD",
    ),
    Column(
        "delta_accuracy",
        "Δaccuracy",
        0.0,
        False,
        False,
        "ID accuracy with this head alone ablated, minus the dense model's (shown, not ranked)",
    ),
    Column(
        "detector_auroc",
        "detector AUROC",
        0.5,
        True,
        True,
        "AUROC of a Mahalanobis detector on this head's CLS output alone (ID class means and a "
        "shared covariance fitted on the search split, scored on the report split); 0.5 = chance",
    ),
    Column(
        "keep_frequency",
        "keep frequency",
        None,
        True,
        True,
        "share of bootstrap resamples of the search split whose greedy search kept this head "
        "within its budget (1 - the stability file's removal frequency; higher = more important; "
        "no interval)",
    ),
)
COLUMN = {c.key: c for c in COLUMNS}


# --- single-head ablations --------------------------------------------------------------------


@dataclass(frozen=True)
class AblationOutputs:
    """The outputs the evidence needs of the dense model and of every single-head ablation, on
    the same samples: MSP and predicted class, float64 MSP from float64 softmax."""

    dense_msp: np.ndarray  # (S,)
    dense_pred: np.ndarray  # (S,) int64
    msp: np.ndarray  # (L, H, S), NaN for absent heads
    pred: np.ndarray  # (L, H, S) int64, -1 for absent heads


def single_head_ablations(
    model: nn.Module,
    x: torch.Tensor,
    *,
    batch_size: int = 256,
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> AblationOutputs:
    """The model's outputs on ``x`` with each head alone ablated, by the greedy search's fast
    candidate evaluator (the layers after the head recomputed, exact against a full forward
    under :func:`~hydra_core.models.adapter.ablate`), ``CHUNK`` samples at a time.

    ``progress(done, total)`` counts candidate heads over all chunks; ``should_stop()`` stops
    between passes (raising :class:`~hydra_core.analysis._suffix.Stopped`)."""
    model, x = model_and_inputs(model, x, names=("x",))
    if model.training:
        raise ValueError("the model is in training mode (dropout); call model.eval() first")
    if len(x) == 0:
        raise ValueError("x holds no samples")
    layout = head_layout(model)
    device = model_device(model)
    dtype = next((p.dtype for p in model.parameters()), torch.float32)
    num_layers, max_heads = layout.shape
    msp = np.full((num_layers, max_heads, len(x)), math.nan)
    pred = np.full((num_layers, max_heads, len(x)), -1, dtype=np.int64)
    dense_msp, dense_pred = np.empty(len(x)), np.empty(len(x), dtype=np.int64)
    chunks = range(0, len(x), CHUNK)
    total, done = layout.total_heads * len(chunks), 0
    with torch.inference_mode():
        for start in chunks:
            part = x[start : start + CHUNK]
            part = part.to(device, dtype if part.is_floating_point() else None)
            per_pass = None if part.device.type == "cpu" else batch_size
            evaluator = fast_evaluator(model, part, pairs_per_pass=per_pass)
            rows = slice(start, start + len(part))
            dense_msp[rows], dense_pred[rows] = _msp_and_pred(evaluator.logits)
            for heads, logits in evaluator.candidate_logits(should_stop):  # (c, s, C)
                m, p = _msp_and_pred(logits)
                for i, (layer, head) in enumerate(heads):
                    msp[layer, head, rows], pred[layer, head, rows] = m[i], p[i]
                done += len(heads)
                if progress is not None:
                    progress(done, total)
    return AblationOutputs(dense_msp, dense_pred, msp, pred)


def cached_ablations(
    model: nn.Module, x: torch.Tensor, cache: DiskCache | None, **options
) -> AblationOutputs:
    """:func:`single_head_ablations`, kept in ``cache`` under the model's weights and the inputs
    (the expensive part of the evidence: a repeated call, or another bootstrap, is instant)."""
    if cache is None:
        return single_head_ablations(model, x, **options)
    key = cache_key(EVIDENCE_VERSION, "single-head-ablations", model_fingerprint(model), x)
    stored = cache.load(EVIDENCE_CACHE_KIND, key)
    fields = ("dense_msp", "dense_pred", "msp", "pred")
    if isinstance(stored, dict) and set(stored) == set(fields):
        return AblationOutputs(*(stored[f].numpy() for f in fields))
    outputs = single_head_ablations(model, x, **options)
    cache.save(EVIDENCE_CACHE_KIND, key, {f: torch.from_numpy(getattr(outputs, f)) for f in fields})
    return outputs


def _msp_and_pred(logits: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(..., C) logits -> MSP and argmax (...,), softmax in float64 on the CPU (as the search)."""
    logits = logits.detach().cpu().double()
    if torch.isnan(logits).any():
        raise FloatingPointError("the model produced NaN logits; the heads cannot be compared")
    return logits.softmax(-1).amax(-1).numpy(), logits.argmax(-1).numpy()


# --- the per-head detector --------------------------------------------------------------------


def mahalanobis_scores(
    fit_feats: np.ndarray,
    fit_labels: np.ndarray,
    feats: np.ndarray,
    *,
    shrinkage: Shrinkage = "ledoit_wolf",
) -> np.ndarray:
    """Per head, each sample's score: minus its smallest squared Mahalanobis distance to the class
    means of ``fit_feats`` under their shared covariance (higher = more in-distribution).

    Args:
        fit_feats: (N_fit, L, H, d_k) features of the ID samples the detector is fitted on.
        fit_labels: (N_fit,) their classes; every class present gets a mean.
        feats: (N, L, H, d_k) features of the samples to score.
        shrinkage: how the shared covariance (of the class-centred ``fit_feats``) is regularised.

    Returns:
        (L, H, N) float64 scores.
    """
    fit = np.asarray(fit_feats, dtype=np.float64)
    x = np.asarray(feats, dtype=np.float64)
    y = np.asarray(fit_labels)
    classes, index = np.unique(y, return_inverse=True)
    means = np.stack([fit[index == k].mean(axis=0) for k in range(len(classes))])  # (K, L, H, d)
    centred = fit - means[index]  # (N_fit, L, H, d)
    _, num_layers, num_heads, _ = fit.shape
    out = np.empty((num_layers, num_heads, len(x)))
    for layer in range(num_layers):
        for head in range(num_heads):
            chol = np.linalg.cholesky(regularised_covariance(centred[:, layer, head], shrinkage))
            diff = x[:, None, layer, head] - means[None, :, layer, head]  # (N, K, d)
            # |L^-1 diff|^2 = diff' S^-1 diff, with S = L L' the shared covariance
            white = np.linalg.solve(chol, diff.reshape(-1, diff.shape[-1]).T)  # (d, N K)
            squared = (white**2).sum(axis=0).reshape(len(x), len(classes))  # (N, K)
            out[layer, head] = -squared.min(axis=1)
    return out


# --- the result -------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadEvidence:
    """Every head's evidence (:attr:`table`, one row per head present in the model), the dense
    model's report numbers and how the intervals were made."""

    table: pd.DataFrame
    shape: tuple[int, int]  # (L, H) of the model's head layout
    dense: dict[str, tuple[float, float, float]]  # "accuracy"/"auroc" -> (value, lo, hi)
    ood_sets: tuple[str, ...]
    n_id: int
    n_ood: tuple[int, ...]
    n_fit: int
    n_boot: int
    seed: int

    def map(self, column: str) -> np.ndarray:
        """(L, H) float64 map of one column of :attr:`table` (NaN for absent heads)."""
        if column not in self.table:
            raise KeyError(f"no column {column!r}; the table has {', '.join(self.table.columns)}")
        out = np.full(self.shape, math.nan)
        values = pd.to_numeric(self.table[column], errors="coerce").to_numpy(dtype=np.float64)
        out[self.table["layer"].to_numpy(), self.table["head"].to_numpy()] = values
        return out

    def columns(self) -> tuple[Column, ...]:
        """The evidence columns this result has (keep frequency only when it was given)."""
        return tuple(
            c for c in COLUMNS if self.table[c.key].notna().any() or c.key != "keep_frequency"
        )

    def top(self, k: int = 10) -> pd.DataFrame:
        """The ``k`` heads of best agreed rank."""
        return self.table.sort_values("agreed_rank").head(k)

    def to_json(self) -> dict:
        """The ``heads --json`` object: setup, the dense model, the rule, one entry per head."""

        def number(value) -> float | None:
            return None if value is None or pd.isna(value) else float(value)

        heads = []
        for row in self.table.sort_values("agreed_rank").to_dict("records"):
            entry = {"label": row["label"], "layer": int(row["layer"]), "head": int(row["head"])}
            for c in COLUMNS:
                entry[c.key] = number(row[c.key])
                if c.null is not None:
                    entry[f"{c.key}_ci95"] = [
                        number(row[f"{c.key}_lo"]),
                        number(row[f"{c.key}_hi"]),
                    ]
                    entry[f"{c.key}_significant"] = bool(row[f"{c.key}_significant"])
                if c.ranked:
                    entry[f"rank_{c.key}"] = number(row[f"rank_{c.key}"])
            entry.update(
                mean_rank=number(row["mean_rank"]),
                agreed_rank=int(row["agreed_rank"]),
                disagreement=number(row["disagreement"]),
                disagrees=row["disagrees"] or None,
            )
            heads.append(entry)
        return {
            "format": "hydra-heads",
            "version": 2,
            "dense": {
                k: {"value": number(v), "ci95": [number(lo), number(hi)]}
                for k, (v, lo, hi) in self.dense.items()
            },
            "ood_sets": list(self.ood_sets),
            "n_id": self.n_id,
            "n_ood": list(self.n_ood),
            "n_fit": self.n_fit,
            "bootstrap": {"n_boot": self.n_boot, "seed": self.seed, "level": LEVEL},
            "columns": {c.key: c.meaning for c in COLUMNS},
            "ranking": RANKING_RULE,
            "heads": heads,
        }


#: the ranking rule in one sentence (JSON, page note, report)
RANKING_RULE = (
    "higher = more important: each ranked column (ΔAUROC: largest drop first; detector AUROC: "
    "highest first; keep frequency, the share of stability resamples that kept the head: highest "
    "first) becomes ranks 1..n (1 = most important), ties sharing their mean rank; a head's mean "
    "rank is the mean over the columns it has, the agreed rank orders the heads by it; "
    "disagreement = largest minus smallest of its ranks, 'disagrees' names the column furthest "
    "from its mean rank"
)


def rank_heads(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` (one row per head, with the ranked columns of :data:`COLUMNS`, NaN where a head
    lacks one) with ``rank_<column>``, ``mean_rank``, ``agreed_rank``, ``disagreement`` and
    ``disagrees`` added, by the rule of the module's docstring (:data:`RANKING_RULE`)."""
    table = table.copy()
    ranked = [c for c in COLUMNS if c.ranked]
    names = [f"rank_{c.key}" for c in ranked]
    for c, name in zip(ranked, names, strict=True):
        table[name] = table[c.key].rank(method="average", ascending=not c.important_first)
    ranks = table[names]
    table["mean_rank"] = ranks.mean(axis=1)
    table["disagreement"] = ranks.max(axis=1) - ranks.min(axis=1)
    distance = ranks.sub(table["mean_rank"], axis=0).abs()
    furthest = distance.fillna(-1.0).to_numpy().argmax(axis=1)
    table["disagrees"] = [
        COLUMN[names[i].removeprefix("rank_")].name if spread > 0 else ""
        for i, spread in zip(furthest, table["disagreement"].fillna(0.0), strict=True)
    ]
    order = table.sort_values(["mean_rank", "layer", "head"], na_position="last").index
    table.loc[order, "agreed_rank"] = np.arange(1, len(table) + 1)
    table["agreed_rank"] = table["agreed_rank"].astype(int)
    return table


def _interval_columns(
    table: dict, key: str, value: np.ndarray, replicates: np.ndarray, null: float
) -> None:
    """``key``, ``key_lo``, ``key_hi`` and ``key_significant`` from (n,) values and (n, B)
    resample values."""
    bounds = np.array([percentile_interval(r) for r in replicates]).reshape(-1, 2)
    table[key] = value
    table[f"{key}_lo"], table[f"{key}_hi"] = bounds[:, 0], bounds[:, 1]
    table[f"{key}_significant"] = (bounds[:, 0] > null) | (bounds[:, 1] < null)


def _mean_auroc(
    id_scores: np.ndarray, ood_scores: Sequence[np.ndarray], resamples: Resamples
) -> tuple[float, np.ndarray]:
    """The MSP AUROC averaged over the OOD sets: (value, (B,) resample values)."""
    value = float(np.mean([auroc(id_scores, s) for s in ood_scores]))
    per_set = ood_replicates_per_set(
        id_scores, list(ood_scores), resamples.id_counts, resamples.ood_counts
    )
    return value, np.mean([r["auroc"] for r in per_set], axis=0)


def check_frequency(frequency: torch.Tensor | np.ndarray, layout: HeadLayout) -> np.ndarray:
    """A selection-frequency map as (L, H) float64, refused unless its shape is the model's and
    every value is in [0, 1] (NaN for heads it lacks)."""
    array = np.asarray(
        frequency.detach().cpu() if isinstance(frequency, torch.Tensor) else frequency,
        dtype=np.float64,
    )
    if array.shape != layout.shape:
        raise InputError(
            f"the selection frequencies are a {array.shape} map but the model's heads are "
            f"{layout.shape} (layers, heads): they were computed for another model"
        )
    finite = array[np.isfinite(array)]
    if ((finite < 0) | (finite > 1)).any():
        raise InputError("selection frequencies must lie in [0, 1] (shares of resamples)")
    return array


def read_stability(
    path: str | Path, layout: HeadLayout, *, name: str | None = None, **made_for
) -> np.ndarray:
    """The (L, H) selection frequencies of a ``hydra-stability`` file (the stability search's
    result), checked against the model's head layout (and, with ``made_for``, its model and
    data: see :func:`stability_frequency`); an InputError names what is wrong (``name``: how
    messages name the file, its path by default)."""
    path = Path(path)
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path} does not exist; give a stability result (JSON)") from None
    except OSError as exc:
        raise InputError(f"{path} is not a stability result ({exc})") from None
    return stability_frequency(text, layout, name=name or str(path), **made_for)


def stability_frequency(
    text: str | bytes,
    layout: HeadLayout,
    *,
    name: str,
    model: dict | None = None,
    data: dict | None = None,
    hint: str = "give a stability result of this model and data",
    warn=None,
) -> np.ndarray:
    """The (L, H) selection frequencies of a stability result given as its JSON text (an uploaded
    file's bytes), checked against the model; ``name`` names it in the messages.

    With ``model`` (the loaded model's identity) the file's provenance is checked as every
    reader of another run's file checks it (:func:`~hydra_core.outputs.check_source`): another
    model's file is refused even when its shape matches, one computed on other search data
    (``data``, this run's search data identity) too, ``hint`` saying what to do; a file that
    names no model goes to ``warn``."""
    from hydra_core.outputs import check_source

    try:
        data_found = json.loads(text)
    except ValueError as exc:
        raise InputError(f"{name} is not a stability result ({exc})") from None
    if not isinstance(data_found, dict) or data_found.get("format") != STABILITY_FORMAT:
        raise InputError(f'{name} is not a stability result (no "format": "{STABILITY_FORMAT}")')
    data, made_for = data_found, data
    rows = data.get("frequency")
    if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
        raise InputError(f"{name} holds no frequency map (a list of layers, each a list of heads)")
    if len({len(r) for r in rows}) > 1:
        raise InputError(f"{name}: the frequency map's layers differ in length")
    try:
        array = np.array([[math.nan if v is None else float(v) for v in r] for r in rows])
    except (TypeError, ValueError):
        raise InputError(f"{name}: the frequency map holds a value that is not a number") from None
    try:
        frequency = check_frequency(array.reshape(len(rows), -1), layout)
    except InputError as exc:
        raise InputError(f"{name}: {exc}") from None
    if model is not None:  # the shape fits: now whose model and data it is
        note = check_source(data, model, made_for, name, hint)
        if note and warn is not None:
            warn(note)
    return frequency


# --- all together -----------------------------------------------------------------------------


def head_evidence(
    model: nn.Module,
    fit_x: torch.Tensor,
    fit_y: torch.Tensor,
    report_id_x: torch.Tensor,
    report_id_y: torch.Tensor,
    report_ood: Mapping[str, torch.Tensor],
    *,
    frequency: torch.Tensor | np.ndarray | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    shrinkage: Shrinkage = "ledoit_wolf",
    batch_size: int = 256,
    cache: DiskCache | None = None,
    progress: StageProgress | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> HeadEvidence:
    """Every head's evidence with 95% intervals over the report data, and the agreed ranking.

    Args:
        model: any model of a supported family, in eval mode.
        fit_x, fit_y: the ID search part (inputs, classes): the detectors are fitted on it.
        report_id_x, report_id_y: the ID report part; report_ood: each report OOD set's inputs.
        frequency: optional (L, H) removal frequencies in [0, 1] of a stability file
            (:func:`read_stability`: the share of resamples that removed each head); the table
            shows their complement, ``keep_frequency``.
        n_boot, seed: the bootstrap (:class:`~hydra_core.metrics.bootstrap.BootstrapConfig`);
            the same seed and report data give the reports' resamples.
        shrinkage: the detectors' covariance regularisation (``regularised_covariance``).
        cache: keeps the single-head ablations' outputs (:func:`cached_ablations`).
        progress: ``progress(stage, done, total)`` with stages "ablations", "detectors",
            "intervals"; should_stop: asked between passes (raises ``Stopped``).
    """
    layout = head_layout(model)
    if not report_ood:
        raise ValueError("report_ood is empty; the evidence needs at least one report OOD set")
    if len(report_id_y) != len(report_id_x) or len(fit_y) != len(fit_x):
        raise ValueError("each ID input needs one label: fit_x/fit_y or report_id_x/report_id_y")
    freq = None if frequency is None else check_frequency(frequency, layout)
    names = list(report_ood)
    sizes = [len(report_ood[n]) for n in names]
    config = BootstrapConfig(n_boot=n_boot, seed=seed)

    def stage(name: str) -> Callable[[int, int], None] | None:
        return None if progress is None else (lambda done, total: progress(name, done, total))

    # one pass over every report sample: ID first, then each OOD set
    x = _concatenate(model, [report_id_x, *(report_ood[n] for n in names)])
    outputs = cached_ablations(
        model,
        x,
        cache,
        batch_size=batch_size,
        progress=stage("ablations"),
        should_stop=should_stop,
    )
    bounds = np.cumsum([len(report_id_x), *sizes])
    labels = report_id_y.detach().cpu().numpy().astype(np.int64)
    resamples = Resamples.draw(labels, sizes, config)

    def split(scores: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        parts = np.split(scores, bounds[:-1])
        return parts[0], parts[1:]

    present = [(la, h) for la in range(layout.num_layers) for h in range(layout.num_heads[la])]
    # accuracy: the dense model and every head as columns of one (N_id, 1 + n) matrix
    correct = np.column_stack(
        [outputs.dense_pred[: len(labels)] == labels]
        + [outputs.pred[la, h, : len(labels)] == labels for la, h in present]
    ).astype(np.float64)
    acc_value = correct.mean(axis=0)  # (1 + n,)
    acc_reps = mean_replicates(correct, resamples.id_counts).T  # (1 + n, B)
    # the detectors: fitted on the search ID part, scored on the report samples
    detect = stage("detectors")
    if detect is not None:
        detect(0, 2)
    fit_feats = head_cls_features(model, fit_x, batch_size=batch_size).double().numpy()
    feats = head_cls_features(model, x, batch_size=batch_size).double().numpy()
    if detect is not None:
        detect(1, 2)
    scores = mahalanobis_scores(fit_feats, fit_y.detach().cpu().numpy(), feats, shrinkage=shrinkage)
    if detect is not None:
        detect(2, 2)
    read_layers = feats.shape[1]  # a model with towers: the first tower's layers see the samples
    # every interval: the ablated models' AUROC, then each detector's
    dense_auroc, dense_reps = _mean_auroc(*split(outputs.dense_msp), resamples)
    report = stage("intervals")
    roc_value, roc_reps = np.empty(len(present)), np.empty((len(present), n_boot))
    det_value, det_reps = np.full(len(present), math.nan), np.full((len(present), n_boot), math.nan)
    for i, (layer, head) in enumerate(present):
        roc_value[i], roc_reps[i] = _mean_auroc(*split(outputs.msp[layer, head]), resamples)
        if layer < read_layers:
            det_value[i], det_reps[i] = _mean_auroc(*split(scores[layer, head]), resamples)
        if report is not None:
            report(i + 1, len(present))
    table: dict = {
        "label": [head_label(la, h) for la, h in present],
        "layer": [la for la, _ in present],
        "head": [h for _, h in present],
    }
    # fewer than MIN_ITEMS items in a part: NaN intervals (never significant), with a warning;
    # accuracy uses the ID part, every AUROC the ID part and each OOD set (their mean)
    id_part, ood_parts = {"accuracy": acc_reps}, [{} for _ in sizes]
    blank_small_parts(id_part, ood_parts, len(report_id_x), sizes, names)
    acc_reps = id_part["accuracy"]
    if len(report_id_x) < MIN_ITEMS or min(sizes, default=0) < MIN_ITEMS:
        roc_reps, dense_reps, det_reps = (
            np.full_like(r, np.nan) for r in (roc_reps, dense_reps, det_reps)
        )
    _interval_columns(table, "delta_auroc", roc_value - dense_auroc, roc_reps - dense_reps, 0.0)
    _interval_columns(
        table, "delta_accuracy", acc_value[1:] - acc_value[0], acc_reps[1:] - acc_reps[0], 0.0
    )
    _interval_columns(table, "detector_auroc", det_value, det_reps, 0.5)
    table["keep_frequency"] = (  # the stability file holds the share that REMOVED the head
        [1.0 - freq[la, h] for la, h in present] if freq is not None else [math.nan] * len(present)
    )
    frame = rank_heads(pd.DataFrame(table))
    return HeadEvidence(
        table=frame,
        shape=layout.shape,
        dense={
            "accuracy": (float(acc_value[0]), *percentile_interval(acc_reps[0])),
            "auroc": (dense_auroc, *percentile_interval(dense_reps)),
        },
        ood_sets=tuple(names),
        n_id=len(report_id_x),
        n_ood=tuple(sizes),
        n_fit=len(fit_x),
        n_boot=n_boot,
        seed=seed,
    )


def _concatenate(model: nn.Module, parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The parts as one input tensor the model takes (token ids of different lengths padded)."""
    checked = model_and_inputs(model, *parts, names=[f"inputs {i}" for i in range(len(parts))])
    return torch.cat([p.cpu() for p in checked[1:]])
