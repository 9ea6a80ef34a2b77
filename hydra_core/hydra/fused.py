"""Hydra fusion's public names, where the app, the command line and the tests import them from.

The code lives in :mod:`hydra_core.hydra.fusion` (its docstring explains how M head-pruned members
run as one model, in one pass): :func:`fuse_members` and :func:`check_fusable` for every family,
:class:`HydraViT` and its :class:`HydraConfig`, :func:`save_hydra` and :func:`load_hydra`.
"""

from hydra_core.hydra.fusion.fuse import check_fusable, ensemble_probs, fuse_members
from hydra_core.hydra.fusion.io import load_hydra, save_hydra
from hydra_core.hydra.fusion.pre_norm import FORMAT, FORMAT_VERSION, HydraConfig, HydraViT
from hydra_core.hydra.fusion.zero_shot import ZERO_SHOT_ENTRY
from hydra_core.models.parts import POOLS, plain_patch_conv

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "POOLS",
    "ZERO_SHOT_ENTRY",
    "HydraConfig",
    "HydraViT",
    "check_fusable",
    "ensemble_probs",
    "fuse_members",
    "load_hydra",
    "plain_patch_conv",
    "save_hydra",
]
