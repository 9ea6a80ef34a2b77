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


def test_exact_report_needs_the_reports_data(capsys):
    assert attribution.main(["--exact", "report"]) == 2
    assert "--inputs report" in capsys.readouterr().err
    assert attribution.main(["--inputs", "report", "--n", "64", "--exact", "report"]) == 2


def test_items_is_n_for_torchrun():
    # torchrun's own parser takes --n for one of its options, so the bench takes --items too
    assert attribution.parser().parse_args(["--items", "64"]).n == 64
    assert attribution.parser().parse_args(["--n", "64"]).n == 64


@pytest.mark.parametrize(
    "argv", [["--stability", "1"], ["--timing", "vit-b16", "--stability", "3"]]
)
def test_stability_needs_two_resamples_of_the_search_mode(argv, capsys):
    assert attribution.main(argv) == 2
    assert "--stability" in capsys.readouterr().err


def test_own_stability_is_greedy_stability_on_the_bench_data():
    import argparse

    import torch

    from hydra_core.analysis.stability import greedy_stability
    from tests.conftest import make_tiny_vit

    model = make_tiny_vit().eval()
    g = torch.Generator().manual_seed(0)
    id_x = torch.randn(12, 1, 16, 16, generator=g)
    id_y = torch.arange(12) % 3
    ood_x = torch.randn(12, 1, 16, 16, generator=g) * 3
    strata = ("a",) * 6 + ("b",) * 6
    args = argparse.Namespace(stability=3, objective="avg", budget=3)
    found = attribution.own_stability(args, model, (id_x, id_y, ood_x, strata), None)
    direct = greedy_stability(
        model, id_x, id_y, ood_x, budget=3, resamples=3, seed=0, ood_strata=strata
    )
    assert found["jaccard"] == direct.jaccard() and found["resamples"] == 3
    assert found["removed"] == [
        " ".join(f"L{layer}H{head}" for layer, head in order) for order in direct.orders
    ]
