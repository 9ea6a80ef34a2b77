"""One output policy for every writer (issue 38): a file a command writes is checked before the work
(an existing file refused without --overwrite; never an input of the same command nor a file of the
installed package; the place writable) and written atomically, a failure leaving no temporary file
and naming none. Also the run's identity (model, data and options), provenance checked on every
reader of another run's file, image folders read as torchvision reads them, texts longer than a
model's positions, options a command would ignore, generated module names, and leftovers.

Each case runs as a user types it: exit code 2, exactly one line on stderr, no traceback, and a
snapshot showing nothing on disk changed."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hydra_core.errors import InputError
from hydra_core.masks import MemberMask, save_masks
from hydra_core.models.adapter import head_layout
from hydra_core.outputs import MANIFEST, check_output, claim_folder, write_output
from hydra_core.paths import ASSETS_DIR, PACKAGE_DIR
from hydra_core.zoo.registry import load_model
from tests.cli.test_bad_inputs import one_error_line, run
from tests.cli.test_bad_inputs_text import sentences, snapshot
from tests.conftest import write_tiny_checkpoint

DATA = ["--n-search", "16", "--n-report", "24", "--ood", "noise", "--device", "cpu"]
ROOT = PACKAGE_DIR.parent


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    """A cache outside ``tmp_path``, whose snapshots show the user's files alone."""
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture
def shipped():
    """The package's files (the shipped checkpoints among them): nothing may change them."""
    before = snapshot(ASSETS_DIR)
    yield
    assert snapshot(ASSETS_DIR) == before


def write_masks(loaded, path: Path, count: int = 2) -> Path:
    layout = head_layout(loaded.model)
    members = []
    for i in range(count):
        keep = layout.all_kept()
        keep[:, i] = False
        members.append(MemberMask(f"drop{i}", "test", keep))
    save_masks(path, members, loaded.identity())
    return path


@pytest.fixture
def masks(checkpoint, tmp_path) -> Path:
    return write_masks(load_model(checkpoint), tmp_path / "members.json")


def refused(capsys, *argv: str) -> str:
    code, err = run(capsys, *argv)
    assert code == 2, err
    return one_error_line(err)


# --- cause 1: the policy as one function ----------------------------------------------------------


