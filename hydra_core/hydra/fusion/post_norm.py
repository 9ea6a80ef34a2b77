"""The fused model of post-norm members on token embeddings: :class:`HydraText` (BERT, RoBERTa,
MPNet, DistilBERT classifiers; file format ``hydra-fused-text``).

The blocks are post-LN (``h = LN1(x + W_O(attn(x)))``, then ``LN2(h + fc2(act(fc1(h))))``); each
fused block applies a grouped Q/K/V projection (member m meets only its own stream and its own
kept heads), runs the attention of all members' heads in one ``scaled_dot_product_attention``
call, projects back with a grouped W_O, normalises per member, and applies one MLP - the members'
MLPs averaged - to every stream at once.

- **Attention mask.** Padding columns that no sample uses are dropped first (as
  :class:`~hydra_core.models.text.TextClassifier` does); the remaining padding keys get the dtype's
  most negative score in every member's heads, so padding never changes a result.
- **Relative position bias** (MPNet's). Each fused layer keeps, per member, the bias columns of
  that member's kept heads, zero-padded like the heads, and adds them to that member's scores
  through :func:`~hydra_core.models.parts.relative_position_buckets`.
- **Sharing.** Anything identical across members is stored once (``S = 1``): the embeddings (as a
  whole), a layer's Q/K/V, W_O, norms and position bias, the classifier. While the embeddings and
  the leading layers are shared, the stream keeps ``S = 1`` and is computed once.
- **Classifier.** Per member (or shared): the dense layer on the class token (BERT's pooler,
  RoBERTa/MPNet's classification head, DistilBERT's pre-classifier), tanh or ReLU, then the output
  layer. It reads only the class token, so the last block computes only that row.

:func:`architecture` says what members must agree on (:class:`HydraTextConfig`'s fields);
:func:`fuse` builds the model from the members' parts, and :func:`assemble_text` from a config
and named tensors, the one constructor for both routes: fused from members, or read back from a
file. The fused model is for inference: dropout is not kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from hydra_core.hydra.fusion.assembly import NamedTensors, check_heads
from hydra_core.hydra.fusion.config import HeaderConfig, member_config, shared_settings
from hydra_core.hydra.fusion.tensors import blocks_tensors, linear_tensors, token_stem_tensors
from hydra_core.hydra.layers import FusedBlock, GroupedLinear, StackedLayerNorm
from hydra_core.models.family import UnsupportedModelError
from hydra_core.models.parts import FusionParts, TokenStem, relative_position_buckets
from hydra_core.models.text import forward_inputs

FORMAT = "hydra-fused-text"
FORMAT_VERSION = 1
#: the activation between the classifier's dense layer and its output layer
POOLER_ACTS = {"tanh": torch.tanh, "relu": torch.relu}


@dataclass(frozen=True)
class HydraTextConfig(HeaderConfig):
    """What a :class:`HydraText` is beyond its tensors: its architecture and each member's heads.

    ``save_hydra`` writes it as JSON into the safetensors header (``to_json``, with the file
    format and version first); ``load_hydra`` reads it back (``from_json``). The fields and their
    order are the header's.
    """

    header_format: ClassVar[tuple[str, int]] = (FORMAT, FORMAT_VERSION)

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
        # padding columns no sample uses dropped
        ids, mask = forward_inputs(inputs, input_ids, attention_mask)
        return self.logits_from_tokens(ids, mask)

    def logits_from_tokens(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Token ids and attention mask (B, T) -> (B, M, C), every column computed: what
        :meth:`forward` runs after dropping the padding columns no sample uses (the ONNX graph
        runs this, whose shapes may not depend on the mask's values)."""
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


