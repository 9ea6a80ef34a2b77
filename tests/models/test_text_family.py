"""The Hugging Face text family: ablation, pruning and the piece-by-piece forward against the
models' own forward, on tiny random BERT, RoBERTa, MPNet and DistilBERT classifiers, with ragged
attention masks and padded batches (fp32, 1e-5)."""

from __future__ import annotations

import pytest
import torch

from hydra_core.models.adapter import (
    UnsupportedModelError,
    ablate,
    family_of,
    head_layout,
    prune_heads,
    record_head_outputs,
    run_blocks,
)
from hydra_core.models.text import TEXT, TextClassifier, pack
from tests.conftest import TEXT_KINDS, make_tiny_text, random_mask, text_batch

TOL = dict(rtol=0, atol=1e-5)


@pytest.fixture(params=TEXT_KINDS)
def tiny_text(request):
    return make_tiny_text(request.param)


def logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


def test_layout_and_family(tiny_text):
    assert family_of(tiny_text) is TEXT
    assert family_of(TextClassifier(tiny_text)) is TEXT
    layout = head_layout(tiny_text)
    assert layout.num_heads == (4, 4) and layout.head_dim == 6 and layout.embed_dim == 24


def test_pieces_rebuild_the_forward(tiny_text):
    ids, mask = text_batch()
    inputs = pack(ids, mask)
    x, context = TEXT.embed(tiny_text, inputs)
    for block in TEXT.blocks(tiny_text):
        z = TEXT.block_heads(block, x, context)
        x = TEXT.block_rest(block, x, TEXT.attention_projection(block, z))
    torch.testing.assert_close(
        TEXT.classify(tiny_text, x, context), logits(tiny_text, ids, mask), **TOL
    )
    # the whole blocks too, and the class-token-only query in the last block
    torch.testing.assert_close(
        TEXT.classify(tiny_text, run_blocks(tiny_text, inputs), context),
        logits(tiny_text, ids, mask),
        **TOL,
    )


def test_class_token_query_alone(tiny_text):
    ids, mask = text_batch(seed=3)
    x, context = TEXT.embed(tiny_text, pack(ids, mask))
    block = TEXT.blocks(tiny_text)[0]
    full = TEXT.block_heads(block, x, context)
    torch.testing.assert_close(TEXT.block_heads(block, x, context, slice(0, 1)), full[:, :1], **TOL)


def test_padding_never_changes_a_result(tiny_text):
    ids, mask = text_batch(seed=2)
    extra = torch.ones(len(ids), 7, dtype=ids.dtype)  # more padding columns, id 1
    padded_ids = torch.cat([ids, extra], 1)
    padded_mask = torch.cat([mask, torch.zeros_like(extra)], 1)
    torch.testing.assert_close(
        logits(tiny_text, padded_ids, padded_mask), logits(tiny_text, ids, mask), **TOL
    )
    # one sample alone gives what it gives in a padded batch
    alone = logits(tiny_text, ids[1:2, : int(mask[1].sum())], mask[1:2, : int(mask[1].sum())])
    torch.testing.assert_close(alone, logits(tiny_text, ids, mask)[1:2], **TOL)
    wrapped = TextClassifier(tiny_text)
    with torch.no_grad():
        torch.testing.assert_close(
            wrapped(pack(padded_ids, padded_mask)), logits(tiny_text, ids, mask), **TOL
        )


def _manual_ablation(model, keep, ids, mask):
    """Ablation the plain way: W_O's columns of the switched-off heads set to zero."""
    import copy

    plain = copy.deepcopy(model)
    layout = head_layout(plain)
    for layer, block in enumerate(TEXT.blocks(plain)):
        weight = TEXT.output_projection(block).weight
        for head in range(layout.num_heads[layer]):
            if not keep[layer, head]:
                with torch.no_grad():
                    weight[:, head * layout.head_dim : (head + 1) * layout.head_dim] = 0
    return logits(plain, ids, mask)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ablate_equals_zeroing_wo_columns_and_leaves_model_untouched(tiny_text, seed):
    ids, mask = text_batch(seed=seed)
    keep = random_mask((2, 4), seed)
    keep[1, 0] = True
    before = {k: v.clone() for k, v in tiny_text.state_dict().items()}
    dense = logits(tiny_text, ids, mask)
    with ablate(tiny_text, keep):
        ablated = logits(tiny_text, ids, mask)
    torch.testing.assert_close(ablated, _manual_ablation(tiny_text, keep, ids, mask), **TOL)
    assert not torch.allclose(ablated, dense)
    torch.testing.assert_close(logits(tiny_text, ids, mask), dense, rtol=0, atol=0)
    for name, value in tiny_text.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_prune_heads_equals_ablation(tiny_text, seed):
    ids, mask = text_batch(seed=seed)
    keep = random_mask((2, 4), seed, p_keep=0.5)
    if seed == 3:
        keep[0] = False  # a layer without heads
    with ablate(tiny_text, keep):
        ablated = logits(tiny_text, ids, mask)
    pruned = prune_heads(tiny_text, keep)
    assert type(pruned) is type(tiny_text)
    assert head_layout(pruned).num_heads == tuple(int(k.sum()) for k in keep)
    torch.testing.assert_close(logits(pruned, ids, mask), ablated, **TOL)
    # the pruned model's pieces and a further pruning agree too
    x, context = TEXT.embed(pruned, pack(ids, mask))
    for block in TEXT.blocks(pruned):
        x = TEXT.block_rest(
            block, x, TEXT.attention_projection(block, TEXT.block_heads(block, x, context))
        )
    torch.testing.assert_close(TEXT.classify(pruned, x, context), ablated, **TOL)
    layout = head_layout(pruned)
    again = layout.all_kept()
    for layer, n in enumerate(layout.num_heads):
        if n > 1:
            again[layer, 0] = False
    twice = prune_heads(pruned, again)
    with ablate(pruned, again):
        torch.testing.assert_close(logits(twice, ids, mask), logits(pruned, ids, mask), **TOL)


def test_wrapped_model_prunes_and_ablates_alike(tiny_text):
    ids, mask = text_batch(seed=5)
    keep = random_mask((2, 4), 5)
    wrapped = TextClassifier(tiny_text)
    with ablate(wrapped, keep), torch.no_grad():
        ablated = wrapped(input_ids=ids, attention_mask=mask)
    pruned = prune_heads(wrapped, keep)
    assert isinstance(pruned, TextClassifier)
    with torch.no_grad():
        torch.testing.assert_close(pruned(pack(ids, mask)), ablated, **TOL)


def test_recorded_head_outputs_match_block_heads(tiny_text):
    ids, mask = text_batch(seed=4)
    x, context = TEXT.embed(tiny_text, pack(ids, mask))
    with record_head_outputs(tiny_text, [0, 1]) as store:
        logits(tiny_text, ids, mask)
    for layer, block in enumerate(TEXT.blocks(tiny_text)):
        z = TEXT.block_heads(block, x, context)
        torch.testing.assert_close(store[layer][0], z[:, 0], **TOL)
        x = TEXT.block_rest(block, x, TEXT.attention_projection(block, z))


def test_a_decoder_is_refused():
    model = make_tiny_text("bert")
    model.config.is_decoder = True
    with pytest.raises(UnsupportedModelError, match="decoder"):
        head_layout(model)