def test_the_policy_refuses_each_bad_target_in_one_line(tmp_path):
    existing = tmp_path / "there.json"
    existing.write_text("{}")
    (tmp_path / "folder").mkdir()
    (tmp_path / "afile").write_text("x")
    cases = {
        existing: "exists already",
        tmp_path / "folder": "is a folder",
        tmp_path / "afile" / "out.onnx": "is a file, not a folder",
        ASSETS_DIR / "fmnist_vit_default.safetensors": "inside the installed Hydra Lab package",
        ASSETS_DIR / "new.onnx": "inside the installed Hydra Lab package",
    }
    for path, message in cases.items():
        with pytest.raises(InputError, match=message) as caught:
            check_output(path, option="--out")
        assert "\n" not in str(caught.value) and str(path) in str(caught.value)
    # an input of the command, even with --overwrite, even by another spelling or a link
    link = tmp_path / "link.json"
    link.symlink_to(existing)
    for given in (existing, link, tmp_path / "folder" / ".." / "there.json"):
        with pytest.raises(InputError, match="the --masks this command reads"):
            check_output(given, overwrite=True, reads={"--masks": str(existing)})
    data = tmp_path / "images"
    (data / "cat").mkdir(parents=True)
    (data / "cat" / "a.png").write_bytes(b"png")
    with pytest.raises(InputError, match="is inside the --id-folder this command reads"):
        check_output(data / "cat" / "a.png", overwrite=True, reads={"--id-folder": str(data)})
    beside = data / "cat" / "new.json"  # a new file beside an input's files is no input
    assert check_output(beside, reads={"--id-folder": str(data)}) == beside
    assert check_output(existing, overwrite=True) == existing
    assert check_output(tmp_path / "new" / "deep" / "x.json") == tmp_path / "new/deep/x.json"
    assert not (tmp_path / "new").exists()  # checking writes nothing


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_an_unwritable_folder_is_refused_before_the_work(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(InputError, match="is not writable for you"):
            check_output(locked / "x.onnx", option="--onnx")
    finally:
        locked.chmod(0o700)


def test_a_failed_write_leaves_no_temporary_file_and_names_none(tmp_path):
    target = tmp_path / "out.json"

    def fails(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(InputError) as caught:
        write_output(target, fails)
    message = str(caught.value)
    assert message.startswith(f"could not write {target}: No space left on device")
    assert ".tmp" not in message and list(tmp_path.iterdir()) == []
    write_output(target, lambda tmp: tmp.write_text("whole"))
    assert target.read_text() == "whole" and [p.name for p in tmp_path.iterdir()] == ["out.json"]


#: calls that write a file: a method or function name -> where its target is
WRITERS = {
    "to_csv", "to_parquet", "write_text", "write_bytes", "save_file", "savefig", "save_masks",
    "save_hydra", "save_checkpoint", "save_asset", "export_onnx", "export_pruned_onnx", "dump",
}  # fmt: skip
#: Path methods: writers only as ``path.write_text(...)`` (a bare ``write_text(path, text)`` is
#: the policy's own :func:`hydra_core.outputs.write_text`)
PATH_METHODS = {"write_text", "write_bytes"}
#: writers that hand their own caller's path on, by file and enclosing function, and why
FORWARDS = {
    ("onnx.py", "export_pruned_onnx"): "export_onnx writes where its caller (through the policy)"
    " says, atomically",
}
#: names a writer's target may have: the policy's temporary file, or a buffer in memory
ALLOWED_TARGETS = {"tmp", "buffer", "sink"}


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _writer_calls(path: Path) -> list[str]:
    """Every call in ``path`` that writes a file other than through the policy: a writer whose
    arguments (or receiver) name no temporary file of :func:`write_output` and no buffer, an
    ``open(..., "w")``, a ``torch.save`` / ``onnx.save`` / ``torch.onnx.export``."""
    found = []
    tree = ast.parse(path.read_text())
    forwarded = {
        id(call)
        for function in ast.walk(tree)
        if isinstance(function, ast.FunctionDef) and (path.name, function.name) in FORWARDS
        for call in ast.walk(function)
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or id(node) in forwarded:
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        arguments = [*node.args, *(k.value for k in node.keywords)]
        if name == "open":
            mode = node.args[1] if len(node.args) > 1 else None
            writes = isinstance(mode, ast.Constant) and set(str(mode.value)) & set("wax+")
            if writes and not _names(node.args[0]) & ALLOWED_TARGETS:
                found.append(f"{path.name}:{node.lineno} open(..., {mode.value!r})")
            continue
        if name == "save" and isinstance(func, ast.Attribute):
            owner = func.value
            if isinstance(owner, ast.Name) and owner.id in ("torch", "onnx"):
                if not set().union(*map(_names, arguments)) & ALLOWED_TARGETS:
                    found.append(f"{path.name}:{node.lineno} {owner.id}.save")
            continue
        if name not in WRITERS or name == "to_csv" and not node.args:
            continue  # to_csv() with no path returns the text
        if name in PATH_METHODS and not isinstance(func, ast.Attribute):
            continue
        names = set().union(*map(_names, arguments)) if arguments else set()
        if isinstance(func, ast.Attribute):
            names |= _names(func.value) if name in ("write_text", "write_bytes") else set()
        if not names & ALLOWED_TARGETS:
            found.append(f"{path.name}:{node.lineno} {name}")
    return found


def test_no_writer_bypasses_the_policy():
    """Every file the command line, the exports, the reports and the app write goes through
    :func:`hydra_core.outputs.write_output` (a writer's target is its temporary file ``tmp``) or
    into memory (``buffer``, a download)."""
    folders = [
        PACKAGE_DIR / "cli", PACKAGE_DIR / "export", PACKAGE_DIR / "report", ROOT / "hydra_ui",
        ROOT / "pages",
    ]  # fmt: skip
    files = [p for folder in folders for p in sorted(folder.rglob("*.py"))] + [ROOT / "app.py"]
    bypass = {str(p.relative_to(ROOT)): calls for p in files if (calls := _writer_calls(p))}
    assert not bypass, f"writers outside the output policy: {bypass}"


def test_the_check_sees_a_bypass(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "frame.to_csv(out / 'a.csv')\nPath(x).write_text('t')\ntorch.save(m, path)\n"
        "open(p, 'w')\nwrite_output(p, lambda tmp: frame.to_csv(tmp))\nframe.to_csv(buffer)\n"
    )
    assert [c.split()[1] for c in _writer_calls(sample)] == [
        "to_csv", "write_text", "torch.save", "open(...,",
    ]  # fmt: skip


# --- cause 1: the commands ------------------------------------------------------------------------


def test_export_refuses_an_existing_file_an_input_and_a_shipped_asset(
    checkpoint, masks, tmp_path, capsys, shipped
):
    base = ["export", "--model", checkpoint, "--masks", str(masks), "--no-check"]
    existing = tmp_path / "hydra.onnx"
    existing.write_bytes(b"mine")
    before = snapshot(tmp_path)
    line = refused(capsys, *base, "--onnx", str(existing))
    assert f"--onnx {existing} exists already" in line and "--overwrite" in line
    line = refused(capsys, *base, "--onnx", str(masks), "--overwrite")
    assert f"--onnx {masks} is the --masks this command reads" in line
    line = refused(capsys, *base, "--onnx", checkpoint, "--overwrite")
    assert "is the --model this command reads" in line
    asset = ASSETS_DIR / "fmnist_vit_default.safetensors"
    line = refused(capsys, *base, "--onnx", str(asset), "--overwrite")
    assert "inside the installed Hydra Lab package" in line
    line = refused(capsys, *base, "--onnx", str(tmp_path / "members.json" / "x.onnx"))
    assert "is a file, not a folder" in line
    line = refused(capsys, *base, "--onnx", str(tmp_path))
    assert "is a folder" in line
    assert snapshot(tmp_path) == before
    code, err = run(capsys, *base, "--onnx", str(existing), "--overwrite")
    assert code == 0, err
    assert existing.read_bytes()[:4] != b"mine" and not list(tmp_path.glob(".*tmp"))


def test_masks_export_refuses_to_write_onto_its_mask_file(checkpoint, masks, tmp_path, capsys):
    base = ["masks", "export", "--model", checkpoint, "--masks", str(masks)]
    before = snapshot(tmp_path)
    for to in ("plain", "nnsight"):
        line = refused(capsys, *base, "--to", to, "--out", str(masks), "--overwrite")
        assert "is the --masks this command reads" in line
    out = tmp_path / "plain.json"
    out.write_text("mine")
    before = snapshot(tmp_path)
    assert "exists already" in refused(capsys, *base, "--to", "plain", "--out", str(out))
    assert snapshot(tmp_path) == before


def test_masks_refuses_to_write_onto_its_stability_input(checkpoint, tmp_path, capsys):
    stability = tmp_path / "stability.json"
    stability.write_text(json.dumps({"format": "hydra-stability"}))
    before = snapshot(tmp_path)
    line = refused(
        capsys, "masks", "--model", checkpoint, *DATA, "--ranking-source", "stability",
        "--stability", str(stability), "--out", str(stability), "--overwrite",
    )  # fmt: skip
    assert "is the --stability this command reads" in line
    assert snapshot(tmp_path) == before


def test_an_output_folder_inside_the_package_is_refused(checkpoint, capsys, shipped):
    line = refused(
        capsys, "search", "--model", checkpoint, *DATA, "--budget", "2", "--out", str(ASSETS_DIR)
    )
    assert "inside the installed Hydra Lab package" in line


# --- cause 9: generated module names --------------------------------------------------------------


@pytest.mark.parametrize(
    "name, fixed",
    [("my-masks.py", "my_masks.py"), ("2026.py", "masks_2026.py"), ("class.py", "class_masks.py"),
     ("masks.txt", "masks.py")],
)  # fmt: skip
def test_an_nnsight_module_name_python_cannot_import_is_refused_with_the_fix(
    checkpoint, masks, tmp_path, capsys, name, fixed
):
    base = ["masks", "export", "--model", checkpoint, "--masks", str(masks), "--to", "nnsight"]
    before = snapshot(tmp_path)
    line = refused(capsys, *base, "--out", str(tmp_path / name))
    assert f"use --out {tmp_path / fixed}" in line
    assert snapshot(tmp_path) == before
    code, err = run(capsys, *base, "--out", str(tmp_path / fixed.replace(".txt", ".py")))
    assert code == 0, err
    module = Path(fixed).stem
    assert f"`{module}.apply(model, 'drop0')`" in run.out


def test_the_default_nnsight_module_of_a_digit_mask_file_is_importable(
    checkpoint, tmp_path, capsys, monkeypatch
):
    masks = write_masks(load_model(checkpoint), tmp_path / "2026-run.json")
    monkeypatch.chdir(tmp_path)
    argv = ["masks", "export", "--model", checkpoint, "--masks", str(masks), "--to", "nnsight"]
    code, err = run(capsys, *argv)
    assert code == 0, err
    written = tmp_path / "results" / "masks" / "masks_2026_run_nnsight.py"
    assert written.is_file() and "`masks_2026_run_nnsight.apply(" in run.out


# --- cause 8: options that would be ignored -------------------------------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        (["hydra", "--masks", "m.json", "--mc-passes", "3"],
         "--mc-passes is read only with --baselines mc-dropout"),
        (["hydra", "--masks", "m.json", "--mc-dropout-rate", "0.1", "--baselines", "temperature"],
         "--mc-dropout-rate is read only with --baselines mc-dropout"),
        (["export", "--hydra", "h.safetensors", "--model", "dinov2-s", "--onnx", "x.onnx"],
         "--model is read only with --masks"),
        (["masks", "--ranking-source", "stability", "--stability", "s.json", "--objective", "acc"],
         "--objective is read only with --strategy circuit or identical-circuit, or "
         "seed-sampling of --ranking-source greedy"),
        (["masks", "--strategy", "taylor", "--objective", "ood"], "--objective is read only"),
    ],
)  # fmt: skip
def test_an_option_the_command_would_ignore_is_refused(
    tmp_path, capsys, monkeypatch, argv, message
):
    monkeypatch.chdir(tmp_path)
    line = refused(capsys, *argv)
    assert message in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has CUDA")
