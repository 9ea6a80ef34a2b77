"""The Hugging Face text-encoder family: BERT, RoBERTa, MPNet and DistilBERT sequence classifiers.

Blocks are post-LN: ``h = LN1(x + W_O(attention(x)))``, then ``LN2(h + fc2(act(fc1(h))))``. The
heads are concatenated at the input of W_O (BERT/RoBERTa ``attention.output.dense``, MPNet
``attention.attn.o``, DistilBERT ``attention.out_lin``). The classifier reads the class token
(position 0) of the last block's output.

Inputs are token ids and an attention mask. Inside Hydra Lab a batch of sentences travels as one
int64 tensor (B, 2, T): row 0 the token ids, row 1 the attention mask (1 = a real token), so that
it can be cut, concatenated and moved like a batch of images; :class:`TextPreprocess` makes it from
strings and :class:`TextClassifier` takes it (or ``input_ids=``/``attention_mask=``) and returns
logits. Every path applies the attention mask, so padding never changes a result (up to float
rounding), and padding columns that no sample of a batch uses are dropped before any compute.

Heads are switched off by a pre-hook on W_O and cut out by slicing Q/K/V rows and W_O columns, never
through ``head_mask`` or ``prune_heads``, which transformers 5 ignores and lacks. MPNet adds a
relative position bias (one per head, shared by all layers) to its attention scores: a pruned MPNet
layer keeps its heads' rows of that bias.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from hydra_core.models.family import (
    PARAMETER_KINDS,
    Context,
    CostSizes,
    HeadLayout,
    ModelFamily,
    PostNormParts,
    UnsupportedModelError,
    shallow_copy,
)
from hydra_core.models.modality import TEXT_MODALITY
from hydra_core.models.part_readers import block_parts, norm_parts
from hydra_core.models.parts import POSITION_BUCKETS, FusionParts, LinearParts, TokenStem

#: the tokens a sentence is cut to (the default for :class:`TextPreprocess`)
MAX_TOKENS = 128


@dataclass(frozen=True)
class _Arch:
    """Where the parts of one architecture are, as dotted paths."""

    backbone: str  # the classifier's attribute holding the encoder model
    layers: str  # from the backbone to the list of blocks
    attention: str  # from a block to the module that holds Q/K/V (replaced when pruning)
    query: str  # from a block to the Q, K, V and output linear layers
    key: str
    value: str
    out: str
    norm1: str  # the LayerNorm after the attention's residual
    fc1: str
    act: str
    fc2: str
    norm2: str  # the LayerNorm after the MLP's residual
    heads_attr: str  # the attention module's attribute holding its number of heads
    width_attr: str | None  # ... and its attribute holding heads x d_k, when it has one
    out_in_attention: bool  # W_O belongs to the `attention` module (its forward applies it)


_BERT = _Arch(
    backbone="bert",
    layers="encoder.layer",
    attention="attention.self",
    query="attention.self.query",
    key="attention.self.key",
    value="attention.self.value",
    out="attention.output.dense",
    norm1="attention.output.LayerNorm",
    fc1="intermediate.dense",
    act="intermediate.intermediate_act_fn",
    fc2="output.dense",
    norm2="output.LayerNorm",
    heads_attr="num_attention_heads",
    width_attr="all_head_size",
    out_in_attention=False,
)
_ARCHS: dict[str, _Arch] = {
    "BertForSequenceClassification": _BERT,
    "RobertaForSequenceClassification": _Arch(**{**_BERT.__dict__, "backbone": "roberta"}),
    "MPNetForSequenceClassification": _Arch(
        backbone="mpnet",
        layers="encoder.layer",
        attention="attention.attn",
        query="attention.attn.q",
        key="attention.attn.k",
        value="attention.attn.v",
        out="attention.attn.o",
        norm1="attention.LayerNorm",
        fc1="intermediate.dense",
        act="intermediate.intermediate_act_fn",
        fc2="output.dense",
        norm2="output.LayerNorm",
        heads_attr="num_attention_heads",
        width_attr="all_head_size",
        out_in_attention=True,
    ),
    "DistilBertForSequenceClassification": _Arch(
        backbone="distilbert",
        layers="transformer.layer",
        attention="attention",
        query="attention.q_lin",
        key="attention.k_lin",
        value="attention.v_lin",
        out="attention.out_lin",
        norm1="sa_layer_norm",
        fc1="ffn.lin1",
        act="ffn.activation",
        fc2="ffn.lin2",
        norm2="output_layer_norm",
        heads_attr="n_heads",
        width_attr=None,
        out_in_attention=True,
    ),
}
SUPPORTED = tuple(_ARCHS)


def _get(module: nn.Module, path: str):
    for part in path.split("."):
        module = getattr(module, part)
    return module


def _replace(copy_: nn.Module, original: nn.Module, path: str, value: nn.Module) -> None:
    """Set ``path`` of ``copy_`` (a shallow copy of ``original``) to ``value``, shallow-copying
    the modules on the way that ``copy_`` still shares with ``original``: ``original`` is never
    changed."""
    *parents, name = path.split(".")
    node, source = copy_, original
    for part in parents:
        child, shared = getattr(node, part), getattr(source, part)
        if child is shared:
            child = shallow_copy(shared)
            setattr(node, part, child)
        node, source = child, shared
    setattr(node, name, value)


# --- inputs ---------------------------------------------------------------------------------------


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Token ids (B, T) and an attention mask (B, T) -> one int64 tensor (B, 2, T)."""
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must have shape (batch, tokens), got {tuple(input_ids.shape)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids "
            f"{tuple(input_ids.shape)}"
        )
    return torch.stack([input_ids.long(), attention_mask.long()], dim=1)


