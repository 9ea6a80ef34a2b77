"""The ``heads`` command on a tiny checkpoint and a tiny text folder: its files and JSON equal the
library's :func:`~hydra_core.analysis.evidence.head_evidence` on the same data; bad inputs end in
one line and exit code 2."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from hydra_core.analysis.evidence import head_evidence
from hydra_core.cli import main
from hydra_core.cli.common import load_for_cli
from hydra_core.cli.heads import CSV_COLUMNS
from hydra_core.metrics.bootstrap import MIN_BOOT
from hydra_core.outputs import MANIFEST
from tests.cli.test_cli_text import text_setup  # noqa: F401 (a fixture)

DATA = ["--n-search", "40", "--n-report", "30", "--ood", "mnist", "noise", "--device", "cpu"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))


def _library(argv: list[str], boot: int, frequency=None):
    """What the library computes for the command's model and data."""
    from hydra_core.cli import build_parser

    args = build_parser().parse_args(argv)
    loaded, benchmark = load_for_cli(args)
    p = loaded.preprocess
    return head_evidence(
        loaded.model,
        p(benchmark.id_search.inputs),
        benchmark.id_search.labels,
        p(benchmark.id_report.inputs),
        benchmark.id_report.labels,
        {s.name: p(s.inputs) for s in benchmark.ood_report},
        n_boot=boot,
        frequency=frequency,
    )


def _check_against_library(out, argv, boot, frequency=None) -> dict:
    table = pd.read_csv(out / "heads.csv")
    assert list(table.columns) == list(CSV_COLUMNS)
    assert table["agreed_rank"].tolist() == list(range(1, len(table) + 1))
    expected = _library(argv, boot, frequency).table.sort_values("agreed_rank")
    for column in ("delta_auroc", "delta_auroc_lo", "detector_auroc_hi", "mean_rank"):
        np.testing.assert_allclose(table[column], expected[column], rtol=1e-12, equal_nan=True)
    assert table["label"].tolist() == expected["label"].tolist()
    assert (out / MANIFEST).exists()
    return json.loads((out / "heads.json").read_text())


def test_heads_writes_csv_json_and_prints_json(checkpoint, tmp_path, capsys):
    out = tmp_path / "heads"
    argv = ["heads", "--model", checkpoint, *DATA, "--boot", "50", "--out", str(out), "--json"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)  # stdout holds the JSON alone
    saved = _check_against_library(out, argv, 50)
    assert printed == saved
    assert printed["format"] == "hydra-heads" and len(printed["heads"]) == 8  # 2 x 4 heads
    assert printed["ood_sets"] == ["mnist", "noise"] and printed["bootstrap"]["n_boot"] == 50
    first = printed["heads"][0]
    assert first["agreed_rank"] == 1 and len(first["delta_auroc_ci95"]) == 2
    assert first["keep_frequency"] is None and printed["model"]["heads"] == 4

    # a stability file joins its frequencies: another run, so the folder of the run without it is
    # refused (nothing changed), and replaced with --overwrite
    stability = tmp_path / "stability.json"
    frequency = [[0.1, 0.9, 0.0, 0.5], [1.0, 0.2, 0.3, None]]
    stability.write_text(json.dumps({"format": "hydra-stability", "frequency": frequency}))
    argv = ["heads", "--model", checkpoint, *DATA, "--boot", "50", "--out", str(out)]
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main([*argv, "--stability", str(stability)]) == 2
    assert "made with --stability not given" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main([*argv, "--stability", str(stability), "--overwrite"]) == 0
    shown = capsys.readouterr().out
    assert "rank  head" in shown and "wrote" in shown
    as_array = np.array([[np.nan if v is None else v for v in r] for r in frequency])
    saved = _check_against_library(out, argv, 50, as_array)
    kept = {h["label"]: h["keep_frequency"] for h in saved["heads"]}
    assert kept["L1H0"] == 0.0 and kept["L0H2"] == 1.0  # removed by every resample / by none


def test_heads_on_a_text_model(text_setup, tmp_path, capsys):  # noqa: F811
    _, args = text_setup
    out = tmp_path / "heads"
    argv = ["heads", *args, "--n-search", "30", "--boot", "50", "--out", str(out)]
    assert main(argv) == 0
    saved = _check_against_library(out, argv, 50)
    assert len(saved["heads"]) == 8  # the tiny BERT: 2 x 4
    assert all(h["detector_auroc"] is not None for h in saved["heads"])


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ({"format": "hydra-stability", "frequency": [[0.5] * 3] * 2}, "another model"),
        ({"format": "hydra-masks"}, "not a stability result"),
        (None, "does not exist"),
    ],
)
def test_bad_stability_files_end_in_one_line(checkpoint, tmp_path, capsys, content, match):
    path = tmp_path / "s.json"
    if content is not None:
        path.write_text(json.dumps(content))
    out = tmp_path / "out"
    argv = ["heads", "--model", checkpoint, *DATA, "--stability", str(path), "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err and err.startswith("error:")
    assert not out.exists()  # refused before the output folder is claimed


@pytest.mark.parametrize("boot", ["0", "1", "49"])
def test_too_few_resamples_are_refused_in_one_line(checkpoint, tmp_path, boot, capsys):
    out = tmp_path / "heads"
    assert main(["heads", "--model", checkpoint, *DATA, "--boot", boot, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"--boot: must be at least {MIN_BOOT} for a 95% interval" in err
    assert not out.exists()


def test_bad_boot_and_a_foreign_folder(checkpoint, tmp_path, capsys):
    assert main(["heads", "--model", checkpoint, *DATA, "--boot", "0"]) == 2
    assert f"--boot: must be at least {MIN_BOOT}" in capsys.readouterr().err
    (tmp_path / "mine.txt").write_text("not a run's")
    assert main(["heads", "--model", checkpoint, *DATA, "--out", str(tmp_path)]) == 2
    assert "--overwrite" in capsys.readouterr().err
