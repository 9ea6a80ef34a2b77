"""``search --holdout F --stability B``: the files, the JSON and the errors, as a user runs it."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from hydra_core.analysis.greedy import greedy_circuit
from hydra_core.analysis.holdout import chance_jaccard, holdout_split
from hydra_core.analysis.inputs import search_inputs
from hydra_core.analysis.stability import StabilityResult, greedy_stability
from hydra_core.cli import main
from hydra_core.zoo.registry import load_model
from tests.cli.test_cli import DATA


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))


def _search(checkpoint, out, *extra) -> list[str]:
    return ["search", "--model", checkpoint, *DATA, "--budget", "3", "--out", str(out), *extra]


def test_holdout_and_stability_files_and_json(checkpoint, tmp_path, capsys):
    out = tmp_path / "s"
    args = _search(checkpoint, out, "--holdout", "0.25", "--stability", "3", "--seed", "2")
    assert main([*args, "--json"]) == 0
    captured = capsys.readouterr()
    found = json.loads(captured.out)
    assert "fewer than 300 per side" in captured.err  # 30 + 30 search samples
    holdout, stability = found["holdout"], found["stability"]
    curve = pd.read_csv(out / "holdout_avg.csv")
    assert len(curve) == 4 and curve["held_out"].tolist() == pytest.approx(holdout["held_out"])
    assert holdout["peak"] == int(curve["held_out"].idxmax())
    peak, end = holdout["peak"], 3
    beats = end > peak and holdout["peak_gain_lo"][end] > 0  # beyond the paired interval only
    assert holdout["peak_beats_budget"] == beats
    assert holdout["suggested_budget"] == (max(peak, 1) if beats else None)
    assert stability["jaccard_chance"] == pytest.approx(chance_jaccard(8, 3))
    assert "for two random sets of 3 of 8 heads" in captured.err
    assert stability["resamples"] == 3 and 0 <= stability["jaccard"] <= 1
    saved = json.loads((out / "stability_avg.json").read_text())
    assert saved["holdout"] == {"fraction": 0.25, "seed": 2}
    result = StabilityResult.from_dict(saved)
    heads = pd.read_csv(out / "stability_avg_heads.csv")
    assert len(heads) == 8 and heads["removal_frequency"].is_monotonic_decreasing
    assert (heads["keep_frequency"] == 1 - heads["removal_frequency"]).all()
    assert heads["search_step"].notna().sum() == 3

    # the same numbers from the library, on the same split of the same search data
    loaded = load_model(checkpoint)
    benchmark = loaded.modality.benchmark(n_search=40, n_report=60, ood=["mnist", "noise"])
    inputs = search_inputs(loaded.preprocess, benchmark)
    split = holdout_split(inputs.id_y, inputs.ood_strata(), 0.25, seed=2)
    strata = [inputs.ood_strata()[i] for i in split.ood_search.tolist()]
    data = (
        inputs.id_x[split.id_search],
        inputs.id_y[split.id_search],
        inputs.ood_x[split.ood_search],
    )
    alone = greedy_circuit(loaded.model, *data, budget=3)
    assert found["order"] == alone.labels()
    again = greedy_stability(loaded.model, *data, budget=3, resamples=3, seed=2, ood_strata=strata)
    assert again.orders == result.orders
    assert found["n_id"] == len(data[0]) and found["n_ood"] == len(data[2])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--holdout", "1"], "--holdout: must lie strictly between 0 and 1"),
        (["--holdout", "x"], "--holdout: must be a number"),
        (["--stability", "1"], "--stability: must be at least 2"),
        (["--seed", "-1"], "--seed: must be at least 0"),
    ],
)
def test_bad_options_are_one_line(checkpoint, tmp_path, capsys, extra, message):
    assert main(_search(checkpoint, tmp_path / "s", *extra)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_holdout_keeps_lone_samples_in_the_search_part(checkpoint, tmp_path, capsys):
    args = _search(checkpoint, tmp_path / "s", "--holdout", "0.5", "--json")
    args[args.index("--n-search") + 1] = "12"  # some classes have one image: none held out
    assert main(args) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["holdout"]["n_id"] >= 2 and found["n_id"] + found["holdout"]["n_id"] == 12
    args[args.index("--n-search") + 1] = "3"  # nothing left to hold out: one line, exit 2
    assert main([*args, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "the held-out part would hold" in err and "Traceback" not in err


def test_masks_from_a_stability_file(checkpoint, tmp_path, capsys):
    from hydra_core.masks import load_masks
    from hydra_core.models.adapter import HeadLayout

    out = tmp_path / "s"
    args = ["search", "--model", checkpoint, *DATA, "--budget", "4", "--stability", "3"]
    assert main([*args, "--out", str(out)]) == 0
    capsys.readouterr()
    stability = out / "stability_avg.json"
    found = StabilityResult.from_dict(json.loads(stability.read_text()))
    ranking_file = json.loads(stability.read_text())["search_ranking"]
    masks = tmp_path / "m.json"
    common = ["masks", "--model", checkpoint, *DATA, "--ranking-source", "stability"]
    assert (
        main(
            [
                *common,
                "--stability",
                str(stability),
                "--strategy",
                "circuit",
                "--m",
                "1",
                "--budget",
                "3",
                "--out",
                str(masks),
            ]
        )
        == 0
    )
    (member,) = load_masks(masks, HeadLayout((4, 4), 6, 24))
    removed = sorted(map(tuple, (~member.keep).nonzero().tolist()))
    expected = found.ranking([tuple(h) for h in ranking_file])[:3]
    assert removed == sorted(expected)
    assert member.provenance["ranking"]["method"] == "stability"
    capsys.readouterr()
    # a budget and pool past the 4 removals the resamples made: one line, exit 2
    assert (
        main(
            [
                *common,
                "--stability",
                str(stability),
                "--budget",
                "3",
                "--out",
                str(tmp_path / "n.json"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "reach past the 4 removals" in err and len(err.strip().splitlines()) == 1
    assert main([*common, "--budget", "2", "--out", str(tmp_path / "o.json")]) == 2
    assert "needs --stability FILE" in capsys.readouterr().err
    assert (
        main(
            [
                *common,
                "--stability",
                str(tmp_path / "nope.json"),
                "--budget",
                "2",
                "--out",
                str(tmp_path / "p.json"),
            ]
        )
        == 2
    )
    assert "does not exist" in capsys.readouterr().err
