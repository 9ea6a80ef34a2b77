"""The results table of an experiment: its systems, evaluated on the same report split
(docs/metrics.md), as one :class:`SystemsReport`.
:func:`~hydra_core.experiment.evaluate.evaluate_systems` makes it; its usual systems, on the ID
report split and every OOD report set:

- ``single``: the source model;
- any extra single pruned models (``pruned={"Taylor": mask, "CircAvg": mask}``);
- each member alone (zero-shot: the source model under the member's head mask; fine-tuned: the
  member's own pruned model);
- ``<label> (unfused)``: the ensemble of the members run separately, probabilities averaged;
- ``<label> (fused)``: the Hydra model (:func:`~hydra_core.hydra.fused.fuse_members`), one forward
  for all members, MLPs averaged when the members were fine-tuned;
- ``Deep Ensembles``: independently trained full copies, when given;
- the baselines of :mod:`hydra_core.baselines` (MC Dropout, temperature scaling, ...).

Ensembles keep their member logits (N, M, C), so the tables carry mutual information and
disagreement on ID and OOD data. The cost of each system (parameters, multiply-adds, latency on
the current device; bf16 too on CUDA) is measured in one round-robin so that load drifts hit all
systems alike.

Every metric carries its 95% percentile bootstrap interval (columns ``m_lo`` / ``m_hi``; JSON
``{"value", "ci95"}``). All systems of a report use the same resamples of the report images, so
:meth:`SystemsReport.difference` gives paired intervals: "Hydra beats single by X" comes with the
interval of X, and a difference whose interval contains 0 is not significant.
"""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from torch import nn

from hydra_core import metrics
from hydra_core.evaluate import (
    ID_COLUMNS,
    METRIC_COLUMNS,
    OOD_COLUMNS,
    Difference,
    Evaluation,
    compare,
    interval_columns,
    nest_intervals,
    paired_replicates,
    probabilities,
)
from hydra_core.experiment.run import KINDS, SystemInfo, system_name
from hydra_core.hydra.cost import VitShape, cost_table, formula_params
from hydra_core.metrics.bootstrap import two_level_interval
from hydra_core.models.adapter import UnsupportedModelError, head_layout
from hydra_core.types import Progress, StageProgress

#: The metric columns of :meth:`SystemsReport.summary`: name -> (metric, set), the set being "id"
#: or an OOD average ("near", "far", "all"); MI and disagreement on OOD data average all OOD sets.
SUMMARY_METRICS: dict[str, tuple[str, str]] = {
    **{m: (m, "id") for m in ID_COLUMNS},
    **{f"{g}_{m}": (m, g) for g in ("near", "far", "all") for m in OOD_COLUMNS},
    "id_mi": ("mutual_information", "id"),
    "id_di": ("disagreement", "id"),
    "ood_mi": ("mutual_information", "all"),
    "ood_di": ("disagreement", "all"),
}


