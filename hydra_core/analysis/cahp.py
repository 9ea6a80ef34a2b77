"""Complementary head selection, CAHP ("Complementary Attention Head Pruning for Efficient
Transformers"; seed ``cahp-complementary-head-pruning.txt``), in two variants.

- ``official`` (the default): the authors' algorithm as their public code runs it
  (repository yanivlivert/cahp), step by step: attention-map signatures, per-dimension
  Jeffries-Matusita profiles, t-SNE, FasterPAM, the knee of the mean simplified silhouette
  curve, the most important head per cluster, one head per layer at least; seed 42.
  :mod:`hydra_core.analysis.cahp_official` has its steps and where it departs from their code.
- ``accuracy-knee``: Hydra Lab's reading of the abstract, from before the code was public,
  described below; it now also keeps one head per layer at least and may take the most
  important head of a cluster instead of its medoid.

The accuracy-knee reading. From the abstract: heads are described with an information-theoretic
measure of how they separate the classes, head selection is a global graph problem (distances
between heads, clustering, one representative per cluster), and the number of heads is read off
the accuracy-vs-heads curve at the point of diminishing returns, found with a polynomial fit of a
chosen degree. Our own choices, none of them taken from the paper or the authors' code:

- **Profile.** Each head's CLS output (d_k values, before W_O) is modelled per class as a
  Gaussian (class mean, Ledoit-Wolf covariance with a tiny floor, so it never fails); the head's
  profile is the Jeffries-Matusita distance JM = 2 (1 - exp(-B)) between every pair of classes, B
  the Bhattacharyya distance: C (C - 1) / 2 values in [0, 2].
- **Graph.** A complete graph of heads weighted by the Euclidean distance between profiles.
- **Clustering.** k-medoids: k-means++-style seeding, then alternating assignment and medoid update
  (Voronoi iteration) until nothing changes, best of a few restarts, all from one seed (0).
- **Global selection.** All heads of all layers are clustered together; each cluster keeps its
  medoid (``representative="medoid"``, the default) or its most important head by the official
  variant's head-mask gradient (``"importance"``); a layer left without a head keeps its most
  important one.
- **Curve.** For every k of the grid, ID accuracy of the model with every head but the ones kept
  for k clusters ablated (zeroed at the input of W_O), measured on the same search tensors that
  gave the profiles.
- **Knee.** A polynomial of the chosen degree (default 3) is fitted to accuracy against k; the knee
  is the integer k, between the smallest and the largest k of the grid, where the fitted curve lies
  farthest above the chord joining its two ends (Kneedle's rule, Satopaa et al., 2011, on the fitted
  curve). A fitted curve with no point above its chord (straight or convex: no diminishing returns)
  gives the largest k.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn

from hydra_core.analysis.cahp_official import (
    DEGREE,
    SEED,
    head_mask_importance,
    keep_one_per_layer,
    most_important_per_cluster,
    official_steps,
)
from hydra_core.analysis.representations import head_cls_features, model_device
from hydra_core.errors import InputError
from hydra_core.evaluate import masked, predict
from hydra_core.metrics.covariance import regularised_covariance
from hydra_core.models.adapter import HeadLayout, head_layout, model_and_inputs
from hydra_core.types import Head, Progress


def _bhattacharyya(mean: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """Bhattacharyya distance between every pair of class Gaussians.

    Args:
        mean: (C, d) class means; cov: (C, d, d) positive-definite class covariances.
    Returns:
        (C (C - 1) / 2,) distances for the pairs (i, j), i < j, in ``np.triu_indices`` order.
    """
    i, j = np.triu_indices(len(mean), k=1)
    pooled = (cov[i] + cov[j]) / 2  # (P, d, d)
    diff = (mean[i] - mean[j])[..., None]  # (P, d, 1)
    chol = np.linalg.cholesky(pooled)
    white = np.linalg.solve(chol, diff)[..., 0]  # (P, d): |.|^2 = diff' pooled^-1 diff
    logdet = 2 * np.log(np.diagonal(np.linalg.cholesky(cov), axis1=-2, axis2=-1)).sum(-1)  # (C,)
    logdet_pooled = 2 * np.log(np.diagonal(chol, axis1=-2, axis2=-1)).sum(-1)  # (P,)
    return (white**2).sum(-1) / 8 + 0.5 * (logdet_pooled - (logdet[i] + logdet[j]) / 2)


def jeffries_matusita(mean: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """JM = 2 (1 - exp(-B)) between every pair of class Gaussians (see :func:`_bhattacharyya`)."""
    return 2 * (1 - np.exp(-np.maximum(_bhattacharyya(mean, cov), 0.0)))


def jeffries_matusita_profiles(
    features: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray
) -> np.ndarray:
    """Every head's class-separability profile.

    Args:
        features: per-head features (N, L, H, d_k), e.g. CLS outputs from ``head_cls_features``.
        labels: (N,) class labels; every class present needs at least two samples.

    Returns:
        (L * H, C (C - 1) / 2): row l * H + h is head (l, h); column p is the Jeffries-Matusita
        distance between the class pair p (``np.triu_indices(C, 1)`` order over the sorted classes
        present).
    """
    if isinstance(features, torch.Tensor):
        features = features.detach().cpu().double().numpy()
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    feats, labels = np.asarray(features, dtype=np.float64), np.asarray(labels)
    if feats.ndim != 4 or len(feats) != len(labels):
        raise ValueError(
            f"features must be (N, L, H, d_k) with N = len(labels) = {len(labels)}, "
            f"got {feats.shape}"
        )
    classes, counts = np.unique(labels, return_counts=True)
    if len(classes) < 2:
        raise ValueError(f"separability needs two classes or more, got {classes.tolist()}")
    if counts.min() < 2:
        raise ValueError(
            f"class {classes[counts.argmin()]} has {counts.min()} sample; "
            "every class needs at least 2"
        )
    _, num_layers, num_heads, dk = feats.shape
    flat = feats.reshape(len(feats), num_layers * num_heads, dk)  # (N, L*H, d_k)
    profiles = np.empty((num_layers * num_heads, len(classes) * (len(classes) - 1) // 2))
    for head in range(flat.shape[1]):
        groups = [flat[labels == c, head] for c in classes]
        mean = np.stack([g.mean(axis=0) for g in groups])  # (C, d_k)
        cov = np.stack([regularised_covariance(g) for g in groups])  # (C, d_k, d_k)
        profiles[head] = jeffries_matusita(mean, cov)
    return profiles


def pairwise_distances(profiles: np.ndarray) -> np.ndarray:
    """Euclidean distances (n, n) between the rows of ``profiles`` (n, p): the head graph."""
    diff = profiles[:, None, :] - profiles[None, :, :]
    return np.sqrt((diff**2).sum(-1))


def k_medoids(
    distances: np.ndarray, k: int, seed: int = 0, *, n_init: int = 5, max_iter: int = 100
) -> tuple[np.ndarray, np.ndarray]:
    """k-medoids on a distance matrix, deterministic for a given seed.

    Each of ``n_init`` restarts seeds k medoids k-means++-style (the first uniformly, each next one
    with probability proportional to the squared distance to the nearest medoid so far), then
    alternates assigning every point to its nearest medoid and moving each medoid to the member that
    minimises the summed distance to its cluster, until the medoids stop changing. The restart with
    the lowest total distance wins.

    Returns:
        (medoids, labels): the sorted medoid indices (k,) and, for every point, the position in
        ``medoids`` of its cluster's medoid (n,).
    """
    distances = np.asarray(distances, dtype=np.float64)
    n = len(distances)
    if distances.shape != (n, n):
        raise ValueError(f"distances must be a square matrix, got shape {distances.shape}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be between 1 and the number of points {n}, got {k}")
    rng = np.random.default_rng(seed)
    best_cost, best = np.inf, None
    for _ in range(n_init):
        medoids = _alternate(distances, _seed_medoids(distances, k, rng), max_iter)
        cost = distances[:, medoids].min(axis=1).sum()
        if cost < best_cost - 1e-12:
            best_cost, best = cost, medoids
    medoids = np.sort(best)
    return medoids, distances[:, medoids].argmin(axis=1)


def _seed_medoids(distances: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    n = len(distances)
    chosen = [int(rng.integers(n))]
    for _ in range(k - 1):
        weight = distances[:, chosen].min(axis=1) ** 2
        weight[chosen] = 0.0
        if weight.sum() <= 0:  # every remaining point sits on a medoid: pick any of them
            weight = np.ones(n)
            weight[chosen] = 0.0
        chosen.append(int(rng.choice(n, p=weight / weight.sum())))
    return np.array(chosen)


def _alternate(distances: np.ndarray, medoids: np.ndarray, max_iter: int) -> np.ndarray:
    for _ in range(max_iter):
        labels = distances[:, medoids].argmin(axis=1)
        labels[medoids] = np.arange(len(medoids))  # a medoid is in its own cluster, even on ties
        updated = medoids.copy()
        for cluster in range(len(medoids)):
            members = np.flatnonzero(labels == cluster)
            within = distances[np.ix_(members, members)].sum(axis=1)
            updated[cluster] = members[within.argmin()]
        if np.array_equal(updated, medoids):
            break
        medoids = updated
    return medoids


def knee_from_polyfit(
    ks: Sequence[int] | np.ndarray, values: Sequence[float] | np.ndarray, degree: int = 3
) -> tuple[int, np.polynomial.Polynomial]:
    """The knee of a rising, saturating curve, read off a polynomial fitted to it.

    Fits a polynomial of ``degree`` to (ks, values) (``numpy.polynomial.Polynomial.fit``, i.e. a
    least-squares polyfit on a rescaled axis), evaluates it at every integer from min(ks) to
    max(ks), and returns the integer where the fitted curve is farthest above the chord between its
    two ends (Kneedle). When no point lies above the chord, returns max(ks).

    Returns:
        (knee, polynomial); ``polynomial(k)`` gives fitted values.
    """
    ks = np.asarray(ks, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    if ks.shape != values.shape or ks.ndim != 1:
        raise ValueError(f"ks and values must be 1-D of one length; got {ks.shape}, {values.shape}")
    if degree < 1:
        raise ValueError(f"degree must be at least 1, got {degree}")
    distinct = len(np.unique(ks))
    if distinct <= degree:
        raise ValueError(
            f"a degree-{degree} fit needs {degree + 1} or more distinct k, got {distinct}"
        )
    poly = np.polynomial.Polynomial.fit(ks, values, degree)
    grid = np.arange(int(np.ceil(ks.min())), int(np.floor(ks.max())) + 1)
    fitted = poly(grid)
    chord = fitted[0] + (fitted[-1] - fitted[0]) * (grid - grid[0]) / max(grid[-1] - grid[0], 1)
    above = fitted - chord
    if above.max() <= 1e-12 * max(1.0, np.abs(fitted).max()):
        return int(grid[-1]), poly
    return int(grid[above.argmax()]), poly


def cahp_k_grid(total_heads: int, step: int = 1) -> list[int]:
    """The head counts CAHP evaluates: every ``step``-th count from 1, and always every head.

    A coarser grid makes the curve cheaper (one evaluation per count) while the knee is still
    read off the fitted polynomial at every integer count.

    Args:
        total_heads: the model's number of heads (``head_layout(model).total_heads``).
        step: evaluate every ``step``-th count (1: all of them).

    Returns:
        1, 1 + step, 1 + 2 step, ..., up to and including ``total_heads``.
    """
    if total_heads < 1:
        raise ValueError(f"total_heads must be a positive number of heads, got {total_heads}")
    if step < 1:
        raise ValueError(f"step must be a positive number of head counts, got {step}")
    grid = list(range(1, total_heads + 1, step))
    if grid[-1] != total_heads:
        grid.append(total_heads)
    return grid


@dataclass(frozen=True)
class VariantDefaults:
    """A variant's defaults: the clustering (and t-SNE) seed, the knee's polynomial degree, and
    which head of a cluster is kept."""

    seed: int
    degree: int
    representative: str


#: the CAHP variants, the default first
CAHP_VARIANTS = ("official", "accuracy-knee")
#: which head of a cluster is kept: the most important one, or the medoid
REPRESENTATIVES = ("importance", "medoid")
VARIANT_DEFAULTS = {
    "official": VariantDefaults(seed=SEED, degree=DEGREE, representative="importance"),
    "accuracy-knee": VariantDefaults(seed=0, degree=3, representative="medoid"),
}


def check_variant(variant: str) -> str:
    """``variant`` if it is one of :data:`CAHP_VARIANTS`; an InputError naming them otherwise."""
    if variant not in CAHP_VARIANTS:
        raise InputError(
            f"{variant!r} is not a CAHP variant; choose one of {', '.join(CAHP_VARIANTS)}"
        )
    return variant


def cahp_seeds(m: int, variant: str = CAHP_VARIANTS[0]) -> list[int]:
    """The seeds of M CAHP members by default: the variant's seed, then the next M - 1."""
    start = VARIANT_DEFAULTS[check_variant(variant)].seed
    return list(range(start, start + m))


