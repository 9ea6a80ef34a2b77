from __future__ import annotations

import json

import pytest
import torch

from hydra_core.masks import (
    MaskFileError,
    MemberMask,
    jaccard_matrix,
    load_masks,
    mask_from_ranking,
    masks_to_json,
    model_identity,
    per_layer_counts,
    save_masks,
    seed_sampled_masks,
)
from hydra_core.models.adapter import HeadLayout

LAYOUT = HeadLayout(num_heads=(4, 4, 4), head_dim=6, embed_dim=24)
RANKING = [
    (2, 3),
    (0, 1),
    (1, 0),
    (2, 0),
    (0, 0),
    (1, 1),
    (1, 2),
    (0, 2),
    (2, 1),
    (0, 3),
    (1, 3),
    (2, 2),
]
IDENTITY = model_identity("tiny", LAYOUT, "abc123")


def test_mask_from_ranking_prunes_the_first_heads():
    keep = mask_from_ranking(RANKING, 3, LAYOUT)
    assert int(keep.sum()) == 9
    assert not keep[2, 3] and not keep[0, 1] and not keep[1, 0] and keep[2, 0]


def test_seed_sampled_masks_differ_and_stay_in_the_pool():
    masks = seed_sampled_masks(RANKING, prune=3, pool=6, seeds=[0, 1, 2], layout=LAYOUT)
    pool = set(RANKING[:6])
    for keep in masks:
        removed = {tuple(h) for h in (~keep).nonzero().tolist()}
        assert len(removed) == 3 and removed <= pool
    assert len({tuple(m.flatten().tolist()) for m in masks}) == 3
    again = seed_sampled_masks(RANKING, prune=3, pool=6, seeds=[0, 1, 2], layout=LAYOUT)
    assert all(torch.equal(a, b) for a, b in zip(masks, again, strict=True))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(prune=7, pool=6, seeds=[0, 1]), "cannot prune 7"),
        (dict(prune=1, pool=13, seeds=[0, 1]), "pool 13"),
        (dict(prune=1, pool=4, seeds=[1, 1]), "seeds must differ"),
    ],
)
def test_seed_sampling_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        seed_sampled_masks(RANKING, layout=LAYOUT, **kwargs)


def test_ranking_with_foreign_head_is_refused():
    with pytest.raises(ValueError, match="names L5H0"):
        mask_from_ranking([(5, 0)], 1, LAYOUT)


def test_jaccard_and_counts():
    a = torch.ones(3, 4, dtype=torch.bool)
    b = a.clone()
    b[0, :2] = False  # b keeps 10 of a's 12 heads
    members = [MemberMask("a", "manual", a), MemberMask("b", "manual", b)]
    jac = jaccard_matrix(members)
    assert jac.loc["a", "b"] == pytest.approx(10 / 12) and jac.loc["a", "a"] == 1.0
    counts = per_layer_counts(members)
    assert counts["b"].tolist() == [2, 4, 4, 10]


def test_file_round_trip(tmp_path):
    masks = seed_sampled_masks(RANKING, prune=3, pool=6, seeds=[0, 1, 2], layout=LAYOUT)
    members = [MemberMask(f"m{i}", "seed sampling", k) for i, k in enumerate(masks)]
    path = save_masks(tmp_path / "masks.json", members, IDENTITY)
    loaded = load_masks(path, LAYOUT, IDENTITY)
    assert [m.name for m in loaded] == ["m0", "m1", "m2"]
    assert all(torch.equal(a.keep, b.keep) for a, b in zip(members, loaded, strict=True))
    assert json.loads(path.read_text())["format"] == "hydra-masks"


