"""Head selection never sees a reported OOD set (docs/default.md, The embedded default, "Protocol";
paper D.1.2).

Checked on what the search is actually given: the tensors that reach ``greedy_circuit`` in a
command-line ``search`` run are compared, row by row, with every report set run through the same
preprocessing. Under the ``halves`` protocol the same check finds the overlap, which shows that it
would catch a leak, and the command says in words that the search saw the reported sets.
"""

from __future__ import annotations

import hashlib
import json

import pandas as pd
import pytest
import torch

from hydra_core.analysis import greedy
from hydra_core.cli import main
from hydra_core.data import REPORT_OOD, SEARCH_OOD, load_fashion_mnist, load_ood_sets
from hydra_core.models.adapter import head_layout
from hydra_core.zoo.registry import load_model
from tests.conftest import missing_data

SMALL = ["--n-search", "40", "--n-report", "60", "--device", "cpu"]
SEARCH = ["search", "--objective", "acc", "--budget", "1", *SMALL]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def sets():
    """The default report and search sets, whole."""
    try:
        return load_ood_sets(REPORT_OOD), load_ood_sets(SEARCH_OOD)
    except FileNotFoundError as exc:
        missing_data(str(exc))


def row_hashes(x: torch.Tensor) -> set[bytes]:
    """One hash per image (first axis) of a tensor."""
    rows = x.contiguous().view(len(x), -1)
    return {hashlib.blake2b(row.numpy().tobytes(), digest_size=8).digest() for row in rows}


@pytest.fixture
def given(monkeypatch) -> dict:
    """What the next search run hands to greedy_circuit: id_x, id_y, ood_x."""
    seen: dict = {}
    real = greedy.greedy_circuit

    def spy(model, id_x, id_y, ood_x, **kwargs):
        seen.update(id_x=id_x.cpu(), id_y=id_y.cpu(), ood_x=ood_x.cpu())
        return real(model, id_x, id_y, ood_x, **kwargs)

    monkeypatch.setattr(greedy, "greedy_circuit", spy)  # the command imports it when it runs
    return seen


def test_the_search_never_sees_a_report_set(checkpoint, tmp_path, sets, given, capsys):
    report_sets, search_sets = sets
    assert main([*SEARCH, "--model", checkpoint, "--out", str(tmp_path)]) == 0
    assert "protocol 'halves'" not in capsys.readouterr().err
    preprocess = load_model(checkpoint).preprocess
    searched = row_hashes(given["ood_x"])
    assert len(given["ood_x"]) == 40 and len(searched) == 40
    for report in report_sets:  # every report set, whole
        assert not searched & row_hashes(preprocess(report.images)), report.name
    allowed = set().union(*(row_hashes(preprocess(s.images)) for s in search_sets))
    assert searched <= allowed
    by_set = [len(searched & row_hashes(preprocess(s.images))) for s in search_sets]
    assert by_set == [20, 20]  # balanced over photos and faces
    id_test = row_hashes(preprocess(load_fashion_mnist("test").images))
    assert not row_hashes(given["id_x"]) & id_test  # ID: validation images only


def test_halves_leak_is_found_and_said(checkpoint, tmp_path, sets, given, capsys):
    """The check above has teeth: under "halves" the search images come from the report sets."""
    report_sets, _ = sets
    argv = [*SEARCH, "--model", checkpoint, "--protocol", "halves", "--out", str(tmp_path)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "warning: protocol 'halves'" in err and "saw the reported distributions" in err
    preprocess = load_model(checkpoint).preprocess
    searched = row_hashes(given["ood_x"])
    reported = set().union(*(row_hashes(preprocess(s.images)) for s in report_sets))
    assert searched <= reported


def test_search_json_is_one_object(checkpoint, tmp_path, capsys):
    argv = ["search", "--model", checkpoint, *SMALL, "--budget", "2", "--json"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    found = json.loads(captured.out)  # stdout holds the JSON and nothing else
    assert set(found) == {
        "objective",
        "budget",
        "order",
        "scores",
        "search_ood",
        "n_id",
        "n_ood",
        "seconds",
        "candidates",  # the guided search's K (None: exact)
        "evaluated",  # candidates evaluated per step
        "shortcut",  # the shortcut check of each search set
    }
    total = head_layout(load_model(checkpoint).model).total_heads
    assert found["candidates"] is None and found["evaluated"] == [total, total - 1]  # exact
    assert set(found["shortcut"]) == set(SEARCH_OOD)
    assert (found["objective"], found["budget"]) == ("avg", 2)
    assert len(found["order"]) == len(found["scores"]) == 2
    assert all(label.startswith("L") and "H" in label for label in found["order"])
    assert found["search_ood"] == list(SEARCH_OOD)
    assert (found["n_id"], found["n_ood"]) == (40, 40)
    assert found["seconds"] > 0
    saved = json.loads((tmp_path / "greedy_avg.json").read_text())
    assert found["scores"] == pytest.approx(saved["scores"])
    assert found["seconds"] == pytest.approx(saved["seconds"])
    assert "wrote" in captured.err and "dense: accuracy" in captured.err


def test_eval_reports_on_report_sets_only(checkpoint, capsys):
    assert main(["eval", "--model", checkpoint, *SMALL, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [o["name"] for o in out["ood"]] == list(REPORT_OOD)
    assert main(["eval", "--model", checkpoint, *SMALL, "--search-ood", "faces", "--json"]) == 0
    assert [o["name"] for o in json.loads(capsys.readouterr().out)["ood"]] == list(REPORT_OOD)


def test_eval_under_halves_says_the_search_saw_the_reported_sets(checkpoint, capsys):
    argv = ["eval", "--model", checkpoint, *SMALL, "--ood", "noise", "--protocol", "halves"]
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    assert "protocol 'halves'" in captured.err and "(noise)" in captured.err
    assert [o["n"] for o in json.loads(captured.out)["ood"]] == [60]  # from the report half


def test_represent_describes_the_report_sets(checkpoint, tmp_path):
    out = tmp_path / "represent"
    argv = ["represent", "--model", checkpoint, *SMALL, "--ood", "mnist", "noise"]
    assert main([*argv, "--n-images", "30", "--out", str(out)]) == 0
    distances = pd.read_csv(out / "distances_layer1.csv")
    assert set(distances["ood_set"]) == {"mnist", "noise"}
    assert len(pd.read_csv(out / "pca_layer1.csv")) == 3 * 30
