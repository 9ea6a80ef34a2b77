"""Per-head representations of ID and OOD data (paper, Appendix B.2 and Figure 4).

Each head's output Z (before W_O) is read at one token (the CLS token by default), giving a d_k-dim
vector per sample and head. Per head we compare the ID and OOD centroids by their Euclidean distance
and by their Mahalanobis distance under the ID covariance of that head, and project chosen heads'
vectors to 2-D (PCA or UMAP) to look at them.

The paper's Mahalanobis distance inverts the plain ID covariance; with fewer samples than d_k, or a
head that always outputs the same vector (an ablated head reads zero), that matrix is singular. We
regularise it (Ledoit-Wolf shrinkage by default, or a ridge of a chosen fraction of the mean
variance, plus a 1e-9 relative floor), so the distance is always defined.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import ExitStack

import numpy as np
import pandas as pd
import torch
from torch import nn

from hydra_core.metrics.covariance import Shrinkage, regularised_covariance
from hydra_core.models.adapter import (
    ablate,
    as_keep_mask,
    family_of,
    head_label,
    head_layout,
    model_and_inputs,
    record_head_outputs,
    run_blocks,
)
from hydra_core.types import Head


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (the CPU for a model without parameters)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def head_cls_features(
    model: nn.Module,
    x: torch.Tensor,
    *,
    layers: Sequence[int] | None = None,
    keep: torch.Tensor | None = None,
    batch_size: int = 256,
    token: int = 0,
) -> torch.Tensor:
    """Each head's output Z (before W_O) at one token position, for every sample.

    Args:
        x: model inputs (N, ...), already preprocessed (images (N, C, H, W); token ids in any
            form :func:`~hydra_core.models.adapter.model_and_inputs` takes); moved to the model's
            device in batches. Padding never changes a text sample's features.
        layers: which layers to read (negative indices count from the end); None means all.
            A model with towers (CLIP's joint layout) is read in the tower that sees ``x``
            (its first: the image tower): None means that tower's layers, and another tower's
            layer (the text tower's heads see the prompts, not the samples) is refused.
        keep: optional head mask (L, H), True = kept; the other heads are ablated while reading, so
            an ablated head reads zero and later layers see the ablated model's stream.
        token: position to read; 0 is the CLS token for models that have one (every text model).

    Returns:
        Float tensor (N, len(layers), H, d_k) on the CPU, H being the most heads any layer has
        (a structurally pruned layer with fewer heads is padded with zeros).
    """
    model, x = model_and_inputs(model, x, names=("x",))
    layout = head_layout(model)
    layers = _resolve_layers(layers, len(layout.input_layers), layout.num_layers)
    if len(x) == 0:
        raise ValueError("x holds no samples; per-head features need at least one input")
    device = model_device(model)
    x = family_of(model).prepare(model, x)  # text: padding columns no sample uses dropped
    with ExitStack() as stack:
        if keep is not None:
            stack.enter_context(ablate(model, keep))  # registered first, so it applies first
        store = stack.enter_context(record_head_outputs(model, sorted(set(layers)), token=token))
        stack.enter_context(torch.no_grad())
        for start in range(0, len(x), batch_size):
            # blocks after the last recorded layer cannot change what is recorded
            run_blocks(model, x[start : start + batch_size].to(device), max(layers))
    out = torch.zeros(len(x), len(layers), layout.max_heads, layout.head_dim)
    for i, layer in enumerate(layers):
        z = torch.cat(store[layer]).float().cpu()  # (N, H_l, d_k)
        out[:, i, : z.shape[1]] = z
    return out


def _resolve_layers(
    layers: Sequence[int] | None, num_layers: int, total: int | None = None
) -> list[int]:
    """``layers`` as indices 0..num_layers - 1 (None: all); ``total`` > ``num_layers``: the
    layers after the first ``num_layers`` are another tower's, refused by name."""
    if layers is None:
        return list(range(num_layers))
    resolved = []
    for layer in layers:
        if total is not None and num_layers <= layer < total:
            raise ValueError(
                f"layer {layer} is in a tower whose heads do not see the samples (the text "
                f"tower's see the prompts); per-head representations exist for layers "
                f"0..{num_layers - 1}"
            )
        if not -num_layers <= layer < num_layers:
            raise ValueError(
                f"layer {layer} does not exist; the model has layers 0..{num_layers - 1}"
            )
        resolved.append(layer % num_layers)
    if not resolved:
        raise ValueError("layers is empty; pass None for all layers or at least one layer index")
    return resolved


def _as_layers(
    feats: torch.Tensor | np.ndarray, layers: Sequence[int] | int | None, name: str
) -> tuple[np.ndarray, list[int]]:
    """Features (N, H, d_k) or (N, L, H, d_k) -> float64 (N, L, H, d_k) and the layer labels."""
    if isinstance(feats, torch.Tensor):
        feats = feats.detach().cpu().double().numpy()
    array = np.asarray(feats, dtype=np.float64)
    if array.ndim == 3:
        array = array[:, None]
    if array.ndim != 4:
        raise ValueError(f"{name} must have shape (N, H, d_k) or (N, L, H, d_k), got {array.shape}")
    if layers is None:
        labels = list(range(array.shape[1]))
    else:
        labels = [layers] if isinstance(layers, int) else list(layers)
    if len(labels) != array.shape[1]:
        raise ValueError(
            f"{name} has {array.shape[1]} layer(s) but layers names {len(labels)}: {labels}"
        )
    return array, labels


class _IdStatistics:
    """ID centroid and the Cholesky factor of the regularised ID covariance of every head."""

    def __init__(self, id_feats: np.ndarray, shrinkage: Shrinkage) -> None:
        _, num_layers, num_heads, dk = id_feats.shape
        self.centroid = id_feats.mean(axis=0)  # (L, H, d_k)
        self.chol = np.empty((num_layers, num_heads, dk, dk))
        for layer in range(num_layers):
            for head in range(num_heads):
                cov = regularised_covariance(id_feats[:, layer, head], shrinkage)
                self.chol[layer, head] = np.linalg.cholesky(cov)

    def distances(self, ood_feats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(Euclidean, Mahalanobis) distances (L, H) between the ID and the OOD centroids."""
        diff = self.centroid - ood_feats.mean(axis=0)  # (L, H, d_k)
        # |L^-1 diff|^2 = diff' S^-1 diff, with S = L L' the regularised ID covariance
        white = np.linalg.solve(self.chol, diff[..., None])[..., 0]
        return np.linalg.norm(diff, axis=-1), np.linalg.norm(white, axis=-1)


def _distance_frame(
    layers: list[int], euclidean: np.ndarray, mahalanobis: np.ndarray
) -> pd.DataFrame:
    rows = [
        {
            "layer": layer,
            "head": head,
            "label": head_label(layer, head),
            "euclidean": euclidean[i, head],
            "mahalanobis": mahalanobis[i, head],
        }
        for i, layer in enumerate(layers)
        for head in range(euclidean.shape[1])
    ]
    return pd.DataFrame(rows, columns=["layer", "head", "label", "euclidean", "mahalanobis"])


def centroid_distances(
    id_feats: torch.Tensor | np.ndarray,
    ood_feats: torch.Tensor | np.ndarray,
    *,
    shrinkage: Shrinkage = "ledoit_wolf",
    layers: Sequence[int] | int | None = None,
) -> pd.DataFrame:
    """Per head, the distance between the ID and the OOD centroid of its features.

    Args:
        id_feats, ood_feats: per-head features (N, H, d_k) of one layer or (N, L, H, d_k), e.g. from
            :func:`head_cls_features`; the two sets may have different N.
        shrinkage: how the ID covariance is regularised (see :func:`regularised_covariance`).
        layers: the layer index of each entry of the layer axis, for the ``layer`` and ``label``
            columns (default 0, 1, ...).

    Returns:
        One row per head: layer, head, label (``L3H7``), euclidean = |c_ID - c_OOD|, mahalanobis =
        sqrt((c_ID - c_OOD)' Sigma^-1 (c_ID - c_OOD)) with Sigma the ID covariance of that head.
    """
    ids, labels = _as_layers(id_feats, layers, "id_feats")
    oods, _ = _as_layers(ood_feats, labels, "ood_feats")
    if ids.shape[1:] != oods.shape[1:]:
        raise ValueError(
            f"ID features {ids.shape[1:]} and OOD features {oods.shape[1:]} differ per sample"
        )
    euclidean, mahalanobis = _IdStatistics(ids, shrinkage).distances(oods)
    return _distance_frame(labels, euclidean, mahalanobis)


def average_distances(table: pd.DataFrame, heads: Sequence[Head | str] | None = None) -> pd.Series:
    """The mean Euclidean and Mahalanobis distance over all heads of ``table``, or over ``heads``
    (given as (layer, head) pairs or labels like ``L3H7``)."""
    if heads is not None:
        wanted = [h if isinstance(h, str) else head_label(*h) for h in heads]
        missing = sorted(set(wanted) - set(table["label"]))
        if missing:
            raise ValueError(f"heads {', '.join(missing)} are not in the distance table")
        if not wanted:
            raise ValueError("heads is empty; pass None to average over every head")
        table = table[table["label"].isin(wanted)]
    return table[["euclidean", "mahalanobis"]].mean()


def distance_table_dense_vs_circuit(
    model: nn.Module,
    keep: torch.Tensor,
    id_x: torch.Tensor,
    ood_sets: Mapping[str, torch.Tensor],
    *,
    layer: int = -1,
    shrinkage: Shrinkage = "ledoit_wolf",
    batch_size: int = 256,
    average_over: str = "kept",
) -> pd.DataFrame:
    """The paper's Table 5: ID/OOD centroid distances of a circuit against the dense model.

    Per OOD set, the mean Euclidean and Mahalanobis distance at ``layer`` (default: the last) for
    the circuit (``model`` with the heads outside ``keep`` ablated; its ID covariance is its own)
    and for the dense model, and circuit minus dense. The last row, "Average", is the mean over
    the OOD sets. ``attrs["heads"]`` lists the heads the circuit keeps there.

    Two conventions for the mean over heads (``average_over``):

    - ``"kept"`` (ours): both columns average over the heads the circuit keeps in that layer. An
      ablated head reads zero for ID and OOD alike, so counting it would lower the circuit's mean
      for no reason other than the pruning itself; the columns then differ only through heads the
      circuit removes in layers before ``layer``.
    - ``"all"`` (the paper's): both average over all H heads of the layer; the circuit's removed
      heads count with distance 0 (their output is zero), the dense model's with their own.
    """
    if average_over not in ("kept", "all"):
        raise ValueError(f"average_over must be 'kept' or 'all', got {average_over!r}")
    if not ood_sets:
        raise ValueError("ood_sets is empty; pass at least one OOD set")
    layout = head_layout(model)
    keep = as_keep_mask(layout, keep)
    (layer,) = _resolve_layers([layer], layout.num_layers)
    heads = [(layer, h) for h in keep[layer].nonzero().flatten().tolist()]
    if not heads:
        raise ValueError(f"the circuit keeps no head in layer {layer}; choose another layer")
    columns = {}
    for variant, mask in (("circuit", keep), ("dense", None)):
        features = dict(layers=[layer], keep=mask, batch_size=batch_size)
        id_feats = head_cls_features(model, id_x, **features).double().numpy()  # (N, 1, H, d_k)
        stats = _IdStatistics(id_feats, shrinkage)
        for name, ood_x in ood_sets.items():
            ood = head_cls_features(model, ood_x, **features).double().numpy()  # (N, 1, H, d_k)
            table = _distance_frame([layer], *stats.distances(ood))
            if average_over == "kept":
                mean = average_distances(table, heads)
            elif variant == "circuit":  # removed heads: distance 0, counted among all H
                mean = average_distances(table, heads) * len(heads) / layout.num_heads[layer]
            else:
                mean = average_distances(table)
            columns.setdefault(name, {})[f"{variant}_euclidean"] = mean["euclidean"]
            columns[name][f"{variant}_mahalanobis"] = mean["mahalanobis"]
    frame = pd.DataFrame.from_dict(columns, orient="index")
    for metric in ("euclidean", "mahalanobis"):
        frame[f"delta_{metric}"] = frame[f"circuit_{metric}"] - frame[f"dense_{metric}"]
    frame.loc["Average"] = frame.mean()
    frame = frame.rename_axis("dataset").reset_index()
    frame.attrs["heads"] = [head_label(*h) for h in heads]
    return frame


def project_features(
    id_feats: torch.Tensor | np.ndarray,
    ood_feats: Mapping[str, torch.Tensor | np.ndarray] | torch.Tensor | np.ndarray,
    *,
    heads: Sequence[Head],
    method: str = "pca",
    n_components: int = 2,
    seed: int = 0,
    layers: Sequence[int] | None = None,
) -> pd.DataFrame:
    """A 2-D (or 3-D) picture of the chosen heads' features, ID and OOD together (paper, Figure 4).

    Each sample is described by the concatenation of the chosen heads' vectors (len(heads) * d_k
    values); PCA or UMAP is fitted on all ID and OOD samples together.

    Args:
        id_feats, ood_feats: features (N, L, H, d_k) as from :func:`head_cls_features`; OOD either
            one tensor (named "OOD") or a dict name -> tensor.
        heads: (layer, head) pairs; ``layer`` refers to ``layers``, the layer index of each entry of
            the layer axis (default 0, 1, ...: features of all layers).
        method: ``"pca"`` (sklearn) or ``"umap"`` (umap-learn, ``random_state=seed``).

    Returns:
        Columns x, y (z when n_components is 3), set (``"ID"`` or the OOD set's name), group
        (``"ID"`` or ``"OOD"``), one row per sample.
    """
    if n_components not in (2, 3):
        raise ValueError(f"n_components must be 2 or 3, got {n_components}")
    if not heads:
        raise ValueError("heads is empty; choose at least one (layer, head)")
    if not isinstance(ood_feats, Mapping):
        ood_feats = {"OOD": ood_feats}
    if "ID" in ood_feats:
        raise ValueError("an OOD set may not be named 'ID', which names the in-distribution set")
    sets = {"ID": id_feats, **ood_feats}
    blocks, names = [], []
    for name, feats in sets.items():
        array, labels = _as_layers(feats, layers, f"features of {name!r}")
        position = {layer: i for i, layer in enumerate(labels)}
        missing = [
            head_label(layer, head)
            for layer, head in heads
            if layer not in position or not 0 <= head < array.shape[2]
        ]
        if missing:
            raise ValueError(
                f"heads {', '.join(missing)} are not in the features of {name!r} "
                f"(layers {labels}, {array.shape[2]} heads)"
            )
        chosen = [array[:, position[layer], head] for layer, head in heads]  # each (N, d_k)
        blocks.append(np.concatenate(chosen, axis=1))  # (N, len(heads) * d_k)
        names += [name] * len(array)
    data = np.concatenate(blocks)
    if method == "pca":
        from sklearn.decomposition import PCA

        embedding = PCA(n_components=n_components, random_state=seed).fit_transform(data)
    elif method == "umap":
        import umap  # slow first import (numba), so only when asked for

        reducer = umap.UMAP(
            n_components=n_components, random_state=seed, n_neighbors=max(2, min(15, len(data) - 1))
        )
        embedding = reducer.fit_transform(data)
    else:
        raise ValueError(f"method must be 'pca' or 'umap', got {method!r}")
    frame = pd.DataFrame(np.asarray(embedding), columns=["x", "y", "z"][:n_components])
    frame["set"] = names
    frame["group"] = ["ID" if name == "ID" else "OOD" for name in names]
    return frame


def most_and_least_important(ranking: Sequence[Head], k: int = 6) -> tuple[list[Head], list[Head]]:
    """(most, least): the last ``k`` and the first ``k`` heads of a ranking that lists the least
    important head first (greedy's removal order), as in the paper's Figure 4 (the last and the
    first heads pruned during CircOOD extraction). Both keep the ranking's order."""
    if not 1 <= k <= len(ranking):
        raise ValueError(f"k must be between 1 and the ranking's length {len(ranking)}, got {k}")
    ranking = [tuple(h) for h in ranking]
    return ranking[-k:], ranking[:k]
