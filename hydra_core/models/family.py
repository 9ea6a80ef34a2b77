"""The seam between Hydra Lab and a family of transformers: what every family tells the rest.

A *family* (timm ViTs, Hugging Face BERT-family encoders, ...) is one :class:`ModelFamily` object
that knows, for the models it recognises, where the heads are, how a batch goes in and how a block
runs. Everything above :mod:`hydra_core.models` (search, analyses, fusion, app, report) reaches a
model only through these methods, so it never asks which family it works on.

Head layout (as in TransformerLens): head outputs are ``[batch, pos, head, d_head]``; they are
concatenated at the input of each layer's attention *output projection* W_O (shape (B, N, H * d_k)),
so head ``h`` of layer ``l`` owns channels ``h*d_k : (h+1)*d_k`` there. A head mask is a bool tensor
of shape (layers, heads), True = kept. Heads are labelled ``L{layer}H{head}``, zero-based.

Running a model piece by piece: ``embed`` turns model inputs into the token stream entering block 0
and a *context* (what every block needs besides the stream: for text, which tokens are padding;
None for images); ``block_heads`` gives a block's per-head outputs Z before W_O;
``attention_projection`` applies W_O; ``block_rest`` finishes the block from its attention output
(residual, norms, MLP: pre-LN for ViTs, post-LN for BERT); ``classify`` reads the logits off the
last stream; ``block_attention`` gives the heads' attention weights, ``real_tokens`` which tokens
are not padding. ``embed`` -> (``block_heads`` -> ``attention_projection`` -> ``block_rest``) per
block -> ``classify`` equals the model's own forward, tested per family.

Fusion: ``fusion_parts`` reads a model into the one canonical layout of
:mod:`hydra_core.models.parts` (per-head Q/K/V and W_O, norms, MLP, stem, classifier) that Hydra
fusion builds on, so that fusion, too, never asks which family a model is from.

Towers: a model may hold its heads in several transformers whose outputs meet only at the end
(CLIP: an image tower and a text tower, the paper's D.3). Its head layout is then *joint*: the
first tower's layers, then the next tower's, each with its own heads per layer
(:attr:`HeadLayout.towers` names them), so that a head mask, a ranking or a mask file covers
every tower at once, and ablation, pruning and Taylor scores work on it like on one transformer.
Only the piece-by-piece forward is per tower: :meth:`ModelFamily.towers` gives each tower as a
model of its own family with its own inputs, and :meth:`ModelFamily.join_towers` computes the
logits from the towers' outputs (what the fast greedy search needs).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hydra_core.models.modality import IMAGE_MODALITY, Modality
from hydra_core.models.parts import FusionParts


class UnsupportedModelError(ValueError):
    """The model is not a transformer whose heads Hydra Lab knows how to find."""


@dataclass(frozen=True)
class HeadLayout:
    """Where the heads of a model are.

    Args:
        num_heads: heads per layer, as the model has them now (a pruned model may differ per layer).
        head_dim: d_k, the width of one head's output.
        embed_dim: d, the width of the residual stream.
    """

    num_heads: tuple[int, ...]
    head_dim: int
    embed_dim: int
    #: the towers whose layers the layout holds, in order, as (name, number of layers): empty for
    #: a model of one transformer, ``(("image", 12),)`` for an OpenCLIP image tower pruned alone,
    #: ``(("image", 12), ("text", 12))`` for both towers of a CLIP model (layers 12.. are the
    #: text tower's); ``embed_dim`` is then the first tower's width
    towers: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.towers and sum(n for _, n in self.towers) != len(self.num_heads):
            raise ValueError(
                f"the towers {self.towers} hold {sum(n for _, n in self.towers)} layers, "
                f"the layout {len(self.num_heads)}"
            )

    @property
    def num_layers(self) -> int:
        return len(self.num_heads)

    @property
    def max_heads(self) -> int:
        return max(self.num_heads, default=0)

    @property
    def shape(self) -> tuple[int, int]:
        """The shape of a head mask for this model: (layers, max heads)."""
        return (self.num_layers, self.max_heads)

    @property
    def total_heads(self) -> int:
        return sum(self.num_heads)

    def all_kept(self) -> torch.Tensor:
        """The mask that keeps every head the model has."""
        keep = torch.zeros(self.shape, dtype=torch.bool)
        for layer, n in enumerate(self.num_heads):
            keep[layer, :n] = True
        return keep

    @property
    def input_layers(self) -> range:
        """The layers whose heads see the model's inputs: every layer, or with towers the first
        tower's (CLIP's image tower; the text tower's heads see the prompts)."""
        return range(self.towers[0][1] if self.towers else self.num_layers)

    def tower_of(self, layer: int) -> tuple[str, int]:
        """(the tower's name, the layer's index within its tower); ("", layer) without towers."""
        start = 0
        for name, count in self.towers:
            if layer < start + count:
                return name, layer - start
            start += count
        return "", layer

    def tower_layers(self) -> dict[str, range]:
        """Each tower's layers in the joint layout, by name (empty without towers)."""
        found, start = {}, 0
        for name, count in self.towers:
            found[name] = range(start, start + count)
            start += count
        return found

    def describe(self) -> str:
        """``6 layers x 12 heads``; with towers ``image 12 layers x 12 heads + text 12 layers x
        8 heads`` (a pruned layer's count as ``6/12``)."""
        groups = self.tower_layers() or {"": range(self.num_layers)}
        parts = []
        for name, layers in groups.items():
            heads = "/".join(str(h) for h in sorted({self.num_heads[layer] for layer in layers}))
            count = f"{len(layers)} layer{'s' if len(layers) != 1 else ''}"
            parts.append(f"{name} {count} x {heads} heads".strip())
        return " + ".join(parts)

    def layer_names(self) -> list[str]:
        """A name for each layer: ``L3``, or with towers ``image L3`` / ``text L0`` (the layer's
        index within its tower), for figures and tables."""
        if len(self.towers) < 2:
            return [f"L{layer}" for layer in range(self.num_layers)]
        return [f"{name} L{local}" for name, local in map(self.tower_of, range(self.num_layers))]


