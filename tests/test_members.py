"""Member strategies checked against the building blocks they are made of, and member overlap."""

from __future__ import annotations

import pytest
import torch

from hydra_core.analysis.cahp import cahp_select
from hydra_core.analysis.greedy import greedy_circuit
from hydra_core.analysis.inputs import SearchInputs
from hydra_core.analysis.taylor import taylor_global_ranking, taylor_prune, taylor_scores
from hydra_core.cache import DiskCache
from hydra_core.hydra.members import build_member_masks, member_overlap
from hydra_core.masks import (
    MemberMask,
    mask_from_ranking,
    model_identity,
    save_masks,
    seed_sampled_masks,
)
from hydra_core.models.adapter import head_layout
from tests.conftest import make_tiny_vit


@pytest.fixture(scope="module")
def model():
    return make_tiny_vit(depth=3, num_heads=4)  # 12 heads


@pytest.fixture(scope="module")
def inputs() -> SearchInputs:
    g = torch.Generator().manual_seed(3)
    id_x = torch.randn(20, 1, 16, 16, generator=g)
    ood_x = 2.0 * torch.rand(20, 1, 16, 16, generator=g)
    return SearchInputs(id_x, torch.arange(5).repeat(4), ood_x, {"ood": ood_x})


def test_seed_sampling_over_the_greedy_ranking(model, inputs, tmp_path):
    cache = DiskCache(tmp_path)
    members = build_member_masks(
        "seed-sampling",
        model=model,
        inputs=inputs,
        m=3,
        budget=4,
        pool=8,
        seeds=(5, 6, 7),
        cache=cache,
    )
    ranking = greedy_circuit(
        model, inputs.id_x, inputs.id_y, inputs.ood_x, objective="avg", budget=4
    ).ranking()
    expected = seed_sampled_masks(
        ranking, prune=4, pool=8, seeds=[5, 6, 7], layout=head_layout(model)
    )
    for member, keep in zip(members, expected, strict=True):
        assert torch.equal(member.keep, keep)
        assert member.kept == 12 - 4
    assert [m.name for m in members] == ["CircAvg seed 5", "CircAvg seed 6", "CircAvg seed 7"]
    # the 4 most useful heads (never in the pool of 8) are kept by every member
    for layer, head in ranking[8:]:
        assert all(m.keep[layer, head] for m in members)
    assert any((cache.root / "greedy").iterdir())  # the search was cached


def test_circuit_and_identical_circuit(model, inputs):
    ranking = greedy_circuit(
        model, inputs.id_x, inputs.id_y, inputs.ood_x, objective="ood", budget=3
    ).ranking()
    (circuit,) = build_member_masks(
        "circuit", model=model, inputs=inputs, m=1, budget=3, objective="ood"
    )
    assert circuit.name == "CircOOD-3"
    assert torch.equal(circuit.keep, mask_from_ranking(ranking, 3, head_layout(model)))
    with pytest.raises(ValueError, match="identical-circuit"):
        build_member_masks("circuit", model=model, inputs=inputs, m=3, budget=3, ranking=ranking)
    copies = build_member_masks(
        "identical-circuit", model=model, inputs=inputs, m=3, budget=3, ranking=ranking
    )
    assert len(copies) == 3 and all(torch.equal(c.keep, circuit.keep) for c in copies)
    assert len({c.name for c in copies}) == 3


def test_taylor_members(model, inputs):
    (single,) = build_member_masks("taylor", model=model, inputs=inputs, m=1, budget=3)
    expected = taylor_prune(model, inputs.id_x, inputs.id_y, heads_to_prune_per_layer=1)
    assert torch.equal(single.keep, expected.keep)
    assert single.keep.sum(1).tolist() == [3, 3, 3]
    with pytest.raises(ValueError, match="does not split evenly"):
        build_member_masks("taylor", model=model, inputs=inputs, m=1, budget=4)
    (uneven,) = build_member_masks("taylor", model=model, inputs=inputs, m=1, per_layer=[2, 1, 0])
    assert uneven.keep.sum(1).tolist() == [2, 3, 4]

    members = build_member_masks("taylor", model=model, inputs=inputs, m=2, budget=3, pool=6)
    ranking = taylor_global_ranking(taylor_scores(model, inputs.id_x, inputs.id_y))
    expected = seed_sampled_masks(ranking, prune=3, pool=6, seeds=[0, 1], layout=head_layout(model))
    assert [m.name for m in members] == ["Taylor seed 0", "Taylor seed 1"]
    assert all(torch.equal(m.keep, k) for m, k in zip(members, expected, strict=True))