@dataclass
class CAHPResult:
    """The outcome of :func:`cahp_select`.

    Args:
        variant: which CAHP ran (:data:`CAHP_VARIANTS`); seed, degree, representative: its
            settings.
        keep: the selected head mask (L, H), True = kept: ``representatives`` and ``added``.
        knee_k: the number of clusters at the knee.
        curve: columns k, the score whose knee is taken (``mss`` for official, ``accuracy`` for
            accuracy-knee) and fitted (the polynomial the knee is read off).
        coefficients: that polynomial in ``numpy.polyval`` order (highest power first, in k).
        heads: (layer, head) of each row of ``profiles`` and each index of ``distances``.
        profiles: the heads' Jeffries-Matusita profiles (official: D values per class pair;
            accuracy-knee: one per class pair).
        distances: (heads, heads) Euclidean distances the clustering ran on (official: between
            the t-SNE coordinates; accuracy-knee: between profiles).
        medoids: k -> the clusters' medoids (accuracy-knee: every k of the grid; official: the
            knee's).
        representatives: the head kept for each cluster at the knee.
        added: heads kept only so that no layer loses every head.
        importance: (heads,) head-mask-gradient importance, min-max normalised.
        embedding: (heads, 2) t-SNE coordinates (official); None for accuracy-knee.
    """

    variant: str
    keep: torch.Tensor
    knee_k: int
    curve: pd.DataFrame
    coefficients: np.ndarray
    heads: list[Head]
    profiles: np.ndarray
    distances: np.ndarray
    medoids: dict[int, list[Head]]
    representatives: list[Head]
    added: list[Head]
    importance: np.ndarray
    seed: int
    degree: int
    representative: str
    embedding: np.ndarray | None = None

    @property
    def score_name(self) -> str:
        """The curve's score column: ``mss`` or ``accuracy``."""
        return str(self.curve.columns[1])

    def describe(self) -> str:
        """One line naming the variant and what it chose, for member sources and reports."""
        curve = "mean simplified silhouette" if self.variant == "official" else "accuracy"
        added = f" (+{len(self.added)} for empty layers)" if self.added else ""
        return (
            f"CAHP {self.variant}: knee of the {curve} curve at {self.knee_k} clusters (degree "
            f"{self.degree}), {int(self.keep.sum())} heads kept{added}, {self.representative} "
            f"per cluster, seed {self.seed}"
        )