@pytest.mark.parametrize("command", ["export", "eval", "masks"])
def test_a_device_the_machine_lacks_is_refused_by_every_command(
    checkpoint, masks, tmp_path, capsys, command
):
    argv = {
        "export": ["export", "--model", checkpoint, "--masks", str(masks), "--onnx",
                   str(tmp_path / "x.onnx")],
        "eval": ["eval", "--model", checkpoint],
        "masks": ["masks", "export", "--model", checkpoint, "--masks", str(masks), "--to",
                  "plain", "--out", str(tmp_path / "p.json")],
    }[command]  # fmt: skip
    before = snapshot(tmp_path)
    line = refused(capsys, *argv, "--device", "cuda")
    assert "--device cuda: this machine has no CUDA GPU; pass --device cpu" in line
    assert snapshot(tmp_path) == before


# --- cause 2: a run's identity includes its options ----------------------------------------------


def test_claim_refuses_the_same_command_with_other_options(tmp_path):
    model = {"name": "m", "layers": 2, "heads": 4, "weights": "abc"}
    data = {"sets": ["a"], "fingerprint": "f"}
    folder = tmp_path / "sweep"
    claim_folder(folder, model=model, data=data, command="sweep layers", options={"--points": [2]})
    (folder / "layers.csv").write_text("done")
    claim_folder(folder, model=model, data=data, command="sweep layers", options={"--points": [2]})
    before = snapshot(folder)
    with pytest.raises(InputError) as caught:
        claim_folder(
            folder, model=model, data=data, command="sweep layers", options={"--points": [2, 4]}
        )
    message = str(caught.value)
    assert "made with --points 2, not 2 4" in message and "--overwrite" in message
    assert snapshot(folder) == before
    claim_folder(
        folder, model=model, data=data, command="sweep layers", options={"--points": [4]},
        overwrite=True,
    )  # fmt: skip
    assert json.loads((folder / MANIFEST).read_text())["options"]["sweep layers"] == {
        "--points": [4]
    }


