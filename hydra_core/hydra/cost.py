"""What a model costs: parameters, multiply-adds (counted and by formula) and measured latency.

The paper (Appendix B.4) counts per transformer layer 12d² for a single model,
4M(H_l/H)d² + 8d² for Hydra and 12Md² for Deep Ensembles (MLP ratio 4). Those are *weights*: the
merged MLP is stored once. Its *multiply-adds* are not shared - the merged MLP runs on each of the M
token streams - so per token Hydra costs M(4(H_l/H)d² + 8d²), the same as running the pruned members
one after another (the paper's own Table 7 agrees: 46.19 G for Hydra vs 3 x 15.48 G for a member).
:func:`formula_params` gives the paper's weight count and :func:`formula_macs` the multiply-adds,
generalised to any MLP width, per-layer kept heads and token count, with the attention-score terms.

Every model family works here: the sizes come from the family
(:meth:`~hydra_core.models.family.ModelFamily.cost_sizes`: a ViT's patch embedding, a text model's
token count and the dense layer before its classifier, an OpenCLIP tower's projection and a
zero-shot classifier's class matrix), parameters are sorted by the family's kinds, and a text model
runs in its callable form (packed token ids in, logits out).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from hydra_core.evaluate import callable_model
from hydra_core.models.adapter import UnsupportedModelError, family_of, head_layout
from hydra_core.types import Progress, StageProgress


@dataclass(frozen=True)
class ModelShape:
    """The sizes that the cost of a forward depends on (for one sample).

    Args:
        embed_dim: d.
        head_dim: d_k.
        mlp_hidden: d_ff, the MLP's hidden width (4d in the paper).
        num_tokens: N, tokens per sample (ViT: patches + class/register tokens; text: the padded
            length of the batch).
        num_classes: C, the classifier's outputs.
        token_pool: the classifier reads the class token only (the last layer needs only its row).
        num_patches: patches per image (the patch embedding runs on these); 0 for text, whose
            embedding is a table lookup.
        patch_dim: C * p_h * p_w, the input of the patch embedding (0 for text).
        pre_classifier: width of a dense layer between the class token and the classifier (BERT's
            pooler, RoBERTa's and DistilBERT's dense layer; 0 for a ViT).
    """

    embed_dim: int
    head_dim: int
    mlp_hidden: int
    num_tokens: int
    num_classes: int
    token_pool: bool
    num_patches: int = 0
    patch_dim: int = 0
    pre_classifier: int = 0

    @classmethod
    def of(cls, model: nn.Module, inputs: torch.Tensor | None = None) -> ModelShape:
        """The shape of a model of any supported family, for one sample of ``inputs`` (a text
        model's token count is the length of ``inputs``; see
        :meth:`~hydra_core.models.family.ModelFamily.cost_sizes`)."""
        layout = head_layout(model)
        sizes = family_of(model).cost_sizes(model, inputs)
        return cls(embed_dim=layout.embed_dim, head_dim=layout.head_dim, **asdict(sizes))

    @property
    def stem_macs(self) -> int:
        """Multiply-adds of the embedding (the patch embedding's matrix multiply)."""
        return self.num_patches * self.patch_dim * self.embed_dim

    @property
    def classifier_macs(self) -> int:
        """Multiply-adds of the classifier on one pooled token (with its dense layer before)."""
        if self.pre_classifier:
            return self.embed_dim * self.pre_classifier + self.pre_classifier * self.num_classes
        return self.embed_dim * self.num_classes


#: the name this class had when it described timm ViTs only
VitShape = ModelShape


def _named_parameters(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The parameters every input runs through: a family's model says which
    (:meth:`~hydra_core.models.family.ModelFamily.per_input_parameters`: a CLIP classifier's
    text tower runs once, into its class embeddings); anything else, all of them."""
    try:
        family = family_of(module)
    except UnsupportedModelError:
        return list(module.named_parameters())
    return list(family.per_input_parameters(module))


def count_params(module: nn.Module) -> int:
    """Number of parameters an input runs through (a tensor shared between submodules counts
    once; a CLIP classifier's text tower, which runs once per classifier, not at all)."""
    return sum(p.numel() for _, p in _named_parameters(module))


def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of attention: Q Kᵀ and A V, each 2 FLOPs per multiply-add."""
    *batch, s_q, d_q = query_shape
    s_k, d_v = key_shape[-2], value_shape[-1]
    rows = int(np.prod(batch))
    return 2 * rows * s_q * s_k * d_q + 2 * rows * s_q * s_k * d_v


def _native_mha_flops(
    query_shape, key_shape, value_shape, embed_dim, num_heads, *args, out_shape=None, **kwargs
) -> int:
    """FLOPs of ``nn.MultiheadAttention``'s fused inference kernel (its fast path, which an
    open_clip tower takes without gradients): the Q, K, V projections, Q Kᵀ and A V over all heads
    (H * d_k = d), and the output projection; inputs (B, N, d)."""
    b, n_q, d = query_shape
    n_k = key_shape[1]
    macs = b * n_q * d * d + 2 * b * n_k * d * d  # Q; K and V
    macs += 2 * b * n_q * n_k * d  # Q Kᵀ and A V
    macs += b * n_q * d * d  # W_O
    return 2 * macs


# torch's FlopCounterMode knows the CUDA attention kernels but not the CPU one, nor the fused
# kernel of nn.MultiheadAttention (it would count nothing of an open_clip tower's attention)
_EXTRA_FLOP_FORMULAS = {torch.ops.aten._native_multi_head_attention: _native_mha_flops}
if hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
    _EXTRA_FLOP_FORMULAS[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu] = _sdpa_flops


@torch.inference_mode()
def count_macs(module: Callable[[torch.Tensor], object], example_input: torch.Tensor) -> int:
    """Multiply-adds of one forward on ``example_input``, counted by torch's FlopCounterMode
    (a model of a supported family runs in its callable form: a text model on packed ids).

    Counted: matrix multiplies, convolutions and attention (MACs = FLOPs / 2). Not counted:
    elementwise work (biases, norms, activations, softmax, residual adds) and table lookups
    (a text model's embedding)."""
    if isinstance(module, nn.Module):
        module = callable_model(module)
    with FlopCounterMode(display=False, custom_mapping=_EXTRA_FLOP_FORMULAS) as counter:
        module(example_input)
    return counter.get_total_flops() // 2


def layer_macs(shape: ModelShape, heads: int, *, num_queries: int | None = None) -> int:
    """Multiply-adds of one transformer layer keeping ``heads`` heads, for one sample.

    Q/K/V are computed for all N tokens; attention scores (Q Kᵀ and A V), the output projection and
    the MLP only for the ``num_queries`` rows that are needed (default: all N)."""
    d, n, a = shape.embed_dim, shape.num_tokens, heads * shape.head_dim
    nq = n if num_queries is None else num_queries
    qkv = n * 3 * d * a
    scores = 2 * nq * n * a
    proj = nq * a * d
    mlp = nq * 2 * d * shape.mlp_hidden
    return qkv + scores + proj + mlp


def formula_macs(
    shape: ModelShape,
    heads: Sequence[Sequence[int]],
    *,
    fused: bool = False,
    shared_layers: int = 0,
    shared_stem: bool = True,
) -> int:
    """Multiply-adds for one sample through M models, member m keeping ``heads[m][l]`` in layer
    l.

    Per layer and token this is 3dh·d_k (Q/K/V) + h·d_k·d (output) + 2d·d_ff (MLP) - the paper's
    12d² at h = H, d_ff = 4d - plus 2N·h·d_k for the attention scores; plus the stem (a ViT's patch
    embedding; nothing for a text model's table lookup) and the classifier (with BERT's pooler or
    the dense layer before a text classifier).

    ``fused=False``: the models run one after another (single model: one member keeping all heads;
    Deep Ensembles: M members keeping all heads).
    ``fused=True``: the Hydra forward as :class:`~hydra_core.hydra.fused.HydraViT` computes it: the
    stem once if ``shared_stem``; the first ``shared_layers`` layers once; each later layer for M
    streams, every member padded to the layer's largest head count; with token pooling only the
    class token's row in the last layer; the classifier on every stream (once if all are shared).
    """
    m = len(heads)
    depth = len(heads[0]) if m else 0
    if m == 0 or any(len(h) != depth for h in heads):
        raise ValueError("heads must list the same number of layers for every member")
    stem, classifier = shape.stem_macs, shape.classifier_macs
    if not fused:
        return sum(
            stem + classifier + sum(layer_macs(shape, h) for h in member) for member in heads
        )
    if shared_layers and not shared_stem:
        raise ValueError("layers can only be shared after a shared stem")
    total = stem * (1 if shared_stem else m) + classifier * (1 if shared_layers == depth else m)
    for layer in range(depth):
        queries = 1 if shape.token_pool and layer == depth - 1 else None
        widest = max(member[layer] for member in heads)
        streams = 1 if layer < shared_layers else m
        total += streams * layer_macs(shape, widest, num_queries=queries)
    return total


def formula_params(shape: ModelShape, heads: Sequence[Sequence[int]], *, merged_mlp: bool) -> int:
    """Weights of the transformer layers as the paper counts them (Appendix B.4; biases and norms
    left out): 4(h_m/H)d² of attention per member, plus 2d·d_ff for each MLP - one merged MLP for
    Hydra, one per member otherwise. Single: 12d²; Hydra: 4M(H_l/H)d² + 8d²; Deep Ensembles: 12Md²
    per layer (d_ff = 4d)."""
    d = shape.embed_dim
    attn = sum(4 * d * h * shape.head_dim for member in heads for h in member)
    mlps = (1 if merged_mlp else len(heads)) * len(heads[0]) * 2 * d * shape.mlp_hidden
    return attn + mlps


#: parameter groups of :func:`parameter_breakdown`, matched in this order on the parameter names of
#: a model outside every family: a fused Hydra model (HydraViT, HydraText, or HydraZeroShot, whose
#: names start with ``visual.``), named as in :mod:`hydra_core.hydra.layers`. A family's model
#: (timm, Hugging Face or open_clip names) is sorted by its family (:data:`KIND_GROUPS`).
PARAMETER_GROUPS = (
    ("embedding", r"(^|\.)(patch_embed|stem|cls_token|reg_token|pos_embed|embeddings)($|\.)"),
    ("layer norms", r"norm"),
    ("attention weights", r"(qkv|proj)[._]weight"),
    ("attention biases", r"(qkv|proj)[._]bias|\.position_bias$"),
    ("MLP weights", r"fc[12][._]weight"),
    ("MLP biases", r"fc[12][._]bias|\.ls2$"),  # the MLP's layer scale, as a family counts it
    ("classifier", r"(^|\.)(head|pooler|classifier)\."),
)
#: the family's parameter kind -> the group of :func:`parameter_breakdown`; attention and MLP
#: parameters go to "... weights" when they are weight matrices, to "... biases" otherwise
#: (biases, a ViT's layer scales, MPNet's table of position biases)
KIND_GROUPS = {
    "embed": "embedding",
    "norm": "layer norms",
    "attn": ("attention weights", "attention biases"),
    "mlp": ("MLP weights", "MLP biases"),
    "head": "classifier",
}


def parameter_breakdown(module: nn.Module) -> dict[str, int]:
    """Parameters by kind (:data:`PARAMETER_GROUPS`): what the paper's formula counts (attention
    and MLP weights) and what it leaves out (biases, norms, embedding, classifier), so that a fused
    model's count can be set against :func:`formula_params`. A text model's embedding holds its
    token, position and type embeddings and their LayerNorm; its classifier, BERT's pooler or the
    dense layer before the classifier. Counted as :func:`count_params` counts (a CLIP
    classifier's text tower left out). Raises on a parameter no group matches, rather than
    dropping it."""
    try:
        family = family_of(module)
    except UnsupportedModelError:
        family = None
    tables = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    counts = dict.fromkeys((name for name, _ in PARAMETER_GROUPS), 0)
    for name, parameter in _named_parameters(module):
        if family is not None:
            group = KIND_GROUPS[family.parameter_kind(module, name)]
            if isinstance(group, tuple):
                matrix = parameter.ndim >= 2 and id(parameter) not in tables
                group = group[0] if matrix else group[1]
        else:
            group = next((g for g, pattern in PARAMETER_GROUPS if re.search(pattern, name)), None)
        if group is None:
            raise ValueError(f"parameter {name!r} fits no group of PARAMETER_GROUPS")
        counts[group] += parameter.numel()
    return counts


def forward_fn(
    models: Sequence[nn.Module], inputs: torch.Tensor, *, autocast_dtype: torch.dtype | None = None
) -> Callable[[], list[torch.Tensor]]:
    """A function of no arguments that runs ``models`` one after another on ``inputs`` (images,
    or packed token ids for a text model, which runs in its callable form), under
    ``torch.inference_mode`` (and under ``torch.autocast`` on the inputs' device, given a
    dtype)."""
    device_type = inputs.device.type
    runnable = [callable_model(m) for m in models]

    def run() -> list[torch.Tensor]:
        autocast = torch.autocast(device_type, dtype=autocast_dtype) if autocast_dtype else None
        with torch.inference_mode(), autocast or nullcontext():
            return [m(inputs) for m in runnable]

    return run


def measure_latencies(
    fns: Mapping[str, Callable[[], object]],
    *,
    warmup: int = 3,
    repeats: int = 20,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
) -> dict[str, dict[str, float]]:
    """Wall-clock time of each function, called in turn (round-robin, so slow drifts in machine load
    hit all of them alike). Returns, per name, the median and inter-quartile range in milliseconds.
    On CUDA every call is followed by ``torch.cuda.synchronize()`` before the clock stops.
    ``progress(done, total)`` at the start (0) and after each round, warm-up rounds included."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    cuda = torch.device(device).type == "cuda"
    rounds = warmup + repeats

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    if progress:
        progress(0, rounds)  # the stage has begun: what a progress bar names
    for done in range(1, warmup + 1):
        for fn in fns.values():
            fn()
        if progress:
            progress(done, rounds)
    sync()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for done in range(warmup + 1, rounds + 1):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            sync()
            times[name].append((time.perf_counter() - start) * 1e3)
        if progress:
            progress(done, rounds)
    result = {}
    for name, ms in times.items():
        q25, median, q75 = np.percentile(ms, [25, 50, 75])
        result[name] = {
            "median_ms": float(median),
            "iqr_ms": float(q75 - q25),
            "min_ms": float(min(ms)),
            "repeats": repeats,
        }
    return result


def measure_latency(
    fn: Callable[[], object],
    *,
    warmup: int = 3,
    repeats: int = 20,
    device: str | torch.device = "cpu",
) -> dict[str, float]:
    """Wall-clock time of ``fn()``: median, inter-quartile range and minimum in ms (see
    :func:`measure_latencies`)."""
    return measure_latencies({"fn": fn}, warmup=warmup, repeats=repeats, device=device)["fn"]


def cost_table(
    systems: Mapping[str, Sequence[nn.Module]],
    inputs: torch.Tensor,
    *,
    latency: bool = True,
    precisions: Mapping[str, torch.dtype | None] | None = None,
    warmup: int = 3,
    repeats: int = 20,
    progress: StageProgress | None = None,
) -> pd.DataFrame:
    """Parameters, multiply-adds and (optionally) latency of systems, each a list of models run
    one after another - the one place where the app, the CLI, the report and the benchmark get
    their cost numbers.

    Args:
        systems: row name -> the models that make up the system (a single model, the pruned
            members one by one, the fused Hydra model, Deep Ensembles' copies, ...). The
            multiply-adds of a model that is in several systems are counted once and reused.
            A text model runs in its callable form.
        inputs: the batch (preprocessed images, or packed token ids); every system runs on all
            of it, on ``inputs.device``.
        latency: time the systems (otherwise params and multiply-adds only).
        precisions: column stem -> autocast dtype (None: no autocast), one latency measurement
            per entry; default ``{"latency": None}``. On CUDA, ``{"latency": None,
            "latency_bf16": torch.bfloat16}`` adds bf16 columns.
        warmup, repeats: untimed and timed round-robin calls per system (see
            :func:`measure_latencies`).
        progress: ``progress(stage, done, total)``: stage ``"multiply-adds"`` per model counted,
            then one stage per latency column (``"latency"``, ``"latency_bf16"``) per round.

    Returns:
        One row per system, the index named ``system``. Columns: params; macs (for the whole
        batch); per precision ``<stem>_ms`` and ``<stem>_iqr_ms`` (median and inter-quartile range
        in ms); and, when a row is named ``single``, ``params_ratio``, ``macs_ratio`` and
        ``<stem>_ratio``: each divided by the single model's value. Latency runs under
        ``torch.inference_mode``.
    """
    stems = dict(precisions or {"latency": None}) if latency else {}
    # counted on the whole batch: a text batch runs at its padded length, not each sample's own
    macs: dict[int, int] = {}
    rows = {}
    distinct = len({id(m) for models in systems.values() for m in models})
    if progress:
        progress("multiply-adds", 0, distinct)
    for name, models in systems.items():
        for m in models:
            if id(m) not in macs:
                macs[id(m)] = count_macs(m, inputs)
                if progress:
                    progress("multiply-adds", len(macs), distinct)
        rows[name] = {
            "params": sum(count_params(m) for m in models),
            "macs": sum(macs[id(m)] for m in models),
        }
    for stem, dtype in stems.items():
        fns = {
            name: forward_fn(models, inputs, autocast_dtype=dtype)
            for name, models in systems.items()
        }
        report = (lambda done, total, stem=stem: progress(stem, done, total)) if progress else None
        timings = measure_latencies(
            fns, warmup=warmup, repeats=repeats, device=inputs.device, progress=report
        )
        for name, t in timings.items():
            rows[name][f"{stem}_ms"] = t["median_ms"]
            rows[name][f"{stem}_iqr_ms"] = t["iqr_ms"]
    table = pd.DataFrame.from_dict(rows, orient="index").rename_axis("system")
    if "single" in table.index:
        for column, ratio in (
            ("params", "params_ratio"),
            ("macs", "macs_ratio"),
            *((f"{stem}_ms", f"{stem}_ratio") for stem in stems),
        ):
            table[ratio] = table[column] / table.loc["single", column]
    return table
