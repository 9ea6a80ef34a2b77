"""The public face of the model families: find a model's heads, switch them off, cut them out.

Every function here works on any supported family (:mod:`hydra_core.models.vit` for timm ViTs,
:mod:`hydra_core.models.text` for Hugging Face BERT-family encoders,
:mod:`hydra_core.models.openclip` for OpenCLIP image towers and zero-shot classifiers, whose
joint layout holds the text tower's heads too); :func:`family_of` picks the family,
and the code above :mod:`hydra_core.models` never needs to know which one it was.
See :mod:`hydra_core.models.family` for the head layout and the piece-by-piece forward.

Every intervention is a forward hook on W_O that lives inside a context manager and is removed in
``finally`` (with the family's :meth:`~hydra_core.models.family.ModelFamily.projection_called`
around it, so that W_O is called as a module): a model leaves every context bit-identical to how
it entered.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from hydra_core.models.family import (
    Context,
    HeadLayout,
    ModelFamily,
    UnsupportedModelError,
    head_label,
    parse_head_label,
)
from hydra_core.models.openclip import OPENCLIP
from hydra_core.models.openclip_text import OPENCLIP_TEXT
from hydra_core.models.text import TEXT
from hydra_core.models.vit import (
    SHORT_SEQUENCE,
    VIT,
    EmptyAttention,
    attention,
    attention_projection,
    block_heads,
    block_rest,
    prune_attention,
)

__all__ = [
    "SHORT_SEQUENCE",
    "Context",
    "EmptyAttention",
    "FAMILIES",
    "HeadLayout",
    "ModelFamily",
    "UnsupportedModelError",
    "ablate",
    "as_keep_mask",
    "attention",
    "attention_weights",
    "attention_projection",
    "block_heads",
    "block_rest",
    "channel_mask",
    "classify",
    "embed",
    "family_of",
    "head_label",
    "head_layout",
    "model_and_inputs",
    "parse_head_label",
    "prune_attention",
    "prune_heads",
    "record_head_outputs",
    "scale_heads",
]

#: every family Hydra Lab knows, tried in this order
FAMILIES: tuple[ModelFamily, ...] = (VIT, TEXT, OPENCLIP, OPENCLIP_TEXT)


def family_of(model: nn.Module) -> ModelFamily:
    """The family ``model`` belongs to; :class:`UnsupportedModelError` when none knows it."""
    for family in FAMILIES:
        if family.matches(model):
            return family
    raise UnsupportedModelError(
        f"{type(model).__name__} has no `blocks` list of transformer blocks and is neither a "
        "Hugging Face text classifier nor an open_clip model; Hydra Lab supports timm "
        "VisionTransformer models (ViT, DeiT, DINOv2 variants), BERT, RoBERTa, MPNet and "
        "DistilBERT sequence classifiers, and open_clip VisionTransformer image towers (bare or "
        "in a ZeroShotClassifier)"
    )


def head_layout(model: nn.Module) -> HeadLayout:
    """The head layout of a supported model; raises :class:`UnsupportedModelError` otherwise."""
    return family_of(model).layout(model)


def model_and_inputs(
    model: nn.Module, *inputs: object, names: Sequence[str] | None = None
) -> tuple[nn.Module, ...]:
    """``model`` as a module mapping one input tensor to logits, and ``inputs`` as tensors it
    takes, checked and made concatenable: for a Hugging Face text classifier, the model wrapped in
    a :class:`~hydra_core.models.text.TextClassifier` and token ids packed with their masks."""
    family = family_of(model)
    names = names or [f"inputs {i}" for i in range(len(inputs))]
    checked = [family.check_inputs(x, name) for x, name in zip(inputs, names, strict=True)]
    return (family.callable_model(model), *family.match_inputs(checked))


def _projections(model: nn.Module) -> list[nn.Linear]:
    family = family_of(model)
    return [family.output_projection(block) for block in family.blocks(model)]


def as_keep_mask(layout: HeadLayout | nn.Module, keep: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Validate a head mask against a model and return it as a CPU bool tensor.

    A mask must be boolean with shape (layers, max heads), True = kept; for layers of a pruned model
    that have fewer heads, the positions past the last head must be False.
    """
    if isinstance(layout, nn.Module):
        layout = head_layout(layout)
    if isinstance(keep, np.ndarray):
        keep = torch.from_numpy(keep)
    if not isinstance(keep, torch.Tensor):
        raise TypeError(
            f"a head mask must be a bool tensor of shape {layout.shape}, got {type(keep).__name__}"
        )
    if keep.dtype != torch.bool:
        raise TypeError(
            f"a head mask must have dtype bool (True = kept), got {keep.dtype}; if 1 means kept, "
            "pass keep.bool()"
        )
    if tuple(keep.shape) != layout.shape:
        raise ValueError(
            f"head mask has shape {tuple(keep.shape)} but the model has {layout.num_layers} layers "
            f"of up to {layout.max_heads} heads: expected shape {layout.shape}"
        )
    keep = keep.detach().cpu()
    for layer, n in enumerate(layout.num_heads):
        extra = (keep[layer, n:].nonzero().flatten() + n).tolist()
        if extra:
            raise ValueError(
                f"head mask keeps {', '.join(head_label(layer, h) for h in extra)}, "
                f"but layer {layer} "
                f"has only {n} heads"
            )
    return keep


