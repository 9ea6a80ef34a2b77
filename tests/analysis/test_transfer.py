"""The transfer matrix (hydra_core.analysis.transfer, ``transfer``): each row's search sees only
its own set's search part, each cell is the paired AUROC change a plain computation gives, the
near / far averages are the means of the row's other cells, and the command writes its files."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import roc_auc_score

import hydra_core.analysis.transfer as transfer
from hydra_core.analysis.transfer import every_set_options, row_benchmark, transfer_matrix
from hydra_core.cache import DiskCache
from hydra_core.cli import main
from hydra_core.evaluate import masked
from hydra_core.inference import predict
from hydra_core.models.adapter import parse_head_label
from hydra_core.zoo.registry import load_model

DATA = ["--n-search", "40", "--n-report", "60", "--device", "cpu"]
SETS = ["--ood", "mnist", "noise", "--search-ood", "faces"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def setup(checkpoint):
    loaded = load_model(checkpoint)
    options = every_set_options(loaded.modality, ood=["mnist", "noise"], search_ood=["faces"])
    benchmark = loaded.modality.benchmark(n_search=40, n_report=60, **options)
    return loaded, benchmark


def _rows(x: torch.Tensor) -> set[bytes]:
    return {row.numpy().tobytes() for row in x.float().flatten(1)}


def test_every_set_is_both_searched_on_and_reported_on_in_disjoint_parts(setup):
    _, benchmark = setup
    assert benchmark.protocol == "halves"
    assert benchmark.search_names() == benchmark.report_names() == ["mnist", "noise", "faces"]
    for search, held_out in zip(benchmark.ood_search, benchmark.ood_report, strict=True):
        assert not _rows(search.images) & _rows(held_out.images)
    assert not _rows(benchmark.id_search.images) & _rows(benchmark.id_report.images)


def test_no_search_sees_an_item_it_is_measured_on(setup, monkeypatch):
    """Every search's inputs (recorded) share no item with the ID report part or any set's
    held-out part, and its OOD inputs are items of its own set's search part alone."""
    loaded, benchmark = setup
    seen = []
    real = transfer.greedy_circuit

    def recording(model, id_x, id_y, ood_x, **kwargs):
        seen.append((id_x.clone(), ood_x.clone()))
        return real(model, id_x, id_y, ood_x, **kwargs)

    monkeypatch.setattr(transfer, "greedy_circuit", recording)
    result = transfer_matrix(loaded, benchmark, budget=2, device="cpu")
    assert len(seen) == len(result.sets) == 3
    measured = _rows(loaded.preprocess(benchmark.id_report.images))
    for s in benchmark.ood_report:
        measured |= _rows(loaded.preprocess(s.images))
    for (id_x, ood_x), search in zip(seen, benchmark.ood_search, strict=True):
        assert not (_rows(id_x) | _rows(ood_x)) & measured
        assert _rows(ood_x) <= _rows(loaded.preprocess(search.images))
        row = row_benchmark(benchmark, search.name)
        assert row.search_names() == [search.name]


def _plain_auroc(logits_id: torch.Tensor, logits_ood: torch.Tensor) -> float:
    msp_id = logits_id.softmax(-1).max(-1).values.numpy()
    msp_ood = logits_ood.softmax(-1).max(-1).values.numpy()
    labels = np.r_[np.zeros(len(msp_ood)), np.ones(len(msp_id))]  # OOD positive: low MSP
    return roc_auc_score(1 - labels, -np.r_[msp_ood, msp_id])


def test_cells_and_averages_are_the_plain_computation(setup):
    loaded, benchmark = setup
    result = transfer_matrix(loaded, benchmark, budget=2, device="cpu", cache=DiskCache())
    cells = result.cells.set_index(["searched_on", "reported_on"])
    assert len(cells) == 9
    for name in result.sets:
        assert cells.loc[(name, name), "group"] == "seen"
        keep = torch.ones(2, 4, dtype=torch.bool)
        for label in result.removed[name]:
            keep[parse_head_label(label)] = False
        model = loaded.model.eval()

        def logits(x, keep=keep, model=model):
            return predict(masked(model, keep), x, loaded.preprocess, device="cpu")

        for s in benchmark.ood_report:
            circuit = _plain_auroc(logits(benchmark.id_report.images), logits(s.images))
            dense = _plain_auroc(
                predict(model, benchmark.id_report.images, loaded.preprocess, device="cpu"),
                predict(model, s.images, loaded.preprocess, device="cpu"),
            )
            cell = cells.loc[(name, s.name)]
            assert cell.delta_auroc == pytest.approx(circuit - dense, abs=1e-9)
            assert cell.lo <= cell.delta_auroc <= cell.hi
        for group in ("near", "far"):
            others = result.cells[
                (result.cells.searched_on == name) & (result.cells.group == group)
            ]
            found = result.summary[name].get(group)
            if others.empty:
                assert found is None
            else:
                assert found["delta_auroc"] == pytest.approx(others.delta_auroc.mean(), abs=1e-12)
                assert found["n_sets"] == len(others)
                assert found["lo"] <= found["delta_auroc"] <= found["hi"]


