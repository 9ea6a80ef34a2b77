"""A greedy step's candidates cut into shares for the processes of a distributed job.

A step's candidates are listed as *units* in (layer, head) order, each with an estimated cost;
:func:`hydra_core.distributed.split` gives every process a contiguous run of units of about equal
cost, and the process scores only the heads of its units. Contiguous runs keep the layers a
process touches few: each process that scores some of a layer's heads computes that layer's shared
part (attention of the kept heads, first MLP matmul) once more.

**Cost of a candidate** (fast path): the blocks it recomputes, a block over every token counting 1.
Its own block counts 1/2 (the attention is shared with the layer's other candidates and, for a
block the MLP fold applies to (timm, OpenCLIP, BERT-family), the first MLP matmul is a rank-d_k
update; 1 where no fold applies), every later block 1, and a last block that computes the class
token alone 1/tokens. On the default model (6 layers, 17 tokens; 256 images, one thread;
``bench/distributed.py --costs``) a candidate of layers 0..5 took 166, 114, 85, 58, 20.5 and
1.4 ms: 32 to 37 ms per unit of this model (48 for the last layer's, whose candidates cost almost
nothing). A weight of L - l instead would give the late layers several times their share: two
processes would split 61/39 instead of 50/50, capping the speed-up at 1.65x instead of 2.0x.
Under the plain method every candidate is one full forward: cost 1.

**Units never cut a batched pass.** The fast path scores a layer's candidates in passes of a fixed
group of heads per chunk of samples; a unit is one such group, so every pass a process runs has
exactly the inputs it has in a single process and the scores are bit-identical to a single-process
search (same order, same numbers), not merely equal to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

import torch

from hydra_core.analysis._suffix import Stopped, SuffixEvaluator
from hydra_core.types import Head


@dataclass(frozen=True)
class Unit:
    """Candidates that one process scores together, and their estimated cost."""

    heads: tuple[Head, ...]
    cost: float


class ShardedSuffixEvaluator(SuffixEvaluator):
    """A :class:`SuffixEvaluator` that scores any set of whole :meth:`units` (or of heads)."""

    def candidate_cost(self, layer: int) -> float:
        """The estimated cost of ablating one head of ``layer`` (module docstring)."""

        def block(index: int) -> float:
            return 1.0 if self._query_rows(index) is None else 1.0 / self.tokens

        own = 0.5 if self.folds[layer] is not None else 1.0
        return own * block(layer) + sum(block(i) for i in range(layer + 1, self.last_layer + 1))

    def units(self) -> list[Unit]:
        """This step's candidates, one unit per group of heads scored in one pass."""
        found = []
        for layer, kept in enumerate(self.kept):
            if not kept:
                continue
            group, cost = self.passes(layer)[1], self.candidate_cost(layer)
            for g in range(0, len(kept), group):
                heads = tuple((layer, h) for h in kept[g : g + group])
                found.append(Unit(heads, cost * len(heads)))
        return found

    def candidate_logits(
        self,
        should_stop: Callable[[], bool] | None = None,
        heads: Collection[Head] | None = None,
    ) -> Iterator[tuple[list[Head], torch.Tensor]]:
        """:meth:`SuffixEvaluator.candidate_logits`, for ``heads`` alone (all candidates when
        None). Whole :meth:`units` are scored in their own passes (bit-identical to a step that
        scores every candidate); any other set of a layer's heads (the guided search's chosen
        candidates) one head per pass, equal to those up to float rounding and the same however
        the heads are shared among processes."""
        if heads is None:
            yield from super().candidate_logits(should_stop)
            return
        classes = self.logits.shape[-1]
        for layer, kept in enumerate(self.kept):
            chosen = [i for i, h in enumerate(kept) if (layer, h) in heads]
            if not chosen:
                continue
            chunks, group = self.passes(layer)
            groups = sorted({i // group * group for i in chosen})
            position = torch.arange(len(kept), device=self.device)
            if sum(min(group, len(kept) - g) for g in groups) == len(chosen):  # whole units
                parts = [position[g : g + group] for g in groups]
            else:  # one head per pass: its scores do not depend on which heads share a process
                picked = torch.tensor(chosen, device=self.device)
                parts = [picked[i : i + 1] for i in range(len(chosen))]
            originals = torch.tensor(kept, device=self.device)
            logits = self.logits.new_empty(len(kept), self.num_samples, classes)
            for chunk in chunks:
                shared = self._shared(layer, self.xs[layer][chunk], self._context(chunk))
                for part in parts:
                    if should_stop is not None and should_stop():
                        raise Stopped
                    logits[part, chunk] = self._candidates_pass(
                        layer, shared, part, originals[part]
                    )
            yield [(layer, kept[i]) for i in chosen], self._caller_order(logits[chosen])
