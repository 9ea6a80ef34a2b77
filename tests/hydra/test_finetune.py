"""Fine-tuning bookkeeping: structure, loss, frozen parameters, schedule, cache, fusion; the
choice of its configuration on validation images, and the images it never sees."""

from __future__ import annotations

import hashlib
import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from hydra_core.cache import DiskCache, model_fingerprint
from hydra_core.data.fashion_mnist import load_fashion_mnist
from hydra_core.data.images import ImageSet
from hydra_core.hydra.finetune import (
    SELECTION_IMAGES,
    FinetuneConfig,
    best_grid_point,
    finetune_member,
    finetune_members,
    fuse_finetuned,
    grid_configs,
    learning_rate,
    parameter_group,
    select_finetune_config,
    training_subset,
    validation_subset,
)
from hydra_core.hydra.fused import ensemble_probs
from hydra_core.inference import predict
from hydra_core.masks import MemberMask
from hydra_core.metrics.classification import nll
from hydra_core.models.adapter import head_layout, prune_heads
from tests.conftest import make_tiny_vit, missing_data
from tests.hydra.test_fused import with_merged_mlps


def preprocess(images: torch.Tensor) -> torch.Tensor:
    return images.float() / 127.5 - 1.0


@pytest.fixture(scope="module")
def train_set() -> ImageSet:
    g = torch.Generator().manual_seed(4)
    images = torch.randint(0, 256, (24, 1, 16, 16), generator=g, dtype=torch.uint8)
    return ImageSet("tiny_train", images, torch.arange(24) % 5, "id")


@pytest.fixture(scope="module")
def model():
    return make_tiny_vit(depth=3, num_heads=4)


def mask(*dropped: tuple[int, int]) -> torch.Tensor:
    keep = torch.ones(3, 4, dtype=torch.bool)
    for layer, head in dropped:
        keep[layer, head] = False
    return keep


def test_structure_frozen_and_trained_parameters(model, train_set):
    keep = mask((0, 1), (2, 0), (2, 3))
    before = model_fingerprint(model)
    config = FinetuneConfig(
        n_train=16, batch_size=8, steps=3, warmup_steps=1, lr=1e-2, trainable=("attn", "head")
    )
    member = finetune_member(
        model, keep, config, preprocess=preprocess, train_set=train_set, name="a"
    )
    assert model_fingerprint(model) == before  # the source model is left alone
    assert head_layout(member.model).num_heads == (3, 4, 2)
    assert not member.model.training and all(p.requires_grad for p in member.model.parameters())
    start = dict(prune_heads(model, keep).named_parameters())
    for name, p in member.model.named_parameters():
        changed = not torch.equal(p, start[name])
        assert changed == (parameter_group(name) in ("attn", "head")), name
    assert [h["step"] for h in member.history] == [1, 2, 3]


def test_training_loss_is_label_smoothed_cross_entropy(model, train_set):
    keep = mask((1, 2))
    config = FinetuneConfig(n_train=16, batch_size=16, steps=1, warmup_steps=0, label_smoothing=0.1)
    member = finetune_member(model, keep, config, preprocess=preprocess, train_set=train_set)
    data = training_subset(config, train_set)  # one batch holds all 16 images
    with torch.no_grad():
        logits = prune_heads(model, keep)(preprocess(data.images))
    reference = F.cross_entropy(logits, data.labels, label_smoothing=0.1)
    log_p = logits.log_softmax(-1)
    by_hand = (0.9 * -log_p[torch.arange(16), data.labels] - 0.1 * log_p.mean(-1)).mean()
    assert member.history[0]["loss"] == pytest.approx(reference.item(), rel=1e-5)
    assert member.history[0]["loss"] == pytest.approx(by_hand.item(), rel=1e-5)
    assert member.history[0]["lr"] == pytest.approx(config.lr)  # no warm-up: the peak at step 0


