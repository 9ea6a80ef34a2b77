"""Member strategies checked against the building blocks they are made of, and member overlap."""

from __future__ import annotations

import pytest
import torch

from hydra_core.analysis.cahp import cahp_select
from hydra_core.analysis.greedy import greedy_circuit
from hydra_core.analysis.inputs import SearchInputs
from hydra_core.analysis.taylor import taylor_global_ranking, taylor_prune, taylor_scores
from hydra_core.cache import DiskCache
from hydra_core.hydra.members import (
    CIRCUIT_NAMES,
    TAYLOR_NAME,
    cahp_members,
    check_members,
    circuit_member,
    greedy_ranking,
    identical_members,
    manual_members,
    member_overlap,
    member_seeds,
    seed_sampled_members,
    taylor_member,
    taylor_ranking,
)
from hydra_core.masks import MemberMask, mask_from_ranking, seed_sampled_masks
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
    layout = head_layout(model)
    ranking = greedy_ranking(model, inputs, objective="avg", budget=4, cache=cache)
    assert any((cache.root / "greedy").iterdir())  # the search was cached
    expected_ranking = greedy_circuit(
        model, inputs.id_x, inputs.id_y, inputs.ood_x, objective="avg", budget=4
    ).ranking()
    assert ranking == expected_ranking
    members = seed_sampled_members(
        ranking, layout, budget=4, pool=8, seeds=(5, 6, 7), ranking_name=CIRCUIT_NAMES["avg"]
    )
    expected = seed_sampled_masks(ranking, prune=4, pool=8, seeds=[5, 6, 7], layout=layout)
    for member, keep in zip(members, expected, strict=True):
        assert torch.equal(member.keep, keep)
        assert member.kept == 12 - 4
    assert [m.name for m in members] == ["CircAvg seed 5", "CircAvg seed 6", "CircAvg seed 7"]
    # the 4 most useful heads (never in the pool of 8) are kept by every member
    for layer, head in ranking[8:]:
        assert all(m.keep[layer, head] for m in members)
    # the default pool is twice the budget
    default = seed_sampled_members(ranking, layout, budget=4, seeds=[5], ranking_name="CircAvg")
    assert "4 of the 8 least useful heads (CircAvg ranking)" in default[0].source
    assert torch.equal(default[0].keep, expected[0])


def test_circuit_member_takes_its_ranking_name(model, inputs):
    layout = head_layout(model)
    ranking = greedy_circuit(
        model, inputs.id_x, inputs.id_y, inputs.ood_x, objective="ood", budget=3
    ).ranking()
    circuit = circuit_member(ranking, layout, budget=3, ranking_name=CIRCUIT_NAMES["ood"])
    assert circuit.name == "CircOOD-3"
    assert circuit.source == "3 least useful heads of the CircOOD ranking removed"
    assert torch.equal(circuit.keep, mask_from_ranking(ranking, 3, layout))
    taylor = circuit_member(
        taylor_ranking(model, inputs), layout, budget=5, ranking_name=TAYLOR_NAME
    )
    assert taylor.name == "Taylor-5" and taylor.kept == 12 - 5


def test_identical_members_copy_one_circuit(model, inputs):
    layout = head_layout(model)
    ranking = greedy_ranking(model, inputs, objective="ood", budget=3)
    circuit = circuit_member(ranking, layout, budget=3, ranking_name="CircOOD")
    copies = identical_members(circuit, 3)
    assert [c.name for c in copies] == ["CircOOD-3 copy 0", "CircOOD-3 copy 1", "CircOOD-3 copy 2"]
    assert all(torch.equal(c.keep, circuit.keep) for c in copies)
    check_members(copies, layout, allow_identical=True)
    with pytest.raises(ValueError, match="keep exactly the same heads"):
        check_members(copies, layout)


def test_taylor_members(model, inputs):
    single = taylor_member(model, inputs, budget=3)
    expected = taylor_prune(model, inputs.id_x, inputs.id_y, heads_to_prune_per_layer=1)
    assert torch.equal(single.keep, expected.keep)
    assert single.name == "Taylor-3" and single.keep.sum(1).tolist() == [3, 3, 3]
    with pytest.raises(ValueError, match="does not split evenly"):
        taylor_member(model, inputs, budget=4)
    uneven = taylor_member(model, inputs, per_layer=[2, 1, 0])
    assert uneven.keep.sum(1).tolist() == [2, 3, 4]
    with pytest.raises(ValueError, match="exactly one of them"):
        taylor_member(model, inputs)

    ranking = taylor_ranking(model, inputs)
    assert ranking == taylor_global_ranking(taylor_scores(model, inputs.id_x, inputs.id_y))
    layout = head_layout(model)
    members = seed_sampled_members(
        ranking, layout, budget=3, pool=6, seeds=[0, 1], ranking_name=TAYLOR_NAME
    )
    expected = seed_sampled_masks(ranking, prune=3, pool=6, seeds=[0, 1], layout=layout)
    assert [m.name for m in members] == ["Taylor seed 0", "Taylor seed 1"]
    assert all(torch.equal(m.keep, k) for m, k in zip(members, expected, strict=True))


