"""Packed-Ensembles (Laurent et al., 2023): E narrower ViTs trained as one, their layers packed.

Every linear layer of the default ViT becomes TorchUncertainty's ``PackedLinear``: a grouped
(block-diagonal) linear map over ``alpha`` times the width, one group per member, so that member
``m`` reads and writes its own slice of ``alpha * d / E`` channels only; the patch embedding is a
``PackedConv2d`` (``first``: one dense convolution whose output channels are split among the
members), every LayerNorm a ``PackedLayerNorm`` with one group per member (a LayerNorm over each
member's slice), and the classifier a ``PackedLinear`` with ``last`` (E logit vectors). With the
paper's E = 3, alpha = 2 on the default ViT (d = 192, 12 heads of 16) each member is a ViT of
width 128 with 8 heads of 16 (the head size kept) and an MLP of 256: 2.4M parameters in all.

The members never exchange a value, so the packed model *is* E independent ViTs run at once:
:func:`member_vit` cuts member ``m`` out as a plain timm ``VisionTransformer`` whose logits are
the packed model's ``m``-th, which the tests check. (TorchUncertainty's
``PackedTransformerEncoderLayer`` is not used: its LayerNorms after the first span all members'
channels, so its members share statistics; its attention's packed in-projection reads the
queries of every member from the first member's group. Its packed linear, convolution and
LayerNorm layers are used as they are.)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer
from torch import nn
from torch_uncertainty.layers import PackedConv2d, PackedLayerNorm, PackedLinear

from hydra_core.zoo.default import VitConfig


@dataclass(frozen=True)
class PackedShape:
    """A member's dimensions in a Packed-Ensemble of ``arch``."""

    width: int  # alpha * d / E channels
    heads: int  # attention heads of the source's head size
    hidden: int  # MLP width


def packed_shape(arch: VitConfig, estimators: int, alpha: float) -> PackedShape:
    """Each member's width, heads and MLP width; a ValueError when they are not whole numbers."""
    total = arch.embed_dim * alpha
    head_dim = arch.embed_dim // arch.num_heads
    width = total / estimators
    hidden = arch.embed_dim * arch.mlp_ratio * alpha / estimators
    if width != int(width) or int(width) % head_dim or hidden != int(hidden):
        raise ValueError(
            f"Packed-Ensembles of E={estimators}, alpha={alpha:g} on width {arch.embed_dim} give "
            f"members of width {width:g} and MLP {hidden:g}: choose E and alpha so that the "
            f"member width is a multiple of the head size {head_dim}"
        )
    return PackedShape(int(width), int(width) // head_dim, int(hidden))


class PackedAttention(nn.Module):
    """Self-attention of E members at once: packed Q/K/V and output projections; member ``m``'s
    heads attend over its own slice only."""

    def __init__(self, arch: VitConfig, estimators: int, alpha: float) -> None:
        super().__init__()
        shape = packed_shape(arch, estimators, alpha)
        d = arch.embed_dim
        self.estimators, self.heads = estimators, shape.heads
        self.head_dim = shape.width // shape.heads
        # group m's outputs: its queries, keys and values, each (heads, head_dim), as timm's qkv
        self.qkv = PackedLinear(d, 3 * d, alpha, estimators, bias=arch.qkv_bias)
        self.proj = PackedLinear(d, d, alpha, estimators)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        e, h, k = self.estimators, self.heads, self.head_dim
        qkv = self.qkv(x).reshape(b, n, e, 3, h, k).permute(3, 0, 2, 4, 1, 5)
        q, key, v = qkv.unbind(0)  # (B, E, heads, N, head_dim)
        out = F.scaled_dot_product_attention(q, key, v)
        return self.proj(out.permute(0, 3, 1, 2, 4).reshape(b, n, e * h * k))


class PackedBlock(nn.Module):
    """A pre-norm transformer block of E members (timm's ``Block`` without layer scale)."""

    def __init__(self, arch: VitConfig, estimators: int, alpha: float) -> None:
        super().__init__()
        d = arch.embed_dim
        hidden = int(d * arch.mlp_ratio)
        self.norm1 = _member_norm(d, estimators, alpha)
        self.attn = PackedAttention(arch, estimators, alpha)
        self.norm2 = _member_norm(d, estimators, alpha)
        self.fc1 = PackedLinear(d, hidden, alpha, estimators)
        self.fc2 = PackedLinear(hidden, d, alpha, estimators)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class PackedViT(nn.Module):
    """A Packed-Ensemble of E ViTs of the architecture ``arch`` (class-token pooling, no layer
    scale, no register tokens, as the default ViT); ``forward(images)`` -> (B, E, classes)
    logits, one vector per member (their softmaxes are averaged downstream)."""

    def __init__(self, arch: VitConfig, estimators: int = 3, alpha: float = 2.0) -> None:
        super().__init__()
        if arch.global_pool != "token":
            raise ValueError(f"Packed-Ensembles here pool the class token, not {arch.global_pool}")
        shape = packed_shape(arch, estimators, alpha)
        self.arch, self.estimators, self.alpha, self.shape = arch, estimators, alpha, shape
        d, width = arch.embed_dim, shape.width * estimators
        self.patch_embed = PackedConv2d(
            arch.in_chans, d, arch.patch_size, alpha, estimators, stride=arch.patch_size, first=True
        )
        patches = (arch.img_size // arch.patch_size) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.pos_embed = nn.Parameter(torch.zeros(1, patches + 1, width))
        self.blocks = nn.ModuleList(PackedBlock(arch, estimators, alpha) for _ in range(arch.depth))
        self.norm = _member_norm(d, estimators, alpha)
        self.head = PackedLinear(d, arch.num_classes, alpha, estimators, last=True)
        self._init_like_timm()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (B, patches, E * width)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x)[:, 0])  # (E * B, classes), member-major
        return logits.view(self.estimators, len(images), -1).transpose(0, 1)

    def describe(self) -> dict:
        return {"estimators": self.estimators, "alpha": self.alpha, **asdict(self.shape)}

    @torch.no_grad()
    def _init_like_timm(self) -> None:
        """timm's ViT initialisation (its ``weight_init=''``): truncated normal (std 0.02)
        linear weights and zero biases, position embedding truncated normal (0.02), class token
        normal (1e-6); the convolution keeps PyTorch's."""
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        for module in self.modules():
            if isinstance(module, PackedLinear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)


