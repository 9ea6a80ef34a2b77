"""Attribution patching of head ablation: every head's first-order effect from one forward and a
few backward passes per batch (Nanda 2023; AtP, Kramár et al. 2024, arXiv 2403.00745).

Node: a head's output at the input of W_O (its d_k slice, where :func:`~hydra_core.models.adapter.
ablate` zeroes it). Each item b gets its own scale s[b, l, h] on that slice (1 for a kept head, 0
for a head already removed), so one backward pass gives, for every item at once,

    d score_b / d s[b, l, h] = sum over positions of z_{b,l,h} . d score_b / d z_{b,l,h},

and the AtP estimate of zeroing the head is ``-(that)``: minus the activation slice dotted with the
gradient of the score with respect to it. The scores differentiated are the item's **logits**,
one backward pass each: every class's when the model has at most :data:`ALL_CLASSES`; otherwise
the :data:`TRACKED` classes that decide the item's scores (its two top classes and its label, or
its third class where the label is among the two; an OOD item's three top classes) and the log
normaliser (log-sum-exp of all logits), 4 backward passes. That gives an estimated logit vector
for every (head, item) and hence every score the search uses, recomputed exactly as the search
computes it from logits (:class:`~hydra_core.analysis._maps.Scorer`):

- the correct class's log-probability and the MSP of each item (:func:`per_item`),
- accuracy (argmax of the estimated logits), MSP AUROC and their mean: the estimated objective
  after each candidate ablation (:func:`estimated_maps`).

With more classes than :data:`ALL_CLASSES`, the untracked classes' logits are shifted together so
that the log normaliser takes its estimated value: the tracked classes' estimated probabilities
(the MSP, the label's log-probability) are then first-order exact; only an untracked class
overtaking a tracked one in the argmax is missed.

Why not AtP*'s attention correction: AtP* recomputes the attention softmax for *query and key*
nodes, whose first-order estimate fails where the softmax saturates (a large change of a score
gives almost no gradient). Here every node is a head's *output* after the softmax and after the
values; zeroing it is linear in the node, and the only nonlinearities between the node and the
logits are the later layers' (which the gradient linearises as it would for any node). The
saturation failure AtP* corrects does not arise for these nodes; the estimate's remaining error
is the ordinary second-order one, measured against exact ablation in the tests and the bench.

Heads of a tower that does not read the items (CLIP's text tower in the joint layout: its heads
see the prompts, shared by every item) get no per-item estimate: their entries are NaN, and the
guided search always evaluates them exactly.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass

import torch
from torch import nn

from hydra_core.analysis._maps import Scorer, objective_of
from hydra_core.cache import DiskCache, cache_key, model_fingerprint
from hydra_core.models.adapter import as_keep_mask, family_of, head_layout, model_and_inputs
from hydra_core.types import Head

#: Changes whenever the numbers the estimates give change; part of their cache key.
ATTRIBUTION_VERSION = "attribution-1"
#: Cache kind (folder of the :class:`DiskCache`) of :func:`attribution_importance`.
ATTRIBUTION_CACHE_KIND = "attribution"
#: at most this many classes: every class's logit is differentiated (one backward pass each)
ALL_CLASSES = 4
#: more classes: this many tracked per item, plus the log normaliser
TRACKED = 3
#: candidates scored per call of the scorer (bounds the memory of the estimated logits)
_CANDIDATES_PER_CHUNK = 8


@dataclass
class Attribution:
    """First-order estimates of ablating each head alone, on top of the heads already removed.

    Args:
        logits: (S, C) the current logits (float64, CPU), items in the order given.
        classes: (S, T) the tracked classes of each item (int64).
        delta: (L, H, S, T) the estimated change of each tracked logit when the head is zeroed
            (float64, CPU; NaN for heads removed already, absent, or without an estimate).
        delta_lse: (L, H, S) the estimated change of the log normaliser, or None when every
            class is tracked.
    """

    logits: torch.Tensor
    classes: torch.Tensor
    delta: torch.Tensor
    delta_lse: torch.Tensor | None = None

    @property
    def estimated(self) -> torch.Tensor:
        """(L, H) bool: the heads with an estimate."""
        return ~torch.isnan(self.delta).any(-1).any(-1)

    def logits_after(self, heads: list[Head]) -> torch.Tensor:
        """(c, S, C) the estimated logits with each of ``heads`` zeroed on its own."""
        out = self.logits[None].repeat(len(heads), 1, 1)
        if not heads:
            return out
        layers = torch.tensor([h[0] for h in heads])
        index = torch.tensor([h[1] for h in heads])
        delta = self.delta[layers, index]  # (c, S, T)
        classes = self.classes[None].expand(len(heads), -1, -1)
        tracked = out.gather(-1, classes) + delta
        out = out.scatter(-1, classes, tracked)
        if self.delta_lse is None:
            return out
        # the untracked classes shifted together so that the normaliser is the estimated one
        untracked = torch.ones_like(self.logits, dtype=torch.bool).scatter(-1, self.classes, False)
        rest = self.logits.masked_fill(~untracked, -math.inf).logsumexp(-1)  # (S,)
        target = self.logits.logsumexp(-1) + self.delta_lse[layers, index]  # (c, S)
        gap = (tracked.logsumexp(-1) - target).clamp(max=-1e-12)  # tracked share below target
        shift = (target + torch.log(-torch.expm1(gap)) - rest).clamp(min=-1e4)  # (c, S)
        return torch.where(untracked[None], out + shift[..., None], out)


def head_attribution(
    model: nn.Module,
    inputs: torch.Tensor,
    *,
    labels: torch.Tensor | None = None,
    keep: torch.Tensor | None = None,
    batch_size: int = 64,
) -> Attribution:
    """AtP estimates of every kept head's ablation for every item of ``inputs``.

    Args:
        model: a supported model (any family) in eval mode; left bit-identical, no gradient
            stored on any parameter, every ``requires_grad`` flag restored.
        inputs: (S, ...) model inputs (images; token ids as
            :func:`~hydra_core.models.adapter.model_and_inputs` takes them).
        labels: (n,) the labels of the first n items (ID items): tracked besides the top classes.
        keep: (L, H) head mask, True = kept: the removed heads are zeroed first (estimates are
            then taken at that point, as the guided search needs after each removal).
        batch_size: items per forward and backward.
    """
    model, inputs = model_and_inputs(model, inputs, names=("inputs",))
    family = family_of(model)
    layout = family.layout(model)
    keep = layout.all_kept() if keep is None else as_keep_mask(layout, keep)
    param = next(model.parameters())
    device = param.device
    dtype = param.dtype if param.is_floating_point() else torch.float32
    with torch.inference_mode(False):
        inputs = inputs.clone()  # an inference tensor cannot enter autograd
        flags = [(p, p.requires_grad) for p in model.parameters()]
        try:
            for p, _ in flags:
                p.requires_grad_(False)
            parts = [
                _batch(
                    model,
                    family,
                    layout,
                    keep,
                    inputs[start : start + batch_size].to(device),
                    None if labels is None else labels[start : start + batch_size],
                    dtype,
                )
                for start in range(0, len(inputs), batch_size)
            ]
        finally:
            for p, flag in flags:
                p.requires_grad_(flag)
    logits = torch.cat([p[0] for p in parts])
    classes = torch.cat([p[1] for p in parts])
    delta = torch.cat([p[2] for p in parts], dim=2)
    lse = None if parts[0][3] is None else torch.cat([p[3] for p in parts], dim=2)
    return Attribution(logits=logits, classes=classes, delta=delta, delta_lse=lse)


def _batch(model, family, layout, keep, x, labels, dtype):
    """(logits (B, C), classes (B, T), delta (L, H, B, T), delta_lse (L, H, B) or None) of one
    batch."""
    b = len(x)
    input_layers = set(layout.input_layers)
    scales = keep.to(x.device, dtype)[None].repeat(b, 1, 1).requires_grad_(True)  # (B, L, H)
    projections = [family.output_projection(block) for block in family.blocks(model)]
    layers = [layer for layer, n in enumerate(layout.num_heads) if n > 0 and layer in input_layers]

    def scaler(layer: int):
        n = layout.num_heads[layer]

        def hook(module: nn.Module, args: tuple[torch.Tensor, ...]):
            z = args[0]
            channels = scales[:, layer, :n].repeat_interleave(layout.head_dim, dim=-1)
            shape = (z.shape[0],) + (1,) * (z.ndim - 2) + (z.shape[-1],)
            return (z * channels.reshape(shape).to(z.dtype),) + tuple(args[1:])

        return hook

    handles = []
    with ExitStack() as stack:
        stack.enter_context(torch.enable_grad())
        stack.enter_context(family.projection_called(model, layers))
        try:
            for layer in layers:
                handles.append(
                    projections[layer].register_forward_pre_hook(scaler(layer), prepend=True)
                )
            logits = model(x)  # (B, C)
            classes = _tracked(logits.detach(), labels)
            outputs = [
                logits.gather(1, classes[:, t : t + 1]).sum() for t in range(classes.shape[1])
            ]
            if logits.shape[1] > ALL_CLASSES:
                outputs.append(logits.float().logsumexp(-1).sum())
            grads = []
            for t, output in enumerate(outputs):
                (grad,) = torch.autograd.grad(output, scales, retain_graph=t + 1 < len(outputs))
                grads.append(grad.detach().double().cpu())  # (B, L, H)
        finally:
            for handle in handles:
                handle.remove()
    delta = -torch.stack(grads, dim=-1).permute(1, 2, 0, 3)  # (L, H, B, T [+ 1])
    missing = ~keep.clone()
    for layer in range(layout.num_layers):
        if layer not in input_layers:
            missing[layer] = True
    delta[missing] = math.nan
    lse = None
    if len(outputs) > classes.shape[1]:
        delta, lse = delta[..., :-1], delta[..., -1]
    return logits.detach().double().cpu(), classes.cpu(), delta, lse


def _tracked(logits: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
    """(B, T) distinct classes to differentiate per item: every class when there are at most
    :data:`ALL_CLASSES`, else the two top classes of the current logits and the label (ID items)
    or the third top class (where the label is among the two, and for OOD items)."""
    b, c = logits.shape
    if c <= ALL_CLASSES:
        return torch.arange(c, device=logits.device)[None].repeat(b, 1)
    top = logits.topk(TRACKED, dim=-1).indices  # (B, 3)
    if labels is not None and len(labels):
        n = len(labels)
        label = labels.to(logits.device).long()
        outside = (top[:n, :2] != label[:, None]).all(-1)
        top[:n, 2] = torch.where(outside, label, top[:n, 2])
    return top


def per_item(attribution: Attribution, labels: torch.Tensor, n_id: int) -> dict[str, torch.Tensor]:
    """Per-item estimates, (L, H, items) float64 each: ``log_prob`` the change of the correct
    class's log-probability (ID items), ``msp`` the change of the maximum softmax probability
    (every item), both from the estimated logits."""
    num_layers, num_heads = attribution.delta.shape[:2]
    base = attribution.logits
    labels = labels.cpu().long()
    base_lp = base[:n_id].log_softmax(-1).gather(1, labels[:, None])[:, 0]
    base_msp = base.softmax(-1).amax(-1)
    log_prob = torch.full((num_layers, num_heads, n_id), math.nan, dtype=torch.float64)
    msp = torch.full((num_layers, num_heads, len(base)), math.nan, dtype=torch.float64)
    heads = [tuple(h) for h in attribution.estimated.nonzero().tolist()]
    for start in range(0, len(heads), _CANDIDATES_PER_CHUNK):
        chunk = heads[start : start + _CANDIDATES_PER_CHUNK]
        after = attribution.logits_after(chunk)
        index = labels[None, :, None].expand(len(chunk), -1, 1)
        lp = after[:, :n_id].log_softmax(-1).gather(2, index)
        for i, (layer, head) in enumerate(chunk):
            log_prob[layer, head] = lp[i, :, 0] - base_lp
            msp[layer, head] = after[i].softmax(-1).amax(-1) - base_msp
    return {"log_prob": log_prob, "msp": msp}


def estimated_maps(
    attribution: Attribution, labels: torch.Tensor, n_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(accuracy, AUROC), (L, H) float64 each: the search's scores recomputed on the estimated
    logits of each head's ablation (NaN where a head has no estimate)."""
    shape = tuple(attribution.delta.shape[:2])
    scorer = Scorer(labels, n_id)
    accuracy = torch.full(shape, math.nan, dtype=torch.float64)
    auroc = torch.full(shape, math.nan, dtype=torch.float64)
    heads = [tuple(h) for h in attribution.estimated.nonzero().tolist()]
    for start in range(0, len(heads), _CANDIDATES_PER_CHUNK):
        chunk = heads[start : start + _CANDIDATES_PER_CHUNK]
        acc, roc = scorer(attribution.logits_after(chunk))
        for i, (layer, head) in enumerate(chunk):
            accuracy[layer, head], auroc[layer, head] = acc[i], roc[i]
    return accuracy, auroc


