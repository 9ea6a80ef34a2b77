"""Where commands write, fed as a user runs them (issue 25, causes 4 and 5): defaults never replace
the shipped checkpoints or the committed report, nonsense settings are refused before anything is
written, a report's files appear all at once, and a folder holding another run's results is
refused unless the user says --overwrite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hydra_core.errors import InputError
from hydra_core.outputs import MANIFEST
from tests.cli.test_bad_inputs import one_error_line, run
from tests.cli.test_bad_inputs_text import snapshot
from tests.conftest import TINY, write_tiny_checkpoint

DATA = ["--n-search", "16", "--n-report", "24", "--ood", "noise", "--device", "cpu"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def other_checkpoint(tmp_path_factory) -> str:
    """A second tiny model: the same architecture, other weights."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("other") / "other.safetensors", seed=1)


# --- cause 4: defaults that wrote into the checkout ----------------------------------------------


@pytest.fixture
def shipped():
    """The shipped checkpoints' bytes, to check that nothing replaced them."""
    from hydra_core.zoo import minilm, mpnet
    from hydra_core.zoo.default import DEFAULT_CHECKPOINT

    paths = [DEFAULT_CHECKPOINT, minilm.ASSET, mpnet.ASSET]
    before = {p: p.read_bytes() for p in paths if p.is_file()}
    yield paths
    assert {p: p.read_bytes() for p in paths if p.is_file()} == before


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--epochs", "0"], "argument --epochs: must be at least 1, got 0"),
        (["train", "--lr", "-1"], "argument --lr: must be above 0, got -1"),
        (["train", "--batch-size", "0"], "argument --batch-size: must be at least 1, got 0"),
        (["train-text", "--epochs", "0"], "argument --epochs: must be at least 1, got 0"),
        (["train-text", "--lr", "nan"], "argument --lr: must be a finite number, got 'nan'"),
        (["report", "--n-search", "0"], "argument --n-search: must be at least 1, got 0"),
    ],
)
def test_nonsense_training_settings_are_refused_before_anything_is_written(
    tmp_path, monkeypatch, capsys, shipped, argv, message
):
    monkeypatch.chdir(tmp_path)
    code, err = run(capsys, *argv)
    assert code == 2 and message in one_error_line(err)
    assert list(tmp_path.iterdir()) == []


def fake_training(monkeypatch) -> None:
    """``train`` and ``train-text`` without the hours of training: a fresh model of the right
    architecture (the default ViT's; a stand-in for MiniLM's trained tensors)."""
    from hydra_core.zoo import default, minilm

    def train_vit(cfg, log=None, progress=None, resume=None):
        torch.manual_seed(cfg.seed)
        return default.build_vit(default.VitConfig()), {"test_accuracy": 0.5}

    def train_minilm(cfg, log=None, progress=None):
        header = {"trained": ["weight"], "validation_accuracy": 0.5, "test_accuracy": 0.5}
        return torch.nn.Linear(2, 2), header

    monkeypatch.setattr(default, "train_vit", train_vit)
    monkeypatch.setattr(minilm, "train_minilm", train_minilm)
    # train-text trains through the named model's record, which holds the function itself
    from dataclasses import replace

    from hydra_core.zoo.named import NAMED_MODELS

    text = NAMED_MODELS[minilm.NAME]
    faked = replace(text, recipe=replace(text.recipe, train=train_minilm))
    monkeypatch.setitem(NAMED_MODELS, minilm.NAME, faked)


@pytest.mark.parametrize(
    "command, option, written",
    [
        ("train", "--out", "results/train/vit_seed3.safetensors"),
        ("train-text", "--output", "results/train-text/minilm_seed3.safetensors"),
    ],
)
def test_training_writes_a_fresh_file_by_default_and_never_replaces_one_unasked(
    tmp_path, monkeypatch, capsys, shipped, command, option, written
):
    fake_training(monkeypatch)
    monkeypatch.chdir(tmp_path)
    code, err = run(capsys, command, "--seed", "3")
    assert code == 0, err
    assert (tmp_path / written).is_file() and f"wrote {written}" in run.out
    first = (tmp_path / written).read_bytes()
    code, err = run(capsys, command, "--seed", "3")  # the same default again
    line = one_error_line(err)
    assert code == 2 and f"{option} {written} exists already" in line and "--overwrite" in line
    assert (tmp_path / written).read_bytes() == first
    for asset in shipped:  # a shipped file is never replaced, even with --overwrite
        for more in ([], ["--overwrite"]):
            code, err = run(capsys, command, option, str(asset), *more)
            assert code == 2 and "inside the installed Hydra Lab package" in one_error_line(err)
    code, err = run(capsys, command, "--seed", "3", "--overwrite")
    assert code == 0, err