def head_label(layer: int, head: int) -> str:
    """``L3H7``: the name of head 7 of layer 3 (zero-based)."""
    return f"L{layer}H{head}"


def parse_head_label(label: str) -> tuple[int, int]:
    """``"L3H7"`` -> (3, 7)."""
    text = label.strip().upper()
    if not text.startswith("L") or "H" not in text:
        raise ValueError(
            f"{label!r} is not a head label; expected the form L<layer>H<head>, e.g. L3H7"
        )
    layer, head = text[1:].split("H", 1)
    try:
        return int(layer), int(head)
    except ValueError:
        raise ValueError(
            f"{label!r} is not a head label; expected the form L<layer>H<head>, e.g. L3H7"
        ) from None


#: what ``embed`` returns besides the stream and every block needs (None for images)
Context = Any


@dataclass(frozen=True)
class Tower:
    """One transformer of a model whose heads sit in several (see the module docstring).

    Args:
        name: as in :attr:`HeadLayout.towers` (``"image"``, ``"text"``).
        model: the tower as a model of a registered family: its outputs (``classify``) are what
            :meth:`ModelFamily.join_towers` takes (CLIP: embeddings (B, D)).
        inputs: the tower's own fixed inputs (CLIP's text tower: the prompts' token ids), or
            None for the tower that reads the model's inputs.
    """

    name: str
    model: nn.Module
    inputs: torch.Tensor | None = None


#: the kinds :meth:`ModelFamily.parameter_kind` sorts a model's parameters into: the embedding
#: (ViT: patch and position embeddings, class tokens; text: token, position and type embeddings
#: and their LayerNorm), attention, MLP, the blocks' and final LayerNorms, the classifier head
#: (with BERT's pooler or the dense layer before a RoBERTa classifier)
PARAMETER_KINDS = ("embed", "attn", "mlp", "norm", "head")


@dataclass(frozen=True)
class CostSizes:
    """The sizes, besides the head layout, that the multiply-adds of one sample depend on.

    Args:
        num_tokens: N, tokens entering block 0 (ViT: patches + prefix tokens; text: the padded
            length of the inputs).
        mlp_hidden: d_ff, the MLP's hidden width.
        num_classes: C, the classifier's outputs.
        token_pool: the classifier reads the class token only.
        num_patches: rows the stem's matrix multiply runs on (0 for a table lookup, as text).
        patch_dim: the width of each such row (C * p_h * p_w for a patch embedding).
        pre_classifier: width of a dense layer between the pooled token and the classifier
            (BERT's pooler, RoBERTa's and DistilBERT's dense layer); 0 when there is none.
    """

    num_tokens: int
    mlp_hidden: int
    num_classes: int
    token_pool: bool
    num_patches: int = 0
    patch_dim: int = 0
    pre_classifier: int = 0


