"""The Hugging Face text family on tiny random BERT, RoBERTa, MPNet and DistilBERT classifiers:
ragged attention masks and padded batches, the wrapped model, decoders refused (fp32, 1e-5).
Ablation, pruning and the piece-by-piece forward, as every family: test_family_contract.py."""

from __future__ import annotations

import pytest
import torch

from hydra_core.models.adapter import (
    UnsupportedModelError,
    ablate,
    family_of,
    head_layout,
    prune_heads,
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


def test_wrapped_model_prunes_and_ablates_alike(tiny_text):
    ids, mask = text_batch(seed=5)
    keep = random_mask((2, 4), 5)
    wrapped = TextClassifier(tiny_text)
    assert family_of(wrapped) is TEXT
    with ablate(wrapped, keep), torch.no_grad():
        ablated = wrapped(input_ids=ids, attention_mask=mask)
    pruned = prune_heads(wrapped, keep)
    assert isinstance(pruned, TextClassifier)
    with torch.no_grad():
        torch.testing.assert_close(pruned(pack(ids, mask)), ablated, **TOL)


def test_a_decoder_is_refused():
    model = make_tiny_text("bert")
    model.config.is_decoder = True
    with pytest.raises(UnsupportedModelError, match="decoder"):
        head_layout(model)