def architecture(parts: FusionParts, where: str) -> dict:
    """What members must agree on: :class:`HydraTextConfig`'s fields, then ``mlp_hidden``, only
    checked; refuses what :class:`HydraText` cannot compute."""
    stem = parts.stem

    def refuse(what: str) -> UnsupportedModelError:
        return UnsupportedModelError(f"{where} cannot be fused: {what}")

    if not isinstance(stem, TokenStem):
        raise refuse(f"post-norm blocks need token embeddings, not a {type(stem).__name__}")
    if parts.pooler is None or parts.pooler_act not in POOLER_ACTS:
        raise refuse(f"the classifier needs a pooler with one of {', '.join(POOLER_ACTS)}")
    if any(b.ls1 is not None or b.ls2 is not None for b in parts.blocks):
        raise refuse("post-norm blocks with layer scales are not supported")
    buckets = {0 if b.position_bias is None else b.position_bias.shape[0] for b in parts.blocks}
    if len(buckets) > 1:
        raise refuse(f"its layers differ in relative position buckets ({sorted(buckets)})")
    act, hidden, eps = shared_settings(parts, where)
    return {
        "kind": parts.arch,
        "embed_dim": parts.embed_dim,
        "depth": len(parts.blocks),
        "head_dim": parts.head_dim,
        "num_classes": int(parts.head.weight.shape[0]),
        "vocab_size": int(stem.word.shape[0]),
        "max_positions": int(stem.position.shape[0]),
        "padding_idx": stem.padding_idx,
        "token_type": stem.token_type is not None,
        "position_buckets": int(buckets.pop()),
        "mlp_act": act,
        "mlp_hidden": hidden,
        "pooler_act": parts.pooler_act,
        "norm_eps": eps,
    }


def fuse(
    spec: dict, parts: Sequence[FusionParts], heads: Sequence[Sequence[torch.Tensor]]
) -> HydraText:
    """The :class:`HydraText` of M members: their agreed :func:`architecture`, their parts and,
    per member and layer, the indices of their kept heads."""
    tensors = token_stem_tensors([p.stem for p in parts])
    tensors.update(blocks_tensors(parts, heads, spec["head_dim"]))
    classifiers = [(p.pooler, p.head) for p in parts]  # (S, d, d) and (S, d, C)
    tensors.update(linear_tensors(("pooler", "classifier"), classifiers))
    return assemble_text(member_config(HydraTextConfig, spec, heads), tensors)


def assemble_text(config: HydraTextConfig, tensors: dict[str, torch.Tensor]) -> HydraText:
    """Build a :class:`HydraText` from its description and its named tensors (a state dict)."""
    named = NamedTensors(tensors, config.norm_eps)
    take = named.take
    embeddings = TextEmbeddings(
        word=take("embeddings.word"),
        position=take("embeddings.position"),
        token_type=take("embeddings.token_type", config.token_type),
        norm=named.norm("embeddings.norm", True),
        padding_idx=config.padding_idx,
    )
    blocks = []
    for layer in range(config.depth):
        p = f"blocks.{layer}."
        block = named.block(p, config.head_dim, config.mlp_act)
        biased = bool(config.position_buckets) and block["qkv"] is not None
        blocks.append(FusedTextBlock(**block, position_bias=take(p + "position_bias", biased)))
    pooler = GroupedLinear(take("pooler.weight"), take("pooler.bias"))
    classifier = GroupedLinear(take("classifier.weight"), take("classifier.bias"))
    hydra = HydraText(config, embeddings, blocks, pooler, classifier)
    named.check_all_used()
    _check_consistent(hydra)
    return hydra


def _check_consistent(hydra: HydraText) -> None:
    """Shapes agree with the description (catches a file whose header and tensors disagree)."""
    cfg = hydra.config
    m, d = cfg.num_members, cfg.embed_dim
    if cfg.pooler_act not in POOLER_ACTS:
        raise ValueError(f"unknown classifier activation {cfg.pooler_act!r}")
    check_heads(hydra, (StackedLayerNorm, GroupedLinear, TextEmbeddings), "classifier")
    emb = hydra.embeddings
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
    for layer, block in enumerate(hydra.blocks):
        needed = block.max_heads
        bias = block.position_bias
        if bias is not None and (
            bias.shape[0] not in (1, m) or tuple(bias.shape[1:]) != (cfg.position_buckets, needed)
        ):
            raise ValueError(
                f"block {layer}: the position bias has shape {tuple(bias.shape)}; expected "
                f"(S, {cfg.position_buckets}, {needed})"
            )
