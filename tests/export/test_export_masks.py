"""Masks for other tools: through nnsight they give exactly what ``ablate`` gives (timm ViTs and
Hugging Face encoders, tiny models and the embedded defaults); the plain JSON lists each member's
kept heads; models nnsight cannot reach are refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hydra_core.errors import InputError
from hydra_core.export.masks import (
    kept_heads,
    nnsight_layout,
    nnsight_module,
    plain_masks,
    plain_masks_text,
    select_members,
)
from hydra_core.masks import MemberMask
from hydra_core.models.family import UnsupportedModelError
from hydra_core.models.text import TextClassifier
from tests.conftest import (
    TEXT_KINDS,
    TINY_CONFIGS,
    make_tiny_text,
    make_tiny_vit,
    make_tiny_zero_shot,
    missing_data,
    random_mask,
)

REPO = Path(__file__).resolve().parents[2]
CASES = [f"vit-{name}" for name in TINY_CONFIGS] + [f"text-{kind}" for kind in TEXT_KINDS]
DEFAULTS = ["default", "minilm-sentiment"]


@pytest.fixture(scope="module")
def nnsight_results(tmp_path_factory) -> dict[str, dict]:
    """tests/export/nnsight_check.py's lines, by case (it runs in a process of its own: nnsight
    patches Python's object and torch when imported)."""
    folder = tmp_path_factory.mktemp("nnsight")
    out = subprocess.run(
        [sys.executable, "-m", "tests.export.nnsight_check", str(folder)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {line["case"]: line for line in lines}


@pytest.mark.parametrize("case", CASES)
def test_nnsight_mask_equals_ablate_on_tiny_models(nnsight_results, case):
    for member in ("member 0", "member 1"):
        found = nnsight_results[f"{case} {member}"]
        assert found["changed"], "the mask changes nothing: equality would prove nothing"
        assert found["library_equal"] and found["module_equal"], found


@pytest.mark.parametrize("case", DEFAULTS)
def test_nnsight_mask_equals_ablate_on_the_embedded_defaults(nnsight_results, case):
    if case in nnsight_results:
        missing_data(nnsight_results[case]["missing"])
    for member in ("member 0", "member 1"):
        found = nnsight_results[f"{case} {member}"]
        assert found["changed"] and found["library_equal"] and found["module_equal"], found


def test_nnsight_paths_count_from_the_model_nnsight_wraps():
    assert nnsight_layout(make_tiny_vit()).projections == tuple(
        f"blocks.{i}.attn.proj" for i in range(3)
    )
    bert = make_tiny_text("bert", depth=2)
    layout = nnsight_layout(TextClassifier(bert))  # Hydra Lab's wrapper: paths from bert itself
    assert layout.projections == tuple(
        f"bert.encoder.layer.{i}.attention.output.dense" for i in range(2)
    )
    assert layout == nnsight_layout(bert) and layout.heads == (4, 4) and layout.head_dim == 6
    mpnet = nnsight_layout(make_tiny_text("mpnet", depth=2))
    assert mpnet.projections[1] == "mpnet.encoder.layer.1.attention.attn.o"


def test_openclip_is_refused_for_nnsight_in_one_line():
    with pytest.raises(UnsupportedModelError, match="reads W_O's weight itself") as error:
        nnsight_layout(make_tiny_zero_shot())
    assert "\n" not in str(error.value) and "plain JSON" in str(error.value)


def members_of(layers: int = 3, heads: int = 4) -> list[MemberMask]:
    keeps = [random_mask((layers, heads), seed) for seed in range(3)]
    keeps[1][2] = False  # a layer that keeps no head
    return [MemberMask(f"seed {i}", "test", keep) for i, keep in enumerate(keeps)]


def test_plain_json_lists_every_layer_and_reads_back_to_the_masks():
    members = members_of()
    plain = json.loads(json.dumps(plain_masks(members)))
    assert list(plain) == ["seed 0", "seed 1", "seed 2"]
    assert plain["seed 1"]["2"] == []
    for member in members:
        keep = torch.zeros(3, 4, dtype=torch.bool)
        for layer, heads in plain[member.name].items():
            keep[int(layer), heads] = True
        assert torch.equal(keep, member.keep)
    one = plain_masks(members[:1])
    assert one == {str(k): v for k, v in kept_heads(members[0].keep).items()}
    assert json.loads(plain_masks_text(members)) == plain_masks(members)  # the file's text
    assert json.loads(plain_masks_text(members[:1])) == one
    assert plain_masks_text(members).count("\n") == 2 + 3 * (1 + 3 + 1)  # a line per layer


def test_a_member_is_chosen_by_name_or_position_and_a_wrong_one_named():
    members = members_of()
    assert select_members(members, None) == members
    assert select_members(members, "seed 2") == [members[2]]
    assert select_members(members, "1") == [members[1]]
    with pytest.raises(InputError, match=r"no member 'seed 9'.*'seed 0', 'seed 1', 'seed 2'"):
        select_members(members, "seed 9")


def test_the_nnsight_module_needs_only_torch_and_holds_the_masks():
    members = members_of()
    model = make_tiny_vit()
    identity = {"name": "tiny", "layers": 3, "heads": 4, "weights": "abc"}
    source = nnsight_module(members, model, identity)
    namespace: dict = {}
    exec(compile(source, "hydra_masks.py", "exec"), namespace)  # imports nothing but torch
    assert "nnsight" not in sys.modules
    assert namespace["MODEL"] == identity and namespace["HEAD_DIM"] == 6
    assert namespace["PROJECTIONS"] == [f"blocks.{i}.attn.proj" for i in range(3)]
    assert namespace["MEMBERS"]["seed 1"] == kept_heads(members[1].keep)
    assert namespace["member_heads"](namespace["MEMBERS"], 2) == kept_heads(members[2].keep)
    with pytest.raises(KeyError, match="no member 'x'"):
        namespace["member_heads"](namespace["MEMBERS"], "x")
