"""Head-importance maps side by side, and how well they agree: the numbers the Head importance page
shows and the ``importance`` command writes, computed once here for both.

Every map is (L, H) float64, oriented **higher = more important**, NaN where a head is absent. By
display name (the page's panel titles and the rows of the Spearman table, in the app and in the
command's ``spearman.csv``), with the file the command writes the map to:

- ``Δaccuracy`` (``delta_accuracy.csv``): minus the change in ID accuracy when the head alone is
  ablated (:func:`~hydra_core.analysis.greedy.single_head_importance`);
- ``ΔAUROC`` (``delta_auroc.csv``): the same for the MSP AUROC, OOD positive;
- ``Taylor`` (``taylor.csv``): the Taylor score (:func:`~hydra_core.analysis.taylor.taylor_scores`);
- ``greedy <objective>`` (``greedy_<objective>_step.csv``): the step at which a greedy search
  removed the head (:func:`greedy_importance`);
- ``AtP Δaccuracy``, ``AtP ΔAUROC`` (``atp_delta_accuracy.csv``, ``atp_delta_auroc.csv``): the
  attribution estimates of the first two from one forward and a few backward passes
  (:func:`~hydra_core.analysis.attribution.attribution_importance`); their rank agreement with
  the exact maps (:meth:`ImportanceMaps.attribution_agreement`) says where the cheap map can
  stand in for the exact one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from hydra_core.analysis.compare import spearman_matrix
from hydra_core.analysis.greedy import GreedyResult
from hydra_core.models.adapter import head_label


@dataclass(frozen=True)
class ImportanceMap:
    """One criterion: its map and the values behind it, as (L, H) float64 arrays (what figures,
    tables and CSV files take)."""

    name: str  # display name, e.g. "Δaccuracy"
    file_stem: str  # its CSV file in the importance command's output, e.g. "delta_accuracy"
    importance: np.ndarray  # (L, H), higher = more important, NaN = absent
    raw_label: str  # what ``raw`` holds, e.g. "accuracy change when ablated"
    raw: np.ndarray  # (L, H), the values as measured (signed changes, scores, steps)


@dataclass(frozen=True)
class ImportanceMaps:
    """What :func:`importance_maps` returns: the criteria in display order and the dense scores."""

    criteria: tuple[ImportanceMap, ...]
    base_accuracy: float  # the dense model's ID accuracy on the search split
    base_auroc: float  # and its MSP AUROC

    @property
    def maps(self) -> dict[str, np.ndarray]:
        """Display name -> (L, H) importance, higher = more important."""
        return {c.name: c.importance for c in self.criteria}

    @property
    def raw(self) -> dict[str, tuple[str, np.ndarray]]:
        """Display name -> (what the values are, (L, H) values): what a hover shows."""
        return {c.name: (c.raw_label, c.raw) for c in self.criteria}

    def spearman(self) -> pd.DataFrame:
        """Spearman correlation between every pair of maps, indexed by display name both ways."""
        return spearman_matrix(self.maps)

    def attribution_agreement(self) -> pd.DataFrame:
        """How well the attribution estimates rank the heads as exact single-head ablation does:
        one row per score (``accuracy``, ``AUROC``) with Spearman's rho over the heads, and how
        many of the exact map's 10 most important heads the estimate's 10 hold (``top-10
        overlap``). Empty when the maps hold no attribution."""
        maps = self.maps
        rows = []
        for score, exact, estimate in (
            ("accuracy", "Δaccuracy", "AtP Δaccuracy"),
            ("AUROC", "ΔAUROC", "AtP ΔAUROC"),
        ):
            if estimate not in maps:
                continue
            pair = spearman_matrix({exact: maps[exact], estimate: maps[estimate]})
            present = np.isfinite(maps[exact]) & np.isfinite(maps[estimate])
            top = min(10, int(present.sum()))
            ranked = [
                np.argsort(-np.where(present, maps[m], -np.inf), axis=None)[:top]
                for m in (exact, estimate)
            ]
            rows.append(
                {
                    "score": score,
                    "spearman": float(pair.loc[exact, estimate]),
                    "top-10 overlap": len(set(ranked[0].tolist()) & set(ranked[1].tolist())),
                    "heads": int(present.sum()),
                }
            )
        return pd.DataFrame(rows, columns=["score", "spearman", "top-10 overlap", "heads"])

    def per_head(self) -> pd.DataFrame:
        """One row per head present in the model: its label (``L3H7``) and each criterion's raw
        value, in columns named by :attr:`ImportanceMap.raw_label`."""
        layers, heads = self.criteria[0].importance.shape
        present = np.isfinite([c.importance for c in self.criteria]).any(0).ravel()
        table = pd.DataFrame(
            {
                "head": [
                    head_label(layer, head) for layer in range(layers) for head in range(heads)
                ],
                **{c.raw_label: c.raw.ravel() for c in self.criteria},
            }
        )
        return table[present].reset_index(drop=True)


def greedy_importance(result: GreedyResult) -> np.ndarray:
    """A greedy search as an importance map: (L, H) float64, the step (1 = first) at which the
    search removed each head; every head it never removed gets ``steps + 1``; NaN for absent heads.

    Heads the search kept tie as the most important ones, instead of taking their place in
    :meth:`GreedyResult.ranking`, because the search establishes only that: each kept head
    mattered more than every removed one. ``ranking`` orders the kept heads by the last step's
    candidate scores, a one-step ablation score of the circuit that resembles single-head ablation;
    after a search with a small budget (most heads kept) that would make the greedy map agree with
    the Δ maps for reasons that have nothing to do with the greedy search. Spearman's correlation
    gives tied heads their mean rank. A search that removed every head leaves no ties, and both
    conventions agree.
    """
    steps = result.removal_step_map().numpy() + 1.0  # 0 = never removed
    present = result.keep_mask(0).numpy()  # every head the model has
    steps[present & (steps == 0)] = result.steps + 1
    steps[~present] = np.nan
    return steps


def _as_map(values: torch.Tensor | np.ndarray) -> np.ndarray:
    """A float64 copy of an (L, H) map given as a tensor (any device) or an array."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().double().numpy()
    return np.array(values, dtype=np.float64)