def cahp_select(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    variant: str = CAHP_VARIANTS[0],
    seed: int | None = None,
    degree: int | None = None,
    representative: str | None = None,
    k_grid: Sequence[int] | None = None,
    batch_size: int = 256,
    progress: Progress | None = None,
) -> CAHPResult:
    """Choose complementary heads and how many to keep, by the CAHP ``variant``.

    Args:
        x, y: ID search inputs (images, or token ids in any form
            :func:`~hydra_core.models.adapter.model_and_inputs` takes) and labels: they give
            the signatures, the importance and (accuracy-knee) the accuracy curve.
        variant: ``official`` (the authors' code) or ``accuracy-knee`` (our earlier reading).
        seed: the clustering (and t-SNE) seed; default the variant's (42, 0).
        degree: degree of the knee's polynomial fit; default the variant's (6, 3).
        representative: accuracy-knee only: ``medoid`` (default) or ``importance``.
        k_grid: accuracy-knee only: the numbers of clusters to evaluate (default every k from 1
            to the number of heads; :func:`cahp_k_grid` makes coarser ones).
        batch_size: accuracy-knee's batches (the official variant reads its data in chunks of
            its authors' loader batch size, 32).
        progress: called as ``progress(done, total)`` as the selection advances.
    """
    defaults = VARIANT_DEFAULTS[check_variant(variant)]
    seed = defaults.seed if seed is None else int(seed)
    degree = defaults.degree if degree is None else int(degree)
    representative = defaults.representative if representative is None else representative
    if representative not in REPRESENTATIVES:
        raise InputError(
            f"{representative!r} is not a cluster representative; choose one of "
            f"{', '.join(REPRESENTATIVES)}"
        )
    if degree < 1:
        raise InputError(f"the polynomial degree must be at least 1, got {degree}")
    model, x = model_and_inputs(model, x, names=("x",))  # a text model: one that takes packed ids
    if variant == "official":
        if k_grid is not None or representative != "importance":
            raise InputError(
                "the official CAHP variant clusters for every k = 2 .. heads - 1 and keeps each "
                "cluster's most important head; a k grid and the medoid as representative are "
                "options of the accuracy-knee variant"
            )
        return _official(model, x, y, seed=seed, degree=degree, progress=progress)
    return _accuracy_knee(
        model,
        x,
        y,
        seed=seed,
        degree=degree,
        representative=representative,
        k_grid=k_grid,
        batch_size=batch_size,
        progress=progress,
    )


