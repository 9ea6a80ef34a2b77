"""The zero-shot report's configuration (:class:`ZeroShotReportConfig`, full or quick), its head
budgets and its seeds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hydra_core.errors import InputError
from hydra_core.experiment.pruning import Budgets
from hydra_core.models.adapter import HeadLayout
from hydra_core.models.zero_shot import DEFAULT_TEMPLATE, DEFAULT_TOWERS

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
        candidates: K of the guided search for every greedy search (None: the exact search;
            docs/guided-search.md): the heads of both towers of an OpenCLIP model make the
            exact search long on a CPU.
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
    candidates: int | None = None
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


def zero_shot_seeds(config: ZeroShotReportConfig) -> dict:
    """The run's seeds, for ``setup["protocol"]``."""
    return {"pruning": list(config.seeds), "bootstrap": {"n_boot": 1000, "seed": 0}}
