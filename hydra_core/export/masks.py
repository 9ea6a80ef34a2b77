"""Member masks for other tools: plain ``{layer: [heads kept]}`` JSON, and nnsight.

- :func:`plain_masks`: the members' kept heads as plain JSON,
  ``{member name: {layer: [head, ...]}}`` (one member: ``{layer: [head, ...]}``), for any tool
  that can read a list of heads.
- :func:`nnsight_ablate`: inside an nnsight trace, switch off the heads a mask drops, at the input
  of each block's attention output projection W_O, exactly as :func:`~hydra_core.ablate` does
  (the same multiplication by a 0/1 channel mask, so the outputs are bit-identical), for timm
  ViTs and Hugging Face encoders.
- :func:`nnsight_module`: the same as a small Python module that needs only torch (its functions
  are copied from :mod:`~hydra_core.export.nnsight_apply`): the members' masks and the model's
  W_O paths, and ``apply(model, member)``.

OpenCLIP towers are refused for nnsight: their ``nn.MultiheadAttention`` reads W_O's weight
itself, so W_O's input is never a module input that nnsight could change.
"""

from __future__ import annotations

import datetime as _dt
import inspect
import json
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from hydra_core.errors import InputError
from hydra_core.export import nnsight_apply
from hydra_core.masks import MemberMask
from hydra_core.models.adapter import as_keep_mask, family_of
from hydra_core.models.family import UnsupportedModelError

#: the targets of ``masks export --to``
TARGETS = ("nnsight", "plain")


def kept_heads(keep: torch.Tensor) -> dict[int, list[int]]:
    """A mask (L, H) bool -> ``{layer: [kept head, ...]}``, every layer listed."""
    return {layer: keep[layer].nonzero().flatten().tolist() for layer in range(keep.shape[0])}


def select_members(members: Sequence[MemberMask], member: str | int | None) -> list[MemberMask]:
    """All members (``member`` None), or the one named ``member`` or at position ``member``
    (a number given as text counts as a position unless a member has that name); an
    :class:`~hydra_core.errors.InputError` naming the members otherwise."""
    members = list(members)
    if member is None:
        return members
    by_name = {m.name: m for m in members}
    if str(member) in by_name:
        return [by_name[str(member)]]
    try:
        position = int(member)
    except ValueError:
        position = None
    if position is not None and 0 <= position < len(members):
        return [members[position]]
    names = ", ".join(repr(m.name) for m in members)
    raise InputError(
        f"no member {member!r} in the mask file; its members are {names} (or positions "
        f"0..{len(members) - 1})"
    )


def plain_masks(members: Sequence[MemberMask]) -> dict:
    """``{member name: {"layer": [kept head, ...]}}``; one member alone: ``{"layer": [...]}``.
    Layers are strings (JSON object keys), every layer is listed (``[]``: all heads pruned)."""
    if not members:
        raise ValueError("no members to export")
    plain = {m.name: {str(k): v for k, v in kept_heads(m.keep).items()} for m in members}
    return next(iter(plain.values())) if len(members) == 1 else plain


def plain_masks_text(members: Sequence[MemberMask]) -> str:
    """:func:`plain_masks` as JSON text, one line per layer."""
    plain = plain_masks(members)
    nested = len(members) > 1

    def layers(entry: dict, indent: str) -> str:
        rows = [f"{indent}{json.dumps(k)}: {json.dumps(v)}" for k, v in entry.items()]
        return "{\n" + ",\n".join(rows) + "\n" + indent[:-2] + "}"

    if not nested:
        return layers(plain, "  ") + "\n"
    blocks = [f"  {json.dumps(name)}: {layers(entry, '    ')}" for name, entry in plain.items()]
    return "{\n" + ",\n".join(blocks) + "\n}\n"


@dataclass(frozen=True)
class NnsightLayout:
    """Where nnsight meets a model's heads: W_O's module path per layer (as the model's own
    ``named_modules()`` names it), the heads per layer and d_k."""

    projections: tuple[str, ...]
    heads: tuple[int, ...]
    head_dim: int


