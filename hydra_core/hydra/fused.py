"""Hydra fusion (paper Section 4.2): M head-pruned ViT members run as one model, in one pass.

The members' token streams are stacked along a leading member axis, ``(M, B, N, d)``. Each fused
block applies, per member, LayerNorm and a grouped fully-connected Q/K/V projection (member m meets
only its own stream and its own kept heads), runs the attention of all members' heads in one
``scaled_dot_product_attention`` call, projects back to each member's stream with a grouped output
projection, and then applies one MLP - the members' MLPs averaged - to every stream at once.

Members may keep different numbers of heads per layer. A layer's per-member weights are padded with
zero rows/columns to the largest head count of that layer: a padded head has q = k = v = 0, so its
attention output is exactly 0, and its W_O columns are 0, so it adds exactly nothing.

Anything identical across members is stored once (``S = 1`` on the leading axis of its weights)
instead of per member (``S = M``). While the stem and the leading blocks are shared, the stream
keeps ``S = 1`` and is computed once; the first per-member weight broadcasts it to M streams.

The building blocks (grouped linear layers, stacked LayerNorms, the merged MLP, the fused block,
the stem) are in :mod:`hydra_core.hydra.layers`. ``fuse_members`` builds a :class:`HydraViT` from
(model, keep) pairs; ``save_hydra`` and ``load_hydra`` store it as safetensors with its
:class:`HydraConfig` as JSON and rebuild it from the file alone. Both routes go through
:func:`assemble_vit`, so a loaded model is the same module as the saved one. The members' parts
are read as :class:`StemParts` and :class:`BlockParts`, so that other pre-norm ViTs map onto the
same model: :mod:`hydra_core.hydra.fused_clip` fuses OpenCLIP image towers this way.
The fused model is for inference: the members' dropout, drop-path and patch dropout are not kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from timm.layers import GELU, GELUTanh, LayerScale, QuickGELU
from timm.models.vision_transformer import global_pool_nlc
from torch import nn

from hydra_core.files import atomic_write
from hydra_core.hydra.fused_text import FORMAT as TEXT_FORMAT
from hydra_core.hydra.fused_text import FORMAT_VERSION as TEXT_FORMAT_VERSION
from hydra_core.hydra.fused_text import (
    HydraText,
    HydraTextConfig,
    assemble_text,
    check_text_fusable,
    fuse_text_members,
)
from hydra_core.hydra.layers import (
    ACTIVATIONS,
    FusedBlock,
    GroupedLinear,
    MergedMlp,
    StackedLayerNorm,
    Stem,
    merged_mlp_tensors,
    stack_members,
)
from hydra_core.models.adapter import (
    HeadLayout,
    UnsupportedModelError,
    as_keep_mask,
    family_of,
    head_layout,
)

FORMAT = "hydra-fused"
FORMAT_VERSION = 1
#: the family whose members fuse into a HydraText (models.text.TEXT's name)
TEXT_FAMILY = "text"
#: the family of OpenCLIP image towers, which fuse through :mod:`hydra_core.hydra.fused_clip`
CLIP_FAMILY = "openclip"
#: the header entry (and tensor name prefix) of a zero-shot head saved with its image tower
ZERO_SHOT_ENTRY = "zero_shot"
POOLS = ("token", "avg", "max", "avgmax")


def ensemble_probs(member_logits: torch.Tensor) -> torch.Tensor:
    """(B, M, C) member logits -> (B, C): the mean of the members' softmax probabilities (fp32)."""
    if member_logits.ndim != 3:
        raise ValueError(
            "member logits must have shape (batch, members, classes), "
            f"got {tuple(member_logits.shape)}"
        )
    return member_logits.float().softmax(dim=-1).mean(dim=1)


@dataclass(frozen=True)
class HydraConfig:
    """What a :class:`HydraViT` is beyond its tensors: its architecture and each member's heads.

    :func:`save_hydra` writes it as JSON into the safetensors header (``to_json``, with the file
    format and version first); :func:`load_hydra` reads it back (``from_json``). The fields and
    their order are the header's, so files saved by earlier versions of this code still load.
    """

    num_members: int  # M, the members fused into one model
    embed_dim: int  # d, the token width
    depth: int  # transformer blocks
    head_dim: int  # d_k, the width of one attention head
    num_classes: int  # C, the classifier's outputs
    global_pool: str  # timm's pooling: "token", "avg", "max" or "avgmax"
    num_prefix_tokens: int  # class and register tokens ahead of the patch tokens
    class_token: bool  # the stem prepends a learned class token
    reg_tokens: int  # learned register tokens the stem prepends after the class token
    no_embed_class: bool  # the position embedding covers the patch tokens only
    pool_include_prefix: bool  # avg/max pooling also reads the prefix tokens
    pos_embed: bool  # the stem adds a learned position embedding
    img_size: tuple[int, int]  # (H, W): the only image size the model accepts
    patch_size: tuple[int, int]  # (p_h, p_w): the patch embedding's kernel and stride
    in_chans: int  # image channels
    mlp_act: str  # the MLP activation, a key of layers.ACTIVATIONS
    norm_eps: float  # epsilon of every LayerNorm (1e-6 when the model has none)
    # kept_heads[m][l]: the heads member m keeps in layer l, in that member's own numbering
    kept_heads: tuple[tuple[tuple[int, ...], ...], ...]

    def to_json(self) -> dict:
        """The header entry: file format and version, then every field (tuples become lists)."""
        return {"format": FORMAT, "version": FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, header: dict) -> HydraConfig:
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
        values["img_size"] = tuple(values["img_size"])
        values["patch_size"] = tuple(values["patch_size"])
        values["kept_heads"] = tuple(
            tuple(tuple(layer) for layer in member) for member in values["kept_heads"]
        )
        return cls(**values)