def test_learning_rate_schedule():
    config = FinetuneConfig(lr=0.1, warmup_steps=4, min_lr_fraction=0.01)
    rates = [learning_rate(config, step, 14) for step in range(14)]
    assert rates[:4] == pytest.approx([0.025, 0.05, 0.075, 0.1])
    assert rates[4] == pytest.approx(0.1) and rates[-1] == pytest.approx(0.001)
    # cosine from step 4 (the peak) to step 13 (the floor): step 8 is 4/9 of the way
    assert rates[8] == pytest.approx(0.001 + 0.5 * 0.099 * (1 + math.cos(math.pi * 4 / 9)))
    assert all(a >= b for a, b in zip(rates[4:], rates[5:], strict=False))
    assert FinetuneConfig(epochs=1.5, batch_size=10).total_steps(25) == 5  # 1.5 x ceil(25 / 10)
    assert FinetuneConfig(steps=7).total_steps(25) == 7


def test_cache_hit_on_the_second_call(model, train_set, tmp_path):
    cache = DiskCache(tmp_path)
    config = FinetuneConfig(n_train=16, batch_size=8, steps=2, warmup_steps=1, lr=1e-2)
    calls = []
    first = finetune_member(
        model,
        mask((0, 0)),
        config,
        preprocess=preprocess,
        train_set=train_set,
        cache=cache,
        progress=lambda done, total: calls.append((done, total)),
    )
    assert calls == [(1, 2), (2, 2)] and not first.cached
    second = finetune_member(
        model, mask((0, 0)), config, preprocess=preprocess, train_set=train_set, cache=cache
    )
    assert second.cached and second.history == first.history
    for (name, a), b in zip(
        first.model.state_dict().items(), second.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    other_seed = finetune_member(
        model, mask((0, 0)), config, preprocess=preprocess, train_set=train_set, cache=cache, seed=1
    )
    assert not other_seed.cached  # the batch order is part of the key


def test_members_fused_with_averaged_mlps(model, train_set):
    config = FinetuneConfig(n_train=16, batch_size=8, steps=2, warmup_steps=1, lr=1e-2)
    members = [MemberMask("a", "", mask((0, 1))), MemberMask("b", "", mask((1, 2), (2, 2)))]
    tuned = finetune_members(
        model, members, config, preprocess=preprocess, train_set=train_set, seeds=[0, 1]
    )
    assert [t.name for t in tuned] == ["a", "b"] and [t.seed for t in tuned] == [0, 1]
    hydra = fuse_finetuned(tuned)
    assert hydra.member_head_counts() == [[3, 4, 4], [4, 3, 3]]
    x = preprocess(train_set.images[:6])
    with torch.no_grad():
        reference = torch.stack([m(x) for m in with_merged_mlps([t.model for t in tuned])], dim=1)
        torch.testing.assert_close(
            ensemble_probs(hydra(x)), ensemble_probs(reference), rtol=0, atol=1e-5
        )
    with pytest.raises(ValueError, match="1 seeds for 2 members"):
        finetune_members(model, members, config, preprocess=preprocess, seeds=[0])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(optimizer="adam"), "optimizer must be one of adamw, sgd"),
        (dict(lr=0.0), "lr must be positive"),
        (dict(steps=0), "steps must be a positive"),
        (dict(trainable=("attn", "everything")), "trainable must name some of"),
        (dict(trainable=()), "trainable must name some of"),
        (dict(label_smoothing=1.0), "label_smoothing"),
        (dict(n_train=0), "n_train must be a positive"),
    ],
)
def test_bad_configs_are_explained(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FinetuneConfig(**kwargs)


def test_parameter_groups():
    names = dict(make_tiny_vit(init_values=0.5).named_parameters())
    groups = {name: parameter_group(name) for name in names}
    assert groups["blocks.0.attn.qkv.weight"] == "attn" and groups["blocks.1.ls1.gamma"] == "attn"
    assert groups["blocks.2.mlp.fc2.bias"] == "mlp" and groups["blocks.0.ls2.gamma"] == "mlp"
    assert groups["blocks.0.norm1.weight"] == "norm" and groups["norm.bias"] == "norm"
    assert groups["patch_embed.proj.weight"] == "embed" and groups["cls_token"] == "embed"
    assert groups["pos_embed"] == "embed" and groups["head.weight"] == "head"
    with pytest.raises(ValueError, match="'adapter.scale' is in none of the groups"):
        parameter_group("adapter.scale")


# --- choosing the configuration on validation images ------------------------------------------


def blobs(n: int, seed: int) -> ImageSet:
    """A learnable synthetic task: class k's images are noise around the grey level 40 k."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 5
    images = (40 * labels).view(-1, 1, 1, 1) + torch.randint(0, 40, (n, 1, 16, 16), generator=g)
    return ImageSet(f"blobs-{seed}", images.to(torch.uint8), labels, "id")


SYNTHETIC = dict(
    base=FinetuneConfig(n_train=40, batch_size=8, warmup_steps=1, epochs=3.0),
    grid={"lr": (1e-5, 0.03, 0.1), "label_smoothing": (0.0, 0.1)},
)


@pytest.fixture(scope="module")
def selection_case():
    """A tiny model (unscaled weights, so it learns), a member mask, training and validation
    images drawn separately from the same task, and the selection on them."""
    model = make_tiny_vit(depth=3, num_heads=4, scale=1.0)
    data = dict(train_set=blobs(40, 0), validation_set=blobs(40, 1))
    keep = mask((0, 1))
    selection = select_finetune_config(model, keep, preprocess=preprocess, **SYNTHETIC, **data)
    return model, keep, data, selection


def test_selection_picks_the_best_grid_point(selection_case):
    """Each row is the validation score of the member fine-tuned with that grid point, computed
    here the plain way; NLL and accuracy pick different points on this case."""
    model, keep, data, selection = selection_case
    configs = grid_configs(SYNTHETIC["base"], SYNTHETIC["grid"])
    assert selection.table[["lr", "label_smoothing"]].values.tolist() == [
        [c.lr, c.label_smoothing] for c in configs
    ]
    validation = data["validation_set"]
    by_hand = []
    for config in configs:
        member = finetune_member(
            model, keep, config, preprocess=preprocess, train_set=data["train_set"]
        )
        logits = predict(member.model, validation.images, preprocess)
        by_hand.append(nll(logits.softmax(-1), validation.labels))
    assert selection.table["nll"].tolist() == pytest.approx(by_hand, rel=1e-9)
    assert selection.criterion == "nll" and selection.n_validation == len(validation)
    best = min(range(len(configs)), key=by_hand.__getitem__)
    assert selection.best == configs[best] and (selection.best.lr, best) == (0.1, 4)

    by_accuracy = select_finetune_config(
        model, keep, preprocess=preprocess, criterion="accuracy", **SYNTHETIC, **data
    )
    assert by_accuracy.table[["accuracy", "nll"]].equals(selection.table[["accuracy", "nll"]])
    top = by_accuracy.table["accuracy"].idxmax()
    assert by_accuracy.best == configs[top] != selection.best  # here the criteria disagree


@pytest.mark.parametrize(
    "nlls, accuracies, criterion, best",
    [
        ([0.5, 0.3, 0.4], [0.8, 0.7, 0.9], "nll", 1),
        ([0.5, 0.3, 0.4], [0.8, 0.7, 0.9], "accuracy", 2),
        ([0.5, 0.3, 0.3], [0.8, 0.7, 0.9], "nll", 1),  # equal NLL: the first
        ([0.5, 0.3, 0.4], [0.9, 0.7, 0.9], "accuracy", 2),  # equal accuracy: the lower NLL
        ([0.4, 0.3, 0.4], [0.9, 0.7, 0.9], "accuracy", 0),  # equal in both: the first
    ],
)
def test_best_grid_point(nlls, accuracies, criterion, best):
    table = pd.DataFrame({"nll": nlls, "accuracy": accuracies})
    assert best_grid_point(table, criterion) == best


def test_selection_is_deterministic_under_a_seed(selection_case):
    model, keep, data, selection = selection_case
    again = select_finetune_config(model, keep, preprocess=preprocess, **SYNTHETIC, **data)
    scores = ["accuracy", "nll", "ece", "confidence"]
    pd.testing.assert_frame_equal(again.table[scores], selection.table[scores], check_exact=True)
    assert again.best == selection.best
    other = select_finetune_config(model, keep, preprocess=preprocess, seed=1, **SYNTHETIC, **data)
    assert not other.table["nll"].equals(selection.table["nll"])  # the seed is the batch order


def test_validation_images_may_not_be_training_images(model, train_set):
    config = FinetuneConfig(n_train=16, batch_size=8, steps=1, warmup_steps=0)
    message = "16 of the 24 validation images are also among the 16 fine-tuning images"
    with pytest.raises(ValueError, match=message):
        select_finetune_config(
            model,
            mask((0, 0)),
            config,
            preprocess=preprocess,
            grid={"lr": (0.01,)},
            train_set=train_set,
            validation_set=train_set,
        )


@pytest.mark.parametrize(
    "base, grid, match",
    [
        (FinetuneConfig(), {"learning_rate": (0.01,)}, "not FinetuneConfig fields"),
        (FinetuneConfig(), {"lr": ()}, "at least one value"),
        (FinetuneConfig(), {}, "at least one value"),
        (FinetuneConfig(steps=5), {"epochs": (1.0, 2.0)}, "sets steps=5, which overrides"),
    ],
)
def test_bad_grids_are_explained(base, grid, match):
    with pytest.raises(ValueError, match=match):
        grid_configs(base, grid)


def test_bad_criterion_is_explained(model):
    with pytest.raises(ValueError, match="criterion must be one of nll, accuracy"):
        select_finetune_config(model, mask(), preprocess=preprocess, criterion="ece")


def row_hashes(images: torch.Tensor) -> set[bytes]:
    return {hashlib.blake2b(row.numpy().tobytes(), digest_size=16).digest() for row in images}


@pytest.fixture(scope="module")
def fashion_mnist() -> dict[str, ImageSet]:
    try:
        return {split: load_fashion_mnist(split) for split in ("train", "validation", "test")}
    except FileNotFoundError as exc:
        missing_data(str(exc))


def test_finetuning_and_selection_never_see_test_images(fashion_mnist, monkeypatch):
    """On Fashion-MNIST with the default images: every image fine-tuning trains on is one of its
    training subset, every image the selection scores is one of its validation subset, and no
    image of either is a test image (the report split) or one of the other."""
    model = make_tiny_vit(depth=2, num_heads=2, img_size=28, patch_size=7, num_classes=10)
    trained, scored = [], []

    def recording(images: torch.Tensor) -> torch.Tensor:
        # predictions run under inference mode; training steps (and the cache key) do not
        (scored if torch.is_inference_mode_enabled() else trained).append(images)
        return preprocess(images)

    base = FinetuneConfig(n_train=64, batch_size=32, warmup_steps=1)
    selection = select_finetune_config(
        model, torch.ones(2, 2, dtype=torch.bool), base, preprocess=recording, grid={"lr": (0.01,)}
    )
    finetune_member(model, torch.ones(2, 2, dtype=torch.bool), base, preprocess=recording)
    trained, scored = row_hashes(torch.cat(trained)), row_hashes(torch.cat(scored))
    assert selection.n_validation == SELECTION_IMAGES

    assert trained == row_hashes(training_subset(base).images)
    assert scored == row_hashes(validation_subset().images)
    assert trained <= row_hashes(fashion_mnist["train"].images)
    assert scored <= row_hashes(fashion_mnist["validation"].images)
    test = row_hashes(fashion_mnist["test"].images)
    assert not trained & test and not scored & test and not trained & scored
