"""The paper's sweeps (hydra_core.report.sweeps) on a tiny checkpoint: each sweep's points equal
the plain computation (the model pruned with prune_heads, member probabilities averaged by hand,
the metrics from their definitions), Deep Ensembles appear only when trained copies exist, and the
``sweep`` command writes its files or refuses with one line."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import roc_auc_score

from hydra_core.analysis.greedy import greedy_circuit
from hydra_core.analysis.inputs import search_inputs
from hydra_core.baselines.deep_ensembles import copy_path, recipe_of
from hydra_core.baselines.shared_backbone import DEEP, deep_heads
from hydra_core.cache import DiskCache
from hydra_core.cli import main
from hydra_core.data.corruptions import corrupt_set
from hydra_core.data.images import take
from hydra_core.data.text import load_rotten_tomatoes
from hydra_core.hydra.finetune import finetune_member
from hydra_core.hydra.members import (
    circuit_member,
    member_overlap,
    seed_sampled_members,
    taylor_member,
)
from hydra_core.models.adapter import prune_heads
from hydra_core.report.sweeps import SweepConfig, run_sweep
from hydra_core.zoo.registry import load_model
from tests.conftest import write_tiny_checkpoint

SIZES = dict(device="cpu", n_search=16, n_report=24, batch_size=64)


def setting(checkpoint, **overrides) -> SweepConfig:
    return SweepConfig.quick(model=checkpoint, **SIZES, **overrides)


def tiny_sentiment_folder(folder) -> str:
    """A tiny random two-class BERT (neg, pos) that reads sentences as long as Rotten Tomatoes'
    (512 positions), saved as a Hugging Face folder with its tokenizer."""
    import transformers

    from tests.conftest import WORDS

    torch.manual_seed(0)
    labels = {0: "neg", 1: "pos"}
    config = transformers.BertConfig(
        vocab_size=60, max_position_embeddings=512, num_labels=2, pad_token_id=1, hidden_size=24,
        num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, id2label=labels,
        label2id={v: k for k, v in labels.items()},
    )  # fmt: skip
    model = transformers.BertForSequenceClassification(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" not in name and (p.ndim >= 2 or "bias" in name):
                p.mul_(3.0)
    model.save_pretrained(folder)
    transformers.BertTokenizer(vocab={w: i for i, w in enumerate(WORDS)}).save_pretrained(folder)
    return str(folder)


def loaded_and_benchmark(checkpoint):
    loaded = load_model(checkpoint)
    benchmark = loaded.modality.benchmark(
        n_search=SIZES["n_search"], n_report=SIZES["n_report"], image_format=loaded.image_format
    )
    return loaded, benchmark


@torch.no_grad()
def probabilities(models, preprocess, images) -> torch.Tensor:
    """The mean of the models' softmax probabilities (one model: its own), float64."""
    x = preprocess(images)
    return torch.stack([m(x).double().softmax(-1) for m in models]).mean(0)


def plain_metrics(models, loaded, benchmark, id_set=None) -> dict[str, float]:
    """Accuracy, NLL and the all-OOD AUROC (mean over report sets, OOD positive, score -MSP)."""
    id_set = benchmark.id_report if id_set is None else id_set
    p = probabilities(models, loaded.preprocess, id_set.inputs)
    found = {
        "accuracy": (p.argmax(-1) == id_set.labels).double().mean().item(),
        "nll": -p[torch.arange(len(p)), id_set.labels].log().mean().item(),
    }
    id_msp = p.max(-1).values.numpy()
    aurocs = []
    for s in benchmark.ood_report:
        ood_msp = probabilities(models, loaded.preprocess, s.inputs).max(-1).values.numpy()
        truth = np.r_[np.zeros(len(id_msp)), np.ones(len(ood_msp))]
        aurocs.append(roc_auc_score(truth, -np.r_[id_msp, ood_msp]))
    found["all_auroc"] = float(np.mean(aurocs))
    return found


