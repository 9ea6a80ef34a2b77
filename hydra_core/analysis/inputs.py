"""From data-set objects to the tensors the analyses take: the thin layer between
:mod:`hydra_core.data` and the search/importance/representation functions."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hydra_core.data.benchmark import Benchmark


@dataclass(frozen=True)
class SearchInputs:
    """Preprocessed search-split tensors: ID images with labels, and the pooled OOD images."""

    id_x: torch.Tensor  # (N_id, C, H, W) model input
    id_y: torch.Tensor  # (N_id,) int64
    ood_x: torch.Tensor  # (N_ood, C, H, W) model input, OOD search parts pooled and balanced
    ood_per_set: dict[str, torch.Tensor]  # each OOD set's search part, preprocessed

    def to(self, device: torch.device | str) -> SearchInputs:
        return SearchInputs(
            self.id_x.to(device),
            self.id_y.to(device),
            self.ood_x.to(device),
            {k: v.to(device) for k, v in self.ood_per_set.items()},
        )

    def describe(self) -> str:
        sets = ", ".join(self.ood_per_set)
        return f"{len(self.id_x)} ID + {len(self.ood_x)} OOD search images ({sets})"


def search_inputs(preprocess, benchmark: Benchmark, *, n_ood: int | None = None) -> SearchInputs:
    """The search split of ``benchmark`` run through ``preprocess`` (a LoadedModel's).

    Args:
        n_ood: size of the pooled OOD set (default: as many as ID search images, balanced across the
            OOD sets, or fewer when their search parts are smaller).
    """
    n_id = len(benchmark.id_search)
    smallest = min(len(s) for s in benchmark.ood_search)
    n_ood = n_ood or min(n_id, smallest * len(benchmark.ood_search))
    return SearchInputs(
        id_x=preprocess(benchmark.id_search.images),
        id_y=benchmark.id_search.labels,
        ood_x=preprocess(benchmark.pooled_ood_search(n_ood).images),
        ood_per_set={s.name: preprocess(s.images) for s in benchmark.ood_search},
    )