class HydraViT(nn.Module):
    """M head-pruned ViT members fused into one model; ``forward(images)`` gives (B, M, C): the
    members' logits (for OpenCLIP image towers, their image embeddings, C = D).

    Attributes:
        num_members: M.
        num_shared_layers: leading blocks identical for all members (same heads, same weights,
            after a shared stem): they run once on (B, N, d) instead of M times.
        kept_heads: per member, per layer, the kept heads in that member's own numbering.
        config: the description that :func:`save_hydra` writes to the file header.
    """

    def __init__(
        self,
        config: HydraConfig,
        stem: Stem,
        blocks: Sequence[FusedBlock],
        norm: StackedLayerNorm | None,
        fc_norm: StackedLayerNorm | None,
        head: GroupedLinear,
    ) -> None:
        super().__init__()
        self.config = config
        # timm's attribute names, so code written for a VisionTransformer reads them here too
        self.num_members = config.num_members
        self.kept_heads = config.kept_heads
        self.global_pool = config.global_pool
        self.num_prefix_tokens = config.num_prefix_tokens
        self.pool_include_prefix = config.pool_include_prefix
        self.img_size = config.img_size
        self.stem = stem
        self.blocks = nn.ModuleList(blocks)
        self.norm, self.fc_norm, self.head = norm, fc_norm, head
        shared = 0
        if stem.groups == 1:
            while shared < len(self.blocks) and self.blocks[shared].is_shared:
                shared += 1
        self.num_shared_layers = shared

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.ndim != 4 or tuple(images.shape[-2:]) != self.img_size:
            h, w = self.img_size
            raise ValueError(f"expected images (B, C, {h}, {w}), got {tuple(images.shape)}")
        x = self.stem(images)  # (S, B, N, d); S = 1 while every member computes the same stream
        last = len(self.blocks) - 1
        for layer, block in enumerate(self.blocks):
            # token pooling reads only the class token: the last block needs only its row
            x = block(x, cls_only=layer == last and self.global_pool == "token")
        if self.norm is not None:
            x = self.norm(x)
        s, b, n, d = x.shape
        pooled = global_pool_nlc(
            x.reshape(s * b, n, d),
            pool_type=self.global_pool,
            num_prefix_tokens=self.num_prefix_tokens,
            reduce_include_prefix=self.pool_include_prefix,
        ).view(s, b, d)
        if self.fc_norm is not None:
            pooled = self.fc_norm(pooled)
        logits = self.head(pooled).expand(self.num_members, -1, -1)  # (M, B, C)
        return logits.transpose(0, 1).contiguous()  # (B, M, C)

    def member_head_counts(self) -> list[list[int]]:
        """Kept heads per member per layer, as counts."""
        return [[len(h) for h in member] for member in self.kept_heads]


# -------------------------------------------------------------------------------------------------
# Fusing members.


