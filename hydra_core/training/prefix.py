"""A frozen prefix run once: training a model's top on the states its frozen layers (embedding and
first blocks) leave.

When the layers below the trained ones are frozen and run without dropout, their output for a
sentence never changes: it is computed once (:func:`prefix_forward`, :func:`state_batches`) and
every optimiser step runs only the trained blocks and the head (:func:`top_logits`). The text
recipes (``train-text``, :mod:`hydra_core.training.top`) train this way; any family whose blocks
the adapter knows can.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from hydra_core.data.text import DataSet
from hydra_core.models.adapter import family_of


@dataclass
class StateBatch:
    """The stream entering the trained layers for a batch of sentences, with its context."""

    states: torch.Tensor  # (B, T, d)
    context: object  # the family's context (attention mask, ...)
    labels: torch.Tensor  # (B,)


def prefix_forward(
    model: nn.Module, inputs: torch.Tensor, frozen: int
) -> tuple[torch.Tensor, object]:
    """The stream (B, T, d) after the embedding and the first ``frozen`` blocks of ``model``, and
    the family's context for the blocks above; ``inputs`` as the model takes them (packed token
    ids for a text model). The caller chooses the mode and the grad setting."""
    family = family_of(model)
    x, context = family.embed(model, family.prepare(model, inputs))
    for block in family.blocks(model)[:frozen]:
        x = family.block_forward(block, x, context)
    return x, context


def top_logits(
    model: nn.Module, frozen: int, states: torch.Tensor, context: object
) -> torch.Tensor:
    """Logits from the stream leaving the frozen blocks: the trained blocks, then the head."""
    family = family_of(model)
    x = states
    for block in family.blocks(model)[frozen:]:
        x = family.block_forward(block, x, context)
    return family.classify(model, x, context)


@torch.no_grad()
def state_batches(
    model: nn.Module,
    preprocess: Callable[[Sequence], torch.Tensor],
    data: DataSet,
    frozen: int,
    batch_size: int,
    device: torch.device,
) -> list[StateBatch]:
    """Run the embedding and the first ``frozen`` blocks of ``model`` (eval mode) once over
    ``data``, in batches of neighbours in the family's order (text: by length, each batch cut to
    its longest sentence by the family's ``prepare``). ``no_grad``, not ``inference_mode``: the
    states are inputs of the training graph."""
    model.eval()
    inputs = preprocess(data.inputs)  # text: (N, 2, T) packed ids and mask; images: (N, C, H, W)
    order = family_of(model).sample_order(inputs)
    if order is None:
        order = torch.arange(len(inputs))
    batches = []
    for start in range(0, len(order), batch_size):
        index = order[start : start + batch_size]
        x, context = prefix_forward(model, inputs[index].to(device), frozen)
        batches.append(StateBatch(x, context, data.labels[index].to(device)))
    return batches


def trained_parameters(model: nn.Module, frozen: int) -> dict[str, nn.Parameter]:
    """The parameters of the blocks from ``frozen`` on and of the head, by name."""
    family = family_of(model)
    top = {id(p) for block in family.blocks(model)[frozen:] for p in block.parameters()}
    return {
        name: p
        for name, p in model.named_parameters()
        if id(p) in top or family.parameter_kind(model, name) == "head"
    }
