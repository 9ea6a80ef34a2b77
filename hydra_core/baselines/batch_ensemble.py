"""BatchEnsemble (Wen et al., 2020) applied to a trained model, then fine-tuned.

Every linear layer of the model (attention Q/K/V and output, MLP, classifier) becomes
TorchUncertainty's ``BatchLinear``: the trained weight W shared by the E members, member m's
weight ``W * (s_m r_m^T)`` (rank-1 fast weights, ``y = ((x * r_m) W^T) * s_m + b_m``) and its own
bias, started from the trained bias. The patch embedding, norms and tokens stay shared.
TorchUncertainty's ``BatchEnsemble`` wrapper repeats each test batch E times (member-major), so
that every member sees every input; in training the batch is split among the members (its
default), which needs a batch size that is a multiple of E.

``BatchLinear`` takes (N, features) inputs; a ViT's are (N, tokens, features), so each layer
here flattens the tokens into the batch first (row order member-major, as the wrapper makes it).
TorchUncertainty draws r and s from N(1, 0.5) (:data:`INIT_STD`); applied to a trained model that
scales each layer's inputs and outputs by factors of 0.5 to 1.5, so the fine-tuning starts well
below the model's accuracy, as the method's authors start from scratch.

``top_blocks`` converts only the linear layers of the model's top blocks and those after its
blocks (the head), and freezes the blocks below (``requires_grad`` off): BatchEnsemble on a
pre-trained encoder's top, as Uncertainty Baselines fine-tunes its BatchEnsemble ViTs (its
``be_layers``: the last two or three blocks, r and s from N(1, 0.5)). A model's modality says how
many (:attr:`~hydra_core.models.modality.Modality.batch_ensemble_blocks`): every layer of the ViT
trained here, the top two of a text encoder (why, measured: docs/baselines.md).

(TorchUncertainty's own conversion, ``BatchEnsemble(convert_layers=True)``, builds new layers with
fresh weights and sets them by dotted name on the root module, which leaves nested layers as they
were; :func:`batch_ensemble` replaces them in their parents and copies the trained weights.)
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch_uncertainty.layers import BatchLinear
from torch_uncertainty.methods import BatchEnsemble

from hydra_core.evaluate import callable_model
from hydra_core.models.adapter import family_of

#: standard deviation of TorchUncertainty's N(1, std) draw of the fast weights r and s
INIT_STD = 0.5


class TokenBatchLinear(BatchLinear):
    """``BatchLinear`` on (N, ..., features) inputs: the middle dimensions are flattened into
    the batch, so that each member's rows stay together (N must be a multiple of E).

    The same numbers as ``BatchLinear.forward``, bit for bit (test), computed with r, s and the
    bias broadcast over each member's rows instead of repeated row by row: TorchUncertainty
    materialises three (rows, features) copies of them per layer, which made a ViT's
    BatchEnsemble forward about 2.4x slower per layer on a CPU (``bench/batch_ensemble.py``)."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        e = self.num_estimators
        if inputs.ndim == 2 and len(inputs) % e:
            return super().forward(inputs)  # its rule for a batch that is no multiple of E
        if len(inputs) % e:
            raise ValueError(
                f"BatchEnsemble: a batch of {len(inputs)} is not a multiple of its {e} members"
            )
        rows = inputs.reshape(e, -1, inputs.shape[-1])  # member-major, as the wrapper repeats
        out = self.linear(rows * self.r_group[:, None, :]) * self.s_group[:, None, :]
        if self.bias is not None:
            out = out + self.bias[:, None, :]
        return out.reshape(*inputs.shape[:-1], -1)


class BatchEnsembleModel(nn.Module):
    """A model whose linear layers are BatchEnsemble layers; ``forward(inputs)`` -> (B, E,
    classes) in eval mode (each input through every member), (B, classes) in training mode
    (the batch split among the members, member-major)."""

    def __init__(self, model: nn.Module, estimators: int) -> None:
        super().__init__()
        self.estimators = estimators
        self.ensemble = BatchEnsemble(model, estimators)

    @property
    def core(self) -> nn.Module:
        return self.ensemble.core_model

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        logits = self.ensemble(inputs)
        if self.training:
            return logits
        return logits.view(self.estimators, len(inputs), -1).transpose(0, 1)


@torch.no_grad()
def batch_ensemble(
    model: nn.Module,
    estimators: int = 3,
    seed: int = 0,
    init_std: float = INIT_STD,
    top_blocks: int | None = None,
) -> BatchEnsembleModel:
    """A copy of ``model`` (in its callable form: a text model takes packed token ids) with its
    ``nn.Linear`` layers BatchEnsemble layers of ``estimators`` members: the trained weight
    shared, the trained bias copied to every member, r and s drawn from N(1, init_std) with
    ``seed`` (the caller's random state untouched). ``top_blocks``: only the layers of the top
    blocks and after them, the blocks below frozen (None: every linear layer)."""
    if estimators < 1:
        raise ValueError(f"BatchEnsemble needs at least one member, got {estimators}")
    core = copy.deepcopy(model).cpu()
    below = _frozen_blocks(core, top_blocks)
    for block in below:
        block.requires_grad_(False)
    inside = {id(m) for block in below for m in block.modules()}
    linears = [
        (n, m) for n, m in core.named_modules() if isinstance(m, nn.Linear) and id(m) not in inside
    ]
    if not linears:
        raise ValueError("BatchEnsemble: the model has no linear layer to convert")
    generator = torch.Generator().manual_seed(int(seed))
    for name, linear in linears:
        layer = TokenBatchLinear(
            linear.in_features, linear.out_features, estimators, bias=linear.bias is not None
        )
        layer.linear.weight.copy_(linear.weight)
        layer.r_group.copy_(1 + init_std * torch.randn(layer.r_group.shape, generator=generator))
        layer.s_group.copy_(1 + init_std * torch.randn(layer.s_group.shape, generator=generator))
        if linear.bias is not None:
            layer.bias.copy_(linear.bias.expand_as(layer.bias))
        parent, _, attr = name.rpartition(".")
        setattr(core.get_submodule(parent) if parent else core, attr, layer)
    return BatchEnsembleModel(callable_model(core), estimators).eval()


def _frozen_blocks(model: nn.Module, top_blocks: int | None) -> list[nn.Module]:
    """The blocks below the top ``top_blocks`` (none when it is None)."""
    if top_blocks is None:
        return []
    blocks = list(family_of(model).blocks(model))
    if not 1 <= top_blocks <= len(blocks):
        raise ValueError(
            f"top_blocks must be 1..{len(blocks)} (the model's blocks), got {top_blocks}"
        )
    return blocks[: len(blocks) - top_blocks]


def member_weight(layer: BatchLinear, m: int) -> torch.Tensor:
    """Member ``m``'s full weight of a BatchEnsemble layer: ``W * (s_m r_m^T)``."""
    return layer.linear.weight * torch.outer(layer.s_group[m], layer.r_group[m])
