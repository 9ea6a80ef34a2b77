"""A Hugging Face text classifier's parts by role, as plain tensors, for code that re-implements its
forward (Hydra fusion, :mod:`hydra_core.hydra.fused_text`) without knowing Hugging Face's names.

The forward these parts make, for token ids (B, T) and an attention mask:

- embeddings: ``LN(word[ids] + token_type[0] + position[positions])``, positions ``0, 1, ...``
  (BERT, DistilBERT) or, with a ``padding_idx`` (RoBERTa, MPNet), ``padding_idx + 1, ...`` counted
  over the non-padding tokens (``padding_idx`` itself at padding); DistilBERT has no token type;
- every block, post-LN: ``h = norm1(x + out(attention(x)))``, ``norm2(h + fc2(act(fc1(h))))``,
  scores ``q k^T / sqrt(d_k)`` plus, for MPNet, a relative position bias
  (``relative_attention_bias[relative_position_buckets(T)]``, one column per original head);
- the classifier on the class token (position 0): ``classifier(pooler_act(pooler(x[:, 0])))``.

Dropout is left out: the parts describe the model in eval mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from operator import attrgetter

import torch
from torch import nn

from hydra_core.models.text import TEXT, NoHeads, hf_model

#: (weight (out, in), bias (out,) or None) of a linear layer
Linear = tuple[torch.Tensor, torch.Tensor | None]
#: (weight (d,), bias (d,), eps) of a LayerNorm
Norm = tuple[torch.Tensor, torch.Tensor, float]

#: MPNet's relative position buckets: its encoder always uses 32 buckets up to distance 128
MPNET_BUCKETS = 32
MPNET_MAX_DISTANCE = 128


@dataclass(frozen=True)
class TextBlockParts:
    """One post-LN block. Q/K/V rows and ``out``'s input columns are head-major, d_k per head."""

    heads: int  # heads the block has now (a pruned block may have fewer, or none)
    query: Linear | None  # None when the block keeps no head
    key: Linear | None
    value: Linear | None
    out: Linear  # W_O; its input is the heads' outputs concatenated
    bias_heads: torch.Tensor  # (heads,) int64: each head's column of the relative position bias
    norm1: Norm
    fc1: Linear
    act: nn.Module  # the MLP activation, as the model has it
    fc2: Linear
    norm2: Norm


@dataclass(frozen=True)
class TextParts:
    """A whole text classifier (see the module docstring for the forward they make)."""

    kind: str  # "bert", "roberta", "mpnet" or "distilbert"
    head_dim: int
    word_embeddings: torch.Tensor  # (vocab, d)
    position_embeddings: torch.Tensor  # (positions, d)
    token_type_embedding: torch.Tensor | None  # (d,): token type 0, added to every token
    padding_idx: int | None  # positions counted over real tokens from here (RoBERTa, MPNet)
    embedding_norm: Norm
    relative_attention_bias: torch.Tensor | None  # MPNet: (buckets, heads of the original model)
    blocks: tuple[TextBlockParts, ...]
    pooler: Linear  # the dense layer on the class token
    pooler_act: str  # "tanh" (BERT pooler, RoBERTa/MPNet head) or "relu" (DistilBERT)
    classifier: Linear


def _linear(module: nn.Linear) -> Linear:
    bias = None if module.bias is None else module.bias.detach()
    return module.weight.detach(), bias


def _norm(module: nn.LayerNorm) -> Norm:
    if not isinstance(module, nn.LayerNorm) or module.weight is None or module.bias is None:
        raise TypeError(f"expected a LayerNorm with weight and bias, got {module!r}")
    return module.weight.detach(), module.bias.detach(), float(module.eps)


def text_parts(model: nn.Module) -> TextParts:
    """The parts of a supported Hugging Face sequence classifier (bare or in a TextClassifier),
    detached (not copied); pruned blocks (:func:`~hydra_core.models.adapter.prune_heads`) included.
    """
    arch = TEXT.arch(model)
    layout = TEXT.layout(model)
    hf = hf_model(model)
    backbone = getattr(hf, arch.backbone)
    get = {name: attrgetter(getattr(arch, name)) for name in ("query", "key", "value")}
    blocks = []
    for n, block in zip(layout.num_heads, TEXT.blocks(model), strict=True):
        attention = attrgetter(arch.attention)(block)
        kept = getattr(attention, "kept_heads", None)  # a pruned MPNet attention's own heads
        has_heads = not isinstance(attention, NoHeads)
        blocks.append(
            TextBlockParts(
                heads=n,
                **{k: _linear(g(block)) if has_heads else None for k, g in get.items()},
                out=_linear(TEXT.output_projection(block)),
                bias_heads=torch.arange(n) if kept is None else kept.detach().cpu().clone(),
                norm1=_norm(attrgetter(arch.norm1)(block)),
                fc1=_linear(attrgetter(arch.fc1)(block)),
                act=attrgetter(arch.act)(block),
                fc2=_linear(attrgetter(arch.fc2)(block)),
                norm2=_norm(attrgetter(arch.norm2)(block)),
            )
        )
    embeddings = backbone.embeddings
    token_type = getattr(embeddings, "token_type_embeddings", None)
    if arch.backbone == "bert":
        pooler, act, classifier = backbone.pooler.dense, "tanh", hf.classifier
    elif arch.backbone == "distilbert":
        pooler, act, classifier = hf.pre_classifier, "relu", hf.classifier
    else:  # RoBERTa, MPNet: a classification head reading token 0
        pooler, act, classifier = hf.classifier.dense, "tanh", hf.classifier.out_proj
    relative = None
    if arch.backbone == "mpnet":
        relative = backbone.encoder.relative_attention_bias.weight.detach()
    return TextParts(
        kind=arch.backbone,
        head_dim=layout.head_dim,
        word_embeddings=embeddings.word_embeddings.weight.detach(),
        position_embeddings=embeddings.position_embeddings.weight.detach(),
        token_type_embedding=None if token_type is None else token_type.weight.detach()[0],
        padding_idx=int(embeddings.padding_idx) if arch.backbone in ("roberta", "mpnet") else None,
        embedding_norm=_norm(embeddings.LayerNorm),
        relative_attention_bias=relative,
        blocks=tuple(blocks),
        pooler=_linear(pooler),
        pooler_act=act,
        classifier=_linear(classifier),
    )


def relative_position_buckets(
    length: int,
    device: torch.device | str = "cpu",
    num_buckets: int = MPNET_BUCKETS,
    max_distance: int = MPNET_MAX_DISTANCE,
) -> torch.Tensor:
    """MPNet's (T5's) relative position buckets for a sequence of ``length``: (T, T) int64, entry
    [i, j] the bucket of key j seen from query i (as ``MPNetEncoder.relative_position_bucket``)."""
    position = torch.arange(length, dtype=torch.long, device=device)
    n = position[:, None] - position[None, :]  # -(key - query)
    half = num_buckets // 2
    ret = (n < 0).to(torch.long) * half
    n = n.abs()
    max_exact = half // 2
    large = max_exact + (
        torch.log(n.float() / max_exact) / math.log(max_distance / max_exact) * (half - max_exact)
    ).to(torch.long)
    large = large.clamp(max=half - 1)
    return ret + torch.where(n < max_exact, n, large)
