"""The replication report: the paper's analyses re-run on our default model, whatever comes out.

``python -m hydra_core report`` writes ``report.md``, ``report.json`` and one CSV per table into an
output folder (default ``docs/report``). Sections, in the paper's numbering:

- Table 4: zero-shot pruning, Taylor against the CircAvg circuit (same number of heads removed);
- Table 5: ID/OOD centroid distances of the last layer's heads, CircOOD against the dense model;
- Table 6: CircAcc against CircOOD;
- Tables 1-2: single model, Taylor, CircAvg, Hydra (Taylor), Hydra (Circ) and Deep Ensembles (when
  trained copies exist) on every metric, zero-shot and, unless disabled, fine-tuned;
- Table 9: where diversity comes from: members differing by their pruning seed against identical
  members (and, fine-tuned, by batch order);
- Table 11: fused against non-fused members;
- Table 7: parameters, multiply-adds and latency.

Every head selection uses the search split; every number in the tables comes from the report
split. Searches and fine-tuned weights are cached, so a second run is much faster.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from hydra_core.cache import DiskCache
from hydra_core.data.fashion_mnist import load_fashion_mnist
from hydra_core.evaluate import evaluate_model, resolve_device
from hydra_core.hydra.finetune import FinetuneConfig, finetune_member
from hydra_core.hydra.members import (
    CIRCUIT_NAMES,
    check_members,
    circuit_member,
    member_overlap,
    seed_sampled_members,
    taylor_member,
    taylor_ranking,
)
from hydra_core.hydra.systems import (
    SystemInfo,
    SystemsReport,
    evaluate_systems,
    machine_description,
)
from hydra_core.masks import MemberMask, save_masks
from hydra_core.models.adapter import head_layout
from hydra_core.paths import REPO_DIR
from hydra_core.types import Log, StageProgress

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
        n_report: images per report part: every table (1,000 ID images: accuracy has a standard
            error of about 1 point).
        ood: OOD sets by name (None: all five default sets).
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
    n_report: int | None = 1000
    ood: tuple[str, ...] | None = None
    removed_per_layer: int | None = None
    pool_fraction: float = 2 / 3
    seeds: tuple[int, ...] = (0, 1, 2)
    taylor_samples: int | None = 256
    finetune: FinetuneConfig | None = FinetuneConfig(n_train=5000)
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

    removed_per_layer: int
    budget: int  # heads every circuit and member removes
    pool: int  # members draw their pruned heads from this many least useful
    total: int  # heads of the model

    @classmethod
    def of(cls, layout, config: ReportConfig) -> Budgets:
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
    """Wall time of each stage of the run, and log lines as they finish."""

    def __init__(self, log: Log) -> None:
        self.seconds: dict[str, float] = {}
        self.log = log

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        self.log(f"[report] {name} ...")
        yield
        self.seconds[name] = time.perf_counter() - start
        self.log(f"[report] {name}: {self.seconds[name]:.0f} s")


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
    from hydra_core.analysis.greedy import greedy_circuit
    from hydra_core.analysis.inputs import search_inputs
    from hydra_core.data.benchmark import default_benchmark
    from hydra_core.models.registry import load_model

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cache = cache or DiskCache()
    stages = _Stages(log)
    started = time.perf_counter()
    created = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    device = resolve_device(config.device)

    with stages("load model and data"):
        loaded = load_model(config.model)
        loaded.model.to(device).eval()
        benchmark = default_benchmark(
            n_search=config.n_search,
            n_report=config.n_report,
            ood=list(config.ood) if config.ood else None,
        )
        inputs = search_inputs(loaded.preprocess, benchmark).to(device)
    layout = head_layout(loaded.model)
    budgets = Budgets.of(layout, config)
    seeds = list(config.seeds)

    circuits = {}
    for objective in ("avg", "acc", "ood"):
        name = CIRCUIT_NAMES[objective]
        with stages(f"greedy search {name} ({budgets.budget} steps)"):
            report = (
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
                progress=report,
            )
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
    circ_members = seed_sampled_members(
        circuits["avg"].ranking(),
        layout,
        budget=budgets.budget,
        pool=budgets.pool,
        seeds=seeds,
        base="CircAvg",
    )
    taylor_members = seed_sampled_members(
        taylor_rank, layout, budget=budgets.budget, pool=budgets.pool, seeds=seeds, base="Taylor"
    )
    for members in (circ_members, taylor_members):
        check_members(members, layout)
    circavg = circuit_member(
        circuits["avg"].ranking(), layout, budget=budgets.budget, name="CircAvg"
    )
    identical = [
        MemberMask(f"CircAvg copy {i}", "the CircAvg circuit", circavg.keep)
        for i in range(len(seeds))
    ]
    identity = loaded.identity()
    save_masks(out / "members.json", [*circ_members, *taylor_members], identity)

    deep = _deep_ensemble(config, log) if config.deep_ensemble else None
    common = dict(
        device=device, cache=cache, progress=progress, latency=False, batch_size=config.batch_size
    )
    with stages("evaluate zero-shot systems"):
        systems = evaluate_systems(
            loaded,
            benchmark,
            circ_members,
            label="Hydra (Circ)",
            pruned=masks,
            deep_ensemble=deep,
            **common,
        )
        systems = systems.merge(
            evaluate_systems(loaded, benchmark, taylor_members, label="Hydra (Taylor)", **common)
        )
        systems = systems.merge(
            evaluate_systems(
                loaded, benchmark, identical, label="Hydra (Circ, identical members)", **common
            )
        )

    finetuned_labels = []
    if config.finetune is not None:
        ft = config.finetune
        with stages("fine-tune and evaluate"):
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
            variants = [
                ("Hydra (Taylor), fine-tuned", taylor_members, None),
                ("Hydra (Circ), fine-tuned", circ_members, None),
                (
                    "Hydra (Circ, identical members), batch order varied, fine-tuned",
                    identical,
                    seeds,
                ),
                ("Hydra (Circ, identical members), fine-tuned", identical, None),
            ]
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
                finetuned_labels.append(label)

    with stages("cost and latency"):
        images = loaded.preprocess(benchmark.id_report.images[: config.latency_batch]).to(device)
        cost_systems = _cost_systems(systems, circ_members, deep is not None, finetuned_labels)
        systems.measure(images, systems=cost_systems, repeats=config.latency_repeats)

    with stages("centroid distances (Table 5)"):
        table5 = _table5(loaded, benchmark, masks["CircOOD"], config)

    total = time.perf_counter() - started
    tables = _tables(systems, table5, circuits, budgets, deep is not None, finetuned_labels)
    overlap = {
        "Hydra (Circ)": member_overlap(circ_members),
        "Hydra (Taylor)": member_overlap(taylor_members),
    }
    setup = _setup(
        config, loaded, benchmark, budgets, device, stages.seconds, total, created, deep, overlap
    )
    _write(out, tables, systems, overlap, circuits, setup, finetuned_labels)
    log(f"[report] wrote {out / 'report.md'} ({total:.0f} s)")
    return {"setup": setup, **{k: _records(v) for k, v in tables.items()}}


# --- pieces of the run --------------------------------------------------------------------------


def _member_progress(progress: StageProgress | None, name: str):
    if progress is None:
        return None
    return lambda done, total: progress(f"fine-tune {name}", done, total)


def _deep_ensemble(config: ReportConfig, log: Log):
    """The reference model and its trained copies, or None when no copy exists."""
    from hydra_core.hydra.deep_ensembles import available_deep_ensemble
    from hydra_core.models.default import DEFAULT_CHECKPOINT

    default = config.model in ("default", "fmnist-vit-default")
    reference = DEFAULT_CHECKPOINT if default else Path(config.model)
    if not reference.is_file():
        log("[report] Deep Ensembles: only for Hydra Lab checkpoints; skipped")
        return None
    try:
        models = available_deep_ensemble(reference=reference)
    except ValueError as error:
        log(f"[report] Deep Ensembles skipped: {error}")
        return None
    if len(models) < 2:
        log(
            "[report] Deep Ensembles: no trained copies found (python -m hydra_core train-ensemble)"
        )
        return None
    return models


def _cost_systems(
    systems: SystemsReport, circ_members, deep: bool, finetuned: Sequence[str]
) -> list[str]:
    names = [
        "single",
        "Taylor",
        "CircAvg",
        f"Hydra (Circ): {circ_members[0].name}",
        "Hydra (Circ) (unfused)",
        "Hydra (Circ) (fused)",
        "Hydra (Taylor) (fused)",
    ]
    if "Hydra (Circ), fine-tuned" in finetuned:
        names += ["Hydra (Circ), fine-tuned (unfused)", "Hydra (Circ), fine-tuned (fused)"]
    if deep:
        names.append("Deep Ensembles")
    return [n for n in names if n in systems.info]


def _table5(loaded, benchmark, keep: torch.Tensor, config: ReportConfig) -> pd.DataFrame:
    from hydra_core.analysis.representations import distance_table_dense_vs_circuit

    n = config.distance_samples
    id_x = loaded.preprocess(benchmark.id_report.images[:n])
    ood = {s.name: loaded.preprocess(s.images[:n]) for s in benchmark.ood_report}
    return distance_table_dense_vs_circuit(
        loaded.model, keep, id_x, ood, layer=-1, batch_size=config.batch_size
    )


# --- tables -------------------------------------------------------------------------------------

OOD_METRICS = ("auroc", "fpr95", "aupr_in", "aupr_out")


def _tables(
    systems: SystemsReport,
    table5: pd.DataFrame,
    circuits,
    budgets: Budgets,
    deep: bool,
    finetuned: Sequence[str],
) -> dict[str, pd.DataFrame]:
    summary = systems.summary().set_index("system")

    def rows(names: Sequence[str]) -> pd.DataFrame:
        return summary.loc[[n for n in names if n in summary.index]].reset_index()

    near_far = [f"{g}_{m}" for g in ("near", "far") for m in OOD_METRICS]
    table4 = rows(["single", "Taylor", "CircAvg"])[
        ["system", "heads", "accuracy", "ece", *near_far]
    ]
    table6 = rows(["CircOOD", "CircAcc"])[
        ["system", "heads", "accuracy", *near_far, *(f"all_{m}" for m in OOD_METRICS)]
    ]
    main = ["single", "Taylor", "CircAvg", "Hydra (Taylor) (fused)", "Hydra (Circ) (fused)"]
    if deep:
        main.append("Deep Ensembles")
    if "Hydra (Circ), fine-tuned" in finetuned:
        main += [
            "Taylor (fine-tuned)",
            "CircAvg (fine-tuned)",
            "Hydra (Taylor), fine-tuned (fused)",
            "Hydra (Circ), fine-tuned (fused)",
        ]
    columns = [
        "system",
        "kind",
        "heads",
        "accuracy",
        "brier",
        "nll",
        "ece",
        "adaptive_ece",
        *(f"all_{m}" for m in OOD_METRICS),
        *near_far,
        "id_mi",
        "id_di",
        "ood_mi",
        "ood_di",
    ]
    table1 = rows(main)[[c for c in columns if c in summary.reset_index().columns]]

    diversity = [
        ("CircAvg", "-", "-"),
        ("Hydra (Circ) (fused)", "varied", "-"),
        ("Hydra (Circ, identical members) (fused)", "fixed", "-"),
    ]
    if deep:
        diversity.insert(1, ("Deep Ensembles", "-", "-"))
    if finetuned:
        diversity += [
            ("Hydra (Circ), fine-tuned (fused)", "varied", "fixed"),
            (
                "Hydra (Circ, identical members), batch order varied, fine-tuned (fused)",
                "fixed",
                "varied",
            ),
            ("Hydra (Circ, identical members), fine-tuned (fused)", "fixed", "fixed"),
        ]
    table9 = rows([d[0] for d in diversity])
    sources = {name: (seed, order) for name, seed, order in diversity}
    table9.insert(1, "pruning_seed", [sources[n][0] for n in table9["system"]])
    table9.insert(2, "batch_order", [sources[n][1] for n in table9["system"]])
    table9 = table9[
        [
            "system",
            "pruning_seed",
            "batch_order",
            "heads",
            "id_mi",
            "id_di",
            "ood_mi",
            "ood_di",
            "accuracy",
            "all_auroc",
        ]
    ]

    fusion = []
    labels = ["Hydra (Circ)", "Hydra (Taylor)", *(f for f in finetuned if "identical" not in f)]
    for label in labels:
        table = systems.fusion_table(label)
        gap = table.attrs["max_prob_diff"]
        for _, row in table.iterrows():
            if row["system"] == "single" and fusion:
                continue
            fused = row["kind"] == "fused"
            fusion.append({**row.to_dict(), "max_prob_diff": gap if fused else np.nan})
    table11 = pd.DataFrame(fusion)[
        [
            "system",
            "heads",
            "accuracy",
            "brier",
            "nll",
            "ece",
            "adaptive_ece",
            "all_auroc",
            "all_fpr95",
            "all_aupr_in",
            "all_aupr_out",
            "ood_mi",
            "max_prob_diff",
        ]
    ]

    cost = systems.cost.reset_index()
    greedy = pd.DataFrame(
        [
            {
                "circuit": CIRCUIT_NAMES[o],
                "objective": o,
                "heads_removed": r.steps,
                "search_accuracy": r.accuracy[-1],
                "search_auroc": r.auroc[-1],
                "dense_search_accuracy": r.base_accuracy,
                "dense_search_auroc": r.base_auroc,
                "seconds": r.seconds,
                "removed": " ".join(r.labels()),
            }
            for o, r in circuits.items()
        ]
    )
    return {
        "table4_zero_shot": table4,
        "table5_distances": table5,
        "table6_circuits": table6,
        "table1_systems": table1,
        "table9_diversity": table9,
        "table11_fusion": table11,
        "table7_cost": cost,
        "circuits": greedy,
        "summary_all_systems": summary.reset_index(),
        "all_sets": systems.table(),
    }


def _records(frame: pd.DataFrame) -> list[dict]:
    return json.loads(frame.to_json(orient="records"))


# --- setup and writing --------------------------------------------------------------------------


def _setup(
    config: ReportConfig,
    loaded,
    benchmark,
    budgets: Budgets,
    device,
    seconds,
    total,
    created,
    deep,
    overlap,
) -> dict:
    data = benchmark.describe()
    return {
        "created": created,
        "command": " ".join(["python -m hydra_core", *sys.argv[1:]]) if sys.argv else "",
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
    overlap,
    circuits,
    setup: dict,
    finetuned: Sequence[str],
) -> None:
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
    (out / "report.md").write_text(markdown_report(tables, setup, overlap, finetuned))


def _nan_to_none(value):
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_to_none(v) for v in value]
    if isinstance(value, float) and value != value:
        return None
    return value


# --- Markdown -----------------------------------------------------------------------------------

PERCENT = (
    "accuracy",
    "auroc",
    "fpr95",
    "aupr_in",
    "aupr_out",
    "search_accuracy",
    "search_auroc",
    "dense_search_accuracy",
    "dense_search_auroc",
)
#: columns shown with two decimals (times in ms, ratios) or one (seconds)
TWO_DECIMALS = (
    "latency_ms",
    "latency_iqr_ms",
    "latency_bf16_ms",
    "latency_bf16_iqr_ms",
    "params_ratio",
    "macs_ratio",
    "latency_ratio",
    "latency_bf16_ratio",
)
HEADERS = {
    "system": "System",
    "kind": "Kind",
    "heads": "Heads",
    "accuracy": "Acc↑",
    "brier": "Brier↓",
    "nll": "NLL↓",
    "ece": "ECE↓",
    "adaptive_ece": "aECE↓",
    "auroc": "AUROC↑",
    "fpr95": "FPR95↓",
    "aupr_in": "AUPR-In↑",
    "aupr_out": "AUPR-Out↑",
    "id_mi": "ID MI",
    "id_di": "ID DI",
    "ood_mi": "OOD MI",
    "ood_di": "OOD DI",
    "pruning_seed": "Pruning seed",
    "batch_order": "Batch order",
    "max_prob_diff": "max |Δp|",
}


def _header(column: str) -> str:
    for prefix, label in (("near_", "near "), ("far_", "far "), ("all_", "")):
        if column.startswith(prefix) and column[len(prefix) :] in HEADERS:
            return label + HEADERS[column[len(prefix) :]]
    return HEADERS.get(column, column.replace("_", " "))


def _cell(column: str, value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    if isinstance(value, (float, np.floating)):
        base = column.split("_", 1)[1] if column.startswith(("near_", "far_", "all_")) else column
        if base in PERCENT:
            return f"{100 * value:.2f}"
        if column == "max_prob_diff":
            return f"{value:.1e}"
        if column in TWO_DECIMALS:
            return f"{value:,.2f}"
        if column == "seconds":
            return f"{value:,.1f}"
        return f"{value:.4f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, (int, np.integer)):
        return f"{value:,}"
    return str(value)


def markdown_table(frame: pd.DataFrame) -> str:
    """A DataFrame as a Markdown table; accuracy and OOD metrics in percent."""
    columns = list(frame.columns)
    lines = [
        "| " + " | ".join(_header(c) for c in columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
    ]
    for _, row in frame.iterrows():
        lines.append("| " + " | ".join(_cell(c, row[c]) for c in columns) + " |")
    return "\n".join(lines)


def markdown_report(
    tables: Mapping[str, pd.DataFrame], setup: dict, overlap, finetuned: Sequence[str]
) -> str:
    """The report's Markdown text."""
    b, model = setup["budgets"], setup["model"]
    ft = setup["finetune"]
    data = pd.DataFrame(setup["data"])
    data["description"] = data["name"].map(setup["data_descriptions"])
    seconds = pd.DataFrame(list(setup["seconds"].items()), columns=["stage", "seconds"])
    cost = tables["table7_cost"].copy()
    cost_columns = [
        c
        for c in (
            "system",
            "params",
            "formula_params",
            "macs",
            "latency_ms",
            "latency_iqr_ms",
            "latency_bf16_ms",
            "params_ratio",
            "macs_ratio",
            "latency_ratio",
            "latency_bf16_ratio",
        )
        if c in cost
    ]
    jaccard = ", ".join(
        f"{k} {v['mean_pairwise_jaccard']:.3f}" for k, v in setup["member_overlap"].items()
    )
    per_layer = b["removed_per_layer"]
    kept = model["heads"] - per_layer
    t1 = tables["table1_systems"].drop(
        columns=[c for c in tables["table1_systems"] if c.startswith(("near_", "far_"))]
    )
    near_far = tables["table1_systems"][
        [
            "system",
            "heads",
            *(c for c in tables["table1_systems"] if c.startswith(("near_", "far_"))),
        ]
    ]
    parts = [
        "# Hydra Ensembles on the default model: a replication report",
        "",
        f"Generated {setup['created']} by `{setup['command'] or 'python -m hydra_core report'}` in "
        f"{setup['total_seconds'] / 60:.1f} minutes on {setup['machine']} ({setup['device']}). "
        "Every number below was measured by this run; nothing is copied from the paper. Where our "
        "numbers disagree with the paper's, they are reported as they came out.",
        "",
        "## Setup",
        "",
        f"- **Model**: `{model['name']}`: {setup['model_description']}; {model['layers']} layers x "
        f"{model['heads']} heads (head dim {model['head_dim']}, width {model['embed_dim']}), "
        f"{model['params']:,} parameters.",
        "- **Data**: heads are selected on the *search* parts only; every table is computed on the "
        '*report* parts, which share no image with them (paper D.1.2, "OOD sets and fairness").',
        "",
        markdown_table(data[["name", "group", "n_search", "n_report", "description"]]),
        "",
        f"- **Budgets**: every pruned model removes {b['budget']} of {b['total']} heads "
        f"({per_layer} per layer for Taylor, i.e. {kept} of {model['heads']} kept, as the paper's "
        f"8 of 12). Circuits: the greedy Headmap search (Algorithm 1) removes {b['budget']} heads "
        "with the objective S_avg (CircAvg), S_acc (CircAcc) or S_ood (CircOOD). Taylor: "
        "layer-wise first-order Taylor pruning (D.1.1).",
        f"- **Members** (M = {setup['members']}, pruning seeds {setup['pruning_seeds']}): each "
        f"prunes {b['budget']} heads drawn at random from the {b['pool']} least useful heads of a "
        'ranking (the paper\'s "48 of 100", B.5): the CircAvg greedy ranking for Hydra (Circ), '
        "the Taylor global ranking for Hydra (Taylor). Heads beyond the greedy search's "
        f"{b['budget']} steps are ranked by their score in its last step. Mean pairwise Jaccard "
        f"of the kept heads: {jaccard}.",
        f"- **Fine-tuning**: {_finetune_sentence(ft)}",
        "- **Deep Ensembles**: "
        + (
            f"{setup['deep_ensemble_members']} independently trained copies (the shipped model "
            "and copies with other seeds, same recipe)."
            if setup["deep_ensemble_members"]
            else "not available: no independently trained copies were found. Train them with "
            "`python -m hydra_core train-ensemble --seeds 1 2` (15-40 min each on 2 CPU cores) "
            "and run the report again."
        ),
        "- **Metrics** (SPEC section 6): ensemble probabilities are the mean of member softmax "
        "probabilities; ECE with 15 equal-width bins, aECE with 15 equal-mass bins; OOD score = "
        "maximum softmax probability, OOD is the positive class (OpenOOD): AUROC, FPR95 (share "
        "of ID flagged OOD when 95% of OOD is caught), AUPR-In / AUPR-Out; near/far/all averages "
        "are unweighted means over the OOD sets of the group. MI = mutual information "
        "H(mean p) - mean H(p_m), DI = disagreement. Accuracy and OOD metrics in percent.",
        "",
        "Durations of the stages (seconds; cached searches and fine-tunes load instantly):",
        "",
        markdown_table(seconds),
        "",
        "## Circuits found by the greedy search",
        "",
        markdown_table(tables["circuits"].drop(columns=["removed"])),
        "",
        "(scores on the search split; `removed` lists the heads in removal order in "
        "`circuits.csv`.)",
        "",
        "## Table 4 - zero-shot pruning: Taylor vs CircAvg",
        "",
        markdown_table(tables["table4_zero_shot"]),
        "",
        "## Table 5 - ID/OOD centroid distances of the last layer's heads, CircOOD vs dense",
        "",
        "Mean over the heads CircOOD keeps in the last layer (heads it removed read zero and are "
        "left out of both columns); Mahalanobis with a Ledoit-Wolf regularised ID covariance.",
        "",
        markdown_table(tables["table5_distances"]),
        "",
        "## Table 6 - CircAcc vs CircOOD",
        "",
        markdown_table(tables["table6_circuits"]),
        "",
        "## Tables 1-2 - every system on every metric",
        "",
        "OOD columns are averages over all OOD sets; near/far below. Rows marked fine-tuned were "
        "fine-tuned after pruning; the others are zero-shot.",
        "",
        markdown_table(t1),
        "",
        markdown_table(near_far),
        "",
        "Every system on every set is in `all_sets.csv`; one row per system (members alone "
        "included) in `summary_all_systems.csv`.",
        "",
        "## Table 9 - sources of diversity",
        "",
        "Members that differ by their pruning seed against members that keep the same heads "
        "(the CircAvg circuit M times)"
        + (
            ", and, fine-tuned, members trained with the same or different batch orders"
            if finetuned
            else ""
        )
        + ". Zero-shot identical members are the same model M times, so their MI and DI are 0 "
        "by construction.",
        "",
        markdown_table(tables["table9_diversity"]),
        "",
        "## Table 11 - fused vs non-fused members",
        "",
        "Fused: one Hydra model, MLPs averaged over members. Non-fused: members run separately, "
        "probabilities averaged. `max |Δp|` is the largest difference of the two ensembles' "
        "probabilities on any image: float error for zero-shot members (their MLPs are the same), "
        "the effect of MLP averaging for fine-tuned ones.",
        "",
        markdown_table(tables["table11_fusion"]),
        "",
        "## Table 7 - cost",
        "",
        f"Parameters as stored; multiply-adds and latency for a batch of "
        f"{setup['config']['latency_batch']} images (latency: median of "
        f"{setup['config']['latency_repeats']} round-robin calls, ms, on {setup['device']}; "
        "bf16 only on CUDA). `formula params` is the paper's per-layer count (B.4: 12d² single, "
        "4M(H_l/H)d² + 8d² Hydra with the MLP ratio of this model) summed over layers. The paper "
        "measured Hydra/single 1.07x in bf16 and 2.66x in fp32 and Deep Ensembles 2.99x on a GPU "
        "with ViT-B/16; a small model on a CPU need not behave the same.",
        "",
        markdown_table(cost[cost_columns]),
        "",
    ]
    return "\n".join(parts)


def _finetune_sentence(ft: dict | None) -> str:
    if ft is None:
        return "none (zero-shot only)."
    length = f"{ft['steps']} steps" if ft["steps"] else f"{ft['epochs']} epoch(s)"
    return (
        f"each pruned model separately, {ft['optimizer']} lr {ft['lr']}, {length} of "
        f"{ft['n_train']} Fashion-MNIST training images, batch {ft['batch_size']}, "
        f"{ft['warmup_steps']} warm-up steps then cosine decay, label smoothing "
        f"{ft['label_smoothing']}, trainable: {', '.join(ft['trainable'])} (D.2); members "
        "fused afterwards with averaged MLPs. Same batch order for every member unless a "
        "row says otherwise."
    )


def config_from_args(quick: bool, **overrides) -> ReportConfig:
    """A :class:`ReportConfig`, quick or full, with the given fields replaced (None = keep)."""
    base = ReportConfig.quick() if quick else ReportConfig()
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})
