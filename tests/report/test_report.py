"""``python -m hydra_core report --quick`` on a tiny checkpoint: every section, every file."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
import torch

from hydra_core.cli import main
from hydra_core.report import Budgets, ReportConfig, markdown_table
from tests.conftest import write_tiny_checkpoint

SECTIONS = [
    "## Setup",
    "## Summary: the paper's statements against this run",
    "## Circuits found by the greedy search",
    "## Per-head evidence",
    "## Table 4",
    "## Table 5",
    "## Table 6",
    "## Stability of the circuits",
    "## Tables 1-2",
    "## Table 9",
    "## Table 11",
    "## Table 7",
    "## Does it transfer?",
    "## Table 12",
    "## The paper's statements over the 2 repeats",
    "## What this report covers",
]
CSVS = [
    "table4_zero_shot",
    "table5_distances",
    "table6_circuits",
    "table1_systems",
    "table9_diversity",
    "table11_fusion",
    "table7_cost",
    "circuits",
    "summary_all_systems",
    "all_sets",
    "table12_seeds",
    "transfer",
    "differences_to_single",
    "differences_over_repeats",
    "paper_claims",
    "stability",
    "heads",
]


def store_tiny_batch_ensemble(checkpoint: str, cache_root):
    """A BatchEnsemble copy of the tiny model stored where ``train-baselines batch-ensemble``
    would store it under ``cache_root`` (r and s as drawn, not fine-tuned: a tiny stand-in)."""
    from safetensors.torch import save_file

    from hydra_core.baselines import efficient
    from hydra_core.baselines.batch_ensemble import batch_ensemble
    from hydra_core.hydra.finetune import members_training_items
    from hydra_core.zoo.registry import load_model

    loaded = load_model(checkpoint)
    settings, config = efficient.EfficientSettings(), efficient.FINETUNE
    data = members_training_items(loaded.model, config)
    root = cache_root / efficient.FOLDER
    path = efficient.finetune_path(
        efficient.BATCH, settings, config, loaded.model, data, loaded.preprocess, 0, root
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    ensemble = batch_ensemble(loaded.model, settings.estimators, 0, settings.init_std)
    save_file({k: v.contiguous() for k, v in ensemble.state_dict().items()}, str(path))
    return path


def store_tiny_mimo(checkpoint: str, cache_root):
    """A MIMO copy of the tiny model's recipe stored where ``train-baselines mimo --model
    CHECKPOINT`` would store it under ``cache_root`` (freshly initialised, not trained: a tiny
    stand-in for the hours of training)."""
    from safetensors.torch import save_file

    from hydra_core.baselines import efficient
    from hydra_core.baselines.deep_ensembles import recipe_of

    settings = efficient.EfficientSettings()
    train_config, arch = recipe_of(checkpoint)
    path = efficient.scratch_path(
        efficient.MIMO, settings, train_config, arch, root=cache_root / efficient.FOLDER
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = efficient.build_scratch(efficient.MIMO, arch, settings)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory) -> tuple:
    root = tmp_path_factory.mktemp("report")
    checkpoint = write_tiny_checkpoint(root / "tiny.safetensors")
    store_tiny_batch_ensemble(checkpoint, root / "cache")
    store_tiny_mimo(checkpoint, root / "cache")  # the other two: not stored
    out = root / "out"
    mp = pytest.MonkeyPatch()
    mp.setenv("HYDRA_LAB_CACHE", str(root / "cache"))
    try:
        # seeds 0 and 1 draw the same 2 of 5 heads; 0, 2, 3 give three different members
        assert (
            main(
                [
                    "report",
                    "--quick",
                    "--model",
                    str(checkpoint),
                    "--ood",
                    "mnist",
                    "noise",
                    "--device",
                    "cpu",
                    "--seeds",
                    "0",
                    "2",
                    "3",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
    finally:
        mp.undo()
    return out


def test_every_section_and_file(report_dir):
    text = (report_dir / "report.md").read_text()
    for section in SECTIONS:
        assert section in text
    assert "Deep Ensembles**: not available" in text and "train-ensemble" in text
    assert "**MC Dropout** (5 passes, the model's own dropout): not run: the model has no " in text
    for name in CSVS:
        assert len(pd.read_csv(report_dir / f"{name}.csv")) > 0, name
    names = {p.name for p in report_dir.iterdir()}
    assert {f"overlap_hydra_circ_b_5_{k}.csv" for k in ("jaccard", "per_layer")} <= names
    assert all(re.fullmatch(r"[a-z0-9_.-]+", n) for n in names if n != "members.json"), names
    data = json.loads((report_dir / "report.json").read_text())
    assert data["setup"]["budgets"] == {"removed_per_layer": 1, "budget": 2, "pool": 5, "total": 8}
    assert data["setup"]["total_seconds"] > 0
    assert "evaluate zero-shot systems" in data["setup"]["seconds"]
    protocol = data["setup"]["protocol"]
    assert protocol["search_ood"] == ["photos", "faces"]
    assert protocol["report_ood"] == ["mnist", "noise"]
    assert not set(protocol["search_ood"]) & set(protocol["report_ood"])
    assert protocol["id_report_n"] == 200 and protocol["seeds"]["pruning"][1] == [3, 4, 5]
    accuracy = data["table1_systems"][0]["accuracy"]  # every reported metric with its interval
    assert set(accuracy) == {"value", "ci95"}
    assert accuracy["ci95"][0] <= accuracy["value"] <= accuracy["ci95"][1]


def test_stability_of_the_circuits(report_dir):
    """Each circuit's stability and held-out curve equal the library's on the same data, and the
    held-out items are search-role items the search never used."""
    from hydra_core.analysis.greedy import greedy_circuit
    from hydra_core.analysis.holdout import chance_jaccard, held_out_curve
    from hydra_core.analysis.inputs import search_inputs
    from hydra_core.analysis.stability import greedy_stability
    from hydra_core.data.benchmark import default_benchmark
    from hydra_core.data.provenance import item_keys
    from hydra_core.experiment.stability import _unused, held_out_sample
    from hydra_core.zoo.registry import load_model

    table = pd.read_csv(report_dir / "stability.csv").set_index("circuit")
    assert list(table.index) == ["CircAvg", "CircAcc", "CircOOD"]
    assert "## Stability of the circuits" in (report_dir / "report.md").read_text()
    loaded = load_model(str(report_dir.parent / "tiny.safetensors"))  # the fixture's checkpoint
    sizes = dict(n_report=200, ood=["mnist", "noise"])
    used, full = default_benchmark(n_search=64, **sizes), default_benchmark(n_search=None, **sizes)
    pairs = [(full.id_search, used.id_search), *zip(full.ood_search, used.ood_search, strict=True)]
    for whole, part in pairs:
        rest = _unused(whole, part, 64)
        assert len(rest) == 64 and not item_keys(rest.inputs) & item_keys(part.inputs)
    inputs = search_inputs(loaded.preprocess, used)
    sample = held_out_sample(loaded.preprocess, full, used, inputs, 64)
    data = (loaded.model, inputs.id_x, inputs.id_y, inputs.ood_x)
    for objective, name in [("avg", "CircAvg"), ("ood", "CircOOD")]:
        row = table.loc[name]
        circuit = greedy_circuit(*data, objective=objective, budget=int(row["budget"]))
        found = greedy_stability(
            *data,
            objective=objective,
            budget=circuit.steps,
            resamples=2,
            ood_strata=inputs.ood_strata(),
        )
        assert row["jaccard"] == pytest.approx(found.jaccard())
        curve = held_out_curve(loaded.model, circuit, *sample[:3], ood_strata=sample[3])
        assert row["held_out_at_budget"] == pytest.approx(curve.held_out[circuit.steps])
        assert row["held_out_dense"] == pytest.approx(curve.held_out[0])
        assert row["held_out_peak"] == curve.peak
        assert bool(row["beyond_peak"]) == (circuit.steps > curve.peak)
        assert bool(row["peak_beats_budget"]) == curve.peak_beats(circuit.steps)
        assert row["jaccard_chance"] == pytest.approx(
            chance_jaccard(sum(found.num_heads), circuit.steps)
        )
        assert row["held_out_at_budget_lo"] <= row["held_out_at_budget"]


def test_key_numbers(report_dir):
    table4 = pd.read_csv(report_dir / "table4_zero_shot.csv")
    assert list(table4["system"]) == ["single", "Taylor", "CircAvg"]
    assert list(table4["heads"]) == [8, 6, 6]
    fusion = pd.read_csv(report_dir / "table11_fusion.csv").set_index("system")
    assert fusion.loc["Hydra (Circ) (fused)", "max_prob_diff"] < 1e-5  # zero-shot: exact
    assert fusion.loc["Hydra (Circ), fine-tuned (fused)", "max_prob_diff"] > 0
    diversity = pd.read_csv(report_dir / "table9_diversity.csv").set_index("system")
    identical = diversity.loc["Hydra (Circ, identical members) (fused)"]
    assert identical["id_mi"] == pytest.approx(0, abs=1e-6) and identical["ood_di"] == 0
    assert diversity.loc["Hydra (Circ, B.5) (fused)", "id_mi"] > 0
    assert diversity.loc["Hydra (Circ) (fused)", "pruning_seed"] == "criterion"
    assert diversity.loc["Hydra (Circ, B.5) (fused)", "pruning_seed"] == "varied"
    table1 = set(pd.read_csv(report_dir / "table1_systems.csv")["system"])
    assert {"Hydra (Circ) (fused)", "Hydra (Circ, B.5) (fused)"} <= table1
    assert "Hydra (Circ, B.5), fine-tuned (fused)" in table1
    table5 = pd.read_csv(report_dir / "table5_distances.csv")
    assert list(table5["dataset"]) == ["mnist", "noise", "Average"] * 2
    assert list(table5["heads_averaged"]) == ["all"] * 3 + ["kept"] * 3
    transfer = pd.read_csv(report_dir / "transfer.csv")
    assert list(transfer["circuit"]) == ["CircOOD"] * 2 + ["CircAvg"] * 2 + [
        "CircOOD, mnist left out"
    ]
    assert (transfer["delta_auroc_lo"] <= transfer["delta_auroc"]).all()
    assert transfer.iloc[-1]["searched_on"] == "halves of noise"
    # searched on half of noise: reported on mnist (and the ID set) only, in no other table
    for name in ("all_sets", "summary_all_systems", "differences_to_single"):
        frame = pd.read_csv(report_dir / f"{name}.csv")
        assert "CircOOD, mnist left out" not in set(frame["system"]), name
    seeds = pd.read_csv(report_dir / "table12_seeds.csv")
    assert sorted(seeds["repeat"].unique()) == [0, 1] and seeds["accuracy"].between(0, 1).all()
    # the differences over repeats: the mean of the repeats' differences to the single model
    # (the same model on the same report images in every repeat), each inside its interval
    over = pd.read_csv(report_dir / "differences_over_repeats.csv")
    assert set(over["reference"]) == {"single"}  # no Deep Ensembles in this run
    over = over.set_index("system")
    summary = pd.read_csv(report_dir / "summary_all_systems.csv").set_index("system")
    assert (over["repeats"] == 2).all() and set(over.index) == set(seeds["system"])
    for name, rows in seeds.groupby("system"):
        expected = rows["all_auroc"].mean() - summary.loc["single", "all_auroc"]
        assert over.loc[name, "all_auroc"] == pytest.approx(expected, abs=1e-9)
        assert over.loc[name, "all_auroc_lo"] <= over.loc[name, "all_auroc"] + 1e-12
        assert over.loc[name, "all_auroc"] <= over.loc[name, "all_auroc_hi"] + 1e-12
    assert "Differences over the 2 repeats" in (report_dir / "report.md").read_text()
    cost = pd.read_csv(report_dir / "table7_cost.csv").set_index("system")
    assert cost.loc["single", "latency_ratio"] == 1.0 and cost["latency_ms"].gt(0).all()
    members = json.loads((report_dir / "members.json").read_text())["members"]
    # Hydra (Circ): CircAcc, CircOOD, CircAvg; its B.5 ablation and Hydra (Taylor): 3 seeds each
    assert [m["name"] for m in members[:3]] == ["CircAcc-2", "CircOOD-2", "CircAvg-2"]
    assert len(members) == 9


def test_the_papers_statements_are_judged_over_the_repeats(report_dir):
    from hydra_core.report.claims import verdict

    claims = pd.read_csv(report_dir / "paper_claims.csv")
    seeds = pd.read_csv(report_dir / "table12_seeds.csv")
    single = pd.read_csv(report_dir / "table1_systems.csv").set_index("system").loc["single"]
    assert set(seeds["repeat"]) == {0, 1}
    row = claims.set_index("claim").loc["Hydra (Circ) raises accuracy over Single"]
    tuned = seeds[seeds["system"] == "Hydra (Circ), fine-tuned (fused)"]["accuracy"]
    # the mean over the repeats of the paired differences: the mean accuracy minus the single
    # model's (the same in every repeat), in points
    assert row["ours"] == pytest.approx(100 * (tuned.mean() - single["accuracy"]), abs=1e-9)
    assert row["ours_lo"] <= row["ours"] <= row["ours_hi"] and row["paper_difference"] == 0.21
    decided = claims[claims["verdict"] != "–"]
    assert len(decided) >= 15
    for r in decided.itertuples():
        assert r.verdict == verdict(r.paper_difference, r.ours, r.ours_lo, r.ours_hi), r.claim
    deep = claims[
        (claims["system"] == "Deep Ensembles") | (claims["reference"] == "Deep Ensembles")
    ]
    assert len(deep) > 0 and set(deep["verdict"]) == {"–"}  # no trained copies in this run
    text = (report_dir / "report.md").read_text()
    assert "The statements about Deep Ensembles need their trained copies." in text


def test_per_head_evidence(report_dir):
    """heads.csv: every head of the tiny model, in agreed order, each value inside its interval;
    report.md lists the top heads with their intervals."""
    heads = pd.read_csv(report_dir / "heads.csv")
    assert len(heads) == 8 and heads["agreed_rank"].tolist() == list(range(1, 9))
    assert sorted(heads["label"]) == [f"L{layer}H{h}" for layer in range(2) for h in range(4)]
    for key in ("delta_auroc", "delta_accuracy", "detector_auroc"):
        assert (heads[f"{key}_lo"] <= heads[key] + 1e-12).all()
        assert (heads[key] <= heads[f"{key}_hi"] + 1e-12).all()
    assert heads["mean_rank"].is_monotonic_increasing
    text = (report_dir / "report.md").read_text()
    first = heads.iloc[0]
    assert f"| 1 | {first['label']} | {first['delta_auroc']:+.4f} [" in text
    data = json.loads((report_dir / "report.json").read_text())
    assert [h["label"] for h in data["heads"]] == heads["label"].tolist()


def test_budgets_and_markdown():
    from hydra_core.models.adapter import HeadLayout

    budgets = Budgets.of(HeadLayout((12,) * 6, 16, 192), ReportConfig())
    assert (budgets.removed_per_layer, budgets.budget, budgets.pool) == (4, 24, 48)
    frame = pd.DataFrame(
        {"system": ["a"], "accuracy": [0.9123], "ece": [0.01234], "near_auroc": [float("nan")]}
    )
    assert markdown_table(frame).splitlines() == [
        "| System | Acc↑ | ECE↓ | near AUROC↑ |",
        "|---|---|---|---|",
        "| a | 91.23 | 0.0123 | – |",
    ]


def test_an_interval_is_shown_with_its_values_precision():
    """A value and its bounds share one precision, picked by the largest of the three (a gain of
    -9.59 with a lower bound of -10.10 was shown as ``-9.5938 [-10.1, -9.1061]``); AUROC points
    always with two decimals."""
    frame = pd.DataFrame(
        {
            "delta": [-9.5938, 0.0123],
            "delta_lo": [-10.1012, 0.0101],
            "delta_hi": [-9.1061, 0.0145],
            "near ΔAUROC (points)": [27.21, -2.6391],
            "near ΔAUROC (points)_lo": [26.6, -3.0219],
            "near ΔAUROC (points)_hi": [27.8, -2.2699],
        }
    )
    rows = markdown_table(frame).splitlines()[2:]
    assert rows == [
        "| -9.6 [-10.1, -9.1] | 27.21 [26.60, 27.80] |",
        "| 0.0123 [0.0101, 0.0145] | -2.64 [-3.02, -2.27] |",
    ]


def test_stored_efficient_ensembles_are_rows_and_the_others_say_how_to_train(report_dir):
    """The stored BatchEnsemble and MIMO copies are rows of Tables 1-2 and 7 with the numbers
    of the ensemble's mean softmax on the report items; the two not stored are one line each
    with the command that trains them; the setup records which were included."""
    from sklearn.metrics import roc_auc_score

    from hydra_core.baselines import efficient
    from hydra_core.data.benchmark import default_benchmark
    from hydra_core.zoo.registry import load_model

    checkpoint = str(report_dir.parent / "tiny.safetensors")
    loaded = load_model(checkpoint)
    root = report_dir.parent / "cache" / efficient.FOLDER
    ensemble = efficient.batch_ensemble_copy(
        loaded.model, loaded.preprocess, root=root, train=False
    )
    assert ensemble is not None
    benchmark = default_benchmark(n_search=64, n_report=200, ood=["mnist", "noise"])

    def msp(images):  # the members' mean softmax: (N, C)
        with torch.no_grad():
            return ensemble(loaded.preprocess(images)).softmax(-1).mean(1)

    id_probs = msp(benchmark.id_report.images)
    labels = benchmark.id_report.labels
    table1 = pd.read_csv(report_dir / "table1_systems.csv").set_index("system")
    row = table1.loc["BatchEnsemble"]
    assert row["kind"] == "efficient-ensemble" and row["heads"] == "8x3"
    accuracy = (id_probs.argmax(-1) == labels).double().mean().item()
    assert row["accuracy"] == pytest.approx(accuracy, abs=1e-9)
    nll = -id_probs[torch.arange(len(labels)), labels].log().double().mean().item()
    assert row["nll"] == pytest.approx(nll, rel=1e-4)
    aurocs = []
    for ood in benchmark.ood_report:  # OOD positive, scored by minus the MSP
        scores = torch.cat([id_probs.max(-1).values, msp(ood.images).max(-1).values])
        truth = [0] * len(id_probs) + [1] * len(ood)
        aurocs.append(roc_auc_score(truth, -scores.numpy()))
    assert row["all_auroc"] == pytest.approx(sum(aurocs) / len(aurocs), abs=1e-6)
    assert row["accuracy_lo"] <= row["accuracy"] <= row["accuracy_hi"]
    mimo = efficient.scratch_copy(efficient.MIMO, reference=checkpoint, root=root, train=False)
    assert mimo is not None
    with torch.no_grad():  # MIMO at test time: every member given the same images
        mimo_probs = mimo(loaded.preprocess(benchmark.id_report.images)).softmax(-1).mean(1)
    mimo_accuracy = (mimo_probs.argmax(-1) == labels).double().mean().item()
    assert table1.loc["MIMO", "kind"] == "efficient-ensemble"
    assert table1.loc["MIMO", "accuracy"] == pytest.approx(mimo_accuracy, abs=1e-9)
    assert not {"Packed-Ensembles", "LoRA Ensembles"} & set(table1.index)
    differences = pd.read_csv(report_dir / "differences_to_single.csv").set_index("system")
    expected = row["accuracy"] - table1.loc["single", "accuracy"]
    assert differences.loc["BatchEnsemble", "accuracy"] == pytest.approx(expected, abs=1e-9)
    cost = pd.read_csv(report_dir / "table7_cost.csv").set_index("system")
    assert cost.loc["BatchEnsemble", "latency_ms"] > 0
    facts = json.loads((report_dir / "report.json").read_text())["setup"]["efficient_ensembles"]
    assert facts["looked_for"] == ["packed-ensembles", "mimo", "batch-ensemble", "lora-ensembles"]
    assert facts["included"] == ["MIMO", "BatchEnsemble"]
    assert list(facts["not_run"]) == ["Packed-Ensembles", "LoRA Ensembles"]
    assert cost.loc["MIMO", "latency_ms"] > 0
    text = (report_dir / "report.md").read_text()
    assert "in the tables: MIMO, BatchEnsemble. The report loads their stored" in text
    for method in ("packed-ensembles", "lora-ensembles"):
        name = efficient.NAMES[method]
        command = f"python -m hydra_core train-baselines {method} --model {checkpoint}"
        assert facts["not_run"][name]["command"] == command
        line = f"- **{name}**: not run, no trained copy is stored; train it with `{command}`"
        assert sum(line in x for x in text.splitlines()) == 1


def test_the_papers_statements_about_the_efficient_ensembles(report_dir):
    """Hydra (Circ) minus BatchEnsemble and minus MIMO, judged on repeat 0 with the items'
    interval; the statements about the ensembles not run are listed as not judged."""
    from hydra_core.report.claims import verdict
    from hydra_core.report.image_claims import REPEAT_0

    claims = pd.read_csv(report_dir / "paper_claims.csv")
    ours = claims[claims["judged_on"] == REPEAT_0]
    assert set(ours["reference"]) == {"BatchEnsemble", "MIMO"}
    assert set(ours["system"]) == {"Hydra (Circ), fine-tuned (fused)"}
    # the paper: 80.88 - 80.53 accuracy, 86.29 - 84.34 AUROC; equal Brier scores: no statement
    batch_claims = ours[ours["reference"] == "BatchEnsemble"]
    assert batch_claims.set_index("metric")["paper_difference"].to_dict() == pytest.approx(
        {"accuracy": 0.35, "nll": 0.02, "all_auroc": 1.95, "all_fpr95": -2.76}
    )
    mimo_claims = ours[ours["reference"] == "MIMO"].set_index("metric")["paper_difference"]
    assert mimo_claims["all_auroc"] == pytest.approx(86.29 - 83.63)  # the paper's Table 1
    table1 = pd.read_csv(report_dir / "table1_systems.csv").set_index("system")
    accuracy = batch_claims.set_index("metric").loc["accuracy"]
    hydra, batch = (table1.loc[s, "accuracy"] for s in accuracy[["system", "reference"]])
    assert accuracy["ours"] == pytest.approx(100 * (hydra - batch), abs=1e-9)
    assert float(accuracy["ours_repeats"]) == pytest.approx(accuracy["ours"])  # one repeat
    for r in ours.itertuples():
        assert r.ours_lo <= r.ours <= r.ours_hi
        assert r.verdict == verdict(r.paper_difference, r.ours, r.ours_lo, r.ours_hi), r.claim
    text = (report_dir / "report.md").read_text()
    assert "## The paper's statements about the efficient ensembles (repeat 0)" in text
    assert "Hydra (Circ) raises OOD AUROC over BatchEnsemble" in text
    assert (
        "Not judged (not run, see the setup): the statements about Packed-Ensembles, "
        "LoRA Ensembles." in text
    )


def test_the_summary_gives_each_headline_near_and_far_and_the_transfer(report_dir):
    """Issue 34 item 4: the summary's OOD statements carry their near and far differences and
    verdicts from paper_claims.csv (over the repeats, and the efficient ensembles' on repeat
    0), the verdict counts, and the transfer section's near and far lines."""
    from hydra_core.report.image_claims import REPEAT_0

    text = (report_dir / "report.md").read_text()
    start = text.index("## Summary")
    summary = text[start : text.index("\n## ", start + 1)]
    claims = pd.read_csv(report_dir / "paper_claims.csv").set_index("claim")
    shown = [ln for ln in summary.splitlines() if ln.startswith("- ") and ": paper " in ln]
    assert shown, summary
    for line in shown:
        claim = line[2 : line.index(": paper ")]
        row = claims.loc[claim]
        assert f"ours {row['ours']:+.2f} [" in line or f"ours {row['ours']:+.4f} [" in line
        assert f"**{row['verdict']}**" in line
        how = "repeat 0" if row["judged_on"] == REPEAT_0 else "mean of 2 repeats"
        assert f"({how}" in line
        if row["metric"] == "all_auroc":
            assert "all OOD sets" in line
            for group in ("near", "far"):
                assert f"{group} {row[f'ours_{group}']:+.2f} [" in line
                assert f"**{row[f'ours_{group}_verdict']}**" in line
    assert any("over BatchEnsemble" in ln and "(repeat 0, all OOD sets)" in ln for ln in shown)
    assert "- **over the 2 repeats**: of " in summary
    assert "- **the efficient ensembles, repeat 0**: of " in summary
    assert "  - **CircOOD** (searched on photos, faces): near " in summary


