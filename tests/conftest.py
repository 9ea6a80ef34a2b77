"""Shared fixtures: tiny timm ViTs in every configuration the adapter supports, built fast."""

from __future__ import annotations

import os

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from hydra_core.models.default import VitConfig, build_vit, save_checkpoint

# Tiny models gain nothing from threads, and OpenMP threads that spin-wait for a busy core slow
# every small op down badly on a loaded 2-core machine.
torch.set_num_threads(1)


def missing_data(reason: str) -> None:
    """Skip a test whose data files are not installed on this machine; fail it under CI
    (``CI`` set), where ``make setup`` installs every data file, so a missing one is a bug."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"data missing under CI: {reason}")
    pytest.skip(reason, allow_module_level=True)


#: timm configurations every model transform is checked on (qkv bias or not, layer scale,
#: token or average pooling, no class token, register tokens, no_embed_class).
TINY_CONFIGS = {
    "token-bias": dict(qkv_bias=True),
    "token-nobias": dict(qkv_bias=False),
    "layerscale": dict(init_values=0.5),
    "avgpool": dict(global_pool="avg"),
    "avg-noclass": dict(global_pool="avg", class_token=False),
    "registers-noembedclass": dict(reg_tokens=2, no_embed_class=True, init_values=0.3),
}


def make_tiny_vit(
    seed: int = 0, depth: int = 3, num_heads: int = 4, scale: float = 4.0, **overrides
) -> VisionTransformer:
    """A tiny random ViT (16x16x1 input, 4x4 patches, d=24) in eval mode.

    timm's initialisation gives near-zero weights, so nearly every head would be inert; the
    weights are scaled up by ``scale`` so that removing a head changes the logits noticeably."""
    torch.manual_seed(seed)
    kwargs = dict(
        img_size=16,
        patch_size=4,
        in_chans=1,
        num_classes=5,
        embed_dim=24,
        depth=depth,
        num_heads=num_heads,
        mlp_ratio=2.0,
        qkv_bias=True,
        global_pool="token",
    )
    kwargs.update(overrides)
    model = VisionTransformer(**kwargs)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2 or "bias" in name:
                p.mul_(scale)
    return model.eval()


@pytest.fixture(params=sorted(TINY_CONFIGS), ids=sorted(TINY_CONFIGS))
def tiny_vit(request) -> VisionTransformer:
    return make_tiny_vit(**TINY_CONFIGS[request.param])


@pytest.fixture
def images() -> torch.Tensor:
    return torch.randn(8, 1, 16, 16, generator=torch.Generator().manual_seed(1))


def random_mask(shape: tuple[int, int], seed: int, p_keep: float = 0.6) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < p_keep


#: The architecture of the tiny Hydra Lab checkpoints the CLI, report and app tests load by path.
TINY = VitConfig(embed_dim=24, depth=2, num_heads=4, mlp_ratio=2.0)  # 2 x 4 = 8 heads


def write_tiny_checkpoint(path, config: VitConfig = TINY, seed: int = 0) -> str:
    """A tiny default-architecture checkpoint (28 px, 10 classes) saved at ``path``."""
    torch.manual_seed(seed)
    model = build_vit(config)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)  # timm's init is nearly inert; bigger weights make heads matter
    save_checkpoint(model, path, config)
    return str(path)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> str:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny.safetensors")