def estimated_objective(
    attribution: Attribution, labels: torch.Tensor, n_id: int, objective: str
) -> torch.Tensor:
    """(L, H) the estimated objective after each head's ablation (``acc``, ``ood``, ``avg``)."""
    return objective_of(objective, *estimated_maps(attribution, labels, n_id))


def top_candidates(estimates: torch.Tensor, keep: torch.Tensor, k: int) -> list[Head]:
    """The ``k`` kept heads with the highest estimated objective (ties: lowest (layer, head)),
    plus every kept head without an estimate (NaN), which is always evaluated exactly."""
    kept = [tuple(h) for h in keep.nonzero().tolist()]
    scored = [h for h in kept if not math.isnan(float(estimates[h]))]
    unscored = [h for h in kept if math.isnan(float(estimates[h]))]
    scored.sort(key=lambda h: (-float(estimates[h]), h))
    return sorted(scored[:k] + unscored)


def attribution_importance(
    model: nn.Module,
    id_x: torch.Tensor,
    id_y: torch.Tensor,
    ood_x: torch.Tensor,
    *,
    batch_size: int = 64,
    cache: DiskCache | None = None,
) -> dict[str, torch.Tensor | float]:
    """Estimated single-head importance, shaped as
    :func:`~hydra_core.analysis.greedy.single_head_importance`'s result: ``delta_accuracy``,
    ``delta_auroc``, ``delta_avg`` (L, H) float64 (estimated score minus the dense model's, NaN
    where no estimate), ``base_accuracy``, ``base_auroc``. With a ``cache``, stored under a key
    of the weights and the items (kind :data:`ATTRIBUTION_CACHE_KIND`)."""
    model, id_x, ood_x = model_and_inputs(model, id_x, ood_x, names=("id_x", "ood_x"))
    if cache is None:
        return _importance(model, id_x, id_y, ood_x, batch_size)
    key = cache_key(ATTRIBUTION_VERSION, model_fingerprint(model), id_x, id_y.long(), ood_x)
    return cache.get_or_compute(
        ATTRIBUTION_CACHE_KIND, key, lambda: _importance(model, id_x, id_y, ood_x, batch_size)
    )


