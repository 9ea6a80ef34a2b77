"""The image report's stages beside the pipeline's: the fine-tuned systems, the systems Table 7
times, Table 5's distances, Deep Ensembles when trained copies exist, the setup (with the efficient
ensembles': :mod:`~hydra_core.report.efficient_ensembles`), the overlaps."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import torch
from torch import nn

from hydra_core.baselines.deep_ensembles import deep_ensemble_for
from hydra_core.baselines.systems import MC_DROPOUT
from hydra_core.data.fashion_mnist import load_fashion_mnist
from hydra_core.evaluate import evaluate_model
from hydra_core.experiment.pipeline import Pipeline
from hydra_core.experiment.pruning import Budgets
from hydra_core.experiment.results import SystemsReport
from hydra_core.experiment.run import SystemInfo, system_name
from hydra_core.hydra.cost import parameter_breakdown
from hydra_core.hydra.finetune import finetune_member
from hydra_core.hydra.members import member_overlap
from hydra_core.hydra.systems import Hydra, Single
from hydra_core.masks import MemberMask
from hydra_core.outputs import write_csv
from hydra_core.report.efficient_ensembles import efficient_facts
from hydra_core.report.image_config import ReportConfig
from hydra_core.report.tables import HYDRA_CIRC, HYDRA_CIRC_FT, HYDRA_TAYLOR, fused

if TYPE_CHECKING:
    from hydra_core.data.benchmark import Benchmark
    from hydra_core.zoo.registry import LoadedModel


def finetuned_systems(
    systems: SystemsReport,
    run: Pipeline,
    masks: Mapping[str, torch.Tensor],
    variants: Sequence[tuple[str, Sequence[MemberMask], Sequence[int] | None]],
    config: ReportConfig,
) -> SystemsReport:
    """``systems`` with the fine-tuned Taylor and CircAvg models and Hydra variants added.

    ``variants`` are (label, members, fine-tuning seeds) triples; each is fine-tuned, fused and
    evaluated as a :class:`~hydra_core.hydra.systems.Hydra` system.
    """
    ft, loaded = config.finetune, run.loaded
    train_set = load_fashion_mnist("train")  # read once; each run takes its subset
    for name in ("Taylor", "CircAvg"):
        member = finetune_member(
            loaded.model,
            masks[name],
            ft,
            preprocess=loaded.preprocess,
            train_set=train_set,
            name=name,
            device=run.device,
            cache=run.cache,
            progress=run.fine_tune_progress(name),
        )
        evaluation = evaluate_model(
            member.model,
            loaded.preprocess,
            run.benchmark.id_report,
            run.benchmark.ood_report,
            name=f"{name} (fine-tuned)",
            device=run.device,
            cache=run.cache,
            batch_size=config.batch_size,
        )
        systems.add_system(
            f"{name} (fine-tuned)",
            evaluation,
            SystemInfo("pruned", str(int(masks[name].sum())), models=[member.model]),
        )
    for label, members, ft_seeds in variants:
        hydra = Hydra(members, label, ft, ft_seeds, train_set)
        systems = systems.merge(run.evaluate([Single(), hydra], batch_size=config.batch_size))
    return systems


def cost_systems(
    systems: SystemsReport,
    circ_members: Sequence[MemberMask],
    deep: bool,
    finetuned: Sequence[str],
    others: Sequence[str] = (),
) -> list[str]:
    """The systems Table 7 times: one of each kind, a single Hydra (Circ) member, and ``others``
    (the efficient ensembles) where evaluated."""
    names = [
        "single",
        "Taylor",
        "CircAvg",
        system_name(HYDRA_CIRC, "member", circ_members[0].name),
        system_name(HYDRA_CIRC, "unfused"),
        fused(HYDRA_CIRC),
        fused(HYDRA_TAYLOR),
    ]
    if HYDRA_CIRC_FT in finetuned:
        names += [system_name(HYDRA_CIRC_FT, "unfused"), fused(HYDRA_CIRC_FT)]
    if deep:
        names.append("Deep Ensembles")
    names += list(others)
    return [n for n in names if n in systems.info]


def distances_table(
    loaded: LoadedModel, benchmark: Benchmark, keep: torch.Tensor, config: ReportConfig
) -> pd.DataFrame:
    """Table 5: centroid distances of the last layer's heads, dense against ``keep``, in both
    conventions (``average_over``: ours, the kept heads; the paper's, all heads)."""
    from hydra_core.analysis.representations import distance_table_dense_vs_circuit

    n = config.distance_samples
    id_x = loaded.preprocess(benchmark.id_report.images[:n])
    ood = {s.name: loaded.preprocess(s.images[:n]) for s in benchmark.ood_report}
    frames = [
        distance_table_dense_vs_circuit(
            loaded.model, keep, id_x, ood, layer=-1, batch_size=config.batch_size, average_over=how
        ).assign(heads_averaged=how)
        for how in ("all", "kept")
    ]
    return pd.concat(frames, ignore_index=True)


#: the Deep Ensembles row, the reference of the "Hydra vs Deep Ensembles" differences
DEEP_ENSEMBLES = "Deep Ensembles"


#: the summary columns the paired differences to the single model are reported on
DIFFERENCE_COLUMNS = ("accuracy", "nll", "ece", "near_auroc", "far_auroc", "all_auroc")


def deep_ensemble_of(config: ReportConfig, run: Pipeline) -> list[nn.Module] | None:
    """The Deep Ensemble's models when asked for and trained copies exist (a line says why not)."""
    if not config.deep_ensemble:
        return None
    return deep_ensemble_for(config.model, log=lambda reason: run.log(f"{run.tag} {reason}"))


def image_setup(
    run: Pipeline,
    config: ReportConfig,
    budgets: Budgets,
    members: Mapping[str, Sequence[MemberMask]],
    deep: Sequence[nn.Module] | None,
    systems: SystemsReport,
) -> dict:
    """The run's description (report.json's ``setup``): what ran, on what, where, how long;
    ``protocol`` says which images selected heads and which were reported, and the seeds."""
    m = len(config.seeds)
    seeds = {
        "pruning": [[r * m + s for s in range(m)] for r in range(config.repeats)],
        "finetune_batch_order": list(range(config.repeats)),
        "search_subsample": [f"search-repeat-{r}" for r in range(1, config.repeats)],
        "bootstrap": {"n_boot": 1000, "seed": 0, "level": 0.95},
    }
    hydra = systems.info.get(fused(HYDRA_CIRC))
    setup = run.setup(None, budgets, seeds, members)
    setup.update(
        parameters={
            "single": parameter_breakdown(run.loaded.model),
            fused(HYDRA_CIRC): None if hydra is None else parameter_breakdown(hydra.models[0]),
        },
        pruning_seeds=list(config.seeds),
        config={k: v for k, v in asdict(config).items() if k != "finetune"},
        finetune=None if config.finetune is None else asdict(config.finetune),
        deep_ensemble_members=0 if deep is None else len(deep),
        mc_dropout_skipped=systems.setup.get("skipped", {}).get(MC_DROPOUT),
        efficient_ensembles=efficient_facts(config, systems),
    )
    return run.finish(setup)


def write_overlaps(out: Path, members: Mapping[str, Sequence[MemberMask]]) -> None:
    """One CSV per ensemble for its members' pairwise Jaccard and per-layer overlap."""
    for label, ms in members.items():
        o = member_overlap(ms)
        # Hydra (Circ, B.5): hydra_circ_b_5
        stem = "_".join(re.findall(r"[a-z0-9]+", label.lower()))
        write_csv(out / f"overlap_{stem}_jaccard.csv", o["jaccard"])
        write_csv(out / f"overlap_{stem}_per_layer.csv", o["per_layer"])