def channel_mask(keep_layer: torch.Tensor, head_dim: int) -> torch.Tensor:
    """A per-head mask (H,) expanded to the projection input's channels (H * d_k,)."""
    return keep_layer.repeat_interleave(head_dim)


@contextmanager
def ablate(model: nn.Module, keep: torch.Tensor) -> Iterator[nn.Module]:
    """Switch off the heads where ``keep`` is False, for the duration of the ``with`` block.

    A switched-off head's d_k slice is zeroed at the input of the attention output projection, which
    equals zeroing its column block of W_O (paper, Appendix D.1.2). Layers that keep every head get
    no hook, so an all-True mask leaves the logits bit-identical.
    """
    family = family_of(model)
    layout = family.layout(model)
    keep = as_keep_mask(layout, keep)
    projections = _projections(model)
    layers = [layer for layer, n in enumerate(layout.num_heads) if not bool(keep[layer, :n].all())]
    handles = []
    try:
        with family.projection_called(model, layers):
            for layer in layers:
                mask = channel_mask(keep[layer, : layout.num_heads[layer]], layout.head_dim)
                # prepended: it applies before any recording hook, whichever context came first
                hook = _ZeroChannels(mask)
                handles.append(projections[layer].register_forward_pre_hook(hook, prepend=True))
            yield model
    finally:
        for handle in handles:
            handle.remove()


class _ZeroChannels:
    """Forward pre-hook: multiply the projection input by a 0/1 channel mask."""

    def __init__(self, mask: torch.Tensor) -> None:
        self.mask = mask
        self._cast: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def __call__(self, module: nn.Module, args: tuple[torch.Tensor, ...]):
        x = args[0]
        key = (x.device, x.dtype)
        if key not in self._cast:
            self._cast[key] = self.mask.to(device=x.device, dtype=x.dtype)
        return (x * self._cast[key],) + tuple(args[1:])