def test_report_defaults_never_point_into_the_checkout():
    from hydra_core.report import DEFAULT_OUT
    from hydra_core.report.text_config import DEFAULT_TEXT_OUT
    from hydra_core.report.zero_shot_config import DEFAULT_ZERO_SHOT_OUT

    for default in (DEFAULT_OUT, DEFAULT_TEXT_OUT, DEFAULT_ZERO_SHOT_OUT):
        assert Path(default).parts[:2] == ("results", "report")


def test_a_report_writes_its_files_only_when_all_are_ready(tmp_path, checkpoint):
    from hydra_core.data.benchmark import default_benchmark
    from hydra_core.experiment.pipeline import Pipeline
    from hydra_core.masks import MemberMask
    from hydra_core.zoo.registry import load_model

    out = tmp_path / "report"
    out.mkdir()
    (out / "members.json").write_text("the last report's")
    (out / "notes.txt").write_text("a file of the user's")

    def loader():
        return load_model(checkpoint), default_benchmark(n_search=16, n_report=24, ood=["noise"])

    run_ = Pipeline(out, None, "cpu", None, log=lambda line: None)
    with pytest.raises(InputError, match="already holds files that no Hydra Lab run"):
        run_.load(loader)  # files of unknown origin: refused before any search
    assert sorted(p.name for p in out.iterdir()) == ["members.json", "notes.txt"]
    assert not list(tmp_path.glob(".report.partial-*"))

    run_ = Pipeline(out, None, "cpu", None, log=lambda line: None, overwrite=True)
    run_.load(loader)
    member = MemberMask("all", "test", torch.ones(TINY.depth, TINY.num_heads, dtype=torch.bool))
    run_.save_members([member])  # as a report does early on; then it is interrupted
    assert (out / "members.json").read_text() == "the last report's"
    staging = run_.out
    assert staging.parent == tmp_path and staging.name.startswith(".report.partial-")

    class Systems:
        def to_json(self) -> dict:
            return {"systems": []}

    run_.write({}, {"total_seconds": 1.0}, Systems(), lambda tables, setup: "# report\n")
    assert not staging.exists() and run_.out == out
    assert json.loads((out / "members.json").read_text())["members"][0]["name"] == "all"
    assert (out / "report.md").read_text() == "# report\n"
    assert (out / "notes.txt").read_text() == "a file of the user's"
    assert json.loads((out / MANIFEST).read_text())["model"]["weights"]


def test_report_refuses_a_folder_of_another_models_report(
    tmp_path, checkpoint, other_checkpoint, capsys
):
    out = tmp_path / "report"
    from hydra_core.outputs import claim_folder
    from hydra_core.zoo.registry import load_model

    claim_folder(out, model=load_model(other_checkpoint).identity(), data={}, command="report")
    (out / "report.md").write_text("another model's report")
    before = snapshot(tmp_path / "report")
    argv = ["report", "--quick", "--model", checkpoint, "--device", "cpu", "--n-search", "16",
            "--n-report", "24", "--ood", "noise", "--out", str(out)]  # fmt: skip
    code, err = run(capsys, *argv)
    line = one_error_line(err)
    assert (
        code == 2 and f"{out} holds the results of another model" in line and "--overwrite" in line
    )
    assert snapshot(tmp_path / "report") == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# --- cause 5: another run's results --------------------------------------------------------------


def test_search_into_another_models_folder_is_refused_unless_overwrite(
    tmp_path, checkpoint, other_checkpoint, capsys
):
    out = tmp_path / "search"
    code, err = run(capsys, "search", "--model", checkpoint, *DATA, "--budget", "2", "--out",
                    str(out))  # fmt: skip
    assert code == 0, err
    found = json.loads((out / "greedy_avg.json").read_text())
    assert found["model"]["name"] == "file:tiny.safetensors" and found["data"]["sets"] == [
        "fashion_mnist", "photos", "faces"
    ]  # fmt: skip
    before = snapshot(out)
    code, err = run(capsys, "search", "--model", other_checkpoint, *DATA, "--budget", "2",
                    "--out", str(out))  # fmt: skip
    line = one_error_line(err)
    assert code == 2 and "holds the results of another model, 'file:tiny.safetensors'" in line
    assert "not 'file:other.safetensors'" in line and "--overwrite" in line
    assert snapshot(out) == before
    # the same model on other data is another run too
    code, err = run(capsys, "search", "--model", checkpoint, *DATA[:-2], "--search-ood", "faces",
                    "--device", "cpu", "--budget", "2", "--out", str(out))  # fmt: skip
    assert code == 2 and "holds search results of this model on other data" in one_error_line(err)
    # the same run again is fine (it resumes), and --overwrite replaces another model's
    assert run(capsys, "search", "--model", checkpoint, *DATA, "--budget", "2", "--out",
               str(out))[0] == 0  # fmt: skip
    code, err = run(capsys, "search", "--model", other_checkpoint, *DATA, "--budget", "2",
                    "--out", str(out), "--overwrite")  # fmt: skip
    assert code == 0, err
    assert json.loads((out / "greedy_avg.json").read_text())["model"]["name"] == (
        "file:other.safetensors"
    )


