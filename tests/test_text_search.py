"""The analyses on text models: the fast greedy search against the plain one on tiny BERT-family
classifiers (ragged, padded batches), for every objective, and the inputs they accept."""

from __future__ import annotations

import pytest
import torch

from hydra_core.analysis import _suffix
from hydra_core.analysis.greedy import greedy_circuit
from hydra_core.models.text import TextClassifier, pack
from tests.conftest import make_tiny_text, text_batch
from tests.test_greedy import assert_same_search


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


@pytest.mark.parametrize("kind", ["roberta", "distilbert"])
def test_fast_equals_plain_full_budget(kind):
    model = make_tiny_text(kind).double()
    id_x, id_y, ood_x = text_data(seed=1)
    runs = [
        greedy_circuit(model, id_x, id_y, ood_x, objective="avg", budget=8, method=m)
        for m in ("fast", "plain")
    ]
    assert_same_search(*runs)
    assert runs[0].keep_mask().sum() == 0


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
