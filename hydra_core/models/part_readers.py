"""Reading modules into :mod:`hydra_core.models.parts`: the readers every family's
:meth:`~hydra_core.models.family.ModelFamily.fusion_parts` shares, each refusing what the canonical
parts cannot describe with an :class:`~hydra_core.models.family.UnsupportedModelError` that names
the model (``where``: "this model", "member 2") and the cause in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from hydra_core.models.family import UnsupportedModelError
from hydra_core.models.parts import ACTIVATIONS, BlockParts, LinearParts, NormParts

#: the grid an MLP activation is compared on with every one of ACTIVATIONS
_PROBE = torch.linspace(-8.0, 8.0, 321)


def norm_parts(norm: nn.Module, where: str, required: bool = False) -> NormParts | None:
    """A LayerNorm's weight, bias (zeros where it has none) and eps, detached; None for an
    Identity (no norm) unless ``required``; anything else is refused."""
    if isinstance(norm, nn.Identity) and not required:
        return None
    if not isinstance(norm, nn.LayerNorm):
        raise UnsupportedModelError(
            f"{where} cannot be fused: a {type(norm).__name__} norm is not supported "
            "(LayerNorm only)"
        )
    if norm.weight is None:
        raise UnsupportedModelError(
            f"{where} cannot be fused: LayerNorms without learned weights are not supported"
        )
    weight = norm.weight.detach()
    bias = weight.new_zeros(weight.shape) if norm.bias is None else norm.bias.detach()
    return NormParts(weight, bias, float(norm.eps))


def activation_name(act: Callable[[torch.Tensor], torch.Tensor], where: str) -> str:
    """The key of :data:`~hydra_core.models.parts.ACTIVATIONS` that computes what ``act``
    computes, checked on a grid of inputs (whatever class the model's activation is)."""
    with torch.no_grad():
        try:
            values = act(_PROBE.clone())  # a copy: an in-place activation overwrites it
        except (RuntimeError, TypeError):
            values = None  # an activation with weights elsewhere than on the CPU, say
        for name, fn in ACTIVATIONS.items():
            if values is not None and torch.allclose(values, fn(_PROBE), rtol=0, atol=1e-6):
                return name
    raise UnsupportedModelError(
        f"{where} cannot be fused: its MLP activation {type(act).__name__} is none of "
        f"{', '.join(ACTIVATIONS)}"
    )


def fused_qkv(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[LinearParts, ...] | None:
    """A fused Q/K/V projection, weight (3 * H * d_k, d) with rows q, then k, then v (each
    head-major), as three linear layers (views, detached); None when it has no rows (no head)."""
    if weight.shape[0] == 0:
        return None
    weight = weight.detach().reshape(3, -1, weight.shape[-1])  # (3, H * d_k, d)
    bias = None if bias is None else bias.detach().reshape(3, -1)
    return tuple(LinearParts(weight[i], None if bias is None else bias[i]) for i in range(3))


def block_parts(
    where: str,
    *,
    num_heads: int,
    qkv: Sequence[LinearParts] | None,
    out: nn.Linear,
    norms: tuple[nn.Module, nn.Module],
    mlp: tuple[nn.Linear, Callable[[torch.Tensor], torch.Tensor], nn.Linear],
    layer_scales: tuple[nn.Module, nn.Module] | None = None,
    position_bias: torch.Tensor | None = None,
) -> BlockParts:
    """A block's parts from its modules by role: Q/K/V (None when it has no head), W_O, the two
    LayerNorms, the MLP (fc1, activation, fc2), the layer scales (Identities or modules with a
    ``gamma``; pre-norm only) and a relative position bias (buckets, H)."""
    query, key, value = (None, None, None) if qkv is None else qkv
    ls1, ls2 = (None, None) if layer_scales is None else (_gamma(s) for s in layer_scales)
    fc1, act, fc2 = mlp
    return BlockParts(
        num_heads=num_heads,
        query=query,
        key=key,
        value=value,
        out=LinearParts.of(out),
        norm1=norm_parts(norms[0], where, required=True),
        norm2=norm_parts(norms[1], where, required=True),
        fc1=LinearParts.of(fc1),
        act=activation_name(act, where),
        fc2=LinearParts.of(fc2),
        ls1=ls1,
        ls2=ls2,
        position_bias=position_bias,
    )


def _gamma(scale: nn.Module) -> torch.Tensor | None:
    """A layer scale's gamma (d,), detached; None for an Identity."""
    return None if isinstance(scale, nn.Identity) else scale.gamma.detach()
