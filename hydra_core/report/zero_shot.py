"""The zero-shot report: the paper's Table 3 (section 5.3, OpenCLIP ViT-B/32 zero-shot) on an
OpenCLIP model the user names.

``python -m hydra_core report --task zero-shot --model openclip:ViT-B-32/laion2b_s34b_b79k``
writes ``report.md``, ``report.json`` and one CSV per table into ``results/report/zero-shot``. No
package registry carries CLIP weights, so this report runs only where the model can be loaded:
online (the weights come from the Hugging Face hub) or from a local open_clip folder
(``openclip:local-dir:/path``). Nothing of it is committed unless it was run on real weights.

The classifier is zero-shot: the ID set's class names in the prompt "A photo of a {label}." (or
the templates given), embedded by the text tower; logits = logit scale x cosine. As the paper's
Table 3 (D.3: "we prune 24 attention heads jointly from both encoders"), heads are pruned in both
towers by default: one head layout of the image tower's layers, then the text tower's; every
circuit and member removes ``removed_per_layer`` x (image-tower layers) heads of it (2 x 12 = 24
for ViT-B/32), and each pruned member's class embeddings come from its own pruned text tower.
``towers="image"`` (``--towers image``) prunes the image tower alone (the paper's Appendix
E.3.2). Nothing is trained. The systems:

- **Single**: the zero-shot classifier as loaded.
- **Temperature Scaling**: the single model's logits divided by one temperature, fitted on the ID
  *search* images (NLL; the paper fits it on a small part of ImageNet's training set), so it
  changes calibration, not the predicted classes (the maximum softmax probability, the OOD
  score, is not a monotone function of the temperature, so its AUROC may move a little).
- **Taylor**: layer-wise Taylor pruning (D.1.1): the image tower alone, ``removed_per_layer``
  heads of every layer (default 2 of 12: the paper's 10 heads kept); both towers, the same
  number of heads in all, spread evenly over the layers of both (ViT-B/32: one per layer of 24;
  where it does not divide, the earlier layers take one more, image first), which is our reading:
  the paper gives Taylor's count ("10") but not how it was spread over the towers.
- **CircAvg**: the greedy circuit of S_avg = (accuracy + AUROC) / 2 (Algorithm 1) on the search
  split, removing as many heads in all.
- **Hydra (Taylor)**, **Hydra (Circ)**: M members drawn from the least useful heads of the Taylor
  or CircAvg ranking (as the image report), fused into one model.

The protocol is the image report's: heads are selected (and the temperature fitted) on the search
split, every number comes from the report split with its 95% bootstrap interval, and differences
to the single model use paired resamples.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from hydra_core.baselines.systems import TEMPERATURE, TemperatureBaseline
from hydra_core.cache import DiskCache
from hydra_core.errors import InputError
from hydra_core.experiment.facts import run_options
from hydra_core.experiment.pipeline import Pipeline
from hydra_core.experiment.pruning import Budgets
from hydra_core.experiment.results import SystemsReport
from hydra_core.experiment.run import system_name
from hydra_core.hydra.systems import Hydra, Pruned, Single
from hydra_core.models.adapter import HeadLayout
from hydra_core.models.zero_shot import (
    DEFAULT_TEMPLATE,
    DEFAULT_TOWERS,
    check_towers,
    declares_random_weights,
)
from hydra_core.report.claims import (
    claim_columns,
    near_far_verdicts,
    paper_frame,
    pick,
    signed,
    verdict_counts,
)
from hydra_core.report.markdown import markdown_table
from hydra_core.report.tables import HYDRA_CIRC, HYDRA_TAYLOR, NEAR_FAR, circuits_table, fused
from hydra_core.types import Log, StageProgress

#: where the report goes unless told (never the committed docs/report/ by default)
DEFAULT_ZERO_SHOT_OUT = Path("results") / "report" / "zero-shot"
DEFAULT_COMMAND = "python -m hydra_core report --task zero-shot --model openclip:..."

SINGLE = "single"
TAYLOR = "Taylor"
CIRCAVG = "CircAvg"


@dataclass(frozen=True)
class ZeroShotReportConfig:
    """What the zero-shot report runs.

    Args:
        model: an OpenCLIP source (``openclip:NAME/TAG``, ``openclip:hf-hub:ORG/REPO`` or
            ``openclip:local-dir:PATH``); there is no offline default.
        templates: prompt templates, ``{label}`` marking the class name.
        id_folder: an ImageFolder of the user's own as the ID set (its sub-folders are the
            classes); None: Fashion-MNIST, the default ID set.
        n_search, n_report, ood, search_ood: the data, as for the image report.
        towers: "both" (the paper's D.3: heads pruned jointly in the image and the text tower)
            or "image" (the image tower alone, its Appendix E.3.2).
        removed_per_layer: heads per image-tower layer: every circuit and member removes this
            many times the image tower's layers (default 2 of 12 per layer, the paper's 10 kept:
            24 heads for ViT-B/32, from both towers or the image tower); Taylor removes as many,
            per layer of the image tower alone, or spread over both towers' layers.
        pool_fraction, seeds, taylor_samples: members, as for the image report.
        device, batch_size, latency_batch, latency_repeats: where and how to predict and time.
    """

    model: str = ""
    templates: tuple[str, ...] = (DEFAULT_TEMPLATE,)
    towers: str = DEFAULT_TOWERS
    id_folder: str | None = None
    n_search: int | None = 256
    n_report: int | None = None
    ood: tuple[str, ...] | None = None
    search_ood: tuple[str, ...] | None = None
    removed_per_layer: int | None = 2
    pool_fraction: float = 2 / 3
    seeds: tuple[int, ...] = (0, 1, 2)
    taylor_samples: int | None = 256
    device: str = "auto"
    batch_size: int = 64
    latency_batch: int = 32
    latency_repeats: int = 20

    @classmethod
    def quick(cls, **overrides) -> ZeroShotReportConfig:
        """Small subsets: every section in a couple of minutes on a small model."""
        settings = dict(n_search=32, n_report=64, taylor_samples=32, latency_repeats=3)
        settings.update(overrides)
        return cls(**settings)


def zero_shot_config_from_args(quick: bool, **overrides) -> ZeroShotReportConfig:
    """The configuration the CLI builds: ``--quick`` or the defaults, with the given options."""
    given = {k: v for k, v in overrides.items() if v is not None}
    return ZeroShotReportConfig.quick(**given) if quick else ZeroShotReportConfig(**given)


def run_zero_shot_report(
    config: ZeroShotReportConfig,
    out: str | Path = DEFAULT_ZERO_SHOT_OUT,
    *,
    cache: DiskCache | None = None,
    progress: StageProgress | None = None,
    log: Log = print,
    overwrite: bool = False,
) -> dict:
    """Run the zero-shot report and write ``report.md``, ``report.json`` and the CSVs into
    ``out``; returns ``report.json``'s content."""
    check_towers(config.towers)
    run = Pipeline(
        out, cache, config.device, progress, log, overwrite=overwrite, options=run_options(config)
    )
    run.load(lambda: _load(config))
    layout = run.layout
    budgets = zero_shot_budgets(layout, config)
    seeds = list(config.seeds)

    # Hydra (Circ) as the paper's method: one circuit per criterion (CircAcc, CircOOD, CircAvg)
    pruning = run.circuits_and_members(
        budgets,
        seeds,
        taylor_samples=config.taylor_samples,
        batch_size=config.batch_size,
        search_batch_size=config.batch_size,
    )
    circuits = pruning.circuits
    taylor, circavg, members = pruning.taylor, pruning.circavg, pruning.members
    run.save_members([taylor, circavg, *members[HYDRA_TAYLOR], *members[HYDRA_CIRC]])

    temperature = TemperatureBaseline()
    systems = [
        Single(),
        Pruned(TAYLOR, taylor.keep),
        Pruned(CIRCAVG, circavg.keep),
        Hydra(members[HYDRA_CIRC], HYDRA_CIRC),
        Hydra(members[HYDRA_TAYLOR], HYDRA_TAYLOR),
        temperature,
    ]
    with run.stage("evaluate every system"):
        report = run.evaluate(systems, batch_size=config.batch_size)
    with run.stage("cost and latency"):
        items = run.loaded.preprocess(run.benchmark.id_report.inputs[: config.latency_batch])
        names = [
            SINGLE,
            TAYLOR,
            CIRCAVG,
            system_name(HYDRA_CIRC, "unfused"),
            fused(HYDRA_CIRC),
            fused(HYDRA_TAYLOR),
        ]
        report.measure(
            items.to(run.device),
            systems=[n for n in names if n in report.info],
            repeats=config.latency_repeats,
        )
    with run.stage("bootstrap intervals"):
        tables = zero_shot_tables(report, circuits)
    setup = run.setup("zero-shot", budgets, _seeds(config), members)
    setup.update(
        classes=list(run.loaded.classes or ()),
        templates=list(config.templates),
        towers=config.towers,
        tower_layers={name: len(layers) for name, layers in layout.tower_layers().items()},
        temperature=temperature.temperature,
        random_weights=declares_random_weights(config.model),
        config=asdict(config),
    )
    return run.write(tables, run.finish(setup), report, zero_shot_markdown)


