"""Tests of hydra_core.report.claims: the columns a paper statement writes to paper_claims.csv
(per-repeat differences, near and far apart) and the verdict recomputed from them alone."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from hydra_core.data.benchmark import build_benchmark
from hydra_core.experiment.evaluate import evaluate_systems
from hydra_core.experiment.results import repeated_difference
from hydra_core.hydra.systems import Pruned, Single
from hydra_core.report.claims import (
    CLAIM_PARTS,
    claim_columns,
    near_far_verdicts,
    recomputed_claim,
    verdict,
)
from hydra_core.zoo.registry import LoadedModel
from tests.conftest import make_tiny_vit
from tests.experiment.test_systems import image_set, preprocess


@pytest.fixture(scope="module")
def repeats():
    """Three repeats: the same report images, a different pruned model each (as the reports)."""
    ood = [image_set("near_set", 30, "near", 2), image_set("far_set", 30, "far", 3)]
    benchmark = build_benchmark(image_set("id_set", 60, "id", 1, labelled=True), None, ood)
    loaded = LoadedModel("tiny", make_tiny_vit(depth=3, num_heads=4), preprocess)
    found = []
    for r in range(3):
        keep = torch.ones(3, 4, dtype=torch.bool)
        keep[r, r] = False
        keep[(r + 1) % 3, 3] = False
        systems = [Single(), Pruned("pruned", keep)]
        found.append(evaluate_systems(loaded, benchmark, systems, device="cpu", latency=False))
    return found


def test_claim_columns_carry_the_repeats_and_judge_near_and_far_apart(repeats):
    row = claim_columns(repeats, "pruned", "single", "all_auroc", 1.0, "fine_tuned")
    assert set(row) == {f"fine_tuned{t}{p}" for t in ("", "_near", "_far") for p in CLAIM_PARTS}
    for tag, which in (("", "all"), ("_near", "near"), ("_far", "far")):
        each = [r.difference("pruned", "single", "auroc", which).value for r in repeats]
        written = [float(v) for v in row[f"fine_tuned{tag}_repeats"].split(";")]
        assert written == pytest.approx([100 * v for v in each])
        d = repeated_difference(repeats, "pruned", "single", "auroc", which)
        assert row[f"fine_tuned{tag}"] == pytest.approx(100 * d.value)
        assert (row[f"fine_tuned{tag}_lo"], row[f"fine_tuned{tag}_hi"]) == pytest.approx(
            (100 * d.lo, 100 * d.hi)
        )
        assert row[f"fine_tuned{tag}_verdict"] == verdict(1.0, d.value, d.lo, d.hi)
    # a statement on accuracy has no near and far
    acc = claim_columns(repeats, "pruned", "single", "accuracy", 1.0, "ours")
    assert acc["ours_near_verdict"] == "–" and acc["ours_far_repeats"] == ""
    assert np.isnan(acc["ours_near"]) and len(acc["ours_repeats"].split(";")) == 3


def test_a_verdict_is_recomputed_from_its_row_alone(repeats, tmp_path):
    rows = [
        {"claim": c, "paper_difference": p, **claim_columns(repeats, "pruned", "single", c, p, "x")}
        for c, p in (("all_auroc", 2.0), ("nll", -0.1), ("accuracy", 0.5))
    ]
    pd.DataFrame(rows).to_csv(tmp_path / "paper_claims.csv", index=False)
    claims = pd.read_csv(tmp_path / "paper_claims.csv", keep_default_na=False, na_values=[""])
    for _, r in claims.iterrows():
        for tag in ("", "_near", "_far"):
            again = recomputed_claim(
                r["paper_difference"],
                r[f"x{tag}_repeats"],
                r[f"x{tag}_item_var"],
                r[f"x{tag}_item_between"],
            )
            if r[f"x{tag}_verdict"] == "–":
                assert again["verdict"] == "–"
                continue
            assert again["value"] == pytest.approx(r[f"x{tag}"], abs=1e-12)
            assert (again["lo"], again["hi"]) == pytest.approx(
                (r[f"x{tag}_lo"], r[f"x{tag}_hi"]), abs=1e-9
            )
            assert again["verdict"] == r[f"x{tag}_verdict"]
    assert near_far_verdicts(claims, "x")[1:] == ["–", "–"]
    assert near_far_verdicts(claims, "x")[0].startswith("near: ")


def test_one_repeat_recomputes_as_the_normal_approximation(repeats):
    row = claim_columns(repeats[0], "pruned", "single", "all_auroc", 1.0, "z")
    again = recomputed_claim(1.0, row["z_repeats"], row["z_item_var"], row["z_item_between"])
    assert again["value"] == pytest.approx(row["z"])
    width = row["z_hi"] - row["z_lo"]
    assert again["hi"] - again["lo"] == pytest.approx(width, rel=0.25)