def fuse_members(
    members: Sequence[tuple[nn.Module, torch.Tensor]],
) -> HydraViT | HydraText | nn.Module:
    """Fuse M (model, keep) pairs into one model that runs every member in one pass.

    Each model is the same object M times for zero-shot members, or separately fine-tuned (possibly
    already structurally pruned) models; ``keep`` is a head mask validated against that model's own
    layout (True = kept). Members must be of one family and agree on the architecture (embedding
    width, depth, head dim, outputs, pooling, prefix tokens, ...). MLPs are averaged over members;
    when they are all identical, member 0's weights are taken as they are, so zero-shot fusion
    reproduces every member's outputs. By family:

    - timm VisionTransformers: a :class:`HydraViT` giving the members' logits (B, M, C).
    - OpenCLIP image towers (``clip_model.visual``): a :class:`HydraViT` giving the members' image
      embeddings (B, M, D); zero-shot classifiers
      (:class:`~hydra_core.models.zero_shot.ZeroShotClassifier`, sharing their class embeddings
      and logit scale): a :class:`~hydra_core.hydra.fused_clip.HydraZeroShot` giving the members'
      zero-shot logits (B, M, C). See :func:`~hydra_core.hydra.fused_clip.fuse_clip_members`.
    - Hugging Face text classifiers: a :class:`~hydra_core.hydra.fused_text.HydraText` giving the
      members' logits (B, M, C); see :func:`~hydra_core.hydra.fused_text.fuse_text_members`.
    """
    members = list(members)
    if not members:
        raise ValueError("cannot fuse an empty list of members")
    pairs = [_as_pair(i, m) for i, m in enumerate(members)]
    families = []
    for i, (model, _) in enumerate(pairs):
        try:
            families.append(family_of(model).name)
        except UnsupportedModelError as error:
            raise UnsupportedModelError(f"member {i}: {error}") from None
    if any(f != families[0] for f in families):
        listing = ", ".join(f"member {i} is a {f} model" for i, f in enumerate(families))
        raise ValueError(f"members disagree on the model family: {listing}")
    if families[0] == CLIP_FAMILY:
        return _clip().fuse(pairs)
    parsed = [_parse_member(i, pair) for i, pair in enumerate(pairs)]  # (model, keep, layout)
    if families[0] == TEXT_FAMILY:
        return fuse_text_members([(model, keep) for model, keep, _ in parsed])
    specs = [_architecture(i, model, layout) for i, (model, _, layout) in enumerate(parsed)]
    spec = agreed_architecture(specs)
    heads = [kept_head_indices(keep, layout) for _, keep, layout in parsed]
    models = [model for model, _, _ in parsed]
    tensors = stem_tensors([_vit_stem(m) for m in models])
    for layer in range(spec["depth"]):
        parts = [_vit_block(m.blocks[layer]) for m in models]
        tensors.update(block_tensors(layer, parts, [h[layer] for h in heads], spec["head_dim"]))
    tensors.update(norm_tensors("norm", [m.norm for m in models]))
    tensors.update(norm_tensors("fc_norm", [m.fc_norm for m in models]))
    tensors.update(
        head_tensors([(m.head.weight.t(), _vector(m.head.bias, m.head.weight)) for m in models])
    )
    return assemble_vit(hydra_config(spec, heads), tensors)


def _as_pair(index: int, member: object) -> tuple[nn.Module, object]:
    pair = isinstance(member, (tuple, list)) and len(member) == 2
    if not pair or not isinstance(member[0], nn.Module):
        raise TypeError(f"member {index} must be a (model, keep) pair, got {type(member).__name__}")
    return member[0], member[1]


def _parse_member(
    index: int, pair: tuple[nn.Module, object]
) -> tuple[nn.Module, torch.Tensor, HeadLayout]:
    model, keep = pair
    try:
        layout = head_layout(model)
        keep = as_keep_mask(layout, keep)
    except (ValueError, TypeError) as error:
        raise type(error)(f"member {index}: {error}") from None
    return model, keep, layout


def agreed_architecture(specs: Sequence[dict]) -> dict:
    """The members' architecture (:func:`_architecture`'s dict); a ValueError naming the first
    entry the members disagree on, with every member's value."""
    for key in specs[0]:
        values = [spec[key] for spec in specs]
        if any(v != values[0] for v in values):
            listing = ", ".join(f"member {i} has {v!r}" for i, v in enumerate(values))
            raise ValueError(f"members disagree on {key}: {listing}")
    return specs[0]


def kept_head_indices(keep: torch.Tensor, layout: HeadLayout) -> list[torch.Tensor]:
    """Per layer, the indices of the heads a validated mask keeps (in the model's own numbering)."""
    return [keep[layer, :n].nonzero().flatten() for layer, n in enumerate(layout.num_heads)]


def hydra_config(spec: dict, heads: Sequence[Sequence[torch.Tensor]]) -> HydraConfig:
    """The :class:`HydraConfig` of M members: their agreed architecture (entries that are not
    config fields, such as ``mlp_hidden``, are only checked, not stored) and each member's kept
    heads per layer."""
    names = {f.name for f in fields(HydraConfig)}
    return HydraConfig(
        num_members=len(heads),
        **{k: v for k, v in spec.items() if k in names},
        kept_heads=tuple(tuple(tuple(h.tolist()) for h in member) for member in heads),
    )


def check_fusable(model: nn.Module) -> None:
    """Raise :class:`UnsupportedModelError` saying why members of ``model`` cannot be fused, so
    that a user learns it when choosing the model, not at the last step."""
    family = family_of(model).name
    if family == TEXT_FAMILY:
        check_text_fusable(model)
    elif family == CLIP_FAMILY:
        _clip().check(model)
    else:
        _architecture(None, model, head_layout(model))


