"""OOD scores beyond MSP, through ``pytorch-ood`` where it has the detector (docs/ood-scores.md).

Scores, by name (:data:`SCORES`); pytorch-ood returns *outlier* scores, higher = more OOD (OOD is
the positive class, as the metrics' convention); the metrics of :mod:`hydra_core.metrics.ood` take
"higher = more in-distribution" scores, which are the outlier scores negated (negation is exact).

- ``msp``: maximum softmax probability (of an ensemble's mean member probabilities); kept on
  Hydra Lab's own path (:func:`hydra_core.evaluate.ood_score`), so MSP results stay exactly as
  before; its outlier score equals pytorch-ood's ``MaxSoftmax`` (tested).
- ``max_logit``, ``energy`` (T = 1), ``entropy``: pytorch-ood's ``MaxLogit``, ``EnergyBased`` and
  ``Entropy`` on the logits (ensembles: on the mean member logits for max-logit and energy, on the
  log of the mean member probabilities for entropy, so its softmax is the ensemble's prediction).
- ``mutual_information``: H(mean p) - mean H(p_m) of an ensemble's members (pytorch-ood has no
  such detector: Hydra Lab's :func:`hydra_core.metrics.mutual_information`); a single model has
  none, and the score is not offered for it.
- ``mahalanobis``, ``vim``, ``knn``: pytorch-ood's ``Mahalanobis``, ``ViM`` (principal subspace of
  dimension D // 2, the classifier's weight and bias) and ``KNN`` (k = :data:`KNN_K`, at most the
  fit items; normalised features), on the model's penultimate features (the input of the
  family's classifier layer, :meth:`~hydra_core.models.family.ModelFamily.classifier_layer`).
  They are **fitted on the benchmark's ID search split only**: :func:`rescore` takes the
  benchmark and nothing else to fit on, and refuses when a search item is among the report items.
  An ensemble's score is the mean of its members' scores, each member's detector fitted on its own
  features. Systems without per-model features (a fused Hydra model, MC Dropout, a fitted
  temperature) are not offered these scores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from hydra_core.detectors import (
    FEATURE_SCORES,
    KNN_K,
    LOGIT_SCORES,
    SCORES,
    FeatureSource,
    classifier_layer,
    feature_outlier_scores,
    fit_detector,
    has_features,
    logit_outlier_scores,
    parse_scores,
)

__all__ = [
    "FEATURE_SCORES",
    "KNN_K",
    "LOGIT_SCORES",
    "SCORES",
    "FeatureSource",
    "classifier_layer",
    "feature_outlier_scores",
    "fit_detector",
    "has_features",
    "logit_outlier_scores",
    "offered",
    "parse_scores",
    "rescore",
    "rescore_report",
    "score_gains",
    "scores_table",
]

# --- evaluations under a score ------------------------------------------------------------------


def offered(evaluation, score: str) -> bool:
    """Whether ``score`` applies to the system of ``evaluation``: mutual information to
    ensembles, feature scores to systems whose every model gives features."""
    if score == "mutual_information":
        return evaluation.id.logits.ndim == 3 and evaluation.id.logits.shape[1] > 1
    if score in FEATURE_SCORES:
        sources = evaluation.extra.get("feature_sources")
        return bool(sources) and all(has_features(s.model) for s in sources)
    return score in SCORES


def _check_fit_unseen(benchmark) -> None:
    from hydra_core.data.provenance import ChosenOn, item_keys

    parts = [benchmark.id_report, *benchmark.ood_report]
    fit = ChosenOn.of("OOD detectors fitted", [benchmark.id_search])
    fit.check("the fitted OOD detectors", [(p.name, item_keys(p.inputs)) for p in parts])


def rescore(evaluation, score: str, benchmark=None):
    """``evaluation``'s predictions under the OOD score ``score``: a new
    :class:`~hydra_core.evaluate.Evaluation` on the same items sharing its resamples (so
    differences between systems stay paired), ``evaluation`` itself for its own score, or None
    when the score is not offered for the system (:func:`offered`).

    Feature scores need ``benchmark`` (the one the evaluation's report sets come from): the
    detectors are fitted on its ID search split and score its report sets."""
    from hydra_core.evaluate import Evaluation

    if score not in SCORES:
        raise ValueError(f"unknown OOD score {score!r}; expected one of {', '.join(SCORES)}")
    if score == evaluation.score:
        return evaluation
    if not offered(evaluation, score):
        return None
    given = None
    if score in FEATURE_SCORES:
        if benchmark is None:
            raise ValueError(f"{score} is fitted on the benchmark's ID search split: pass it")
        sets = [benchmark.id_report, *benchmark.ood_report]
        names = [evaluation.id.name, *(s.name for s in evaluation.ood)]
        if [s.name for s in sets] != names:
            raise ValueError(
                f"{evaluation.system!r} was evaluated on {names}, the benchmark reports on "
                f"{[s.name for s in sets]}"
            )
        _check_fit_unseen(benchmark)
        sources = evaluation.extra["feature_sources"]
        given = []
        for data in sets:
            member_scores = [
                feature_outlier_scores(s.detector(score, benchmark), s.features(data))
                for s in sources
            ]
            given.append(-np.mean(member_scores, axis=0))
    new = Evaluation(
        evaluation.system,
        evaluation.id,
        evaluation.ood,
        score=score,
        extra=evaluation.extra,
        bootstrap=evaluation.bootstrap,
        given_scores=given,
    )
    new.use_resamples(evaluation.resamples())
    return new


def rescore_report(report, scores: Sequence[str], benchmark=None) -> dict:
    """score -> a :class:`~hydra_core.experiment.results.SystemsReport` of ``report``'s systems
    under that score (the systems it is not offered for left out), all on ``report``'s shared
    resamples; the report's own score maps to ``report`` itself."""
    report.compute_intervals()  # shares the first system's resamples with every system
    out = {}
    for score in scores:
        if score == report.evaluations[report.systems[0]].score:
            out[score] = report
            continue
        evaluations, info = {}, {}
        for name, ev in report.evaluations.items():
            found = rescore(ev, score, benchmark)
            if found is not None:
                evaluations[name], info[name] = found, report.info[name]
        if evaluations:
            # the same kind of report, its cost kept, under this score
            setup = {**report.setup, "score": score}
            out[score] = replace(report, evaluations=evaluations, info=info, setup=setup)
    return out


#: The OOD columns of :func:`scores_table`.
SCORE_TABLE_COLUMNS = ("auroc", "fpr95", "aupr_in", "aupr_out")


def scores_table(scored: Mapping[str, object]) -> pd.DataFrame:
    """Every OOD metric per score: one row per score x system x OOD set (and the near / far / all
    averages), with ``m_lo`` / ``m_hi`` intervals; ``scored`` maps score -> SystemsReport (from
    :func:`rescore_report`) or score -> Evaluation."""
    from hydra_core.evaluate import interval_columns

    frames = []
    for score, item in scored.items():
        frame = item.table()
        if "kind" not in frame:
            frame.insert(1, "kind", "")
        frame = frame[frame["group"] != "id"]
        frame.insert(0, "score", score)
        frames.append(frame)
    columns = ["score", "system", "kind", "set", "group", "n"]
    columns += interval_columns(SCORE_TABLE_COLUMNS)
    return pd.concat(frames, ignore_index=True).reindex(columns=columns)


def score_gains(
    scored: Mapping[str, object], reference: str = "single", groups: Sequence[str] = ("near", "far")
) -> pd.DataFrame:
    """Does each system's OOD gain hold under every score: per score and system, its AUROC and
    the paired AUROC difference to ``reference`` (system minus reference, 95% paired bootstrap
    interval; ``<g>_holds``: the interval lies above 0) on the near- and far-OOD averages.
    ``scored``: score -> SystemsReport (:func:`rescore_report`); scores whose report lacks the
    reference are left out."""
    from hydra_core.evaluate import interval_columns

    rows = []
    for score, report in scored.items():
        if reference not in report.evaluations:
            continue
        table = report.summary().set_index("system")
        columns = [f"{g}_auroc" for g in groups]
        differences = report.differences(reference, columns).set_index("system")
        for name in differences.index:
            row = {"score": score, "system": name, "kind": report.info[name].kind}
            for g in groups:
                column = f"{g}_auroc"
                row[f"{g}_auroc"] = table.loc[name, column]
                row[f"{g}_auroc_single"] = table.loc[reference, column]
                for suffix in ("", "_lo", "_hi"):
                    row[f"{g}_delta{suffix}"] = differences.loc[name, column + suffix]
                row[f"{g}_holds"] = bool(differences.loc[name, f"{column}_lo"] > 0)
            rows.append(row)
    columns = ["score", "system", "kind"]
    for g in groups:
        columns += [f"{g}_auroc_single", f"{g}_auroc", *interval_columns([f"{g}_delta"])]
        columns.append(f"{g}_holds")
    return pd.DataFrame(rows, columns=columns)
