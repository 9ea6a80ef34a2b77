"""What every report prunes: head budgets derived from the model and a configuration
(:class:`Budgets`), the members of the Hydra variants the reports build (:func:`hydra_members`,
by label), and what the pruning stage of :class:`~hydra_core.experiment.pipeline.Pipeline` gives
(:class:`Pruning`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hydra_core.errors import choice
from hydra_core.hydra.members import seed_sampled_members
from hydra_core.masks import MemberMask
from hydra_core.models.adapter import HeadLayout

if TYPE_CHECKING:
    from hydra_core.analysis.greedy import GreedyResult

#: the ensemble labels of the Hydra variants the reports build: Hydra (Circ) is the paper's
#: method, one circuit per criterion (CircAcc, CircOOD, CircAvg; B.2 question 3, D.3); the B.5
#: ablation draws its members by seed from CircAvg's ranking alone ("we assume only one circuit to
#: be available"); Hydra (Taylor) draws them from the Taylor ranking
HYDRA_CIRC = "Hydra (Circ)"
HYDRA_CIRC_B5 = "Hydra (Circ, B.5)"
HYDRA_TAYLOR = "Hydra (Taylor)"


@dataclass
class Budgets:
    """Head budgets derived from the model and the configuration."""

    removed_per_layer: int | tuple[int, ...]  # heads Taylor removes in every layer (or in each)
    budget: int  # heads every circuit and member removes
    pool: int  # members draw their pruned heads from this many least useful
    total: int  # heads of the model

    @classmethod
    def of(cls, layout: HeadLayout, config) -> Budgets:
        """The budgets for a model with this head layout and a configuration with
        ``removed_per_layer`` (None: a third of a layer's heads) and ``pool_fraction``; refuses a
        per-layer count that leaves a layer with no head."""
        per_layer = config.removed_per_layer
        if per_layer is None:
            per_layer = max(1, round(layout.max_heads / 3))
        if not 0 < per_layer < min(layout.num_heads):
            raise ValueError(
                f"{choice('removed_per_layer')} must be between 1 and "
                f"{min(layout.num_heads) - 1} for this model, got {per_layer}"
            )
        budget = per_layer * layout.num_layers
        pool = round(config.pool_fraction * layout.total_heads)
        pool = min(layout.total_heads, max(budget + 1, pool))
        return cls(per_layer, budget, pool, layout.total_heads)


@dataclass
class Pruning:
    """What the pruning stage gives: Taylor's layer-wise member and global ranking, the CircAvg
    circuit as a member, and the members by label: Hydra (Circ) (when the searches of the other
    criteria were given), Hydra (Circ, B.5) and Hydra (Taylor)."""

    taylor: MemberMask
    taylor_rank: list[tuple[int, int]]
    circavg: MemberMask
    members: dict[str, list[MemberMask]]
    circuits: dict[str, GreedyResult] = field(default_factory=dict)  # by objective, when searched


def hydra_members(
    circ_ranking: Sequence[tuple[int, int]],
    taylor_rank: Sequence[tuple[int, int]],
    layout: HeadLayout,
    budgets: Budgets,
    seeds: Sequence[int],
) -> dict[str, list[MemberMask]]:
    """The Hydra (Circ, B.5) and Hydra (Taylor) members: one per seed, each pruning the budget's
    heads drawn from the pool of least useful heads of the CircAvg or Taylor ranking."""
    rankings = {HYDRA_CIRC_B5: ("CircAvg", circ_ranking), HYDRA_TAYLOR: ("Taylor", taylor_rank)}
    return {
        label: seed_sampled_members(
            ranking,
            layout,
            budget=budgets.budget,
            pool=budgets.pool,
            seeds=seeds,
            ranking_name=name,
        )
        for label, (name, ranking) in rankings.items()
    }
