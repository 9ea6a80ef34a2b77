"""Run the report: load, search, prune, fine-tune, evaluate, time; then write every file.

:func:`run_report` does the work in stages (each logged with its wall time) and hands the results
to :func:`~hydra_core.report.tables.report_tables` and
:func:`~hydra_core.report.markdown.markdown_report`; ``report.json`` and the CSVs are written here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import torch
from torch import nn

from hydra_core.analysis._maps import DEFAULT_OOD_AGGREGATE
from hydra_core.baselines.deep_ensembles import DeepEnsemble, deep_ensemble_for
from hydra_core.baselines.systems import MC_DROPOUT, MCDropoutBaseline
from hydra_core.cache import DiskCache
from hydra_core.data.benchmark import DEFAULT_PROTOCOL, NAMED_SEARCH
from hydra_core.data.fashion_mnist import load_fashion_mnist
from hydra_core.data.provenance import ChosenOn
from hydra_core.errors import InputError
from hydra_core.evaluate import evaluate_model
from hydra_core.experiment.facts import run_options
from hydra_core.experiment.pipeline import Pipeline
from hydra_core.experiment.pruning import Budgets
from hydra_core.experiment.results import SystemsReport, repeated_differences
from hydra_core.experiment.run import SystemInfo, system_name
from hydra_core.hydra.cost import parameter_breakdown
from hydra_core.hydra.finetune import FinetuneConfig, finetune_member
from hydra_core.hydra.members import (
    CIRCUIT_NAMES,
    member_overlap,
)
from hydra_core.hydra.systems import Hydra, Pruned, Single
from hydra_core.masks import MemberMask
from hydra_core.outputs import write_csv
from hydra_core.report.heads import evidence_table
from hydra_core.report.image_claims import image_claims
from hydra_core.report.markdown import markdown_report
from hydra_core.report.tables import (
    HYDRA_CIRC,
    HYDRA_CIRC_B5,
    HYDRA_CIRC_B5_FT,
    HYDRA_CIRC_FT,
    HYDRA_IDENTICAL,
    HYDRA_IDENTICAL_FT,
    HYDRA_IDENTICAL_ORDER_FT,
    HYDRA_TAYLOR,
    HYDRA_TAYLOR_FT,
    fused,
    ood_gain_table,
    report_tables,
)
from hydra_core.types import Log, StageProgress

if TYPE_CHECKING:
    from hydra_core.data.benchmark import Benchmark
    from hydra_core.zoo.registry import LoadedModel

#: where the report goes unless told (never the committed docs/report/ by default)
DEFAULT_OUT = Path("results") / "report"


@dataclass(frozen=True)
class ReportConfig:
    """What the report runs.

    The defaults are sized for about half an hour on two CPU cores the first time (most of it the
    three greedy searches, about 24 steps x 72 candidates x 512 images each; they are cached, as
    are fine-tuned weights and predictions, so a second run takes a few minutes). Larger
    ``n_search`` / ``n_report`` give less noisy rankings and tables at a proportional cost.

    Args:
        model: model source (see :func:`~hydra_core.zoo.registry.load_model`).
        n_search: images per search part (ID and each OOD set): head selection only; the greedy
            search scores candidates on n_search ID + n_search pooled OOD images.
        n_report: images per report part: every table (None: the whole Fashion-MNIST test set
            and every image of each report OOD set).
        ood: report OOD sets by name (None: the five default report sets).
        search_ood: search OOD sets by name, used only to select heads and never reported
            (None: the default search sets, see :data:`hydra_core.data.ood.SEARCH_OOD`).
        protocol: which data selects heads (:data:`~hydra_core.data.benchmark.PROTOCOLS`,
            docs/search-protocols.md): ``"dedicated"`` (search sets apart from report sets, the
            paper's), ``"synthetic"``, ``"far-to-near"``, ``"near-to-far"``, or ``"halves"``
            (halves of the report sets, which leaks them into head selection; the report says so
            at the top).
        ood_aggregate: how the greedy searches' AUROC combines the OOD search sets (``pooled``,
            ``mean``, ``min``); the stability resamples score the pooled AUROC.
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
        evidence_samples: images per report set for the per-head evidence (heads.csv; None:
            all).
        device, batch_size: where and in what batches to predict.
        latency_batch, latency_repeats: images per timed forward and timed calls per system.
        stability_resamples: bootstrap resamples of the search data per circuit for its
            stability (0: none); held_out: unused search-role images per set scored after every
            step (:mod:`hydra_core.experiment.stability`).
    """

    model: str = "default"
    n_search: int | None = 256
    n_report: int | None = None
    ood: tuple[str, ...] | None = None
    search_ood: tuple[str, ...] | None = None
    protocol: str = DEFAULT_PROTOCOL
    ood_aggregate: str = DEFAULT_OOD_AGGREGATE
    repeats: int = 5
    loso_set: str | None = "mnist"
    removed_per_layer: int | None = None
    pool_fraction: float = 2 / 3
    seeds: tuple[int, ...] = (0, 1, 2)
    taylor_samples: int | None = 256
    finetune: FinetuneConfig | None = FinetuneConfig()
    deep_ensemble: bool = True
    distance_samples: int | None = 1000
    evidence_samples: int | None = 1000
    device: str = "auto"
    batch_size: int = 256
    latency_batch: int = 32
    latency_repeats: int = 20
    stability_resamples: int = 5
    held_out: int | None = 512

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
            stability_resamples=2,
            held_out=64,
            finetune=FinetuneConfig(n_train=256, steps=4, batch_size=64, warmup_steps=1),
        )
        settings.update(overrides)
        return cls(**settings)


def run_report(
    config: ReportConfig = ReportConfig(),
    out: str | Path = DEFAULT_OUT,
    *,
    cache: DiskCache | None = None,
    progress: StageProgress | None = None,
    log: Log = print,
    overwrite: bool = False,
) -> dict:
    """Run every analysis and write ``report.md``, ``report.json`` and the CSVs into ``out``.

    Returns the key numbers (also in ``report.json``): per table, the rows written.
    """
    from hydra_core.data.benchmark import default_benchmark
    from hydra_core.zoo.registry import load_model

    run = Pipeline(
        out, cache, config.device, progress, log, overwrite=overwrite, options=run_options(config)
    )
    run.ood_aggregate = config.ood_aggregate
    device, cache, stages = run.device, run.cache, run.stage

    def benchmark_of(n_search: int | None):
        return default_benchmark(
            n_search=n_search,
            n_report=config.n_report,
            ood=list(config.ood) if config.ood else None,
            search_ood=list(config.search_ood) if config.search_ood else None,
            protocol=config.protocol,
        )

    def loader():
        from hydra_core.models.modality import IMAGE_MODALITY

        loaded = load_model(config.model)
        if loaded.modality is not IMAGE_MODALITY:
            raise InputError(
                f"--task image (the default) needs an image classifier; {config.model!r} takes "
                f"{loaded.modality.name}: pass --task {loaded.modality.name}"
            )
        return loaded, benchmark_of(config.n_search)

    run.load(loader)
    loaded, benchmark, layout = run.loaded, run.benchmark, run.layout
    budgets = Budgets.of(layout, config)
    seeds = list(config.seeds)
    if run.rank > 0:  # under torchrun: this process's share of the repeats, then done
        _repeats(None, run, budgets, config, _deep_ensemble(config, run))
        return {}

    pruning = run.circuits_and_members(
        budgets,
        seeds,
        taylor_samples=config.taylor_samples,
        batch_size=config.batch_size,
        search_batch_size=config.batch_size,
    )
    circuits, taylor, members = pruning.circuits, pruning.taylor, pruning.members
    masks = {"Taylor": taylor.keep}
    masks.update({CIRCUIT_NAMES[o]: r.keep_mask() for o, r in circuits.items()})
    circ_members = members[HYDRA_CIRC]  # CircAcc, CircOOD, CircAvg: the paper's method
    b5_members, taylor_members = members[HYDRA_CIRC_B5], members[HYDRA_TAYLOR]
    identical = [
        MemberMask(f"CircAvg copy {i}", "the CircAvg circuit", pruning.circavg.keep)
        for i in range(len(seeds))
    ]
    run.save_members([*circ_members, *b5_members, *taylor_members])

    deep = _deep_ensemble(config, run)
    zero_shot = [
        Single(),
        MCDropoutBaseline(),  # the model's own dropout; a model without any: skipped, why said
        *(Pruned(name, keep) for name, keep in masks.items()),
        Hydra(circ_members, HYDRA_CIRC),
        Hydra(b5_members, HYDRA_CIRC_B5),
        *([] if deep is None else [DeepEnsemble(deep)]),
        Hydra(taylor_members, HYDRA_TAYLOR),
        Hydra(identical, HYDRA_IDENTICAL),
    ]
    with stages("evaluate zero-shot systems"):
        systems = run.evaluate(zero_shot, batch_size=config.batch_size)

    finetuned_labels = []
    if config.finetune is not None:
        variants = [  # (label, members, fine-tuning seeds: None = the same batch order for all)
            (HYDRA_TAYLOR_FT, taylor_members, None),
            (HYDRA_CIRC_FT, circ_members, None),
            (HYDRA_CIRC_B5_FT, b5_members, None),
            (HYDRA_IDENTICAL_ORDER_FT, identical, seeds),
            (HYDRA_IDENTICAL_FT, identical, None),
        ]
        with stages("fine-tune and evaluate"):
            systems = _finetuned_systems(systems, run, masks, variants, config)
        finetuned_labels = [label for label, _, _ in variants]

    with stages("cost and latency"):
        images = loaded.preprocess(benchmark.id_report.images[: config.latency_batch]).to(device)
        cost_systems = _cost_systems(systems, circ_members, deep is not None, finetuned_labels)
        systems.measure(images, systems=cost_systems, repeats=config.latency_repeats)

    with stages("centroid distances (Table 5)"):
        table5 = _table5(loaded, benchmark, masks["CircOOD"], config)

    with stages("per-head evidence (heads.csv)"):
        heads = evidence_table(
            loaded,
            benchmark,
            run.inputs.id_x,
            run.inputs.id_y,
            n=config.evidence_samples,
            batch_size=config.batch_size,
            cache=cache,
        )

    with stages(f"seeded systems over {config.repeats} repeats (Table 12)"):
        repeated, over_repeats, claims = _repeats(systems, run, budgets, config, deep)
    stability = run.stability(
        circuits,
        benchmark_of(None),
        resamples=config.stability_resamples,
        held_out=config.held_out,
    )
    with stages("transfer of the circuits' AUROC gain"):
        transfer = _transfer_table(systems, run, budgets, config)

    tables = report_tables(systems, table5, circuits, deep is not None, finetuned_labels)
    tables["table12_seeds"] = repeated
    tables["differences_over_repeats"] = over_repeats
    tables["paper_claims"] = claims
    tables["transfer"] = transfer
    if stability is not None:
        tables["stability"] = stability
    tables["heads"] = heads
    tables["differences_to_single"] = systems.differences("single", list(DIFFERENCE_COLUMNS))
    with stages("OOD gain under every score"):
        table1 = tables["table1_systems"]["system"]
        tables["ood_gain_by_score"] = ood_gain_table(systems, benchmark, list(table1))
    setup = _setup(run, config, budgets, members, deep, systems)
    _write_overlaps(run.out, members)
    markdown = lambda tables, setup: markdown_report(tables, setup, finetuned_labels)  # noqa: E731
    payload = run.write(tables, setup, systems, markdown)
    return {k: v for k, v in payload.items() if k != "systems"}


# --- stages of the run --------------------------------------------------------------------------


def _finetuned_systems(
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


#: the Deep Ensembles row, the reference of the "Hydra vs Deep Ensembles" differences
DEEP_ENSEMBLES = "Deep Ensembles"
#: the summary columns the paired differences to the single model are reported on
DIFFERENCE_COLUMNS = ("accuracy", "nll", "ece", "near_auroc", "far_auroc", "all_auroc")


def _deep_ensemble(config: ReportConfig, run: Pipeline) -> list[nn.Module] | None:
    """The Deep Ensemble's models when asked for and trained copies exist (a line says why not)."""
    if not config.deep_ensemble:
        return None
    return deep_ensemble_for(config.model, log=lambda reason: run.log(f"{run.tag} {reason}"))