class _ClipFusion:
    """What :mod:`hydra_core.hydra.fused_clip` provides to this module: it builds on this module,
    so it is not imported here; it registers itself when imported, which ``hydra_core.hydra``
    does whenever this module is imported (a package runs its ``__init__`` first)."""

    fuse: Callable | None = None  # fuse_clip_members
    check: Callable | None = None  # check_clip_fusable
    head_type: type | None = None  # HydraZeroShot


_CLIP = _ClipFusion()


def register_clip_fusion(fuse: Callable, check: Callable, head_type: type) -> None:
    """Called by :mod:`hydra_core.hydra.fused_clip` when it is imported."""
    _CLIP.fuse, _CLIP.check, _CLIP.head_type = fuse, check, head_type


def _clip() -> _ClipFusion:
    if _CLIP.fuse is None:
        raise RuntimeError("hydra_core.hydra.fused_clip has not registered its fusion")
    return _CLIP


def plain_patch_conv(conv: object) -> bool:
    """True for the patch embedding the fused stem runs: a non-overlapping Conv2d (stride =
    kernel, no padding, groups or dilation)."""
    return (
        isinstance(conv, nn.Conv2d)
        and conv.stride == conv.kernel_size
        and conv.groups == 1
        and conv.padding in ((0, 0), "valid")
        and conv.dilation == (1, 1)
    )


def _architecture(index: int | None, model: nn.Module, layout: HeadLayout) -> dict:
    """What members must agree on, read from a timm VisionTransformer; refuses the unsupported."""

    where = "this model" if index is None else f"member {index}"

    def refuse(what: str) -> UnsupportedModelError:
        return UnsupportedModelError(
            f"{where} cannot be fused: {what}; Hydra fusion supports timm "
            "VisionTransformers (Conv2d patch embedding, Block, Mlp)"
        )

    for attr in ("patch_embed", "norm_pre", "norm", "fc_norm", "head", "global_pool"):
        if not hasattr(model, attr):
            raise refuse(f"{type(model).__name__} has no `{attr}`")
    pe = model.patch_embed
    conv = getattr(pe, "proj", None)
    if not plain_patch_conv(conv):
        raise refuse("the patch embedding is not a plain non-overlapping Conv2d")
    if getattr(model, "dynamic_img_size", False) or getattr(pe, "dynamic_img_pad", False):
        raise refuse("dynamic image sizes are not supported")
    if getattr(model, "attn_pool", None) is not None:
        raise refuse("attention pooling (global_pool='map') is not supported")
    if model.global_pool not in POOLS:
        raise refuse(f"global_pool={model.global_pool!r} is not one of {', '.join(POOLS)}")
    if not isinstance(model.head, nn.Linear):
        raise refuse("the classifier head is not a Linear layer (num_classes=0?)")
    acts, hidden, eps = set(), set(), set()
    for norm in (pe.norm, model.norm_pre, model.norm, model.fc_norm):
        eps |= norm_eps(where, norm)
    for layer, block in enumerate(model.blocks):
        for name in ("q_norm", "k_norm"):
            if not isinstance(getattr(block.attn, name, nn.Identity()), nn.Identity):
                raise refuse(f"block {layer} normalises queries/keys ({name})")
        for name in ("ls1", "ls2"):
            if not isinstance(getattr(block, name), (nn.Identity, LayerScale)):
                raise refuse(f"block {layer}: {name} is a {type(getattr(block, name)).__name__}")
        mlp = block.mlp
        linear = all(isinstance(getattr(mlp, n, None), nn.Linear) for n in ("fc1", "fc2"))
        if not linear or not isinstance(getattr(mlp, "norm", nn.Identity()), nn.Identity):
            raise refuse(f"block {layer}: the MLP is a {type(mlp).__name__}, not timm's Mlp")
        acts.add(activation_name(where, mlp.act))
        hidden.add(mlp.fc1.out_features)
        for norm in (block.norm1, block.norm2):
            if not isinstance(norm, nn.LayerNorm):
                raise refuse(f"block {layer} uses {type(norm).__name__}; expected LayerNorm")
            eps |= norm_eps(where, norm)
    for name, values in (("MLP activations", acts), ("MLP widths", hidden), ("LayerNorm eps", eps)):
        if len(values) > 1:
            raise refuse(f"layers differ in {name} ({sorted(values)})")
    reg_token = getattr(model, "reg_token", None)
    return {
        "embed_dim": layout.embed_dim,
        "depth": layout.num_layers,
        "head_dim": layout.head_dim,
        "num_classes": model.head.out_features,
        "global_pool": model.global_pool,
        "num_prefix_tokens": int(model.num_prefix_tokens),
        "class_token": getattr(model, "cls_token", None) is not None,
        "reg_tokens": 0 if reg_token is None else int(reg_token.shape[1]),
        "no_embed_class": bool(getattr(model, "no_embed_class", False)),
        "pool_include_prefix": bool(getattr(model, "pool_include_prefix", False)),
        "pos_embed": getattr(model, "pos_embed", None) is not None,
        "img_size": tuple(pe.img_size),
        "patch_size": tuple(conv.kernel_size),
        "in_chans": conv.in_channels,
        "mlp_act": acts.pop(),
        "mlp_hidden": hidden.pop(),
        "norm_eps": eps.pop() if eps else 1e-6,
    }


