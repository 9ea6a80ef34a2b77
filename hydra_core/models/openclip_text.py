"""The text tower of an OpenCLIP model with the prompts of a zero-shot classifier
(:class:`ClipTextTower`), and its family (:data:`OPENCLIP_TEXT`).

The paper prunes CLIP's heads "jointly from both encoders" (D.3): a class's embedding is what the
text tower makes of its prompts, so removing a text head changes the classifier. The tower is
open_clip's text transformer as ``CLIP.encode_text`` runs it: token embedding plus position
embedding, ``ResidualAttentionBlock`` s with a causal attention mask, ``ln_final``, the pooled
token (the end-of-text token, ``argmax`` of the ids, for CLIP; ``eos``, ``first`` or ``last`` as
the model says), the projection. Its inputs are the prompts' token ids (P, context length), one
row per (class, template), class-major; its outputs are the prompts' embeddings (P, D);
:func:`class_embeddings_from_prompts` averages a class's normalised prompt embeddings and
normalises again (OpenAI's prompt ensembling, as ``open_clip.build_zero_shot_classifier``).

With a causal mask a token sees only the tokens before it, so the pooled token's output does not
depend on the padding after it: the tower (and the search, through :meth:`OpenClipTextFamily.
prepare` and ``trim``) runs only up to the last pooled position of a batch, which gives exactly
the numbers of the full context length (a prompt of 10 tokens in a context of 77).

The tower shares its modules with the open_clip model it was read from (nothing is copied).
Refused, each in one line: text towers that are not open_clip's own transformer (Hugging Face
text encoders), a class token appended to the text (CoCa), padding masks, pooling 'none', and the
blocks the image tower refuses too.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hydra_core.models.family import (
    PARAMETER_KINDS,
    Context,
    CostSizes,
    HeadLayout,
    UnsupportedModelError,
)
from hydra_core.models.openclip_blocks import (
    ResidualBlocksFamily,
    block_head_outputs,
    block_kind,
    check_block,
)

#: prompts per pass when a tower embeds all of its prompts (open_clip embeds 10 classes at once)
PROMPTS_PER_PASS = 512


def class_embeddings_from_prompts(prompts: torch.Tensor, templates: int) -> torch.Tensor:
    """Prompt embeddings (..., C * T, D), class-major, -> normalised class embeddings (..., C, D):
    per class, the mean of its T normalised prompt embeddings, normalised again."""
    *lead, rows, width = prompts.shape
    per_class = F.normalize(prompts, dim=-1).reshape(*lead, rows // templates, templates, width)
    return F.normalize(per_class.mean(-2), dim=-1)


class ClipTextTower(nn.Module):
    """An open_clip text tower and the prompts of a zero-shot classifier.

    ``forward(tokens)`` -> the prompts' embeddings (B, D), the numbers of
    ``CLIP.encode_text(tokens)``; :meth:`class_embeddings` -> (C, D), normalised.

    Args:
        token_embedding, positional_embedding, transformer, ln_final, text_projection: the
            tower's modules (shared, not copied); ``text_projection`` a (width, D) parameter, a
            Linear or None.
        attn_mask: (context, context) additive causal mask, or None (bidirectional).
        pool_type: ``"argmax"``, ``"eos"``, ``"first"`` or ``"last"``.
        eos_id: the end-of-text id (``"eos"`` pooling).
        prompts: (C * T, context) int64 token ids, class-major (class c's templates at rows
            c * T .. c * T + T - 1).
        templates: T, the templates per class.
    """

    def __init__(
        self,
        token_embedding: nn.Embedding,
        positional_embedding: nn.Parameter,
        transformer: nn.Module,
        ln_final: nn.Module,
        text_projection: nn.Parameter | nn.Linear | None,
        attn_mask: torch.Tensor | None,
        pool_type: str,
        eos_id: int | None,
        prompts: torch.Tensor,
        templates: int,
    ) -> None:
        super().__init__()
        if pool_type not in ("argmax", "eos", "first", "last"):
            raise UnsupportedModelError(
                f"the text tower pools with {pool_type!r}; Hydra Lab supports 'argmax', 'eos', "
                "'first' and 'last' (one token per prompt)"
            )
        if prompts.ndim != 2 or templates < 1 or len(prompts) % templates:
            raise ValueError(
                f"prompts must be (classes x {templates} templates, context) token ids, got shape "
                f"{tuple(prompts.shape)}"
            )
        self.token_embedding = token_embedding
        self.positional_embedding = positional_embedding
        self.transformer = transformer
        self.ln_final = ln_final
        self.text_projection = text_projection
        mask = None if attn_mask is None else attn_mask.detach().clone()
        self.register_buffer("attn_mask", mask, persistent=False)
        self.pool_type = pool_type
        self.eos_id = eos_id
        self.register_buffer("prompts", prompts.detach().long().clone())
        self.templates = int(templates)
        # > 0 while an intervention (ablation, recording) is on the tower's W_O: the classifier
        # then computes its class embeddings with the tower instead of reading them stored
        self.interventions = 0

    @classmethod
    def of(cls, clip: nn.Module, prompts: torch.Tensor, templates: int) -> ClipTextTower:
        """The text tower of an open_clip ``CLIP`` (its text attributes) or ``CustomTextCLIP``
        (its ``text``, an open_clip ``TextTransformer``), with ``prompts``; refuses the rest."""
        text = getattr(clip, "text", None)
        if text is not None:
            if type(text).__name__ != "TextTransformer" or not hasattr(text, "transformer"):
                raise UnsupportedModelError(
                    f"the text tower is a {type(text).__name__}, not open_clip's own "
                    "TextTransformer (a Hugging Face text encoder?): Hydra Lab prunes its heads "
                    "only in open_clip's transformers; prune the image tower alone "
                    "(towers='image', --towers image)"
                )
            if getattr(text, "cls_emb", None) is not None or getattr(text, "use_pad_mask", False):
                raise UnsupportedModelError(
                    "the text tower appends a class token (cls_emb) or masks padding "
                    "(use_pad_mask), which Hydra Lab does not reproduce; prune the image tower "
                    "alone (towers='image', --towers image)"
                )
            source, pool, eos = text, text.pool_type, getattr(text, "eos_id", None)
        elif hasattr(clip, "token_embedding") and hasattr(clip, "transformer"):
            source, pool, eos = clip, clip.text_pool_type, getattr(clip, "text_eos_id", None)
        else:
            raise UnsupportedModelError(
                f"{type(clip).__name__} has no open_clip text tower (token_embedding, "
                "transformer); pass an open_clip CLIP model"
            )
        return cls(
            source.token_embedding,
            source.positional_embedding,
            source.transformer,
            source.ln_final,
            source.text_projection,
            source.attn_mask,
            pool,
            eos,
            prompts,
            templates,
        )

    @property
    def blocks(self) -> nn.ModuleList:
        return self.transformer.resblocks

    def pooled_positions(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B,) the position of the token each prompt is read at (open_clip's
        ``text_global_pool``)."""
        if self.pool_type == "argmax":
            return tokens.argmax(dim=-1)
        if self.pool_type == "eos":
            return (tokens == self.eos_id).int().argmax(dim=-1)
        last = tokens.shape[-1] - 1 if self.pool_type == "last" else 0
        return torch.full(tokens.shape[:1], last, dtype=torch.long, device=tokens.device)

    def used_length(self, tokens: torch.Tensor) -> int:
        """The positions a forward needs: up to the last pooled token with a causal mask (later
        tokens cannot reach it), all of them without one."""
        if self.attn_mask is None or not len(tokens):
            return tokens.shape[-1]
        return int(self.pooled_positions(tokens).max()) + 1

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> the stream entering block 0 (B, T, width)."""
        cast = self.blocks[0].get_weight_dtype() if len(self.blocks) else self.ln_final.weight.dtype
        x = self.token_embedding(tokens).to(cast)
        return x + self.positional_embedding[: tokens.shape[1]].to(cast)

    def mask(self, length: int) -> torch.Tensor | None:
        return None if self.attn_mask is None else self.attn_mask[:length, :length]

    def readout(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The stream leaving the last block (B, T, width) -> the prompts' embeddings (B, D)."""
        x = self.ln_final(x)
        pooled = x[torch.arange(x.shape[0], device=x.device), positions]  # (B, width)
        projection = self.text_projection
        if projection is None:
            return pooled
        return projection(pooled) if isinstance(projection, nn.Linear) else pooled @ projection

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = self.pooled_positions(tokens)
        tokens = tokens[:, : self.used_length(tokens)]
        x = self.transformer(self.embed(tokens), attn_mask=self.mask(tokens.shape[1]))
        return self.readout(x, positions)

    def prompt_embeddings(self) -> torch.Tensor:
        """The embeddings (C * T, D) of every prompt, in passes of :data:`PROMPTS_PER_PASS`."""
        prompts, step = self.prompts, PROMPTS_PER_PASS
        return torch.cat([self(prompts[i : i + step]) for i in range(0, len(prompts), step)])

    def class_embeddings(self) -> torch.Tensor:
        """(C, D) normalised class embeddings from this tower, as it runs now (with whatever
        interventions are on it)."""
        return class_embeddings_from_prompts(self.prompt_embeddings(), self.templates)

    def live(self) -> bool:
        """Whether a forward must run this tower instead of reading stored class embeddings: an
        intervention is on its W_O, or gradients may flow into it."""
        if self.interventions > 0:
            return True
        return torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())


