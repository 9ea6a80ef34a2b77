"""MIMO (Havasi et al., 2021): E subnetworks in one ViT, fed E inputs at once.

The default ViT with E times its input channels and E times its classes: member ``m`` reads
channels ``[m C, (m+1) C)`` and writes logits ``[m K, (m+1) K)``. In training each member gets
its own image of the batch (TorchUncertainty's ``MIMOBatchFormat``: the batch repeated
``batch_repeat`` times, shuffled independently per member except for a ``rho`` share of the rows
that all members see together); at test time every member gets the same image. The paper's
E = 3, rho = 0.5, batch repeat 4. TorchUncertainty's MIMO models are ResNets, WideResNets and
InceptionTime; the ViT here follows its ``_MIMOResNet.forward`` (member-major batch rearranged
into channels, logits back into the batch).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from einops import rearrange
from torch import nn
from torch_uncertainty.transforms import MIMOBatchFormat

from hydra_core.zoo.default import VitConfig, build_vit


class MIMOViT(nn.Module):
    """A MIMO ViT of E members on the architecture ``arch``; ``forward(images)`` -> (B, E,
    classes): every member given the same images, as at test time."""

    def __init__(self, arch: VitConfig, estimators: int = 3) -> None:
        super().__init__()
        if estimators < 1:
            raise ValueError(f"MIMO needs at least one member, got {estimators}")
        self.arch, self.estimators = arch, estimators
        wide = replace(
            arch, in_chans=arch.in_chans * estimators, num_classes=arch.num_classes * estimators
        )
        self.vit = build_vit(wide)

    def grouped(self, images: torch.Tensor) -> torch.Tensor:
        """Member-major inputs (E * B, C, H, W) -> member-major logits (E * B, classes): row
        ``m * B + i`` is member m's prediction for the i-th of its own images."""
        e = self.estimators
        x = rearrange(images, "(m b) c h w -> b (m c) h w", m=e)
        return rearrange(self.vit(x), "b (m k) -> (m b) k", m=e)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        logits = self.grouped(images.repeat(self.estimators, 1, 1, 1))
        return logits.view(self.estimators, len(images), -1).transpose(0, 1)


def mimo_batch(
    images: torch.Tensor,
    labels: torch.Tensor,
    estimators: int,
    rho: float,
    batch_repeat: int,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One training batch as MIMO trains on it (TorchUncertainty's ``MIMOBatchFormat``):
    member-major inputs (E * batch_repeat * B, ...) and their labels. Its shuffles draw from
    the global random state; here from a state seeded with ``seed`` and restored after, so a
    batch is the same whatever ran before (and an interrupted run resumes exactly)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MIMOBatchFormat(estimators, rho, batch_repeat)((images, labels))
