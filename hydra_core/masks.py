"""Ensemble member masks: strategies that produce them, their overlap, and the mask file format.

A member mask is a bool tensor (layers, heads), True = kept. Strategies (paper 4.3, B.5):
- :func:`mask_from_ranking` - prune the ``budget`` least useful heads of a ranking (a circuit);
- :func:`seed_sampled_masks` - per member seed, prune ``prune`` heads drawn at random from the
  ``pool`` least useful of a ranking (the paper's "48 out of 100");
- Taylor and CAHP rankings/masks plug into the same two functions; masks drawn by hand are plain
  tensors.

Mask file (docs/cli.md, "Mask files"), JSON::

    {"format": "hydra-masks", "version": 1,
     "model": {"name": ..., "layers": L, "heads": H, "weights": <fingerprint>},
     "members": [{"name": ..., "source": ..., "keep": {"<layer>": [head, ...]},
                  "provenance": {"strategy": ..., "parameters": {...}, "ranking": {...}}}],
     "created": "<ISO time>"}

A model whose layout names its towers (an OpenCLIP zero-shot classifier) says which in the model
block, ``"towers": {"image": 12, "text": 12}`` (the joint layout: layers 0-11 the image tower's,
12-23 the text tower's) or ``{"image": 12}`` (the image tower alone). A file without the entry
was written for a model of one transformer, or by a Hydra Lab that pruned only OpenCLIP's image
tower: it loads as the image-only layout, and onto a model with the joint layout it is refused
with the way to load the model image-only.

``provenance`` says how a member was made, so that a file explains itself later: the strategy
and its parameters (budget, pool, seed, ...) and the ranking it drew from (the greedy search's
objective, budget and steps made, or Taylor's samples, with the search sets and their sizes).
It is optional: files written before it existed import as they are.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from hydra_core.errors import InputError, choice
from hydra_core.files import atomic_write
from hydra_core.models.adapter import HeadLayout, as_keep_mask, head_label
from hydra_core.outputs import describe_towers
from hydra_core.types import Head

FORMAT = "hydra-masks"
VERSION = 1


class MaskFileError(InputError):
    """A mask file that cannot be read, or does not fit the loaded model."""


@dataclass(frozen=True, eq=False)
class MemberMask:
    """One ensemble member: a name, where its mask came from (a sentence, and the provenance
    block of the mask file: strategy, parameters, ranking, search data), and the mask (L, H)
    bool."""

    name: str
    source: str
    keep: torch.Tensor
    provenance: dict = field(default_factory=dict)

    @property
    def kept(self) -> int:
        return int(self.keep.sum())


def _check_ranking(ranking: Sequence[Head], layout: HeadLayout) -> list[Head]:
    heads = [(int(layer), int(head)) for layer, head in ranking]
    if len(set(heads)) != len(heads):
        raise ValueError("the ranking lists a head more than once")
    for layer, head in heads:
        if not (0 <= layer < layout.num_layers and 0 <= head < layout.num_heads[layer]):
            raise ValueError(
                f"the ranking names {head_label(layer, head)}, which the model "
                f"({layout.num_layers} layers x {layout.max_heads} heads) does not have"
            )
    return heads


def mask_from_ranking(ranking: Sequence[Head], budget: int, layout: HeadLayout) -> torch.Tensor:
    """Keep every head except the first ``budget`` of ``ranking`` (least useful first)."""
    heads = _check_ranking(ranking, layout)
    if not 0 <= budget <= len(heads):
        raise ValueError(f"budget {budget} must be between 0 and the ranking's length {len(heads)}")
    keep = layout.all_kept()
    for layer, head in heads[:budget]:
        keep[layer, head] = False
    return keep


def seed_sampled_masks(
    ranking: Sequence[Head], *, prune: int, pool: int, seeds: Sequence[int], layout: HeadLayout
) -> list[torch.Tensor]:
    """One mask per seed: prune ``prune`` heads drawn without replacement from the ``pool`` least
    useful heads of ``ranking`` (paper B.5: "48 of 100"). Members therefore share their most useful
    heads and differ in which of the weak ones they drop."""
    heads = _check_ranking(ranking, layout)
    if not 1 <= pool <= len(heads):
        raise ValueError(f"pool {pool} must be between 1 and the ranking's length {len(heads)}")
    if not 0 <= prune <= pool:
        raise ValueError(f"cannot prune {prune} heads out of a pool of {pool}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must differ so that members differ, got {list(seeds)}")
    masks = []
    for seed in seeds:
        generator = torch.Generator().manual_seed(int(seed))
        chosen = torch.randperm(pool, generator=generator)[:prune].tolist()
        keep = layout.all_kept()
        for i in chosen:
            keep[heads[i]] = False
        masks.append(keep)
    return masks


def jaccard_matrix(members: Sequence[MemberMask]) -> pd.DataFrame:
    """Pairwise Jaccard similarity of the members' kept-head sets (1 = identical)."""
    names = [m.name for m in members]
    out = np.ones((len(members), len(members)))
    for i, a in enumerate(members):
        for j, b in enumerate(members):
            union = int((a.keep | b.keep).sum())
            out[i, j] = int((a.keep & b.keep).sum()) / union if union else 1.0
    return pd.DataFrame(out, index=names, columns=names)