def zero_shot_budgets(layout: HeadLayout, config: ZeroShotReportConfig) -> Budgets:
    """The budgets of the image tower (:meth:`Budgets.of` on its layers); with both towers the
    same number of heads, drawn from the joint layout (its pool a share of all its heads), and
    Taylor's count spread over the layers of both towers (``removed_per_layer`` then one number
    per layer: the earlier layers one more where the budget does not divide)."""
    towers = layout.tower_layers()
    image = towers.get("image", range(layout.num_layers))
    image_layout = HeadLayout(layout.num_heads[: image.stop], layout.head_dim, layout.embed_dim)
    budgets = Budgets.of(image_layout, config)
    if len(towers) < 2:
        return budgets
    layers = layout.num_layers
    per_layer = [budgets.budget // layers + (i < budgets.budget % layers) for i in range(layers)]
    for layer, (r, n) in enumerate(zip(per_layer, layout.num_heads, strict=True)):
        if r >= n:
            name, local = layout.tower_of(layer)
            raise InputError(
                f"Taylor would remove {r} of the {n} heads of {name} layer {local} "
                f"({budgets.budget} heads over {layers} layers); lower --removed-per-layer, or "
                "prune the image tower alone (--towers image)"
            )
    pool = round(config.pool_fraction * layout.total_heads)
    pool = min(layout.total_heads, max(budgets.budget + 1, pool))
    return Budgets(tuple(per_layer), budgets.budget, pool, layout.total_heads)


def _seeds(config: ZeroShotReportConfig) -> dict:
    """The run's seeds, for ``setup["protocol"]``."""
    return {"pruning": list(config.seeds), "bootstrap": {"n_boot": 1000, "seed": 0}}


def _load(config: ZeroShotReportConfig):
    """The zero-shot classifier (classes: the ID set's) and the benchmark; refuses a model that
    is not an OpenCLIP source."""
    from hydra_core.data.benchmark import default_benchmark, folder_benchmark
    from hydra_core.models.preprocess import input_format
    from hydra_core.models.zero_shot import folder_classes
    from hydra_core.zoo.registry import load_model

    if not config.model.startswith("openclip:"):
        raise InputError(
            f"--task zero-shot needs an OpenCLIP model (--model openclip:NAME/TAG, e.g. "
            f"openclip:ViT-B-32/laion2b_s34b_b79k, or openclip:local-dir:PATH); got "
            f"{config.model or 'none'!r}"
        )
    data = dict(
        n_search=config.n_search,
        n_report=config.n_report,
        ood=list(config.ood) if config.ood else None,
        search_ood=list(config.search_ood) if config.search_ood else None,
    )
    if config.id_folder is None:
        benchmark = default_benchmark(**data)
        loaded = load_model(
            config.model,
            classes=benchmark.id_search.classes,
            templates=config.templates,
            towers=config.towers,
        )
        return loaded, benchmark
    loaded = load_model(
        config.model,
        classes=folder_classes(config.id_folder),
        templates=config.templates,
        towers=config.towers,
    )
    channels, size = input_format(loaded.model)
    benchmark = folder_benchmark(id_folder=config.id_folder, size=size, channels=channels, **data)
    return loaded, benchmark


# --- tables ---------------------------------------------------------------------------------------

#: the rows of Table 3, in the paper's order (Hydra (Taylor) is not in the paper's table)
MAIN_ROWS = (SINGLE, TEMPERATURE, TAYLOR, CIRCAVG, fused(HYDRA_TAYLOR), fused(HYDRA_CIRC))
MAIN_COLUMNS = (
    "accuracy",
    "brier",
    "nll",
    "ece",
    "adaptive_ece",
    "all_auroc",
    "all_fpr95",
    "all_aupr_in",
    "all_aupr_out",
)
DIFFERENCES = ("accuracy", "nll", "ece", "near_auroc", "far_auroc", "all_auroc", "all_fpr95")

#: the paper's Table 3 (OpenCLIP ViT-B/32, nine data sets averaged; ImageNet-1k OOD; ECE and aECE
#: in percent there, as fractions here; both towers pruned), the rows Hydra Lab runs
PAPER_TABLE3 = (
    ("Single", "12", 73.65, 0.36, 0.98, 0.0868, 0.0857, 70.76, 75.20, 37.73),
    ("Temperature Scaling", "12", 73.65, 0.36, 0.90, 0.0403, 0.0380, 70.76, 75.20, 37.73),
    ("Taylor", "10", 60.75, 0.53, 1.65, 0.1376, 0.1367, 67.44, 79.41, 33.64),
    ("CircAvg", "10", 71.91, 0.38, 0.99, 0.0400, 0.0411, 76.88, 68.26, 47.64),
    ("Hydra (Circ)", "10x3", 74.00, 0.36, 0.93, 0.0349, 0.0335, 76.82, 68.05, 47.85),
)
PAPER_COLUMNS = (
    "system",
    "heads",
    "accuracy",
    "brier",
    "nll",
    "ece",
    "adaptive_ece",
    "all_auroc",
    "all_fpr95",
    "all_aupr_out",
)
#: our systems by the paper's row name
OURS = {
    "Single": SINGLE,
    "Temperature Scaling": TEMPERATURE,
    "Taylor": TAYLOR,
    "CircAvg": CIRCAVG,
    "Hydra (Taylor)": fused(HYDRA_TAYLOR),
    "Hydra (Circ)": fused(HYDRA_CIRC),
}
#: the statements Table 3 makes about pairs of its rows: (claim, system, reference, column)
CLAIMS = (
    ("Temperature Scaling lowers NLL", "Temperature Scaling", "Single", "nll"),
    ("Temperature Scaling lowers ECE", "Temperature Scaling", "Single", "ece"),
    ("Taylor lowers accuracy", "Taylor", "Single", "accuracy"),
    ("Taylor lowers OOD AUROC", "Taylor", "Single", "all_auroc"),
    ("CircAvg lowers accuracy", "CircAvg", "Single", "accuracy"),
    ("CircAvg beats Taylor on accuracy", "CircAvg", "Taylor", "accuracy"),
    ("CircAvg lowers ECE", "CircAvg", "Single", "ece"),
    ("CircAvg raises OOD AUROC", "CircAvg", "Single", "all_auroc"),
    ("CircAvg lowers FPR95", "CircAvg", "Single", "all_fpr95"),
    ("Hydra (Circ) raises accuracy", "Hydra (Circ)", "Single", "accuracy"),
    ("Hydra (Circ) lowers NLL", "Hydra (Circ)", "Single", "nll"),
    ("Hydra (Circ) lowers ECE", "Hydra (Circ)", "Single", "ece"),
    ("Hydra (Circ) raises OOD AUROC", "Hydra (Circ)", "Single", "all_auroc"),
    ("Hydra (Circ) lowers FPR95", "Hydra (Circ)", "Single", "all_fpr95"),
    ("Hydra (Circ) beats Temperature Scaling on ECE", "Hydra (Circ)", "Temperature Scaling", "ece"),
    (
        "Hydra (Circ) beats Temperature Scaling on AUROC",
        "Hydra (Circ)",
        "Temperature Scaling",
        "all_auroc",
    ),
)


def paper_table3() -> pd.DataFrame:
    """The paper's Table 3 rows Hydra Lab runs, in its units (ECE as a fraction)."""
    return pd.DataFrame(PAPER_TABLE3, columns=PAPER_COLUMNS)


def zero_shot_tables(systems: SystemsReport, circuits: Mapping) -> dict[str, pd.DataFrame]:
    """Every table of the zero-shot report, by CSV name (the bootstrap intervals are computed
    here)."""
    summary = systems.summary()
    rows = summary.set_index("system")
    main = rows.loc[[r for r in MAIN_ROWS if r in rows.index]].reset_index()
    table = systems.table()
    return {
        "table3_systems": pick(main, ["system", "kind", "heads", *MAIN_COLUMNS]),
        "near_far": pick(main, ["system", "heads", *NEAR_FAR]),
        "per_set": table[table["group"] != "id"].drop(columns=["kind"]).reset_index(drop=True),
        "differences_to_single": systems.differences(SINGLE, list(DIFFERENCES)),
        "paper_table3": paper_table3(),
        "paper_claims": _claims(systems),
        "circuit": circuits_table(circuits),
        "table7_cost": systems.cost.reset_index(),
        "summary_all_systems": summary,
        "all_sets": table,
    }


def _claims(systems: SystemsReport) -> pd.DataFrame:
    """Each statement of :data:`CLAIMS` against our paired difference and its 95% interval."""
    numbers = paper_table3().set_index("system")
    rows = []
    for claim, system, reference, column in CLAIMS:
        paper = float(numbers.loc[system, column] - numbers.loc[reference, column])
        row = {"claim": claim, "metric": column, "paper_difference": round(paper, 4)}
        row.update(claim_columns(systems, OURS[system], OURS[reference], column, paper, "ours"))
        rows.append(row)
    return pd.DataFrame(rows).rename(columns={"ours_verdict": "verdict"})


# --- Markdown -------------------------------------------------------------------------------------


def zero_shot_markdown(tables: Mapping[str, pd.DataFrame], setup: dict) -> str:
    """``report.md`` from the tables and the setup."""
    model, b = setup["model"], setup["budgets"]
    p = setup["protocol"]
    circuit = tables["circuit"].iloc[0]
    lines = [
        "# Hydra Ensembles, zero-shot CLIP: the paper's Table 3",
        "",
        f"Generated {setup['created']} by `{setup['command'] or DEFAULT_COMMAND}` in "
        f"{setup['total_seconds'] / 60:.1f} minutes on {setup['machine']} ({setup['device']}). "
        "Every number below was measured by this run, except the paper's, which are labelled.",
        "",
        *_random_weights_warning(setup),
        "## Setup",
        "",
        f"- **Model**: `{model['name']}`: {setup['model_description']}; head layout "
        f"{str(model.get('towers', '')).partition(': ')[2] or model['layers']} (head dim "
        f"{model['head_dim']}, image width {model['embed_dim']}).",
        f"- **Classifier**: zero-shot, {len(setup['classes'])} classes from the ID set, "
        f"prompt templates {', '.join(repr(t) for t in setup['templates'])}; logits = logit "
        f"scale x cosine of the image and class embeddings. {_towers_sentence(setup)} Nothing "
        "is trained.",
        f"- **Data**: heads are selected, and the temperature ({setup['temperature']:.4f}) is "
        f"fitted, on {p['id_search_n']:,} ID search images and the search OOD set(s) "
        f"{', '.join(p['search_ood'])}; every table is computed on {p['id_report_n']:,} ID report "
        f"images and the report OOD sets {', '.join(p['report_ood'])}, with 95% bootstrap "
        "intervals (value [lo, hi]) and paired intervals for differences.",
        f"- **Budgets**: every pruned model and member removes {b['budget']} of {b['total']} "
        f"heads; Taylor {_taylor_counts(b['removed_per_layer'], setup)}; CircAvg the greedy "
        "S_avg circuit. Hydra (Circ) is the paper's method: one circuit per criterion (CircAcc, "
        "CircOOD, CircAvg, each its own greedy search); Hydra (Taylor)'s members draw from the "
        f"{b['pool']} least useful heads of the Taylor ranking, seeds "
        f"{setup['protocol']['seeds']['pruning']}.",
        "",
        "## Table 3 - every system",
        "",
        markdown_table(tables["table3_systems"]),
        "",
        "The paper's Table 3 (OpenCLIP ViT-B/32, nine data sets averaged, ImageNet-1k as the OOD "
        "set, both towers pruned; ECE as a fraction here), for reference:",
        "",
        markdown_table(paper_frame(tables["paper_table3"])),
        "",
        "## Differences to the single model",
        "",
        markdown_table(tables["differences_to_single"]),
        "",
        "## Agreements and disagreements with the paper",
        "",
        "*agrees*: same direction as the paper's difference, our interval excludes 0; "
        "*disagrees*: opposite direction, interval excludes 0; *n.s.*: our interval contains 0.",
        "",
        markdown_table(_claims_shown(tables["paper_claims"])),
        "",
        *verdict_counts(
            tables["paper_claims"]
            .rename(columns={"verdict": "zero_shot_verdict"})
            .assign(fine_tuned_verdict="–")
        ),
        "",
        "## The CircAvg circuit",
        "",
        f"On the search split it moved accuracy from {100 * circuit['dense_search_accuracy']:.2f} "
        f"to {100 * circuit['search_accuracy']:.2f} and AUROC from "
        f"{100 * circuit['dense_search_auroc']:.2f} to {100 * circuit['search_auroc']:.2f} "
        f"({circuit['seconds']:.0f} s); removed in order: {circuit['removed']}.",
        "",
        "## Near and far OOD",
        "",
        markdown_table(tables["near_far"]),
        "",
        "## Cost",
        "",
        markdown_table(tables["table7_cost"]),
        "",
    ]
    return "\n".join(lines)


def _towers_sentence(setup: Mapping) -> str:
    """Which heads were pruned, against the paper."""
    if setup.get("towers", "image") == "both":
        layers = setup.get("tower_layers", {})
        shown = " + ".join(f"{n} {name}" for name, n in layers.items())
        return (
            f"Heads are pruned jointly in both towers (one head layout of {shown} layers), as "
            "the paper's Table 3 (D.3); each pruned model and member has the class embeddings "
            "of its own pruned text tower."
        )
    return (
        "Heads are pruned in the image tower only (--towers image); the paper's Table 3 prunes "
        "both towers (its Appendix E.3.2 has the image tower alone)."
    )


def _taylor_counts(removed, setup: Mapping) -> str:
    """Taylor's heads per layer: one number (the paper's "10 of 12"), or one per layer."""
    if isinstance(removed, int):
        return f"{removed} per layer of the image tower (the paper's 10 of 12 kept)"
    counts = sorted(set(removed))
    shown = " or ".join(str(c) for c in counts)
    return f"{shown} per layer, spread over the layers of both towers ({sum(removed)} in all)"


def _random_weights_warning(setup: Mapping) -> list[str]:
    """A warning at the top when the model's folder says its weights are random."""
    if not setup.get("random_weights"):
        return []
    return [
        f"**The weights of this model are random ({setup['model'].get('weights', '')}): no number "
        "in this report is a zero-shot result. Such a run checks that the pipeline works; only a "
        "run on pretrained weights says anything about the paper.**",
        "",
    ]


def _claims_shown(claims: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "paper says": claims["claim"],
            "paper": [f"{v:+.4g}" for v in claims["paper_difference"]],
            "ours": [
                signed(r["metric"], r["ours"], r["ours_lo"], r["ours_hi"])
                for _, r in claims.iterrows()
            ],
            "verdict": claims["verdict"],
            "verdict, near / far OOD": near_far_verdicts(claims, "ours"),
        }
    )


__all__ = [
    "DEFAULT_ZERO_SHOT_OUT",
    "ZeroShotReportConfig",
    "run_zero_shot_report",
    "zero_shot_config_from_args",
    "zero_shot_markdown",
    "zero_shot_tables",
]
