"""Taylor importance against a hand-written autograd reference; layer-by-layer Taylor pruning."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hydra_core.analysis import taylor
from hydra_core.analysis.taylor import (
    TAYLOR_CACHE_KIND,
    TAYLOR_VERSION,
    taylor_global_ranking,
    taylor_prune,
    taylor_scores,
)
from hydra_core.cache import DiskCache, cache_key, model_fingerprint
from hydra_core.models.adapter import ablate, head_layout, prune_heads
from tests.conftest import make_tiny_vit


@pytest.fixture(scope="module")
def model():
    return make_tiny_vit(depth=2)


@pytest.fixture(scope="module")
def data():
    x = torch.randn(20, 1, 16, 16, generator=torch.Generator().manual_seed(3))
    return x, torch.arange(20) % 5


def reference_scores(model, x, y, keep=None) -> torch.Tensor:
    """Paper D.1.1 written out: one full-data mean loss, a loop over heads slicing W_q, W_k, W_v."""
    layout = head_layout(model)
    weights = [block.attn.qkv.weight for block in model.blocks]
    for w in weights:
        w.requires_grad_(True)
    if keep is None:
        loss = F.cross_entropy(model(x), y)
    else:
        with ablate(model, keep):
            loss = F.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, weights)
    dh, d = layout.head_dim, layout.embed_dim
    width = layout.num_heads[0] * dh
    scores = torch.empty(layout.shape)
    for layer, (w, g) in enumerate(zip(weights, grads, strict=True)):
        for head in range(layout.num_heads[layer]):
            parts = []
            for part in range(3):  # q, k, v thirds of the fused qkv weight
                rows = slice(part * width + head * dh, part * width + (head + 1) * dh)
                parts.append((w[rows] * g[rows]).abs().sum() / (dh * d))
            scores[layer, head] = sum(parts) / 3
    return scores.detach()


def test_scores_equal_autograd_reference_and_leave_no_trace(model, data):
    x, y = data
    frozen = model.blocks[0].mlp.fc1.weight
    frozen.requires_grad_(False)
    try:
        scores = taylor_scores(model, x, y, batch_size=7)  # 3 uneven batches: accumulation is exact
        assert all(p.grad is None for p in model.parameters())
        assert not frozen.requires_grad
        assert all(p.requires_grad for p in model.parameters() if p is not frozen)
        assert not model.training
    finally:
        frozen.requires_grad_(True)
    expected = reference_scores(model, x, y)
    torch.testing.assert_close(scores, expected, rtol=1e-4, atol=1e-10)


def test_ablated_heads_score_nan_and_equal_structural_removal(model, data):
    x, y = data
    keep = torch.tensor([[True, False, True, True], [False, True, True, False]])
    scores = taylor_scores(model, x, y, keep=keep, batch_size=64)
    assert torch.isnan(scores[~keep]).all() and torch.isfinite(scores[keep]).all()
    expected = reference_scores(model, x, y, keep)[keep]
    torch.testing.assert_close(scores[keep], expected, rtol=1e-4, atol=1e-10)
    # The same heads, cut out structurally: same gradients, same scores (rows renumbered).
    pruned = taylor_scores(prune_heads(model, keep), x, y, batch_size=64)
    torch.testing.assert_close(pruned[torch.isfinite(pruned)], scores[keep], rtol=1e-4, atol=1e-10)


def test_prune_recomputes_after_each_layer(model, data):
    x, y = data
    result = taylor_prune(model, x, y, heads_to_prune_per_layer=[1, 2], batch_size=64)
    assert result.keep.sum(dim=1).tolist() == [3, 2]
    assert result.layer_order == [0, 1]
    first = taylor_scores(model, x, y, batch_size=64)
    assert result.pruned[0] == (0, int(first[0].argmin()))
    torch.testing.assert_close(result.scores[0], first[0])
    after_first = torch.ones(2, 4, dtype=torch.bool)
    after_first[result.pruned[0]] = False
    second = taylor_scores(model, x, y, keep=after_first, batch_size=64)
    torch.testing.assert_close(result.scores[1], second[1])
    lowest_two = sorted(range(4), key=lambda h: second[1, h].item())[:2]
    assert result.pruned[1:] == [(1, h) for h in lowest_two]
    assert (~result.keep).nonzero().tolist() == sorted(list(h) for h in result.pruned)


def test_prune_rejects_bad_budgets(model, data):
    x, y = data
    with pytest.raises(ValueError, match="model has 2 layers"):
        taylor_prune(model, x, y, heads_to_prune_per_layer=[1, 1, 1])
    with pytest.raises(ValueError, match="cannot prune 5 heads of layer 0, which has 4"):
        taylor_prune(model, x, y, heads_to_prune_per_layer=5)


def test_global_ranking_lowest_first_without_nan():
    scores = torch.tensor([[0.3, float("nan")], [0.1, 0.3]])
    assert taylor_global_ranking(scores) == [(1, 0), (0, 0), (1, 1)]


def test_a_layer_without_heads_scores_nan(model, data):
    x, y = data
    keep = torch.tensor([[False] * 4, [True, False, True, True]])
    scores = taylor_scores(prune_heads(model, keep), x, y, batch_size=64)
    assert torch.isnan(scores[0]).all()
    expected = taylor_scores(model, x, y, keep=keep, batch_size=64)[keep]
    torch.testing.assert_close(scores[1, :3], expected, rtol=1e-4, atol=1e-10)


def test_cache_serves_a_second_call_and_keys_by_weights_samples_and_mask(
    model, data, tmp_path, monkeypatch
):
    x, y = data
    cache = DiskCache(tmp_path)
    computed = []
    real = taylor._scores

    def counting(*args):
        computed.append(1)
        return real(*args)

    monkeypatch.setattr(taylor, "_scores", counting)
    first = taylor_scores(model, x, y, batch_size=64, cache=cache)
    again = taylor_scores(model, x, y, batch_size=7, cache=cache)  # batch size is not in the key
    assert len(computed) == 1 and torch.equal(first, again)
    torch.testing.assert_close(first, taylor_scores(model, x, y, batch_size=64))
    # the key the app used before the cache moved into taylor_scores: old entries stay valid
    old_key = cache_key(TAYLOR_VERSION, model_fingerprint(model), x, y)
    assert cache.path(TAYLOR_CACHE_KIND, old_key).exists()

    keep = torch.ones(2, 4, dtype=torch.bool)
    keep[0, 1] = False
    masked = taylor_scores(model, x, y, keep=keep, cache=cache)
    assert len(computed) == 3 and torch.isnan(masked[0, 1])
    cached = taylor_scores(model, x, y, keep=keep, cache=cache)
    torch.testing.assert_close(cached, masked, rtol=0, atol=0, equal_nan=True)
    taylor_scores(model, x[:10], y[:10], cache=cache)
    assert len(computed) == 4
    assert len(list((tmp_path / TAYLOR_CACHE_KIND).glob("*.pt"))) == 3
