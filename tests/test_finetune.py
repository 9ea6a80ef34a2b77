"""Fine-tuning bookkeeping: structure, loss, frozen parameters, schedule, cache, fusion."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hydra_core.cache import DiskCache, model_fingerprint
from hydra_core.data.images import ImageSet
from hydra_core.hydra.finetune import (
    FinetuneConfig,
    finetune_member,
    finetune_members,
    fuse_finetuned,
    learning_rate,
    parameter_group,
    training_subset,
)
from hydra_core.hydra.fused import ensemble_probs
from hydra_core.masks import MemberMask
from hydra_core.models.adapter import head_layout, prune_heads
from tests.conftest import make_tiny_vit
from tests.test_fused import with_merged_mlps


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
    config = FinetuneConfig(n_train=16, batch_size=16, steps=1, warmup_steps=0)
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
