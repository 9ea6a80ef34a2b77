"""What members must agree on, and the description a fused model's file header holds.

Each fused model has a frozen dataclass config (its architecture and each member's kept heads),
built from the members' agreed architecture (:func:`agreed_architecture`, :func:`member_config`)
and written as JSON into the safetensors header (:class:`HeaderConfig`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, fields
from typing import ClassVar

import torch

from hydra_core.models.family import UnsupportedModelError
from hydra_core.models.parts import FusionParts


class HeaderConfig:
    """The JSON header entry of a fused model's config (a frozen dataclass deriving from this):
    the file format and version first, then every field, in order, so that files saved by earlier
    versions of this code still load."""

    #: the header's ``format`` and ``version``
    header_format: ClassVar[tuple[str, int]]
    #: fields stored as JSON lists that are tuples here (besides ``kept_heads``)
    tuple_fields: ClassVar[tuple[str, ...]] = ()

    def to_json(self) -> dict:
        """The header entry: file format and version, then every field (tuples become lists)."""
        fmt, version = self.header_format
        return {"format": fmt, "version": version, **asdict(self)}

    @classmethod
    def from_json(cls, header: dict) -> HeaderConfig:
        """Read a header entry written by :meth:`to_json` (format and version checked by the
        caller); a missing or unknown field is a ValueError naming it."""
        names = [f.name for f in fields(cls)]
        values = {k: v for k, v in header.items() if k not in ("format", "version")}
        missing = [n for n in names if n not in values]
        if missing:
            raise ValueError(f"it lacks the fields {', '.join(missing)}")
        unknown = [k for k in values if k not in names]
        if unknown:
            raise ValueError(f"it has unknown fields {', '.join(unknown)}")
        for name in cls.tuple_fields:
            values[name] = tuple(values[name])
        values["kept_heads"] = tuple(
            tuple(tuple(layer) for layer in member) for member in values["kept_heads"]
        )
        return cls(**values)


def shared_settings(parts: FusionParts, where: str) -> tuple[str, int, float]:
    """The MLP activation, MLP width and LayerNorm eps, which a fused model has once for all its
    layers; a model whose layers differ in one is refused. The eps is 1e-6 when there is no
    norm."""
    acts = {block.act for block in parts.blocks}
    hidden = {int(block.fc1.weight.shape[0]) for block in parts.blocks}
    eps = {norm.eps for norm in parts.norms()}
    for name, values in (("MLP activations", acts), ("MLP widths", hidden), ("LayerNorm eps", eps)):
        if len(values) > 1:
            raise UnsupportedModelError(
                f"{where} cannot be fused: its layers differ in {name} ({sorted(values)})"
            )
    return acts.pop(), hidden.pop(), eps.pop() if eps else 1e-6


def agreed_architecture(specs: Sequence[dict]) -> dict:
    """The members' architecture (a fused model's ``architecture`` dict); a ValueError naming the
    first entry the members disagree on, with every member's value."""
    for key in specs[0]:
        values = [spec[key] for spec in specs]
        if any(v != values[0] for v in values):
            listing = ", ".join(f"member {i} has {v!r}" for i, v in enumerate(values))
            raise ValueError(f"members disagree on {key}: {listing}")
    return specs[0]


def member_config(
    config_class: type, spec: dict, heads: Sequence[Sequence[torch.Tensor]]
) -> HeaderConfig:
    """The config of M members: their agreed architecture (entries that are not fields of
    ``config_class``, such as ``mlp_hidden``, are only checked, not stored) and each member's
    kept heads per layer."""
    names = {f.name for f in fields(config_class)}
    return config_class(
        num_members=len(heads),
        **{k: v for k, v in spec.items() if k in names},
        kept_heads=tuple(tuple(tuple(h.tolist()) for h in member) for member in heads),
    )