def norm_eps(where: str, norm: nn.Module) -> set[float]:
    """The epsilon of a LayerNorm (as a set, to collect a model's), none for an Identity."""
    if isinstance(norm, nn.Identity):
        return set()
    if not isinstance(norm, nn.LayerNorm):
        raise UnsupportedModelError(
            f"{where}: a {type(norm).__name__} norm is not supported (LayerNorm only)"
        )
    return {float(norm.eps)}


def activation_name(where: str, act: nn.Module) -> str:
    """The key of :data:`~hydra_core.hydra.layers.ACTIVATIONS` computing what ``act`` does."""
    if isinstance(act, nn.GELU):
        return "gelu" if act.approximate == "none" else "gelu_tanh"
    known = (
        (GELU, "gelu"),
        (GELUTanh, "gelu_tanh"),
        (QuickGELU, "quick_gelu"),
        (nn.ReLU, "relu"),
        (nn.SiLU, "silu"),
    )
    for kind, name in known:
        if isinstance(act, kind):
            return name
    raise UnsupportedModelError(
        f"{where}: MLP activation {type(act).__name__} is not "
        f"supported (supported: {', '.join(ACTIVATIONS)})"
    )


def _param(module: nn.Module, name: str) -> torch.Tensor | None:
    """A parameter, detached, or None where the module has none."""
    t = getattr(module, name, None)
    return None if t is None else t.detach()


def _vector(bias: torch.Tensor | None, weight: torch.Tensor) -> torch.Tensor:
    """A layer's bias, detached; zeros (as long as ``weight``'s first axis) where it has none."""
    return weight.new_zeros(weight.shape[:1]) if bias is None else bias.detach()


