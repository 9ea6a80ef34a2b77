"""Search protocols and --ood-aggregate on the command line: what reaches the search, and the
choices refused in one line."""

from __future__ import annotations

import json

import pytest

from hydra_core.analysis import greedy
from hydra_core.analysis._maps import DEFAULT_OOD_AGGREGATE
from hydra_core.cli import main
from hydra_core.data.benchmark import DEFAULT_PROTOCOL
from hydra_core.hydra import members
from hydra_core.report import config_from_args
from hydra_core.report.text_config import text_config_from_args

DATA = ["--n-search", "24", "--n-report", "30", "--device", "cpu"]
SEARCH = ["search", "--objective", "ood", "--budget", "1", *DATA]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def given(monkeypatch) -> list[dict]:
    """The keyword arguments of every greedy_circuit call."""
    calls: list[dict] = []
    real = greedy.greedy_circuit

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(greedy, "greedy_circuit", spy)
    return calls


@pytest.mark.parametrize(
    "protocol, aggregate, searched",
    [
        ("dedicated", "pooled", {"photos", "faces"}),
        ("dedicated", "min", {"photos", "faces"}),
        ("synthetic", "mean", {"synthetic_patch_shuffle", "synthetic_pixel_permutation"}),
        ("far-to-near", "mean", {"photos", "faces", "textures", "noise"}),
        ("near-to-far", "min", {"mnist", "animal_silhouettes", "digits8x8"}),
    ],
)
def test_search_takes_the_protocol_and_the_aggregate(
    checkpoint, tmp_path, given, capsys, protocol, aggregate, searched
):
    out = tmp_path / "out"
    args = [*SEARCH, "--model", checkpoint, "--out", str(out), "--json"]
    assert main([*args, "--protocol", protocol, "--ood-aggregate", aggregate]) == 0
    found = json.loads(capsys.readouterr().out)
    assert searched <= set(found["search_ood"])
    assert given[-1]["ood_aggregate"] == aggregate
    assert set(given[-1]["ood_sets"]) == set(found["search_ood"])  # each OOD item's set
    saved = json.loads((out / "greedy_ood.json").read_text())
    assert saved["ood_aggregate"] == aggregate


def test_masks_pass_the_aggregate_to_the_search(checkpoint, tmp_path, monkeypatch):
    seen = []
    real = members.greedy_ranking

    def spy(*args, **kwargs):
        seen.append(kwargs["ood_aggregate"])
        return real(*args, **kwargs)

    monkeypatch.setattr(members, "greedy_ranking", spy)
    args = ["masks", "--model", checkpoint, *DATA, "--budget", "2", "--m", "2"]
    args += ["--strategy", "seed-sampling", "--out", str(tmp_path / "m.json")]
    assert main([*args, "--ood-aggregate", "mean", "--protocol", "synthetic"]) == 0
    assert seen == ["mean"]


def test_refused_choices_say_what_to_do(checkpoint, tmp_path, capsys):
    args = [*SEARCH, "--model", checkpoint, "--out", str(tmp_path / "o")]
    assert main([*args, "--protocol", "synthetic", "--search-ood", "photos"]) == 2
    assert "under 'synthetic'" in capsys.readouterr().err
    assert main([*args, "--ood-aggregate", "min", "--holdout", "0.25", "--overwrite"]) == 2
    assert "--ood-aggregate pooled" in capsys.readouterr().err
    assert main([*args, "--ood-aggregate", "max"]) == 2
    assert "invalid choice: 'max'" in capsys.readouterr().err


def test_the_defaults_are_one_constant_each():
    assert config_from_args(True).protocol == DEFAULT_PROTOCOL
    assert config_from_args(True).ood_aggregate == DEFAULT_OOD_AGGREGATE
    assert text_config_from_args(True).protocol == DEFAULT_PROTOCOL
    custom = config_from_args(True, protocol="synthetic", ood_aggregate="min")
    assert (custom.protocol, custom.ood_aggregate) == ("synthetic", "min")


def test_report_refuses_a_protocol_for_the_zero_shot_task(capsys):
    args = ["report", "--task", "zero-shot", "--protocol", "synthetic", "--out", "x"]
    assert main(args) == 2
    assert "--protocol and --ood-aggregate apply to" in capsys.readouterr().err


def test_only_the_commands_that_search_take_the_aggregate(checkpoint, capsys):
    args = ["importance", "--model", checkpoint, *DATA, "--ood-aggregate", "min"]
    assert main(args) == 2  # importance scores single heads on the pooled AUROC
    assert "unrecognized arguments: --ood-aggregate" in capsys.readouterr().err