def test_a_folder_of_a_version_without_an_option_resumes_at_its_none(tmp_path):
    """A new option (``report --candidates``) is absent from the manifests of folders written
    before it: read as None there, so the same run resumes, and a value is another run. (The
    comparison used to fail with StopIteration: the dicts differed, no option's value did.)"""
    model = {"name": "m", "layers": 2, "heads": 4, "weights": "abc"}
    data = {"sets": ["a"], "fingerprint": "f"}
    folder = tmp_path / "report"
    claim_folder(folder, model=model, data=data, command="report", options={"--seeds": [0]})
    (folder / "report.md").write_text("done")
    now = {"--seeds": [0], "--candidates": None}
    claim_folder(folder, model=model, data=data, command="report", options=now)  # a resume
    with pytest.raises(InputError, match="made with --candidates not given, not 8"):
        claim_folder(
            folder, model=model, data=data, command="report", options={**now, "--candidates": 8}
        )


def test_a_sweep_of_other_points_into_a_finished_sweep_is_refused(tmp_path, monkeypatch):
    from hydra_core.report import sweeps

    finished = {"n": 0}

    def layers(run, config):  # the sweep's work, instant: its table of the points asked for
        finished["n"] += 1
        import pandas as pd

        return pd.DataFrame({"per_layer": list(config.removed_per_layer)}), None

    monkeypatch.setitem(sweeps.SWEEP_FUNCTIONS, "layers", layers)
    monkeypatch.setattr(sweeps, "plot_sweep", lambda *a: _Figure())
    monkeypatch.setattr(sweeps.Pipeline, "write", _write_table)
    checkpoint = write_tiny_checkpoint(tmp_path / "tiny.safetensors")
    config = sweeps.SweepConfig.quick(model=checkpoint, device="cpu", n_search=8, n_report=8)
    out = tmp_path / "sweep"
    sweeps.run_sweep("layers", config, out, log=lambda *_: None)
    before = snapshot(out)
    other = sweeps.SweepConfig.quick(
        model=checkpoint, device="cpu", n_search=8, n_report=8, removed_per_layer=(2,)
    )
    with pytest.raises(InputError, match=r"made with --points 2 4, not 2 \(other options"):
        sweeps.run_sweep("layers", other, out, log=lambda *_: None)
    assert snapshot(out) == before and finished["n"] == 1
    sweeps.run_sweep("layers", config, out, log=lambda *_: None)  # the same run again: a resume
    assert finished["n"] == 2