#: the seeded systems Table 12 repeats, and the summary columns it reports
SEEDED_METRICS = ("accuracy", "nll", "ece", "near_auroc", "far_auroc", "all_auroc", "ood_mi")


def _repeats(
    systems: SystemsReport | None,
    run: Pipeline,
    budgets: Budgets,
    config: ReportConfig,
    deep: Sequence[nn.Module] | None,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame] | None:
    """Table 12: every seeded system over ``config.repeats`` repeats, one row per repeat; every
    seeded system minus the single model (and, with Deep Ensembles, every Hydra minus Deep
    Ensembles) over the repeats, with the two-level interval (repeats, then report items) that
    the verdicts use; and the paper's Table 1 statements with those verdicts
    (:func:`~hydra_core.report.image_claims.image_claims`).

    Repeat 0 is the main run (its rows come from ``systems``). Repeat r > 0 changes every source
    of randomness together: another subsample of the search images (ID and search OOD; the same
    images in another order when ``n_search`` takes them all, which leaves the search unchanged),
    the three greedy searches (CircAcc, CircOOD, CircAvg) and the Taylor ranking on it, pruning
    seeds r*M .. r*M + M - 1, and fine-tuning batch order r. The report images stay the same, so
    the spread is the seeds' alone. Each repeat's systems are taken as chosen on its own search
    subsample (the guard of ``evaluate_systems`` checks them against the report items).

    Under ``torchrun`` the processes share the repeats (:meth:`Pipeline.repeats`); a process other
    than rank 0 gives ``systems`` None, runs its share into the cache and returns None."""
    from hydra_core.data.ood import OOD_SETS, load_ood_set

    benchmark = run.benchmark
    m, b, n = len(config.seeds), config.batch_size, config.taylor_samples
    labels = [(HYDRA_CIRC, HYDRA_CIRC_FT), (HYDRA_CIRC_B5, HYDRA_CIRC_B5_FT)]
    labels.append((HYDRA_TAYLOR, HYDRA_TAYLOR_FT))
    families = [fused(label) for label, _ in labels] + ["CircAvg", "Taylor"]
    if config.finetune is not None:
        families += [fused(tuned) for _, tuned in labels]
    rows, reports = [], [systems]
    if systems is not None:
        main = systems.summary().set_index("system")
        rows = [{"repeat": 0, "system": f, **main.loc[f, list(SEEDED_METRICS)]} for f in families]
    train_set = load_fashion_mnist("train") if config.finetune is not None else None

    def pools() -> tuple:  # the ID search pool, one pool per OOD search set
        named = benchmark.protocol in NAMED_SEARCH
        ood = [
            load_ood_set(s.name) if s.name in OOD_SETS and named else s
            for s in benchmark.ood_search
        ]
        return load_fashion_mnist("validation"), ood

    stability = (budgets.budget, config.stability_resamples)
    repeats = run.search_repeats(
        config.repeats, benchmark, config.n_search, pools, stability=stability
    )
    for r, sub, inputs in repeats:
        seeds = [r * m + i for i in range(m)]
        pruning = run.circuits_and_members(
            budgets,
            seeds,
            taylor_samples=n,
            batch_size=b,
            search_batch_size=b,
            inputs=inputs,
            repeat=f", repeat {r}",
        )
        members, taylor = pruning.members, pruning.taylor
        repeat = [
            Single(),
            Pruned("CircAvg", pruning.circavg.keep),
            Pruned("Taylor", taylor.keep),
            *(Hydra(members[label], label) for label, _ in labels),
            *([] if deep is None else [DeepEnsemble(deep)]),
        ]
        if config.finetune is not None:
            for label, tuned in labels:
                ft_seeds = [r] * m
                repeat.append(Hydra(members[label], tuned, config.finetune, ft_seeds, train_set))
        found = run.evaluate(repeat, batch_size=config.batch_size, benchmark=sub)
        reports.append(found)
        summary = found.summary().set_index("system")
        rows += [
            {"repeat": r, "system": f, **summary.loc[f, list(SEEDED_METRICS)]} for f in families
        ]
    if systems is None:
        return None
    over = repeated_differences(reports, families, "single", DIFFERENCE_COLUMNS)
    if deep is not None:
        hydras = [f for f in families if f.startswith("Hydra")]
        against = repeated_differences(reports, hydras, DEEP_ENSEMBLES, DIFFERENCE_COLUMNS)
        over = pd.concat(
            [over.assign(reference="single"), against.assign(reference=DEEP_ENSEMBLES)]
        )
    else:
        over = over.assign(reference="single")
    return pd.DataFrame(rows), over, image_claims(reports)


