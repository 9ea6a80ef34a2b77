"""The fast path of the greedy head search: cached residual streams and shared suffix passes.

Ablating head h of layer l changes nothing before layer l, so the stream entering every layer is
kept for the current (permanent) mask and a candidate is scored by recomputing layers l..L-1 only.
What a step computes, per layer l and chunk of samples:

- shared by the candidates of layer l: the kept heads' outputs Z_l, the projected attention
  output A_l = proj(Z_l) and the residual after it; candidate h's residual is that minus head h's
  share Z_l^(h) W_O^(h)T (the attention output decomposes over heads, paper Appendix D.1.2);
- for a standard pre-LN block (LayerNorm, a two-layer MLP, optional layer scale, as the family's
  ``pre_norm_parts`` describes it: timm's Block, OpenCLIP's) the MLP's first matmul is shared
  too: fc1(norm2(u - delta_h)) = (F - Z_h M_h + mean(delta_h) s) / std(u - delta_h) + b', where
  F = W1 gamma centre(u) is computed once per chunk and M_h = W_O^(h)T W1 gamma is a (d_k, hidden)
  matrix fixed per head, so a candidate costs a rank-d_k update instead of a full fc1;
- candidates x samples stacked along the batch axis, in passes of a bounded number of token rows
  (operands stay in the CPU cache); text samples sorted by length and cut into chunks of similar
  length, so little of a pass is padding (:meth:`SuffixEvaluator.passes`); heads already
  removed are cut out structurally (:func:`prune_attention`), so they cost nothing in later
  layers;
- in the last block with class-token pooling only the CLS row: its query and attention (the family
  computes that one row its fastest way: timm ViTs and text encoders fold W_K and W_V onto the
  query side), the CLS row of the projection and of the MLP.

Every cached stream is a deterministic function of the stream before it and the current mask
(fixed sample chunks), so a search resumed from a stored removal order recomputes exactly the
numbers an uninterrupted search holds at that point.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hydra_core.models.adapter import family_of
from hydra_core.models.family import ModelFamily, PostNormParts, PreNormParts

#: Token rows (candidates x samples x tokens) per batched pass on the CPU. Single-threaded, small
#: passes whose activations stay in cache are fastest (1024 rows beat 16384 by ~20% with the
#: default ViT). With several threads every op ends in a barrier, and on a busy machine a barrier
#: waits for a descheduled thread (milliseconds), so fewer, larger ops win there: with 2 threads
#: on the shared 2-core development machine 1024-row passes ran 4-6x slower than 8192-row ones.
CPU_ROWS_PER_PASS = 1024
CPU_ROWS_PER_PASS_THREADED = 8192


def cpu_rows_per_pass() -> int:
    """Token rows per batched pass on the CPU for the current torch thread count."""
    return CPU_ROWS_PER_PASS if torch.get_num_threads() == 1 else CPU_ROWS_PER_PASS_THREADED


class Stopped(Exception):
    """Raised inside a step when ``should_stop`` asked to stop; the step is discarded."""


def class_token_pooling(model: nn.Module) -> bool:
    """True when the classifier reads only token 0 of the last block's output."""
    return family_of(model).class_token_pooling(model)


@dataclass
class _MlpFold:
    """Constants that turn fc1(norm2(u - delta_h)) into a rank-d_k update per head h."""

    head_out: torch.Tensor  # (H, d_k, d): Z_h @ head_out[h] = ls1(head h's share of the attention)
    rank_update: torch.Tensor  # (H, d_k, hidden): M_h = head_out[h] @ (W1 diag gamma2)^T
    w1g: torch.Tensor  # (hidden, d): W1 diag gamma2
    row_sum: torch.Tensor  # (hidden,): s = W1 gamma2, the response to a constant shift
    bias: torch.Tensor  # (hidden,): b' = W1 beta2 + b1
    eps: float
    pre_norm: PreNormParts | None = None  # a pre-LN block's parts
    post_norm: PostNormParts | None = None  # a post-LN block's parts (the norm is norm1 there)


