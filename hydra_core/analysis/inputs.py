"""From data-set objects to the tensors the analyses take: the thin layer between
:mod:`hydra_core.data` and the search/importance/representation functions.

Two kinds of analyses, two kinds of inputs: those that *select* heads (greedy search, single-head
importance, Taylor, member masks) take :func:`search_inputs`, the ID search part and the
search-role OOD sets; those that *describe* the reported distributions (per-head representations,
dense vs circuit) take :func:`report_sample`, a fixed sample of the ID report part and of every
report-role OOD set."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hydra_core.data.benchmark import Benchmark
from hydra_core.data.images import take

#: images per set in :func:`report_sample` (enough for stable centroids and a readable scatter)
REPORT_SAMPLE = 512


@dataclass(frozen=True)
class SearchInputs:
    """Preprocessed search tensors: ID images with labels, and the pooled search-role OOD sets."""

    id_x: torch.Tensor  # (N_id, C, H, W) model input
    id_y: torch.Tensor  # (N_id,) int64
    ood_x: torch.Tensor  # (N_ood, C, H, W) model input, the OOD search sets pooled and balanced
    ood_per_set: dict[str, torch.Tensor]  # each search-role OOD set, preprocessed
    #: the OOD search set each row of ``ood_x`` comes from (None: one set, or unknown)
    ood_sets: tuple[str, ...] | None = None

    def to(self, device: torch.device | str) -> SearchInputs:
        return SearchInputs(
            self.id_x.to(device),
            self.id_y.to(device),
            self.ood_x.to(device),
            {k: v.to(device) for k, v in self.ood_per_set.items()},
            self.ood_sets,
        )

    def ood_strata(self) -> tuple[str, ...]:
        """The OOD set of each row of ``ood_x`` (all ``"ood"`` when unknown): resamples draw each
        OOD set within itself."""
        return self.ood_sets if self.ood_sets is not None else ("ood",) * len(self.ood_x)

    def describe(self) -> str:
        sets = ", ".join(self.ood_per_set)
        return f"{len(self.id_x)} ID + {len(self.ood_x)} OOD search samples ({sets})"


def search_inputs(preprocess, benchmark: Benchmark, *, n_ood: int | None = None) -> SearchInputs:
    """The search data of ``benchmark`` run through ``preprocess`` (a LoadedModel's; it takes a
    set's ``inputs``, images or, for a text model's tokenizer, a tuple of strings): the ID
    search part and the search-role OOD sets, never a report-role set (under the ``"halves"``
    protocol, the search halves of the report sets).

    Args:
        n_ood: size of the pooled OOD set (default: as many as ID search images, balanced across the
            search sets, or fewer when they are smaller).
    """
    n_id = len(benchmark.id_search)
    smallest = min(len(s) for s in benchmark.ood_search)
    sets = len(benchmark.ood_search)
    # at least one item of every OOD search set, however few ID items are searched on
    n_ood = n_ood or max(min(n_id, smallest * sets), min(sets, smallest * sets))
    return SearchInputs(
        id_x=preprocess(benchmark.id_search.inputs),
        id_y=benchmark.id_search.labels,
        ood_x=preprocess(benchmark.pooled_ood_search(n_ood).inputs),
        ood_per_set={s.name: preprocess(s.inputs) for s in benchmark.ood_search},
        ood_sets=benchmark.pooled_ood_search_sets(n_ood),
    )


@dataclass(frozen=True)
class ReportSample:
    """Preprocessed samples of the report data: ID images and each report-role OOD set."""

    id_x: torch.Tensor  # (N_id, C, H, W) model input
    ood_per_set: dict[str, torch.Tensor]  # report-role OOD set name -> (N, C, H, W) model input

    def to(self, device: torch.device | str) -> ReportSample:
        return ReportSample(
            self.id_x.to(device), {k: v.to(device) for k, v in self.ood_per_set.items()}
        )

    def describe(self) -> str:
        sets = ", ".join(f"{len(x)} {name}" for name, x in self.ood_per_set.items())
        return f"{len(self.id_x)} ID report samples and OOD report samples ({sets})"


def report_sample(
    preprocess, benchmark: Benchmark, *, n: int | None = REPORT_SAMPLE
) -> ReportSample:
    """At most ``n`` images of the ID report part and of every report-role OOD set (a fixed
    :func:`~hydra_core.data.images.take` sample; all when None), run through ``preprocess``:
    what the analyses that describe the reported distributions take."""
    return ReportSample(
        id_x=preprocess(take(benchmark.id_report, n, purpose="describe").inputs),
        ood_per_set={
            s.name: preprocess(take(s, n, purpose="describe").inputs) for s in benchmark.ood_report
        },
    )
