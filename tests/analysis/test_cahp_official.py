"""The official CAHP variant against a separate transcription of its authors' code, and each of
its steps against a direct computation.

``Authors`` below is written from the authors' repository (yanivlivert/cahp:
``cahp/utils/head_utils.py``, ``cahp/data_types/running_stats.py``, ``cahp/graph/distance.py``,
``cahp/graph/clustering.py``, ``cahp/graph/mss.py``, ``cahp/pruning/pruners/
attention_head_pruner.py``), function by function, and imports nothing of Hydra Lab's CAHP: the
attention maps come from the library's own attention (Hugging Face's ``output_attentions``, as
their code reads them; timm's unfused softmax for a ViT), the head mask from a hook on the
module their code hooks. Only their loaders, logging and plots are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from kmedoids import fasterpam
from kneed import KneeLocator
from sklearn.manifold import TSNE
from sklearn.metrics.pairwise import euclidean_distances, pairwise_distances

from hydra_core.analysis.cahp import cahp_select
from hydra_core.analysis.cahp_official import (
    attention_statistics,
    head_mask_importance,
    jm_distance,
    jm_profiles,
    keep_one_per_layer,
    mean_simplified_silhouette,
    most_important_per_cluster,
    mss_knee,
    pooled_maps,
    tsne_embedding,
    welford_merge,
)
from hydra_core.errors import InputError
from hydra_core.models.text import TextClassifier, pack
from tests.conftest import make_tiny_text, make_tiny_vit

# --- the authors' code, transcribed --------------------------------------------------------------


@dataclass
class RunningStats:  # cahp/data_types/running_stats.py
    D: int
    n: int = 0
    mean: np.ndarray = field(default_factory=lambda: np.array([], dtype=np.float32))
    M2: np.ndarray = field(default_factory=lambda: np.array([], dtype=np.float32))

    def __post_init__(self):
        if self.mean.size == 0:
            self.mean = np.zeros(self.D, dtype=np.float32)
            self.M2 = np.zeros(self.D, dtype=np.float32)

    @property
    def var(self):
        if self.n < 2:
            return np.full_like(self.mean, 1e-6)
        return self.M2 / (self.n - 1)

    def update_batch(self, x_batch):
        k = x_batch.shape[0]
        if k == 0:
            return
        batch_mean = np.mean(x_batch, axis=0)
        batch_m2 = np.sum((x_batch - batch_mean) ** 2, axis=0)
        delta = batch_mean - self.mean
        new_n = self.n + k
        self.M2 += batch_m2 + (delta**2) * (self.n * k / new_n)
        self.mean += delta * (k / new_n)
        self.n = new_n


class Authors:
    """Their pipeline on a list of batches ``{"input_ids", "attention_mask", "labels"}`` (a
    Hugging Face BERT classifier) or ``{"pixel_values", "labels"}`` (a timm ViT)."""

    def __init__(self, model, batches, pool_size=32):
        self.model, self.batches, self.pool_size = model, batches, pool_size
        self.bert = hasattr(model, "bert")
        blocks = model.bert.encoder.layer if self.bert else model.blocks
        self.layer_heads = [
            b.attention.self.num_attention_heads if self.bert else b.attn.num_heads for b in blocks
        ]
        self.global_to_local = [(li, h) for li, n in enumerate(self.layer_heads) for h in range(n)]
        labels = np.concatenate([b["labels"].numpy() for b in batches])
        self.num_classes = len(np.unique(labels))

    def attentions(self, batch):
        if self.bert:
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            return self.model(**inputs, output_attentions=True).attentions
        captured = []  # timm's unfused attention hands its softmax weights to attn_drop
        hooks = [
            b.attn.attn_drop.register_forward_hook(lambda m, a, out: captured.append(out))
            for b in self.model.blocks
        ]
        for b in self.model.blocks:
            b.attn.fused_attn = False
        try:
            self.model(batch["pixel_values"])
        finally:
            for h in hooks:
                h.remove()
        return captured

    def collect_head_signatures(self):  # head_utils.collect_head_signatures
        self.model.eval()
        pool_size, D = self.pool_size, self.pool_size * self.pool_size
        total_heads = sum(self.layer_heads)
        stats = {
            g: {c: RunningStats(D) for c in range(self.num_classes)} for g in range(total_heads)
        }
        with torch.no_grad():
            for batch in self.batches:
                labels = batch["labels"]
                attn_mask = batch.get("attention_mask", None)
                attentions = self.attentions(batch)
                batch_signatures = []
                for layer_attn in attentions:
                    layer_pooled_list = []
                    for b in range(labels.shape[0]):
                        L_real = (
                            int(attn_mask[b].sum().item())
                            if attn_mask is not None
                            else layer_attn.size(-1)
                        )
                        heads_raw = layer_attn[b, :, :L_real, :L_real].unsqueeze(1)
                        pooled = F.interpolate(
                            heads_raw,
                            size=(pool_size, pool_size),
                            mode="bilinear",
                            align_corners=False,
                        )
                        layer_pooled_list.append(pooled.flatten(1))
                    batch_signatures.append(torch.stack(layer_pooled_list, dim=0))
                batch_signatures_np = torch.cat(batch_signatures, dim=1).cpu().numpy()
                labels_np = labels.cpu().numpy()
                for lbl in np.unique(labels_np):
                    subset = batch_signatures_np[np.where(labels_np == lbl)[0]]
                    for global_id in range(total_heads):
                        stats[global_id][lbl].update_batch(subset[:, global_id, :])
        return stats

    @staticmethod
    def jm_distance(mu1, var1, mu2, var2, eps=1e-6):  # graph/distance.py
        s1 = np.maximum(var1, eps)
        s2 = np.maximum(var2, eps)
        diff2 = (mu1 - mu2) ** 2
        B = 0.25 * diff2 / (s1 + s2) + 0.5 * np.log((s1 + s2) / (2.0 * np.sqrt(s1 * s2)))
        JM = 2.0 * (1.0 - np.exp(-B))
        return JM.astype(np.float32)

    def build_global_feature_matrix(self, stats):
        D = self.pool_size * self.pool_size
        pairs = list(combinations(list(range(self.num_classes)), 2))
        X = np.zeros((len(stats), D * len(pairs)), dtype=np.float32)
        for gi in range(len(stats)):
            col = 0
            for c1, c2 in pairs:
                s1, s2 = stats[gi][c1], stats[gi][c2]
                X[gi, col : col + D] = self.jm_distance(s1.mean, s1.var, s2.mean, s2.var)
                col += D
        return X

    def compute_head_importance(self):  # head_utils.compute_head_importance
        num_layers, num_heads = len(self.layer_heads), self.layer_heads[0]
        head_mask = torch.ones(num_layers, num_heads, requires_grad=True)
        head_importance = torch.zeros_like(head_mask)
        original = {p: p.requires_grad for p in self.model.parameters()}
        for p in self.model.parameters():
            p.requires_grad = False
        self.model.eval()

        def make_hook(layer_idx):
            def hook(module, input, output):
                context = output[0]
                B, S, H = context.shape
                context = context.view(B, S, num_heads, H // num_heads)
                context = context * head_mask[layer_idx].view(1, 1, num_heads, 1)
                return (context.view(B, S, H),) + output[1:]

            def pre_hook(module, args):  # timm: the same place, the input of W_O (attn.proj)
                context = args[0]
                B, S, H = context.shape
                context = context.view(B, S, num_heads, H // num_heads)
                context = context * head_mask[layer_idx].view(1, 1, num_heads, 1)
                return (context.view(B, S, H),)

            return hook if self.bert else pre_hook

        if self.bert:
            hooks = [
                layer.attention.self.register_forward_hook(make_hook(i))
                for i, layer in enumerate(self.model.bert.encoder.layer)
            ]
        else:
            hooks = [
                block.attn.proj.register_forward_pre_hook(make_hook(i))
                for i, block in enumerate(self.model.blocks)
            ]
        target_batches = max(1, int(0.25 * len(self.batches)))
        n_batches = 0
        try:
            for batch in self.batches:
                if n_batches >= target_batches:
                    break
                n_batches += 1
                if head_mask.grad is not None:
                    head_mask.grad.zero_()
                with torch.enable_grad():
                    if self.bert:
                        inputs = {k: v for k, v in batch.items() if k != "labels"}
                        loss = self.model(**inputs, labels=batch["labels"]).loss
                    else:  # a timm model returns logits: the loss a classifier computes
                        loss = F.cross_entropy(self.model(batch["pixel_values"]), batch["labels"])
                    loss.backward()
                head_importance += head_mask.grad.abs().detach()
        finally:
            for h in hooks:
                h.remove()
            for p in self.model.parameters():
                p.requires_grad = original.get(p, True)
        head_importance /= float(n_batches)
        weights = head_importance.reshape(-1).detach().cpu().numpy().astype(np.float32)
        w_min, w_max = float(weights.min()), float(weights.max())
        if w_max > w_min:
            return (weights - w_min) / (w_max - w_min)
        return np.ones_like(weights, dtype=np.float32)

    @staticmethod
    def kmedoids_fasterpam(data, k, seed=42):  # graph/clustering.py
        k_medoids = fasterpam(diss=pairwise_distances(data), medoids=k, random_state=seed)
        return {
            "labels": k_medoids.labels,
            "medoids": k_medoids.medoids,
            "medoids_loc": data[k_medoids.medoids],
        }

    @staticmethod
    def calc_mss_value(space, clustering):  # graph/mss.py
        cluster_labels = clustering["labels"]
        cluster_centers = clustering["medoids_loc"]
        intra = euclidean_distances(space, cluster_centers[cluster_labels]).diagonal()
        nearest = np.zeros_like(intra)
        for cluster_index, _ in enumerate(cluster_centers):
            cluster_members = space[cluster_labels == cluster_index]
            if cluster_members.size == 0:
                continue
            non_current = np.delete(cluster_centers, cluster_index, axis=0)
            nearest[cluster_labels == cluster_index] = euclidean_distances(
                cluster_members, non_current
            ).mean(axis=1)
        valid = intra != 0
        if not np.any(valid):
            return 1
        a, b = intra[valid], nearest[valid]
        return np.mean((b - a) / np.maximum(a, b))

    def select_optimal_components(self, reduced, weights, num_components, seed=42, poly_deg=6):
        mss_values = []
        k_values = range(2, num_components)
        for i, k in enumerate(k_values):
            mss_value = self.calc_mss_value(reduced, self.kmedoids_fasterpam(reduced, k, seed))
            mss_values.append(mss_value)
            if mss_value == 1.0 or mss_value == 1:
                mss_values.extend([1.0] * (len(k_values) - i - 1))
                break
        knee = KneeLocator(
            list(k_values),
            mss_values,
            curve="concave",
            direction="increasing",
            interp_method="polynomial",
            polynomial_degree=poly_deg,
        ).knee
        optimal = self.kmedoids_fasterpam(reduced, int(knee), seed)
        labels, medoids = optimal["labels"], optimal["medoids"]
        highest = np.empty_like(medoids)  # find_optimal_weighted_medoids
        for i, medoid in enumerate(medoids):
            cluster_indices = np.where(labels == labels[medoid])[0]
            highest[i] = cluster_indices[np.argmax(weights[cluster_indices])]
        return highest.tolist(), int(knee)

    def prune(self, seed=42, poly_deg=6):  # AttentionHeadPruner.prune, up to the surgery
        stats = self.collect_head_signatures()
        X = self.build_global_feature_matrix(stats)
        Y = TSNE(n_components=2, max_iter=1000, perplexity=10, random_state=seed).fit_transform(X)
        weights = self.compute_head_importance()
        kept, knee = self.select_optimal_components(Y, weights, X.shape[0], seed, poly_deg)
        kept_by_layer = {}
        for gi in kept:
            layer_idx, head_idx = self.global_to_local[gi]
            kept_by_layer.setdefault(layer_idx, []).append(int(head_idx))
        for layer_idx in range(len(self.layer_heads)):
            if kept_by_layer.get(layer_idx):
                continue
            layer_gi = [i for i, (li, _) in enumerate(self.global_to_local) if li == layer_idx]
            best_gi = layer_gi[int(np.argmax([weights[i] for i in layer_gi]))]
            kept_by_layer.setdefault(layer_idx, []).append(self.global_to_local[best_gi][1])
        kept_heads = sorted((li, h) for li, heads in kept_by_layer.items() for h in heads)
        return kept_heads, knee, X, weights


# --- tiny problems, as batches of their loader's 32 samples --------------------------------------


def text_problem(n=128, tokens=14, seed=0):
    """A tiny BERT (4 layers x 6 heads) and right-padded sentences of 4..14 tokens, 3 classes."""
    model = make_tiny_text("bert", depth=4, num_heads=6, seed=seed)
    model.set_attn_implementation("eager")  # so that it returns its attention weights
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 60, (n, tokens), generator=g)
    lengths = torch.randint(4, tokens + 1, (n,), generator=g)
    mask = (torch.arange(tokens)[None] < lengths[:, None]).long()
    ids[:, 0] = 0
    ids[mask == 0] = 1
    labels = torch.randint(0, 3, (n,), generator=g)
    batches = [
        {
            "input_ids": ids[s : s + 32],
            "attention_mask": mask[s : s + 32],
            "labels": labels[s : s + 32],
        }
        for s in range(0, n, 32)
    ]
    return model, TextClassifier(model), pack(ids, mask), labels, batches


def image_problem(n=128, seed=0):
    """A tiny timm ViT (4 layers x 4 heads, 17 tokens) and random images, 5 classes."""
    model = make_tiny_vit(depth=4, num_heads=4, seed=seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 16, 16, generator=g)
    labels = torch.randint(0, 5, (n,), generator=g)
    batches = [
        {"pixel_values": x[s : s + 32], "labels": labels[s : s + 32]} for s in range(0, n, 32)
    ]
    return model, model, x, labels, batches


PROBLEMS = {"bert": text_problem, "vit": image_problem}


@pytest.mark.parametrize("kind", sorted(PROBLEMS))
def test_the_official_variant_keeps_the_heads_the_authors_code_keeps(kind):
    theirs_model, model, x, y, batches = PROBLEMS[kind]()
    kept, knee, profiles, importance = Authors(theirs_model, batches).prune()
    ours = cahp_select(model, x, y)  # the default: official, seed 42, degree 6
    assert ours.variant == "official" and (ours.seed, ours.degree) == (42, 6)
    np.testing.assert_array_equal(ours.profiles, profiles)  # the same maps, the same arithmetic
    np.testing.assert_allclose(ours.importance, importance, rtol=1e-5, atol=1e-6)
    assert ours.knee_k == knee
    assert sorted(map(tuple, ours.keep.nonzero().tolist())) == kept
    assert 0 < len(kept) < len(ours.heads)


# --- each step against a direct computation ------------------------------------------------------


def test_jm_per_dimension_is_two_minus_twice_the_bhattacharyya_coefficient():
    """JM = 2 (1 - BC), BC = the integral of sqrt(p q): here by quadrature, value by value."""
    mu1 = np.array([0.0, 0.3, 1.0, -2.0], dtype=np.float32)
    var1 = np.array([1.0, 0.5, 2.0, 0.3], dtype=np.float32)
    mu2 = np.array([0.0, 1.1, -1.0, 2.5], dtype=np.float32)
    var2 = np.array([1.0, 1.5, 0.7, 0.3], dtype=np.float32)
    grid = np.linspace(-30, 30, 200_001)

    def normal(mu, var):
        return np.exp(-((grid - mu) ** 2) / (2 * var)) / np.sqrt(2 * np.pi * var)

    coefficient = [
        np.trapezoid(np.sqrt(normal(a, s) * normal(b, t)), grid)
        for a, s, b, t in zip(mu1, var1, mu2, var2, strict=True)
    ]
    jm = jm_distance(mu1, var1, mu2, var2)
    assert jm.dtype == np.float32 and jm[0] == 0.0
    np.testing.assert_allclose(jm, 2 * (1 - np.array(coefficient)), atol=1e-6)
    # a variance under the floor counts as 1e-6, as theirs: two near-constant values apart -> 2
    assert jm_distance(np.float32([0]), np.float32([0]), np.float32([1]), np.float32([1e-9]))[
        0
    ] == pytest.approx(2 * (1 - math.exp(-(0.25 / 2e-6))), abs=1e-6)


def test_welford_merge_is_the_mean_and_sum_of_squares_of_everything_seen():
    rng = np.random.default_rng(0)
    chunks = [rng.normal(size=(k, 3, 5)).astype(np.float32) for k in (4, 1, 7)]
    mean, m2, n = np.zeros((3, 5), np.float32), np.zeros((3, 5), np.float32), 0
    for chunk in chunks:
        mean, m2, n = welford_merge(mean, m2, n, chunk)
    everything = np.concatenate(chunks).astype(np.float64)
    assert n == 12 and mean.dtype == np.float32
    np.testing.assert_allclose(mean, everything.mean(0), atol=1e-6)
    np.testing.assert_allclose(m2 / (n - 1), everything.var(0, ddof=1), rtol=1e-5)


def test_pooled_maps_are_bilinear_resizing_of_the_real_tokens():
    def bilinear(image, out):  # align_corners=False: source = (i + 0.5) * in / out - 0.5
        n = image.shape[0]
        src = np.maximum((np.arange(out) + 0.5) * n / out - 0.5, 0)
        i0 = np.floor(src).astype(int)
        i1, w = np.minimum(i0 + 1, n - 1), src - np.floor(src)
        rows = image[i0] * (1 - w)[:, None] + image[i1] * w[:, None]
        return rows[:, i0] * (1 - w)[None] + rows[:, i1] * w[None]

    weights = torch.rand(2, 3, 7, 7, dtype=torch.float64).softmax(-1)
    pooled = pooled_maps(weights, None, pool_size=12)
    assert pooled.shape == (2, 3, 144)
    np.testing.assert_allclose(pooled[1, 2].numpy(), bilinear(weights[1, 2].numpy(), 12).ravel())
    real = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    padded = pooled_maps(weights, real, pool_size=12)
    np.testing.assert_allclose(padded[0].numpy(), pooled[0].numpy())
    np.testing.assert_allclose(
        padded[1, 0].numpy(), bilinear(weights[1, 0, :4, :4].numpy(), 12).ravel()
    )


def test_statistics_and_profiles_from_the_maps():
    _, model, x, y, _ = image_problem(n=40)
    stats = attention_statistics(model, x, y, pool_size=8, loader_batch_size=16)
    with torch.no_grad():
        from hydra_core.models.adapter import attention_weights

        weights, _ = attention_weights(model, x)
    signatures = torch.cat([pooled_maps(w, None, 8) for w in weights], 1).double().numpy()
    classes = np.unique(y.numpy())
    assert stats.classes.tolist() == classes.tolist() and stats.mean.shape == (5, 16, 64)
    for i, c in enumerate(classes):
        mine = signatures[y.numpy() == c]
        assert stats.counts[i] == len(mine)
        np.testing.assert_allclose(stats.mean[i], mine.mean(0), atol=1e-6)
        np.testing.assert_allclose(stats.var[i], mine.var(0, ddof=1), rtol=1e-4, atol=1e-9)
    profiles = jm_profiles(stats)
    assert profiles.shape == (16, 64 * 10)  # 16 heads, D = 64 values x 10 class pairs
    var = stats.var
    pair = list(combinations(range(5), 2)).index((1, 3))
    np.testing.assert_array_equal(
        profiles[:, pair * 64 : (pair + 1) * 64],
        jm_distance(stats.mean[1], var[1], stats.mean[3], var[3]),
    )
    with pytest.raises(InputError, match="one class"):
        jm_profiles(attention_statistics(model, x, torch.zeros(40, dtype=torch.long)))


def _direct_mss(points, labels, medoids, left_out=None):
    """a = distance to the own medoid, b = mean distance to the other medoids, s = (b - a) /
    max(a, b), averaged over the points at a distance from their medoid (``left_out``: the
    points that do not count; default those with a = 0)."""
    scores = []
    for i, p in enumerate(points):
        a = np.linalg.norm(p - points[medoids[labels[i]]])
        others = [np.linalg.norm(p - points[m]) for j, m in enumerate(medoids) if j != labels[i]]
        if (a != 0) if left_out is None else (i not in left_out):
            b = np.mean(others)  # the mean over the other medoids, not the nearest one
            scores.append((b - a) / max(a, b))
    return np.mean(scores), len(scores)


def test_mss_against_a_direct_computation():
    rng = np.random.default_rng(1)
    points = rng.integers(-20, 20, size=(25, 2)).astype(np.float64)  # exact arithmetic
    medoids = np.array([3, 11, 20])
    labels = np.linalg.norm(points[:, None] - points[medoids][None], axis=-1).argmin(1)
    labels[medoids] = [0, 1, 2]
    expected, counted = _direct_mss(points, labels, medoids)
    assert counted <= 22  # the three medoids (and any point on one) are left out
    assert mean_simplified_silhouette(points, labels, medoids) == pytest.approx(expected)
    assert mean_simplified_silhouette(points[:3], np.arange(3), np.arange(3)) == 1.0
    # As in the authors' code, a is scikit-learn's euclidean_distances (|x|^2 - 2 x.y + |y|^2),
    # whose rounding can leave a medoid ~3e-8 from itself: that medoid then counts, s ~ 1.
    points = rng.normal(size=(25, 2))
    labels = np.linalg.norm(points[:, None] - points[medoids][None], axis=-1).argmin(1)
    labels[medoids] = [0, 1, 2]
    intra = euclidean_distances(points, points[medoids][labels]).diagonal()
    counted_medoids = [m for m in medoids if intra[m] != 0]
    left_out = set(medoids) - set(counted_medoids)
    expected, _ = _direct_mss(points, labels, medoids, left_out=left_out)
    assert mean_simplified_silhouette(points, labels, medoids) == pytest.approx(expected)


def test_mss_knee_is_kneedle_on_the_degree_6_fit():
    ks = np.arange(2, 60)
    values = 1 - np.exp(-ks / 6) + 0.01 * np.sin(ks)
    knee, fitted = mss_knee(ks, values)
    np.testing.assert_allclose(fitted, np.polyval(np.polyfit(ks, values, 6), ks), rtol=1e-9)
    # Kneedle on a concave, increasing, unimodal difference curve: its maximum
    x = (ks - ks.min()) / (ks.max() - ks.min())
    y = (fitted - fitted.min()) / (fitted.max() - fitted.min())
    assert knee == ks[np.argmax(y - x)] and 8 <= knee <= 20
    with pytest.raises(InputError, match="no knee"):
        mss_knee(ks, 0.01 * ks)  # a straight line: no diminishing returns
    with pytest.raises(InputError, match="no knee"):
        mss_knee(ks, np.ones(len(ks)))  # every clustering perfect from k = 2 on


def test_tsne_needs_more_heads_than_its_perplexity():
    with pytest.raises(
        InputError, match="perplexity 10, which needs more than 10 heads; this model has 10"
    ):
        tsne_embedding(np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32))
    assert tsne_embedding(
        np.random.default_rng(0).normal(size=(11, 4)).astype(np.float32)
    ).shape == (11, 2)


def test_importance_reads_the_first_quarter_of_the_batches():
    theirs, model, x, y, _ = text_problem(n=64)
    batches = [
        {"input_ids": x[s : s + 8, 0], "attention_mask": x[s : s + 8, 1], "labels": y[s : s + 8]}
        for s in range(0, 64, 8)
    ]
    expected = Authors(theirs, batches).compute_head_importance()  # 2 of 8 batches
    ours = head_mask_importance(model, x, y, loader_batch_size=8)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)
    assert ours.min() == 0.0 and ours.max() == 1.0
    changed = y.clone()
    changed[16:] = (changed[16:] + 1) % 3  # labels past the first two batches are never read
    np.testing.assert_array_equal(
        head_mask_importance(model, x, changed, loader_batch_size=8), ours
    )


def test_representatives_and_the_layer_guard():
    importance = np.array([0.1, 0.9, 0.5, 0.4, 0.8, 0.0])
    labels = np.array([0, 0, 1, 1, 1, 2])
    medoids = np.array([0, 3, 5])
    assert most_important_per_cluster(importance, labels, medoids) == [1, 4, 5]
    heads = [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert keep_one_per_layer([1, 4], heads, importance) == [2]  # layer 1: its best head
    assert keep_one_per_layer([1, 2, 5], heads, importance) == []


def test_official_result_is_reproducible_and_self_consistent():
    _, model, x, y, _ = image_problem(n=96, seed=1)
    calls = []
    first = cahp_select(model, x, y, progress=lambda done, total: calls.append((done, total)))
    again = cahp_select(model, x, y)
    assert torch.equal(first.keep, again.keep) and first.knee_k == again.knee_k
    assert calls[-1][0] == calls[-1][1] and all(d <= t for d, t in calls)
    kept = sorted(map(tuple, first.keep.nonzero().tolist()))
    assert kept == sorted(first.representatives + first.added)
    assert len(set(first.representatives)) == first.knee_k
    assert set(range(4)) == {layer for layer, _ in kept}  # every layer keeps a head
    assert first.curve.columns.tolist() == ["k", "mss", "fitted"] and first.score_name == "mss"
    assert first.curve["k"].tolist() == list(range(2, 16))
    assert first.embedding.shape == (16, 2) and first.distances.shape == (16, 16)
    assert "CAHP official" in first.describe()
    other = cahp_select(model, x, y, seed=7)
    assert other.seed == 7
    with pytest.raises(InputError, match="options of the accuracy-knee variant"):
        cahp_select(model, x, y, k_grid=[1, 2, 3])
    with pytest.raises(InputError, match="options of the accuracy-knee variant"):
        cahp_select(model, x, y, representative="medoid")
    with pytest.raises(InputError, match="not a CAHP variant"):
        cahp_select(model, x, y, variant="paper")
    small = make_tiny_vit(depth=2)  # 8 heads: too few for t-SNE at perplexity 10
    with pytest.raises(InputError, match="accuracy-knee"):
        cahp_select(small, x, y)


@pytest.mark.parametrize("kind", ["mpnet", "distilbert", "openclip"])
def test_official_on_other_families(kind):
    if kind == "openclip":
        from tests.conftest import clip_images, make_tiny_zero_shot

        model, x, y = make_tiny_zero_shot(), clip_images(20, seed=2), torch.arange(20) % 5
    else:
        _, _, x, y, _ = text_problem(n=40, tokens=12, seed=1)
        model = make_tiny_text(kind, depth=3, num_heads=4)
    result = cahp_select(model, x, y)
    kept = sorted(map(tuple, result.keep.nonzero().tolist()))
    assert kept == sorted(result.representatives + result.added)
    assert {layer for layer, _ in kept} == {0, 1, 2} and len(result.heads) == 12
    if kind != "openclip":  # padding columns no sample uses change nothing
        ids, mask = x[:, 0], x[:, 1]
        pad = torch.ones(len(x), 6, dtype=torch.long)
        padded = cahp_select(
            model, pack(torch.cat([ids, pad], 1), torch.cat([mask, 0 * pad], 1)), y
        )
        assert torch.equal(padded.keep, result.keep)
        np.testing.assert_allclose(padded.profiles, result.profiles, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_the_same_heads_as_the_authors_code_on_minilm_sentiment():
    """The text default, 256 search sentences, as ``python -m hydra_core cahp --model
    minilm-sentiment --n-search 256`` reads them: the transcription above and ours keep the same
    heads from the same profiles, bit for bit (about 20 s)."""
    from hydra_core.analysis.inputs import search_inputs
    from hydra_core.cli import build_parser
    from hydra_core.cli.common import load_for_cli
    from hydra_core.models.text import hf_model, unpack

    argv = ["cahp", "--model", "minilm-sentiment", "--n-search", "256", "--device", "cpu"]
    try:
        loaded, benchmark = load_for_cli(build_parser().parse_args(argv))
    except InputError as exc:
        pytest.skip(str(exc))
    inputs = search_inputs(loaded.preprocess, benchmark)
    x, y = inputs.id_x, inputs.id_y
    ours = cahp_select(loaded.model, x, y)  # the model as loaded (sdpa attention)
    hf = hf_model(loaded.model)
    hf.set_attn_implementation("eager")  # as the authors' load_model
    batches = []
    for start in range(0, len(x), 32):
        ids, mask = unpack(x[start : start + 32])
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": y[start : start + 32]})
    kept, knee, profiles, importance = Authors(hf, batches).prune()
    np.testing.assert_array_equal(ours.profiles, profiles)
    np.testing.assert_allclose(ours.importance, importance, rtol=1e-5, atol=1e-6)
    assert ours.knee_k == knee
    assert sorted(map(tuple, ours.keep.nonzero().tolist())) == kept
