"""The Hydra commands (masks, hydra, train-ensemble), run as a user would, on a tiny checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from hydra_core.baselines.deep_ensembles import (
    available_deep_ensemble,
    deep_ensemble_for,
    reference_checkpoint,
    stored_copies,
)
from hydra_core.cli import build_parser, main
from hydra_core.data.benchmark import default_benchmark
from hydra_core.data.images import ImageSet
from hydra_core.evaluate import probabilities
from hydra_core.hydra.fused import load_hydra
from hydra_core.masks import load_masks
from hydra_core.metrics import accuracy
from hydra_core.models.adapter import HeadLayout
from hydra_core.zoo.default import DEFAULT_CHECKPOINT, preprocess
from tests.conftest import TINY

DATA = ["--n-search", "40", "--n-report", "60", "--ood", "mnist", "noise", "--device", "cpu"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("name", ["masks", "hydra", "train-ensemble", "report"])
def test_help(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([name, "--help"])
    assert exit_info.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_masks_then_hydra(checkpoint, tmp_path, capsys):
    masks = tmp_path / "members.json"
    assert (
        main(
            [
                "masks",
                "--model",
                checkpoint,
                *DATA,
                "--budget",
                "2",
                "--pool",
                "5",
                "--seeds",
                "0",
                "2",
                "3",
                "--out",
                str(masks),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "Jaccard" in printed and "mean pairwise Jaccard" in printed
    members = load_masks(masks, HeadLayout((4, 4), 6, 24))
    assert [m.name for m in members] == ["CircAvg seed 0", "CircAvg seed 2", "CircAvg seed 3"]
    assert all(m.kept == 6 for m in members)
    # the file says how each member was made: strategy, parameters, the search behind the ranking
    made = json.loads(masks.read_text())["members"][1]["provenance"]
    assert made["strategy"] == "seed-sampling"
    assert made["parameters"] == {"budget": 2, "pool": 5, "seed": 2}
    ranking = made["ranking"]
    assert [ranking[k] for k in ("name", "method", "objective")] == ["CircAvg", "greedy", "avg"]
    assert (ranking["budget"], ranking["steps"]) == (2, 2)
    assert ranking["search"]["id"] == {"name": "fashion_mnist", "n": 40}
    assert set(ranking["search"]["ood"]) == {"photos", "faces"}

    out = tmp_path / "hydra"
    assert (
        main(
            [
                "hydra",
                "--model",
                checkpoint,
                *DATA,
                "--masks",
                str(masks),
                "--out",
                str(out),
                "--latency-batch",
                "4",
                "--latency-repeats",
                "3",
            ]
        )
        == 0
    )
    summary = pd.read_csv(out / "summary.csv").set_index("system")
    assert json.loads((out / "systems.json").read_text())["setup"]["latency_repeats"] == 3
    assert {"single", "Hydra (unfused)", "Hydra (fused)"} <= set(summary.index)
    assert summary.loc["Hydra (fused)", "heads"] == "6x3"
    assert len(pd.read_csv(out / "systems_table.csv")) == 6 * len(summary)
    systems = json.loads((out / "systems.json").read_text())["systems"]
    assert systems["Hydra (fused)"]["kind"] == "fused"
    # the exported model reproduces the fused row's accuracy on the report split
    hydra = load_hydra(out / "hydra.safetensors")
    id_report = default_benchmark(n_search=40, n_report=60, ood=["mnist", "noise"]).id_report
    with torch.no_grad():
        probs = probabilities(hydra(preprocess(id_report.images)))
    expected = summary.loc["Hydra (fused)", "accuracy"]
    assert accuracy(probs, id_report.labels) == pytest.approx(expected)
    # ... and loads back as a model: `eval` gives the fused row's numbers, analyses refuse it
    capsys.readouterr()
    exported = str(out / "hydra.safetensors")
    assert main(["eval", "--model", exported, *DATA, "--json"]) == 0
    evaluation = json.loads(capsys.readouterr().out)
    assert evaluation["model"]["members"] == 3 and evaluation["model"]["heads"] == "6+6+6"
    assert evaluation["id"]["accuracy"]["value"] == pytest.approx(expected)
    assert main(["search", "--model", exported, *DATA, "--out", str(tmp_path / "s")]) == 2
    assert "is a fused Hydra model" in capsys.readouterr().err

    tuned = tmp_path / "tuned"
    assert (
        main(
            [
                "hydra",
                "--model",
                checkpoint,
                *DATA,
                "--masks",
                str(masks),
                "--out",
                str(tuned),
                "--finetune",
                "--ft-steps",
                "2",
                "--ft-n-train",
                "64",
                "--ft-batch-size",
                "32",
                "--ft-vary-batch-order",
                "--no-latency",
                "--label",
                "Tuned",
            ]
        )
        == 0
    )
    setup = json.loads((tuned / "systems.json").read_text())["setup"]
    assert setup["finetune"]["steps"] == 2 and setup["label"] == "Tuned"
    assert "latency_ms" not in pd.read_csv(tuned / "cost.csv").columns


def test_deep_ensemble_lookup_by_model_source(checkpoint, tmp_path):
    assert reference_checkpoint("default") == reference_checkpoint("fmnist-vit-default")
    assert reference_checkpoint("default") == DEFAULT_CHECKPOINT
    assert reference_checkpoint(checkpoint) == Path(checkpoint)
    missing = str(tmp_path / "missing.safetensors")
    for source in ("dinov2-s", "vit_small_patch16_224", missing):
        assert reference_checkpoint(source) is None and stored_copies(source) == []
    reasons = []
    assert deep_ensemble_for("dinov2-s", log=reasons.append) is None
    assert deep_ensemble_for(checkpoint, log=reasons.append) is None  # no copies trained
    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, str(foreign))
    assert stored_copies(str(foreign)) == []
    assert deep_ensemble_for(str(foreign), log=reasons.append) is None
    assert reasons == [
        "Deep Ensembles: only for Hydra Lab checkpoints; skipped",
        "Deep Ensembles: no trained copies found (python -m hydra_core train-ensemble)",
        f"Deep Ensembles skipped: {foreign} has no 'vit_config' metadata; Deep Ensembles need "
        "a Hydra Lab checkpoint (written by save_checkpoint) as the reference",
    ]


def _tiny_fashion_mnist(split: str = "test") -> ImageSet:
    n = {"train": 64, "validation": 32, "test": 32, "train-full": 96}[split]
    g = torch.Generator().manual_seed(len(split))
    images = torch.randint(0, 256, (n, 1, 28, 28), generator=g, dtype=torch.uint8)
    return ImageSet("fashion_mnist", images, torch.arange(n) % 10, "id")


def test_an_interrupted_train_ensemble_goes_on_from_its_last_epoch(
    checkpoint, tmp_path, monkeypatch, capsys
):
    from hydra_core.training import trainer

    monkeypatch.setattr("hydra_core.data.fashion_mnist.load_fashion_mnist", _tiny_fashion_mnist)
    write = trainer._write_resume

    def write_then_ctrl_c(*args, **kwargs):
        write(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "_write_resume", write_then_ctrl_c)
    argv = ["train-ensemble", "--reference", checkpoint, "--seeds", "1", "--epochs", "2"]
    assert main(argv) == 130
    kept = list((tmp_path / "cache" / "deep_ensembles").glob("seed1-*.safetensors.resume.pt"))
    assert len(kept) == 1 and not list(kept[0].parent.glob("*.safetensors"))
    monkeypatch.setattr(trainer, "_write_resume", write)
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "going on from the interrupted run" in out and "epoch 1/2" not in out
    assert not kept[0].exists() and kept[0].with_name(kept[0].name[: -len(".resume.pt")]).is_file()


def test_train_ensemble_then_deep_ensemble_rows(checkpoint, tmp_path, monkeypatch, capsys):
    # train_vit reads Fashion-MNIST itself; a tiny stand-in keeps this to a few optimiser steps
    monkeypatch.setattr("hydra_core.data.fashion_mnist.load_fashion_mnist", _tiny_fashion_mnist)
    assert (
        main(["train-ensemble", "--reference", checkpoint, "--seeds", "1", "2", "--epochs", "1"])
        == 0
    )
    paths = [
        line.split(": ", 1)[1]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("seed")
    ]
    assert len(paths) == 2 and all(p.endswith(".safetensors") for p in paths)
    assert main(["train-ensemble", "--reference", checkpoint, "--seeds", "0"]) == 2
    assert "seed 0 is the seed the reference" in capsys.readouterr().err
    # the recipe changed (--epochs 1), so the reference's own recipe has no copies
    assert len(available_deep_ensemble(reference=checkpoint)) == 1
    from hydra_core.baselines import deep_ensembles

    one_epoch = deep_ensembles.TrainConfig(epochs=1)
    monkeypatch.setattr(deep_ensembles, "recipe_of", lambda reference: (one_epoch, TINY))
    assert len(available_deep_ensemble(reference=checkpoint)) == 3
    assert stored_copies(checkpoint) == [1, 2] and len(deep_ensemble_for(checkpoint)) == 3
    masks = tmp_path / "members.json"
    assert (
        main(
            [
                "masks",
                "--model",
                checkpoint,
                *DATA,
                "--strategy",
                "taylor",
                "--budget",
                "2",
                "--pool",
                "6",
                "--m",
                "2",
                "--out",
                str(masks),
            ]
        )
        == 0
    )
    out = tmp_path / "hydra"
    assert (
        main(
            [
                "hydra",
                "--model",
                checkpoint,
                *DATA,
                "--masks",
                str(masks),
                "--deep-ensemble",
                "--no-latency",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    summary = pd.read_csv(out / "summary.csv").set_index("system")
    assert summary.loc["Deep Ensembles", "heads"] == "8x3"
    assert summary.loc["Deep Ensembles", "id_mi"] > 0


def test_hydra_with_baselines(checkpoint, tmp_path, capsys):
    from hydra_core.masks import MemberMask, save_masks
    from hydra_core.zoo.registry import load_model

    keep = torch.ones(2, 4, dtype=torch.bool)
    keep[0, 0] = keep[1, 3] = False
    other = keep.clone()
    other[0, 1] = False
    masks = tmp_path / "members.json"
    members = [MemberMask("a", "test", keep), MemberMask("b", "test", other)]
    save_masks(masks, members, load_model(checkpoint).identity())
    out = tmp_path / "hydra"
    common = ["hydra", "--model", checkpoint, *DATA, "--masks", str(masks), "--no-latency"]
    assert main([*common, "--out", str(out), "--baselines", "temperature", "mc-dropout"]) == 0
    assert "MC Dropout left out: the model has no dropout" in capsys.readouterr().err
    summary = pd.read_csv(out / "summary.csv").set_index("system")
    assert summary.loc["Temperature Scaling", "kind"] == "temperature"
    assert "MC Dropout" not in summary.index
    rate = [*common, "--out", str(out), "--baselines", "mc-dropout", "--mc-dropout-rate", "0.1"]
    assert main([*rate, "--mc-passes", "2"]) == 2  # other options: another run, not a resume
    assert "made with --baselines temperature mc-dropout, not mc-dropout" in capsys.readouterr().err
    assert main([*rate, "--mc-passes", "2", "--overwrite"]) == 0
    summary = pd.read_csv(out / "summary.csv").set_index("system")
    assert summary.loc["MC Dropout (p=0.1, post hoc)", "kind"] == "mc-dropout"
    capsys.readouterr()
    assert main([*common, "--baselines", "dropout"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--baselines: unknown baseline(s) 'dropout'" in err
    assert main([*common, "--baselines", "mc-dropout", "--mc-dropout-rate", "1.5"]) == 2
    assert (
        "argument --mc-dropout-rate: must lie strictly between 0 and 1" in capsys.readouterr().err
    )
    assert main([*common, "--latency-repeats", "0"]) == 2
    assert "argument --latency-repeats: must be at least 1, got 0" in capsys.readouterr().err


def test_masks_circuits_is_one_circuit_per_criterion(checkpoint, tmp_path, capsys):
    """--strategy circuits: Hydra (Circ) as the paper's method, CircAcc + CircOOD + CircAvg, each
    the same mask as the single circuit of its criterion."""
    layout = HeadLayout((4, 4), 6, 24)

    def masks(*extra: str) -> list:
        out = tmp_path / f"m{len(list(tmp_path.iterdir()))}.json"
        args = ["masks", "--model", checkpoint, *DATA, "--budget", "6", *extra, "--out", str(out)]
        assert main(args) == 0
        return load_masks(out, layout)

    members = masks("--strategy", "circuits")
    assert [m.name for m in members] == ["CircAcc-6", "CircOOD-6", "CircAvg-6"]
    for member, objective in zip(members, ("acc", "ood", "avg"), strict=True):
        (single,) = masks("--strategy", "circuit", "--m", "1", "--objective", objective)
        assert torch.equal(member.keep, single.keep)
    capsys.readouterr()
    out = ["--out", str(tmp_path / "refused.json")]
    code = main(["masks", "--model", checkpoint, *DATA, "--strategy", "circuits", "--m", "2", *out])
    assert code == 2
    assert "one member per criterion" in capsys.readouterr().err
    # at budget 2 the three criteria remove the same two heads of this tiny model
    code = main(
        ["masks", "--model", checkpoint, *DATA, "--strategy", "circuits", "--budget", "2", *out]
    )
    assert code == 2
    assert "the criteria found the same circuit" in capsys.readouterr().err


def test_efficient_baselines_from_the_command_line(checkpoint, tmp_path, capsys):
    """hydra --baselines: a from-scratch ensemble that is not stored is left out with the command
    that trains it; train-baselines refuses what cannot apply, in one line."""
    from hydra_core.masks import MemberMask, save_masks
    from hydra_core.zoo.registry import load_model

    keep = torch.ones(2, 4, dtype=torch.bool)
    keep[0, 0] = False
    masks = tmp_path / "members.json"
    save_masks(masks, [MemberMask("a", "test", keep)], load_model(checkpoint).identity())
    common = ["hydra", "--model", checkpoint, *DATA, "--masks", str(masks), "--no-latency"]
    out = tmp_path / "hydra"
    assert main([*common, "--out", str(out), "--baselines", "mimo", "packed-ensembles"]) == 0
    err = capsys.readouterr().err
    assert "MIMO left out: no trained copy is stored; train it with " in err
    assert "`python -m hydra_core train-baselines packed-ensembles`" in err
    assert "MIMO" not in pd.read_csv(out / "summary.csv")["system"].tolist()
    assert main(["train-baselines", "mimo", "--model", "minilm-sentiment"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "mimo: trained from scratch with a Hydra Lab checkpoint" in err
    assert main(["train-baselines", "lora-ensembles", "--epochs", "2"]) == 2
    assert "--epochs applies to packed-ensembles and mimo only" in capsys.readouterr().err
    assert main(["train-baselines", "dropout"]) == 2
    assert "invalid choice: 'dropout'" in capsys.readouterr().err