#: for each command whose folder records its options: a run, and the same run with one option
#: changed that changes its results
OTHER_OPTIONS = {
    "importance": (["--taylor-samples", "8"], ["--taylor-samples", "12"]),
    "heads": (["--boot", "50"], ["--boot", "60"]),
    "cahp": (  # CAHP clusters each class: 40 items give every class two
        ["--n-search", "40", "--variant", "accuracy-knee"],
        ["--n-search", "40", "--variant", "accuracy-knee", "--k-step", "2"],
    ),
    "hydra": (["--no-latency"], ["--no-latency", "--baselines", "temperature"]),
}


@pytest.mark.parametrize("command", sorted(OTHER_OPTIONS))
def test_a_command_with_other_options_is_another_run(command, checkpoint, masks, tmp_path, capsys):
    """Cause 2 for every command that writes a folder: the same command again is a resume, the
    command with an option that changes its results is refused (one line naming the option,
    nothing on disk changed), and replaces the folder with --overwrite."""
    first, second = OTHER_OPTIONS[command]
    out = tmp_path / command
    base = [command, "--model", checkpoint, *DATA, "--out", str(out)]
    if command == "hydra":
        base += ["--masks", str(masks)]
    assert run(capsys, *base, *first)[0] == 0
    assert run(capsys, *base, *first)[0] == 0  # the same run again
    before = snapshot(tmp_path)
    line = refused(capsys, *base, *second)
    assert f"holds {command} results made with" in line and "--overwrite" in line
    assert snapshot(tmp_path) == before
    assert run(capsys, *base, *second, "--overwrite")[0] == 0
    recorded = json.loads((out / MANIFEST).read_text())["options"][command]
    changed, value = second[-2:]
    assert str(recorded[changed]) in (value, str([value]))


class _Figure:
    def savefig(self, target, **kwargs) -> None:
        Path(target).write_text("figure")


def _write_table(self, tables, setup, systems, markdown) -> dict:
    """Pipeline.write without systems: the tables, moved into place, then the manifest."""
    from hydra_core.outputs import write_csv

    for name, table in tables.items():
        write_csv(self.out / f"{name}.csv", table, index=False)
    self.final.mkdir(parents=True, exist_ok=True)
    for path in sorted(self.out.iterdir()):
        os.replace(path, self.final / path.name)
    self.out.rmdir()
    self.out = self.final
    self._claim(record=True)
    return {}


# --- cause 10: leftovers -------------------------------------------------------------------------


def test_a_refused_run_leaves_no_folder_holding_only_the_manifest(checkpoint, tmp_path, capsys):
    out = tmp_path / "search"
    # refused after the folder is claimed: the budget is more heads than the model has
    code, err = run(capsys, "search", "--model", checkpoint, *DATA, "--budget", "999",
                    "--out", str(out))  # fmt: skip
    assert code == 2, err
    assert not out.exists()


def test_a_killed_runs_staging_folder_is_named_by_the_next_run(tmp_path, monkeypatch):
    from hydra_core.report import sweeps

    left = tmp_path / ".sweep.partial-abc123"
    left.mkdir()
    lines = []
    monkeypatch.setitem(sweeps.SWEEP_FUNCTIONS, "layers", _fail)
    checkpoint = write_tiny_checkpoint(tmp_path / "tiny.safetensors")
    config = sweeps.SweepConfig.quick(model=checkpoint, device="cpu", n_search=8, n_report=8)
    with pytest.raises(RuntimeError, match="stop here"):
        sweeps.run_sweep("layers", config, tmp_path / "sweep", log=lines.append)
    with pytest.raises(RuntimeError, match="stop here"):  # a folder whose parent is new too
        sweeps.run_sweep("layers", config, tmp_path / "new" / "sweep", log=lambda *_: None)
    notes = [line for line in lines if "partial" in line]
    assert len(notes) == 1 and str(left) in notes[0] and "can be deleted" in notes[0]
    assert not (tmp_path / "sweep").exists()  # a failed run leaves no folder
    assert not (tmp_path / "new" / "sweep").exists()


def _fail(run, config):
    raise RuntimeError("stop here")


def test_a_one_member_mask_file_says_overlap_needs_two(checkpoint, tmp_path, capsys):
    out = tmp_path / "one.json"
    code, err = run(capsys, "masks", "--model", checkpoint, *DATA, "--strategy", "taylor",
                    "--m", "1", "--budget", "2", "--out", str(out))  # fmt: skip
    assert code == 0, err
    assert "nan" not in run.out and "overlap needs two members" in run.out
    assert "(1 member)" in run.out


# --- cause 3: provenance checked -----------------------------------------------------------------


def _stability_file(path: Path, model: dict, data: dict | None = None) -> Path:
    from hydra_core.analysis.stability import StabilityResult

    found = StabilityResult(
        objective="avg", budget=2, seed=0, method="exact", num_heads=(4, 4), n_id=5, n_ood=7,
        orders=[[(0, 1), (1, 2)], [(0, 1), (1, 3)]], scores=[[0.5, 0.6], [0.5, 0.6]],
        accuracy=[[0.9, 0.8], [0.9, 0.8]], auroc=[[0.6, 0.7], [0.6, 0.7]], group_steps=3,
        seconds=1.0, complete=True,
    )  # fmt: skip
    entry = {**found.to_dict(), "search_ranking": [[0, 1], [1, 2]], "model": model}
    if data is not None:
        entry["data"] = data
    path.write_text(json.dumps(entry))
    return path


