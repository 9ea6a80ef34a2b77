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

from dataclasses import asdict
from pathlib import Path

from hydra_core.baselines.systems import TemperatureBaseline
from hydra_core.cache import DiskCache
from hydra_core.errors import InputError
from hydra_core.experiment.facts import run_options
from hydra_core.experiment.pipeline import Pipeline
from hydra_core.experiment.run import system_name
from hydra_core.hydra.systems import Hydra, Pruned, Single
from hydra_core.models.zero_shot import check_towers, declares_random_weights
from hydra_core.report.tables import HYDRA_CIRC, HYDRA_TAYLOR, fused
from hydra_core.report.zero_shot_config import (
    CIRCAVG,
    DEFAULT_ZERO_SHOT_OUT,
    SINGLE,
    TAYLOR,
    ZeroShotReportConfig,
    zero_shot_budgets,
    zero_shot_config_from_args,
    zero_shot_seeds,
)
from hydra_core.report.zero_shot_markdown import zero_shot_markdown
from hydra_core.report.zero_shot_tables import zero_shot_tables
from hydra_core.types import Log, StageProgress


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
    run.candidates = config.candidates
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
    setup = run.setup("zero-shot", budgets, zero_shot_seeds(config), members)
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


def _load(config: ZeroShotReportConfig):
    """The zero-shot classifier (classes: the ID set's) and the benchmark; refuses a model that
    is not an OpenCLIP source."""
    from hydra_core.data.benchmark import default_benchmark, folder_benchmark
    from hydra_core.models.preprocess import input_format
    from hydra_core.models.zero_shot import folder_classes
    from hydra_core.zoo.registry import load_model
    from hydra_core.zoo.sources import is_zero_shot

    if not is_zero_shot(config.model):
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


# --- Markdown -------------------------------------------------------------------------------------


__all__ = [
    "DEFAULT_ZERO_SHOT_OUT",
    "ZeroShotReportConfig",
    "run_zero_shot_report",
    "zero_shot_config_from_args",
    "zero_shot_markdown",
    "zero_shot_tables",
]