def nnsight_layout(model: nn.Module) -> NnsightLayout:
    """The :class:`NnsightLayout` of ``model`` (a Hugging Face classifier inside Hydra Lab's
    wrapper counts its paths from the Hugging Face model, the one nnsight wraps); an
    :class:`~hydra_core.models.family.UnsupportedModelError` for a model whose W_O is not
    called as a module."""
    family = family_of(model)
    if not family.projection_is_called:
        raise UnsupportedModelError(
            f"nnsight cannot switch heads off in this {family.name} model: its attention reads "
            "W_O's weight itself, so W_O's input is never a module input; use the plain JSON "
            "({layer: [heads kept]}) instead"
        )
    bare = family.bare_model(model)
    names = {id(module): name for name, module in bare.named_modules()}
    blocks = family.blocks(model)
    layout = family.layout(model)
    projections = tuple(names[id(family.output_projection(block))] for block in blocks)
    return NnsightLayout(projections, tuple(layout.num_heads), layout.head_dim)


def nnsight_ablate(nnsight_model, model: nn.Module, keep: torch.Tensor | MemberMask) -> None:
    """Inside ``with nnsight_model.trace(...)``: switch off the heads ``keep`` drops (True =
    kept), as :func:`~hydra_core.ablate` does, so the traced output equals the ablated model's
    bit for bit.

    Args:
        nnsight_model: the nnsight wrapper (``nnsight.NNsight(m)``) of ``model``, or of the
            Hugging Face model inside a text model Hydra Lab loaded (``loaded.model.hf``).
        model: the model, to read where its heads are.
        keep: a head mask (L, H) bool, or a member of a mask file (``hc.load_masks``).
    """
    if isinstance(keep, MemberMask):
        keep = keep.keep
    family = family_of(model)
    keep = as_keep_mask(family.layout(model), keep)
    layout = nnsight_layout(model)
    nnsight_apply.zero_dropped_heads(
        nnsight_model,
        kept_heads(keep),
        list(layout.projections),
        list(layout.heads),
        layout.head_dim,
    )


_MODULE_DOC = '''"""Hydra Lab head masks for nnsight: {members} of {name}
({layers} layers x {heads} heads, weights {weights}).

Written by Hydra Lab (`python -m hydra_core masks export --to nnsight`), {created}.
It needs only torch. Inside an nnsight trace, `apply(model, member)` switches off the heads
the member drops, zeroing them at the input of each layer's attention output projection (W_O),
exactly as Hydra Lab's `ablate` does:

    from nnsight import NNsight
    import {module}

    model = NNsight(net)  # the model the masks were made for ({family} family)
    with model.trace(inputs):  # images, or input_ids=..., attention_mask=... for a text model
        {module}.apply(model, {first!r})  # a member's name or position
        output = model.output.save()
"""'''

_APPLY = '''

def apply(model, member=0):
    """Inside ``with model.trace(...)``: switch off the heads ``member`` (a name of MEMBERS or a
    position) drops, at the input of each layer's W_O."""
    zero_dropped_heads(model, member_heads(MEMBERS, member), PROJECTIONS, HEADS, HEAD_DIM)
'''


def nnsight_module(
    members: Sequence[MemberMask], model: nn.Module, identity: dict, *, module: str = "hydra_masks"
) -> str:
    """The source of a Python module holding ``members``' masks for ``model`` and
    ``apply(model, member)`` (see the module docstring); ``module`` is the name its example
    imports it by. ``identity`` is the mask file's ``model`` block."""
    if not members:
        raise ValueError("no members to export")
    layout = nnsight_layout(model)
    family = family_of(model)
    doc = _MODULE_DOC.format(
        members=f"{len(members)} member{'s' if len(members) != 1 else ''}",
        name=identity.get("name"),
        layers=len(layout.heads),
        heads=max(layout.heads),
        weights=identity.get("weights"),
        created=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        module=module,
        family=family.name,
        first=members[0].name,
    )
    lines = [doc, "", "import torch", ""]
    lines.append(f"MODEL = {json.dumps(dict(identity))}")
    lines.append(f"HEAD_DIM = {layout.head_dim}")
    lines.append(f"HEADS = {list(layout.heads)}")
    lines.append("PROJECTIONS = [")
    lines += [f"    {json.dumps(path)}," for path in layout.projections]
    lines.append("]")
    lines.append("MEMBERS = {")
    for member in members:
        lines.append(f"    {json.dumps(member.name)}: {kept_heads(member.keep)!r},")
    lines.append("}")
    functions = [nnsight_apply.member_heads, nnsight_apply.zero_dropped_heads]
    source = "\n".join(lines) + _APPLY
    return source + "".join("\n\n" + inspect.getsource(f) for f in functions)