def row(table: pd.DataFrame, **where) -> pd.Series:
    chosen = table
    for column, value in where.items():
        chosen = chosen[chosen[column] == value]
    assert len(chosen) == 1, (where, chosen)
    return chosen.iloc[0]


def assert_point(found: pd.Series, expected: dict[str, float]) -> None:
    for metric, value in expected.items():
        assert found[metric] == pytest.approx(value, abs=1e-5), metric
        if metric in found and f"{metric}_lo" in found:
            assert found[f"{metric}_lo"] <= found[metric] + 1e-12 <= found[f"{metric}_hi"] + 2e-12


def test_layers_sweep_points_equal_the_pruned_models(tmp_path, checkpoint, monkeypatch):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))
    cache, lines = DiskCache(tmp_path / "cache"), []
    config = setting(checkpoint, removed_per_layer=(1, 2, 4))
    table = run_sweep("layers", config, tmp_path / "out", cache=cache, log=lines.append)
    assert any("[4] heads per layer left out: the model has 4" in line for line in lines)
    assert sorted(set(table["removed_per_layer"])) == [0, 1, 2]
    assert len(table) == 1 + 2 * 2 * 2  # single; Taylor, CircAvg x 1, 2 x zero-shot, fine-tuned

    loaded, benchmark = loaded_and_benchmark(checkpoint)
    model, inputs = loaded.model, search_inputs(loaded.preprocess, benchmark)
    assert_point(row(table, system="single"), plain_metrics([model], loaded, benchmark))
    taylor = taylor_member(model, inputs, per_layer=1, samples=config.taylor_samples, batch_size=64)
    found = row(table, method="Taylor", removed_per_layer=1, setting="zero-shot")
    assert found["heads"] == "6"
    expected = plain_metrics([prune_heads(model, taylor.keep)], loaded, benchmark)
    assert_point(found, expected)
    circuit = greedy_circuit(
        model, inputs.id_x, inputs.id_y, inputs.ood_x, objective="avg", budget=4, batch_size=64
    )
    from hydra_core.models.adapter import head_layout

    keep = circuit_member(circuit.ranking(), head_layout(model), budget=4, ranking_name="c").keep
    found = row(table, method="CircAvg", removed_per_layer=2, setting="zero-shot")
    assert found["heads"] == "4"
    assert_point(found, plain_metrics([prune_heads(model, keep)], loaded, benchmark))
    tuned = finetune_member(
        model, keep, config.finetune, preprocess=loaded.preprocess, cache=cache
    )  # the sweep's weights, from the cache
    assert tuned.cached
    found = row(table, method="CircAvg", removed_per_layer=2, setting="fine-tuned")
    assert_point(found, plain_metrics([tuned.model], loaded, benchmark))
    for name in ("layers.csv", "layers.png", "layers.svg", "report.md", "report.json"):
        assert (tmp_path / "out" / name).is_file()
    assert pd.read_csv(tmp_path / "out" / "layers.csv").shape == table.shape