def test_members_carry_their_provenance_through_the_file(tmp_path):
    """A mask file explains itself: strategy, its parameters, the ranking's search (objective,
    budget, steps made) and the search sets with their sizes come back from the file."""
    from types import SimpleNamespace

    from hydra_core.analysis.inputs import SearchInputs
    from hydra_core.hydra.members import (
        circuit_member,
        ranking_provenance,
        search_provenance,
        seed_sampled_members,
    )

    inputs = SearchInputs(
        torch.zeros(40, 1),
        torch.zeros(40, dtype=torch.long),
        torch.zeros(40, 1),
        {"photos": torch.zeros(30, 1), "faces": torch.zeros(20, 1)},
    )
    benchmark = SimpleNamespace(protocol="dedicated", id_search=SimpleNamespace(name="fmnist"))
    search = search_provenance(benchmark, inputs)
    assert search == {
        "protocol": "dedicated",
        "id": {"name": "fmnist", "n": 40},
        "ood": {"photos": 30, "faces": 20},
        "ood_pooled": 40,
    }
    info = ranking_provenance("greedy", objective="avg", budget=6, steps=5, search=search)
    members = seed_sampled_members(
        RANKING, LAYOUT, budget=3, seeds=[0, 4], ranking_name="CircAvg", pool=6, ranking_info=info
    )
    members.append(circuit_member(RANKING, LAYOUT, budget=2, ranking_name="CircAvg"))
    path = save_masks(tmp_path / "masks.json", members, IDENTITY)
    loaded = load_masks(path, LAYOUT, IDENTITY)
    ranking = {"name": "CircAvg", "method": "greedy", "objective": "avg", "budget": 6}
    assert loaded[1].provenance == {
        "strategy": "seed-sampling",
        "parameters": {"budget": 3, "pool": 6, "seed": 4},
        "ranking": {**ranking, "steps": 5, "search": search},
    }
    assert loaded[2].provenance == {  # a ranking of unknown origin: its name only
        "strategy": "circuit",
        "parameters": {"budget": 2},
        "ranking": {"name": "CircAvg"},
    }
    written = json.loads(path.read_text())["members"][0]
    assert written["provenance"]["ranking"]["search"]["ood"] == {"photos": 30, "faces": 20}


def test_files_without_provenance_still_import(tmp_path):
    """A file written before members carried their provenance (no such key) imports as it is,
    with empty provenance, and is written back the same way."""
    older = {
        "format": "hydra-masks",
        "version": 1,
        "model": IDENTITY,
        "members": [
            {"name": "a", "source": "seed sampling", "keep": {"0": [0, 1], "1": [2], "2": [3]}},
            {"name": "b", "source": "manual", "keep": {"0": [3], "1": [0, 1, 2], "2": []}},
        ],
        "created": "2026-11-22T10:00:00+00:00",
    }
    path = tmp_path / "older.json"
    path.write_text(json.dumps(older))
    loaded = load_masks(path, LAYOUT, IDENTITY)
    assert [(m.name, m.source, m.kept, m.provenance) for m in loaded] == [
        ("a", "seed sampling", 4, {}),
        ("b", "manual", 4, {}),
    ]
    assert masks_to_json(loaded, IDENTITY)["members"] == older["members"]


def _valid() -> dict:
    return masks_to_json([MemberMask("m", "manual", torch.ones(3, 4, dtype=torch.bool))], IDENTITY)


def _edit(path: tuple, value) -> dict:
    data = _valid()
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


@pytest.mark.parametrize(
    "data, match",
    [
        ([], "JSON object"),
        (_edit(("format",), "other"), "not a Hydra Lab mask file"),
        (_edit(("version",), 2), "version 2 is not supported"),
        (_edit(("model", "layers"), 12), r"12 layers x 4 heads .* loaded model has 3 x 4"),
        (_edit(("model", "weights"), "zzz"), "other weights"),
        (_edit(("members",), []), "no members"),
        (_edit(("members", 0, "keep"), {"7": [0]}), "layer 7 does not exist"),
        (_edit(("members", 0, "keep"), {"0": [4]}), "L0H4 does not exist"),
        (_edit(("members", 0, "keep"), {"0": [1, 1]}), "lists a head twice"),
        (_edit(("members", 0, "keep"), {"0": ["a"]}), "head indices"),
        (_edit(("members", 0, "keep"), {"x": [0]}), "not a number"),
        (_edit(("members", 0, "keep"), {"0": [], "1": [], "2": []}), "keeps no head"),
        (_edit(("members", 0, "keep"), {"0": [0]}), r"layer\(s\) 1, 2 missing from 'keep'"),
        (_edit(("members", 0, "provenance"), "greedy"), "'provenance' must be an object"),
    ],
)
def test_bad_files_are_refused_with_a_reason(tmp_path, data, match):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(MaskFileError, match=match):
        load_masks(path, LAYOUT, IDENTITY)


def test_other_weights_can_be_allowed(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(_edit(("model", "weights"), "zzz")))
    assert len(load_masks(path, LAYOUT, IDENTITY, allow_other_weights=True)) == 1


@pytest.mark.parametrize(
    "content, match",
    [
        (b"{not json", "c.json is not valid JSON"),
        (b"\xff\xfe\x00", "c.json is not a mask file: not UTF-8 text"),
        (b" \n", "c.json is empty"),
    ],
)
def test_corrupt_files(tmp_path, content, match):
    path = tmp_path / "c.json"
    path.write_bytes(content)
    with pytest.raises(MaskFileError, match=match):
        load_masks(path, LAYOUT)


def test_missing_file(tmp_path):
    with pytest.raises(MaskFileError, match="does not exist"):
        load_masks(tmp_path / "nope.json", LAYOUT)