def _layer_norm(norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A LayerNorm's (weight, bias); None for an Identity."""
    if isinstance(norm, nn.Identity):
        return None
    if norm.weight is None:
        raise UnsupportedModelError("LayerNorms without learned weights are not supported")
    return norm.weight.detach(), _vector(norm.bias, norm.weight)


def norm_tensors(name: str, norms: Sequence[nn.Module]) -> dict[str, torch.Tensor]:
    """The members' LayerNorms (or Identities, then nothing) stacked as ``{name}.weight/bias``."""
    parts = [_layer_norm(n) for n in norms]
    if all(p is None for p in parts):
        return {}
    if any(p is None for p in parts):
        raise UnsupportedModelError(f"some members have a `{name}` LayerNorm and some do not")
    weight, bias = stack_members(parts)
    return {f"{name}.weight": weight, f"{name}.bias": bias}


@dataclass(frozen=True)
class StemParts:
    """What one member's stem is made of, whatever its family calls it.

    Args:
        patch_weight: (d, C, p_h, p_w), the patch embedding's conv weight; patch_bias (d,) or None.
        cls_token: (1, d) or None; reg_token: (R, d) or None.
        pos_embed: (N_pos, d) or None.
        patch_norm, norm_pre: LayerNorms or Identities.
    """

    patch_weight: torch.Tensor
    patch_bias: torch.Tensor | None
    cls_token: torch.Tensor | None
    reg_token: torch.Tensor | None
    pos_embed: torch.Tensor | None
    patch_norm: nn.Module
    norm_pre: nn.Module


def _vit_stem(model: nn.Module) -> StemParts:
    tokens = [_param(model, n) for n in ("cls_token", "reg_token", "pos_embed")]
    cls_token, reg_token, pos_embed = (None if t is None else t[0] for t in tokens)  # batch axis
    conv = model.patch_embed.proj
    return StemParts(
        patch_weight=conv.weight.detach(),
        patch_bias=_param(conv, "bias"),
        cls_token=cls_token,
        reg_token=reg_token,
        pos_embed=pos_embed,
        patch_norm=model.patch_embed.norm,
        norm_pre=model.norm_pre,
    )


def stem_tensors(stems: Sequence[StemParts]) -> dict[str, torch.Tensor]:
    """Patch embedding, prefix tokens, position embedding and the stem's norms, stacked. The stem is
    shared only as a whole: if any part differs between members, every part is per member."""
    names = ("patch_weight", "patch_bias", "cls_token", "reg_token", "pos_embed")
    per_member = [tuple(getattr(s, n) for n in names) for s in stems]
    stacked = zip(names, stack_members(per_member), strict=True)
    tensors = {f"stem.{n}": t for n, t in stacked if t is not None}
    tensors.update(norm_tensors("stem.patch_norm", [s.patch_norm for s in stems]))
    tensors.update(norm_tensors("stem.norm_pre", [s.norm_pre for s in stems]))
    if len({t.shape[0] for t in tensors.values()}) > 1:
        tensors = {k: t.expand(len(stems), *t.shape[1:]).clone() for k, t in tensors.items()}
    return tensors


@dataclass(frozen=True)
class BlockParts:
    """What one member's pre-norm block ``x + ls1 * W_O(attn(norm1(x)))``, then
    ``x + ls2 * fc2(act(fc1(norm2(x))))``, is made of, whatever its family calls it.

    Args:
        num_heads: H, the heads the block has now.
        qkv_weight: (3 * H * d_k, d), rows q | k | v, head-major within each; qkv_bias or None.
        proj_weight: (d, H * d_k), W_O; proj_bias (d,) or None.
        ls1, ls2: the layer scales (d,) of the attention and the MLP branch, or None.
        norm1, norm2: the LayerNorms before the attention and before the MLP.
        fc1, fc2: the MLP's linear layers.
    """

    num_heads: int
    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor | None
    proj_weight: torch.Tensor
    proj_bias: torch.Tensor | None
    ls1: torch.Tensor | None
    ls2: torch.Tensor | None
    norm1: nn.Module
    norm2: nn.Module
    fc1: nn.Linear
    fc2: nn.Linear


def _vit_block(block: nn.Module) -> BlockParts:
    a = block.attn
    return BlockParts(
        num_heads=int(a.num_heads),
        qkv_weight=a.qkv.weight.detach(),
        qkv_bias=_param(a.qkv, "bias"),
        proj_weight=a.proj.weight.detach(),
        proj_bias=_param(a.proj, "bias"),
        ls1=block.ls1.gamma.detach() if isinstance(block.ls1, LayerScale) else None,
        ls2=block.ls2.gamma.detach() if isinstance(block.ls2, LayerScale) else None,
        norm1=block.norm1,
        norm2=block.norm2,
        fc1=block.mlp.fc1,
        fc2=block.mlp.fc2,
    )


def block_tensors(
    layer: int, blocks: Sequence[BlockParts], heads: Sequence[torch.Tensor], dk: int
) -> dict[str, torch.Tensor]:
    """One layer's fused weights from each member's block and kept heads."""
    d = blocks[0].proj_weight.shape[0]
    h_max = max(len(h) for h in heads)
    qkv_bias = any(b.qkv_bias is not None for b in blocks)
    proj_bias = any(b.proj_bias is not None for b in blocks)
    attn, norm1, norm2, ls2 = [], [], [], []
    for block, kept in zip(blocks, heads, strict=True):
        n, h = block.num_heads, len(kept)
        # Q/K/V rows of the kept heads, zero-padded to h_max heads
        qkv_w = block.qkv_weight.new_zeros(3, h_max, dk, d)
        qkv_w[:, :h] = block.qkv_weight.reshape(3, n, dk, d)[:, kept]
        qkv_b = block.qkv_weight.new_zeros(3, h_max, dk)
        if block.qkv_bias is not None:
            qkv_b[:, :h] = block.qkv_bias.reshape(3, n, dk)[:, kept]
        # W_O columns of the kept heads, padded; layer scale folded in: g(W z + b) = (gW) z + gb
        proj_w = block.proj_weight.new_zeros(d, h_max, dk)
        proj_w[:, :h] = block.proj_weight.reshape(d, n, dk)[:, kept]
        proj_b = _vector(block.proj_bias, block.proj_weight)
        if block.ls1 is not None:
            proj_w = proj_w * block.ls1[:, None, None]
            proj_b = proj_b * block.ls1
        attn.append(
            (
                qkv_w.reshape(3 * h_max * dk, d).t() if h_max else None,  # (d, 3*h_max*d_k)
                qkv_b.reshape(1, -1) if qkv_bias and h_max else None,  # (1, 3*h_max*d_k)
                proj_w.reshape(d, h_max * dk).t(),  # (h_max*d_k, d)
                proj_b[None] if proj_bias else None,  # (1, d)
            )
        )
        norm1.append(_layer_norm(block.norm1))
        norm2.append(_layer_norm(block.norm2))
        ls2.append((block.ls2,))
    if len({g is None for (g,) in ls2}) > 1:
        raise UnsupportedModelError(
            f"block {layer}: some members scale their MLP output (layer scale) and some do not"
        )
    tensors = dict(
        zip(
            ("qkv.weight", "qkv.bias", "proj.weight", "proj.bias"), stack_members(attn), strict=True
        )
    )
    tensors["norm1.weight"], tensors["norm1.bias"] = stack_members(norm1)
    tensors["norm2.weight"], tensors["norm2.bias"] = stack_members(norm2)
    (tensors["ls2"],) = stack_members(ls2)
    tensors.update(_merged_mlp(blocks))
    return {f"blocks.{layer}.{k}": v for k, v in tensors.items() if v is not None}


def _merged_mlp(blocks: Sequence[BlockParts]) -> dict[str, torch.Tensor | None]:
    """The paper's merged MLP: weights and biases averaged over members (member 0's if equal)."""
    per_member = [
        (b.fc1.weight.detach(), _param(b.fc1, "bias"), b.fc2.weight.detach(), _param(b.fc2, "bias"))
        for b in blocks
    ]
    try:
        return merged_mlp_tensors(per_member)
    except ValueError as error:
        raise UnsupportedModelError(str(error)) from None


def head_tensors(
    per_member: Sequence[tuple[torch.Tensor, torch.Tensor]],
) -> dict[str, torch.Tensor]:
    """The classifier from each member's (weight (d, C), bias (C,)), stacked for the head's
    :class:`GroupedLinear`: (S, d, C) and (S, 1, C)."""
    weight, bias = stack_members(list(per_member))
    return {"head.weight": weight, "head.bias": bias[:, None]}


# -------------------------------------------------------------------------------------------------
# One constructor for both routes: fused from members, or read back from a file.


def assemble_vit(config: HydraConfig, tensors: dict[str, torch.Tensor]) -> HydraViT:
    """Build a :class:`HydraViT` from its description and its named tensors (a state dict)."""
    unused = set(tensors)

    def take(name: str, required: bool = True) -> torch.Tensor | None:
        if name not in tensors:
            if required:
                raise ValueError(f"the Hydra model lacks the tensor {name!r}")
            return None
        unused.discard(name)
        return tensors[name]

    def norm(prefix: str, required: bool = False) -> StackedLayerNorm | None:
        weight = take(f"{prefix}.weight", required)
        if weight is None:
            return None
        return StackedLayerNorm(weight, take(f"{prefix}.bias"), config.norm_eps)

    stem = Stem(
        patch_weight=take("stem.patch_weight"),
        patch_bias=take("stem.patch_bias", False),
        patch_norm=norm("stem.patch_norm"),
        cls_token=take("stem.cls_token", config.class_token),
        reg_token=take("stem.reg_token", config.reg_tokens > 0),
        pos_embed=take("stem.pos_embed", config.pos_embed),
        no_embed_class=config.no_embed_class,
        norm_pre=norm("stem.norm_pre"),
    )
    blocks = []
    for layer in range(config.depth):
        p = f"blocks.{layer}."
        qkv_weight, qkv_bias = take(p + "qkv.weight", False), take(p + "qkv.bias", False)
        blocks.append(
            FusedBlock(
                head_dim=config.head_dim,
                norm1=norm(p + "norm1", True),
                qkv=None if qkv_weight is None else GroupedLinear(qkv_weight, qkv_bias),
                proj=GroupedLinear(take(p + "proj.weight"), take(p + "proj.bias", False)),
                norm2=norm(p + "norm2", True),
                mlp=MergedMlp(
                    take(p + "mlp.fc1_weight"),
                    take(p + "mlp.fc1_bias", False),
                    take(p + "mlp.fc2_weight"),
                    take(p + "mlp.fc2_bias", False),
                    config.mlp_act,
                ),
                ls2=take(p + "ls2", False),
            )
        )
    head = GroupedLinear(take("head.weight"), take("head.bias"))
    hydra = HydraViT(config, stem, blocks, norm("norm"), norm("fc_norm"), head)
    if unused:
        names = ", ".join(sorted(unused))
        raise ValueError(f"the Hydra model has tensors it does not use: {names}")
    _check_consistent(hydra)
    return hydra


def _check_consistent(hydra: HydraViT) -> None:
    """Shapes agree with the description (catches a file whose header and tensors disagree)."""
    cfg = hydra.config
    m, d, dk, depth = cfg.num_members, cfg.embed_dim, cfg.head_dim, cfg.depth
    if len(hydra.kept_heads) != m or any(len(member) != depth for member in hydra.kept_heads):
        raise ValueError(f"kept_heads must list {depth} layers for each of the {m} members")
    for name, module in hydra.named_modules():
        stacked = isinstance(module, (StackedLayerNorm, GroupedLinear, Stem))
        if stacked and module.groups not in (1, m):
            raise ValueError(f"{name} holds {module.groups} member groups; expected 1 or {m}")
    for layer, block in enumerate(hydra.blocks):
        needed = max(len(member[layer]) for member in hydra.kept_heads)
        if block.max_heads != needed or block.proj.weight.shape[1:] != (needed * dk, d):
            raise ValueError(
                f"block {layer}: the weights hold {block.max_heads} heads, but the "
                f"members keep up to {needed}"
            )
        if block.ls2 is not None and block.ls2.shape[0] not in (1, m):
            raise ValueError(f"block {layer}: ls2 holds {block.ls2.shape[0]} member groups")
    if hydra.head.weight.shape[1:] != (d, cfg.num_classes):
        raise ValueError(
            f"the head has shape {tuple(hydra.head.weight.shape)}; expected "
            f"(S, {d}, {cfg.num_classes})"
        )


# -------------------------------------------------------------------------------------------------
# Export.


def save_hydra(
    hydra: HydraViT | HydraText | nn.Module,
    path: str | Path,
    *,
    preprocess: dict | None = None,
    source: str | None = None,
    classes: Sequence[str] | None = None,
) -> None:
    """Write ``hydra`` as safetensors (atomically); the header's ``hydra`` entry (JSON) describes
    the model (format ``hydra-fused`` for a :class:`HydraViT`, ``hydra-fused-text`` for a
    :class:`~hydra_core.hydra.fused_text.HydraText`). A
    :class:`~hydra_core.hydra.fused_clip.HydraZeroShot` is stored as its image tower (a
    ``hydra-fused`` model) plus its zero-shot head: the class embeddings as the tensor
    ``zero_shot.class_embeddings``, the logit scale, classes and prompt templates as the header's
    ``zero_shot`` entry (JSON); ``classes`` defaults to its classes.

    Args:
        hydra: the fused model.
        path: the file.
        preprocess: how images become its input (``size``, ``channels``, ``mean``, ``std``, as
            :func:`hydra_core.models.preprocess.describe` gives them); stored so that
            ``load_model(path)`` can evaluate the file like its source model.
        source: the name of the model the members were pruned from.
        classes: class names, index = label.
    """
    model, extra, header = hydra, {}, {}
    if _CLIP.head_type is not None and isinstance(hydra, _CLIP.head_type):
        model = hydra.visual
        extra, entry = hydra.file_parts()
        header[ZERO_SHOT_ENTRY] = json.dumps(entry)
        classes = classes or hydra.classes
    state = {k: v.detach().cpu().contiguous() for k, v in {**model.state_dict(), **extra}.items()}
    header["hydra"] = json.dumps(hydra.config.to_json())
    extras = {"preprocess": preprocess, "source": source, "classes": classes}
    header.update({k: json.dumps(list(v) if k == "classes" else v) for k, v in extras.items() if v})
    atomic_write(path, lambda tmp: save_file(state, str(tmp), metadata=header))


def load_hydra(
    path: str | Path, device: str | torch.device = "cpu"
) -> HydraViT | HydraText | nn.Module:
    """Rebuild a :class:`HydraViT`, :class:`~hydra_core.hydra.fused_text.HydraText` or
    :class:`~hydra_core.hydra.fused_clip.HydraZeroShot` (eval mode) from a file written by
    :func:`save_hydra`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iter)
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(f"{path} is not a readable safetensors file ({error})") from None
    if "hydra" not in meta:
        raise ValueError(
            f"{path} is a safetensors file but not a Hydra model (its header has no "
            "'hydra' entry); such files are written by save_hydra"
        )
    try:
        header = json.loads(meta["hydra"])
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: the 'hydra' header is not valid JSON ({error})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the 'hydra' header is not a JSON object")
    formats = {
        FORMAT: (FORMAT_VERSION, HydraConfig, assemble_vit),
        TEXT_FORMAT: (TEXT_FORMAT_VERSION, HydraTextConfig, assemble_text),
    }
    fmt, version = header.get("format"), header.get("version")
    if fmt not in formats or version != formats[fmt][0]:
        readable = [(f, v) for f, (v, _, _) in formats.items() if f == fmt] or [
            (f, v) for f, (v, _, _) in formats.items()
        ]
        raise ValueError(
            f"{path}: the header says format {fmt!r} version {version!r}; this code reads "
            + " or ".join(f"{f!r} version {v}" for f, v in readable)
        )
    _, config_class, assemble = formats[fmt]
    try:
        config = config_class.from_json(header)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{path}: the 'hydra' header is malformed ({error})") from None
    head = {k: tensors.pop(k) for k in list(tensors) if k.startswith(f"{ZERO_SHOT_ENTRY}.")}
    try:
        model = assemble(config, tensors)
    except (KeyError, TypeError) as error:
        raise ValueError(f"{path}: the 'hydra' header is malformed ({error!r})") from None
    if ZERO_SHOT_ENTRY not in meta:
        if head:
            raise ValueError(f"{path} holds zero-shot tensors but no 'zero_shot' header entry")
        return model.eval()
    if fmt != FORMAT:
        raise ValueError(f"{path}: a zero-shot head needs an image model, not format {fmt!r}")
    try:
        entry = json.loads(meta[ZERO_SHOT_ENTRY])
        return _clip().head_type.from_file_parts(model, head, entry).eval()
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"{path}: the 'zero_shot' header entry is malformed ({error})") from None
