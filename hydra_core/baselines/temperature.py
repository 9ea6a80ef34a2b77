"""Temperature scaling (Guo et al., 2017) as a system: the source model's logits divided by one
scalar T, fitted to minimise the NLL on the ID *search* split (held out of every report), with
:func:`~hydra_core.metrics.temperature.fit_temperature`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from hydra_core.evaluate import Evaluation, SetPredictions, callable_model
from hydra_core.inference import predict
from hydra_core.metrics.temperature import fit_temperature


class TemperatureScaled(nn.Module):
    """A classifier whose logits are divided by a fitted temperature."""

    def __init__(self, model: nn.Module, temperature: float) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("temperature", torch.tensor(float(temperature)))

    @property
    def wrapped(self) -> nn.Module:
        """The model whose logits are scaled."""
        return self.model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return callable_model(self.model)(x) / self.temperature


def fitted_temperature(
    model: nn.Module,
    inputs: Sequence | torch.Tensor,
    labels: torch.Tensor,
    preprocess: Callable,
    *,
    device: torch.device | str = "cpu",
    batch_size: int = 256,
    progress: Callable[[int, int], None] | None = None,
) -> float:
    """The temperature minimising the NLL of ``model``'s logits on ``inputs`` (raw items, turned
    into model inputs by ``preprocess``) with ``labels``; ``progress(done, total)`` after each
    batch predicted."""
    logits = predict(
        callable_model(model),
        inputs,
        preprocess,
        device=device,
        batch_size=batch_size,
        progress=progress,
    )
    return fit_temperature(logits.float().cpu(), labels.cpu())


def scaled_evaluation(source: Evaluation, name: str, temperature: torch.Tensor) -> Evaluation:
    """The evaluation of :class:`TemperatureScaled` from the source model's own (fp32)
    predictions: every logit divided by ``temperature`` (the buffer the scaled model divides by),
    which is what the scaled model's forward computes."""

    def scaled(part: SetPredictions) -> SetPredictions:
        return SetPredictions(part.name, part.group, part.logits / temperature, part.labels)

    return Evaluation(
        name,
        scaled(source.id),
        [scaled(s) for s in source.ood],
        score=source.score,
        bootstrap=source.bootstrap,
    )