def _official(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    seed: int,
    degree: int,
    progress: Progress | None,
) -> CAHPResult:
    layout = head_layout(model)
    heads = _heads(layout)
    steps = official_steps(model, x, y, heads, seed=seed, degree=degree, progress=progress)
    representatives = [heads[i] for i in steps.representatives]
    added = [heads[i] for i in steps.added]
    return CAHPResult(
        variant="official",
        keep=_mask(layout.shape, representatives + added),
        knee_k=steps.knee,
        curve=pd.DataFrame({"k": steps.ks, "mss": steps.mss, "fitted": steps.fitted}),
        coefficients=np.polyfit(steps.ks, steps.mss, degree),
        heads=heads,
        profiles=steps.profiles,
        distances=pairwise_distances(steps.embedding.astype(np.float64)),
        medoids={steps.knee: [heads[i] for i in steps.medoids]},
        representatives=representatives,
        added=added,
        importance=steps.importance,
        seed=seed,
        degree=degree,
        representative="importance",
        embedding=steps.embedding,
    )


def _accuracy_knee(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    seed: int,
    degree: int,
    representative: str,
    k_grid: Sequence[int] | None,
    batch_size: int,
    progress: Progress | None,
) -> CAHPResult:
    layout = head_layout(model)
    heads = _heads(layout)
    grid = cahp_k_grid(len(heads)) if k_grid is None else sorted({int(k) for k in k_grid})
    if not grid or grid[0] < 1 or grid[-1] > len(heads):
        raise ValueError(
            f"k_grid must hold numbers of heads between 1 and {len(heads)}, "
            f"got {list(k_grid or [])}"
        )
    features = head_cls_features(model, x, batch_size=batch_size)  # (N, L, H, d_k)
    profiles = jeffries_matusita_profiles(features, y)
    rows = [layer * layout.max_heads + head for layer, head in heads]
    profiles = profiles[rows]  # only heads that exist (a pruned model's padding is left out)
    distances = pairwise_distances(profiles)
    importance = head_mask_importance(model, x, y)

    def selection(k: int) -> tuple[list[int], list[int], list[int]]:
        """(medoids, representatives, added for empty layers), as indices into ``heads``."""
        medoids, labels = k_medoids(distances, k, seed)
        chosen = (
            [int(i) for i in medoids]
            if representative == "medoid"
            else most_important_per_cluster(importance, labels, medoids)
        )
        return [int(i) for i in medoids], chosen, keep_one_per_layer(chosen, heads, importance)

    selections, accuracy = {}, []
    for done, k in enumerate(grid, start=1):
        selections[k] = selection(k)
        kept = [heads[i] for i in selections[k][1] + selections[k][2]]
        accuracy.append(_accuracy(model, x, y, _mask(layout.shape, kept), batch_size))
        if progress is not None:
            progress(done, len(grid))
    knee, poly = knee_from_polyfit(grid, accuracy, degree)
    if knee not in selections:
        selections[knee] = selection(knee)
    _, chosen, added = selections[knee]
    representatives, added = [heads[i] for i in chosen], [heads[i] for i in added]
    fitted = poly(np.asarray(grid, dtype=np.float64))
    return CAHPResult(
        variant="accuracy-knee",
        keep=_mask(layout.shape, representatives + added),
        knee_k=knee,
        curve=pd.DataFrame({"k": grid, "accuracy": accuracy, "fitted": fitted}),
        coefficients=poly.convert().coef[::-1],
        heads=heads,
        profiles=profiles,
        distances=distances,
        medoids={k: [heads[i] for i in chosen[0]] for k, chosen in selections.items()},
        representatives=representatives,
        added=added,
        importance=importance,
        seed=seed,
        degree=degree,
        representative=representative,
    )


def _heads(layout: HeadLayout) -> list[Head]:
    """Every head the model has, layer by layer."""
    return [tuple(h) for h in layout.all_kept().nonzero().tolist()]


def _mask(shape: tuple[int, int], heads: Sequence[Head]) -> torch.Tensor:
    keep = torch.zeros(shape, dtype=torch.bool)
    for layer, head in heads:
        keep[layer, head] = True
    return keep


def _accuracy(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, keep: torch.Tensor, batch_size: int
) -> float:
    device = model_device(model)
    logits = predict(masked(model, keep), x, _as_is, batch_size=batch_size, device=device)
    return (logits.argmax(-1) == y.cpu()).float().mean().item()


def _as_is(x: torch.Tensor) -> torch.Tensor:
    return x  # the inputs are already preprocessed (token ids stay ints)
