"""``report --task zero-shot``: the paper's Table 3 rows on an OpenCLIP model, run end to end in
``--quick`` mode on a tiny random model saved as an open_clip folder (no CLIP weights exist
offline), with heads pruned jointly in both towers (D.3, the default) and in the image tower
alone (``--towers image``), and the parts that hold for any weights: temperature scaling keeps
the predictions, the claims' verdicts, the random-weights warning, the budgets, and the
refusals."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from hydra_core.baselines.temperature import TemperatureScaled
from hydra_core.cli import main
from hydra_core.errors import InputError
from hydra_core.models.adapter import HeadLayout
from hydra_core.report.zero_shot import run_zero_shot_report
from hydra_core.report.zero_shot_config import ZeroShotReportConfig, zero_shot_budgets
from hydra_core.report.zero_shot_tables import CLAIMS, MAIN_ROWS, OURS, paper_table3
from tests.conftest import clip_images, make_tiny_zero_shot, save_tiny_clip


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """One quick run (shared by the tests below): its JSON and its output folder."""
    root = tmp_path_factory.mktemp("zero-shot")
    folder = save_tiny_clip(root / "model")
    config = ZeroShotReportConfig.quick(
        model=f"openclip:local-dir:{folder}", n_search=24, n_report=40, latency_repeats=2
    )
    from hydra_core.cache import DiskCache

    payload = run_zero_shot_report(
        config, root / "out", cache=DiskCache(root / "cache"), log=lambda _: None
    )
    return payload, root / "out"


def test_every_table_and_file_is_written(report):
    payload, out = report
    for name in ("table3_systems", "differences_to_single", "paper_claims", "table7_cost"):
        assert (out / f"{name}.csv").is_file()
    assert json.loads((out / "report.json").read_text())["setup"]["task"] == "zero-shot"
    systems = [row["system"] for row in payload["table3_systems"]]
    assert systems == list(MAIN_ROWS)


def test_the_report_says_the_weights_are_random(report):
    payload, out = report
    text = (out / "report.md").read_text()
    assert "no number in this report is a zero-shot result" in text
    assert payload["setup"]["random_weights"] is True
    from hydra_core.report.zero_shot_markdown import random_weights_warning

    # a file name is not a declaration: only the folder's configuration says so
    honest = {"random_weights": False, "model": {"weights": "random_name.safetensors"}}
    assert random_weights_warning(honest) == []
    for section in ("## Table 3", "## Agreements and disagreements", "## The CircAvg circuit"):
        assert section in text


def test_temperature_scaling_keeps_the_predictions(report):
    payload, _ = report
    rows = {r["system"]: r for r in payload["table3_systems"]}
    single, scaled = rows["single"], rows["Temperature Scaling"]
    assert scaled["accuracy"]["value"] == pytest.approx(single["accuracy"]["value"])
    assert payload["setup"]["temperature"] > 0
    model = make_tiny_zero_shot()
    x = clip_images(4)
    assert torch.allclose(TemperatureScaled(model, 2.0)(x), model(x) / 2.0)


def test_claims_compare_the_papers_differences_with_ours(report):
    payload, _ = report
    claims = pd.DataFrame(payload["paper_claims"])
    assert len(claims) == len(CLAIMS)
    paper = paper_table3().set_index("system")
    first = claims.iloc[0]
    _, system, reference, column = CLAIMS[0]
    expected = paper.loc[system, column] - paper.loc[reference, column]
    assert first["paper_difference"] == pytest.approx(expected, abs=1e-4)
    assert set(claims["verdict"]) <= {
        "agrees",
        "disagrees",
        "same direction, n.s.",
        "opposite direction, n.s.",
        "no difference",
        "–",
    }
    assert set(OURS) >= {s for _, s, _, _ in CLAIMS}


def test_the_cli_refuses_a_model_that_is_not_openclip(capsys):
    assert main(["report", "--task", "zero-shot", "--quick", "--model", "default"]) == 2
    assert "needs an OpenCLIP model" in capsys.readouterr().err


def test_zero_shot_options_are_refused_on_other_tasks(capsys):
    assert main(["report", "--task", "text", "--prompts", "openai"]) == 2
    assert "--task zero-shot" in capsys.readouterr().err


def test_both_towers_are_pruned_jointly(report):
    payload, out = report
    setup = payload["setup"]
    assert setup["towers"] == "both" and setup["tower_layers"] == {"image": 3, "text": 1}
    budgets = setup["budgets"]
    # 2 per image layer: 6 heads in all; Taylor spreads them over 3 image + 1 text layers
    assert budgets["budget"] == 6 and list(budgets["removed_per_layer"]) == [2, 2, 1, 1]
    members = json.loads((out / "members.json").read_text())
    assert members["model"]["towers"] == {"image": 3, "text": 1}
    taylor = members["members"][0]
    assert taylor["name"] == "Taylor-6" and taylor["keep"]["3"] in ([0], [1])
    text = (out / "report.md").read_text()
    assert "pruned jointly in both towers (one head layout of 3 image + 1 text layers)" in text
    assert "1 or 2 per layer, spread over the layers of both towers (6 in all)" in text


def test_the_image_tower_alone(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))
    folder = save_tiny_clip(tmp_path / "model")
    argv = ["report", "--task", "zero-shot", "--quick", "--towers", "image", "--device", "cpu"]
    argv += ["--model", f"openclip:local-dir:{folder}", "--n-search", "24", "--n-report", "40"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 0
    payload = json.loads((tmp_path / "out" / "report.json").read_text())
    assert payload["setup"]["towers"] == "image"
    assert payload["setup"]["budgets"]["removed_per_layer"] == 2
    assert payload["setup"]["budgets"]["budget"] == 6
    text = (tmp_path / "out" / "report.md").read_text()
    assert "pruned in the image tower only (--towers image)" in text


def test_budgets_of_the_paper_and_their_refusal():
    vit_b32 = HeadLayout((12,) * 12 + (8,) * 12, 64, 768, (("image", 12), ("text", 12)))
    budgets = zero_shot_budgets(vit_b32, ZeroShotReportConfig())
    assert budgets.budget == 24 and budgets.removed_per_layer == (1,) * 24  # D.3: 24 heads
    assert budgets.total == 240 and budgets.pool == 160
    image = HeadLayout((12,) * 12, 64, 768, (("image", 12),))
    assert zero_shot_budgets(image, ZeroShotReportConfig()).removed_per_layer == 2
    narrow = HeadLayout((4,) * 3 + (1,), 16, 64, (("image", 3), ("text", 1)))
    with pytest.raises(InputError, match="remove 1 of the 1 heads of text layer 0"):
        zero_shot_budgets(narrow, ZeroShotReportConfig())
