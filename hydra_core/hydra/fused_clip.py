"""The fused zero-shot model's public names (:mod:`hydra_core.hydra.fusion.zero_shot` holds the
code): :class:`HydraZeroShot`, a fused OpenCLIP image tower with the zero-shot head its members
share. OpenCLIP towers and zero-shot classifiers fuse through
:func:`hydra_core.hydra.fused.fuse_members`, as every family does; ``fuse_clip_members`` and
``check_clip_fusable`` are those functions under their earlier names.
"""

from hydra_core.hydra.fusion.fuse import check_fusable as check_clip_fusable
from hydra_core.hydra.fusion.fuse import fuse_members as fuse_clip_members
from hydra_core.hydra.fusion.zero_shot import CLASS_EMBEDDINGS, HydraZeroShot

__all__ = ["CLASS_EMBEDDINGS", "HydraZeroShot", "check_clip_fusable", "fuse_clip_members"]
