"""The analyses on text models: the fast greedy search against the plain one on tiny BERT-family
classifiers (ragged, padded batches), for every objective, and the inputs they accept."""

from __future__ import annotations

import pytest
import torch

from hydra_core.analysis import _suffix
from hydra_core.analysis.greedy import greedy_circuit
from hydra_core.models.text import TextClassifier, pack
from tests.analysis.test_greedy import assert_same_search
from tests.conftest import make_tiny_text, text_batch


def text_data(seed: int = 0, n: int = 24):
    ids, mask = text_batch(seed=seed, batch=n, tokens=10)
    ood_ids, ood_mask = text_batch(seed=seed + 100, batch=n, tokens=14)  # longer: padded to 14
    labels = torch.arange(n) % 3
    return pack(ids, mask), labels, pack(ood_ids, ood_mask)


@pytest.fixture
def small_passes(monkeypatch):
    """Fast-path passes of a few samples: ragged chunks, many passes."""
    monkeypatch.setattr(_suffix, "CPU_ROWS_PER_PASS", 5 * 14)
    monkeypatch.setattr(_suffix, "CPU_ROWS_PER_PASS_THREADED", 5 * 14)


@pytest.mark.parametrize("objective", ["acc", "ood", "avg"])
@pytest.mark.parametrize("kind", ["bert", "mpnet"])
def test_fast_equals_plain_on_text(kind, objective, small_passes):
    model = make_tiny_text(kind, depth=3).double()
    id_x, id_y, ood_x = text_data()
    modules = list(model.modules())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    runs = [
        greedy_circuit(model, id_x, id_y, ood_x, objective=objective, budget=11, method=m)
        for m in ("fast", "plain")
    ]
    assert_same_search(*runs)
    assert runs[0].steps == 11
    assert list(model.modules()) == modules  # no part of the model was replaced
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_inputs_in_every_form_give_the_same_search():
    model = make_tiny_text("bert")
    id_x, id_y, ood_x = text_data(seed=2)
    reference = greedy_circuit(model, id_x, id_y, ood_x, objective="avg", budget=3)
    as_pairs = greedy_circuit(
        TextClassifier(model),
        (id_x[:, 0], id_x[:, 1]),
        id_y,
        {"input_ids": ood_x[:, 0], "attention_mask": ood_x[:, 1]},
        objective="avg",
        budget=3,
    )
    assert as_pairs.order == reference.order
    with pytest.raises(TypeError, match="id_x must be token ids"):
        greedy_circuit(model, id_x.float(), id_y, ood_x, objective="avg", budget=3)


def test_passes_cut_ragged_text_into_chunks_of_little_padding(monkeypatch):
    """Samples of very different lengths: every layer's passes cover all samples once, in order,
    stay within the pass's rows, waste at most MAX_PADDING of them (or take every head per
    pass), and the scores equal those of passes that ignore lengths."""
    monkeypatch.setattr(_suffix, "CPU_ROWS_PER_PASS", 96)
    monkeypatch.setattr(_suffix, "CPU_ROWS_PER_PASS_THREADED", 96)
    model = make_tiny_text("bert", depth=3).double()
    ids, mask = text_batch(seed=3, batch=40, tokens=16)
    inputs = pack(ids, mask)
    evaluator = _suffix.SuffixEvaluator(model, inputs)
    lengths = evaluator.lengths
    assert lengths == sorted(int(m.nonzero().max()) + 1 for m in mask)
    for layer in range(2):  # the last block's class-token row is cut by samples alone
        chunks, heads = evaluator.passes(layer)
        assert [c.start for c in chunks] == [0] + [c.stop for c in chunks[:-1]]
        assert chunks[-1].stop == len(lengths)
        widest = max((c.stop - c.start) * lengths[c.stop - 1] for c in chunks)
        assert heads * widest <= 96
        padded = _suffix._padded_rows(lengths, chunks)
        assert padded * (1 - _suffix.MAX_PADDING) <= sum(lengths)  # here within reach
    fast = [logits for _, logits in evaluator.candidate_logits()]
    monkeypatch.setattr(_suffix, "MAX_PADDING", 1.0)  # one head per pass, chunks of 96 rows
    plain = _suffix.SuffixEvaluator(model, inputs)
    assert plain.passes(0) != evaluator.passes(0)
    for a, b in zip(fast, [logits for _, logits in plain.candidate_logits()], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_equal_lengths_keep_one_head_per_pass():
    """Images (and text of one length) are cut as before: even chunks of whole passes."""
    model = make_tiny_text("bert", depth=2)
    ids = torch.randint(3, 60, (30, 8))
    evaluator = _suffix.SuffixEvaluator(model, pack(ids), pairs_per_pass=7)
    chunks, heads = evaluator.passes(0)
    assert [c.stop - c.start for c in chunks] == [6, 6, 6, 6, 6] and heads == 1
    assert evaluator.lengths == [8] * 30