@dataclass
class SystemsReport:
    """Evaluations of several systems on the same sets, and their cost.

    Attributes:
        evaluations: system name -> :class:`~hydra_core.evaluate.Evaluation`.
        info: system name -> :class:`SystemInfo`.
        cost: one row per system (params, macs, formula_params, latency_ms, latency_iqr_ms and,
            on CUDA, latency_bf16_ms; ratios to the single model), or None.
        setup: how the numbers were made (device, sets, sizes, seconds per stage).
    """

    evaluations: dict[str, Evaluation]
    info: dict[str, SystemInfo]
    cost: pd.DataFrame | None = None
    setup: dict = field(default_factory=dict)
    _roc_aurocs: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if set(self.evaluations) != set(self.info):
            raise ValueError("evaluations and info must name the same systems")

    @property
    def systems(self) -> list[str]:
        return list(self.evaluations)

    def _evaluation(self, system: str) -> Evaluation:
        if system not in self.evaluations:
            raise KeyError(f"no system {system!r}; the report has {', '.join(self.evaluations)}")
        return self.evaluations[system]

    def _paired(self) -> None:
        """Give every system the first system's resamples: all systems are on the same images,
        so their intervals come from the same resamples and their differences are paired."""
        shared = self.evaluations[self.systems[0]].resamples()
        for ev in self.evaluations.values():
            ev.use_resamples(shared)

    def compute_intervals(self, progress: Progress | None = None) -> None:
        """Compute every system's bootstrap replicates now (the tables and differences read
        them), on shared resamples; ``progress(done, total)`` at the start (0) and after each
        system."""
        self._paired()
        if progress:
            progress(0, len(self.evaluations))
        for done, evaluation in enumerate(self.evaluations.values(), start=1):
            evaluation.replicates()
            if progress:
                progress(done, len(self.evaluations))

    def table(self) -> pd.DataFrame:
        """Every system x every set (ID, each OOD set, near / far / all-OOD averages): the metrics
        of docs/metrics.md, with mutual information and disagreement for
        ensembles (also averaged over the OOD sets of each group); each metric ``m`` with its 95%
        interval in ``m_lo`` and ``m_hi``."""
        self._paired()
        frames = []
        for name, ev in self.evaluations.items():
            frame = ev.table()
            frame.insert(1, "kind", self.info[name].kind)
            frames.append(frame)
        table = pd.concat(frames, ignore_index=True)
        columns = ["system", "kind", "set", "group", "n", *interval_columns(METRIC_COLUMNS)]
        return table.reindex(columns=columns)

    def summary(self) -> pd.DataFrame:
        """One row per system: heads, accuracy, NLL, Brier, ECE, aECE; AUROC, FPR95, AUPR-In and
        AUPR-Out averaged over near, far and all OOD sets; MI and disagreement on ID and OOD (mean
        over the OOD sets); each with its 95% interval (``m_lo``, ``m_hi``; see
        :data:`SUMMARY_METRICS`); params, multiply-adds and latency when the cost was measured."""
        table = self.table()
        rows = []
        for name, ev in self.evaluations.items():
            t = table[table["system"] == name].set_index("set")
            row = {"system": name, "kind": self.info[name].kind, "heads": self.info[name].heads}
            for column, (metric, which) in SUMMARY_METRICS.items():
                label = ev.set_label(which)
                for suffix in ("", "_lo", "_hi"):
                    found = label in t.index
                    row[column + suffix] = t.loc[label, metric + suffix] if found else math.nan
            if self.cost is not None and name in self.cost.index:
                for col in ("params", "macs", "latency_ms", "latency_bf16_ms"):
                    if col in self.cost:
                        row[col] = self.cost.loc[name, col]
            rows.append(row)
        return pd.DataFrame(rows)

    def difference(self, a: str, b: str, metric: str, set: str | None = None) -> Difference:
        """metric(a) - metric(b) with its paired 95% interval (``.significant``: the interval
        excludes 0), e.g. ``report.difference("Hydra (fused)", "single", "auroc", set="near")``.

        Args:
            metric: a column of :meth:`table` ("accuracy", "auroc", "mutual_information", ...).
            set: "id", "near", "far", "all" or an OOD set's name; default "id" for ID and
                diversity metrics, "all" for OOD metrics.
        """
        self._paired()
        return compare(self._evaluation(a), self._evaluation(b), metric, set)

    def difference_replicates(
        self, a: str, b: str, metric: str, set: str | None = None
    ) -> tuple[float, np.ndarray]:
        """:meth:`difference`'s value and its value on every paired resample."""
        self._paired()
        return paired_replicates(self._evaluation(a), self._evaluation(b), metric, set)

    def differences(
        self, reference: str = "single", columns: Sequence[str] | None = None
    ) -> pd.DataFrame:
        """Every other system minus ``reference`` on summary columns (default: all of
        :data:`SUMMARY_METRICS`): one row per system, each column ``c`` with ``c_lo`` and ``c_hi``,
        the paired 95% interval of the difference. :func:`~hydra_core.evaluate.format_intervals`
        with ``signed=True`` marks the ones whose interval contains 0 "(n.s.)"."""
        self._evaluation(reference)
        chosen = list(SUMMARY_METRICS if columns is None else columns)
        unknown = [c for c in chosen if c not in SUMMARY_METRICS]
        if unknown:
            raise KeyError(
                f"no summary columns {unknown}; expected some of {list(SUMMARY_METRICS)}"
            )
        rows = []
        for name in self.systems:
            if name == reference:
                continue
            row = {"system": name, "kind": self.info[name].kind}
            for column in chosen:
                metric, which = SUMMARY_METRICS[column]
                found = self.difference(name, reference, metric, which)
                row.update(
                    {column: found.value, f"{column}_lo": found.lo, f"{column}_hi": found.hi}
                )
            rows.append(row)
        return pd.DataFrame(rows, columns=["system", "kind", *interval_columns(chosen)])

    def best_member(self, label: str = "Hydra", column: str = "all_auroc") -> str:
        """The member of the ensemble ``label`` with the best value of a summary column (highest
        where higher is better, e.g. the all-OOD AUROC; lowest for NLL, ECE, FPR@95)."""
        members = [
            name
            for name, info in self.info.items()
            if info.kind == "member" and name.startswith(f"{label}: ")
        ]
        if not members:
            raise KeyError(f"the ensemble {label!r} has no member systems in this report")
        metric, _ = SUMMARY_METRICS[column]
        higher = metrics.METRICS[metric].higher_is_better
        if higher is None:
            raise ValueError(f"{column} has no better direction to pick a best member by")
        values = self.summary().set_index("system")[column].loc[members]
        return str(values.idxmax() if higher else values.idxmin())

    def comparisons(
        self,
        label: str = "Hydra",
        columns: Sequence[str] | None = None,
        *,
        best_by: str = "all_auroc",
    ) -> pd.DataFrame:
        """The fused ensemble ``label`` against each other system a reader weighs it against:
        the single model, every baseline (pruned single models, Deep Ensembles, MC Dropout,
        temperature scaling), its members run one by one (unfused), and its best member (by
        ``best_by``; see :meth:`best_member`). One row per comparison, ``system`` = the fused
        ensemble, ``against`` = the other system, ``role`` = "baseline", "unfused" or "best
        member"; each summary column ``c`` holds fused minus other with its paired 95% interval
        (``c_lo``, ``c_hi``), as :meth:`differences`; with the cost measured, ``macs_ratio`` and
        ``against_macs_ratio``: each system's multiply-adds over the single model's.

        Where the best member matches the fused ensemble (an interval containing 0) at a
        fraction of its cost, the pruning, not the ensembling, bought the gain over the single
        model."""
        fused = self.find(label, "fused")
        chosen = list(SUMMARY_METRICS if columns is None else columns)
        unknown = [c for c in chosen if c not in SUMMARY_METRICS]
        if unknown:
            raise KeyError(
                f"no summary columns {unknown}; expected some of {list(SUMMARY_METRICS)}"
            )
        baseline_kinds = ("single", "pruned", "deep-ensemble", "mc-dropout", "temperature")
        against = [(s, "baseline") for s in self.systems if self.info[s].kind in baseline_kinds]
        against += [(s, "unfused") for s in self.systems if s == system_name(label, "unfused")]
        try:
            against.append((self.best_member(label, best_by), "best member"))
        except KeyError:
            pass  # an ensemble without member rows (a report read back in part)
        ratios = None
        if self.cost is not None and "macs_ratio" in self.cost:
            ratios = self.cost["macs_ratio"]
        rows = []
        for other, role in against:
            row = {"system": fused, "against": other, "role": role}
            for column in chosen:
                metric, which = SUMMARY_METRICS[column]
                found = self.difference(fused, other, metric, which)
                row.update(
                    {column: found.value, f"{column}_lo": found.lo, f"{column}_hi": found.hi}
                )
            if ratios is not None:
                row["macs_ratio"] = ratios.get(fused, math.nan)
                row["against_macs_ratio"] = ratios.get(other, math.nan)
            rows.append(row)
        extra = ["macs_ratio", "against_macs_ratio"] if ratios is not None else []
        return pd.DataFrame(
            rows, columns=["system", "against", "role", *interval_columns(chosen), *extra]
        )

    def reliability(self, system: str, n_bins: int = 15) -> pd.DataFrame:
        """Reliability-diagram data of a system on the ID set (equal-width confidence bins)."""
        ev = self._evaluation(system)
        return metrics.reliability_curve(probabilities(ev.id.logits), ev.id.labels, n_bins)

    def _ood_indices(self, ev: Evaluation, ood_set: str) -> list[int]:
        """The OOD sets of ``ood_set``: one set by name, or all of them (``"all"``)."""
        names = [s.name for s in ev.ood]
        if ood_set == "all":
            return list(range(len(names)))
        if ood_set in names:
            return [names.index(ood_set)]
        raise KeyError(f"no OOD set {ood_set!r}; the report has {', '.join(names)} (or 'all')")

    def roc(self, system: str, ood_set: str = "all") -> tuple[np.ndarray, np.ndarray]:
        """(fpr, tpr) of the OOD-positive ROC curve of a system against one OOD set, or against
        all OOD sets pooled (``"all"``)."""
        ev = self._evaluation(system)
        chosen = self._ood_indices(ev, ood_set)
        id_scores, *ood_scores = ev.set_scores()
        ood = np.concatenate([ood_scores[k] for k in chosen])
        return metrics.roc_curve_ood(id_scores, ood)

    def roc_auroc(self, system: str, ood_set: str = "all") -> tuple[float, float, float]:
        """(AUROC, lo, hi): the area under the curve :meth:`roc` draws (one OOD set, or all
        pooled) and its 95% interval, over the report's shared resamples (a pooled resample is
        every set's resample). Kept after the first call."""
        key = (system, ood_set)
        if key not in self._roc_aurocs:
            self._paired()
            ev = self._evaluation(system)
            chosen = self._ood_indices(ev, ood_set)
            resamples = ev.resamples()
            id_scores, *ood_scores = ev.set_scores()
            ood = np.concatenate([ood_scores[k] for k in chosen])
            counts = np.hstack([resamples.ood_counts[k] for k in chosen])  # (B, N_ood pooled)
            found = metrics.ood_replicates(id_scores, ood, resamples.id_counts, counts)
            value = metrics.auroc(id_scores, ood)
            self._roc_aurocs[key] = (value, *metrics.percentile_interval(found["auroc"]))
        return self._roc_aurocs[key]

    def find(self, label: str, kind: str, member: str | None = None) -> str:
        """The name of the ``kind`` system (``"member"``, ``"unfused"`` or ``"fused"``) of the
        ensemble ``label`` (see :func:`system_name`), checked to be in the report."""
        name = system_name(label, kind, member)
        if name not in self.info or self.info[name].kind != kind:
            raise KeyError(
                f"no {kind} system of the ensemble {label!r} (looked for {name!r}); the report "
                f"has {', '.join(self.systems)}"
            )
        return name

    def fusion_table(self, label: str = "Hydra") -> pd.DataFrame:
        """The paper's Table 11: single, fused and unfused rows of :meth:`summary`, and the
        largest difference between the fused and unfused ensemble probabilities on any image."""
        fused, unfused = self.find(label, "fused"), self.find(label, "unfused")
        summary = self.summary().set_index("system")
        table = summary.loc[["single", fused, unfused]].reset_index()
        table.attrs["max_prob_diff"] = self.max_probability_gap(fused, unfused)
        return table

    def max_probability_gap(self, a: str, b: str) -> float:
        """The largest |p_a - p_b| of the ensemble probabilities of two systems, over every image
        of every set (0 up to float error for zero-shot fused vs unfused members)."""
        ea, eb = self._evaluation(a), self._evaluation(b)
        pairs = [(ea.id, eb.id), *zip(ea.ood, eb.ood, strict=True)]
        return max(
            float((probabilities(x.logits) - probabilities(y.logits)).abs().max()) for x, y in pairs
        )

    def add_system(self, name: str, evaluation: Evaluation, info: SystemInfo) -> None:
        """Add a system evaluated elsewhere on the same sets (e.g. a fine-tuned pruned model)."""
        if name in self.evaluations:
            raise ValueError(f"the report already has a system named {name!r}")
        first = self.evaluations[self.systems[0]] if self.evaluations else None
        if first is not None and _set_names(first) != _set_names(evaluation):
            raise ValueError(
                f"{name!r} was evaluated on {_set_names(evaluation)}, the report on "
                f"{_set_names(first)}"
            )
        if info.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {info.kind!r}")
        self.evaluations[name] = evaluation
        self.info[name] = info

    def measure(
        self,
        images: torch.Tensor,
        *,
        systems: Sequence[str] | None = None,
        latency: bool = True,
        repeats: int = 20,
        warmup: int = 3,
        progress: StageProgress | None = None,
    ) -> pd.DataFrame:
        """Measure the cost of ``systems`` (default: all) on the batch ``images`` with
        :func:`~hydra_core.hydra.cost.cost_table`: params, multiply-adds, the paper's formula
        parameter count, and latency (on CUDA also under bf16 autocast) of each system's models
        run one after another (``warmup`` untimed rounds first, ``progress`` as cost_table's).
        The result becomes :attr:`cost` and is returned."""
        chosen = self.systems if systems is None else list(systems)
        missing = [n for n in chosen if n not in self.info]
        if missing:
            raise KeyError(f"no systems {missing}; the report has {', '.join(self.systems)}")
        info = {n: self.info[n] for n in chosen}
        precisions = {"latency": None}
        if images.device.type == "cuda":
            precisions["latency_bf16"] = torch.bfloat16
        table = cost_table(
            {n: s.models for n, s in info.items()},
            images,
            latency=latency,
            precisions=precisions,
            warmup=warmup,
            repeats=repeats,
            progress=progress,
        )
        # every system here comes from one architecture; a plain ViT among them gives its sizes
        shape = VitShape.of(
            next(_unwrapped(m) for s in info.values() if s.kind != "fused" for m in s.models)
        )
        table.insert(2, "formula_params", [_formula_params(s, shape) for s in info.values()])
        self.cost = table
        return self.cost

    def merge(self, other: SystemsReport) -> SystemsReport:
        """Both reports' systems in one (systems ``other`` shares with this one are taken from
        this one; they must be on the same sets)."""
        if _set_names(self.evaluations[self.systems[0]]) != _set_names(
            other.evaluations[other.systems[0]]
        ):
            raise ValueError("the two reports were evaluated on different sets")
        evaluations = dict(self.evaluations)
        info = dict(self.info)
        for name, ev in other.evaluations.items():
            if name not in evaluations:
                evaluations[name] = ev
                info[name] = other.info[name]
        cost = self.cost
        if other.cost is not None:
            new = [n for n in other.cost.index if cost is None or n not in cost.index]
            extra = other.cost.loc[new]
            cost = extra if cost is None else pd.concat([cost, extra])
        setup = {**other.setup, **self.setup}
        setup["seconds"] = {**other.setup.get("seconds", {}), **self.setup.get("seconds", {})}
        return SystemsReport(evaluations, info, cost, setup)

    def to_json(self) -> dict:
        """JSON-safe (NaN as None): setup, per system its kind, heads and evaluation, the summary,
        the differences to the single model and the cost. Every metric is ``{"value": v, "ci95":
        [lo, hi]}``; a difference adds ``"significant"`` (its interval excludes 0)."""
        systems = {
            name: {
                "kind": self.info[name].kind,
                "heads": self.info[name].heads,
                "members": self.info[name].members,
                "evaluation": ev.to_json({"name": name}),
            }
            for name, ev in self.evaluations.items()
        }
        out = {
            "setup": self.setup,
            "systems": systems,
            "summary": [nest_intervals(r) for r in self.summary().to_dict(orient="records")],
            "differences_to_single": self._differences_json("single"),
            "cost": None
            if self.cost is None
            else self.cost.reset_index(names="system").to_dict(orient="records"),
        }
        return _json_safe(out)

    def _differences_json(self, reference: str) -> list[dict] | None:
        if reference not in self.evaluations:
            return None
        records = []
        for record in self.differences(reference).to_dict(orient="records"):
            nested = nest_intervals(record)
            for column in SUMMARY_METRICS:
                lo, hi = nested[column]["ci95"]
                nested[column]["significant"] = lo is not None and (lo > 0 or hi < 0)
            records.append(nested)
        return records