def unpack(inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, 2, T) -> (token ids (B, T), attention mask (B, T)), padding columns that no sample
    uses dropped."""
    if inputs.ndim != 3 or inputs.shape[1] != 2:
        raise ValueError(
            "text inputs must be token ids and attention masks packed as (batch, 2, tokens), got "
            f"shape {tuple(inputs.shape)}"
        )
    ids, mask = inputs[:, 0], inputs[:, 1]
    used = mask.bool().any(0).nonzero()
    end = int(used.max()) + 1 if len(used) else 1
    return ids[:, :end], mask[:, :end]


def forward_inputs(
    inputs: torch.Tensor | None = None,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """What a text model's ``forward`` takes -> (token ids, attention mask) as :func:`unpack`
    gives them: packed inputs (B, 2, T), or ``input_ids`` (B, T) and an ``attention_mask``."""
    if inputs is None:
        if input_ids is None:
            raise ValueError("pass packed inputs (B, 2, T) or input_ids (and attention_mask)")
        inputs = pack(input_ids, attention_mask)
    return unpack(inputs)


class TextPreprocess:
    """Sentences -> packed token ids and attention masks (N, 2, ``max_length``), via a Hugging Face
    tokenizer (truncated to ``max_length`` tokens, padded to it)."""

    def __init__(self, tokenizer, max_length: int = MAX_TOKENS, source: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        #: where the tokenizer comes from again (a model name or folder), stored with exports
        self.source = source or getattr(tokenizer, "name_or_path", None)

    def normalize(self, text: str) -> str:
        """``text`` as the model sees it before splitting into tokens: the tokenizer's own
        normalizer (lower-casing, accent stripping for uncased BERT), or ``text`` unchanged where
        the tokenizer has none. Surface features that this removes are invisible to the model."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        normalizer = getattr(backend, "normalizer", None)
        return text if normalizer is None else normalizer.normalize_str(text)

    def __call__(self, texts: Sequence[str]) -> torch.Tensor:
        texts = list(texts)
        if not texts:
            return torch.zeros(0, 2, self.max_length, dtype=torch.long)
        encoded = self.tokenizer(
            texts,
            padding="max_length",
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
            return_token_type_ids=False,
        )
        return pack(encoded["input_ids"], encoded["attention_mask"])


