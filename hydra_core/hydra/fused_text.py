"""Hydra fusion for text encoders: M head-pruned BERT, RoBERTa, MPNet or DistilBERT classifiers run
as one model, in one pass (the text counterpart of :mod:`hydra_core.hydra.fused`).

The members' token streams are stacked along a leading member axis, ``(S, B, N, d)``. The blocks
are post-LN (``h = LN1(x + W_O(attn(x)))``, then ``LN2(h + fc2(act(fc1(h))))``); each fused block
applies a grouped Q/K/V projection (member m meets only its own stream and its own kept heads),
runs the attention of all members' heads in one ``scaled_dot_product_attention`` call, projects
back with a grouped W_O, normalises per member, and applies one MLP - the members' MLPs averaged -
to every stream at once. Heads are padded with zeros to the largest count of their layer, as for
ViTs: a padded head adds exactly nothing.

- **Attention mask.** Padding columns that no sample uses are dropped first (as
  :class:`~hydra_core.models.text.TextClassifier` does); the remaining padding keys get the dtype's
  most negative score in every member's heads, so padding never changes a result.
- **MPNet's relative position bias.** One table (buckets x heads) shared by all layers of a
  model; each fused layer keeps, per member, the table's columns of that member's kept heads (a
  pruned MPNet maps its heads back to the original ones through ``kept_heads``), zero-padded like
  the heads, and adds them to that member's scores.
- **Sharing.** Anything identical across members is stored once (``S = 1``): the embeddings (as a
  whole), a layer's Q/K/V, W_O, norms and position bias, the classifier. While the embeddings and
  the leading layers are shared, the stream keeps ``S = 1`` and is computed once.
- **Classifier.** Per member (or shared): the dense layer on the class token (BERT's pooler,
  RoBERTa/MPNet's classification head, DistilBERT's pre-classifier), tanh or ReLU, then the output
  layer. It reads only the class token, so the last block computes only that row.

The model's parts are read through :func:`hydra_core.models.text_parts.text_parts`; nothing here
names a Hugging Face attribute. ``fuse_text_members`` builds a :class:`HydraText`, and
:func:`hydra_core.hydra.fused.fuse_members` calls it for text models; ``save_hydra`` /
``load_hydra`` store it with its :class:`HydraTextConfig` (format ``hydra-fused-text``).
The fused model is for inference: dropout is not kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

import torch
from torch import nn

from hydra_core.hydra.layers import (
    ACTIVATIONS,
    FusedBlock,
    GroupedLinear,
    MergedMlp,
    StackedLayerNorm,
    merged_mlp_tensors,
    stack_members,
)
from hydra_core.models.adapter import UnsupportedModelError, as_keep_mask, head_layout
from hydra_core.models.text import pack, unpack
from hydra_core.models.text_parts import (
    MPNET_BUCKETS,
    TextParts,
    relative_position_buckets,
    text_parts,
)

FORMAT = "hydra-fused-text"
FORMAT_VERSION = 1
#: the activation between the classifier's dense layer and its output layer
POOLER_ACTS = {"tanh": torch.tanh, "relu": torch.relu}


@dataclass(frozen=True)
class HydraTextConfig:
    """What a :class:`HydraText` is beyond its tensors: its architecture and each member's heads.

    :func:`~hydra_core.hydra.fused.save_hydra` writes it as JSON into the safetensors header
    (``to_json``, with the file format and version first); ``load_hydra`` reads it back.
    """

    num_members: int  # M, the members fused into one model
    kind: str  # the source architecture: "bert", "roberta", "mpnet" or "distilbert"
    embed_dim: int  # d, the token width
    depth: int  # transformer blocks
    head_dim: int  # d_k, the width of one attention head
    num_classes: int  # C, the classifier's outputs
    vocab_size: int  # rows of the word embedding
    max_positions: int  # rows of the position embedding
    padding_idx: int | None  # RoBERTa/MPNet: positions count real tokens from here; None: 0, 1, ...
    token_type: bool  # token type 0's embedding is added to every token (BERT, RoBERTa)
    position_buckets: int  # MPNet: relative position buckets of the attention bias; 0: none
    mlp_act: str  # the MLP activation, a key of layers.ACTIVATIONS
    pooler_act: str  # the classifier's activation, a key of POOLER_ACTS
    norm_eps: float  # epsilon of every LayerNorm
    # kept_heads[m][l]: the heads member m keeps in layer l, in that member's own numbering
    kept_heads: tuple[tuple[tuple[int, ...], ...], ...]

    def to_json(self) -> dict:
        """The header entry: file format and version, then every field (tuples become lists)."""
        return {"format": FORMAT, "version": FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, header: dict) -> HydraTextConfig:
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
        values["kept_heads"] = tuple(
            tuple(tuple(layer) for layer in member) for member in values["kept_heads"]
        )
        return cls(**values)


class TextEmbeddings(nn.Module):
    """Word, token-type-0 and position embeddings, then LayerNorm; shared (S = 1) or per member.

    Args:
        word: (S, vocab, d); position: (S, max_positions, d); token_type: (S, d) or None.
        norm: the embeddings' LayerNorm.
        padding_idx: None for positions 0, 1, ... (BERT, DistilBERT); else positions count the
            non-padding tokens from ``padding_idx + 1``, padding at ``padding_idx`` (RoBERTa,
            MPNet).
    """

    def __init__(
        self,
        *,
        word: torch.Tensor,
        position: torch.Tensor,
        token_type: torch.Tensor | None,
        norm: StackedLayerNorm,
        padding_idx: int | None,
    ) -> None:
        super().__init__()
        self.word = nn.Parameter(word)
        self.position = nn.Parameter(position)
        self.token_type = None if token_type is None else nn.Parameter(token_type)
        self.norm = norm
        self.padding_idx = padding_idx

    @property
    def groups(self) -> int:
        """S: 1 when the members share the embeddings, M otherwise."""
        return self.word.shape[0]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids (B, N) -> the stream entering block 0, (S, B, N, d)."""
        n = ids.shape[1]
        if self.padding_idx is None:
            positions = torch.arange(n, device=ids.device)[None]  # (1, N)
        else:
            real = ids.ne(self.padding_idx).long()
            positions = real.cumsum(1) * real + self.padding_idx  # (B, N)
        if int(positions.max()) >= self.position.shape[1]:
            raise ValueError(
                f"a sequence of {n} tokens needs more than the model's "
                f"{self.position.shape[1]} positions; cut the inputs to fewer tokens"
            )
        x = self.word[:, ids]  # (S, B, N, d)
        if self.token_type is not None:
            x = x + self.token_type[:, None, None]
        x = x + self.position[:, positions]  # position (S, 1 or B, N, d)
        return self.norm(x)