def packed_vit(arch: VitConfig, estimators: int = 3, alpha: float = 2.0) -> PackedViT:
    """A freshly initialised Packed-Ensemble (the global random state draws its weights)."""
    return PackedViT(arch, estimators, alpha)


def _member_norm(d: int, estimators: int, alpha: float) -> PackedLayerNorm:
    """A LayerNorm over each member's slice (TorchUncertainty's ``first`` grouping: one group
    per member), timm's epsilon."""
    return PackedLayerNorm(d, estimators, alpha, eps=1e-6, first=True)


@torch.no_grad()
def member_vit(packed: PackedViT, m: int) -> VisionTransformer:
    """Member ``m`` of a Packed-Ensemble as a plain timm ViT of its width, heads and MLP, its
    weights copied out of the packed layers: its logits are the packed model's ``m``-th."""
    arch, shape = packed.arch, packed.shape
    w = shape.width
    vit = VisionTransformer(
        img_size=arch.img_size,
        patch_size=arch.patch_size,
        in_chans=arch.in_chans,
        num_classes=arch.num_classes,
        embed_dim=w,
        depth=arch.depth,
        num_heads=shape.heads,
        mlp_ratio=shape.hidden / w,
        qkv_bias=arch.qkv_bias,
        global_pool="token",
    )
    own = slice(m * w, (m + 1) * w)

    def linear(target: nn.Linear, source: PackedLinear) -> None:
        target.weight.copy_(source.weight[m])
        if target.bias is not None:
            rows = source.weight.shape[1]
            target.bias.copy_(source.bias[m * rows : (m + 1) * rows])

    def norm(target: nn.LayerNorm, source: PackedLayerNorm) -> None:
        target.weight.copy_(source.weight[own])
        target.bias.copy_(source.bias[own])

    vit.patch_embed.proj.weight.copy_(packed.patch_embed.conv.weight[own])
    vit.patch_embed.proj.bias.copy_(packed.patch_embed.conv.bias[own])
    vit.cls_token.copy_(packed.cls_token[..., own])
    vit.pos_embed.copy_(packed.pos_embed[..., own])
    for mine, block in zip(vit.blocks, packed.blocks, strict=True):
        norm(mine.norm1, block.norm1)
        linear(mine.attn.qkv, block.attn.qkv)
        linear(mine.attn.proj, block.attn.proj)
        norm(mine.norm2, block.norm2)
        linear(mine.mlp.fc1, block.fc1)
        linear(mine.mlp.fc2, block.fc2)
    norm(vit.norm, packed.norm)
    linear(vit.head, packed.head)
    return vit.eval()
