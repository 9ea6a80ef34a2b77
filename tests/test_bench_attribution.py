"""bench/attribution.py's options: the report's data, the stability reference, the output policy
(no searches run, no timings)."""

from __future__ import annotations

import csv

import pytest

from bench import attribution


def test_report_inputs_default_to_the_reports_size():
    args = attribution.parser().parse_args(["--inputs", "report", "--budget", "36"])
    assert args.inputs == "report" and args.n is None and args.held_out is None
    assert attribution.REPORT_N == 256
    assert attribution.parser().parse_args([]).inputs == "halves"


@pytest.mark.parametrize("text", [False, True])
def test_stability_row_is_the_committed_reports(text):
    path = attribution.TEXT_STABILITY_CSV if text else attribution.STABILITY_CSV
    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if r["circuit"] == "CircAvg"]
    budget = int(rows[0]["budget"])
    found = attribution.stability_row(text, "avg", budget)
    assert float(found["jaccard"]) == float(rows[0]["jaccard"])
    assert attribution.stability_row(text, "avg", budget + 1) is None


def test_existing_output_is_refused_without_overwrite(tmp_path, capsys):
    out = tmp_path / "found.csv"
    out.write_text("kept")
    code = attribution.main(["--inputs", "report", "--csv", str(out)])
    assert code == 2
    assert "--csv" in capsys.readouterr().err
    assert out.read_text() == "kept"


def test_csv_with_timing_is_refused(tmp_path, capsys):
    code = attribution.main(["--timing", "vit-b16", "--csv", str(tmp_path / "t.csv")])
    assert code == 2
    assert "--timing" in capsys.readouterr().err
    assert not (tmp_path / "t.csv").exists()