def test_cahp_members_use_one_seed_each(model, inputs):
    grid = [2, 4, 6, 8, 10, 12]
    members = build_member_masks(
        "cahp",
        model=model,
        inputs=inputs,
        m=2,
        seeds=(0, 1),
        cahp_k_grid=grid,
        allow_identical=True,
    )
    for member, seed in zip(members, (0, 1), strict=True):
        expected = cahp_select(model, inputs.id_x, inputs.id_y, k_grid=grid, seed=seed)
        assert torch.equal(member.keep, expected.keep)
        assert member.name == f"CAHP seed {seed}"


def test_file_and_manual_members(model, tmp_path):
    layout = head_layout(model)
    a, b = layout.all_kept(), layout.all_kept()
    a[0, 0] = False
    b[2, 3] = False
    identity = model_identity("tiny", layout, "abc")
    path = save_masks(
        tmp_path / "m.json", [MemberMask("a", "x", a), MemberMask("b", "y", b)], identity
    )
    members = build_member_masks("file", model=model, m=None, path=path, identity=identity)
    assert [m.name for m in members] == ["a", "b"] and torch.equal(members[1].keep, b)
    with pytest.raises(ValueError, match="holds 2 members, but m=3"):
        build_member_masks("file", model=model, m=3, path=path)

    manual = build_member_masks("manual", model=model, m=2, masks=[a, b], names=["left", "right"])
    assert [m.name for m in manual] == ["left", "right"]
    with pytest.raises(ValueError, match="'member 0' = 'member 1'.*allow_identical"):
        build_member_masks("manual", model=model, m=2, masks=[a, a.clone()])
    same = build_member_masks(
        "manual", model=model, m=2, masks=[a, a.clone()], allow_identical=True
    )
    assert torch.equal(same[0].keep, same[1].keep)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(strategy="bagging"), "unknown member strategy"),
        (dict(strategy="seed-sampling", budget=4, seeds=(1, 1, 2)), "seeds must differ"),
        (dict(strategy="seed-sampling", budget=4, seeds=(1, 2)), "2 seeds were given for m=3"),
        (dict(strategy="seed-sampling"), "budget= .* is required"),
        (dict(strategy="seed-sampling", budget=12), "budget must be between 1 and 11"),
        (dict(strategy="seed-sampling", budget=4, ranking_source="random"), "ranking_source"),
        (dict(strategy="cahp", inputs=None), "scores heads on search data"),
        (dict(strategy="manual", masks=[torch.ones(2, 4, dtype=torch.bool)] * 3), "expected shape"),
    ],
)
def test_bad_requests_are_explained(model, inputs, kwargs, match):
    kwargs = {"inputs": inputs, "m": 3, **kwargs}
    with pytest.raises(ValueError, match=match):
        build_member_masks(kwargs.pop("strategy"), model=model, **kwargs)


def test_member_overlap_numbers():
    a = torch.tensor([[True, True, False], [True, False, False]])  # kept: 3 heads
    b = torch.tensor([[True, False, True], [True, False, False]])  # shares 2 with a, union 4
    c = torch.tensor([[False, False, True], [False, True, True]])  # none shared with a, 1 with b
    overlap = member_overlap([MemberMask(n, "", k) for n, k in zip("abc", (a, b, c), strict=True)])
    jaccard = overlap["jaccard"]
    assert jaccard.loc["a", "b"] == pytest.approx(2 / 4)
    assert jaccard.loc["a", "c"] == pytest.approx(0.0)
    assert jaccard.loc["b", "c"] == pytest.approx(1 / 5)
    assert overlap["mean_pairwise_jaccard"] == pytest.approx((0.5 + 0.0 + 0.2) / 3)
    assert overlap["per_layer"].loc["total"].tolist() == [3, 3, 3]
    assert overlap["per_layer"].loc["layer 1"].tolist() == [1, 1, 2]
    assert overlap["kept_by_all"] == [] and len(overlap["kept_by_any"]) == 6
    assert overlap["identical_pairs"] == []
    twins = member_overlap([MemberMask("a", "", a), MemberMask("a2", "", a)])
    assert twins["identical_pairs"] == [("a", "a2")] and twins["mean_pairwise_jaccard"] == 1.0
