"""The shortcut check: can a search set be told from the ID search items by surface features
alone, as well as the model tells them apart?

A search that selects heads on an OOD set which differs from the ID data by something shallow
(headlines without a final full stop, brighter images) may reward heads that see that difference
and nothing that transfers. Before a search, a small classifier (logistic regression on
standardised surface features, :attr:`~hydra_core.models.modality.Modality.surface_features`) is
fitted to tell each search-role set from the ID search items; its AUROC (OOD positive) is
computed on out-of-fold scores of a stratified k-fold, with a stratified percentile bootstrap
interval, and compared with the dense model's MSP AUROC on the same items. Where the classifier
does as well or better (its AUROC >= the model's, or its interval reaches the model's AUROC), the
check warns: the search set may be separable by a shortcut.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hydra_core import metrics
from hydra_core.errors import InputError, choice
from hydra_core.metrics.bootstrap import bootstrap_interval

#: folds of the cross-validation (fewer when a side has fewer items)
FOLDS = 5

#: where a warning sends the user to see whether a circuit transfers
CHECK = "check the transfer matrix: python -m hydra_core transfer"
#: ... in the transfer matrix (the command or the page's section), which is that check
CHECK_IN_MATRIX = "its row of the transfer matrix shows whether its circuit transfers"


@dataclass(frozen=True)
class ShortcutCheck:
    """One search set's check: the surface classifier's cross-validated AUROC with its 95%
    interval, the dense model's MSP AUROC on the same items, and whether it warns."""

    name: str
    auroc: float
    lo: float
    hi: float
    dense_auroc: float
    n_id: int
    n_ood: int

    @property
    def warns(self) -> bool:
        return bool(self.auroc >= self.dense_auroc or self.hi >= self.dense_auroc)

    def to_dict(self) -> dict:
        """``{"auroc", "lo", "hi", "dense_auroc", "warns"}`` (the search JSON's entry)."""
        keys = ("auroc", "lo", "hi", "dense_auroc")
        return {**{k: float(getattr(self, k)) for k in keys}, "warns": self.warns}

    def warning(self, check: str = CHECK) -> str:
        """The one-line warning of a set that warns, ending with where to ``check`` whether its
        circuit transfers (default: the ``transfer`` command; the transfer matrix itself says
        its own row)."""
        return (
            f"shortcut: surface features alone tell the search set {self.name!r} from the ID "
            f"search items at AUROC {self.auroc:.3f} [{self.lo:.3f}, {self.hi:.3f}], the dense "
            f"model at {self.dense_auroc:.3f}: heads chosen on it may separate a surface cue, "
            f"not OOD data in general ({check})"
        )


def surface_auroc(
    id_features: np.ndarray, ood_features: np.ndarray, *, seed: int = 0, n_boot: int = 1000
) -> tuple[float, float, float]:
    """(AUROC, lo, hi): a standardised logistic regression telling OOD (positive) from ID rows,
    scored out of fold (stratified k-fold, shuffled by ``seed``), with the percentile bootstrap
    interval of the AUROC, ID and OOD resampled within themselves."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = np.concatenate([id_features, ood_features]).astype(np.float64)
    y = np.concatenate([np.zeros(len(id_features)), np.ones(len(ood_features))]).astype(int)
    folds = min(FOLDS, len(id_features), len(ood_features))
    if folds < 2:
        raise ValueError("the shortcut check needs at least 2 ID and 2 OOD items")
    x = np.nan_to_num(x)
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
    split = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    scores = cross_val_predict(model, x, y, cv=split, method="decision_function")

    def auroc(s: np.ndarray, labels: np.ndarray) -> float:  # higher score = OOD
        return metrics.auroc(-s[labels == 0], -s[labels == 1])

    value = auroc(scores, y)
    lo, hi = bootstrap_interval(auroc, scores, y, strata=y, n_boot=n_boot, seed=seed)
    return value, lo, hi


def shortcut_check(
    modality,
    id_items,
    ood_sets,
    dense_auroc: dict[str, float],
    *,
    seed: int = 0,
    preprocess=None,
) -> dict[str, ShortcutCheck]:
    """Per search set: :func:`surface_auroc` of its items against ``id_items`` (sets of
    ``modality``'s kind, surface features through
    :attr:`~hydra_core.models.modality.Modality.surface_features`, on the items as the model's
    ``preprocess`` sees them where it says so), beside ``dense_auroc[set]``, the dense model's
    MSP AUROC on the same items."""

    def features(data):
        return modality.surface_features(data, preprocess)

    for data in ood_sets:
        if min(len(id_items), len(data)) < 2:
            raise InputError(
                f"the shortcut check before a search tells each search set from the ID search "
                f"items out of fold, and needs at least 2 of each: {data.name!r} has "
                f"{len(data)}, the ID search part {len(id_items)}; raise {choice('n_search')}"
            )
    id_features = features(id_items)
    out = {}
    for data in ood_sets:
        value, lo, hi = surface_auroc(id_features, features(data), seed=seed)
        out[data.name] = ShortcutCheck(
            data.name, value, lo, hi, float(dense_auroc[data.name]), len(id_items), len(data)
        )
    return out


def benchmark_shortcuts(loaded, benchmark, *, cache=None, device="auto", batch_size: int = 256):
    """:func:`shortcut_check` of a benchmark's search sets against its ID search part, the dense
    model's AUROC from its predictions on them (``cache``: predictions kept)."""
    from hydra_core.evaluate import evaluate_model

    dense = evaluate_model(
        loaded.model,
        loaded.preprocess,
        benchmark.id_search,
        benchmark.ood_search,
        name=loaded.name,
        device=device,
        cache=cache,
        batch_size=batch_size,
    )
    aurocs = {r["set"]: r["auroc"] for r in dense.rows() if r["group"] in ("near", "far")}
    return shortcut_check(
        loaded.modality,
        benchmark.id_search,
        benchmark.ood_search,
        aurocs,
        preprocess=loaded.preprocess,
    )
