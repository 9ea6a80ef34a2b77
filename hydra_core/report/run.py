"""Run the report: load, search, prune, fine-tune, evaluate, time; then write every file.

:func:`run_report` does the work in stages (each logged with its wall time) and hands the results
to :func:`~hydra_core.report.tables.report_tables` and
:func:`~hydra_core.report.markdown.markdown_report`; ``report.json`` and the CSVs are written here.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import torch
from torch import nn

from hydra_core.baselines.deep_ensembles import deep_ensemble_for
from hydra_core.cache import DiskCache
from hydra_core.data.fashion_mnist import load_fashion_mnist
from hydra_core.errors import InputError
from hydra_core.evaluate import evaluate_model, nest_intervals, resolve_device
from hydra_core.hydra.cost import parameter_breakdown
from hydra_core.hydra.experiment import evaluate_systems
from hydra_core.hydra.finetune import FinetuneConfig, finetune_member
from hydra_core.hydra.members import (
    CIRCUIT_NAMES,
    circuit_member,
    member_overlap,
    seed_sampled_members,
    taylor_member,
    taylor_ranking,
)
from hydra_core.hydra.systems import (
    SystemInfo,
    SystemsReport,
    machine_description,
    system_name,
)
from hydra_core.masks import MemberMask, save_masks
from hydra_core.models.adapter import HeadLayout, head_layout
from hydra_core.paths import REPO_DIR
from hydra_core.report.markdown import markdown_report
from hydra_core.report.tables import (
    HYDRA_CIRC,
    HYDRA_CIRC_FT,
    HYDRA_IDENTICAL,
    HYDRA_IDENTICAL_FT,
    HYDRA_IDENTICAL_ORDER_FT,
    HYDRA_TAYLOR,
    HYDRA_TAYLOR_FT,
    fused,
    report_tables,
)
from hydra_core.types import Log, StageProgress

if TYPE_CHECKING:
    from hydra_core.analysis.greedy import GreedyResult
    from hydra_core.analysis.inputs import SearchInputs
    from hydra_core.data.benchmark import Benchmark
    from hydra_core.models.registry import LoadedModel

DEFAULT_OUT = REPO_DIR / "docs" / "report"


@dataclass(frozen=True)
class ReportConfig:
    """What the report runs.

    The defaults are sized for about half an hour on two CPU cores the first time (most of it the
    three greedy searches, about 24 steps x 72 candidates x 512 images each; they are cached, as
    are fine-tuned weights and predictions, so a second run takes a few minutes). Larger
    ``n_search`` / ``n_report`` give less noisy rankings and tables at a proportional cost.

    Args:
        model: model source (see :func:`~hydra_core.models.registry.load_model`).
        n_search: images per search part (ID and each OOD set): head selection only; the greedy
            search scores candidates on n_search ID + n_search pooled OOD images.
        n_report: images per report part: every table (None: the whole Fashion-MNIST test set
            and every image of each report OOD set).
        ood: report OOD sets by name (None: the five default report sets).
        search_ood: search OOD sets by name, used only to select heads and never reported
            (None: the default search sets, see :data:`hydra_core.data.ood.SEARCH_OOD`).
        protocol: ``"dedicated"`` (search sets apart from report sets, the paper's) or
            ``"halves"`` (halves of the report sets, which leaks them into head selection; the
            report says so at the top).
        repeats: how often the seeded systems are repeated (search subsample, pruning seeds and
            fine-tuning batch order change together); their mean ± std is Table 12.
        loso_set: the report set left out of a CircOOD search over halves of the other report
            sets (the transfer table's leave-one-set-out run); None skips it.
        removed_per_layer: heads Taylor removes per layer; every circuit and every member removes
            as many heads in all (None: a third of the heads of a layer, rounded: 4 of 12, i.e. 8
            kept as in the paper's ViT-B experiments).
        pool_fraction: members prune their heads from the ``pool_fraction`` least useful share of
            all heads (the paper draws 48 of the 100 least useful of 144 heads: about 2/3).
        seeds: one pruning seed per member (M = len(seeds); the paper uses M = 3).
        taylor_samples: ID search images the Taylor scores use.
        finetune: how members and pruned models are fine-tuned (None: zero-shot only).
        deep_ensemble: include Deep Ensembles when trained copies of the model exist.
        distance_samples: images per set for the centroid distances (Table 5).
        device, batch_size: where and in what batches to predict.
        latency_batch, latency_repeats: images per timed forward and timed calls per system.
    """

    model: str = "default"
    n_search: int | None = 256
    n_report: int | None = None
    ood: tuple[str, ...] | None = None
    search_ood: tuple[str, ...] | None = None
    protocol: str = "dedicated"
    repeats: int = 3
    loso_set: str | None = "mnist"
    removed_per_layer: int | None = None
    pool_fraction: float = 2 / 3
    seeds: tuple[int, ...] = (0, 1, 2)
    taylor_samples: int | None = 256
    finetune: FinetuneConfig | None = FinetuneConfig()
    deep_ensemble: bool = True
    distance_samples: int | None = 1000
    device: str = "auto"
    batch_size: int = 256
    latency_batch: int = 32
    latency_repeats: int = 20

    @classmethod
    def quick(cls, **overrides) -> ReportConfig:
        """Small subsets and short fine-tuning: every section in a couple of minutes."""
        settings = dict(
            n_search=64,
            n_report=200,
            repeats=2,
            taylor_samples=64,
            distance_samples=200,
            latency_repeats=3,
            finetune=FinetuneConfig(n_train=256, steps=4, batch_size=64, warmup_steps=1),
        )
        settings.update(overrides)
        return cls(**settings)


@dataclass
class Budgets:
    """Head budgets derived from the model and the configuration."""

    removed_per_layer: int  # heads Taylor removes in every layer
    budget: int  # heads every circuit and member removes
    pool: int  # members draw their pruned heads from this many least useful
    total: int  # heads of the model

    @classmethod
    def of(cls, layout: HeadLayout, config: ReportConfig) -> Budgets:
        """The budgets for a model with this head layout; refuses a per-layer count that leaves
        a layer with no head."""
        per_layer = config.removed_per_layer
        if per_layer is None:
            per_layer = max(1, round(layout.max_heads / 3))
        if not 0 < per_layer < min(layout.num_heads):
            raise ValueError(
                f"removed_per_layer must be between 1 and "
                f"{min(layout.num_heads) - 1}, got {per_layer}"
            )
        budget = per_layer * layout.num_layers
        pool = round(config.pool_fraction * layout.total_heads)
        pool = min(layout.total_heads, max(budget + 1, pool))
        return cls(per_layer, budget, pool, layout.total_heads)


class _Stages:
    """Wall time of each stage of the run, and log lines as they finish; when the run began."""

    def __init__(self, log: Log) -> None:
        self.seconds: dict[str, float] = {}
        self.log = log
        self.started = time.perf_counter()
        self.created = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")

    def total(self) -> float:
        """Seconds since the run began."""
        return time.perf_counter() - self.started

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        self.log(f"[report] {name} ...")
        yield
        self.seconds[name] = time.perf_counter() - start
        self.log(f"[report] {name}: {self.seconds[name]:.0f} s")


def open_run(out: str | Path, cache: DiskCache | None, log: Log) -> tuple[Path, DiskCache, _Stages]:
    """What every report starts with: its output folder (created), the cache (the default one
    when None) and the clock of its stages."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return out, cache or DiskCache(), _Stages(log)


def run_report(
    config: ReportConfig = ReportConfig(),
    out: str | Path = DEFAULT_OUT,
    *,
    cache: DiskCache | None = None,
    progress: StageProgress | None = None,
    log: Log = print,
) -> dict:
    """Run every analysis and write ``report.md``, ``report.json`` and the CSVs into ``out``.

    Returns the key numbers (also in ``report.json``): per table, the rows written.
    """
    from hydra_core.analysis.inputs import search_inputs
    from hydra_core.data.benchmark import default_benchmark
    from hydra_core.models.registry import load_model

    out, cache, stages = open_run(out, cache, log)
    device = resolve_device(config.device)

    with stages("load model and data"):
        loaded = load_model(config.model)
        loaded.model.to(device).eval()
        benchmark = default_benchmark(
            n_search=config.n_search,
            n_report=config.n_report,
            ood=list(config.ood) if config.ood else None,
            search_ood=list(config.search_ood) if config.search_ood else None,
            protocol=config.protocol,
        )
        if benchmark.protocol_note():
            log(f"[report] warning: {benchmark.protocol_note()}")
        inputs = search_inputs(loaded.preprocess, benchmark).to(device)
    layout = head_layout(loaded.model)
    budgets = Budgets.of(layout, config)
    seeds = list(config.seeds)

    circuits = _greedy_circuits(loaded, inputs, budgets, config, cache, progress, stages)
    with stages("Taylor scores and layer-wise pruning"):
        taylor = taylor_member(
            loaded.model,
            inputs,
            per_layer=budgets.removed_per_layer,
            samples=config.taylor_samples,
            batch_size=config.batch_size,
        )
        taylor_rank = taylor_ranking(
            loaded.model, inputs, samples=config.taylor_samples, batch_size=config.batch_size
        )

    masks = {"Taylor": taylor.keep}
    masks.update({CIRCUIT_NAMES[o]: r.keep_mask() for o, r in circuits.items()})
    members = _members(circuits["avg"].ranking(), taylor_rank, layout, budgets, seeds)
    circ_members, taylor_members = members[HYDRA_CIRC], members[HYDRA_TAYLOR]
    circavg = circuit_member(
        circuits["avg"].ranking(), layout, budget=budgets.budget, ranking_name="CircAvg"
    )
    identical = [
        MemberMask(f"CircAvg copy {i}", "the CircAvg circuit", circavg.keep)
        for i in range(len(seeds))
    ]
    identity = loaded.identity()
    save_masks(out / "members.json", [*circ_members, *taylor_members], identity)

    deep = (
        deep_ensemble_for(config.model, log=lambda reason: log(f"[report] {reason}"))
        if config.deep_ensemble
        else None
    )
    common = _evaluation_options(device, cache, progress, config.batch_size)
    with stages("evaluate zero-shot systems"):
        systems = evaluate_systems(
            loaded,
            benchmark,
            circ_members,
            label=HYDRA_CIRC,
            pruned=masks,
            deep_ensemble=deep,
            **common,
        )
        systems = systems.merge(
            evaluate_systems(loaded, benchmark, taylor_members, label=HYDRA_TAYLOR, **common)
        )
        systems = systems.merge(
            evaluate_systems(loaded, benchmark, identical, label=HYDRA_IDENTICAL, **common)
        )

    finetuned_labels = []
    if config.finetune is not None:
        variants = [  # (label, members, fine-tuning seeds: None = the same batch order for all)
            (HYDRA_TAYLOR_FT, taylor_members, None),
            (HYDRA_CIRC_FT, circ_members, None),
            (HYDRA_IDENTICAL_ORDER_FT, identical, seeds),
            (HYDRA_IDENTICAL_FT, identical, None),
        ]
        with stages("fine-tune and evaluate"):
            systems = _finetuned_systems(
                systems, loaded, benchmark, masks, variants, config, device, cache, progress
            )
        finetuned_labels = [label for label, _, _ in variants]

    with stages("cost and latency"):
        images = loaded.preprocess(benchmark.id_report.images[: config.latency_batch]).to(device)
        cost_systems = _cost_systems(systems, circ_members, deep is not None, finetuned_labels)
        systems.measure(images, systems=cost_systems, repeats=config.latency_repeats)

    with stages("centroid distances (Table 5)"):
        table5 = _table5(loaded, benchmark, masks["CircOOD"], config)

    with stages(f"seeded systems over {config.repeats} repeats (Table 12)"):
        repeated = _repeats(systems, loaded, benchmark, budgets, config, device, cache, progress)
    with stages("transfer of the circuits' AUROC gain"):
        transfer = _transfer_table(systems, loaded, benchmark, budgets, config, device, cache)

    tables = report_tables(systems, table5, circuits, deep is not None, finetuned_labels)
    tables["table12_seeds"] = repeated
    tables["transfer"] = transfer
    tables["differences_to_single"] = systems.differences("single", list(DIFFERENCE_COLUMNS))
    overlap = {
        "Hydra (Circ)": member_overlap(circ_members),
        "Hydra (Taylor)": member_overlap(taylor_members),
    }
    models = {name: info.models[0] for name, info in systems.info.items() if info.models}
    setup = _setup(
        config,
        loaded,
        benchmark,
        budgets,
        device,
        stages.seconds,
        stages.total(),
        stages.created,
        deep,
        overlap,
        models,
    )
    _write(out, tables, systems, overlap, setup, finetuned_labels)
    log(f"[report] wrote {out / 'report.md'} ({setup['total_seconds']:.0f} s)")
    return {"setup": setup, **{k: _records(v) for k, v in tables.items()}}


# --- stages of the run --------------------------------------------------------------------------


def _greedy_circuits(
    loaded: LoadedModel,
    inputs: SearchInputs,
    budgets: Budgets,
    config: ReportConfig,
    cache: DiskCache,
    progress: StageProgress | None,
    stages: _Stages,
) -> dict[str, GreedyResult]:
    """The three greedy searches (CircAvg, CircAcc, CircOOD) by objective, each a stage."""
    from hydra_core.analysis.greedy import greedy_circuit

    circuits = {}
    for objective in ("avg", "acc", "ood"):
        name = CIRCUIT_NAMES[objective]
        with stages(f"greedy search {name} ({budgets.budget} steps)"):
            on_step = (
                None
                if progress is None
                else (
                    lambda step, name=name: progress(
                        f"greedy {name}", step.step + 1, budgets.budget
                    )
                )
            )
            circuits[objective] = greedy_circuit(
                loaded.model,
                inputs.id_x,
                inputs.id_y,
                inputs.ood_x,
                objective=objective,
                budget=budgets.budget,
                batch_size=config.batch_size,
                cache=cache,
                progress=on_step,
            )
    return circuits


def _evaluation_options(
    device: torch.device, cache: DiskCache, progress: StageProgress | None, batch_size: int
) -> dict:
    """Options every ``evaluate_systems`` call of the report shares; latency is timed later."""
    return dict(device=device, cache=cache, progress=progress, latency=False, batch_size=batch_size)


def _finetuned_systems(
    systems: SystemsReport,
    loaded: LoadedModel,
    benchmark: Benchmark,
    masks: Mapping[str, torch.Tensor],
    variants: Sequence[tuple[str, Sequence[MemberMask], Sequence[int] | None]],
    config: ReportConfig,
    device: torch.device,
    cache: DiskCache,
    progress: StageProgress | None,
) -> SystemsReport:
    """``systems`` with the fine-tuned Taylor and CircAvg models and Hydra variants added.

    ``variants`` are (label, members, fine-tuning seeds) triples; each is fine-tuned, fused and
    evaluated as :func:`~hydra_core.hydra.systems.evaluate_systems` does.
    """
    ft = config.finetune
    common = _evaluation_options(device, cache, progress, config.batch_size)
    train_set = load_fashion_mnist("train")  # read once; each run takes its subset
    for name in ("Taylor", "CircAvg"):
        member = finetune_member(
            loaded.model,
            masks[name],
            ft,
            preprocess=loaded.preprocess,
            train_set=train_set,
            name=name,
            device=device,
            cache=cache,
            progress=_member_progress(progress, name),
        )
        evaluation = evaluate_model(
            member.model,
            loaded.preprocess,
            benchmark.id_report,
            benchmark.ood_report,
            name=f"{name} (fine-tuned)",
            device=device,
            cache=cache,
            batch_size=config.batch_size,
        )
        systems.add_system(
            f"{name} (fine-tuned)",
            evaluation,
            SystemInfo("pruned", str(int(masks[name].sum())), models=[member.model]),
        )
    for label, members, ft_seeds in variants:
        systems = systems.merge(
            evaluate_systems(
                loaded,
                benchmark,
                members,
                label=label,
                finetune=ft,
                finetune_seeds=ft_seeds,
                train_set=train_set,
                **common,
            )
        )
    return systems


def _member_progress(
    progress: StageProgress | None, name: str
) -> Callable[[int, int], None] | None:
    """``progress`` for one fine-tuning run, its stage named after the model."""
    if progress is None:
        return None
    return lambda done, total: progress(f"fine-tune {name}", done, total)


def _cost_systems(
    systems: SystemsReport,
    circ_members: Sequence[MemberMask],
    deep: bool,
    finetuned: Sequence[str],
) -> list[str]:
    """The systems Table 7 times: one of each kind, and a single Hydra (Circ) member."""
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
    return [n for n in names if n in systems.info]


def _members(
    circ_ranking: Sequence[tuple[int, int]],
    taylor_rank: Sequence[tuple[int, int]],
    layout: HeadLayout,
    budgets: Budgets,
    seeds: Sequence[int],
) -> dict[str, list[MemberMask]]:
    """The Hydra (Circ) and Hydra (Taylor) members: one per seed, each pruning the budget's
    heads drawn from the pool of least useful heads of the CircAvg or Taylor ranking."""
    rankings = {HYDRA_CIRC: ("CircAvg", circ_ranking), HYDRA_TAYLOR: ("Taylor", taylor_rank)}
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


def _table5(
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


#: the summary columns the paired differences to the single model are reported on
DIFFERENCE_COLUMNS = ("accuracy", "nll", "ece", "near_auroc", "far_auroc", "all_auroc")

#: the seeded systems Table 12 repeats, and the summary columns it reports
SEEDED_METRICS = ("accuracy", "nll", "ece", "near_auroc", "far_auroc", "all_auroc", "ood_mi")


def _repeats(
    systems: SystemsReport,
    loaded: LoadedModel,
    benchmark: Benchmark,
    budgets: Budgets,
    config: ReportConfig,
    device: torch.device,
    cache: DiskCache,
    progress: StageProgress | None,
) -> pd.DataFrame:
    """Table 12: every seeded system over ``config.repeats`` repeats, one row per repeat.

    Repeat 0 is the main run (its rows come from ``systems``). Repeat r > 0 changes every source
    of randomness together: another subsample of the search images (ID and search OOD; the same
    images in another order when ``n_search`` takes them all, which leaves the search unchanged),
    a CircAvg search and Taylor ranking on it, pruning seeds r*M .. r*M + M - 1, and fine-tuning
    batch order r. The report images stay the same, so the spread is the seeds' alone."""
    from hydra_core.analysis.greedy import greedy_circuit
    from hydra_core.analysis.inputs import search_inputs
    from hydra_core.data.images import take
    from hydra_core.data.ood import OOD_SETS, load_ood_set

    layout = head_layout(loaded.model)
    m = len(config.seeds)
    families = [fused(HYDRA_CIRC), fused(HYDRA_TAYLOR), "CircAvg", "Taylor"]
    if config.finetune is not None:
        families += [fused(HYDRA_CIRC_FT), fused(HYDRA_TAYLOR_FT)]
    main = systems.summary().set_index("system")
    rows = [{"repeat": 0, "system": f, **main.loc[f, list(SEEDED_METRICS)]} for f in families]
    common = _evaluation_options(device, cache, progress, config.batch_size)
    train_set = load_fashion_mnist("train") if config.finetune is not None else None
    id_pool = load_fashion_mnist("validation") if config.repeats > 1 else None
    pools = [
        load_ood_set(s.name) if s.name in OOD_SETS and benchmark.protocol == "dedicated" else s
        for s in benchmark.ood_search
    ]
    for r in range(1, config.repeats):
        purpose = f"search-repeat-{r}"
        sub = replace(
            benchmark,
            id_search=take(id_pool, config.n_search, purpose=purpose),
            ood_search=tuple(take(s, config.n_search, purpose=purpose) for s in pools),
        )
        inputs = search_inputs(loaded.preprocess, sub).to(device)
        circ = greedy_circuit(
            loaded.model,
            inputs.id_x,
            inputs.id_y,
            inputs.ood_x,
            objective="avg",
            budget=budgets.budget,
            batch_size=config.batch_size,
            cache=cache,
        )
        options = dict(samples=config.taylor_samples, batch_size=config.batch_size)
        taylor = taylor_member(loaded.model, inputs, per_layer=budgets.removed_per_layer, **options)
        taylor_rank = taylor_ranking(loaded.model, inputs, **options)
        seeds = [r * m + i for i in range(m)]
        members = _members(circ.ranking(), taylor_rank, layout, budgets, seeds)
        pruned = {"CircAvg": circ.keep_mask(), "Taylor": taylor.keep}
        run = evaluate_systems(
            loaded, benchmark, members[HYDRA_CIRC], label=HYDRA_CIRC, pruned=pruned, **common
        )
        run = run.merge(
            evaluate_systems(loaded, benchmark, members[HYDRA_TAYLOR], label=HYDRA_TAYLOR, **common)
        )
        if config.finetune is not None:
            for label, tuned in ((HYDRA_CIRC, HYDRA_CIRC_FT), (HYDRA_TAYLOR, HYDRA_TAYLOR_FT)):
                run = run.merge(
                    evaluate_systems(
                        loaded,
                        benchmark,
                        members[label],
                        label=tuned,
                        finetune=config.finetune,
                        finetune_seeds=[r] * m,
                        train_set=train_set,
                        **common,
                    )
                )
        summary = run.summary().set_index("system")
        rows += [
            {"repeat": r, "system": f, **summary.loc[f, list(SEEDED_METRICS)]} for f in families
        ]
    return pd.DataFrame(rows)


def _transfer_table(
    systems: SystemsReport,
    loaded: LoadedModel,
    benchmark: Benchmark,
    budgets: Budgets,
    config: ReportConfig,
    device: torch.device,
    cache: DiskCache,
) -> pd.DataFrame:
    """How much of the circuits' AUROC gain over the dense model reaches sets the search never
    saw: per report set, AUROC(circuit) - AUROC(single) with its paired 95% interval, for CircOOD
    and CircAvg (searched on the search sets only), and for one leave-one-set-out CircOOD searched
    on halves of the other report sets and measured on the one left out (added to ``systems``)."""
    from hydra_core.analysis.greedy import greedy_circuit
    from hydra_core.data.images import split_in_two

    searched = {
        "CircOOD": ", ".join(benchmark.search_names()),
        "CircAvg": ", ".join(benchmark.search_names()),
    }
    wanted = [(c, s.name) for c in searched for s in benchmark.ood_report]
    if config.loso_set is not None:
        names = [s.name for s in benchmark.ood_report]
        if config.loso_set not in names:
            raise InputError(
                f"loso_set {config.loso_set!r} is not a report set ({', '.join(names)})"
            )
        others = [s for s in benchmark.ood_report if s.name != config.loso_set]
        halves = [split_in_two(s)[0] for s in others]
        per_set = max(1, (config.n_search or len(benchmark.id_search)) // len(halves))
        ood_images = torch.cat([h.images[:per_set] for h in halves])
        id_x = loaded.preprocess(benchmark.id_search.images).to(device)
        circuit = greedy_circuit(
            loaded.model,
            id_x,
            benchmark.id_search.labels.to(device),
            loaded.preprocess(ood_images).to(device),
            objective="ood",
            budget=budgets.budget,
            batch_size=config.batch_size,
            cache=cache,
        )
        name = f"CircOOD, {config.loso_set} left out"
        keep = circuit.keep_mask()
        evaluation = evaluate_model(
            loaded.model,
            loaded.preprocess,
            benchmark.id_report,
            benchmark.ood_report,
            keep=keep,
            name=name,
            device=device,
            cache=cache,
            batch_size=config.batch_size,
        )
        systems.add_system(name, evaluation, SystemInfo("pruned", str(int(keep.sum()))))
        searched[name] = "halves of " + ", ".join(s.name for s in others)
        wanted.append((name, config.loso_set))
    table = systems.table().set_index(["system", "set"])
    rows = []
    for circuit_name, set_name in wanted:
        d = systems.difference(circuit_name, "single", "auroc", set_name)
        rows.append(
            {
                "circuit": circuit_name,
                "searched_on": searched[circuit_name],
                "ood_set": set_name,
                "single_auroc": table.loc[("single", set_name), "auroc"],
                "circuit_auroc": table.loc[(circuit_name, set_name), "auroc"],
                "delta_auroc": d.value,
                "delta_auroc_lo": d.lo,
                "delta_auroc_hi": d.hi,
                "significant": bool(d.significant),
            }
        )
    return pd.DataFrame(rows)


def _records(frame: pd.DataFrame) -> list[dict]:
    """A table as JSON records, as ``report.json`` stores it: every metric with an interval as
    ``{"value": v, "ci95": [lo, hi]}``, NaN as null."""
    return [nest_intervals(row) for row in json.loads(frame.to_json(orient="records"))]


# --- setup and writing --------------------------------------------------------------------------


def _setup(
    config: ReportConfig,
    loaded: LoadedModel,
    benchmark: Benchmark,
    budgets: Budgets,
    device: torch.device,
    seconds: Mapping[str, float],
    total: float,
    created: str,
    deep: Sequence[nn.Module] | None,
    overlap: Mapping[str, dict],
    systems_models: Mapping[str, nn.Module],
) -> dict:
    """The run's description (report.json's ``setup``): what ran, on what, where, how long;
    ``protocol`` says which images selected heads and which were reported, and the seeds."""
    data = benchmark.describe()
    fused_hydra = systems_models.get(fused(HYDRA_CIRC))
    return {
        "created": created,
        "command": " ".join(["python -m hydra_core", *sys.argv[1:]]) if sys.argv else "",
        "protocol": {
            "name": benchmark.protocol,
            "note": benchmark.protocol_note(),
            "search_ood": benchmark.search_names(),
            "report_ood": benchmark.report_names(),
            "id_search_n": len(benchmark.id_search),
            "id_report_n": len(benchmark.id_report),
            "seeds": {
                "pruning": [
                    [r * len(config.seeds) + s for s in range(len(config.seeds))]
                    for r in range(config.repeats)
                ],
                "finetune_batch_order": list(range(config.repeats)),
                "search_subsample": [f"search-repeat-{r}" for r in range(1, config.repeats)],
                "bootstrap": {"n_boot": 1000, "seed": 0, "level": 0.95},
            },
        },
        "parameters": {
            "single": parameter_breakdown(loaded.model),
            fused(HYDRA_CIRC): None if fused_hydra is None else parameter_breakdown(fused_hydra),
        },
        "model": loaded.card(),
        "model_description": loaded.description,
        "data": data.drop(columns="description").to_dict(orient="records"),
        "data_descriptions": dict(zip(data["name"], data["description"], strict=True)),
        "budgets": asdict(budgets),
        "members": len(config.seeds),
        "pruning_seeds": list(config.seeds),
        "config": {k: v for k, v in asdict(config).items() if k != "finetune"},
        "finetune": None if config.finetune is None else asdict(config.finetune),
        "deep_ensemble_members": 0 if deep is None else len(deep),
        "member_overlap": {
            k: {
                "mean_pairwise_jaccard": v["mean_pairwise_jaccard"],
                "kept_by_all": len(v["kept_by_all"]),
                "kept_by_any": len(v["kept_by_any"]),
            }
            for k, v in overlap.items()
        },
        **run_facts(device, seconds, total),
    }


def protocol_facts(benchmark: Benchmark, seeds: Mapping[str, object]) -> dict:
    """``setup["protocol"]``: which samples selected heads and which were reported, and the
    run's ``seeds``."""
    return {
        "name": benchmark.protocol,
        "note": benchmark.protocol_note(),
        "search_ood": benchmark.search_names(),
        "report_ood": benchmark.report_names(),
        "id_search_n": len(benchmark.id_search),
        "id_report_n": len(benchmark.id_report),
        "report_n": {s.name: len(s) for s in benchmark.ood_report},
        "seeds": dict(seeds),
    }


def run_facts(device: torch.device, seconds: Mapping[str, float], total: float) -> dict:
    """Where and how long a report ran: the entries every report's ``setup`` ends with."""
    return {
        "device": str(device),
        "machine": machine_description(device),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "total_seconds": round(total, 1),
    }


def _write(
    out: Path,
    tables: Mapping[str, pd.DataFrame],
    systems: SystemsReport,
    overlap: Mapping[str, dict],
    setup: dict,
    finetuned: Sequence[str],
) -> None:
    """Every file of the report: one CSV per table and per overlap, report.json, report.md."""
    for name, table in tables.items():
        table.to_csv(out / f"{name}.csv", index=False)
    for label, o in overlap.items():
        stem = label.lower().replace(" ", "_").replace("(", "").replace(")", "")
        o["jaccard"].to_csv(out / f"overlap_{stem}_jaccard.csv")
        o["per_layer"].to_csv(out / f"overlap_{stem}_per_layer.csv")
    payload = {
        "setup": setup,
        **{k: _records(v) for k, v in tables.items()},
        "systems": systems.to_json()["systems"],
    }
    (out / "report.json").write_text(json.dumps(_nan_to_none(payload), indent=1))
    (out / "report.md").write_text(markdown_report(tables, setup, finetuned))


def _nan_to_none(value: object) -> object:
    """``value`` with every NaN float, however deeply nested, replaced by None (JSON null)."""
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_to_none(v) for v in value]
    if isinstance(value, float) and value != value:
        return None
    return value


def config_from_args(quick: bool, **overrides) -> ReportConfig:
    """A :class:`ReportConfig`, quick or full, with the given fields replaced (None = keep)."""
    base = ReportConfig.quick() if quick else ReportConfig()
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})
