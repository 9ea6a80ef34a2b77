"""First-order Taylor importance of attention heads and layer-by-layer Taylor pruning (paper D.1.1,
after Molchanov et al., 2019).

For layer l with embedding width D and head width d_h, head h owns rows h*d_h .. (h+1)*d_h - 1
of each of W_q, W_k, W_v (the model's family says where they are: the q, k and v thirds of timm's
fused ``qkv`` weight, Hugging Face's separate query, key and value weights). With G the gradient
of the loss L (mean cross-entropy over all given samples) with respect to a weight,

    q_h = 1 / (d_h D) * sum over the head's rows r and all columns c of |W_q[r, c] * G_q[r, c]|,

likewise k_h and v_h, and the head's score is s_h = (q_h + k_h + v_h) / 3. Gradients are summed over
batches before the absolute value is taken, so the score is that of the full-data loss.

With a :class:`DiskCache`, :func:`taylor_scores` are stored under a key of the model weights, the
samples and the mask, so the app and the ``importance`` command compute them once between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from hydra_core.analysis.representations import model_device
from hydra_core.cache import DiskCache, cache_key, model_fingerprint
from hydra_core.models.adapter import (
    ablate,
    as_keep_mask,
    family_of,
    head_layout,
    model_and_inputs,
)

#: Changes whenever the numbers :func:`taylor_scores` produces change; part of its cache key.
TAYLOR_VERSION = "taylor-1"
#: Cache kind (folder of the :class:`DiskCache`) of the stored scores.
TAYLOR_CACHE_KIND = "taylor"


def taylor_scores(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    keep: torch.Tensor | None = None,
    batch_size: int = 256,
    cache: DiskCache | None = None,
) -> torch.Tensor:
    """The Taylor score of every head, shape (L, H) (CPU, float32).

    Args:
        x, y: model inputs (N, ...) (images (N, C, H, W); token ids in any form
            :func:`~hydra_core.models.adapter.model_and_inputs` takes) and labels (N,); the loss
            is the mean cross-entropy over all N.
        keep: optional head mask (L, H), True = kept; the other heads are ablated and score NaN.
        cache: return the scores stored for the same model weights, samples and mask, or compute
            and store them (``batch_size`` changes them only by float rounding: not in the key).

    The model is used in the mode it is in (eval for deterministic scores) and left as it was:
    gradients are taken with ``torch.autograd.grad``, so no ``.grad`` is stored on any parameter,
    and every ``requires_grad`` flag is restored.
    """
    model, x = model_and_inputs(model, x, names=("x",))
    layers = range(head_layout(model).num_layers)
    if cache is None:
        return _scores(model, x, y, keep, batch_size, layers)
    key = _cache_key(model, x, y, keep)
    return cache.get_or_compute(
        TAYLOR_CACHE_KIND, key, lambda: _scores(model, x, y, keep, batch_size, layers)
    )


def _cache_key(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, keep: torch.Tensor | None
) -> str:
    """A key of the weights, the samples and the mask. The mask enters only when given, so that
    unmasked scores keep the key the app stored them under before (version, weights, x, y)."""
    parts = (TAYLOR_VERSION, model_fingerprint(model), x, y)
    if keep is None:
        return cache_key(*parts)
    return cache_key(*parts, keep=as_keep_mask(head_layout(model), keep))


def _scores(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    keep: torch.Tensor | None,
    batch_size: int,
    layers: Sequence[int],
) -> torch.Tensor:
    """Taylor scores (L, H) of the heads of ``layers``; every other entry is NaN."""
    layout = head_layout(model)
    mask = layout.all_kept() if keep is None else as_keep_mask(layout, keep)
    if len(x) != len(y):
        raise ValueError(f"{len(x)} inputs but {len(y)} labels")
    if len(x) == 0:
        raise ValueError("no samples: Taylor scores need at least one labelled input")
    layers = [layer for layer in layers if layout.num_heads[layer] > 0]  # an empty layer has no W_q
    grads = _qkv_gradients(model, x, y, keep, batch_size, layers) if layers else []
    family = family_of(model)
    blocks = family.blocks(model)
    scores = torch.full(layout.shape, float("nan"))
    for layer, layer_grads in zip(layers, grads, strict=True):
        weights = family.qkv_weights(blocks[layer])
        products = [(w.detach() * g).abs() for w, g in zip(weights, layer_grads, strict=True)]
        n = layout.num_heads[layer]
        saliency = torch.cat(products).float().cpu()  # (3 * H * d_h, D): q, k, v rows
        per_part = saliency.reshape(3, n, layout.head_dim, -1).mean(dim=(2, 3))  # (3, H): q, k, v
        scores[layer, :n] = per_part.mean(dim=0)
    return scores.masked_fill(~mask, float("nan"))


def _qkv_gradients(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    keep: torch.Tensor | None,
    batch_size: int,
    layers: Sequence[int],
) -> list[list[torch.Tensor]]:
    """dL/dW of the Q/K/V weights (``family.qkv_weights``) of each of ``layers``, L the mean
    cross-entropy over all of x: per layer, one gradient per weight."""
    family = family_of(model)
    blocks = family.blocks(model)
    per_layer = [family.qkv_weights(blocks[layer]) for layer in layers]
    weights = [w for layer_weights in per_layer for w in layer_weights]
    grads = [torch.zeros_like(w) for w in weights]
    flags = [(p, p.requires_grad) for p in model.parameters()]
    device = model_device(model)
    try:
        # Only the scored weights need gradients: backward then stops at the first scored layer.
        for p, _ in flags:
            p.requires_grad_(False)
        for w in weights:
            w.requires_grad_(True)
        with ExitStack() as stack:
            if keep is not None:
                stack.enter_context(ablate(model, keep))
            stack.enter_context(torch.enable_grad())
            for start in range(0, len(x), batch_size):
                logits = model(x[start : start + batch_size].to(device))  # token ids stay ints
                labels = y[start : start + batch_size].to(device)
                # This batch's share of the full-data mean loss: the sum of the shares is L.
                loss = F.cross_entropy(logits, labels, reduction="sum") / len(x)
                for grad, part in zip(grads, torch.autograd.grad(loss, weights), strict=True):
                    grad += part
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
    sizes = [len(layer_weights) for layer_weights in per_layer]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [grads[start : start + size] for start, size in zip(starts, sizes, strict=True)]


@dataclass
class TaylorResult:
    """The outcome of :func:`taylor_prune`.

    Args:
        keep: the final head mask (L, H), True = kept.
        scores: (L, H); row l holds layer l's scores when it was pruned, i.e. with the heads of
            layers before l already removed (NaN for heads that do not exist).
        layer_order: the layers in the order they were pruned (first to last).
        pruned: the removed heads as (layer, head), in the order they were removed (within a layer,
            lowest score first).
    """

    keep: torch.Tensor
    scores: torch.Tensor
    layer_order: list[int] = field(default_factory=list)
    pruned: list[tuple[int, int]] = field(default_factory=list)


def taylor_prune(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    heads_to_prune_per_layer: int | Sequence[int],
    batch_size: int = 256,
) -> TaylorResult:
    """Prune the r_l lowest-scoring heads of each layer, from the first layer to the last,
    recomputing the gradients after each layer with the heads pruned so far removed (paper D.1.1).

    The paper rebuilds the attention structurally after each layer; we ablate instead (zero the
    removed heads at the input of W_O). That gives the same gradients for the remaining heads: an
    ablated head contributes exactly zero to the forward pass, so every other activation, and hence
    every other weight's gradient, is what it would be without the head. Only the scored layer's
    gradients are computed at each step.

    Args:
        x, y: model inputs and labels, as for :func:`taylor_scores`.
        heads_to_prune_per_layer: r_l, one number for every layer or one per layer.
    """
    model, x = model_and_inputs(model, x, names=("x",))
    layout = head_layout(model)
    if isinstance(heads_to_prune_per_layer, int):
        budget = [heads_to_prune_per_layer] * layout.num_layers
    else:
        budget = [int(r) for r in heads_to_prune_per_layer]
    if len(budget) != layout.num_layers:
        raise ValueError(
            f"heads_to_prune_per_layer has {len(budget)} entries; "
            f"the model has {layout.num_layers} layers"
        )
    for layer, (r, n) in enumerate(zip(budget, layout.num_heads, strict=True)):
        if not 0 <= r <= n:
            raise ValueError(f"cannot prune {r} heads of layer {layer}, which has {n}")
    keep = layout.all_kept()
    scores = torch.full(layout.shape, float("nan"))
    result = TaylorResult(keep=keep, scores=scores)
    for layer, r in enumerate(budget):
        row = _scores(model, x, y, keep, batch_size, [layer])[layer]
        scores[layer] = row
        result.layer_order.append(layer)
        if r == 0:
            continue
        order = sorted(range(layout.num_heads[layer]), key=lambda h: (row[h].item(), h))
        for head in order[:r]:
            keep[layer, head] = False
            result.pruned.append((layer, head))
    return result


def taylor_global_ranking(scores: torch.Tensor) -> list[tuple[int, int]]:
    """Every scored head as (layer, head), least important (lowest score) first, for global
    pruning across layers; NaN entries (removed or absent heads) are left out, and ties go to the
    earlier head."""
    heads = [(layer, head) for layer, head in torch.isfinite(scores).nonzero().tolist()]
    return sorted(heads, key=lambda lh: (scores[lh].item(), lh))