def _importance(model, id_x, id_y, ood_x, batch_size: int) -> dict[str, torch.Tensor | float]:
    inputs = torch.cat([id_x, ood_x])
    found = head_attribution(model, inputs, labels=id_y, batch_size=batch_size)
    scorer = Scorer(id_y, len(id_x))
    base_acc, base_roc = (float(v[0]) for v in scorer(found.logits[None]))
    accuracy, auroc = estimated_maps(found, id_y, len(id_x))
    layout = head_layout(model)
    absent = ~layout.all_kept()
    accuracy[absent], auroc[absent] = math.nan, math.nan
    return {
        "delta_accuracy": accuracy - base_acc,
        "delta_auroc": auroc - base_roc,
        "delta_avg": (accuracy + auroc) / 2 - (base_acc + base_roc) / 2,
        "base_accuracy": base_acc,
        "base_auroc": base_roc,
    }


def _rows(attribution: Attribution, rows: torch.Tensor) -> Attribution:
    """The estimates of some items only (rows of the inputs, in the order given)."""
    return Attribution(
        logits=attribution.logits[rows],
        classes=attribution.classes[rows],
        delta=attribution.delta[:, :, rows],
        delta_lse=None if attribution.delta_lse is None else attribution.delta_lse[:, :, rows],
    )