def test_heads_refuses_another_models_stability_file_of_the_same_shape(
    checkpoint, tmp_path, capsys
):
    other = load_model(write_tiny_checkpoint(tmp_path / "other.safetensors", seed=1))
    path = _stability_file(tmp_path / "stability.json", other.identity())
    before = snapshot(tmp_path)
    line = refused(capsys, "heads", "--model", checkpoint, *DATA, "--stability", str(path),
                   "--out", str(tmp_path / "heads"))  # fmt: skip
    assert f"--stability {path} was made for" in line and "not the loaded model" in line
    assert snapshot(tmp_path) == before


def test_heads_and_masks_refuse_a_stability_file_of_other_data(checkpoint, tmp_path, capsys):
    mine = load_model(checkpoint).identity()
    data = {"sets": ["fashion_mnist", "noise"], "fingerprint": "0000000000000000"}
    path = _stability_file(tmp_path / "stability.json", mine, data)
    before = snapshot(tmp_path)
    line = refused(capsys, "heads", "--model", checkpoint, *DATA, "--stability", str(path),
                   "--out", str(tmp_path / "heads"))  # fmt: skip
    assert "was computed on other data" in line and "--n-search" in line
    line = refused(capsys, "masks", "--model", checkpoint, *DATA, "--ranking-source",
                   "stability", "--stability", str(path), "--budget", "2", "--pool", "2",
                   "--m", "1", "--out", str(tmp_path / "m.json"))  # fmt: skip
    assert "was computed on other data" in line
    assert snapshot(tmp_path) == before


def test_a_search_of_other_options_is_another_run_not_a_resume(checkpoint, tmp_path, capsys):
    """A search folder holds one search per objective; the same objective again with an option
    that changes its files (a guided search's K, the OOD aggregate, a held-out part) would
    replace them without a word, so it is refused (one line naming the option) unless
    ``--overwrite``; the same search again (a longer budget: it continues) and another objective
    are not."""
    out = tmp_path / "search"
    base = ["search", "--model", checkpoint, *DATA, "--out", str(out)]
    code, err = run(capsys, *base, "--budget", "2")
    assert code == 0, err
    code, err = run(capsys, *base, "--budget", "3")  # the same search, continued
    assert code == 0, err
    before = snapshot(tmp_path)
    for extra, option in (
        (["--candidates", "4"], "--candidates"),
        (["--ood-aggregate", "min"], "--ood-aggregate"),
        (["--holdout", "0.5"], "--holdout"),
    ):
        line = refused(capsys, *base, "--budget", "3", *extra)
        assert f"holds search greedy_avg results made with {option}" in line
        assert "--overwrite" in line
    assert snapshot(tmp_path) == before
    code, err = run(capsys, *base, "--budget", "2", "--objective", "ood", "--candidates", "4")
    assert code == 0, err  # another objective: its own files, its own options
    code, err = run(capsys, *base, "--budget", "3", "--candidates", "4", "--overwrite")
    assert code == 0, err
    assert json.loads((out / "greedy_avg.json").read_text())["candidates"] == 4


def test_importance_refuses_a_search_of_other_data(checkpoint, tmp_path, capsys):
    """``importance --greedy`` checks the search file's data as ``heads`` and ``masks`` check a
    stability file's: a search of the same model on other search data is refused, in one line,
    before any work, and nothing is written."""
    searched = tmp_path / "search"
    other = ["--n-search", "12", *DATA[2:]]  # another search sample: another data fingerprint
    code, err = run(capsys, "search", "--model", checkpoint, *other, "--budget", "1",
                    "--out", str(searched))  # fmt: skip
    assert code == 0, err
    before = snapshot(tmp_path)
    line = refused(capsys, "importance", "--model", checkpoint, *DATA, "--greedy",
                   str(searched / "greedy_avg.json"), "--out", str(tmp_path / "imp"))  # fmt: skip
    assert f"--greedy {searched / 'greedy_avg.json'} was computed on other data" in line
    assert snapshot(tmp_path) == before


