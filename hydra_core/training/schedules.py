"""Learning-rate schedules: a linear warm-up per step, then a decay; ``schedule(step)`` gives the
learning rate of (0-based) optimiser ``step``.

Each schedule is written exactly as the recipe that uses it trained its shipped weights: the order
of the floating-point operations is part of the recipe (``peak * (step + 1) / warmup`` and
``peak * ((step + 1) / warmup)`` differ in the last bit, and so do the checkpoints trained with
them). Change one only together with the version of what it trains.
"""

from __future__ import annotations

import math
from collections.abc import Callable

#: (0-based step) -> learning rate
Schedule = Callable[[int], float]


def warmup_cosine(peak: float, warmup: int, total: int) -> Schedule:
    """Linear warm-up to ``peak`` over ``warmup`` steps, then a cosine decay that would reach 0 at
    step ``total`` (the default ViT's recipe)."""

    def lr_at(step: int) -> float:
        if step < warmup:
            return peak * (step + 1) / warmup
        return 0.5 * peak * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))

    return lr_at


def warmup_cosine_to_floor(peak: float, warmup: int, total: int, floor_fraction: float) -> Schedule:
    """Linear warm-up to ``peak`` over ``warmup`` steps, then a cosine decay that reaches
    ``peak * floor_fraction`` at the last step, ``total - 1`` (fine-tuning after pruning, D.2)."""

    def lr_at(step: int) -> float:
        if step < warmup:
            return peak * (step + 1) / warmup
        decay_steps = max(1, total - warmup - 1)
        progress = min(1.0, (step - warmup) / decay_steps)
        floor = peak * floor_fraction
        return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))

    return lr_at


def warmup_linear(
    peak: float, warmup: int, total: int, *, fraction_first: bool = False
) -> Schedule:
    """Linear warm-up to ``peak`` over ``warmup`` steps, then a linear decay that would reach 0 at
    step ``total`` (the text models' recipes).

    Args:
        fraction_first: the warm-up as ``peak * ((step + 1) / warmup)``, as the top fine-tuning of
            text models (:mod:`hydra_core.training.top`) computes it, instead of
            ``peak * (step + 1) / warmup`` (``train-text``).
    """

    def lr_at(step: int) -> float:
        if step < warmup:
            return peak * ((step + 1) / warmup) if fraction_first else peak * (step + 1) / warmup
        return peak * max(0.0, (total - step) / max(1, total - warmup))

    return lr_at