@dataclass(frozen=True)
class PreNormParts:
    """The parts of a pre-LN block after its attention: ``u = x + ls1(attention)``, then
    ``u + ls2(fc2(act(fc1(norm2(u)))))`` (dropout off); ``ls1`` multiplies by ``scale1`` (a layer
    scale's gamma (d,), or a scalar one)."""

    ls1: nn.Module
    scale1: torch.Tensor
    norm2: nn.LayerNorm
    fc1: nn.Linear
    act: Any
    fc2: nn.Linear
    ls2: nn.Module


@dataclass(frozen=True)
class PostNormParts:
    """The parts of a post-LN block after its attention: ``h = norm1(x + attention)``, then
    ``norm2(h + fc2(act(fc1(h))))`` (dropout off)."""

    norm1: nn.Module
    fc1: nn.Linear
    act: Any
    fc2: nn.Linear
    norm2: nn.Module


def shallow_copy(module: nn.Module) -> nn.Module:
    """A new module object sharing ``module``'s submodules, parameters and buffers, whose own
    registries can be changed (e.g. one submodule replaced) without touching ``module``."""
    new = copy.copy(module)
    new._modules = dict(module._modules)
    new._parameters = dict(module._parameters)
    new._buffers = dict(module._buffers)
    new._forward_hooks = type(module._forward_hooks)()
    new._forward_pre_hooks = type(module._forward_pre_hooks)()
    return new


