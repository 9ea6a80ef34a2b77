"""Hydra ensembles: fuse head-pruned members into one model, and account for what it costs."""

from hydra_core.hydra.cost import (
    VitShape,
    cost_table,
    count_macs,
    count_params,
    formula_macs,
    formula_params,
    measure_latencies,
    measure_latency,
)
from hydra_core.hydra.fused import HydraViT, ensemble_probs, fuse_members, load_hydra, save_hydra
from hydra_core.hydra.fused_clip import HydraZeroShot
from hydra_core.hydra.fused_text import HydraText
from hydra_core.hydra.source import FUSED_FILE  # registers fused Hydra files as a model source

__all__ = [
    "FUSED_FILE",
    "HydraText",
    "HydraViT",
    "HydraZeroShot",
    "VitShape",
    "cost_table",
    "count_macs",
    "count_params",
    "ensemble_probs",
    "formula_macs",
    "formula_params",
    "fuse_members",
    "load_hydra",
    "measure_latencies",
    "measure_latency",
    "save_hydra",
]