class FusedTextBlock(FusedBlock):
    """A post-norm fused block whose attention takes the padding mask and, for MPNet, each member's
    relative position bias.

    Args:
        position_bias: (S, buckets, H_max), column h the bias of the member's h-th kept head (zero
            for padded heads), or None.
        **block: the arguments of :class:`FusedBlock` but ``ls2`` and ``post_norm``.
    """

    def __init__(self, *, position_bias: torch.Tensor | None, **block) -> None:
        super().__init__(ls2=None, post_norm=True, **block)
        self.position_bias = None if position_bias is None else nn.Parameter(position_bias)

    @property
    def is_shared(self) -> bool:
        bias = self.position_bias
        return super().is_shared and (bias is None or bias.shape[0] == 1)

    def forward(
        self,
        x: torch.Tensor,
        padding: torch.Tensor,
        buckets: torch.Tensor | None = None,
        cls_only: bool = False,
    ) -> torch.Tensor:
        """x (S_x, B, N, d), padding (1, B, 1, 1, N) added to the scores, buckets (N, N) of the
        relative positions -> (S, B, N', d); N' = 1 when ``cls_only``."""
        bias = padding
        if self.position_bias is not None:
            rows = buckets[:1] if cls_only else buckets  # (N_q, N)
            position = self.position_bias[:, rows].permute(0, 3, 1, 2)  # (S, H, N_q, N)
            bias = position[:, None] + padding  # (S, B, H, N_q, N)
        return super().forward(x, cls_only, bias)