def attribution_per_set(
    model: nn.Module,
    id_x: torch.Tensor,
    id_y: torch.Tensor,
    ood_per_set: dict[str, torch.Tensor],
    *,
    batch_size: int = 64,
) -> dict[str, torch.Tensor | float]:
    """:func:`attribution_importance` with the AUROC taken per OOD set and averaged over the sets
    (as the per-head evidence of :mod:`hydra_core.analysis.evidence` takes it): one forward and a
    few backward passes over the ID items and every set's items together."""
    names = list(ood_per_set)
    model, id_x, *oods = model_and_inputs(
        model, id_x, *(ood_per_set[n] for n in names), names=("id_x", *names)
    )
    found = head_attribution(model, torch.cat([id_x, *oods]), labels=id_y, batch_size=batch_size)
    n_id = len(id_x)
    id_rows = torch.arange(n_id)
    scorer = Scorer(id_y, n_id)
    accuracies, aurocs, base_accs, base_rocs, start = [], [], [], [], n_id
    for ood in oods:
        rows = torch.cat([id_rows, torch.arange(start, start + len(ood))])
        start += len(ood)
        part = _rows(found, rows)
        accuracy, auroc = estimated_maps(part, id_y, n_id)
        accuracies.append(accuracy)  # the same ID items for every set
        aurocs.append(auroc)
        base = scorer(part.logits[None])
        base_accs.append(float(base[0][0]))
        base_rocs.append(float(base[1][0]))
    accuracy, base_acc = accuracies[0], base_accs[0]
    auroc = torch.stack(aurocs).mean(0)
    base_roc = sum(base_rocs) / len(base_rocs)
    return {
        "delta_accuracy": accuracy - base_acc,
        "delta_auroc": auroc - base_roc,
        "base_accuracy": base_acc,
        "base_auroc": base_roc,
    }
