"""Degenerate samples are never shown as certain: too few bootstrap resamples are refused, too
few items give NaN intervals with a warning (never "significant"), classes of one item give no
stability (issue 38, cause 4)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from hydra_core.cli import main
from hydra_core.errors import InputError
from hydra_core.evaluate import Difference
from hydra_core.metrics import UndefinedMetricWarning
from hydra_core.metrics.bootstrap import (
    MIN_BOOT,
    MIN_ITEMS,
    blank_small_parts,
    check_n_boot,
    check_resampled,
    percentile_interval,
)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))


def test_too_few_resamples_are_refused_naming_the_option():
    assert check_n_boot(MIN_BOOT) == MIN_BOOT
    with pytest.raises(InputError, match=rf"^--boot 1: .* at least {MIN_BOOT} .*--boot {MIN_BOOT}"):
        check_n_boot(1)


def test_small_parts_get_nan_intervals_and_one_warning():
    ids = {"accuracy": np.linspace(0.4, 0.6, 100)}
    sets = [{"auroc": np.linspace(0.7, 0.9, 100)}, {"auroc": np.linspace(0.5, 0.6, 100)}]
    with pytest.warns(UndefinedMetricWarning, match=rf"fewer than {MIN_ITEMS} items in far \(1\)"):
        blank_small_parts(ids, sets, 50, [40, 1], ["near", "far"])
    assert not np.isnan(ids["accuracy"]).any() and not np.isnan(sets[0]["auroc"]).any()
    lo, hi = percentile_interval(sets[1]["auroc"])
    assert np.isnan(lo) and np.isnan(hi)
    assert not Difference(0.3, lo, hi).significant  # NaN is never significant
    # a small ID part blanks every OOD set too: their metrics use the ID items
    ids, sets = {"accuracy": np.ones(100)}, [{"auroc": np.ones(100)}]
    with pytest.warns(UndefinedMetricWarning, match=r"the ID part \(2\)"):
        blank_small_parts(ids, sets, 2, [40])
    assert np.isnan(ids["accuracy"]).all() and np.isnan(sets[0]["auroc"]).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        blank_small_parts({"a": np.ones(3)}, [{"b": np.ones(3)}], MIN_ITEMS, [MIN_ITEMS])


def test_classes_of_one_item_give_no_stability():
    with pytest.raises(InputError, match="each bootstrap resample would be the sample itself"):
        check_resampled(np.array(["id:0", "id:1", "ood:a"]))
    with pytest.warns(UndefinedMetricWarning, match="1 of 5 search items are alone"):
        check_resampled(["id:0", "id:0", "ood:a", "ood:a", "ood:b"])


def _folders(tmp_path, counts):
    from PIL import Image

    rng = np.random.default_rng(0)
    for folder, count in counts.items():
        (tmp_path / folder).mkdir(parents=True)
        for i in range(count):
            pixels = rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / folder / f"{i}.png")


def test_one_ood_image_is_not_certain_through_the_cli(checkpoint, tmp_path, capsys):
    _folders(tmp_path, {"mine/a": 24, "mine/b": 24, "one": 1})
    args = ["--id-folder", str(tmp_path / "mine"), "--ood-folder", f"near:{tmp_path / 'one'}"]
    assert main(["eval", "--model", checkpoint, "--device", "cpu", *args, "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    (one,) = out["ood"]
    assert one["n"] == 1
    assert one["auroc"]["ci95"] == [None, None] and one["fpr95"]["ci95"] == [None, None]
    assert out["id"]["accuracy"]["ci95"][0] is not None  # the ID part (24 items) keeps its own
    warned = [line for line in captured.err.splitlines() if f"fewer than {MIN_ITEMS}" in line]
    assert len(warned) == 1 and "one (1)" in warned[0]


def test_few_report_items_are_never_significant_through_the_cli(checkpoint, tmp_path, capsys):
    _folders(tmp_path, {"mine/a": 6, "mine/b": 6, "odd": 30})
    args = ["--id-folder", str(tmp_path / "mine"), "--ood-folder", f"near:{tmp_path / 'odd'}"]
    out = tmp_path / "out"
    argv = ["heads", "--model", checkpoint, "--device", "cpu", *args, "--boot", "50"]
    assert main([*argv, "--out", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    found = json.loads(captured.out)
    assert found["n_id"] < MIN_ITEMS
    for head in found["heads"]:
        assert head["delta_auroc_ci95"] == [None, None] and not head["delta_auroc_significant"]
        assert not head["detector_auroc_significant"] and not head["delta_accuracy_significant"]
    assert found["dense"]["auroc"]["ci95"] == [None, None]
    assert f"fewer than {MIN_ITEMS} items in the ID part" in captured.err


def test_stability_over_classes_of_one_item_is_refused_through_the_cli(
    checkpoint, tmp_path, capsys
):
    # 2 search samples per side: one ID class and one OOD set per item
    data = ["--n-search", "2", "--n-report", "60", "--ood", "mnist", "noise", "--device", "cpu"]
    argv = ["search", "--model", checkpoint, *data, "--budget", "2", "--stability", "3"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "error" in line]
    assert len(err) == 1 and "each bootstrap resample would be the sample itself" in err[0]
    assert "--n-search" in err[0]
