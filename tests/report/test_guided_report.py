"""``report --candidates K``: every greedy search of a report as the guided search, the setup
saying so, and no stability runs (they resample the exact search)."""

from __future__ import annotations

import pytest

from hydra_core.cli import main
from hydra_core.data.benchmark import default_benchmark
from hydra_core.experiment.pipeline import Pipeline
from hydra_core.experiment.pruning import Budgets
from hydra_core.report.image_config import ReportConfig
from hydra_core.report.markdown import searches_line, stability
from hydra_core.zoo.registry import load_model


def tiny(checkpoint: str) -> tuple:
    """The tiny checkpoint and a small benchmark, as a report's loader gives them."""
    return load_model(checkpoint), default_benchmark(n_search=16, n_report=24, ood=["noise"])


@pytest.fixture
def guided_run(checkpoint, tmp_path):
    lines = []
    run = Pipeline(tmp_path / "report", None, "cpu", None, log=lines.append)
    run.candidates = 2
    run.load(lambda: tiny(checkpoint))
    return run, lines


def test_a_guided_runs_searches_are_guided_and_its_stability_is_left_out(guided_run):
    run, lines = guided_run
    found = run.search("avg", 3)
    assert found.candidates == 2 and found.evaluated == [2, 2, 2]
    assert any("greedy search CircAvg (3 steps, guided K = 2) ..." in line for line in lines)
    stable = run.stability({"avg": found}, run.benchmark, resamples=2, held_out=None)
    assert stable is None and "no stability runs: they resample the exact search" in lines[-1]
    budgets = Budgets.of(run.layout, ReportConfig(removed_per_layer=1))
    setup = run.setup("image", budgets, {"pruning": [0]}, {})
    assert setup["protocol"]["candidates"] == 2
    (line,) = searches_line(setup["protocol"])
    assert line.startswith("- **Searches**: guided (K = 2)") and "stability runs" in line
    assert "Not measured" in stability({}, setup)[2] and "K = 2" in stability({}, setup)[2]


@pytest.mark.parametrize("candidates", [None, 8, 100])  # K of every head (8) is exact
def test_an_exact_run_says_nothing_of_guidance(candidates, checkpoint, tmp_path):
    run = Pipeline(tmp_path / "report", None, "cpu", None, log=lambda _: None)
    run.candidates = candidates
    run.load(lambda: tiny(checkpoint))
    assert run.candidates is None
    assert run.search("avg", 2).candidates is None
    protocol = run.setup("image", Budgets.of(run.layout, ReportConfig()), {}, {})["protocol"]
    assert protocol["candidates"] is None and searches_line(protocol) == []
    assert stability({}, {"protocol": protocol}) == []


@pytest.mark.parametrize(
    "task, runner",
    [
        ("image", "hydra_core.report.run_report"),
        ("text", "hydra_core.report.text.run_text_report"),
        ("zero-shot", "hydra_core.report.zero_shot.run_zero_shot_report"),
    ],
)
def test_report_candidates_reaches_every_reports_configuration(task, runner, monkeypatch):
    """``report --candidates K`` sets the configuration's K (the run's identity, so an exact
    report's folder is another run), for each report."""
    import importlib

    module, name = runner.rsplit(".", 1)
    seen = {}
    monkeypatch.setattr(importlib.import_module(module), name, lambda c, *a, **k: seen.update(c=c))
    extra = ["--model", "openclip:local-dir:/nowhere"] if task == "zero-shot" else []
    assert main(["report", "--task", task, "--candidates", "8", *extra]) == 0
    assert seen["c"].candidates == 8
