"""The README stays true: its Python tour runs as written, on the embedded default model."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

from hydra_core.zoo.default import DEFAULT_CHECKPOINT

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "docs" / "example.py"


def code_lines(text: str) -> set[str]:
    """The code of every line, without indentation and trailing comments."""
    code = (line.split("  #")[0].strip() for line in text.splitlines())
    return {line for line in code if line and not line.startswith("#")}


def test_readme_tour_is_the_tested_script():
    """Every line of code of the README's first Python block is in docs/example.py (comments aside,
    and the lines that only show what to look at, which the script prints), so running the script
    checks the README."""
    readme = (REPO / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    script = code_lines(EXAMPLE.read_text())
    missing = [
        line
        for line in code_lines(block)
        if not line.startswith(("search.labels()", "report.summary()", "member_logits = hydra("))
        and line not in script
    ]
    assert not missing, f"README lines not in docs/example.py: {missing}"


@pytest.mark.skipif(not DEFAULT_CHECKPOINT.exists(), reason="needs the shipped checkpoint")
def test_example_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path))  # a cold cache: every step really runs
    namespace = runpy.run_path(str(EXAMPLE), run_name="__main__")
    out = capsys.readouterr().out
    search, report = namespace["search"], namespace["report"]
    assert len(search.order) == 6 and len(search.scores) == 6
    assert namespace["member_logits"].shape == (8, 3, 10)
    summary = report.summary()
    assert {"single", "Hydra (fused)", "Hydra (unfused)"} <= set(summary["system"])
    fused = summary.set_index("system").loc["Hydra (fused)"]
    unfused = summary.set_index("system").loc["Hydra (unfused)"]
    assert fused["accuracy"] == pytest.approx(unfused["accuracy"], abs=1e-6)  # zero-shot: equal
    assert "removed:" in out and "Hydra (fused)" in out
    baselines = set(summary["system"])  # the last report: Hydra beside the baselines
    assert {"Temperature Scaling", "MC Dropout (p=0.1, post hoc)"} <= baselines
