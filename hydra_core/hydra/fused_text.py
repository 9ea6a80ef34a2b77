"""The fused text model's public names (:mod:`hydra_core.hydra.fusion.post_norm` holds the code):
:class:`HydraText`, M head-pruned BERT, RoBERTa, MPNet or DistilBERT classifiers run as one model,
and its :class:`HydraTextConfig` (file format ``hydra-fused-text``). They fuse through
:func:`hydra_core.hydra.fused.fuse_members`, as every family does.
"""

from hydra_core.hydra.fusion.post_norm import (
    FORMAT,
    FORMAT_VERSION,
    HydraText,
    HydraTextConfig,
)

__all__ = ["FORMAT", "FORMAT_VERSION", "HydraText", "HydraTextConfig"]
