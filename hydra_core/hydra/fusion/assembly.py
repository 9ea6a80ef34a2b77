"""Named tensors -> a fused model's modules: what every ``assemble_*`` function shares.

A fused model is built from its config and its named tensors (a state dict) by one function, both
when members are fused and when a file is read back; :class:`NamedTensors` hands out the tensors
by name and refuses a file that lacks one or has one too many, and :func:`check_heads` refuses a
file whose header and tensors disagree.
"""

from __future__ import annotations

import torch
from torch import nn

from hydra_core.hydra.layers import GroupedLinear, MergedMlp, StackedLayerNorm


class NamedTensors:
    """The named tensors of a fused model, each taken once by the module that holds it.

    Args:
        tensors: name -> tensor, as the fused model's state dict names them.
        norm_eps: the epsilon of every LayerNorm built here.
    """

    def __init__(self, tensors: dict[str, torch.Tensor], norm_eps: float) -> None:
        self.tensors = tensors
        self.norm_eps = norm_eps
        self.unused = set(tensors)

    def take(self, name: str, required: bool = True) -> torch.Tensor | None:
        """The tensor ``name``; None when there is none and it is not ``required``."""
        if name not in self.tensors:
            if required:
                raise ValueError(f"the Hydra model lacks the tensor {name!r}")
            return None
        self.unused.discard(name)
        return self.tensors[name]

    def norm(self, prefix: str, required: bool = False) -> StackedLayerNorm | None:
        """The LayerNorm ``{prefix}.weight/bias``; None when there is none and not ``required``."""
        weight = self.take(f"{prefix}.weight", required)
        if weight is None:
            return None
        return StackedLayerNorm(weight, self.take(f"{prefix}.bias"), self.norm_eps)

    def block(self, prefix: str, head_dim: int, act: str) -> dict[str, nn.Module | int | None]:
        """The arguments of a :class:`~hydra_core.hydra.layers.FusedBlock` that every fused block
        has: its norms, Q/K/V (None when no member keeps a head), W_O and merged MLP."""
        qkv_weight, qkv_bias = (
            self.take(prefix + "qkv.weight", False),
            self.take(prefix + "qkv.bias", False),
        )
        return {
            "head_dim": head_dim,
            "norm1": self.norm(prefix + "norm1", True),
            "qkv": None if qkv_weight is None else GroupedLinear(qkv_weight, qkv_bias),
            "proj": GroupedLinear(
                self.take(prefix + "proj.weight"), self.take(prefix + "proj.bias", False)
            ),
            "norm2": self.norm(prefix + "norm2", True),
            "mlp": MergedMlp(
                self.take(prefix + "mlp.fc1_weight"),
                self.take(prefix + "mlp.fc1_bias", False),
                self.take(prefix + "mlp.fc2_weight"),
                self.take(prefix + "mlp.fc2_bias", False),
                act,
            ),
        }

    def check_all_used(self) -> None:
        """Refuse tensors that no module took."""
        if self.unused:
            names = ", ".join(sorted(self.unused))
            raise ValueError(f"the Hydra model has tensors it does not use: {names}")


def check_heads(hydra: nn.Module, stacked: tuple[type, ...], output: str) -> None:
    """Shapes agree with the description (catches a file whose header and tensors disagree):
    ``kept_heads`` lists every layer of every member, each module of the ``stacked`` types holds
    1 or M member groups, each block holds as many heads as its members keep at most, and the
    ``output`` layer maps d to the config's ``num_classes``."""
    cfg = hydra.config
    m, d, dk, depth = cfg.num_members, cfg.embed_dim, cfg.head_dim, cfg.depth
    if len(hydra.kept_heads) != m or any(len(member) != depth for member in hydra.kept_heads):
        raise ValueError(f"kept_heads must list {depth} layers for each of the {m} members")
    for name, module in hydra.named_modules():
        if isinstance(module, stacked) and module.groups not in (1, m):
            raise ValueError(f"{name} holds {module.groups} member groups; expected 1 or {m}")
    for layer, block in enumerate(hydra.blocks):
        needed = max(len(member[layer]) for member in hydra.kept_heads)
        if block.max_heads != needed or block.proj.weight.shape[1:] != (needed * dk, d):
            raise ValueError(
                f"block {layer}: the weights hold {block.max_heads} heads, but the "
                f"members keep up to {needed}"
            )
    weight = getattr(hydra, output).weight
    if weight.shape[1:] != (d, cfg.num_classes):
        raise ValueError(
            f"the {output} has shape {tuple(weight.shape)}; expected (S, {d}, {cfg.num_classes})"
        )