def importance_maps(
    single_head: Mapping[str, torch.Tensor | np.ndarray | float],
    taylor: torch.Tensor | np.ndarray,
    greedy: GreedyResult | None = None,
    attribution: Mapping[str, torch.Tensor | np.ndarray | float] | None = None,
) -> ImportanceMaps:
    """The head-importance maps of one model on one search split, oriented and named once for the
    app and the command line.

    Args:
        single_head: what :func:`~hydra_core.analysis.greedy.single_head_importance` returns
            (``delta_accuracy`` and ``delta_auroc`` maps as tensors or arrays, ``base_accuracy``,
            ``base_auroc``).
        taylor: (L, H) Taylor scores (:func:`~hydra_core.analysis.taylor.taylor_scores`).
        greedy: a greedy search on the same model; adds the map ``greedy <objective>``
            (:func:`greedy_importance`).
        attribution: what :func:`~hydra_core.analysis.attribution.attribution_importance`
            returns for the same model and items; adds ``AtP Δaccuracy`` and ``AtP ΔAUROC``.

    Raises:
        ValueError: when the maps differ in shape (they come from different models).
    """
    delta_accuracy = _as_map(single_head["delta_accuracy"])
    delta_auroc = _as_map(single_head["delta_auroc"])
    scores = _as_map(taylor)
    criteria = [
        ImportanceMap(
            name="Δaccuracy",
            file_stem="delta_accuracy",
            importance=-delta_accuracy,  # an important head's removal lowers the accuracy
            raw_label="accuracy change when ablated",
            raw=delta_accuracy,
        ),
        ImportanceMap(
            name="ΔAUROC",
            file_stem="delta_auroc",
            importance=-delta_auroc,
            raw_label="AUROC change when ablated",
            raw=delta_auroc,
        ),
        ImportanceMap(
            name="Taylor",
            file_stem="taylor",
            importance=scores,
            raw_label="Taylor score",
            raw=scores,
        ),
    ]
    if greedy is not None:
        steps = greedy_importance(greedy)
        criteria.append(
            ImportanceMap(
                name=f"greedy {greedy.objective}",
                file_stem=f"greedy_{greedy.objective}_step",
                importance=steps,
                raw_label="removed at step (– = kept)",
                raw=np.where(steps <= greedy.steps, steps, np.nan),
            )
        )
    if attribution is not None:
        for score, stem, label in (
            ("accuracy", "delta_accuracy", "Δaccuracy"),
            ("AUROC", "delta_auroc", "ΔAUROC"),
        ):
            values = _as_map(attribution[stem])
            criteria.append(
                ImportanceMap(
                    name=f"AtP {label}",
                    file_stem=f"atp_{stem}",
                    importance=-values,
                    raw_label=f"estimated {score} change (AtP)",
                    raw=values,
                )
            )
    shapes = {c.name: c.importance.shape for c in criteria}
    if len(set(shapes.values())) != 1:
        raise ValueError(
            "the importance maps differ in shape (layers, heads), so they belong to different "
            f"models: {', '.join(f'{name} {shape}' for name, shape in shapes.items())}"
        )
    return ImportanceMaps(
        criteria=tuple(criteria),
        base_accuracy=float(single_head["base_accuracy"]),
        base_auroc=float(single_head["base_auroc"]),
    )