def test_a_folder_of_unknown_files_is_refused(tmp_path, checkpoint, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("mine")
    before = snapshot(tmp_path / "mine")
    code, err = run(capsys, "importance", "--model", checkpoint, *DATA, "--out",
                    str(tmp_path / "mine"))  # fmt: skip
    line = one_error_line(err)
    assert (
        code == 2 and "already holds files that no Hydra Lab run" in line and "thesis.tex" in line
    )
    assert snapshot(tmp_path / "mine") == before


def test_importance_refuses_another_models_search(tmp_path, checkpoint, other_checkpoint, capsys):
    searched = tmp_path / "search"
    assert run(capsys, "search", "--model", other_checkpoint, *DATA, "--budget", "2", "--out",
               str(searched))[0] == 0  # fmt: skip
    greedy = searched / "greedy_avg.json"
    code, err = run(capsys, "importance", "--model", checkpoint, *DATA, "--greedy", str(greedy),
                    "--out", str(tmp_path / "imp"), "--taylor-samples", "8")  # fmt: skip
    line = one_error_line(err)
    assert code == 2 and f"--greedy {greedy} was made for 'file:other.safetensors'" in line
    assert "not the loaded model 'file:tiny.safetensors'" in line
    assert not list((tmp_path / "imp").glob("*.csv"))
    # a search of its own model is taken
    argv = ["importance", "--model", other_checkpoint, *DATA, "--greedy", str(greedy), "--out",
            str(tmp_path / "imp2"), "--taylor-samples", "8"]  # fmt: skip
    code, err = run(capsys, *argv)
    assert code == 0, err


def test_hydra_into_another_models_folder_is_refused(
    tmp_path, checkpoint, other_checkpoint, capsys
):
    masks = {}
    for name, model in (("a", checkpoint), ("b", other_checkpoint)):
        masks[name] = tmp_path / f"{name}.json"
        argv = ["masks", "--model", model, *DATA, "--strategy", "taylor", "--m", "2",
                "--budget", "2", "--taylor-samples", "8", "--out", str(masks[name])]  # fmt: skip
        assert run(capsys, *argv)[0] == 0
    out = tmp_path / "hydra"
    hydra = ["hydra", *DATA, "--no-latency", "--out", str(out)]
    assert run(capsys, *hydra, "--model", checkpoint, "--masks", str(masks["a"]))[0] == 0
    assert (
        json.loads((out / "systems.json").read_text())["model"]["name"] == "file:tiny.safetensors"
    )
    before = snapshot(out)
    code, err = run(capsys, *hydra, "--model", other_checkpoint, "--masks", str(masks["b"]))
    assert code == 2 and "holds the results of another model" in one_error_line(err)
    assert snapshot(out) == before
    # a mask file of another model is named as such, with the flag that accepts it
    code, err = run(capsys, *hydra, "--model", other_checkpoint, "--masks", str(masks["a"]))
    line = one_error_line(err)
    assert code == 2 and "--allow-other-weights" in line and "allow_other_weights" not in line
    # masks --out over another model's mask file
    code, err = run(capsys, "masks", "--model", other_checkpoint, *DATA, "--strategy", "taylor",
                    "--m", "2", "--budget", "2", "--taylor-samples", "8", "--out",
                    str(masks["a"]))  # fmt: skip
    assert code == 2 and "holds the results of 'file:tiny.safetensors'" in one_error_line(err)


def test_a_refused_command_leaves_no_folder_behind(tmp_path, checkpoint, other_checkpoint, capsys):
    masks = tmp_path / "a.json"
    argv = ["masks", "--model", checkpoint, *DATA, "--strategy", "taylor", "--m", "2",
            "--budget", "2", "--taylor-samples", "8", "--out", str(masks)]  # fmt: skip
    assert run(capsys, *argv)[0] == 0
    before = snapshot(tmp_path)
    for argv in (
        ["represent", "--model", other_checkpoint, "--masks", str(masks)],  # another model's
        ["represent", "--model", checkpoint, "--layer", "7"],
        ["search", "--model", checkpoint, "--budget", "8"],  # 8 heads: a circuit keeps one
        ["masks", "--model", checkpoint, "--per-layer", "1", "--strategy", "circuit"],
    ):
        code, err = run(capsys, *argv, *DATA, "--out", str(tmp_path / "out" / "x"))
        assert code == 2 and one_error_line(err)
        assert snapshot(tmp_path) == before, argv