@dataclass
class PromptContext:
    """What every text block needs besides the stream."""

    positions: torch.Tensor  # (B,) the pooled token of each prompt
    mask: torch.Tensor | None  # (context, context): the causal mask, None when bidirectional


class OpenClipTextFamily(ResidualBlocksFamily):
    """:class:`ClipTextTower` s. Inputs: token ids (B, T) int64; outputs: the prompts'
    embeddings (B, D). Reached through a CLIP classifier's joint layout, never loaded alone."""

    name = "openclip-text"

    def matches(self, model: nn.Module) -> bool:
        return isinstance(model, ClipTextTower)

    def blocks(self, model: nn.Module) -> Sequence[nn.Module]:
        return model.blocks

    def layout(self, model: nn.Module) -> HeadLayout:
        blocks = self.blocks(model)
        if len(blocks) == 0:
            raise UnsupportedModelError("the text tower has no transformer blocks")
        for i, block in enumerate(blocks):
            check_block(i, block, "text")
        head_dims = {int(b.attn.head_dim) for b in blocks}
        if len(head_dims) != 1:
            raise UnsupportedModelError(
                f"text layers disagree on the width of their heads: {sorted(head_dims)}"
            )
        return HeadLayout(
            num_heads=tuple(int(b.attn.num_heads) for b in blocks),
            head_dim=head_dims.pop(),
            embed_dim=int(blocks[0].attn.out_proj.out_features),
        )

    @contextmanager
    def projection_called(self, model: nn.Module, layers: Sequence[int]) -> Iterator[None]:
        """W_O called as a module (see the base class), and the tower marked as intervened on,
        so that a classifier around it computes its class embeddings through it."""
        with super().projection_called(model, layers):
            model.interventions += 1
            try:
                yield
            finally:
                model.interventions -= 1

    def check_inputs(self, x: object, name: str) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.is_floating_point() or x.ndim != 2:
            raise TypeError(f"{name} must be token ids (prompts, context length), int64")
        return x

    def parameter_kind(self, model: nn.Module, name: str) -> str:
        """``token_embedding``, ``positional_embedding``: "embed"; ``ln_final`` "norm";
        ``text_projection`` "head"; the blocks as open_clip's image tower's."""
        parts = name.split(".")
        if parts[:2] == ["transformer", "resblocks"] and len(parts) > 3:
            kind = block_kind(parts[3:])
            if kind is not None:
                return kind
        elif parts[0] in ("token_embedding", "positional_embedding"):
            return "embed"
        elif parts[0] == "ln_final":
            return "norm"
        elif parts[0] == "text_projection":
            return "head"
        raise ValueError(
            f"parameter {name!r} is in none of the groups {', '.join(PARAMETER_KINDS)}; "
            "Hydra Lab knows open_clip text-tower parameter names only"
        )

    def cost_sizes(self, model: nn.Module, inputs: torch.Tensor | None = None) -> CostSizes:
        """Tokens: the positions a forward on ``inputs`` (default: the tower's prompts) runs."""
        tokens = model.prompts if inputs is None else inputs
        projection = model.text_projection
        width = int(self.layout(model).embed_dim)
        if projection is None:
            out = width
        elif isinstance(projection, nn.Linear):
            out = projection.out_features
        else:
            out = int(projection.shape[1])
        return CostSizes(
            num_tokens=model.used_length(tokens),
            mlp_hidden=int(self.blocks(model)[0].mlp.c_fc.out_features),
            num_classes=out,
            token_pool=False,
        )

    # --- piece by piece -----------------------------------------------------------------------

    def prepare(self, model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        return inputs[:, : model.used_length(inputs)]

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> tuple[torch.Tensor, Context]:
        context = PromptContext(model.pooled_positions(inputs), model.attn_mask)
        return model.embed(inputs), context  # (B, T, width)

    def block_forward(self, block: nn.Module, x: torch.Tensor, context: Context) -> torch.Tensor:
        mask = None if context.mask is None else context.mask[: x.shape[1], : x.shape[1]]
        if block.attn.batch_first:
            return block(x, attn_mask=mask)
        return block(x.transpose(0, 1), attn_mask=mask).transpose(0, 1)

    def block_heads(
        self, block: nn.Module, x: torch.Tensor, context: Context, queries: slice | None = None
    ) -> torch.Tensor:
        return block_head_outputs(block, x, queries, context.mask)

    def classify(self, model: nn.Module, x: torch.Tensor, context: Context) -> torch.Tensor:
        return model.readout(x, context.positions)

    def class_token_pooling(self, model: nn.Module) -> bool:
        return False

    def sample_lengths(self, inputs: torch.Tensor) -> torch.Tensor | None:
        # set by the tower: only a causal mask makes the positions after the pooled one unused
        return None

    def trim(self, x: torch.Tensor, context: Context) -> tuple[torch.Tensor, Context]:
        if context.mask is None or not len(context.positions):
            return x, context
        return x[:, : int(context.positions.max()) + 1], context

    def select_context(self, context: Context, index) -> Context:
        return PromptContext(context.positions[index], context.mask)

    def repeat_context(self, context: Context, times: int) -> Context:
        return PromptContext(context.positions.repeat(times), context.mask)

    def concat_contexts(self, contexts: Sequence[Context]) -> Context:
        return PromptContext(torch.cat([c.positions for c in contexts]), contexts[0].mask)


OPENCLIP_TEXT = OpenClipTextFamily()