@contextmanager
def scale_heads(model: nn.Module, scales: torch.Tensor) -> Iterator[nn.Module]:
    """Multiply each head's output by ``scales[layer, head]`` at the input of W_O, for the
    duration of the ``with`` block: a differentiable head mask (Michel et al., 2019). With
    ``scales`` all ones and requiring grad, a loss computed inside is the model's own and its
    gradient with respect to ``scales`` is the gradient with respect to the head mask.

    Args:
        scales: (layers, max heads) float, on the model's device; entries past a layer's last
            head are not read.
    """
    family = family_of(model)
    layout = family.layout(model)
    if tuple(scales.shape) != layout.shape or not scales.is_floating_point():
        raise ValueError(
            f"head scales must be a float tensor of shape {layout.shape}, got "
            f"{scales.dtype} {tuple(scales.shape)}"
        )
    projections = _projections(model)
    layers = [layer for layer, n in enumerate(layout.num_heads) if n > 0]

    def scaler(layer: int):
        n = layout.num_heads[layer]

        def hook(module: nn.Module, args: tuple[torch.Tensor, ...]):
            channels = scales[layer, :n].repeat_interleave(layout.head_dim)  # (H * d_k,)
            return (args[0] * channels.to(args[0].dtype),) + tuple(args[1:])

        return hook

    handles = []
    try:
        with family.projection_called(model, layers):
            for layer in layers:
                hook = scaler(layer)
                handles.append(projections[layer].register_forward_pre_hook(hook, prepend=True))
            yield model
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def record_head_outputs(
    model: nn.Module, layers: Sequence[int], *, token: int | None = 0
) -> Iterator[dict[int, list[torch.Tensor]]]:
    """Record each head's output Z (before W_O) at ``layers`` during forwards inside the block.

    Yields a dict ``layer -> list of tensors``, one per forward call, of shape (B, H, d_k) for one
    ``token`` (0 = CLS) or (B, N, H, d_k) when ``token`` is None. Ablation hooks apply first
    (:func:`ablate` prepends them), so a recorded ablated head reads zero, whether ``ablate`` is
    entered before this context or inside it.
    """
    family = family_of(model)
    layout = family.layout(model)
    projections = _projections(model)
    for layer in layers:
        if not 0 <= layer < layout.num_layers:
            raise ValueError(
                f"layer {layer} does not exist; the model has layers 0..{layout.num_layers - 1}"
            )
    store: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
    handles = []

    def recorder(layer: int):
        def hook(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            x = args[0]
            b, n, _ = x.shape
            z = x.reshape(b, n, layout.num_heads[layer], layout.head_dim)  # (B, N, H, d_k)
            store[layer].append((z if token is None else z[:, token]).detach())

        return hook

    try:
        with family.projection_called(model, layers):
            for layer in layers:
                handles.append(projections[layer].register_forward_pre_hook(recorder(layer)))
            yield store
    finally:
        for handle in handles:
            handle.remove()


def prune_heads(model: nn.Module, keep: torch.Tensor) -> nn.Module:
    """A new, structurally smaller model that keeps only the heads where ``keep`` is True.

    Only the kept heads' Q/K/V rows and W_O columns remain (per-layer head counts may differ; a
    layer that keeps no head adds only W_O's bias). Its logits equal those of ``model`` under
    ``ablate(model, keep)``. The source model is not modified.
    """
    family = family_of(model)
    layout = family.layout(model)
    keep = as_keep_mask(layout, keep)
    pruned = copy.deepcopy(model)
    replaced = False
    for layer, block in enumerate(list(family.blocks(pruned))):
        n = layout.num_heads[layer]
        heads = keep[layer, :n].nonzero().flatten()
        if len(heads) == n:
            continue
        family.set_block(pruned, layer, family.prune_block(block, heads))
        replaced = True
    if replaced:
        family.weights_changed(pruned)
    return pruned


def embed(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """Model inputs -> the token stream entering block 0, shape (B, N, d) (the family's context,
    which text models need further on, is dropped: use ``family_of(model).embed`` for it)."""
    return family_of(model).embed(model, inputs)[0]


def classify(model: nn.Module, tokens: torch.Tensor, context: Context = None) -> torch.Tensor:
    """The token stream leaving the last block (B, N, d) -> logits (B, C)."""
    return family_of(model).classify(model, tokens, context)


def run_blocks(
    model: nn.Module, inputs: torch.Tensor, last_layer: int | None = None
) -> torch.Tensor:
    """Embed ``inputs`` and run the blocks up to ``last_layer`` (all when None), each as the model
    runs it (hooks on its modules fire): the stream leaving that block, (B, N, d). A model with
    towers runs the tower that reads ``inputs``, its first."""
    towers = family_of(model).towers(model)
    if towers:
        model = towers[0].model
    family = family_of(model)
    x, context = family.embed(model, inputs)
    blocks = family.blocks(model)
    if last_layer is not None and last_layer >= len(blocks):
        raise ValueError(f"layer {last_layer} is not in the blocks that read the inputs")
    for block in blocks[: len(blocks) if last_layer is None else last_layer + 1]:
        x = family.block_forward(block, x, context)
    return x


def attention_weights(
    model: nn.Module, inputs: torch.Tensor
) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """Every head's attention weights for a batch of model inputs, as the model computes them.

    Returns:
        (weights, real): per layer, the softmax weights (B, H_l, N, N), queries x keys (a
        padding key gets weight 0); and which of the N tokens are real, (B, N) bool, or None
        when every token is (images). Text inputs are cut to the positions some sample uses.
    """
    family = family_of(model)
    x, context = family.trim(*family.embed(model, inputs))
    weights = []
    for block in family.blocks(model):
        weights.append(family.block_attention(block, x, context))
        x = family.block_forward(block, x, context)
    return weights, family.real_tokens(context)