def _transfer_table(
    systems: SystemsReport, run: Pipeline, budgets: Budgets, config: ReportConfig
) -> pd.DataFrame:
    """How much of the circuits' AUROC gain over the dense model reaches sets the search never
    saw: per report set, AUROC(circuit) - AUROC(single) with its paired 95% interval, for CircOOD
    and CircAvg (searched on the search sets only), and for one leave-one-set-out CircOOD searched
    on halves of the other report sets and measured on the one left out, and on it alone (never
    added to ``systems``: the other report sets chose its heads)."""
    from hydra_core.analysis.inputs import SearchInputs
    from hydra_core.data.images import split_in_two

    loaded, benchmark, device = run.loaded, run.benchmark, run.device
    searched = {
        "CircOOD": ", ".join(benchmark.search_names()),
        "CircAvg": ", ".join(benchmark.search_names()),
    }
    wanted = [(c, s.name) for c in searched for s in benchmark.ood_report]
    table = systems.table().set_index(["system", "set"])
    rows = [
        _transfer_row(systems, table, circuit, searched[circuit], set_name)
        for circuit, set_name in wanted
    ]
    if config.loso_set is not None:
        names = [s.name for s in benchmark.ood_report]
        if config.loso_set not in names:
            raise InputError(
                f"loso_set {config.loso_set!r} is not a report set ({', '.join(names)})"
            )
        left_out = benchmark.ood_report[names.index(config.loso_set)]
        others = [s for s in benchmark.ood_report if s is not left_out]
        per_set = max(1, (config.n_search or len(benchmark.id_search)) // len(others))
        halves = [split_in_two(s)[0] for s in others]
        halves = [h.subset(torch.arange(min(per_set, len(h)))) for h in halves]
        ood_x = loaded.preprocess(torch.cat([h.images for h in halves])).to(device)
        inputs = SearchInputs(
            loaded.preprocess(benchmark.id_search.images).to(device),
            benchmark.id_search.labels.to(device),
            ood_x,
            {"halves of the other report sets": ood_x},
        )
        circuit = run.search(
            "ood",
            budgets.budget,
            batch_size=config.batch_size,
            inputs=inputs,
            repeat=f", {config.loso_set} left out",
        )
        # the guard of evaluate_systems refuses any report set that shares an item with the
        # images that chose the circuit, so it is reported on the left-out set and the ID set
        name = f"CircOOD, {config.loso_set} left out"
        chosen = ChosenOn.of("heads", [benchmark.id_search, *halves])
        found = run.evaluate(
            [Single(), Pruned(name, circuit.keep_mask(), chosen)],
            batch_size=config.batch_size,
            benchmark=replace(benchmark, ood_report=(left_out,)),
        )
        searched_on = "halves of " + ", ".join(s.name for s in others)
        left_table = found.table().set_index(["system", "set"])
        rows.append(_transfer_row(found, left_table, name, searched_on, left_out.name))
    return pd.DataFrame(rows)


def _transfer_row(
    systems: SystemsReport, table: pd.DataFrame, circuit: str, searched_on: str, set_name: str
) -> dict:
    """One row of the transfer table: the circuit's AUROC on ``set_name`` against the single
    model's, with the paired interval of the difference."""
    d = systems.difference(circuit, "single", "auroc", set_name)
    return {
        "circuit": circuit,
        "searched_on": searched_on,
        "ood_set": set_name,
        "single_auroc": table.loc[("single", set_name), "auroc"],
        "circuit_auroc": table.loc[(circuit, set_name), "auroc"],
        "delta_auroc": d.value,
        "delta_auroc_lo": d.lo,
        "delta_auroc_hi": d.hi,
        "significant": bool(d.significant),
    }


# --- setup and writing --------------------------------------------------------------------------


def _setup(
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
    )
    return run.finish(setup)


def _write_overlaps(out: Path, members: Mapping[str, Sequence[MemberMask]]) -> None:
    """One CSV per ensemble for its members' pairwise Jaccard and per-layer overlap."""
    for label, ms in members.items():
        o = member_overlap(ms)
        # Hydra (Circ, B.5): hydra_circ_b_5
        stem = "_".join(re.findall(r"[a-z0-9]+", label.lower()))
        write_csv(out / f"overlap_{stem}_jaccard.csv", o["jaccard"])
        write_csv(out / f"overlap_{stem}_per_layer.csv", o["per_layer"])


def config_from_args(quick: bool, **overrides) -> ReportConfig:
    """A :class:`ReportConfig`, quick or full, with the given fields replaced (None = keep)."""
    base = ReportConfig.quick() if quick else ReportConfig()
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})
