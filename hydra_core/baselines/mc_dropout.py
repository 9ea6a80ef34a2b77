"""MC Dropout (Gal and Ghahramani, 2016): a model's own dropout left on at test time, T passes,
their softmaxes averaged (downstream, as every ensemble's are).

A model trained without dropout (the default ViT: timm's dropout modules with p = 0) has nothing
to sample; :func:`dropout_rate` says so and the system refuses unless a rate is given. With
``rate``, every dropout module is set to that rate for the passes only: the *post-hoc* variant
(dropout the model never saw in training), named so in the system's name.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from hydra_core.evaluate import callable_model

DROPOUT_TYPES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.AlphaDropout)


def dropout_rate(model: nn.Module) -> float:
    """The largest rate among ``model``'s dropout modules (0.0 when it has none)."""
    rates = [float(m.p) for m in model.modules() if isinstance(m, DROPOUT_TYPES)]
    return max(rates, default=0.0)


def dropout_modules(model: nn.Module) -> int:
    """How many dropout modules ``model`` has (each can be given a post-hoc rate)."""
    return sum(isinstance(m, DROPOUT_TYPES) for m in model.modules())


class MCDropout(nn.Module):
    """MC Dropout: ``model`` with its dropout on, ``passes`` forwards; ``forward(inputs)`` ->
    (B, passes, C) logits (their softmaxes are averaged downstream).

    Pass t re-seeds the random generator with ``seed + t`` at every call (inside a forked random
    state, so the caller's is untouched): the predictions are reproducible for a given batching.
    ``rate``: every dropout module's p during the passes (None: the model's own). The model's
    train/eval flags and rates are restored after every call.
    """

    def __init__(
        self, model: nn.Module, passes: int, seed: int = 0, rate: float | None = None
    ) -> None:
        super().__init__()
        if passes < 1:
            raise ValueError(f"MC Dropout needs at least one pass, got {passes}")
        if rate is not None and not 0.0 < rate < 1.0:
            raise ValueError(f"a dropout rate lies strictly between 0 and 1, got {rate}")
        self.model, self.passes, self.seed, self.rate = model, passes, seed, rate

    @property
    def wrapped(self) -> nn.Module:
        """The model whose weights the passes share (its cost is the system's parameters)."""
        return self.model

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        system = callable_model(self.model)
        devices = [inputs.device] if inputs.device.type == "cuda" else []
        with _sampling(self.model, self.rate):
            outs = []
            for t in range(self.passes):
                with torch.random.fork_rng(devices=devices):
                    torch.manual_seed(self.seed + t)
                    outs.append(system(inputs))
        return torch.stack(outs, dim=1)  # (B, T, C)


@contextmanager
def _sampling(model: nn.Module, rate: float | None):
    """Inside, ``model`` is in train mode (dropout samples) with every dropout module at ``rate``
    when given; on exit its flags and rates are as they were."""
    flags = {m: m.training for m in model.modules()}
    rates = {m: m.p for m in model.modules() if isinstance(m, DROPOUT_TYPES)}
    model.train()
    if rate is not None:
        for m in rates:
            m.p = rate
    try:
        yield
    finally:
        for m, training in flags.items():
            m.training = training
        for m, p in rates.items():
            m.p = p
