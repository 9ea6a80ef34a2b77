"""The fused model of pre-norm members on a patch stem: :class:`HydraViT` (timm ViTs, OpenCLIP
image towers; file format ``hydra-fused``).

Each fused block applies, per member, LayerNorm and a grouped Q/K/V projection, runs every
member's heads in one attention, projects back with a grouped W_O (the member's attention layer
scale folded in), adds the residual, and applies one MLP - the members' MLPs averaged - after a
per-member LayerNorm, scaled per member (``ls2``). The stem (patch embedding, class and register
tokens, position embedding, norms) is shared or per member as a whole. After the last block come
``norm``, timm's pooling, ``fc_norm`` and the head, so the output is (B, M, C): the members'
logits, or for image towers their embeddings (C = D).

:func:`architecture` says what members must agree on (:class:`HydraConfig`'s fields);
:func:`fuse` builds the model from the members' parts, and :func:`assemble_vit` from a config
and named tensors, the one constructor for both routes: fused from members, or read back from a
file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from timm.models.vision_transformer import global_pool_nlc
from torch import nn

from hydra_core.hydra.fusion.assembly import NamedTensors, check_heads
from hydra_core.hydra.fusion.config import HeaderConfig, member_config, shared_settings
from hydra_core.hydra.fusion.tensors import (
    blocks_tensors,
    linear_tensors,
    norm_tensors,
    patch_stem_tensors,
)
from hydra_core.hydra.layers import FusedBlock, GroupedLinear, StackedLayerNorm, Stem
from hydra_core.models.family import UnsupportedModelError
from hydra_core.models.parts import POOLS, FusionParts, PatchStem

FORMAT = "hydra-fused"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class HydraConfig(HeaderConfig):
    """What a :class:`HydraViT` is beyond its tensors: its architecture and each member's heads.

    ``save_hydra`` writes it as JSON into the safetensors header (``to_json``, with the file
    format and version first); ``load_hydra`` reads it back (``from_json``). The fields and
    their order are the header's, so files saved by earlier versions of this code still load.
    """

    header_format: ClassVar[tuple[str, int]] = (FORMAT, FORMAT_VERSION)
    tuple_fields: ClassVar[tuple[str, ...]] = ("img_size", "patch_size")

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


class HydraViT(nn.Module):
    """M head-pruned ViT members fused into one model; ``forward(images)`` gives (B, M, C): the
    members' logits (for OpenCLIP image towers, their image embeddings, C = D).

    Attributes:
        num_members: M.
        num_shared_layers: leading blocks identical for all members (same heads, same weights,
            after a shared stem): they run once on (B, N, d) instead of M times.
        kept_heads: per member, per layer, the kept heads in that member's own numbering.
        config: the description that ``save_hydra`` writes to the file header.
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


def architecture(parts: FusionParts, where: str) -> dict:
    """What members must agree on: :class:`HydraConfig`'s fields, then entries only checked
    (``mlp_hidden``; ``final_ln_after_pool``: the final LayerNorm comes after the pooling);
    refuses what :class:`HydraViT` cannot compute."""
    stem = parts.stem
    if not isinstance(stem, PatchStem):
        raise UnsupportedModelError(
            f"{where} cannot be fused: pre-norm blocks need a patch stem, not a "
            f"{type(stem).__name__}"
        )
    if parts.global_pool not in POOLS:
        raise UnsupportedModelError(
            f"{where} cannot be fused: pooling {parts.global_pool!r} is not one of "
            f"{', '.join(POOLS)}"
        )
    if any(block.position_bias is not None for block in parts.blocks):
        raise UnsupportedModelError(
            f"{where} cannot be fused: pre-norm blocks with a position bias are not supported"
        )
    act, hidden, eps = shared_settings(parts, where)
    return {
        "embed_dim": parts.embed_dim,
        "depth": len(parts.blocks),
        "head_dim": parts.head_dim,
        "num_classes": int(parts.head.weight.shape[0]),
        "global_pool": parts.global_pool,
        "num_prefix_tokens": parts.num_prefix_tokens,
        "class_token": stem.cls_token is not None,
        "reg_tokens": 0 if stem.reg_token is None else int(stem.reg_token.shape[0]),
        "no_embed_class": stem.no_embed_class,
        "pool_include_prefix": parts.pool_include_prefix,
        "pos_embed": stem.pos_embed is not None,
        "img_size": stem.img_size,
        "patch_size": tuple(int(p) for p in stem.patch_weight.shape[2:]),
        "in_chans": int(stem.patch_weight.shape[1]),
        "mlp_act": act,
        "mlp_hidden": hidden,
        "norm_eps": eps,
        "final_ln_after_pool": parts.fc_norm is not None,
    }


def fuse(
    spec: dict, parts: Sequence[FusionParts], heads: Sequence[Sequence[torch.Tensor]]
) -> HydraViT:
    """The :class:`HydraViT` of M members: their agreed :func:`architecture`, their parts and,
    per member and layer, the indices of their kept heads."""
    tensors = patch_stem_tensors([p.stem for p in parts])
    tensors.update(blocks_tensors(parts, heads, spec["head_dim"]))
    tensors.update(norm_tensors("norm", [p.norm for p in parts]))
    tensors.update(norm_tensors("fc_norm", [p.fc_norm for p in parts]))
    tensors.update(linear_tensors(("head",), [(p.head,) for p in parts]))
    return assemble_vit(member_config(HydraConfig, spec, heads), tensors)


def assemble_vit(config: HydraConfig, tensors: dict[str, torch.Tensor]) -> HydraViT:
    """Build a :class:`HydraViT` from its description and its named tensors (a state dict)."""
    named = NamedTensors(tensors, config.norm_eps)
    take = named.take
    stem = Stem(
        patch_weight=take("stem.patch_weight"),
        patch_bias=take("stem.patch_bias", False),
        patch_norm=named.norm("stem.patch_norm"),
        cls_token=take("stem.cls_token", config.class_token),
        reg_token=take("stem.reg_token", config.reg_tokens > 0),
        pos_embed=take("stem.pos_embed", config.pos_embed),
        no_embed_class=config.no_embed_class,
        norm_pre=named.norm("stem.norm_pre"),
    )
    blocks = []
    for layer in range(config.depth):
        p = f"blocks.{layer}."
        block = named.block(p, config.head_dim, config.mlp_act)
        blocks.append(FusedBlock(**block, ls2=take(p + "ls2", False)))
    head = GroupedLinear(take("head.weight"), take("head.bias"))
    hydra = HydraViT(config, stem, blocks, named.norm("norm"), named.norm("fc_norm"), head)
    named.check_all_used()
    _check_consistent(hydra)
    return hydra


def _check_consistent(hydra: HydraViT) -> None:
    """Shapes agree with the description (catches a file whose header and tensors disagree)."""
    check_heads(hydra, (StackedLayerNorm, GroupedLinear, Stem), "head")
    m = hydra.config.num_members
    for layer, block in enumerate(hydra.blocks):
        if block.ls2 is not None and block.ls2.shape[0] not in (1, m):
            raise ValueError(f"block {layer}: ls2 holds {block.ls2.shape[0]} member groups")