class ModelFamily:
    """One family of transformers. Subclasses implement every method that raises here."""

    #: short name, shown to users and stored with saved files ("vit", "text", ...)
    name: str = ""
    #: what the inputs are, and the data that follows (:mod:`hydra_core.models.modality`):
    #: IMAGE_MODALITY (uint8 images + preprocess) or TEXT_MODALITY (token ids)
    modality: Modality = IMAGE_MODALITY

    def matches(self, model: nn.Module) -> bool:
        """Whether ``model`` looks like a member of this family (checked further by ``layout``)."""
        raise NotImplementedError

    def blocks(self, model: nn.Module) -> Sequence[nn.Module]:
        """The transformer blocks, in order."""
        raise NotImplementedError

    def layout(self, model: nn.Module) -> HeadLayout:
        """The head layout; raises :class:`UnsupportedModelError` naming what does not fit."""
        raise NotImplementedError

    def output_projection(self, block: nn.Module) -> nn.Linear:
        """W_O of a block: its input holds the heads' outputs, concatenated."""
        raise NotImplementedError

    #: the model's own forward calls W_O as a module, so that tools intercepting a module's
    #: input (forward pre-hooks, nnsight) see the heads there; False where the attention reads
    #: W_O's weight itself (OpenCLIP's ``nn.MultiheadAttention``)
    projection_is_called: bool = True

    def bare_model(self, model: nn.Module) -> nn.Module:
        """``model`` as its own library defines it, without a Hydra Lab wrapper: what a user
        holds outside Hydra Lab (and module paths are counted from)."""
        return model

    @contextmanager
    def projection_called(self, model: nn.Module, layers: Sequence[int]) -> Iterator[None]:
        """Inside, the output projections of ``layers`` are called as modules, so that hooks on
        them fire (the ablation and recording hooks of :mod:`hydra_core.models.adapter`); on exit
        ``model`` is as it was. Nothing to do for a family whose attention calls W_O already (the
        default); OpenCLIP's ``nn.MultiheadAttention`` reads W_O's weight directly instead."""
        yield

    def prune_block(self, block: nn.Module, heads: torch.Tensor) -> nn.Module:
        """A copy of ``block`` whose attention keeps only ``heads`` (1-D int64, sorted),
        structurally; the block's other parts are shared with ``block``, not copied."""
        raise NotImplementedError

    def weights_changed(self, model: nn.Module) -> None:
        """Called once blocks of ``model`` were replaced (:meth:`set_block`, after pruning) or its
        weights trained, so that the model can update what it derives from them (a CLIP
        classifier: the class embeddings of its text tower). Nothing by default."""

    def towers(self, model: nn.Module) -> tuple[Tower, ...]:
        """The towers of a model whose heads sit in several transformers, in the order of its
        joint head layout; empty (the default) for a model of one transformer."""
        return ()

    def join_towers(self, model: nn.Module, outputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """The logits from each tower's outputs, in the order of :meth:`towers`: tower k's
        outputs (..., S_k, D), leading (candidate) dimensions broadcast -> (..., S, C) for the S
        samples of the tower that reads the model's inputs."""
        raise NotImplementedError(f"{self.name or 'this'} models have one tower")

    def callable_model(self, model: nn.Module) -> nn.Module:
        """``model`` as a module that maps this family's inputs (one tensor) to logits (B, C)."""
        return model

    def classifier_layer(self, model: nn.Module) -> nn.Linear:
        """The last linear layer of the classifier: its input is the model's penultimate
        (pre-classifier) features of a sample, (B, D), its weight (C, D) and bias (C,) map them
        to the logits. Feature-based OOD scores (Mahalanobis, ViM, KNN) read it; a family without
        one raises :class:`UnsupportedModelError` (those scores are then not offered)."""
        raise UnsupportedModelError(
            f"{self.name or 'this'} models have no single linear classifier to read penultimate "
            "features from"
        )

    def check_inputs(self, x: object, name: str) -> torch.Tensor:
        """``x`` as this family's model inputs, a tensor whose first axis is the samples; a
        TypeError naming ``name`` when it cannot be."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(
                f"{name} must be a float tensor of preprocessed model inputs, got "
                f"{type(x).__name__ if not isinstance(x, torch.Tensor) else x.dtype}"
            )
        return x

    def match_inputs(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Several input tensors made concatenable (for text: padded to one length)."""
        return list(inputs)

    def set_block(self, model: nn.Module, layer: int, block: nn.Module) -> None:
        """Replace block ``layer`` of ``model`` (used on copies only)."""
        self.blocks(model)[layer] = block

    def qkv_weights(self, block: nn.Module) -> list[nn.Parameter]:
        """The Q/K/V weight parameters of a block. Their rows, concatenated in order, are
        q, k, v, each head-major: reshaping to (3, H, d_k, d) gives per head rows (Taylor)."""
        raise NotImplementedError

    def parameter_kind(self, model: nn.Module, name: str) -> str:
        """Which of :data:`PARAMETER_KINDS` the parameter ``name`` of ``model`` (as
        ``model.named_parameters()`` names it) belongs to; a ValueError naming it otherwise."""
        raise NotImplementedError

    def per_input_parameters(self, model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
        """The named parameters a forward on every input runs through (what the cost counts):
        all of them by default; a CLIP classifier leaves out its text tower, which runs once,
        into the class embeddings."""
        yield from model.named_parameters()

    def cost_sizes(self, model: nn.Module, inputs: torch.Tensor | None = None) -> CostSizes:
        """The sizes a forward's multiply-adds depend on, for one sample of ``inputs`` (this
        family's model inputs; text needs them for the token count, which else defaults to the
        longest input a text preprocess makes)."""
        raise NotImplementedError

    # --- running a model piece by piece ----------------------------------------------------------

    def prepare(self, model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        """Inputs made ready to be cut into chunks that embed to streams of one length (for text:
        padding columns that no sample uses are dropped). The identity by default."""
        return inputs

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> tuple[torch.Tensor, Context]:
        """Model inputs -> (the stream entering block 0 (B, N, d), the context)."""
        raise NotImplementedError

    def block_forward(self, block: nn.Module, x: torch.Tensor, context: Context) -> torch.Tensor:
        """A whole block, as the model runs it (hooks on its modules fire)."""
        raise NotImplementedError

    def block_heads(
        self,
        block: nn.Module,
        x: torch.Tensor,
        context: Context,
        queries: slice | None = None,
    ) -> torch.Tensor:
        """Per-head outputs Z (B, Nq, H, d_k) of a block for the stream ``x`` entering it, before
        W_O; ``queries`` limits the query positions (``slice(0, 1)``: the class token only)."""
        raise NotImplementedError

    def block_attention(self, block: nn.Module, x: torch.Tensor, context: Context) -> torch.Tensor:
        """Each head's attention weights (B, H, N, N), queries x keys, for the stream ``x``
        entering the block: the softmax the block computes (padding keys get weight 0), in the
        order of operations of the library's explicit attention (see ``explicit_attention``)."""
        raise NotImplementedError

    @contextmanager
    def explicit_attention(self, model: nn.Module) -> Iterator[None]:
        """Inside, ``model`` computes its attention as an explicit softmax, the path libraries
        return attention weights from (Hugging Face's "eager" implementation, timm's unfused
        attention), not a fused kernel; on exit it is as it was. Nothing to do by default."""
        yield

    def real_tokens(self, context: Context) -> torch.Tensor | None:
        """(B, N) bool, True where a batch's token is a real one (text: not padding), for the
        context ``embed`` (then ``trim``) gave; None when every token is real (the default)."""
        return None

    def attention_projection(self, block: nn.Module, z: torch.Tensor) -> torch.Tensor:
        """(B, N, H, d_k) head outputs -> the attention output (B, N, d) through W_O."""
        b, n = z.shape[:2]
        return self.output_projection(block)(z.reshape(b, n, -1))

    def block_rest(self, block: nn.Module, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """Finish a block from the stream entering it and its attention output after W_O."""
        raise NotImplementedError

    def classify(self, model: nn.Module, x: torch.Tensor, context: Context) -> torch.Tensor:
        """The stream leaving the last block (B, N, d) -> logits (B, C)."""
        raise NotImplementedError

    def class_token_pooling(self, model: nn.Module) -> bool:
        """True when the classifier reads only token 0 of the last block's output."""
        raise NotImplementedError

    def pre_norm_parts(self, block: nn.Module) -> PreNormParts | None:
        """The parts after the attention of a pre-LN block when they have exactly the form of
        :class:`PreNormParts` (the fast greedy search then folds the MLP's first matmul); None
        otherwise (the default)."""
        return None

    def post_norm_parts(self, block: nn.Module) -> PostNormParts | None:
        """The parts after the attention of a post-LN block; None for pre-LN blocks."""
        return None

    def sample_lengths(self, inputs: torch.Tensor) -> torch.Tensor | None:
        """(S,) the positions each sample of prepared ``inputs`` uses, as :meth:`trim` keeps them
        (text: up to its last unmasked token); None when every sample uses every position."""
        return None

    def sample_order(self, inputs: torch.Tensor) -> torch.Tensor | None:
        """An order of the samples that makes batches of neighbours cheap (by length, so a batch
        is cut to its longest member); None when the order does not matter."""
        lengths = self.sample_lengths(inputs)
        return None if lengths is None else lengths.argsort(stable=True)

    def trim(self, x: torch.Tensor, context: Context) -> tuple[torch.Tensor, Context]:
        """A batch's stream (B, N, d) and context cut to the positions some sample uses (text:
        padding columns beyond the longest sample dropped); as given by default."""
        return x, context

    def select_context(self, context: Context, index: slice | torch.Tensor) -> Context:
        """The context of the samples ``index`` of a batch."""
        return context

    def repeat_context(self, context: Context, times: int) -> Context:
        """The context of a batch repeated ``times`` times along the batch axis (a whole batch,
        then the whole batch again: candidates outside, samples inside)."""
        return context

    def concat_contexts(self, contexts: Sequence[Context]) -> Context:
        """The contexts of consecutive batches as one."""
        return contexts[0] if contexts else None

    # --- fusion ----------------------------------------------------------------------------------

    def fusion_parts(self, model: nn.Module, where: str = "this model") -> FusionParts:
        """``model`` in the one canonical layout that Hydra fusion reads
        (:class:`~hydra_core.models.parts.FusionParts`: the stem, per-block Q/K/V and W_O whose
        heads can be sliced, norms, MLP, classifier; its ``kind``, pre-norm or post-norm, picks
        the fused model). Tensors are detached, not copied. Raises
        :class:`UnsupportedModelError` starting with ``where`` ("this model", "member 2") and
        naming what the parts cannot describe, so that fusability is checked by calling this."""
        raise UnsupportedModelError(
            f"{where} cannot be fused: Hydra fusion does not support {self.name or 'this'} models"
        )

    def member_fusion_parts(
        self, model: nn.Module, keep: torch.Tensor, where: str = "this model"
    ) -> tuple[FusionParts, torch.Tensor]:
        """A member (``model`` keeping the heads of ``keep``, a mask of its layout) as fusion
        parts and the mask of the heads those parts hold: ``fusion_parts`` and ``keep`` by
        default. A model with towers reads here what its other towers make of their kept heads
        (CLIP: the member's class embeddings, from its own pruned text tower) into the parts,
        and returns the mask of the tower that is fused."""
        return self.fusion_parts(model, where), keep