class TextClassifier(nn.Module):
    """A Hugging Face sequence classifier that takes packed inputs and returns logits.

    ``forward(inputs)`` with inputs (B, 2, T) (see :func:`pack`), or ``forward(input_ids=...,
    attention_mask=...)``; either way logits (B, C). The wrapped model is ``self.hf``; ablation,
    pruning and fusion work on either.
    """

    def __init__(self, hf: nn.Module) -> None:
        super().__init__()
        self.hf = hf
        self.training = hf.training  # a wrapper of a model in eval mode is in eval mode

    def forward(
        self,
        inputs: torch.Tensor | None = None,
        *,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        ids, mask = forward_inputs(inputs, input_ids, attention_mask)
        return self.hf(input_ids=ids, attention_mask=mask).logits


def hf_model(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside a :class:`TextClassifier` (the model itself otherwise)."""
    return model.hf if isinstance(model, TextClassifier) else model


@dataclass(frozen=True)
class TextContext:
    """What every block needs besides the stream: which tokens are real, MPNet's position bias."""

    mask: torch.Tensor  # (B, N) bool, True = a real token
    position_bias: torch.Tensor | None = None  # (1, H, N, N): MPNet's, every head of the model

    def scores_bias(self, dtype: torch.dtype) -> torch.Tensor:
        """(B, 1, 1, N): 0 for real tokens, the dtype's most negative value for padding."""
        bias = torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device)
        return bias.masked_fill_(~self.mask, torch.finfo(dtype).min)[:, None, None]


@functools.cache
def _pruned_mpnet_attention() -> type:
    """MPNet's self-attention keeping some heads: it takes their rows of the position bias."""
    from transformers.models.mpnet.modeling_mpnet import MPNetSelfAttention

    class PrunedMPNetSelfAttention(MPNetSelfAttention):
        def forward(self, hidden_states, attention_mask=None, position_bias=None, *args, **kwargs):
            if position_bias is not None:
                position_bias = position_bias.index_select(1, self.kept_heads)
            return super().forward(hidden_states, attention_mask, position_bias, *args, **kwargs)

    return PrunedMPNetSelfAttention


class NoHeads(nn.Module):
    """The attention of a layer that keeps no head. With W_O inside (``out``), it returns W_O's
    bias, the whole attention output; without, the empty head outputs (B, N, 0)."""

    def __init__(self, out: nn.Linear | None, head_dim: int, outputs: int) -> None:
        super().__init__()
        self.out = out
        self.head_dim = head_dim
        self.outputs = outputs  # the length of the tuple the replaced module returned

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        z = hidden_states.new_zeros(*hidden_states.shape[:-1], 0)
        result = z if self.out is None else self.out(z)
        return (result, None)[: self.outputs]


def _slice_linear(linear: nn.Linear, rows=None, cols=None) -> nn.Linear:
    weight = linear.weight.detach()
    bias = None if linear.bias is None else linear.bias.detach()
    if rows is not None:
        weight, bias = weight[rows], None if bias is None else bias[rows]
    if cols is not None:
        weight = weight[:, cols]
    new = nn.Linear(1, 1, bias=bias is not None, device=weight.device, dtype=weight.dtype)
    new.in_features, new.out_features = weight.shape[1], weight.shape[0]
    new.weight = nn.Parameter(weight.clone())
    new.bias = None if bias is None else nn.Parameter(bias.clone())
    return new


def _classifier_layers(hf: nn.Module, backbone: str) -> tuple[nn.Linear, str, nn.Linear]:
    """The classifier on the class token: (dense layer, its activation, output layer)."""
    if backbone == "bert":
        return hf.bert.pooler.dense, "tanh", hf.classifier
    if backbone == "distilbert":
        return hf.pre_classifier, "relu", hf.classifier
    return hf.classifier.dense, "tanh", hf.classifier.out_proj  # RoBERTa, MPNet: token 0


def _fusion_refusal(where: str, what: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"{where} cannot be fused: {what}")


class TextFamily(ModelFamily):
    """Hugging Face BERT, RoBERTa, MPNet and DistilBERT sequence classifiers, bare or inside a
    :class:`TextClassifier`."""

    name = "text"
    modality = TEXT_MODALITY

    def arch(self, model: nn.Module) -> _Arch:
        name = type(hf_model(model)).__name__
        if name not in _ARCHS:
            raise UnsupportedModelError(
                f"{name} is not a supported text classifier; Hydra Lab supports "
                f"{', '.join(SUPPORTED)}"
            )
        return _ARCHS[name]

    def matches(self, model: nn.Module) -> bool:
        if isinstance(model, TextClassifier):
            return True
        return "transformers" in sys.modules and type(model).__name__ in _ARCHS

    def bare_model(self, model: nn.Module) -> nn.Module:
        return hf_model(model)

    def _arch_of_block(self, block: nn.Module) -> _Arch:
        name = type(block).__name__
        for arch, prefix in ((_BERT, "Bert"), (_BERT, "Roberta")):
            if name == f"{prefix}Layer":
                return arch
        if name == "MPNetLayer":
            return _ARCHS["MPNetForSequenceClassification"]
        if name == "TransformerBlock":
            return _ARCHS["DistilBertForSequenceClassification"]
        raise UnsupportedModelError(f"{name} is not a block of a supported text encoder")

    def blocks(self, model: nn.Module) -> Sequence[nn.Module]:
        arch = self.arch(model)
        return _get(getattr(hf_model(model), arch.backbone), arch.layers)

    def layout(self, model: nn.Module) -> HeadLayout:
        arch = self.arch(model)
        hf = hf_model(model)
        if getattr(hf.config, "is_decoder", False):
            raise UnsupportedModelError(
                f"{type(hf).__name__} is configured as a decoder; Hydra Lab supports encoders"
            )
        blocks = self.blocks(model)
        if len(blocks) == 0:
            raise UnsupportedModelError("the model has no transformer blocks")
        heads, dims = [], set()
        for block in blocks:
            attention = _get(block, arch.attention)
            if isinstance(attention, NoHeads):
                heads.append(0)
                dims.add(attention.head_dim)
                continue
            n = int(getattr(attention, arch.heads_attr))
            width = _get(block, arch.query).out_features
            heads.append(n)
            dims.add(width // n)
        if len(dims) != 1:
            raise UnsupportedModelError(f"layers disagree on the head dimension: {sorted(dims)}")
        return HeadLayout(
            num_heads=tuple(heads),
            head_dim=dims.pop(),
            embed_dim=int(self.output_projection(blocks[0]).out_features),
        )

    def output_projection(self, block: nn.Module) -> nn.Linear:
        arch = self._arch_of_block(block)
        attention = _get(block, arch.attention)
        if isinstance(attention, NoHeads) and arch.out_in_attention:
            return attention.out
        return _get(block, arch.out)

    def _kept_heads(self, block: nn.Module) -> torch.Tensor | None:
        """The original indices of the heads a pruned MPNet block keeps (None: all)."""
        attention = _get(block, self._arch_of_block(block).attention)
        return getattr(attention, "kept_heads", None)

    def prune_block(self, block: nn.Module, heads: torch.Tensor) -> nn.Module:
        arch = self._arch_of_block(block)
        attention = _get(block, arch.attention)
        n = int(getattr(attention, arch.heads_attr))
        dk = _get(block, arch.query).out_features // n
        rows = (heads[:, None] * dk + torch.arange(dk)).flatten()
        out = _slice_linear(self.output_projection(block), cols=rows)
        if len(heads) == 0:
            outputs = 1 if type(block).__name__ == "MPNetLayer" else 2
            new_attention = NoHeads(out if arch.out_in_attention else None, dk, outputs)
        else:
            new_attention = shallow_copy(attention)
            for path in (arch.query, arch.key, arch.value):
                name = path.rpartition(".")[2]
                setattr(new_attention, name, _slice_linear(_get(block, path), rows=rows))
            setattr(new_attention, arch.heads_attr, len(heads))
            if arch.width_attr:
                setattr(new_attention, arch.width_attr, len(heads) * dk)
            if type(block).__name__ == "MPNetLayer":
                previous = self._kept_heads(block)
                kept = heads if previous is None else previous[heads]
                new_attention.__class__ = _pruned_mpnet_attention()
                new_attention.register_buffer("kept_heads", kept.clone(), persistent=False)
            if arch.out_in_attention:
                setattr(new_attention, arch.out.rpartition(".")[2], out)
        new_block = shallow_copy(block)
        _replace(new_block, block, arch.attention, new_attention)
        if not arch.out_in_attention:
            _replace(new_block, block, arch.out, out)  # BERT: W_O is in attention.output
        return new_block

    def callable_model(self, model: nn.Module) -> nn.Module:
        return model if isinstance(model, TextClassifier) else TextClassifier(model)

    def classifier_layer(self, model: nn.Module) -> nn.Linear:
        """The classifier's output layer (BERT, DistilBERT: ``classifier``; RoBERTa, MPNet:
        ``classifier.out_proj``): it reads the class token after the dense layer before it."""
        return _classifier_layers(hf_model(model), self.arch(model).backbone)[2]

    def check_inputs(self, x: object, name: str) -> torch.Tensor:
        """Packed inputs (B, 2, T); also token ids (B, T) alone, an ``(ids, mask)`` pair or a
        mapping with ``input_ids`` (and ``attention_mask``), as a tokenizer returns them."""
        if isinstance(x, dict) or hasattr(x, "keys"):
            if "input_ids" not in x:
                raise TypeError(f"{name} is a mapping without input_ids")
            x = pack(x["input_ids"], x.get("attention_mask"))
        elif isinstance(x, (tuple, list)) and len(x) == 2:
            x = pack(*x)
        if not isinstance(x, torch.Tensor) or x.is_floating_point() or x.dtype == torch.bool:
            raise TypeError(
                f"{name} must be token ids: packed (B, 2, T) ids and attention masks, (B, T) ids, "
                f"an (ids, mask) pair or a tokenizer's output, got "
                f"{type(x).__name__ if not isinstance(x, torch.Tensor) else x.dtype}"
            )
        if x.ndim == 2:
            x = pack(x)
        unpack(x)  # checks the shape
        return x.long()

    def match_inputs(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        length = max(x.shape[-1] for x in inputs)
        out = []
        for x in inputs:
            pad = length - x.shape[-1]
            if pad:
                ids, mask = x[:, 0], x[:, 1]
                fill = ids.new_full((len(x), pad), 0)
                x = pack(torch.cat([ids, fill], 1), torch.cat([mask, fill], 1))
            out.append(x)
        return out

    def set_block(self, model: nn.Module, layer: int, block: nn.Module) -> None:
        self.blocks(model)[layer] = block

    def qkv_weights(self, block: nn.Module) -> list[nn.Parameter]:
        arch = self._arch_of_block(block)
        return [_get(block, p).weight for p in (arch.query, arch.key, arch.value)]

    def parameter_kind(self, model: nn.Module, name: str) -> str:
        """The backbone's ``embeddings`` (token, position, type embeddings, their LayerNorm) are
        "embed"; in a block, the attention (Q, K, V, W_O; MPNet's shared position bias too) is
        "attn", the MLP "mlp", its two LayerNorms "norm"; the rest (BERT's pooler, the
        classifier and the dense layer before it) "head"."""
        arch = self.arch(model)
        local = name.removeprefix("hf.") if isinstance(model, TextClassifier) else name
        layers = f"{arch.backbone}.{arch.layers}."
        if local.startswith(f"{arch.backbone}.embeddings."):
            return "embed"
        if local.startswith(layers):
            inside = local[len(layers) :].partition(".")[2]  # past the layer number
            for kind, paths in (
                ("norm", (arch.norm1, arch.norm2)),
                ("attn", (arch.attention, arch.out)),
                ("mlp", (arch.fc1, arch.fc2)),
            ):
                if any(inside.startswith(f"{path}.") for path in paths):
                    return kind
        elif local == f"{arch.backbone}.encoder.relative_attention_bias.weight":
            return "attn"  # MPNet: one position bias per head, shared by every layer
        elif not local.startswith(f"{arch.backbone}.") or local.startswith(
            f"{arch.backbone}.pooler."
        ):
            return "head"
        raise ValueError(
            f"parameter {name!r} is in none of the groups {', '.join(PARAMETER_KINDS)}; "
            f"Hydra Lab does not know this part of {type(hf_model(model)).__name__}"
        )

    def cost_sizes(self, model: nn.Module, inputs: torch.Tensor | None = None) -> CostSizes:
        """Tokens: the length of ``inputs`` once padding columns no sample uses are dropped (as
        every forward drops them), :data:`MAX_TOKENS` without inputs. The embedding is a table
        lookup: no multiply-adds."""
        arch = self.arch(model)
        hf = hf_model(model)
        block = self.blocks(model)[0]
        dense, _, _ = _classifier_layers(hf, arch.backbone)
        return CostSizes(
            num_tokens=MAX_TOKENS if inputs is None else unpack(inputs)[0].shape[1],
            mlp_hidden=int(_get(block, arch.fc1).out_features),
            num_classes=int(hf.config.num_labels),
            token_pool=True,
            pre_classifier=int(dense.out_features),
        )

    # --- piece by piece ------------------------------------------------------------------------

    def prepare(self, model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        return pack(*unpack(inputs))

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> tuple[torch.Tensor, Context]:
        arch = self.arch(model)
        backbone = getattr(hf_model(model), arch.backbone)
        unpack(inputs)  # checks the shape; the length stays (``prepare`` trims a whole set)
        ids, mask = inputs[:, 0], inputs[:, 1]
        x = backbone.embeddings(input_ids=ids)
        position_bias = None
        if arch.backbone == "mpnet":
            position_bias = backbone.encoder.compute_position_bias(x[:1])  # (1, H, N, N)
        return x, TextContext(mask=mask.bool(), position_bias=position_bias)

    def block_forward(self, block: nn.Module, x: torch.Tensor, context: Context) -> torch.Tensor:
        bias = context.scores_bias(x.dtype)
        if type(block).__name__ == "MPNetLayer":
            position_bias = context.position_bias.expand(len(x), -1, -1, -1)
            out = block(x, bias, position_bias=position_bias)
        else:
            out = block(x, attention_mask=bias)
        return out[0] if isinstance(out, tuple) else out

    def block_heads(
        self, block: nn.Module, x: torch.Tensor, context: Context, queries: slice | None = None
    ) -> torch.Tensor:
        arch = self._arch_of_block(block)
        b, n, _ = x.shape
        dk = self.layout_head_dim(block)
        if isinstance(_get(block, arch.attention), NoHeads):
            nq = n if queries is None else len(range(n)[queries])
            return x.new_zeros(b, nq, 0, dk)
        q, bias = self._queries(block, x, context, queries)
        key, value = _get(block, arch.key), _get(block, arch.value)
        if q.shape[2] == 1:
            return self._one_query(q[:, :, 0], x, key, value, bias, dk)
        h = q.shape[1]
        k = key(x).reshape(b, n, h, dk).transpose(1, 2)
        v = value(x).reshape(b, n, h, dk).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) + bias  # (B, H, Nq, N)
        return (scores.softmax(-1) @ v).transpose(1, 2)  # (B, Nq, H, d_k)

    def _queries(
        self, block: nn.Module, x: torch.Tensor, context: Context, queries: slice | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The scaled queries (B, H, Nq, d_k) of a block with heads, and what its attention adds
        to the scores: the padding bias (B, 1, 1, N), plus MPNet's position bias of the block's
        heads (then (B, H, Nq, N))."""
        arch = self._arch_of_block(block)
        b = x.shape[0]
        dk = self.layout_head_dim(block)
        query = _get(block, arch.query)
        h = query.out_features // dk
        xq = x if queries is None else x[:, queries]
        q = query(xq).reshape(b, -1, h, dk).transpose(1, 2) * dk**-0.5  # (B, H, Nq, d_k)
        bias = context.scores_bias(x.dtype)  # (B, 1, 1, N)
        if context.position_bias is not None:
            position = context.position_bias
            kept = self._kept_heads(block)
            if kept is not None:
                position = position.index_select(1, kept.to(position.device))
            bias = bias + (position if queries is None else position[:, :, queries])
        return q, bias

    def block_attention(self, block: nn.Module, x: torch.Tensor, context: Context) -> torch.Tensor:
        """In Hugging Face's order: (q k^T) * d_k^-0.5 (MPNet: / sqrt(d_k), then + its position
        bias), + the padding bias, softmax; so the numbers equal its eager attention's."""
        arch = self._arch_of_block(block)
        b, n, _ = x.shape
        if isinstance(_get(block, arch.attention), NoHeads):
            return x.new_zeros(b, 0, n, n)
        dk = self.layout_head_dim(block)
        q, k = (_get(block, path)(x).reshape(b, n, -1, dk) for path in (arch.query, arch.key))
        scores = q.transpose(1, 2) @ k.permute(0, 2, 3, 1)  # (B, H, N, N)
        if context.position_bias is None:
            scores = scores * dk**-0.5
        else:  # MPNet
            position = context.position_bias
            kept = self._kept_heads(block)
            if kept is not None:
                position = position.index_select(1, kept.to(position.device))
            scores = scores / math.sqrt(dk) + position
        return (scores + context.scores_bias(x.dtype)).softmax(-1)

    @contextmanager
    def explicit_attention(self, model: nn.Module) -> Iterator[None]:
        """Hugging Face's "eager" attention implementation."""
        hf = hf_model(model)
        previous = hf.config._attn_implementation
        try:
            hf.set_attn_implementation("eager")
            yield
        finally:
            hf.set_attn_implementation(previous)

    def real_tokens(self, context: Context) -> torch.Tensor | None:
        return context.mask

    @staticmethod
    def _one_query(
        q: torch.Tensor,
        x: torch.Tensor,
        key: nn.Linear,
        value: nn.Linear,
        bias: torch.Tensor,
        dk: int,
    ) -> torch.Tensor:
        """Attention of one query row (B, H, d_k) with W_K and W_V folded onto the query side:
        scores q_h W_K,h x_k (W_K's bias adds the same to every score, which softmax ignores)
        and output W_V,h (sum_k a_hk x_k) + b_V,h, since the weights a_hk sum to one. The keys
        and values of the N tokens are never formed. Returns (B, 1, H, d_k)."""
        b, h, _ = q.shape
        w_k = key.weight.reshape(h, dk, -1)  # (H, d_k, d)
        w_v = value.weight.reshape(h, dk, -1)
        folded = torch.bmm(q.transpose(0, 1), w_k).transpose(0, 1)  # (B, H, d)
        scores = torch.bmm(folded, x.transpose(1, 2)) + bias[:, :, 0]  # (B, H, N)
        mixed = torch.bmm(scores.softmax(-1), x)  # (B, H, d)
        z = torch.bmm(mixed.transpose(0, 1), w_v.transpose(1, 2)).transpose(0, 1)  # (B, H, d_k)
        if value.bias is not None:
            z = z + value.bias.reshape(h, dk)
        return z[:, None]

    def layout_head_dim(self, block: nn.Module) -> int:
        arch = self._arch_of_block(block)
        attention = _get(block, arch.attention)
        if isinstance(attention, NoHeads):
            return attention.head_dim
        return _get(block, arch.query).out_features // int(getattr(attention, arch.heads_attr))

    def block_rest(self, block: nn.Module, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        arch = self._arch_of_block(block)
        h = _get(block, arch.norm1)(attn_out + x)
        hidden = _get(block, arch.act)(_get(block, arch.fc1)(h))
        return _get(block, arch.norm2)(_get(block, arch.fc2)(hidden) + h)

    def classify(self, model: nn.Module, x: torch.Tensor, context: Context) -> torch.Tensor:
        hf = hf_model(model)
        arch = self.arch(model)
        if arch.backbone == "bert":
            return hf.classifier(hf.dropout(hf.bert.pooler(x)))
        if arch.backbone == "distilbert":
            cls = torch.relu(hf.pre_classifier(x[:, 0]))
            return hf.classifier(hf.dropout(cls))
        return hf.classifier(x)  # RoBERTa, MPNet: their heads read token 0

    def class_token_pooling(self, model: nn.Module) -> bool:
        return True

    def post_norm_parts(self, block: nn.Module) -> PostNormParts | None:
        arch = self._arch_of_block(block)
        return PostNormParts(
            *(_get(block, p) for p in (arch.norm1, arch.fc1, arch.act, arch.fc2, arch.norm2))
        )

    def fusion_parts(self, model: nn.Module, where: str = "this model") -> FusionParts:
        """Post-norm :class:`~hydra_core.models.parts.FusionParts`: the word, position and token
        type 0 embeddings and their LayerNorm; per block Q, K, V, W_O, the two LayerNorms and the
        MLP (by the paths of :class:`_Arch`); MPNet's relative position bias, one table (buckets
        x original heads) shared by all layers, as each block's columns of its heads (a pruned
        MPNet block maps its heads back through ``kept_heads``); the classifier on the class
        token (BERT's pooler, RoBERTa's and MPNet's classification head, DistilBERT's
        pre-classifier)."""
        arch = self.arch(model)
        try:
            layout = self.layout(model)
        except UnsupportedModelError as error:
            raise _fusion_refusal(where, str(error)) from None
        hf = hf_model(model)
        backbone = getattr(hf, arch.backbone)
        table = None
        if arch.backbone == "mpnet":
            table = backbone.encoder.relative_attention_bias.weight.detach()  # (buckets, heads)
            if table.shape[0] < POSITION_BUCKETS:
                raise _fusion_refusal(
                    where,
                    f"its relative position bias has {table.shape[0]} buckets, fewer than the "
                    f"{POSITION_BUCKETS} MPNet uses",
                )
        blocks = []
        for n, block in zip(layout.num_heads, self.blocks(model), strict=True):
            kept = self._kept_heads(block)  # a pruned MPNet block's original heads
            heads = torch.arange(n) if kept is None else kept
            qkv = None  # a block that keeps no head has no Q/K/V
            if n:
                qkv = [LinearParts.of(_get(block, p)) for p in (arch.query, arch.key, arch.value)]
            blocks.append(
                block_parts(
                    where,
                    num_heads=n,
                    qkv=qkv,
                    out=self.output_projection(block),
                    norms=(_get(block, arch.norm1), _get(block, arch.norm2)),
                    mlp=tuple(_get(block, p) for p in (arch.fc1, arch.act, arch.fc2)),
                    position_bias=None if table is None else table[:POSITION_BUCKETS, heads],
                )
            )
        embeddings = backbone.embeddings
        token_type = getattr(embeddings, "token_type_embeddings", None)
        padding = arch.backbone in ("roberta", "mpnet")  # positions count the real tokens
        pooler, pooler_act, classifier = _classifier_layers(hf, arch.backbone)
        stem = TokenStem(
            word=embeddings.word_embeddings.weight.detach(),  # (vocab, d)
            position=embeddings.position_embeddings.weight.detach(),  # (positions, d)
            token_type=None if token_type is None else token_type.weight.detach()[0],  # (d,)
            padding_idx=int(embeddings.padding_idx) if padding else None,
            norm=norm_parts(embeddings.LayerNorm, where, required=True),
        )
        return FusionParts(
            kind="post-norm",
            arch=arch.backbone,
            embed_dim=layout.embed_dim,
            head_dim=layout.head_dim,
            stem=stem,
            blocks=tuple(blocks),
            head=LinearParts.of(classifier),
            pooler=LinearParts.of(pooler),
            pooler_act=pooler_act,
        )

    def sample_lengths(self, inputs: torch.Tensor) -> torch.Tensor | None:
        mask = inputs[:, 1].bool()
        last = mask.shape[1] - 1 - mask.flip(1).int().argmax(1)  # the last unmasked position
        return torch.where(mask.any(1), last + 1, 1)

    def trim(self, x: torch.Tensor, context: Context) -> tuple[torch.Tensor, Context]:
        used = context.mask.any(0).nonzero()
        n = int(used.max()) + 1 if len(used) else 1
        if n == x.shape[1]:
            return x, context
        bias = context.position_bias
        return x[:, :n], TextContext(
            context.mask[:, :n], None if bias is None else bias[..., :n, :n]
        )

    def select_context(self, context: Context, index) -> Context:
        return TextContext(context.mask[index], context.position_bias)

    def repeat_context(self, context: Context, times: int) -> Context:
        return TextContext(context.mask.repeat(times, 1), context.position_bias)

    def concat_contexts(self, contexts: Sequence[Context]) -> Context:
        return TextContext(torch.cat([c.mask for c in contexts]), contexts[0].position_bias)


TEXT = TextFamily()
