"""A Hydra Lab head mask applied inside an nnsight trace, the way ``hydra_core.ablate`` applies it.

Each layer's dropped heads are zeroed at the input of that layer's attention output projection
W_O: the input is multiplied by a 0/1 channel mask, the same multiplication ``ablate``'s pre-hook
does, so the two give bit-identical outputs. Layers that keep every head are left alone, as
``ablate`` leaves them.

``masks export --to nnsight`` copies these functions into the module it writes, so this file
imports nothing but torch (never nnsight, which patches Python's ``object`` when imported: the
caller brings it).
"""

from __future__ import annotations

import torch


def member_heads(members: dict, member: int | str) -> dict:
    """The kept heads ``{layer: [head, ...]}`` of ``member``, by name or by position in
    ``members`` (a dict from member name to its kept heads); a KeyError naming the members."""
    names = list(members)
    position = isinstance(member, int) and not isinstance(member, bool)
    if position and -len(names) <= member < len(names):
        return members[names[member]]
    if member in members:
        return members[member]
    raise KeyError(
        f"no member {member!r}; the members are {names} (or their positions 0..{len(names) - 1})"
    )


def zero_dropped_heads(model, kept: dict, projections: list, heads: list, head_dim: int) -> None:
    """Inside ``with model.trace(...)``: zero the heads not in ``kept`` at the input of W_O.

    Args:
        model: the nnsight model (``NNsight(m)``, or a ``LanguageModel``) wrapping the timm
            VisionTransformer or Hugging Face classifier the masks were made for.
        kept: per layer (an int key), the heads it keeps.
        projections: per layer, W_O's module path in the wrapped model, as
            ``named_modules()`` names it (``blocks.0.attn.proj``,
            ``bert.encoder.layer.0.attention.output.dense``).
        heads: per layer, its number of heads.
        head_dim: d_k, the width of one head.
    """
    envoys = dict(model.named_modules())
    for layer, path in enumerate(projections):
        keep = torch.zeros(heads[layer], dtype=torch.bool)
        keep[list(kept[layer])] = True
        if bool(keep.all()):
            continue
        projection = envoys[f"{model.path}.{path}"]
        x = projection.input  # (B, N, H * d_k): the heads' outputs, concatenated
        channels = keep.repeat_interleave(head_dim).to(device=x.device, dtype=x.dtype)
        projection.input = x * channels