def per_layer_counts(members: Sequence[MemberMask]) -> pd.DataFrame:
    """Kept heads per layer (rows) for each member (columns), with a total row."""
    table = pd.DataFrame({m.name: m.keep.sum(1).tolist() for m in members})
    table.index = [f"layer {i}" for i in range(len(table))]
    table.loc["total"] = table.sum()
    return table


def model_identity(name: str, layout: HeadLayout, fingerprint: str) -> dict:
    """The ``model`` block of a mask file (with ``towers`` when the layout names them)."""
    identity = {
        "name": name,
        "layers": layout.num_layers,
        "heads": layout.max_heads,
        "weights": fingerprint,
    }
    if layout.towers:
        identity["towers"] = dict(layout.towers)
    return identity


def _check_towers(model: dict, layout: HeadLayout) -> None:
    """Refuse masks made for another tower layout, saying how to load the model that fits."""
    ours = dict(layout.towers)
    theirs = model.get("towers")
    if theirs is None:
        if len(ours) <= 1:
            return  # one transformer, or an image-only file from before towers were named
        theirs = {"image": model.get("layers")}
    if not isinstance(theirs, dict) or theirs == ours:
        return
    fix = "load the model they were made for"
    if ours and len(theirs) < len(ours) and list(theirs) == list(ours)[: len(theirs)]:
        fix = "load the model with towers 'image' (--towers image; Setup: Towers)"
    elif ours and len(ours) < len(theirs) and list(ours) == list(theirs)[: len(ours)]:
        fix = "load the model with towers 'both' (--towers both; Setup: Towers)"
    raise MaskFileError(
        f"the masks were made for the head layout {describe_towers(theirs)} "
        f"({model.get('name')!r}); the loaded model's is {describe_towers(ours)}: {fix}"
    )


