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


def test_exact_from_report_is_the_committed_circuit():
    from hydra_core.zoo.registry import load_model

    with attribution.CIRCUITS_CSV.open() as f:
        row = next(r for r in csv.DictReader(f) if r["objective"] == "avg")
    budget = int(row["heads_removed"])
    found = attribution.exact_from_report(load_model("default").model, False, "avg", budget)
    assert [f"L{layer}H{head}" for layer, head in found.order] == row["removed"].split()
    acc, auroc = float(row["search_accuracy"]), float(row["search_auroc"])
    assert found.scores[-1] == pytest.approx((acc + auroc) / 2)
    assert found.steps == budget and found.complete
    assert attribution.report_circuit(False, "avg", budget + 1) is None
    assert attribution.parse_head("L3H10") == (3, 10)


def test_exact_report_needs_the_reports_data(capsys):
    assert attribution.main(["--exact", "report"]) == 2
    assert "--inputs report" in capsys.readouterr().err
    assert attribution.main(["--inputs", "report", "--n", "64", "--exact", "report"]) == 2
