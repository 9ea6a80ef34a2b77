"""The README's "Use the results elsewhere" runs as written, on the embedded defaults: its commands,
then each Python snippet (the nnsight one in a process of its own, as nnsight patches Python's
``object`` and torch when imported)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hydra_core.cli import main
from hydra_core.zoo.default import DEFAULT_CHECKPOINT
from tests.conftest import missing_data

REPO = Path(__file__).resolve().parents[1]


def section_blocks() -> list[tuple[str, str]]:
    """The (language, code) blocks of the README section, in order."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Use the results elsewhere\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(bash|python)\n(.*?)```", section, re.S)


def python_block(marker: str) -> str:
    return next(code for lang, code in section_blocks() if lang == "python" and marker in code)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A folder where the README's commands have run (mask file, ONNX files, exported masks)."""
    if not DEFAULT_CHECKPOINT.exists():
        pytest.skip("needs the shipped checkpoint")
    folder = tmp_path_factory.mktemp("elsewhere")
    commands = [code for lang, code in section_blocks() if lang == "bash"]
    assert len(commands) == 1
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setenv("HYDRA_LAB_CACHE", str(folder / "cache"))
        for line in commands[0].splitlines():
            argv = shlex.split(line.split("  #")[0])
            assert argv[:3] == ["python", "-m", "hydra_core"], line
            assert main(argv[3:]) == 0, line
    return folder


def test_the_commands_write_every_file(workdir):
    for name in ("members.json", "hydra.onnx", "member0.onnx", "hydra_masks.py"):
        assert (workdir / name).is_file(), name
    assert (workdir / "members_plain.json").read_text().startswith('{\n  "Taylor seed 0"')


def test_onnx_runtime_snippet_preprocesses_as_hydra_lab(workdir, monkeypatch, capsys):
    from hydra_core.zoo.registry import load_model

    monkeypatch.chdir(workdir)
    namespace: dict = {}
    exec(python_block('ort.InferenceSession("hydra.onnx"'), namespace)
    assert namespace["member_logits"].shape == (8, 3, 10) and namespace["probs"].shape == (8, 10)
    loaded = load_model("default")
    expected = loaded.preprocess(torch.from_numpy(namespace["images"]))
    np.testing.assert_allclose(namespace["x"], expected.numpy(), rtol=0, atol=1e-6)
    assert "Taylor seed 0" in capsys.readouterr().out


def test_nnsight_snippet_runs_and_its_assert_holds(workdir):
    code = python_block("from nnsight import NNsight")
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=workdir,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "HYDRA_LAB_CACHE": str(workdir / "cache")},
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]


def test_plain_json_snippet_reads_the_masks_back(workdir, monkeypatch):
    from hydra_core.masks import load_masks
    from hydra_core.models.adapter import head_layout
    from hydra_core.zoo.registry import load_model

    monkeypatch.chdir(workdir)
    namespace: dict = {}
    exec(python_block("members_plain.json"), namespace)
    loaded = load_model("default")
    members = load_masks("members.json", head_layout(loaded.model), loaded.identity())
    assert list(namespace["masks"]) == [m.name for m in members]
    for member in members:
        assert torch.equal(namespace["masks"][member.name], member.keep)


def test_text_onnx_snippet(tmp_path, monkeypatch):
    from hydra_core.errors import InputError
    from hydra_core.zoo.minilm import wheel_folder

    try:
        wheel_folder()
    except InputError as error:
        missing_data(str(error))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(python_block("text.onnx"), namespace)
    assert namespace["member_logits"].shape == (2, 2, 2)
    hydra, batch = namespace["hydra"], namespace["batch"]
    with torch.no_grad():
        expected = hydra(
            input_ids=torch.from_numpy(batch["input_ids"]),
            attention_mask=torch.from_numpy(batch["attention_mask"]),
        )
    np.testing.assert_allclose(namespace["member_logits"], expected.numpy(), rtol=0, atol=1e-5)