def _mlp_fold(family: ModelFamily, block: nn.Module, head_out: torch.Tensor) -> _MlpFold | None:
    """The fold of a block of ``family`` (pre- or post-LN), or None when none applies."""
    parts = family.pre_norm_parts(block)
    if parts is None:
        return _post_norm_fold(family.post_norm_parts(block), head_out)
    if tuple(parts.norm2.normalized_shape) != (head_out.shape[-1],):
        return None
    fold = _fold(parts.norm2, parts.fc1, head_out, parts.scale1)
    fold.pre_norm = parts
    return fold


def _post_norm_fold(parts: PostNormParts | None, head_out: torch.Tensor) -> _MlpFold | None:
    """The fold for a post-LN block (h = norm1(u), then norm2(h + fc2(act(fc1(h))))): the same
    constants with norm1 in norm2's place and no layer scale."""
    if parts is None or not isinstance(parts.norm1, nn.LayerNorm):
        return None
    if tuple(parts.norm1.normalized_shape) != (head_out.shape[-1],):
        return None
    fold = _fold(parts.norm1, parts.fc1, head_out, torch.ones(()))
    fold.post_norm = parts
    return fold


def _fold(
    norm: nn.LayerNorm, fc1: nn.Linear, head_out: torch.Tensor, scale1: torch.Tensor
) -> _MlpFold:
    """The constants of fc1(norm(u - delta_h)) as a rank-d_k update (see :class:`_MlpFold`)."""

    def exact(t: torch.Tensor) -> torch.Tensor:  # folded in float64, on the CPU
        return t.detach().cpu().double()

    def back(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=head_out.device, dtype=head_out.dtype)

    w1 = exact(fc1.weight)  # (hidden, d)
    d = w1.shape[1]
    gamma = exact(norm.weight) if norm.weight is not None else w1.new_ones(d)
    beta = exact(norm.bias) if norm.bias is not None else w1.new_zeros(d)
    b1 = exact(fc1.bias) if fc1.bias is not None else w1.new_zeros(w1.shape[0])
    out = exact(head_out) * exact(scale1)  # (H, d_k, d)
    w1g = w1 * gamma  # (hidden, d)
    return _MlpFold(
        head_out=back(out),
        rank_update=back(out @ w1g.T),
        w1g=back(w1g),
        row_sum=back(w1g.sum(1)),
        bias=back(w1 @ beta + b1),
        eps=float(norm.eps),
    )


@dataclass
class _Shared:
    """What every candidate of one layer shares, for one chunk of s samples."""

    z: torch.Tensor  # (s, Nq, Hk, d_k): the kept heads' outputs


@dataclass
class _LoneHead(_Shared):
    """The layer keeps one head: ablating it leaves W_O's bias as the whole attention output."""

    x: torch.Tensor  # (s, Nq, d): the stream entering the block, its query rows
    context: object  # the family's context of the s samples
    bias_only: torch.Tensor  # (s, Nq, d): W_O's bias (zeros without one)


@dataclass
class _SharedAttention(_Shared):
    """Any block: a candidate's attention output is ``attn`` minus its head's share."""

    x: torch.Tensor  # (s, Nq, d): the stream entering the block, its query rows
    context: object  # the family's context of the s samples
    attn: torch.Tensor  # (s, Nq, d): the projected attention output of all kept heads


@dataclass
class _SharedMlpInput(_Shared):
    """A foldable block (:class:`_MlpFold`): a candidate costs a rank-d_k update of ``f``."""

    context: object  # the family's context of the s samples
    mid: torch.Tensor  # (s, N, d): the residual after the attention of all kept heads
    f: torch.Tensor  # (s, N, hidden): W1 gamma centre(mid)
    fold: _MlpFold