def masks_to_json(members: Sequence[MemberMask], identity: dict) -> dict:
    if not members:
        raise ValueError("no members to save")
    return {
        "format": FORMAT,
        "version": VERSION,
        "model": dict(identity),
        "members": [
            {
                "name": m.name,
                "source": m.source,
                "keep": {
                    str(layer): m.keep[layer].nonzero().flatten().tolist()
                    for layer in range(m.keep.shape[0])
                },
                **({"provenance": m.provenance} if m.provenance else {}),
            }
            for m in members
        ],
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


def save_masks(path: str | Path, members: Sequence[MemberMask], identity: dict) -> Path:
    """Write a mask file (atomically); returns its path."""
    path = Path(path)
    text = json.dumps(masks_to_json(members, identity), indent=2)
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def masks_from_json(
    data: object,
    layout: HeadLayout,
    identity: dict | None = None,
    *,
    allow_other_weights: bool = False,
    allow_identical: bool = False,
) -> list[MemberMask]:
    """Validate a parsed mask file against the loaded model and return its members.

    Every member lists every layer: a layer whose heads are all pruned is an empty list, never
    an omitted key (an omission is far more often a mistake than a wish to drop a layer).

    Raises :class:`MaskFileError` naming what does not fit: format, version, model shape, weights
    (unless ``allow_other_weights``), missing layers, layers and heads out of range, duplicate
    heads, empty members, and members that keep the same heads (unless ``allow_identical``,
    for the identical-members ablation: they add no diversity).
    """
    if not isinstance(data, dict):
        raise MaskFileError(f"a mask file holds a JSON object, found {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise MaskFileError(
            f"not a Hydra Lab mask file: 'format' is {data.get('format')!r}, expected {FORMAT!r}"
        )
    if data.get("version") != VERSION:
        raise MaskFileError(
            f"mask file version {data.get('version')!r} is not supported (expected {VERSION})"
        )
    model = data.get("model")
    if not isinstance(model, dict):
        raise MaskFileError("mask file has no 'model' object")
    _check_towers(model, layout)
    if (model.get("layers"), model.get("heads")) != (layout.num_layers, layout.max_heads):
        raise MaskFileError(
            f"the masks were made for a model with {model.get('layers')} layers x "
            f"{model.get('heads')} heads ({model.get('name')!r}); the loaded model has "
            f"{layout.num_layers} x {layout.max_heads}"
        )
    if identity and not allow_other_weights and not model.get("weights"):
        raise MaskFileError(
            f"the mask file names no weights fingerprint (written by hand or by another tool), "
            f"so nothing shows it was made for {identity.get('name')!r} (weights "
            f"{identity.get('weights')}); make the masks with this model, or accept the file as "
            f"it is with {choice('allow_other_weights')}"
        )
    if identity and not allow_other_weights and model.get("weights") != identity.get("weights"):
        raise MaskFileError(
            f"the masks were made for {model.get('name')!r} with weights {model.get('weights')}; "
            f"the loaded model {identity.get('name')!r} has weights {identity.get('weights')} "
            "(same shape, other weights): use masks made for this model, or accept them anyway "
            f"with {choice('allow_other_weights')}"
        )
    raw = data.get("members")
    if not isinstance(raw, list) or not raw:
        raise MaskFileError("mask file has no members")
    members, names = [], set()
    for i, m in enumerate(raw):
        where = f"member {i}"
        if not isinstance(m, dict) or not isinstance(m.get("keep"), dict):
            raise MaskFileError(f"{where} has no 'keep' object mapping layers to kept heads")
        name = str(m.get("name") or f"member {i}")
        where = f"member {name!r}"
        if name in names:
            raise MaskFileError(f"two members are named {name!r}")
        names.add(name)
        keep = torch.zeros(layout.shape, dtype=torch.bool)
        for layer_key, heads in m["keep"].items():
            try:
                layer = int(layer_key)
            except ValueError:
                raise MaskFileError(f"{where}: layer key {layer_key!r} is not a number") from None
            if not 0 <= layer < layout.num_layers:
                raise MaskFileError(
                    f"{where}: layer {layer} does not exist (layers 0..{layout.num_layers - 1})"
                )
            if not isinstance(heads, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in heads
            ):
                raise MaskFileError(
                    f"{where}: layer {layer} must list head indices (integers), got {heads!r}"
                )
            if len(set(heads)) != len(heads):
                raise MaskFileError(f"{where}: layer {layer} lists a head twice: {heads}")
            for h in heads:
                if not 0 <= h < layout.num_heads[layer]:
                    raise MaskFileError(
                        f"{where}: {head_label(layer, h)} does not exist "
                        f"(layer {layer} has heads 0..{layout.num_heads[layer] - 1})"
                    )
                keep[layer, h] = True
        listed = {int(k) for k in m["keep"]}
        missing = [layer for layer in range(layout.num_layers) if layer not in listed]
        if missing:
            raise MaskFileError(
                f"{where}: layer(s) {', '.join(map(str, missing))} missing from 'keep'; list "
                "every layer, with [] for a layer whose heads are all pruned"
            )
        if not keep.any():
            raise MaskFileError(f"{where} keeps no head at all")
        provenance = m.get("provenance", {})  # absent from files written before it existed
        if not isinstance(provenance, dict):
            raise MaskFileError(
                f"{where}: 'provenance' must be an object (strategy, parameters, ranking), got "
                f"{type(provenance).__name__}"
            )
        source = str(m.get("source", "file"))
        members.append(MemberMask(name, source, as_keep_mask(layout, keep), provenance))
    if not allow_identical:
        for i, a in enumerate(members):
            twin = next((b for b in members[i + 1 :] if torch.equal(a.keep, b.keep)), None)
            if twin is not None:
                raise MaskFileError(
                    f"members {a.name!r} and {twin.name!r} keep the same heads, so they add no "
                    "diversity; make them differ, or allow identical members (--allow-identical) "
                    "for the identical-members ablation"
                )
    return members


def read_masks(
    content: bytes,
    where: str,
    layout: HeadLayout,
    identity: dict | None = None,
    *,
    allow_other_weights: bool = False,
    allow_identical: bool = False,
) -> list[MemberMask]:
    """The members of a mask file's bytes (a file read, an upload on the Masks page), validated
    (see :func:`masks_from_json`); ``where`` names the file in messages. Anything that is not a
    UTF-8 JSON mask file of the loaded model is a :class:`MaskFileError` in one line."""
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise MaskFileError(
            f"{where} is not a mask file: not UTF-8 text (byte {content[exc.start]:#x} at "
            f"position {exc.start}); a mask file is the JSON that masks or the Masks page writes"
        ) from None
    if not text.strip():
        raise MaskFileError(f"{where} is empty; a mask file is the JSON that masks writes")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MaskFileError(
            f"{where} is not valid JSON ({exc}); a mask file is the JSON that masks or the Masks "
            "page writes"
        ) from None
    try:
        return masks_from_json(
            data,
            layout,
            identity,
            allow_other_weights=allow_other_weights,
            allow_identical=allow_identical,
        )
    except MaskFileError as exc:
        raise MaskFileError(f"{where}: {exc}") from None


def load_masks(
    path: str | Path,
    layout: HeadLayout,
    identity: dict | None = None,
    *,
    allow_other_weights: bool = False,
    allow_identical: bool = False,
) -> list[MemberMask]:
    """Read and validate a mask file (see :func:`read_masks`)."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise MaskFileError(f"mask file {path} is a folder; give the JSON file masks wrote")
    try:
        content = path.read_bytes()
    except FileNotFoundError:
        raise MaskFileError(
            f"mask file {path} does not exist; give the JSON file masks wrote"
        ) from None
    except OSError as exc:
        raise MaskFileError(f"cannot read mask file {path} ({exc.strerror or exc})") from None
    return read_masks(
        content,
        str(path),
        layout,
        identity,
        allow_other_weights=allow_other_weights,
        allow_identical=allow_identical,
    )