def test_cahp_members_use_one_seed_each(model, inputs):
    grid = [2, 4, 6, 8, 10, 12]
    calls = []
    members = cahp_members(
        model,
        inputs,
        seeds=(0, 1),
        variant="accuracy-knee",
        k_grid=grid,
        allow_identical=True,
        progress=lambda done, total: calls.append((done, total)),
    )
    for member, seed in zip(members, (0, 1), strict=True):
        expected = cahp_select(
            model, inputs.id_x, inputs.id_y, variant="accuracy-knee", k_grid=grid, seed=seed
        )
        assert torch.equal(member.keep, expected.keep)
        assert member.name == f"CAHP accuracy-knee seed {seed}"
        assert member.source == expected.describe()
    assert calls == [(done, 12) for done in range(1, 13)]  # both seeds' curves, 6 points each


def test_official_cahp_members(model, inputs):
    members = cahp_members(model, inputs, seeds=(42, 43), allow_identical=True)
    for member, seed in zip(members, (42, 43), strict=True):
        expected = cahp_select(model, inputs.id_x, inputs.id_y, seed=seed)
        assert torch.equal(member.keep, expected.keep)
        assert member.name == f"CAHP official seed {seed}"
        assert member.source.startswith("CAHP official: knee of the mean simplified silhouette")


def test_manual_members(model):
    layout = head_layout(model)
    a, b = layout.all_kept(), layout.all_kept()
    a[0, 0] = False
    b[2, 3] = False
    named = manual_members([MemberMask("left", "x", a), MemberMask("right", "y", b)], layout)
    assert [m.name for m in named] == ["left", "right"] and torch.equal(named[1].keep, b)
    assert [m.name for m in manual_members([a, b], layout)] == ["member 0", "member 1"]
    with pytest.raises(ValueError, match="'member 0' = 'member 1'.*allow_identical"):
        manual_members([a, a.clone()], layout)
    same = manual_members([a, a.clone()], layout, allow_identical=True)
    assert torch.equal(same[0].keep, same[1].keep)


def test_member_seeds():
    assert member_seeds(3) == [0, 1, 2]
    assert member_seeds(2, (7, 4)) == [7, 4]


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda r, lay: member_seeds(3, (1, 1, 2)), "seeds must differ"),
        (lambda r, lay: member_seeds(3, (1, 2)), "2 seeds were given for m=3"),
        (lambda r, lay: member_seeds(0), "m must be a positive number of members, got 0"),
        (
            lambda r, lay: seed_sampled_members(r, lay, budget=4, seeds=(1, 1), ranking_name="x"),
            "seeds must differ",
        ),
        (
            lambda r, lay: seed_sampled_members(r, lay, budget=4, seeds=(), ranking_name="x"),
            "no seeds",
        ),
        (
            lambda r, lay: seed_sampled_members(r, lay, budget=12, seeds=(0,), ranking_name="x"),
            "budget must be between 1 and 11",
        ),
        (
            lambda r, lay: seed_sampled_members(
                r, lay, budget=2, pool=2, seeds=(0, 1), ranking_name="x"
            ),
            "keep exactly the same heads",
        ),
        (
            lambda r, lay: circuit_member(r, lay, budget=0, ranking_name="x"),
            "budget must be between 1 and 11",
        ),
        (lambda r, lay: identical_members(MemberMask("a", "", lay.all_kept()), 0), "positive"),
        (
            lambda r, lay: manual_members([torch.ones(2, 4, dtype=torch.bool)], lay),
            "expected shape",
        ),
        (lambda r, lay: manual_members([], lay), "no members"),
    ],
)
def test_bad_requests_are_explained(model, build, match):
    layout = head_layout(model)
    ranking = [tuple(h) for h in layout.all_kept().nonzero().tolist()]
    with pytest.raises(ValueError, match=match):
        build(ranking, layout)


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