def test_members_sweep_equals_averaged_members_and_adds_trained_copies(
    tmp_path, checkpoint, monkeypatch
):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))
    train, arch = recipe_of(checkpoint)
    copy = copy_path(1, train, arch)  # a trained copy with another seed: Deep Ensembles exist
    copy.parent.mkdir(parents=True)
    write_tiny_checkpoint(copy, seed=1)
    config = setting(checkpoint, members=(2, 3), finetune=None)
    table = run_sweep("members", config, tmp_path / "out", cache=DiskCache(tmp_path / "cache"))
    assert list(table["system"]) == [
        "single", "Hydra M=2 (fused)", "Hydra M=3 (fused)", "Deep Ensembles"
    ]  # fmt: skip

    loaded, benchmark = loaded_and_benchmark(checkpoint)
    model = loaded.model
    inputs = search_inputs(loaded.preprocess, benchmark)
    from hydra_core.experiment.pruning import Budgets
    from hydra_core.models.adapter import head_layout

    layout = head_layout(model)
    b = Budgets.of(layout, config_like(config))
    circuit = greedy_circuit(
        model, inputs.id_x, inputs.id_y, inputs.ood_x, objective="avg", budget=b.budget,
        batch_size=64,
    )  # fmt: skip
    masks = seed_sampled_members(
        circuit.ranking(), layout, budget=b.budget, pool=b.pool, seeds=range(3),
        ranking_name="CircAvg", allow_identical=True,
    )  # fmt: skip
    members = [prune_heads(model, m.keep) for m in masks]
    found = row(table, members=3, setting="zero-shot")
    assert_point(found, plain_metrics(members, loaded, benchmark))
    assert found["members_jaccard"] == pytest.approx(member_overlap(masks)["mean_pairwise_jaccard"])
    copies = [model, load_model(str(copy)).model]
    assert_point(row(table, system="Deep Ensembles"), plain_metrics(copies, loaded, benchmark))
    assert row(table, system="single")["latency_ratio"] == 1.0
    assert (table["params"] > 0).all() and (table["latency_ms"] > 0).all()


def config_like(config: SweepConfig):
    from types import SimpleNamespace

    return SimpleNamespace(removed_per_layer=None, pool_fraction=config.pool_fraction)


def test_corruption_sweep_pools_the_corrupted_sets_and_never_fakes_deep_ensembles(
    tmp_path, checkpoint, monkeypatch
):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))  # no trained copies there
    lines = []
    names = ("gaussian_noise", "contrast")
    config = setting(
        checkpoint, corruptions=names, severities=(1, 5), n_corrupt=20, seeds=(0, 2, 3)
    )
    table = run_sweep(
        "corruption", config, tmp_path / "out", cache=DiskCache(tmp_path / "cache"),
        log=lines.append,
    )  # fmt: skip
    assert sum("Deep Ensembles: no trained copies found" in line for line in lines) == 1
    systems = ["single", "Taylor", "CircAvg", "Hydra (Circ) (fused)"]
    assert sorted(set(table["system"])) == sorted(systems)
    assert len(table) == len(systems) * (1 + len(names) * 2 + 2)  # clean, each, pooled

    loaded, benchmark = loaded_and_benchmark(checkpoint)
    clean = take(benchmark.id_report, 20, purpose="corruption")
    single = [loaded.model]
    expected = plain_metrics(single, loaded, benchmark, clean)
    found = row(table, system="single", corruption="none")
    assert found["severity"] == 0
    assert_point(found, {k: expected[k] for k in ("accuracy", "nll")})
    parts = [corrupt_set(clean, name, 5) for name in names]
    pooled = type(clean)(
        "pooled", torch.cat([p.images for p in parts]), torch.cat([p.labels for p in parts])
    )
    expected = plain_metrics(single, loaded, benchmark, pooled)
    found = row(table, system="single", corruption="all", severity=5)
    assert_point(found, {k: expected[k] for k in ("accuracy", "nll")})
    one = plain_metrics(single, loaded, benchmark, parts[1])
    found = row(table, system="single", corruption="contrast", severity=5)
    assert_point(found, {k: one[k] for k in ("accuracy", "nll")})