def test_a_mask_file_from_a_stability_ranking_records_the_files_sample_sizes(
    checkpoint, tmp_path, capsys
):
    from hydra_core.analysis.inputs import search_inputs
    from hydra_core.data.benchmark import default_benchmark
    from hydra_core.outputs import data_identity

    loaded = load_model(checkpoint)
    benchmark = default_benchmark(n_search=16, n_report=24, ood=["noise"])
    data = data_identity(benchmark, "search")
    assert len(search_inputs(loaded.preprocess, benchmark).id_x) == 16  # not the file's 5
    path = _stability_file(tmp_path / "stability.json", loaded.identity(), data)
    out = tmp_path / "m.json"
    code, err = run(capsys, "masks", "--model", checkpoint, *DATA, "--ranking-source",
                    "stability", "--stability", str(path), "--strategy", "circuit", "--m", "1",
                    "--budget", "2", "--out", str(out))  # fmt: skip
    assert code == 0, err
    ranking = json.loads(out.read_text())["members"][0]["provenance"]["ranking"]
    assert ranking["search"]["id"]["n"] == 5 and ranking["search"]["ood_pooled"] == 7
    assert ranking["search"]["data"] == data and ranking["resamples"] == 2


# --- cause 5: image folders as torchvision reads them ---------------------------------------------


def _image(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 8, 3), value, dtype=np.uint8)).save(path)


def test_images_in_sub_folders_of_a_class_folder_are_read_as_imagefolder_reads_them(tmp_path):
    from torchvision.datasets import ImageFolder

    from hydra_core.data.generic import load_image_folder

    root = tmp_path / "data"
    _image(root / "cat" / "a.png", 10)
    _image(root / "cat" / "deep" / "b.png", 20)
    _image(root / "cat" / "deep" / "er" / "c.png", 30)
    _image(root / "dog" / "only" / "d.png", 40)  # a class folder of sub-folders only
    _image(root / "dog" / "z.png", 50)
    loaded = load_image_folder(root, size=8)
    reference = ImageFolder(str(root))
    assert loaded.classes == tuple(reference.classes)
    assert loaded.labels.tolist() == [label for _, label in reference.samples]
    values = [int(np.asarray(Image.open(p))[0, 0, 0]) for p, _ in reference.samples]
    assert loaded.images[:, 0, 0, 0].tolist() == values


def test_a_symlink_loop_in_an_image_folder_is_named_in_one_line(tmp_path, capsys):
    from hydra_core.data.generic import load_image_folder

    root = tmp_path / "data"
    _image(root / "cat" / "a.png", 10)
    (root / "cat" / "again").symlink_to(root / "cat")
    with pytest.raises(InputError, match=r"a symbolic link back to .*\(a loop\)") as caught:
        load_image_folder(root, size=8)
    assert "\n" not in str(caught.value)
    (root / "cat" / "again").unlink()
    (root / "cat" / "self").symlink_to(root / "cat" / "self")
    with pytest.raises(InputError, match="is a symbolic link loop"):
        load_image_folder(root, size=8)


# --- cause 6: texts longer than the model's positions ---------------------------------------------


def test_texts_longer_than_the_models_positions_are_cut(tmp_path, capsys):
    from tests.conftest import WORDS, save_tiny_folder

    folder = tmp_path / "model"
    save_tiny_folder(folder, ("negative", "positive"))  # 40 positions
    loaded = load_model(str(folder))
    assert loaded.preprocess.max_length == 40 and "cut to its 40 positions" in loaded.description
    long = " ".join(WORDS[5:] * 20)
    with torch.no_grad():
        logits = loaded.model(loaded.preprocess([long, "short"]))
    assert logits.shape == (2, 2) and torch.isfinite(logits).all()
    rows = [{"text": f"{long} {i}", "label": ["negative", "positive"][i % 2]} for i in range(20)]
    import pandas as pd

    pd.DataFrame(rows).to_csv(tmp_path / "long.csv", index=False)
    pd.DataFrame([{"text": f"{w} {long}"} for w in WORDS[5:25]]).to_csv(
        tmp_path / "far.csv", index=False
    )
    code, err = run(capsys, "eval", "--model", str(folder), "--id-file",
                    str(tmp_path / "long.csv"), "--ood-file", str(tmp_path / "far.csv"),
                    "--device", "cpu")  # fmt: skip
    assert code == 0, err
    assert "Traceback" not in err


# --- cause 7: messages in the user's words --------------------------------------------------------


def test_messages_name_the_users_own_option_or_control():
    from hydra_core.errors import choice, surface

    assert choice("allow_identical") == "allow_identical=True"
    with surface("cli"):
        assert choice("allow_identical") == "--allow-identical"
    with surface("app"):
        assert "command line" in choice("allow_identical")
        assert "Masks page" in choice("allow_other_weights")


def test_a_mask_file_without_a_weights_fingerprint_says_so(checkpoint, masks, tmp_path, capsys):
    data = json.loads(masks.read_text())
    data["model"].pop("weights")
    masks.write_text(json.dumps(data))
    line = refused(capsys, "masks", "export", "--model", checkpoint, "--masks", str(masks),
                   "--to", "plain", "--out", str(tmp_path / "p.json"))  # fmt: skip
    assert "names no weights fingerprint" in line and "--allow-other-weights" in line
    assert "None" not in line