def _even_chunks(total: int, most: int) -> list[slice]:
    """``range(total)`` cut into the fewest chunks of at most ``most``, their sizes within one."""
    count = -(-total // most)
    bounds = [total * i // count for i in range(count + 1)]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


#: The most of a pass's token rows that may be padding before a layer's candidates are scored in
#: smaller chunks of samples with more heads per pass (see :meth:`SuffixEvaluator.passes`).
MAX_PADDING = 0.1


def _length_chunks(lengths: list[int], most_rows: int) -> list[slice]:
    """Samples sorted by length (ascending) cut into consecutive chunks whose padded rows (size x
    longest) stay within ``most_rows`` (a sample longer than that alone in its chunk); equal
    lengths give :func:`_even_chunks`."""
    if lengths[0] == lengths[-1]:
        return _even_chunks(len(lengths), max(1, most_rows // lengths[-1]))
    chunks, start = [], 0
    for i, length in enumerate(lengths):
        if i > start and (i + 1 - start) * length > most_rows:
            chunks.append(slice(start, i))
            start = i
    return [*chunks, slice(start, len(lengths))]


def _padded_rows(lengths: list[int], chunks: list[slice]) -> int:
    """Token rows the chunks compute: each sample padded to its chunk's longest."""
    return sum((c.stop - c.start) * lengths[c.stop - 1] for c in chunks)


class SuffixEvaluator:
    """Logits of the model under the current head mask and under each one-head-more ablation.

    Works on every model family through its :class:`~hydra_core.models.family.ModelFamily`, and
    only through it. The MLP fold applies where the family describes its blocks' parts
    (``pre_norm_parts``, ``post_norm_parts``).

    Args:
        model: a supported model in eval mode (never modified).
        inputs: (S, ...) model inputs (preprocessed images, packed token ids), ID and OOD
            together, on the model's device.
        pairs_per_pass: (candidate, sample) pairs per batched pass; None sizes the passes for
            the CPU (:func:`cpu_rows_per_pass` token rows).
    """

    def __init__(
        self, model: nn.Module, inputs: torch.Tensor, *, pairs_per_pass: int | None = None
    ) -> None:
        self.model = model
        self.family = family = family_of(model)
        if family.towers(model):
            raise ValueError(
                f"{type(model).__name__} holds its heads in several towers: score its candidates "
                "with hydra_core.analysis._towers.TowersEvaluator (one of these per tower)"
            )
        self.layout = family.layout(model)
        self.blocks = list(family.blocks(model))
        self.last_layer = len(self.blocks) - 1
        self.cls_only = family.class_token_pooling(model)
        inputs = family.prepare(model, inputs)
        # Samples in the family's order (text: by length, so that each pass is cut to its
        # longest sample); every logits tensor handed out is put back into the caller's order.
        self.order = family.sample_order(inputs)
        self.inverse = None
        if self.order is not None:
            self.order = self.order.to(inputs.device)
            inputs = inputs[self.order]
            self.inverse = self.order.argsort()
        self.device = inputs.device
        self.num_samples = len(inputs)
        self.kept = [list(range(n)) for n in self.layout.num_heads]  # original head indices kept
        # Each block with its removed heads cut out (the block itself while it keeps them all).
        self.views: list[nn.Module] = list(self.blocks)
        dk, d = self.layout.head_dim, self.layout.embed_dim
        # Each head's W_O column block, transposed: (H, d_k, d), so that Z_h @ head_out[h] is the
        # head's share of the projected attention output.
        self.head_out = [
            family.output_projection(b).weight.detach().reshape(d, n, dk).permute(1, 2, 0)
            for b, n in zip(self.blocks, self.layout.num_heads, strict=True)
        ]
        self.head_out = [w.contiguous() for w in self.head_out]
        self.folds = [
            _mlp_fold(family, b, w) for b, w in zip(self.blocks, self.head_out, strict=True)
        ]
        self.tokens = family.embed(model, inputs[:1])[0].shape[1]
        lengths = family.sample_lengths(inputs)  # ascending, as ordered above
        self.lengths = [self.tokens] * self.num_samples if lengths is None else lengths.tolist()
        # Token rows per pass through full blocks, and as many (candidate, sample) pairs per pass
        # through the last block's CLS row alone (one row each).
        self.rows = cpu_rows_per_pass() if pairs_per_pass is None else pairs_per_pass * self.tokens
        self.pairs_cls = self.rows
        self._full_passes: dict[int, tuple[list[slice], int]] = {}
        self.chunks = _length_chunks(self.lengths, self.rows)
        # The stream entering each layer (S, N, d) under the current mask, and the logits (S, K);
        # the family's context of all S samples (None for images).
        embedded = [family.embed(model, inputs[c]) for c in self.chunks]
        self.xs: list[torch.Tensor] = [torch.cat([x for x, _ in embedded])]
        self.context = family.concat_contexts([context for _, context in embedded])
        self.xs += [torch.empty(0)] * self.last_layer
        self.logits = torch.empty(0)
        self._refresh(0)

    # --- the current mask -------------------------------------------------------------------

    def set_removed(self, heads: list[tuple[int, int]]) -> None:
        """Switch off ``heads`` (layer, head) permanently, all at once (used when resuming)."""
        if not heads:
            return
        for layer, head in heads:
            self.kept[layer].remove(head)
        for layer in {layer for layer, _ in heads}:
            self._rebuild_view(layer)
        self._refresh(min(layer for layer, _ in heads))

    def remove(self, layer: int, head: int) -> torch.Tensor:
        """Switch off one more head permanently; returns the new logits (S, K)."""
        self.kept[layer].remove(head)
        self._rebuild_view(layer)
        self._refresh(layer)
        return self.logits

    def _rebuild_view(self, layer: int) -> None:
        block = self.blocks[layer]
        kept = self.kept[layer]
        if len(kept) == self.layout.num_heads[layer]:
            self.views[layer] = block
            return
        self.views[layer] = self.family.prune_block(block, torch.tensor(kept, dtype=torch.long))

    def _refresh(self, start: int) -> None:
        """Recompute the streams after layer ``start`` and the logits."""
        for layer in range(start, self.last_layer + 1):
            outputs = []
            for c in self.chunks:
                x, context = self.family.trim(self.xs[layer][c], self._context(c))
                out = self._layer(layer, x, context)
                if layer == self.last_layer:
                    out = self.family.classify(self.model, out, context)
                elif out.shape[1] < self.xs[layer].shape[1]:  # padding columns come back
                    out = F.pad(out, (0, 0, 0, self.xs[layer].shape[1] - out.shape[1]))
                outputs.append(out)
            if layer < self.last_layer:
                self.xs[layer + 1] = torch.cat(outputs)
            else:
                self.logits = self._caller_order(torch.cat(outputs))

    def _context(self, samples: slice) -> object:
        return self.family.select_context(self.context, samples)

    def _caller_order(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits (..., S, K) of the samples in this evaluator's order -> in the caller's."""
        return logits if self.inverse is None else logits.index_select(-2, self.inverse)

    # --- one block --------------------------------------------------------------------------

    def _query_rows(self, layer: int) -> slice | None:
        return slice(0, 1) if self.cls_only and layer == self.last_layer else None

    def _heads(self, layer: int, x: torch.Tensor, context: object) -> torch.Tensor:
        """(B, N, d) stream -> (B, Nq, Hk, d_k): the kept heads' outputs (the family computes a
        class-token-only query row its own fastest way)."""
        return self.family.block_heads(self.views[layer], x, context, self._query_rows(layer))

    def _project(self, layer: int, z: torch.Tensor) -> torch.Tensor:
        """(B, Nq, Hk, d_k) -> (B, Nq, d); a layer without heads adds only W_O's bias."""
        view = self.views[layer]
        if z.shape[2] == 0:
            return self.family.output_projection(view)(z.new_zeros(*z.shape[:2], 0))
        return self.family.attention_projection(view, z)

    def _layer(self, layer: int, x: torch.Tensor, context: object) -> torch.Tensor:
        """One block on (B, N, d) -> (B, Nq, d)."""
        rows = self._query_rows(layer)
        attn = self._project(layer, self._heads(layer, x, context))
        return self.family.block_rest(self.views[layer], x if rows is None else x[:, rows], attn)

    def _suffix(self, start: int, x: torch.Tensor, context: object) -> torch.Tensor:
        """Run blocks ``start``.. on (B, N, d) and classify: (B, K)."""
        for layer in range(start, self.last_layer + 1):
            x = self._layer(layer, x, context)
        return self.family.classify(self.model, x, context)

    # --- candidates -------------------------------------------------------------------------

    def candidate_logits(
        self,
        should_stop: Callable[[], bool] | None = None,
    ) -> Iterator[tuple[list[tuple[int, int]], torch.Tensor]]:
        """Per layer: (its kept heads, logits (c, S, K) with each of them ablated on its own).

        Raises :class:`Stopped` between passes once ``should_stop()`` is true.
        """
        classes = self.logits.shape[-1]
        for layer, kept in enumerate(self.kept):
            if not kept:
                continue
            chunks, group = self.passes(layer)
            position = torch.arange(len(kept), device=self.device)
            heads = torch.tensor(kept, device=self.device)
            logits = self.logits.new_empty(len(kept), self.num_samples, classes)
            for chunk in chunks:
                shared = self._shared(layer, self.xs[layer][chunk], self._context(chunk))
                for g in range(0, len(kept), group):
                    if should_stop is not None and should_stop():
                        raise Stopped
                    part = slice(g, g + group)
                    logits[part, chunk] = self._candidates_pass(
                        layer, shared, position[part], heads[part]
                    )
            yield [(layer, h) for h in kept], self._caller_order(logits)

    def passes(self, layer: int) -> tuple[list[slice], int]:
        """How ``layer``'s candidates are scored: the chunks of samples, and the heads per pass.

        A pass holds about ``rows`` token rows (heads x samples x the chunk's longest sample).
        Where samples differ in length (text) a chunk is padded to its longest member, so a
        layer takes the fewest heads per pass whose chunks (``rows / heads`` padded rows each)
        waste at most :data:`MAX_PADDING` of their rows: 128 + 128 Rotten Tomatoes / Guardian
        sentences (22 tokens on average, 63 at most) computed 1.9x the rows they use in 8192-row
        passes of one head, 1.1x with twelve heads per pass in 680-row chunks. Equal lengths
        (images) keep one head per pass in chunks of ``rows`` until the samples run out. The
        last block's class-token row alone (one row per sample) is cut by ``pairs_cls`` samples.
        """
        if self._query_rows(layer) is not None:
            chunks = _even_chunks(self.num_samples, self.pairs_cls)
            return chunks, max(1, self.pairs_cls // (chunks[0].stop - chunks[0].start))
        kept = len(self.kept[layer])
        if kept not in self._full_passes:
            used = sum(self.lengths)
            for heads in range(1, kept + 1):
                chunks = _length_chunks(self.lengths, self.rows // heads)
                if _padded_rows(self.lengths, chunks) * (1 - MAX_PADDING) <= used:
                    break
            widest = max((c.stop - c.start) * self.lengths[c.stop - 1] for c in chunks)
            group = max(1, self.rows // widest)
            group = -(-kept // -(-kept // group))  # even passes: 12 heads by 10 -> 6 + 6
            self._full_passes[kept] = chunks, group
        return self._full_passes[kept]

    def _shared(self, layer: int, x: torch.Tensor, context: object) -> _Shared:
        """What every candidate of ``layer`` shares for the samples ``x`` (s, N, d)."""
        x, context = self.family.trim(x, context)
        rows = self._query_rows(layer)
        z = self._heads(layer, x, context)  # (s, Nq, Hk, d_k)
        attn = self._project(layer, z)  # (s, Nq, d)
        x = x if rows is None else x[:, rows]
        fold = self.folds[layer] if rows is None else None
        if len(self.kept[layer]) == 1:
            # Removing the layer's only kept head leaves exactly W_O's bias, as in the plain forward
            # (where e.g. a model without heads gives every sample bit-identical logits).
            bias = self.family.output_projection(self.views[layer]).bias
            bias_only = (
                attn.new_zeros(attn.shape) if bias is None else bias.detach().expand(attn.shape)
            )
            return _LoneHead(z=z, x=x, context=context, bias_only=bias_only)
        if fold is None:
            return _SharedAttention(z=z, x=x, context=context, attn=attn)
        # (s, N, d), the residual after the attention
        mid = x + (attn if fold.post_norm is not None else fold.pre_norm.ls1(attn))
        centred = mid - mid.mean(-1, keepdim=True)
        f = F.linear(centred, fold.w1g)  # (s, N, hidden)
        return _SharedMlpInput(z=z, context=context, mid=mid, f=f, fold=fold)

    def _candidates_pass(
        self, layer: int, shared: _Shared, position: torch.Tensor, heads: torch.Tensor
    ) -> torch.Tensor:
        """Logits (c, s, K) of one chunk of samples with each of c heads of ``layer`` ablated
        (``position``: their indices among the kept heads; ``heads``: their original indices)."""
        z = shared.z.index_select(2, position)  # (s, Nq, c, d_k)
        s, nq, c, dk = z.shape
        z = z.permute(2, 0, 1, 3).reshape(c, s * nq, dk)  # (c, s*Nq, d_k)
        view = self.views[layer]
        if isinstance(shared, _LoneHead):
            x = self.family.block_rest(view, shared.x, shared.bias_only)  # (s, Nq, d), c = 1
        elif isinstance(shared, _SharedAttention):
            delta = torch.bmm(z, self.head_out[layer][heads])  # (c, s*Nq, d): each head's share
            attn = shared.attn.reshape(1, s * nq, -1) - delta
            x = self.family.block_rest(view, shared.x.reshape(1, s * nq, -1), attn)  # (c, s*Nq, d)
        elif shared.fold.post_norm is not None:
            x = self._post_norm_candidates(shared, z, heads)
        else:
            fold = shared.fold
            delta = torch.bmm(z, fold.head_out[heads])  # (c, s*N, d), layer scale included
            u = shared.mid.reshape(1, s * nq, -1) - delta  # the residual without head h
            # the variance written out: var_mean is slow on the CPU
            var = (u - u.mean(-1, keepdim=True)).square_().mean(-1, keepdim=True)  # (c, s*N, 1)
            hidden = torch.baddbmm(
                shared.f.reshape(1, s * nq, -1), z, fold.rank_update[heads], alpha=-1
            )
            hidden = torch.addcmul(hidden, delta.mean(-1, keepdim=True), fold.row_sum)
            # hidden is now W1 gamma centre(u); scaled by 1/std(u) and shifted: fc1(norm2(u))
            hidden = torch.addcmul(fold.bias, hidden, torch.rsqrt(var + fold.eps))
            parts = fold.pre_norm  # dropout is off: the search runs in eval mode
            x = u + parts.ls2(parts.fc2(parts.act(hidden)))
        context = self.family.repeat_context(shared.context, c)
        logits = self._suffix(layer + 1, x.reshape(c * s, nq, -1), context)  # (c*s, K)
        return logits.reshape(c, s, -1)

    @staticmethod
    def _post_norm_candidates(
        shared: _SharedMlpInput, z: torch.Tensor, heads: torch.Tensor
    ) -> torch.Tensor:
        """A post-LN block's output (c, s*N, d) for c candidates, with fc1 as a rank-d_k update:
        u = mid - delta_h, h = norm1(u), out = norm2(h + fc2(act(fc1(h))))."""
        fold, parts = shared.fold, shared.fold.post_norm
        s, n = shared.mid.shape[:2]
        delta = torch.bmm(z, fold.head_out[heads])  # (c, s*N, d)
        u = shared.mid.reshape(1, s * n, -1) - delta
        centred = u - u.mean(-1, keepdim=True)
        rstd = torch.rsqrt(centred.square().mean(-1, keepdim=True) + fold.eps)  # (c, s*N, 1)
        hidden = torch.baddbmm(shared.f.reshape(1, s * n, -1), z, fold.rank_update[heads], alpha=-1)
        hidden = torch.addcmul(hidden, delta.mean(-1, keepdim=True), fold.row_sum)
        hidden = torch.addcmul(fold.bias, hidden, rstd)  # fc1(norm1(u))
        h = centred * rstd  # norm1(u)
        if parts.norm1.weight is not None:
            h = h * parts.norm1.weight
        if parts.norm1.bias is not None:
            h = h + parts.norm1.bias
        return parts.norm2(parts.fc2(parts.act(hidden)) + h)