def test_efficient_ensembles_looked_for_are_checked():
    from hydra_core.baselines.efficient import train_command

    assert ReportConfig.quick(efficient=()).efficient == ()
    with pytest.raises(ValueError, match="unknown efficient ensemble.*'oba'.*choose from"):
        ReportConfig(efficient=("mimo", "oba"))
    assert train_command("mimo") == "python -m hydra_core train-baselines mimo"
    assert train_command("mimo", 3, "my model.safetensors") == (
        "python -m hydra_core train-baselines mimo --model 'my model.safetensors' --epochs 3"
    )


def test_the_report_command_passes_the_efficient_ensembles_looked_for(monkeypatch, capsys):
    import hydra_core.report

    seen = []
    monkeypatch.setattr(
        hydra_core.report, "run_report", lambda config, *a, **k: seen.append(config)
    )
    for flags, expected in [
        ([], ("packed-ensembles", "mimo", "batch-ensemble", "lora-ensembles")),
        (["--efficient", "mimo", "batch-ensemble", "mimo"], ("mimo", "batch-ensemble")),
        (["--efficient"], ()),
    ]:
        assert main(["report", "--quick", *flags]) == 0
        assert seen.pop().efficient == expected
    assert main(["report", "--task", "zero-shot", "--efficient", "mimo"]) == 2
    assert "--efficient applies to the image and text reports" in capsys.readouterr().err
