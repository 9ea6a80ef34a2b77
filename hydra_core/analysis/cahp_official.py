"""CAHP as its authors' code runs it (repository yanivlivert/cahp), one function per step.

Each step names the function of theirs it follows and keeps its arithmetic (float32 where theirs
is float32, their variance floor, their order of operations), so that on the same attention
maps it keeps the same heads; ``tests/analysis/test_cahp_official.py`` checks that against a
separate transcription of their code.

1. **Signatures** (``head_utils.collect_head_signatures``): each head's softmax attention map of
   a sample, over its real tokens (queries x keys; padding dropped), as the model's explicit
   attention computes it (their ``load_model`` sets Hugging Face's "eager"), resized bilinearly to
   ``pool_size`` x ``pool_size`` (32: ``--pool_size``) and flattened to D = 1,024 values; per
   class, a running mean and variance per value (``RunningStats``: Welford's merge, batch by
   batch of their data loader's 32 samples, float32; variance M2 / (n - 1), 1e-6 below two
   samples).
2. **Profiles** (``build_global_feature_matrix``, ``graph/distance.py``): for every pair of
   classes, the one-dimensional Jeffries-Matusita distance per value, JM = 2 (1 - exp(-B)) with
   B = (mu1 - mu2)^2 / (4 (s1 + s2)) + ln((s1 + s2) / (2 sqrt(s1 s2))) / 2 and variances floored
   at 1e-6; a head's profile is the D values of every pair, concatenated (D x pairs).
3. **Embedding** (``reduce_feature_dimension``): scikit-learn t-SNE to 2-D, perplexity 10,
   1,000 iterations, ``random_state`` = the seed (42).
4. **Clusters** (``graph/clustering.py``): FasterPAM (the ``kmedoids`` package) on the Euclidean
   distances between embedded heads, ``random_state`` = the seed, for every k = 2 .. N - 1.
5. **Number of clusters** (``graph/mss.py``, ``get_knee``): the mean simplified silhouette of
   each clustering (a = distance to the own medoid, b = *mean* distance to the other medoids,
   points with a = 0 left out; a curve that reaches 1 stays at 1), and the knee of that curve
   by ``kneed.KneeLocator`` (concave, increasing, polynomial fit of degree 6).
6. **Importance** (``compute_head_importance``): |dL / d head mask| of a mask of ones that
   multiplies each head's output before W_O, L the mean cross-entropy of a batch, summed over
   the first 25% of the data loader's batches, divided by their number, min-max normalised.
7. **Selection** (``find_optimal_weighted_medoids``, ``AttentionHeadPruner.prune``): in each
   cluster at the knee the most important head; a layer left without a head keeps its most
   important one.

Where this departs from their code: it reads the search split's tensors in order, in chunks of
their loader's batch size, instead of a Hugging Face dataset through a ``DataLoader``; it works
on any family of the seam (their code runs Hugging Face BERT models only: ``model.bert`` is
hard-coded for the importance); the real tokens are the ones the attention mask marks (they cut
each map to its first ``sum(mask)`` tokens: the same for right-padded text); the classes are
those present in the labels, sorted (theirs assume labels 0 .. C - 1); the importance is
computed over the heads a model has (theirs refuse layers with different head counts);
nothing global is seeded (their ``force_set_seed``): t-SNE and FasterPAM get the seed directly;
too few heads for t-SNE, an MSS curve without a knee and a flat one raise an InputError (theirs
crash, or take kneed's knee of rounding noise); and the pruned model is not fine-tuned here
(theirs trains it 3 epochs after the selection).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hydra_core.analysis.representations import model_device
from hydra_core.errors import InputError
from hydra_core.models.adapter import attention_weights, family_of, head_layout, scale_heads
from hydra_core.types import Head, Progress

#: their defaults: pool size (``--pool_size``), t-SNE perplexity, polynomial degree
#: (``--poly_deg``), seed (``--seed``), their data loader's batch size, the share of its batches
#: the importance reads, and the variance floor of ``bhattacharyya_distance`` / ``RunningStats``
POOL_SIZE = 32
PERPLEXITY = 10
DEGREE = 6
SEED = 42
LOADER_BATCH_SIZE = 32
IMPORTANCE_SHARE = 0.25
VARIANCE_FLOOR = 1e-6


# --- 1. signatures -------------------------------------------------------------------------------


def pooled_maps(
    weights: torch.Tensor, real: torch.Tensor | None, pool_size: int = POOL_SIZE
) -> torch.Tensor:
    """One layer's attention maps over the real tokens, resized to ``pool_size`` squared.

    Args:
        weights: (B, H, N, N) softmax weights of a batch (``attention_weights``).
        real: (B, N) bool, the real tokens of each sample; None when all are.

    Returns:
        (B, H, pool_size * pool_size): bilinear (``align_corners=False``) resizing, flattened.
    """
    b, h, n, _ = weights.shape
    size = (pool_size, pool_size)
    if h == 0:
        return weights.new_zeros(b, 0, pool_size * pool_size)
    if real is None:
        maps = weights.reshape(b * h, 1, n, n)
        return F.interpolate(maps, size=size, mode="bilinear", align_corners=False).reshape(
            b, h, -1
        )
    pooled = []
    for sample, tokens in zip(weights, real, strict=True):
        index = tokens.nonzero().flatten()
        maps = sample[:, index][:, :, index].unsqueeze(1)  # (H, 1, L, L): real tokens only
        pooled.append(
            F.interpolate(maps, size=size, mode="bilinear", align_corners=False).flatten(1)
        )
    return torch.stack(pooled)  # (B, H, P * P)


@dataclass
class ClassStatistics:
    """Per class, per head, per pooled value: the running mean and M2 of the signatures.

    Args:
        classes: (C,) the classes, sorted; counts: (C,) samples of each.
        mean, m2: (C, heads, D) float32, Welford's running mean and sum of squared deviations.
    """

    classes: np.ndarray
    counts: np.ndarray
    mean: np.ndarray
    m2: np.ndarray

    @property
    def var(self) -> np.ndarray:
        """(C, heads, D): M2 / (n - 1), and the floor 1e-6 for a class of fewer than two."""
        var = np.empty_like(self.mean)
        for c, n in enumerate(self.counts):
            var[c] = self.m2[c] / (n - 1) if n >= 2 else np.full_like(self.mean[c], VARIANCE_FLOOR)
        return var


def welford_merge(
    mean: np.ndarray, m2: np.ndarray, n: int, batch: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int]:
    """Merge a batch (k, ...) into a running mean and M2 of n samples (``update_batch``)."""
    k = len(batch)
    batch_mean = np.mean(batch, axis=0)
    batch_m2 = np.sum((batch - batch_mean) ** 2, axis=0)
    delta = batch_mean - mean
    total = n + k
    m2 = m2 + (batch_m2 + (delta**2) * (n * k / total))  # their M2 += (...)
    mean = mean + delta * (k / total)
    return mean, m2, total


def attention_statistics(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    pool_size: int = POOL_SIZE,
    loader_batch_size: int = LOADER_BATCH_SIZE,
    progress: Progress | None = None,
) -> ClassStatistics:
    """Step 1 over ``x`` (model inputs, in order) and labels ``y``: the heads are every layer's,
    in order, as many as the layer has. The model runs its explicit attention (Hugging Face's
    "eager", as their loader sets it; timm's unfused one), whose weights the maps are."""
    labels = np.asarray(y.cpu() if isinstance(y, torch.Tensor) else y)
    classes = np.unique(labels)
    heads = head_layout(model).total_heads
    dim = pool_size * pool_size
    mean = np.zeros((len(classes), heads, dim), dtype=np.float32)
    m2 = np.zeros_like(mean)
    counts = np.zeros(len(classes), dtype=np.int64)
    device = model_device(model)
    batches = range(0, len(x), loader_batch_size)
    with torch.no_grad(), family_of(model).explicit_attention(model):
        for done, start in enumerate(batches, start=1):
            weights, real = attention_weights(
                model, x[start : start + loader_batch_size].to(device)
            )
            signatures = torch.cat([pooled_maps(w, real, pool_size) for w in weights], dim=1)
            signatures = signatures.float().cpu().numpy()  # (B, heads, D)
            batch_labels = labels[start : start + loader_batch_size]
            for c in np.unique(batch_labels):
                i = int(np.searchsorted(classes, c))
                mean[i], m2[i], counts[i] = welford_merge(
                    mean[i], m2[i], int(counts[i]), signatures[batch_labels == c]
                )
            if progress is not None:
                progress(done, len(batches))
    return ClassStatistics(classes, counts, mean, m2)


# --- 2. profiles ---------------------------------------------------------------------------------


def jm_distance(mu1: np.ndarray, var1: np.ndarray, mu2: np.ndarray, var2: np.ndarray) -> np.ndarray:
    """The Jeffries-Matusita distance per dimension between two normal distributions given by
    their means and variances (``jm_distance``), float32."""
    s1 = np.maximum(var1, VARIANCE_FLOOR)
    s2 = np.maximum(var2, VARIANCE_FLOOR)
    diff2 = (mu1 - mu2) ** 2
    b = 0.25 * diff2 / (s1 + s2) + 0.5 * np.log((s1 + s2) / (2.0 * np.sqrt(s1 * s2)))
    return (2.0 * (1.0 - np.exp(-b))).astype(np.float32)


def jm_profiles(stats: ClassStatistics) -> np.ndarray:
    """Step 2: (heads, D x pairs) float32; columns p D .. (p + 1) D - 1 hold class pair p
    (``itertools.combinations`` order over the sorted classes)."""
    if len(stats.classes) < 2:
        raise InputError(
            f"CAHP compares classes, but the search labels hold one class "
            f"({stats.classes.tolist()}); use a search split with two classes or more"
        )
    var = stats.var
    pairs = list(combinations(range(len(stats.classes)), 2))
    return np.concatenate(
        [jm_distance(stats.mean[i], var[i], stats.mean[j], var[j]) for i, j in pairs], axis=1
    )


# --- 3 to 5. embedding, clusters, their number ---------------------------------------------------


def tsne_embedding(
    profiles: np.ndarray, seed: int = SEED, perplexity: float = PERPLEXITY
) -> np.ndarray:
    """Step 3: (heads, 2), scikit-learn's t-SNE as ``reduce_feature_dimension`` calls it."""
    from sklearn.manifold import TSNE

    if len(profiles) <= perplexity:
        raise InputError(
            f"CAHP's official variant embeds the heads with t-SNE at perplexity {perplexity:g}, "
            f"which needs more than {perplexity:g} heads; this model has {len(profiles)}: use "
            "the accuracy-knee variant (--cahp-variant accuracy-knee) for it"
        )
    tsne = TSNE(n_components=2, max_iter=1000, perplexity=perplexity, random_state=seed)
    return tsne.fit_transform(profiles)


def fasterpam_clusters(
    points: np.ndarray, k: int, seed: int = SEED
) -> tuple[np.ndarray, np.ndarray]:
    """Step 4 for one k (``kmedoids_fasterpam``): (labels (n,), medoids (k,)), ``labels[i]``
    the position in ``medoids`` of point i's medoid."""
    from kmedoids import fasterpam
    from sklearn.metrics import pairwise_distances

    result = fasterpam(diss=pairwise_distances(points), medoids=int(k), random_state=seed)
    return np.asarray(result.labels), np.asarray(result.medoids)


def mean_simplified_silhouette(
    points: np.ndarray, labels: np.ndarray, medoids: np.ndarray
) -> float:
    """``calc_mss_value``: per point a = distance to its medoid, b = the mean distance to the
    other medoids, s = (b - a) / max(a, b); the mean over points with a != 0 (1 when none)."""
    from sklearn.metrics.pairwise import euclidean_distances

    centers = points[medoids]
    intra = euclidean_distances(points, centers[labels]).diagonal()
    others = np.zeros_like(intra)
    for cluster in range(len(centers)):
        members = points[labels == cluster]
        if members.size == 0:
            continue
        rest = np.delete(centers, cluster, axis=0)
        others[labels == cluster] = euclidean_distances(members, rest).mean(axis=1)
    valid = intra != 0
    if not np.any(valid):
        return 1.0
    a, b = intra[valid], others[valid]
    return float(np.mean((b - a) / np.maximum(a, b)))


def mss_curve(
    points: np.ndarray, seed: int = SEED, progress: Progress | None = None
) -> tuple[list[int], list[float]]:
    """Step 5's curve (``select_optimal_components``): (k = 2 .. N - 1, MSS of each FasterPAM
    clustering); once a clustering reaches MSS 1, the rest of the curve is 1."""
    ks = list(range(2, len(points)))
    values: list[float] = []
    for k in ks:
        labels, medoids = fasterpam_clusters(points, k, seed)
        values.append(mean_simplified_silhouette(points, labels, medoids))
        if progress is not None:
            progress(len(values), len(ks))
        if values[-1] == 1.0:
            values.extend([1.0] * (len(ks) - len(values)))
            break
    return ks, values


def mss_knee(
    ks: Sequence[int], values: Sequence[float], degree: int = DEGREE
) -> tuple[int, np.ndarray]:
    """Step 5's knee (``get_knee``): ``kneed.KneeLocator`` on a concave, increasing curve
    smoothed by a polynomial of ``degree``. Returns (knee, the smoothed curve at ``ks``).

    An InputError when kneed finds no knee, and (unlike their code, which would take the knee
    kneed reads off rounding noise) when the smoothed curve is flat."""
    from kneed import KneeLocator

    if len(ks) < 2:
        raise InputError(
            f"the MSS curve has {len(ks)} point(s) (k = 2 .. heads - 1); CAHP needs a model "
            "with more heads"
        )
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # polyfit's conditioning; a flat curve's 0 / 0
        locator = KneeLocator(
            list(ks),
            list(values),
            curve="concave",
            direction="increasing",
            interp_method="polynomial",
            polynomial_degree=degree,
        )
    fitted = np.asarray(locator.Ds_y, dtype=np.float64)
    flat = np.ptp(fitted) <= 1e-9 * max(1.0, float(np.abs(fitted).max()))
    if locator.knee is None or flat:  # a flat curve's "knee" would be rounding noise
        raise InputError(
            f"the mean simplified silhouette curve (k = {ks[0]} .. {ks[-1]}) has no knee under "
            f"a degree-{degree} fit, so CAHP cannot choose a number of heads; try another seed "
            "or degree, or more search samples"
        )
    return int(locator.knee), fitted


# --- 6 and 7. importance and selection -----------------------------------------------------------


def head_mask_importance(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    loader_batch_size: int = LOADER_BATCH_SIZE,
    share: float = IMPORTANCE_SHARE,
    progress: Progress | None = None,
) -> np.ndarray:
    """Step 6: (heads,) float32 in [0, 1], every layer's heads in order.

    The batches are ``x`` cut in chunks of ``loader_batch_size``; the first
    max(1, int(share x their number)) are read, with the model's explicit attention. The
    model's parameters get no gradient (their ``requires_grad`` flags are restored) and the model
    is used in the mode it is in.
    """
    layout = head_layout(model)
    device = model_device(model)
    batches = -(-len(x) // loader_batch_size)
    target = max(1, int(share * batches))
    scales = torch.ones(layout.shape, device=device, requires_grad=True)
    total = torch.zeros(layout.shape, device=device)
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        with (
            family_of(model).explicit_attention(model),
            scale_heads(model, scales),
            torch.enable_grad(),
        ):
            for done in range(1, target + 1):
                chunk = slice((done - 1) * loader_batch_size, done * loader_batch_size)
                loss = F.cross_entropy(model(x[chunk].to(device)), y[chunk].to(device))
                (grad,) = torch.autograd.grad(loss, scales)
                total += grad.abs()
                if progress is not None:
                    progress(done, target)
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
    total /= float(target)
    weights = total[layout.all_kept().to(device)].cpu().numpy().astype(np.float32)
    low, high = float(weights.min()), float(weights.max())
    if high > low:
        return (weights - low) / (high - low)
    return np.ones_like(weights)


def most_important_per_cluster(
    importance: np.ndarray, labels: np.ndarray, medoids: np.ndarray
) -> list[int]:
    """Step 7 (``find_optimal_weighted_medoids``): per medoid, the member of its cluster with
    the highest importance (the first on ties)."""
    chosen = []
    for medoid in medoids:
        members = np.where(labels == labels[medoid])[0]
        chosen.append(int(members[np.argmax(importance[members])]))
    return chosen


def keep_one_per_layer(
    kept: Sequence[int], heads: Sequence[Head], importance: np.ndarray
) -> list[int]:
    """Step 7's guard: for each layer none of whose heads is in ``kept`` (indices into
    ``heads``), its most important head. Returns the added indices, by layer."""
    layers = sorted({layer for layer, _ in heads})
    covered = {heads[i][0] for i in kept}
    added = []
    for layer in layers:
        if layer in covered:
            continue
        members = [i for i, (lay, _) in enumerate(heads) if lay == layer]
        added.append(members[int(np.argmax(importance[members]))])
    return added


# --- the whole selection -------------------------------------------------------------------------


@dataclass
class OfficialSteps:
    """What each step of :func:`official_steps` produced.

    Args:
        profiles: (heads, D x pairs) JM profiles; embedding: (heads, 2) t-SNE coordinates.
        ks, mss, fitted: the MSS curve, and the degree-``degree`` polynomial kneed smoothed it to.
        knee: the number of clusters; labels, medoids: the FasterPAM clustering at the knee.
        importance: (heads,) normalised head-mask gradients.
        representatives: per cluster, the most important head (indices into the heads).
        added: heads kept only so that no layer is empty.
    """

    profiles: np.ndarray
    embedding: np.ndarray
    ks: list[int]
    mss: list[float]
    fitted: np.ndarray
    knee: int
    labels: np.ndarray
    medoids: np.ndarray
    importance: np.ndarray
    representatives: list[int]
    added: list[int]


def official_steps(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    heads: Sequence[Head],
    *,
    seed: int = SEED,
    degree: int = DEGREE,
    pool_size: int = POOL_SIZE,
    perplexity: float = PERPLEXITY,
    loader_batch_size: int = LOADER_BATCH_SIZE,
    progress: Progress | None = None,
) -> OfficialSteps:
    """Steps 1 to 7 on ``model`` (a callable model, as ``model_and_inputs`` gives it) for the
    search inputs ``x`` and labels ``y``; ``heads`` are the model's heads, layer by layer."""
    if model.training:
        raise InputError(
            "the model is in training mode (dropout would make the attention maps random); "
            "call model.eval() first"
        )
    stat_batches = -(-len(x) // loader_batch_size)
    importance_batches = max(1, int(IMPORTANCE_SHARE * stat_batches))
    total = stat_batches + importance_batches + max(len(heads) - 2, 0)

    def stage(offset: int) -> Progress | None:
        if progress is None:
            return None
        return lambda done, _: progress(offset + done, total)

    stats = attention_statistics(
        model, x, y, pool_size=pool_size, loader_batch_size=loader_batch_size, progress=stage(0)
    )
    profiles = jm_profiles(stats)
    embedding = tsne_embedding(profiles, seed, perplexity)
    importance = head_mask_importance(
        model, x, y, loader_batch_size=loader_batch_size, progress=stage(stat_batches)
    )
    ks, mss = mss_curve(embedding, seed, progress=stage(stat_batches + importance_batches))
    knee, fitted = mss_knee(ks, mss, degree)
    labels, medoids = fasterpam_clusters(embedding, knee, seed)
    representatives = most_important_per_cluster(importance, labels, medoids)
    added = keep_one_per_layer(representatives, heads, importance)
    if progress is not None:
        progress(total, total)
    return OfficialSteps(
        profiles=profiles,
        embedding=embedding,
        ks=ks,
        mss=mss,
        fitted=fitted,
        knee=knee,
        labels=labels,
        medoids=medoids,
        importance=importance,
        representatives=representatives,
        added=added,
    )