class HydraText(nn.Module):
    """M head-pruned text classifiers fused into one model; (B, M, C) member logits.

    ``forward(inputs)`` with packed inputs (B, 2, T) (token ids and attention masks, see
    :func:`~hydra_core.models.text.pack`), or ``forward(input_ids=..., attention_mask=...)``.

    Attributes:
        num_members: M.
        num_shared_layers: leading blocks identical for all members (same heads, same weights,
            after shared embeddings): they run once on (B, N, d) instead of M times.
        kept_heads: per member, per layer, the kept heads in that member's own numbering.
        config: the description that ``save_hydra`` writes to the file header.
    """

    def __init__(
        self,
        config: HydraTextConfig,
        embeddings: TextEmbeddings,
        blocks: Sequence[FusedTextBlock],
        pooler: GroupedLinear,
        classifier: GroupedLinear,
    ) -> None:
        super().__init__()
        self.config = config
        self.num_members = config.num_members
        self.kept_heads = config.kept_heads
        self.embeddings = embeddings
        self.blocks = nn.ModuleList(blocks)
        self.pooler, self.classifier = pooler, classifier
        shared = 0
        if embeddings.groups == 1:
            while shared < len(self.blocks) and self.blocks[shared].is_shared:
                shared += 1
        self.num_shared_layers = shared

    def forward(
        self,
        inputs: torch.Tensor | None = None,
        *,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if inputs is None:
            if input_ids is None:
                raise ValueError("pass packed inputs (B, 2, T) or input_ids (and attention_mask)")
            inputs = pack(input_ids, attention_mask)
        ids, mask = unpack(inputs)  # padding columns no sample uses dropped
        x = self.embeddings(ids)  # (S, B, N, d); S = 1 while every member has the same stream
        padding = torch.zeros(mask.shape, dtype=x.dtype, device=x.device)
        padding.masked_fill_(~mask.bool(), torch.finfo(x.dtype).min)
        padding = padding[None, :, None, None]  # (1, B, 1, 1, N)
        buckets = None
        if self.config.position_buckets:
            n = ids.shape[1]
            buckets = relative_position_buckets(n, x.device, self.config.position_buckets)
        last = len(self.blocks) - 1
        for layer, block in enumerate(self.blocks):
            # the classifier reads only the class token: the last block needs only its row
            x = block(x, padding, buckets, cls_only=layer == last)
        pooled = POOLER_ACTS[self.config.pooler_act](self.pooler(x[:, :, 0]))  # (S, B, d)
        logits = self.classifier(pooled).expand(self.num_members, -1, -1)  # (M, B, C)
        return logits.transpose(0, 1).contiguous()  # (B, M, C)

    def member_head_counts(self) -> list[list[int]]:
        """Kept heads per member per layer, as counts."""
        return [[len(h) for h in member] for member in self.kept_heads]


# -------------------------------------------------------------------------------------------------
# Fusing members.


def fuse_text_members(members: Sequence[tuple[nn.Module, torch.Tensor]]) -> HydraText:
    """Fuse M (model, keep) pairs of text classifiers into one :class:`HydraText`.

    Each model is a Hugging Face BERT, RoBERTa, MPNet or DistilBERT sequence classifier (bare or in
    a TextClassifier) - the same object M times for zero-shot members, or separately fine-tuned,
    possibly already structurally pruned models; ``keep`` is a head mask validated against that
    model's own layout (True = kept). Members must agree on the architecture (kind, widths, depth,
    classes, vocabulary, ...). MLPs are averaged over members; when they are all identical, member
    0's weights are taken as they are, so zero-shot fusion reproduces every member's logits.
    (:func:`hydra_core.hydra.fused.fuse_members` calls this for text models.)
    """
    members = list(members)
    if not members:
        raise ValueError("cannot fuse an empty list of members")
    parts, heads = [], []
    for index, (model, keep) in enumerate(members):
        try:
            layout = head_layout(model)
            keep = as_keep_mask(layout, keep)
        except (ValueError, TypeError) as error:
            raise type(error)(f"member {index}: {error}") from None
        parts.append(text_parts(model))
        heads.append(
            [keep[layer, :n].nonzero().flatten() for layer, n in enumerate(layout.num_heads)]
        )
    specs = [_architecture(i, p) for i, p in enumerate(parts)]
    for key in specs[0]:
        values = [spec[key] for spec in specs]
        if any(v != values[0] for v in values):
            listing = ", ".join(f"member {i} has {v!r}" for i, v in enumerate(values))
            raise ValueError(f"members disagree on {key}: {listing}")
    spec = specs[0]
    config = HydraTextConfig(
        num_members=len(parts),
        **{k: v for k, v in spec.items() if k != "mlp_hidden"},
        kept_heads=tuple(tuple(tuple(h.tolist()) for h in member) for member in heads),
    )
    tensors = _embedding_tensors(parts)
    for layer in range(config.depth):
        layer_heads = [h[layer] for h in heads]
        tensors.update(_block_tensors(layer, parts, layer_heads, config))
    pooler_w, pooler_b, out_w, out_b = stack_members(
        [
            (p.pooler[0].t(), _bias(p.pooler), p.classifier[0].t(), _bias(p.classifier))
            for p in parts
        ]
    )
    tensors["pooler.weight"], tensors["pooler.bias"] = pooler_w, pooler_b[:, None]  # (S, d, d)
    tensors["classifier.weight"], tensors["classifier.bias"] = out_w, out_b[:, None]  # (S, d, C)
    return assemble_text(config, tensors)


def check_text_fusable(model: nn.Module) -> None:
    """Raise :class:`UnsupportedModelError` saying why members of this text model cannot be
    fused."""
    _architecture(None, text_parts(model))


def _architecture(index: int | None, parts: TextParts) -> dict:
    """What members must agree on; refuses what the fused model cannot compute."""
    where = "this model" if index is None else f"member {index}"
    blocks = parts.blocks
    acts = {_activation_name(where, b.act) for b in blocks}
    hidden = {b.fc1[0].shape[0] for b in blocks}
    norms = [parts.embedding_norm] + [n for b in blocks for n in (b.norm1, b.norm2)]
    eps = {n[2] for n in norms}
    for name, values in (("MLP activations", acts), ("MLP widths", hidden), ("LayerNorm eps", eps)):
        if len(values) > 1:
            raise UnsupportedModelError(
                f"{where} cannot be fused: its layers differ in {name} ({sorted(values)})"
            )
    buckets = 0
    if parts.relative_attention_bias is not None:
        buckets = MPNET_BUCKETS
        if parts.relative_attention_bias.shape[0] < buckets:
            raise UnsupportedModelError(
                f"{where} cannot be fused: its relative position bias has "
                f"{parts.relative_attention_bias.shape[0]} buckets, fewer than the {buckets} "
                "MPNet uses"
            )
    return {
        "kind": parts.kind,
        "embed_dim": parts.word_embeddings.shape[1],
        "depth": len(blocks),
        "head_dim": parts.head_dim,
        "num_classes": parts.classifier[0].shape[0],
        "vocab_size": parts.word_embeddings.shape[0],
        "max_positions": parts.position_embeddings.shape[0],
        "padding_idx": parts.padding_idx,
        "token_type": parts.token_type_embedding is not None,
        "position_buckets": buckets,
        "mlp_act": acts.pop(),
        "mlp_hidden": hidden.pop(),
        "pooler_act": parts.pooler_act,
        "norm_eps": eps.pop(),
    }


def _activation_name(where: str, act: nn.Module) -> str:
    """The key of :data:`ACTIVATIONS` that computes what ``act`` computes (checked on a grid)."""
    probe = torch.linspace(-8.0, 8.0, 321)
    with torch.no_grad():
        values = act(probe)
        for name, fn in ACTIVATIONS.items():
            if torch.allclose(values, fn(probe), rtol=0, atol=1e-6):
                return name
    raise UnsupportedModelError(
        f"{where} cannot be fused: its MLP activation {type(act).__name__} is none of "
        f"{', '.join(ACTIVATIONS)}"
    )


def _bias(linear: tuple[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
    """A linear layer's bias; zeros where it has none."""
    weight, bias = linear
    return weight.new_zeros(weight.shape[:1]) if bias is None else bias


def _embedding_tensors(parts: Sequence[TextParts]) -> dict[str, torch.Tensor]:
    """The embeddings, stacked; shared only as a whole."""
    names = ("word", "position", "token_type", "norm.weight", "norm.bias")
    per_member = [
        (
            p.word_embeddings,
            p.position_embeddings,
            p.token_type_embedding,
            *p.embedding_norm[:2],
        )
        for p in parts
    ]
    stacked = zip(names, stack_members(per_member), strict=True)
    return {f"embeddings.{n}": t for n, t in stacked if t is not None}


def _block_tensors(
    layer: int,
    parts: Sequence[TextParts],
    heads: Sequence[torch.Tensor],
    config: HydraTextConfig,
) -> dict[str, torch.Tensor]:
    """One layer's fused weights from each member's block and kept heads."""
    d, dk = config.embed_dim, config.head_dim
    h_max = max(len(h) for h in heads)
    blocks = [p.blocks[layer] for p in parts]
    qkv_bias = any(b.query is not None and b.query[1] is not None for b in blocks)
    proj_bias = any(b.out[1] is not None for b in blocks)
    attn, position, norm1, norm2 = [], [], [], []
    for p, block, kept in zip(parts, blocks, heads, strict=True):
        n, h = block.heads, len(kept)
        # Q/K/V rows of the kept heads, zero-padded to h_max heads
        qkv_w = block.out[0].new_zeros(3, h_max, dk, d)
        qkv_b = block.out[0].new_zeros(3, h_max, dk)
        if h:
            for i, (weight, bias) in enumerate((block.query, block.key, block.value)):
                qkv_w[i, :h] = weight.view(n, dk, d)[kept]
                if bias is not None:
                    qkv_b[i, :h] = bias.view(n, dk)[kept]
        proj_w = block.out[0].new_zeros(d, h_max, dk)  # W_O columns of the kept heads, padded
        proj_w[:, :h] = block.out[0].view(d, n, dk)[:, kept]
        attn.append(
            (
                qkv_w.reshape(3 * h_max * dk, d).t() if h_max else None,  # (d, 3*h_max*d_k)
                qkv_b.reshape(1, -1) if qkv_bias and h_max else None,  # (1, 3*h_max*d_k)
                proj_w.reshape(d, h_max * dk).t(),  # (h_max*d_k, d)
                _bias(block.out)[None] if proj_bias else None,  # (1, d)
            )
        )
        if config.position_buckets and h_max:
            table = p.relative_attention_bias[: config.position_buckets]  # (buckets, heads)
            bias = table.new_zeros(config.position_buckets, h_max)
            bias[:, :h] = table[:, block.bias_heads[kept]]
            position.append((bias,))
        norm1.append(block.norm1[:2])
        norm2.append(block.norm2[:2])
    tensors = dict(
        zip(
            ("qkv.weight", "qkv.bias", "proj.weight", "proj.bias"),
            stack_members(attn),
            strict=True,
        )
    )
    if position:
        (tensors["position_bias"],) = stack_members(position)
    tensors["norm1.weight"], tensors["norm1.bias"] = stack_members(norm1)
    tensors["norm2.weight"], tensors["norm2.bias"] = stack_members(norm2)
    tensors.update(_merged_mlp(blocks))
    return {f"blocks.{layer}.{k}": v for k, v in tensors.items() if v is not None}


def _merged_mlp(blocks: Sequence) -> dict[str, torch.Tensor | None]:
    """The paper's merged MLP: weights and biases averaged over members (member 0's if equal)."""
    try:
        return merged_mlp_tensors([(*b.fc1, *b.fc2) for b in blocks])
    except ValueError as error:
        raise UnsupportedModelError(str(error)) from None


# -------------------------------------------------------------------------------------------------
# One constructor for both routes: fused from members, or read back from a file.


def assemble_text(config: HydraTextConfig, tensors: dict[str, torch.Tensor]) -> HydraText:
    """Build a :class:`HydraText` from its description and its named tensors (a state dict)."""
    unused = set(tensors)

    def take(name: str, required: bool = True) -> torch.Tensor | None:
        if name not in tensors:
            if required:
                raise ValueError(f"the Hydra model lacks the tensor {name!r}")
            return None
        unused.discard(name)
        return tensors[name]

    def norm(prefix: str) -> StackedLayerNorm:
        return StackedLayerNorm(take(f"{prefix}.weight"), take(f"{prefix}.bias"), config.norm_eps)

    embeddings = TextEmbeddings(
        word=take("embeddings.word"),
        position=take("embeddings.position"),
        token_type=take("embeddings.token_type", config.token_type),
        norm=norm("embeddings.norm"),
        padding_idx=config.padding_idx,
    )
    blocks = []
    for layer in range(config.depth):
        p = f"blocks.{layer}."
        qkv_weight, qkv_bias = take(p + "qkv.weight", False), take(p + "qkv.bias", False)
        blocks.append(
            FusedTextBlock(
                head_dim=config.head_dim,
                norm1=norm(p + "norm1"),
                qkv=None if qkv_weight is None else GroupedLinear(qkv_weight, qkv_bias),
                proj=GroupedLinear(take(p + "proj.weight"), take(p + "proj.bias", False)),
                norm2=norm(p + "norm2"),
                mlp=MergedMlp(
                    take(p + "mlp.fc1_weight"),
                    take(p + "mlp.fc1_bias", False),
                    take(p + "mlp.fc2_weight"),
                    take(p + "mlp.fc2_bias", False),
                    config.mlp_act,
                ),
                position_bias=take(
                    p + "position_bias", bool(config.position_buckets) and qkv_weight is not None
                ),
            )
        )
    pooler = GroupedLinear(take("pooler.weight"), take("pooler.bias"))
    classifier = GroupedLinear(take("classifier.weight"), take("classifier.bias"))
    hydra = HydraText(config, embeddings, blocks, pooler, classifier)
    if unused:
        raise ValueError(
            f"the Hydra model has tensors it does not use: {', '.join(sorted(unused))}"
        )
    _check_consistent(hydra)
    return hydra


def _check_consistent(hydra: HydraText) -> None:
    """Shapes agree with the description (catches a file whose header and tensors disagree)."""
    cfg = hydra.config
    m, d, dk, depth = cfg.num_members, cfg.embed_dim, cfg.head_dim, cfg.depth
    if cfg.pooler_act not in POOLER_ACTS:
        raise ValueError(f"unknown classifier activation {cfg.pooler_act!r}")
    if len(hydra.kept_heads) != m or any(len(member) != depth for member in hydra.kept_heads):
        raise ValueError(f"kept_heads must list {depth} layers for each of the {m} members")
    emb = hydra.embeddings
    if emb.groups not in (1, m):
        raise ValueError(f"the embeddings hold {emb.groups} member groups; expected 1 or {m}")
    expected = {
        "word": (cfg.vocab_size, d),
        "position": (cfg.max_positions, d),
        "token_type": (d,),
    }
    for name, shape in expected.items():
        t = getattr(emb, name)
        if t is not None and (t.shape[0] != emb.groups or tuple(t.shape[1:]) != shape):
            raise ValueError(
                f"embeddings.{name} has shape {tuple(t.shape)}; expected (S, *{shape})"
            )
    for name, module in hydra.named_modules():
        if isinstance(module, (StackedLayerNorm, GroupedLinear)) and module.groups not in (1, m):
            raise ValueError(f"{name} holds {module.groups} member groups; expected 1 or {m}")
    for layer, block in enumerate(hydra.blocks):
        needed = max(len(member[layer]) for member in hydra.kept_heads)
        if block.max_heads != needed or block.proj.weight.shape[1:] != (needed * dk, d):
            raise ValueError(
                f"block {layer}: the weights hold {block.max_heads} heads, but the "
                f"members keep up to {needed}"
            )
        bias = block.position_bias
        if bias is not None and (
            bias.shape[0] not in (1, m) or tuple(bias.shape[1:]) != (cfg.position_buckets, needed)
        ):
            raise ValueError(
                f"block {layer}: the position bias has shape {tuple(bias.shape)}; expected "
                f"(S, {cfg.position_buckets}, {needed})"
            )
    if hydra.classifier.weight.shape[1:] != (d, cfg.num_classes):
        raise ValueError(
            f"the classifier has shape {tuple(hydra.classifier.weight.shape)}; expected "
            f"(S, {d}, {cfg.num_classes})"
        )
