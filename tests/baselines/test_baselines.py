"""The baselines as systems (MC Dropout, temperature scaling), checked against plain computations
on a tiny ViT; evaluate_systems with a list of systems."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hydra_core.baselines.mc_dropout import MCDropout, dropout_modules, dropout_rate
from hydra_core.baselines.systems import (
    MCDropoutBaseline,
    TemperatureBaseline,
    baseline_systems,
)
from hydra_core.baselines.temperature import TemperatureScaled
from hydra_core.data.benchmark import build_benchmark
from hydra_core.data.images import ImageSet
from hydra_core.experiment.evaluate import evaluate_systems
from hydra_core.hydra.systems import Hydra, Pruned, Single
from hydra_core.inference import predict
from hydra_core.masks import MemberMask
from hydra_core.metrics.temperature import fit_temperature
from hydra_core.zoo.registry import LoadedModel
from tests.conftest import make_tiny_vit


def preprocess(images: torch.Tensor) -> torch.Tensor:
    return images.float() / 127.5 - 1.0


def image_set(name: str, n: int, group: str, seed: int, labelled: bool = False) -> ImageSet:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 1, 16, 16), generator=g, dtype=torch.uint8)
    return ImageSet(name, images, torch.arange(n) % 5 if labelled else None, group)


@pytest.fixture(scope="module")
def loaded():
    return LoadedModel("tiny", make_tiny_vit(depth=2, num_heads=4), preprocess)


@pytest.fixture(scope="module")
def benchmark(loaded):
    """ID labels: the model's own predictions, a third of them changed, so that the fitted
    temperature lies inside its bounds."""
    items = image_set("id_set", 80, "id", 1)
    with torch.no_grad():
        labels = loaded.model(preprocess(items.inputs)).argmax(-1)
    labels[::3] = (labels[::3] + 1) % 5
    ood = [image_set("near_set", 24, "near", 2), image_set("far_set", 24, "far", 3)]
    return build_benchmark(ImageSet("id_set", items.inputs, labels, "id"), None, ood)


@pytest.fixture(scope="module")
def members():
    masks = torch.ones(2, 2, 4, dtype=torch.bool)
    masks[0, 0, :2] = False
    masks[1, 1, 1:3] = False
    return [MemberMask(f"m{i}", "test", masks[i]) for i in range(2)]


def test_mc_dropout_matches_plain_passes_and_restores_the_model():
    model = make_tiny_vit(depth=2, num_heads=4, drop_rate=0.2, proj_drop_rate=0.2)
    x = preprocess(image_set("x", 6, "id", 5).inputs)
    plain = []
    for t in range(3):
        torch.manual_seed(11 + t)
        model.train()
        plain.append(model(x))
    model.eval()
    outs = MCDropout(model, passes=3, seed=11)(x)
    assert outs.shape == (6, 3, 5)
    torch.testing.assert_close(outs, torch.stack(plain, dim=1), rtol=0, atol=0)
    assert not model.training and not any(m.training for m in model.modules())
    assert not torch.equal(outs[:, 0], outs[:, 1])  # dropout sampled


def test_post_hoc_rate_is_used_during_the_passes_only():
    model = make_tiny_vit(depth=2, num_heads=4)
    assert dropout_rate(model) == 0.0 and dropout_modules(model) > 0
    x = preprocess(image_set("x", 4, "id", 6).inputs)
    outs = MCDropout(model, passes=2, seed=0, rate=0.3)(x)
    assert not torch.equal(outs[:, 0], outs[:, 1])
    assert dropout_rate(model) == 0.0 and not model.training
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        MCDropout(model, passes=2, rate=1.0)


def test_temperature_is_fitted_on_the_search_split(loaded, benchmark):
    report = evaluate_systems(
        loaded, benchmark, [Single(), TemperatureBaseline()], device="cpu", latency=False
    )
    search = benchmark.id_search
    with torch.no_grad():
        logits = loaded.model(preprocess(search.inputs))
    expected = fit_temperature(logits, search.labels)
    system = report.info["Temperature Scaling"]
    assert system.kind == "temperature"
    scaled = system.models[0]
    assert isinstance(scaled, TemperatureScaled)
    assert 1e-3 < expected < 1e3  # inside the bounds: a real fit
    assert float(scaled.temperature) == pytest.approx(expected, rel=1e-6)
    single = report.evaluations["single"].id.logits
    torch.testing.assert_close(
        report.evaluations["Temperature Scaling"].id.logits, single / scaled.temperature
    )
    # taken from the single model's predictions, bit for bit what the scaled model predicts
    evaluated = report.evaluations["Temperature Scaling"]
    for part, data in zip(
        [evaluated.id, *evaluated.ood], [benchmark.id_report, *benchmark.ood_report], strict=True
    ):
        direct = predict(scaled, data.inputs, loaded.preprocess, batch_size=256)
        assert torch.equal(part.logits, direct), part.name
    nll = F.cross_entropy(single / scaled.temperature, benchmark.id_report.labels)
    table = report.table().set_index(["system", "set"])
    assert table.loc[("Temperature Scaling", "id_set"), "nll"] == pytest.approx(float(nll), 1e-5)


def test_every_stage_is_named_in_the_progress(loaded, benchmark, members):
    """evaluate_systems reports each stage it runs, in order: each system's evaluation (counting
    the report items over all sets), the multiply-adds, the latency rounds, the intervals."""
    seen: dict[str, list[tuple[int, int]]] = {}
    systems = [Single(), Hydra(members), TemperatureBaseline()]
    report = evaluate_systems(
        loaded,
        benchmark,
        systems,
        device="cpu",
        latency_repeats=2,
        latency_warmup=1,
        progress=lambda stage, done, total: seen.setdefault(stage, []).append((done, total)),
    )
    items = len(benchmark.id_report) + sum(len(s) for s in benchmark.ood_report)
    evaluated = ["single", "Hydra: m0", "Hydra: m1", "Hydra (fused)"]
    assert list(seen) == [
        *(f"evaluation: {name}" for name in evaluated),  # the unfused ensemble and temperature
        "temperature fit",  # scaling reuse these predictions; the fit predicts the ID search
        "multiply-adds",  # split (a silent wait before)
        "latency",
        "intervals",
    ]
    n_fit = len(benchmark.id_search)
    assert seen["temperature fit"][-1] == (n_fit, n_fit)
    ends = [steps[-1] for stage, steps in seen.items() if stage.startswith("evaluation")]
    assert ends == [(items, items)] * len(evaluated)
    # each of the last three stages says it has begun (0), so that a bar names it at once
    assert seen["latency"] == [(0, 3), (1, 3), (2, 3), (3, 3)]  # warm-up round, timed ones
    assert seen["multiply-adds"][0][0] == 0 and seen["intervals"][0][0] == 0
    assert seen["intervals"][-1] == (len(report.systems), len(report.systems))
    assert report.setup["latency_warmup"] == 1


def test_systems_side_by_side(loaded, benchmark, members):
    keep = torch.ones(2, 4, dtype=torch.bool)
    keep[:, 0] = False
    systems = [
        Single(),
        Pruned("Taylor", keep),
        Hydra(members),
        MCDropoutBaseline(passes=2),
        MCDropoutBaseline(passes=2, rate=0.1),
        TemperatureBaseline(),
    ]
    report = evaluate_systems(
        loaded, benchmark, systems, device="cpu", latency_batch=4, latency_repeats=1
    )
    assert report.systems == [
        "single",
        "Taylor",
        "Hydra: m0",
        "Hydra: m1",
        "Hydra (unfused)",
        "Hydra (fused)",
        "MC Dropout (p=0.1, post hoc)",
        "Temperature Scaling",
    ]
    assert "no dropout" in report.setup["skipped"]["MC Dropout"]
    assert [s["name"] for s in report.setup["systems"]][-1] == "Temperature Scaling"
    mc = report.evaluations["MC Dropout (p=0.1, post hoc)"]
    assert mc.id.logits.shape == (len(benchmark.id_report), 2, 5)
    summary = report.summary().set_index("system")
    assert summary.loc["MC Dropout (p=0.1, post hoc)", "kind"] == "mc-dropout"
    assert summary.loc["MC Dropout (p=0.1, post hoc)", "ood_mi"] > 0  # passes disagree
    cost = report.cost
    assert cost.loc["Temperature Scaling", "params"] == cost.loc["single", "params"]
    assert cost.loc["MC Dropout (p=0.1, post hoc)", "params"] == cost.loc["single", "params"]


def test_shorthand_and_mistakes_are_explained(loaded, benchmark, members):
    with pytest.raises(TypeError, match="with System objects"):
        evaluate_systems(loaded, benchmark, [Single()], label="x", device="cpu")
    with pytest.raises(TypeError, match="not a mix"):
        evaluate_systems(loaded, benchmark, [Single(), *members], device="cpu")
    with pytest.raises(ValueError, match="two systems are named 'single'"):
        evaluate_systems(loaded, benchmark, [Single(), Single()], device="cpu", latency=False)
    with pytest.raises(ValueError, match="unknown baseline.*'dropout'.*mc-dropout, temperature"):
        baseline_systems(["dropout"])
    assert [s.name for s in baseline_systems(["temperature", "mc-dropout"], mc_rate=0.2)] == [
        "Temperature Scaling",
        "MC Dropout (p=0.2, post hoc)",
    ]


def test_shared_backbone_heads_on_an_image_model(loaded, benchmark):
    """Deep Ensembles (D) on a ViT: fresh heads on the shared backbone's final states; the members
    differ only in their heads, and each member is the model with its own head."""
    from dataclasses import replace

    from hydra_core.baselines.shared_backbone import DEEP, DEEP_HEADS
    from hydra_core.baselines.systems import SharedBackboneBaseline

    train = image_set("train", 40, "id", 9, labelled=True)
    config = replace(DEEP_HEADS, steps=2, n_train=None, batch_size=16)
    deep = SharedBackboneBaseline(seeds=(0, 1), config=config, train_set=train)
    report = evaluate_systems(loaded, benchmark, [Single(), deep], device="cpu", latency=False)
    ensemble = report.info[DEEP].models[0]
    first, second = ensemble.copies
    assert first.patch_embed.proj.weight is second.patch_embed.proj.weight  # shared backbone
    assert not torch.equal(first.head.weight, second.head.weight)  # own heads, by seed
    logits = report.evaluations[DEEP].id.logits  # (N, 2, C)
    with torch.no_grad():
        own = first(preprocess(benchmark.id_report.inputs))
    torch.testing.assert_close(logits[:, 0], own, rtol=1e-5, atol=1e-5)
    skipped = evaluate_systems(
        loaded, benchmark, [Single(), SharedBackboneBaseline()], device="cpu", latency=False
    )
    assert "training split" in skipped.setup["skipped"][DEEP]
