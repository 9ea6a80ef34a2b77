"""The result of a greedy Headmap search (:func:`hydra_core.analysis.greedy.greedy_circuit`): the
removal order with the scores after each step, and what each step reports to a progress callback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from hydra_core.models.adapter import head_label
from hydra_core.types import Head

#: the search objectives (:func:`hydra_core.analysis.greedy.greedy_circuit`)
OBJECTIVES = ("acc", "ood", "avg")


@dataclass
class GreedyResult:
    """A greedy search: the heads in the order they were removed and the scores along the way.

    ``scores[t]``, ``accuracy[t]`` and ``auroc[t]`` belong to the model with ``order[: t + 1]``
    ablated; ``candidate_scores[t]`` is the (L, H) float64 map of the objective for every head that
    step ``t`` tried (NaN for heads already removed or absent). ``seconds`` is the compute time
    of the dense evaluation and of the steps listed.
    """

    objective: str
    budget: int
    order: list[Head]
    scores: list[float]
    accuracy: list[float]
    auroc: list[float]
    base_accuracy: float
    base_auroc: float
    base_score: float
    candidate_scores: list[torch.Tensor]
    complete: bool
    seconds: float
    num_heads: tuple[int, ...]
    method: str = "fast"
    step_seconds: list[float] = field(default_factory=list)
    #: the guided search's K (:mod:`hydra_core.analysis.attribution`); None: every head each step
    candidates: int | None = None
    #: candidates evaluated exactly at each step
    evaluated: list[int] = field(default_factory=list)

    @property
    def shape(self) -> tuple[int, int]:
        """(layers, max heads): the shape of the maps and masks."""
        return (len(self.num_heads), max(self.num_heads, default=0))

    @property
    def steps(self) -> int:
        return len(self.order)

    def removal_step_map(self) -> torch.Tensor:
        """(L, H) int64: the step at which each head was removed (0-based), -1 if never."""
        steps = torch.full(self.shape, -1, dtype=torch.long)
        for t, (layer, head) in enumerate(self.order):
            steps[layer, head] = t
        return steps

    def keep_mask(self, n_removed: int | None = None) -> torch.Tensor:
        """(L, H) bool, True = kept, after removing the first ``n_removed`` heads (default: all
        listed)."""
        n = self.steps if n_removed is None else n_removed
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self.steps:
            raise ValueError(
                f"n_removed must be an int between 0 and {self.steps} (the steps done), got {n!r}"
            )
        keep = torch.zeros(self.shape, dtype=torch.bool)
        for layer, count in enumerate(self.num_heads):
            keep[layer, :count] = True
        for layer, head in self.order[:n]:
            keep[layer, head] = False
        return keep

    def ranking(self) -> list[Head]:
        """Every head, least useful first: the removal order, then the heads never removed by their
        last candidate score, highest first (ties: lowest (layer, head) first)."""
        removed = set(self.order)
        rest = [
            (layer, head)
            for layer, count in enumerate(self.num_heads)
            for head in range(count)
            if (layer, head) not in removed
        ]
        if self.candidate_scores:
            last = self.candidate_scores[-1]
            rest.sort(key=lambda lh: -float(last[lh]))
        return list(self.order) + rest

    def labels(self) -> list[str]:
        """The removal order as head labels (``L3H7``)."""
        return [head_label(layer, head) for layer, head in self.order]

    def prefix(self, n: int) -> GreedyResult:
        """The first ``n`` steps, as the result of a search with budget ``n``."""
        if not 0 <= n <= self.steps:
            raise ValueError(f"n must be between 0 and {self.steps}, got {n}")
        return replace(
            self,
            budget=n,
            order=self.order[:n],
            scores=self.scores[:n],
            accuracy=self.accuracy[:n],
            auroc=self.auroc[:n],
            candidate_scores=self.candidate_scores[:n],
            complete=True,
            step_seconds=self.step_seconds[:n],
            seconds=self.seconds - sum(self.step_seconds[n:]),
            evaluated=self.evaluated[:n],
        )

    def to_dict(self) -> dict:
        """JSON-safe: lists and numbers only, NaN as None."""
        return {
            "format": "hydra-greedy",
            "version": 1,
            "objective": self.objective,
            "method": self.method,
            "budget": self.budget,
            "num_heads": list(self.num_heads),
            "order": [[layer, head] for layer, head in self.order],
            "scores": list(self.scores),
            "accuracy": list(self.accuracy),
            "auroc": list(self.auroc),
            "base_accuracy": self.base_accuracy,
            "base_auroc": self.base_auroc,
            "base_score": self.base_score,
            "candidate_scores": [
                [[None if math.isnan(v) else v for v in row] for row in c.tolist()]
                for c in self.candidate_scores
            ],
            "complete": self.complete,
            "seconds": self.seconds,
            "step_seconds": list(self.step_seconds),
            "candidates": self.candidates,
            "evaluated": list(self.evaluated),
        }

    @classmethod
    def from_dict(cls, data: dict) -> GreedyResult:
        """Inverse of :meth:`to_dict`; raises ValueError on anything inconsistent."""
        if not isinstance(data, dict) or data.get("format") != "hydra-greedy":
            raise ValueError("not a greedy search result (expected format 'hydra-greedy')")
        try:
            num_heads = tuple(int(n) for n in data["num_heads"])
            shape = (len(num_heads), max(num_heads, default=0))
            order = [(int(layer), int(head)) for layer, head in data["order"]]
            candidates = [
                torch.tensor(
                    [[math.nan if v is None else float(v) for v in row] for row in c],
                    dtype=torch.float64,
                ).reshape(shape)
                for c in data["candidate_scores"]
            ]
            result = cls(
                objective=str(data["objective"]),
                budget=int(data["budget"]),
                order=order,
                scores=[float(v) for v in data["scores"]],
                accuracy=[float(v) for v in data["accuracy"]],
                auroc=[float(v) for v in data["auroc"]],
                base_accuracy=float(data["base_accuracy"]),
                base_auroc=float(data["base_auroc"]),
                base_score=float(data["base_score"]),
                candidate_scores=candidates,
                complete=bool(data["complete"]),
                seconds=float(data["seconds"]),
                num_heads=num_heads,
                method=str(data.get("method", "fast")),
                step_seconds=[float(v) for v in data.get("step_seconds", [])],
                candidates=None if data.get("candidates") is None else int(data["candidates"]),
                evaluated=[int(v) for v in data.get("evaluated", [])],
            )
        except (KeyError, TypeError, RuntimeError) as error:
            raise ValueError(f"malformed greedy search result: {error}") from None
        n = len(order)
        lengths = {len(result.scores), len(result.accuracy), len(result.auroc), len(candidates)}
        if lengths != {n} or result.objective not in OBJECTIVES or len(set(order)) != n:
            raise ValueError("malformed greedy search result: inconsistent step lists or objective")
        if any(
            not (0 <= layer < shape[0] and 0 <= head < num_heads[layer]) for layer, head in order
        ):
            raise ValueError("malformed greedy search result: a removed head is outside the model")
        return result


@dataclass
class GreedyStep:
    """What ``progress`` receives after each step of a search."""

    step: int  # 0-based index of the step just finished
    head: Head  # the head it removed
    score: float
    accuracy: float
    auroc: float
    candidate_scores: torch.Tensor  # (L, H) float64, NaN where not a candidate
    seconds: float  # this step's compute time
    elapsed: float  # seconds since the call started
    result: GreedyResult  # the partial result, this step included
