"""The fast path of the greedy head search for a model whose heads sit in several towers (CLIP's
image and text towers pruned jointly, the paper's D.3).

The towers meet only at the end (:meth:`~hydra_core.models.family.ModelFamily.join_towers`:
CLIP's logits are the cosines of the image embeddings and the class embeddings the text tower
makes of the prompts), so removing a head of one tower changes only that tower's outputs. Each
tower gets its own :class:`~hydra_core.analysis._shares.ShardedSuffixEvaluator` on its own
inputs (the images; the prompts), which keeps that tower's outputs under the current mask and
gives its candidates' outputs; a candidate's logits join its tower's candidate outputs with the
other towers' current ones. A text candidate thus costs the text tower's suffix on the prompts
and one matrix product, never a pass over the images.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator

import torch
from torch import nn

from hydra_core.analysis._shares import ShardedSuffixEvaluator, Unit
from hydra_core.models.adapter import family_of
from hydra_core.types import Head


class TowersEvaluator:
    """Logits of a towered model under the current (joint) head mask and under each one-head-more
    ablation, with the interface of :class:`ShardedSuffixEvaluator` (layers and heads in the
    joint layout).

    Args:
        model: a model whose family gives :meth:`~hydra_core.models.family.ModelFamily.towers`.
        inputs: (S, ...) the model's inputs (the first tower's), on the model's device.
        pairs_per_pass: as for :class:`~hydra_core.analysis._suffix.SuffixEvaluator`, per tower.
    """

    def __init__(
        self, model: nn.Module, inputs: torch.Tensor, *, pairs_per_pass: int | None = None
    ) -> None:
        self.model = model
        self.family = family_of(model)
        towers = self.family.towers(model)
        self.evaluators = [
            ShardedSuffixEvaluator(
                tower.model,
                inputs if tower.inputs is None else tower.inputs.to(inputs.device),
                pairs_per_pass=pairs_per_pass,
            )
            for tower in towers
        ]
        self.offsets, start = [], 0
        for evaluator in self.evaluators:
            self.offsets.append(start)
            start += len(evaluator.kept)
        # a unit's cost in the first tower's blocks-over-every-token (see _shares)
        first = self.evaluators[0]
        self.scales = [
            e.num_samples * e.tokens / (first.num_samples * first.tokens) for e in self.evaluators
        ]
        self.logits = self._join()

    def _join(self, tower: int | None = None, outputs: torch.Tensor | None = None) -> torch.Tensor:
        """The logits from every tower's current outputs, tower ``tower``'s replaced by
        ``outputs`` (its candidates' (c, S_k, D)) when given: (S, C) or (c, S, C)."""
        current = [e.logits for e in self.evaluators]
        if tower is not None:
            current[tower] = outputs
        return self.family.join_towers(self.model, current)

    def _local(self, layer: int) -> tuple[int, int]:
        """(tower index, layer within the tower) of a joint-layout layer."""
        for k in reversed(range(len(self.offsets))):
            if layer >= self.offsets[k]:
                return k, layer - self.offsets[k]
        raise ValueError(f"layer {layer} is in no tower")

    @property
    def kept(self) -> list[list[int]]:
        """The original indices of the heads each layer keeps, joint layout."""
        return [heads for e in self.evaluators for heads in e.kept]

    # --- the current mask -------------------------------------------------------------------

    def set_removed(self, heads: list[Head]) -> None:
        """Switch off ``heads`` (joint layer, head) permanently, all at once (resuming)."""
        per_tower: dict[int, list[Head]] = {}
        for layer, head in heads:
            k, local = self._local(layer)
            per_tower.setdefault(k, []).append((local, head))
        for k, local_heads in per_tower.items():
            self.evaluators[k].set_removed(local_heads)
        if heads:
            self.logits = self._join()

    def remove(self, layer: int, head: int) -> torch.Tensor:
        """Switch off one more head permanently; returns the new logits (S, C)."""
        k, local = self._local(layer)
        self.evaluators[k].remove(local, head)
        self.logits = self._join()
        return self.logits

    # --- candidates -------------------------------------------------------------------------

    def units(self) -> list[Unit]:
        """Every tower's units (its passes), in the joint layout, costs on one scale."""
        found = []
        for k, evaluator in enumerate(self.evaluators):
            offset, scale = self.offsets[k], self.scales[k]
            for unit in evaluator.units():
                heads = tuple((layer + offset, head) for layer, head in unit.heads)
                found.append(Unit(heads, unit.cost * scale))
        return found

    def candidate_logits(
        self,
        should_stop: Callable[[], bool] | None = None,
        heads: Collection[Head] | None = None,
    ) -> Iterator[tuple[list[Head], torch.Tensor]]:
        """Per layer of every tower: (its candidates in the joint layout, logits (c, S, C) with
        each ablated on its own); ``heads``: only these (whole :meth:`units`)."""
        for k, evaluator in enumerate(self.evaluators):
            offset, count = self.offsets[k], len(evaluator.kept)
            local = None
            if heads is not None:
                local = {(i - offset, h) for i, h in heads if offset <= i < offset + count}
                if not local:
                    continue
            for found, outputs in evaluator.candidate_logits(should_stop, local):
                joint = [(layer + offset, head) for layer, head in found]
                yield joint, self._join(k, outputs)


def fast_evaluator(
    model: nn.Module, inputs: torch.Tensor, *, pairs_per_pass: int | None
) -> ShardedSuffixEvaluator | TowersEvaluator:
    """The fast path's evaluator of ``model``: one per tower for a model with towers."""
    if family_of(model).towers(model):
        return TowersEvaluator(model, inputs, pairs_per_pass=pairs_per_pass)
    return ShardedSuffixEvaluator(model, inputs, pairs_per_pass=pairs_per_pass)