@pytest.mark.parametrize("suffix, what", [(".json", "a JSON file"), (".onnx", "an ONNX file")])
def test_a_json_or_onnx_file_given_as_a_model_is_named(tmp_path, capsys, suffix, what):
    path = tmp_path / f"model{suffix}"
    path.write_text("{}")
    line = refused(capsys, "eval", "--model", str(path), *DATA)
    assert f"{path} is {what}" in line and "not a model" in line and "safetensors" in line


def test_a_role_typo_is_named_not_reported_as_a_missing_path(checkpoint, tmp_path, capsys):
    _image(tmp_path / "faces" / "a.png", 1)
    line = refused(capsys, "eval", "--model", checkpoint, *DATA, "--ood-folder",
                   f"mid:{tmp_path / 'faces'}")  # fmt: skip
    assert "'mid' is not a role" in line and "near:, far: or search:" in line


def test_a_long_csv_field_is_read(tmp_path):
    from hydra_core.data.text_files import _read_rows

    path = tmp_path / "long.csv"
    path.write_text('text,label\n"' + "word " * 250_000 + '",positive\n')
    rows, columns = _read_rows(path)
    assert columns == {"text", "label"} and len(rows[0][1]["text"]) == 1_250_000


def test_one_search_item_still_takes_one_item_of_every_ood_set():
    from hydra_core.analysis.inputs import search_inputs
    from hydra_core.data.benchmark import default_benchmark

    benchmark = default_benchmark(n_search=1, n_report=8, ood=["noise", "mnist"])
    found = search_inputs(lambda x: x.float(), benchmark)
    assert len(found.id_x) == 1 and len(found.ood_x) == 2
    assert len(set(found.ood_sets)) == 2 == len(benchmark.ood_search)


def test_ctrl_c_before_any_work_does_not_claim_progress_was_saved():
    from hydra_core.cli import STOPPED

    assert "progress saved" not in STOPPED and "nothing is saved" in STOPPED


# --- the app: long texts on every page, another model's stability upload -----------------------


PAGES = [
    "pages/1_setup.py", "pages/2_headmap.py", "pages/3_importance.py",
    "pages/4_representations.py", "pages/5_masks.py", "pages/6_hydra.py",
]  # fmt: skip


def test_every_page_takes_texts_longer_than_the_models_positions(tmp_path, monkeypatch):
    import pandas as pd

    from hydra_ui.context import SetupConfig, disk_cache
    from tests.app.conftest import new_app
    from tests.conftest import WORDS, save_tiny_folder

    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))
    disk_cache.clear()
    save_tiny_folder(tmp_path / "model", ("negative", "positive"))  # 40 positions
    long = " ".join(WORDS[5:] * 10)  # far more than 40 tokens
    first = sentences(100)  # distinct beginnings, then far more than 40 tokens
    rows = [{"text": f"{t} {long}", "label": ["negative", "positive"][i % 2]}
            for i, t in enumerate(first[:40])]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / "id.csv", index=False)
    for name, offset in (("far", 40), ("search", 70)):
        texts = [{"text": f"{t} {long}"} for t in first[offset : offset + 30]]
        pd.DataFrame(texts).to_csv(tmp_path / f"{name}.csv", index=False)
    at = new_app(
        SetupConfig(
            model=str(tmp_path / "model"),
            id_source=str(tmp_path / "id.csv"),
            ood_sources=(f"far: {tmp_path / 'far.csv'}", f"search: {tmp_path / 'search.csv'}"),
            ood=(),
            search_ood=(),
            n_search=16,
            n_report=16,
            device="cpu",
        )
    )
    at.run()
    for page in PAGES:
        at.switch_page(page)
        at.run()
        assert not at.exception, (page, [e.value for e in at.exception])
        assert not at.error, (page, [e.value for e in at.error])


def test_the_evidence_upload_refuses_another_models_file_of_the_same_shape(
    checkpoint, tmp_path, monkeypatch
):
    from streamlit.delta_generator import DeltaGenerator

    from hydra_ui.context import SetupConfig, disk_cache
    from tests.app.conftest import new_app

    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))
    disk_cache.clear()
    other = load_model(write_tiny_checkpoint(tmp_path / "other.safetensors", seed=1))
    path = _stability_file(tmp_path / "stability.json", other.identity())

    class Upload:
        name = "stability.json"

        def getvalue(self) -> bytes:
            return path.read_bytes()

    monkeypatch.setattr(DeltaGenerator, "file_uploader", lambda *a, **k: Upload())
    at = new_app(
        SetupConfig(model=checkpoint, ood=("noise",), n_search=16, n_report=16, device="cpu")
    )
    at.run()
    at.switch_page("pages/2_headmap.py")
    at.run()
    errors = [e.value for e in at.error]
    assert any("stability.json was made for" in e and "not the loaded model" in e for e in errors)
    assert not at.exception