def test_sweep_command_writes_its_files_and_refuses_with_one_line(tmp_path, checkpoint, capsys):
    out = tmp_path / "sweep"
    args = ["sweep", "--kind", "layers", "--quick", "--model", checkpoint, "--device", "cpu",
            "--n-search", "16", "--n-report", "24", "--no-finetune", "--points", "1",
            "--cache-dir", str(tmp_path / "cache"), "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    written = sorted(p.name for p in out.iterdir())
    assert written == [
        ".hydra-run.json", "layers.csv", "layers.png", "layers.svg", "report.json", "report.md"
    ]  # fmt: skip
    manifest = json.loads((out / ".hydra-run.json").read_text())
    assert "sweep layers" in manifest["data"]
    capsys.readouterr()
    other = write_tiny_checkpoint(tmp_path / "other.safetensors", seed=5)
    again = [a if a != checkpoint else other for a in args]
    assert main(again) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds the results of another model" in err[0]
    assert main([*args[:-2], "--points", "4", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "leaves a head in every layer" in err[0]
    assert main(["sweep", "--kind", "heads"]) == 2
    assert "invalid choice: 'heads'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--kind", "corruption", "--points", "2"], "--points applies to --kind layers or members"),
        (["--kind", "layers", "--n-corrupt", "5"], "--n-corrupt applies to --kind corruption"),
        (["--kind", "members", "--corruptions", "contrast"], "--corruptions applies to --kind"),
        (["--kind", "corruption", "--corruptions", "fog"], "unknown corruption 'fog'"),
    ],
)
def test_sweep_options_of_another_kind_are_refused(tmp_path, checkpoint, capsys, extra, message):
    args = ["sweep", *extra, "--quick", "--model", checkpoint, "--device", "cpu", "--n-search",
            "16", "--n-report", "24", "--cache-dir", str(tmp_path / "cache"),
            "--out", str(tmp_path / "out")]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_corruption_sweep_on_text_corrupts_the_sentences(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))
    folder = tiny_sentiment_folder(tmp_path / "model")
    config = setting(
        folder, task="text", corruptions=("typos", "word_dropout"), severities=(5,), n_corrupt=12,
        seeds=(0, 2, 3),
    )  # fmt: skip
    table = run_sweep("corruption", config, tmp_path / "out", cache=DiskCache(tmp_path / "cache"))
    assert set(table["corruption"]) == {"none", "typos", "word_dropout", "all"}
    loaded, benchmark = loaded_and_benchmark(folder)
    clean = take(benchmark.id_report, 12, purpose="corruption")
    typos = corrupt_set(clean, "typos", 5)
    assert typos.texts != clean.texts
    expected = plain_metrics([loaded.model], loaded, benchmark, typos)
    found = row(table, system="single", corruption="typos", severity=5)
    assert_point(found, {k: expected[k] for k in ("accuracy", "nll")})
    # Deep Ensembles (D), as the text report makes it: fresh heads on the shared encoder, one per
    # seed, trained once (the same ensemble comes back from the cache), probabilities averaged
    deep, _ = deep_heads(
        loaded.model, load_rotten_tomatoes("train"), config.deep_heads,
        preprocess=loaded.preprocess, seeds=config.seeds, validation_set=benchmark.id_search,
        cache=DiskCache(tmp_path / "cache"),
    )  # fmt: skip
    with torch.no_grad():
        p = deep(loaded.preprocess(typos.inputs)).double().softmax(-1).mean(1)
    found = row(table, system=DEEP, corruption="typos", severity=5)
    assert_point(found, {"accuracy": (p.argmax(-1) == typos.labels).double().mean().item()})
    assert len(table[table["system"] == DEEP]) == 4  # clean, each corruption, pooled


def test_a_fine_tuned_pruned_model_is_never_reported_on_its_training_items(checkpoint):
    from hydra_core.errors import InputError
    from hydra_core.experiment.evaluate import evaluate_systems
    from hydra_core.hydra.finetune import FinetuneConfig
    from hydra_core.hydra.systems import FinetunedPruned, Single

    loaded, benchmark = loaded_and_benchmark(checkpoint)
    keep = torch.ones(2, 4, dtype=torch.bool)
    keep[0, 0] = False
    tuned_on = benchmark.id_report  # the report items as its training set: refused
    system = FinetunedPruned("tuned", keep, FinetuneConfig(n_train=None, steps=1), tuned_on)
    with pytest.raises(InputError, match="'tuned' would be reported on data that chose it"):
        evaluate_systems(loaded, benchmark, [Single(), system], device="cpu", latency=False)