def machine_description(device: torch.device | str) -> str:
    """CPU model and core count, or the GPU's name, for the setup section of a report."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cpu}, {cores} cores available, {torch.get_num_threads()} torch threads"


# --- helpers ------------------------------------------------------------------------------------


def _set_names(evaluation: Evaluation) -> list[str]:
    return [s.name for s in [evaluation.id, *evaluation.ood]]


def _formula_params(system: SystemInfo, shape: VitShape) -> float:
    """The paper's per-layer weight count (Appendix B.4), summed over layers; NaN for a system
    the formula does not describe (a shared-backbone ensemble, whose members share layers)."""
    if system.kind == "fused":
        return formula_params(shape, system.models[0].member_head_counts(), merged_mlp=True)
    try:
        heads = [list(head_layout(_unwrapped(m)).num_heads) for m in system.models]
    except UnsupportedModelError:
        return math.nan
    return formula_params(shape, heads, merged_mlp=False)


def _unwrapped(model: nn.Module) -> nn.Module:
    """The model a baseline wraps (MC Dropout's passes, temperature scaling), or ``model``."""
    return getattr(model, "wrapped", model)


def _json_safe(value):
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def repeated_difference(
    reports: Sequence[SystemsReport],
    a: str,
    b: str,
    metric: str,
    set: str | None = None,
) -> Difference:
    """metric(a) - metric(b) over repeats of an experiment (each repeat with its own seeds and
    search sample, the same report items or not): the mean of the repeats' paired differences,
    with a two-level interval (a Student t interval over the repeats that adds the report items'
    sampling; :func:`~hydra_core.metrics.bootstrap.two_level_interval`), so that the interval
    carries the variance of everything that was random, not only the items. Arguments as
    :meth:`SystemsReport.difference`; every report must hold both systems."""
    if not reports:
        raise ValueError("no repeats: pass one SystemsReport per repeat")
    missing = [i for i, r in enumerate(reports) if a not in r.info or b not in r.info]
    if missing:
        raise KeyError(f"repeats {missing} lack {a!r} or {b!r}")
    found = [r.difference_replicates(a, b, metric, set) for r in reports]
    value, lo, hi = two_level_interval([v for v, _ in found], [reps for _, reps in found])
    return Difference(value, lo, hi)


def repeated_differences(
    reports: Sequence[SystemsReport],
    systems: Sequence[str],
    reference: str = "single",
    columns: Sequence[str] = ("accuracy", "nll", "ece", "near_auroc", "far_auroc", "all_auroc"),
) -> pd.DataFrame:
    """Each of ``systems`` minus ``reference`` over the repeats, on summary columns: one row per
    system, ``c`` (the mean over repeats), ``c_lo`` and ``c_hi`` (the two-level interval of
    :func:`repeated_difference`), and ``repeats``."""
    rows = []
    for name in systems:
        row = {"system": name, "repeats": len(reports)}
        for column in columns:
            metric, which = SUMMARY_METRICS[column]
            d = repeated_difference(reports, name, reference, metric, which)
            row.update({column: d.value, f"{column}_lo": d.lo, f"{column}_hi": d.hi})
        rows.append(row)
    return pd.DataFrame(rows, columns=["system", "repeats", *interval_columns(columns)])