def test_a_guided_matrix_searches_each_row_with_the_guided_search(setup, tmp_path):
    """``candidates=K``: each row's circuit is :func:`greedy_circuit`'s guided search on the
    row's own search data; K at least the model's heads gives the exact matrix."""
    from hydra_core.analysis.greedy import greedy_circuit
    from hydra_core.analysis.inputs import search_inputs
    from hydra_core.models.adapter import head_label

    loaded, benchmark = setup
    guided = transfer_matrix(loaded, benchmark, budget=2, candidates=2, device="cpu")
    assert guided.candidates == 2
    for name in guided.sets:
        inputs = search_inputs(loaded.preprocess, row_benchmark(benchmark, name))
        alone = greedy_circuit(
            loaded.model, inputs.id_x, inputs.id_y, inputs.ood_x, budget=2, candidates=2,
            objective="ood",
        )  # fmt: skip
        assert guided.removed[name] == [head_label(*h) for h in alone.order]
    exact = transfer_matrix(loaded, benchmark, budget=2, device="cpu")
    every = transfer_matrix(loaded, benchmark, budget=2, candidates=8, device="cpu")
    assert every.candidates is None and every.removed == exact.removed
    pd.testing.assert_frame_equal(every.cells, exact.cells)
    # the command's figure says which search drew it, like the app's
    assert "(guided, K = 2)" in transfer.plot_transfer(guided).axes[0].get_title()
    assert "guided" not in transfer.plot_transfer(exact).axes[0].get_title()


def test_the_command_writes_the_matrix_and_resumes_from_the_cache(checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["transfer", "--model", checkpoint, *DATA, *SETS, "--budget", "2", "--out", str(out)]
    assert main([*argv, "--json"]) == 0
    printed = capsys.readouterr()
    found = json.loads(printed.out)
    assert set(found) == {"cells", "summary"}
    assert len(found["cells"]) == 9
    assert set(found["cells"][0]) == {
        "searched_on",
        "reported_on",
        "group",
        "delta_auroc",
        "lo",
        "hi",
    }
    assert {c["group"] for c in found["cells"]} == {"near", "far", "seen"}
    assert set(found["summary"]) == {"mnist", "noise", "faces"}
    for stem in ("transfer_ood.csv", "transfer_ood_summary.csv", "transfer_ood.png"):
        assert (out / stem).is_file()
    table = pd.read_csv(out / "transfer_ood.csv")
    assert table.delta_auroc.tolist() == pytest.approx([c["delta_auroc"] for c in found["cells"]])
    written = json.loads((out / "transfer_ood.json").read_text())
    assert set(written["shortcut"]) == {"mnist", "noise", "faces"}
    assert written["candidates"] is None  # the exact search unless --candidates K
    # a set that warns is told to read its row here, not to run this command again
    warned = [line for line in printed.err.splitlines() if "shortcut:" in line]
    assert len(warned) == sum(e["warns"] for e in written["shortcut"].values())
    assert all("row of the transfer matrix" in line for line in warned)
    assert not any("hydra_core transfer" in line for line in warned)
    # the searches are cached: a second run into another folder gives the same matrix
    assert main([*argv[:-1], str(tmp_path / "again"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == found
    # the folder holds this run: another objective is written beside it
    assert main([*argv, "--objective", "avg"]) == 0
    assert (out / "transfer_avg.csv").is_file()


def test_one_set_and_a_budget_too_large_are_refused(setup, checkpoint, tmp_path, capsys):
    loaded, _ = setup
    one = loaded.modality.benchmark(n_search=40, n_report=60, ood=["mnist"], protocol="halves")
    with pytest.raises(ValueError, match="at least two OOD sets"):
        transfer_matrix(loaded, one, budget=2, device="cpu")
    argv = ["transfer", "--model", checkpoint, *DATA, *SETS, "--budget", "8"]
    assert main([*argv, "--out", str(tmp_path / "b")]) == 2
    assert "--budget must be between 1 and 7" in capsys.readouterr().err


def test_small_held_out_parts_warn_once_for_the_whole_matrix(checkpoint):
    """Every row measures on the same held-out parts: the warning that parts under 10 items have
    no interval comes once, naming each, not once per row (it came once per row)."""
    import warnings

    from hydra_core.metrics import UndefinedMetricWarning

    loaded = load_model(checkpoint)
    options = every_set_options(loaded.modality, ood=["mnist", "noise"], search_ood=["faces"])
    benchmark = loaded.modality.benchmark(n_search=12, n_report=8, **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = transfer_matrix(loaded, benchmark, budget=1, device="cpu")
    small = [str(w.message) for w in caught if issubclass(w.category, UndefinedMetricWarning)]
    assert len(small) == 1, small
    assert all(f"{name} (" in small[0] for name in ("the ID part", "mnist", "noise", "faces"))
    assert result.cells["lo"].isna().all()  # no interval, as the warning says
