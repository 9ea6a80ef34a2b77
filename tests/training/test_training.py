"""The one training loop: its pieces (schedules, decay split, best epoch, frozen flags, errors),
and every recipe built on it against the plain loop it replaced, bit for bit on tiny models.

The ``_plain_*`` functions are the loops as they were written before the trainer (one per recipe:
the default ViT, ``train-text``, fine-tuning after pruning, the top of a text model on cached
states); each recipe must give exactly their weights and histories, as the shipped checkpoints and
cached runs depend on it."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hydra_core.data.images import ImageSet
from hydra_core.data.text import TextSet
from hydra_core.errors import InputError
from hydra_core.evaluate import callable_model
from hydra_core.hydra.finetune import FinetuneConfig, finetune_member, training_subset
from hydra_core.models.adapter import family_of, prune_heads
from hydra_core.models.text import TextClassifier, pack
from hydra_core.training.prefix import state_batches, top_logits, trained_parameters
from hydra_core.training.schedules import warmup_cosine, warmup_cosine_to_floor, warmup_linear
from hydra_core.training.top import TopFinetuneConfig, state_nll, train_top
from hydra_core.training.trainer import TrainerConfig, decay_split, train
from hydra_core.zoo.default import TrainConfig, train_vit
from hydra_core.zoo.minilm import TextTrainConfig, train_epochs
from tests.conftest import TINY, make_tiny_text, make_tiny_vit


def preprocess(images: torch.Tensor) -> torch.Tensor:
    return images.float() / 127.5 - 1.0


def blobs(n: int, seed: int, size: int = 16, classes: int = 5) -> ImageSet:
    """A learnable task: class k's images are noise around the grey level 40 k."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    images = (40 * (labels % 5)).view(-1, 1, 1, 1) + torch.randint(
        0, 40, (n, 1, size, size), generator=g
    )
    return ImageSet(f"blobs-{seed}", images.to(torch.uint8), labels, "id")


def assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


# --- the pieces ---------------------------------------------------------------------------------


def test_schedules():
    cosine = warmup_cosine(0.1, 4, 14)
    assert [cosine(s) for s in range(4)] == pytest.approx([0.025, 0.05, 0.075, 0.1])
    assert cosine(9) == pytest.approx(0.05 * (1 + math.cos(math.pi * 5 / 10)))
    floor = warmup_cosine_to_floor(0.1, 4, 14, 0.01)
    assert floor(4) == pytest.approx(0.1) and floor(13) == pytest.approx(0.001)
    linear = warmup_linear(0.3, 3, 13)
    assert [linear(s) for s in (0, 2, 3, 8, 12)] == pytest.approx([0.1, 0.3, 0.3, 0.15, 0.03])


def test_the_two_linear_warm_ups_differ_in_the_last_bit():
    """train-text's warm-up and the top fine-tuning's are the same number on paper, not in
    floating point: each recipe keeps its own."""
    plain, first = warmup_linear(3e-4, 7, 70), warmup_linear(3e-4, 7, 70, fraction_first=True)
    assert [plain(s) for s in range(7)] == [3e-4 * (s + 1) / 7 for s in range(7)]
    assert [first(s) for s in range(7)] == [3e-4 * ((s + 1) / 7) for s in range(7)]
    assert plain(0) != first(0) and plain(0) == pytest.approx(first(0), rel=1e-15)
    assert [plain(s) for s in range(7, 70)] == [first(s) for s in range(7, 70)]


def test_decay_split_exempts_biases_norms_tokens_and_embedding_tables():
    vit = make_tiny_vit(reg_tokens=2)
    named = dict(vit.named_parameters())
    decay, no_decay = decay_split(vit, named)
    name_of = {id(p): n for n, p in named.items()}
    decaying = [name_of[id(p)] for p in decay]
    tokens = ("cls_token", "reg_token", "pos_embed")  # matrices by shape, never decayed
    assert decaying == [n for n, p in named.items() if p.ndim >= 2 and n not in tokens]
    assert [name_of[id(p)] for p in no_decay] == [n for n in named if n not in decaying]
    text = make_tiny_text("bert")
    decay, _ = decay_split(text, dict(text.named_parameters()))
    tables = {id(m.weight) for m in text.modules() if isinstance(m, nn.Embedding)}
    assert len(tables) == 3 and not tables & {id(p) for p in decay}


def _toy_run(steps: int, epochs_seen: list, on_epoch=None, **kwargs):
    """A tiny ViT trained on blobs; ``epochs_seen`` gets each complete epoch's weights."""
    model = make_tiny_vit(depth=2, num_heads=2, scale=1.0)
    data, val = blobs(24, 0), blobs(16, 1)
    parameters = dict(model.named_parameters())

    def scores() -> dict:
        with torch.no_grad():
            logits = model(preprocess(val.images))
        return {"nll": float(F.cross_entropy(logits, val.labels))}

    def seen(epoch) -> None:
        epochs_seen.append((epoch.epoch, {k: p.detach().clone() for k, p in parameters.items()}))
        if on_epoch is not None:
            on_epoch(epoch)

    result = train(
        model,
        parameters,
        lambda index: (model(preprocess(data.images[index])), data.labels[index]),
        lambda g: torch.randperm(24, generator=g).split(8),
        TrainerConfig(steps=steps, lr=0.05, seed=1),
        warmup_linear(0.05, 1, steps),
        validate=scores,
        on_epoch=seen,
        **kwargs,
    )
    return model, result


def test_best_epoch_is_restored_and_a_cut_epoch_is_not_validated():
    seen = []
    model, result = _toy_run(14, seen, rank=lambda s: (-s["nll"],))  # keep the *worst* epoch
    assert [e.epoch for e in result.epochs] == [1, 2, 3, 4] and len(result.steps) == 14
    assert [e.steps for e in result.epochs] == [3, 6, 9, 12]  # steps 13-14: a cut epoch
    worst = max(result.epochs, key=lambda e: e.scores["nll"])
    assert result.chosen == worst.epoch and result.chosen_scores == worst.scores
    kept = dict(seen)[worst.epoch]
    for name, p in model.named_parameters():
        assert torch.equal(p, kept[name]), name
    assert not model.training and all(p.requires_grad for p in model.parameters())
    assert result.epochs[0].loss == pytest.approx(sum(s.loss for s in result.steps[:3]) / 3)


def test_without_rank_the_last_step_is_kept():
    seen = []
    model, result = _toy_run(6, seen)
    assert result.chosen is None
    last = seen[-1][1]
    assert all(torch.equal(p, last[n]) for n, p in model.named_parameters())
    with pytest.raises(ValueError, match="no epoch was chosen"):
        _ = result.chosen_scores


def test_only_the_trained_parameters_change_and_flags_come_back():
    model = make_tiny_vit(depth=2, num_heads=2)
    model.blocks[0].norm1.weight.requires_grad_(False)  # a caller's own flag
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trained = {n: p for n, p in model.named_parameters() if n.startswith("head.")}
    images, labels = preprocess(blobs(8, 0).images), torch.arange(8) % 5
    train(
        model,
        trained,
        lambda _: (model(images), labels),
        lambda g: [None],
        TrainerConfig(steps=2, lr=0.1),
        lambda step: 0.1,
    )
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]) != name.startswith("head."), name
    assert not model.blocks[0].norm1.weight.requires_grad and model.head.weight.requires_grad


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(optimizer="adam"), "optimizer must be one of adamw, sgd"),
        (dict(steps=0), "steps must be >= 1"),
        (dict(lr=0.0), "lr > 0"),
    ],
)
def test_bad_trainer_configs_are_explained(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainerConfig(**{"steps": 1, "lr": 0.1, **kwargs})


def test_bad_runs_are_explained():
    model = make_tiny_vit(depth=1, num_heads=2)
    config, step = TrainerConfig(steps=1, lr=0.1), lambda _: None
    with pytest.raises(ValueError, match="gave no batch"):
        train(model, dict(model.named_parameters()), step, lambda g: [], config, lambda s: 0.1)
    stranger = {"w": nn.Parameter(torch.zeros(2))}
    with pytest.raises(ValueError, match="must be a parameter of the model"):
        train(model, stranger, step, lambda g: [None], config, lambda s: 0.1)


class _Stop(Exception):
    """Stands for Ctrl-C (or a killed process) at the end of an epoch."""


@pytest.mark.parametrize("rank", [None, lambda s: (s["nll"],)], ids=["last-step", "best-epoch"])
def test_an_interrupted_run_goes_on_to_the_weights_and_records_of_the_whole_run(tmp_path, rank):
    whole_seen, cut_seen = [], []
    whole, whole_result = _toy_run(14, whole_seen, rank=rank)
    resume = tmp_path / "run.resume.pt"

    def stop_after_two(epoch) -> None:
        if epoch.epoch == 2:
            raise _Stop

    with pytest.raises(_Stop):  # the toy's dropout-free model: the global draws are the data's
        _toy_run(14, [], rank=rank, resume=resume, on_epoch=stop_after_two)
    assert resume.is_file()
    cut, cut_result = _toy_run(14, cut_seen, rank=rank, resume=resume)
    assert_same_weights(cut, whole)
    assert cut_result.steps == whole_result.steps and cut_result.epochs == whole_result.epochs
    assert cut_result.chosen == whole_result.chosen and cut_result.resumed_after == 2
    assert [e for e, _ in cut_seen] == [3, 4]  # on_epoch: the new epochs only
    assert whole_result.resumed_after == 0 and cut_result.seconds > 0


def test_dropout_draws_go_on_where_they_stopped(tmp_path):
    def run(resume=None, on_epoch=None):
        torch.manual_seed(3)
        model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 3))
        x, y = torch.randn(12, 4, generator=torch.Generator().manual_seed(0)), torch.arange(12) % 3
        config = TrainerConfig(steps=9, lr=0.1, seed=2, dropout_seed=7)
        train(model, dict(model.named_parameters()), lambda i: (model(x[i]), y[i]),
              lambda g: torch.randperm(12, generator=g).split(4), config, lambda s: 0.1,
              resume=resume, on_epoch=on_epoch)  # fmt: skip
        return model

    def stop(epoch) -> None:
        raise _Stop

    with pytest.raises(_Stop):
        run(tmp_path / "r.pt", stop)
    assert_same_weights(run(tmp_path / "r.pt"), run())


def test_a_resume_file_of_another_run_or_a_broken_one_is_refused_in_one_line(tmp_path):
    resume = tmp_path / "run.resume.pt"
    with pytest.raises(_Stop):
        _toy_run(6, [], resume=resume, on_epoch=lambda e: (_ for _ in ()).throw(_Stop))
    with pytest.raises(InputError, match="holds the state of another run.*delete it"):
        _toy_run(9, [], resume=resume)  # other steps
    resume.write_bytes(resume.read_bytes()[:100])  # cut short
    with pytest.raises(InputError, match="not a readable resume file.*delete it"):
        _toy_run(6, [], resume=resume)
    assert not list(tmp_path.glob("*.tmp"))


# --- fine-tuning after pruning ------------------------------------------------------------------


def _plain_finetune(model, data, config, preprocess, seed):
    """hydra/finetune.py's loop before the trainer."""
    family = family_of(model)
    model.train()
    for name, p in model.named_parameters():
        p.requires_grad_(family.parameter_kind(model, name) in config.trainable)
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            matrix = p.ndim >= 2 and id(p) not in tables
            keep = matrix and "pos_embed" not in name and "token" not in name
            (decay if keep else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if config.optimizer == "sgd":
        optimizer = torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum)
    else:
        optimizer = torch.optim.AdamW(groups, lr=config.lr)
    trainable = [p for p in model.parameters() if p.requires_grad]
    system = callable_model(model)
    n, bs = len(data), config.batch_size
    total = config.total_steps(n)
    per_epoch = math.ceil(n / bs)
    generator = torch.Generator().manual_seed(int(seed))
    history, order = [], None
    for step in range(total):
        b = step % per_epoch
        if b == 0:
            order = torch.randperm(n, generator=generator)
        index = order[b * bs : (b + 1) * bs]
        if isinstance(data.inputs, torch.Tensor):
            inputs = data.inputs[index]
        else:
            inputs = tuple(data.inputs[i] for i in index.tolist())
        x, y = preprocess(inputs), data.labels[index]
        w = config.warmup_steps
        if step < w:
            lr = config.lr * (step + 1) / w
        else:
            progress = min(1.0, (step - w) / max(1, total - w - 1))
            floor = config.lr * config.min_lr_fraction
            lr = floor + 0.5 * (config.lr - floor) * (1 + math.cos(math.pi * progress))
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = F.cross_entropy(system(x), y, label_smoothing=config.label_smoothing)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(trainable, config.grad_clip)
        optimizer.step()
        history.append({"step": step + 1, "lr": lr, "loss": loss.item()})
    for p in model.parameters():
        p.requires_grad_(True)
    return history


@pytest.mark.parametrize(
    "config",
    [
        FinetuneConfig(n_train=40, batch_size=8, epochs=1.5, warmup_steps=3, lr=0.05),
        FinetuneConfig(
            optimizer="adamw",
            lr=0.01,
            weight_decay=0.05,
            label_smoothing=0.1,
            grad_clip=None,
            n_train=24,
            batch_size=10,
            steps=7,
            warmup_steps=1,
            trainable=("attn", "norm", "head"),
        ),
    ],
    ids=["sgd-fractional-epochs", "adamw-steps"],
)
def test_finetune_member_is_the_plain_loop(config):
    # float64: a learning rate one bit off shows in the weights
    model = make_tiny_vit(depth=3, num_heads=4, scale=1.0).double()
    keep = torch.ones(3, 4, dtype=torch.bool)
    keep[0, 1] = keep[2, 0] = keep[2, 3] = False
    data = blobs(48, 0)

    def as_double(images: torch.Tensor) -> torch.Tensor:
        return preprocess(images).double()

    member = finetune_member(model, keep, config, preprocess=as_double, train_set=data, seed=2)
    plain = prune_heads(model, keep)
    history = _plain_finetune(plain, training_subset(config, data), config, as_double, 2)
    assert_same_weights(member.model, plain.eval())
    assert member.history == history


def tiny_texts(n: int, seed: int = 0) -> tuple[TextSet, Callable]:
    """Sentences of random "words" (token ids as text) and a packing preprocess (ids, masks)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 10, (n,), generator=g)
    texts = tuple(
        " ".join(str(int(t)) for t in torch.randint(3, 60, (int(k),), generator=g)) for k in lengths
    )

    def packed(batch) -> torch.Tensor:
        ids = torch.ones(len(batch), 12, dtype=torch.long)
        mask = torch.zeros(len(batch), 12, dtype=torch.long)
        for i, text in enumerate(batch):
            tokens = [0, *map(int, text.split())]
            ids[i, : len(tokens)] = torch.tensor(tokens)
            mask[i, : len(tokens)] = 1
        return pack(ids, mask)

    return TextSet(f"tiny-{seed}", texts, torch.arange(n) % 3), packed


def test_finetune_member_of_a_text_model_is_the_plain_loop():
    """A text member trains in its callable form; its dropout is seeded by the member's seed, so
    the caller's random state does not change its weights."""
    model = make_tiny_text("bert", scale=1.0)
    keep = torch.ones(2, 4, dtype=torch.bool)
    keep[1, 2] = False
    data, packed = tiny_texts(30)
    config = FinetuneConfig(optimizer="adamw", lr=0.01, n_train=20, batch_size=8, steps=4)
    torch.manual_seed(7)
    member = finetune_member(model, keep, config, preprocess=packed, train_set=data, seed=3)
    torch.manual_seed(11)  # another random state before the call: the same weights
    again = finetune_member(model, keep, config, preprocess=packed, train_set=data, seed=3)
    assert_same_weights(member.model, again.model)
    plain = prune_heads(model, keep)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)  # dropout
        history = _plain_finetune(plain, training_subset(config, data), config, packed, 3)
    assert_same_weights(member.model, plain.eval())
    assert member.history == history


# --- a text model's top on cached states --------------------------------------------------------


def _plain_top(model, batches, config, frozen, seed, validation):
    """training/top.py's loop before the trainer."""
    trained = trained_parameters(model, frozen)
    for p in model.parameters():
        p.requires_grad_(False)
    decay, no_decay = [], []
    for p in trained.values():
        p.requires_grad_(True)
        (decay if p.ndim >= 2 else no_decay).append(p)
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.lr,
    )
    total = config.steps or config.epochs * len(batches)
    warmup = max(1, round(config.warmup * total))
    generator = torch.Generator().manual_seed(seed)
    history, best, order = [], None, []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.train()
        for step in range(total):
            if not order:
                order = torch.randperm(len(batches), generator=generator).tolist()
            batch = batches[order.pop()]
            lr = config.lr * (
                (step + 1) / warmup if step < warmup else (total - step) / max(1, total - warmup)
            )
            for group in optimizer.param_groups:
                group["lr"] = lr
            logits = top_logits(model, frozen, batch.states, batch.context)
            loss = F.cross_entropy(logits, batch.labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.grad_clip is not None:
                nn.utils.clip_grad_norm_(list(trained.values()), config.grad_clip)
            optimizer.step()
            history.append({"step": step + 1, "lr": lr, "loss": round(loss.item(), 5)})
            epoch_end = config.steps is None and (step + 1) % len(batches) == 0
            if epoch_end and validation and config.epochs > 1:
                nll, accuracy = state_nll(model, frozen, validation)
                history[-1].update(val_nll=round(nll, 5), val_accuracy=accuracy)
                if best is None or nll < best[0]:
                    state = {k: p.detach().clone() for k, p in trained.items()}
                    best = (nll, (step + 1) // len(batches), state)
                model.train()
    if best is not None:
        with torch.no_grad():
            for name, p in trained.items():
                p.copy_(best[2][name])
        history.append({"chosen_epoch": best[1], "val_nll": round(best[0], 5)})
    model.eval()
    for p in model.parameters():
        p.requires_grad_(True)
    return history


@pytest.mark.parametrize(
    "config",
    [
        TopFinetuneConfig(trained_layers=1, epochs=3, batch_size=8, lr=0.01, warmup=0.5),
        TopFinetuneConfig(
            trained_layers=2, steps=7, batch_size=8, lr=0.01, warmup=0.45, grad_clip=None
        ),
        TopFinetuneConfig(trained_layers=0, epochs=2, batch_size=8, lr=0.01, warmup=0.4),
    ],
    ids=["epochs-chosen", "steps-across-epochs", "head-only"],
)
def test_train_top_is_the_plain_loop(config):
    source = TextClassifier(make_tiny_text("bert", scale=1.0))
    data, packed = tiny_texts(28)
    val, _ = tiny_texts(12, seed=1)
    frozen = 2 - config.trained_layers
    runs = []
    for _ in range(2):
        model = copy.deepcopy(source)
        batches = state_batches(model, packed, data, frozen, config.batch_size, torch.device("cpu"))
        validation = state_batches(model, packed, val, frozen, 256, torch.device("cpu"))
        runs.append((model, batches, validation))
    (ours, batches, validation), (plain, plain_batches, plain_validation) = runs
    history = train_top(ours, batches, config, frozen, 3, validation, None)
    expected = _plain_top(plain, plain_batches, config, frozen, 3, plain_validation)
    assert_same_weights(ours, plain)
    assert history == expected
    assert ("chosen_epoch" in history[-1]) == (config.steps is None)


# --- train-text's epochs ------------------------------------------------------------------------


def _plain_text_epochs(model, prefixes, cfg, n_train, epoch_batches, batch_loss, validate):
    """minilm.py's optimiser and train_epochs before the trainer."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        trained = name.startswith(tuple(prefixes))
        p.requires_grad_(trained)
        if trained:
            (decay if p.ndim >= 2 else no_decay).append(p)
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=cfg.lr,
    )
    generator = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    steps_per_epoch = math.ceil(n_train / cfg.batch_size)
    total = cfg.epochs * steps_per_epoch
    warmup = max(1, round(cfg.warmup * total))
    history, best, step = [], None, 0
    for epoch in range(1, cfg.epochs + 1):
        model.train()
        running = 0.0
        for index in epoch_batches(generator):
            loss = batch_loss(index)
            lr = (
                cfg.lr * (step + 1) / warmup
                if step < warmup
                else cfg.lr * max(0.0, (total - step) / max(1, total - warmup))
            )
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            running += loss.item()
            step += 1
        model.eval()
        val = validate()
        history.append(
            {
                "epoch": epoch,
                "train_loss": round(running / steps_per_epoch, 4),
                "val_accuracy": val["accuracy"],
                "val_nll": round(val["nll"], 4),
            }
        )
        if best is None or (-val["nll"], val["accuracy"]) > (-best[0]["nll"], best[0]["accuracy"]):
            best = (val, epoch, {k: v.clone() for k, v in model.state_dict().items()})
    val, chosen, state = best
    model.load_state_dict(state)
    model.eval()
    return history, val, chosen


def test_train_text_epochs_are_the_plain_loop():
    """Top blocks and head of a tiny ViT with dropout, the recipe train-text runs for every
    base: same weights, history and chosen epoch."""
    cfg = TextTrainConfig(seed=4, epochs=3, batch_size=8, lr=0.01, warmup=0.25)  # 3 steps
    data, val = blobs(30, 0), blobs(16, 1)
    prefixes = ("blocks.1.", "norm.", "head.")

    def run(train_fn):
        # float64: a learning rate one bit off shows in the weights
        model = make_tiny_vit(depth=2, num_heads=2, scale=1.0, drop_rate=0.2, proj_drop_rate=0.1)
        model = model.double()

        def scores() -> dict:
            with torch.no_grad():
                logits = model(preprocess(val.images).double())
            return {
                "nll": float(F.cross_entropy(logits, val.labels)),
                "accuracy": float((logits.argmax(-1) == val.labels).float().mean()),
            }

        def logits_and_labels(index):
            return model(preprocess(data.images[index]).double()), data.labels[index]

        batches = lambda g: torch.randperm(30, generator=g).split(cfg.batch_size)  # noqa: E731
        return model, train_fn(model, batches, logits_and_labels, scores)

    ours, (history, val_scores, chosen) = run(
        lambda model, batches, step, scores: train_epochs(
            model, prefixes, cfg, 30, batches, step, scores, started=0.0, log=lambda line: None
        )
    )
    plain, expected = run(
        lambda model, batches, step, scores: _plain_text_epochs(
            model,
            prefixes,
            cfg,
            30,
            batches,
            lambda index: F.cross_entropy(*step(index)),
            scores,
        )
    )
    assert_same_weights(ours, plain)
    assert (history, val_scores, chosen) == expected


# --- the default ViT ----------------------------------------------------------------------------


def _plain_train_vit(cfg, arch, fashion_mnist):
    """default.py's train_vit before the trainer (weights and per-epoch history)."""
    from hydra_core.zoo.default import accuracy_on, build_vit
    from hydra_core.zoo.default import preprocess as vit_preprocess

    train_set, val = fashion_mnist("train"), fashion_mnist("validation")
    torch.manual_seed(cfg.seed)
    model = build_vit(arch)
    rule = [
        p.ndim >= 2 and "pos_embed" not in n and "cls_token" not in n
        for n, p in model.named_parameters()
    ]
    params = [p for _, p in model.named_parameters()]
    optimizer = torch.optim.AdamW(
        [
            {
                "params": [p for p, d in zip(params, rule, strict=True) if d],
                "weight_decay": cfg.weight_decay,
            },
            {
                "params": [p for p, d in zip(params, rule, strict=True) if not d],
                "weight_decay": 0.0,
            },
        ],
        lr=cfg.lr,
    )
    steps_per_epoch = math.ceil(len(train_set) / cfg.batch_size)
    total = cfg.epochs * steps_per_epoch
    warmup = int(cfg.warmup_epochs * steps_per_epoch)
    generator = torch.Generator().manual_seed(cfg.seed)
    history, step = [], 0
    for epoch in range(cfg.epochs):
        model.train()
        order = torch.randperm(len(train_set), generator=generator)
        running = 0.0
        for b in range(steps_per_epoch):
            index = order[b * cfg.batch_size : (b + 1) * cfg.batch_size]
            x = vit_preprocess(train_set.images[index])
            n, p = len(x), cfg.pad_crop
            if p:
                padded = F.pad(x, (p, p, p, p))
                dy = torch.randint(0, 2 * p + 1, (n,), generator=generator)
                dx = torch.randint(0, 2 * p + 1, (n,), generator=generator)
                x = torch.stack(
                    [padded[i, :, dy[i] : dy[i] + 28, dx[i] : dx[i] + 28] for i in range(n)]
                )
            if cfg.hflip:
                flip = torch.rand(n, generator=generator) < 0.5
                x = torch.where(flip[:, None, None, None], x.flip(-1), x)
            loss = F.cross_entropy(model(x), train_set.labels[index])
            if step < warmup:
                lr = cfg.lr * (step + 1) / warmup
            else:
                lr = (
                    0.5
                    * cfg.lr
                    * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
                )
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            running += loss.item()
            step += 1
        val_acc = accuracy_on(model, val.images, val.labels)
        history.append(
            {"epoch": epoch + 1, "loss": running / steps_per_epoch, "val_accuracy": val_acc}
        )
    return model.eval(), history


def fashion_mnist(split: str) -> ImageSet:
    """A learnable stand-in for Fashion-MNIST (train_vit reads it itself): a few 28x28 blobs."""
    n = {"train": 40, "validation": 16, "test": 16}[split]
    data = blobs(n, len(split), size=28, classes=10)
    return ImageSet("fashion_mnist", data.images, data.labels, "id")


@pytest.mark.parametrize("pad_crop", [0, 2], ids=["shipped-recipe", "crop"])
def test_train_vit_is_the_plain_loop(pad_crop, monkeypatch):
    monkeypatch.setattr("hydra_core.data.fashion_mnist.load_fashion_mnist", fashion_mnist)
    cfg = TrainConfig(seed=5, epochs=2, batch_size=16, warmup_epochs=1.0, pad_crop=pad_crop)
    model, summary = train_vit(cfg, TINY, log=lambda line: None)
    plain, history = _plain_train_vit(cfg, TINY, fashion_mnist)
    assert_same_weights(model, plain)
    assert summary["history"] == history


def test_train_vit_resumed_after_an_epoch_is_the_whole_run(tmp_path, monkeypatch):
    monkeypatch.setattr("hydra_core.data.fashion_mnist.load_fashion_mnist", fashion_mnist)
    cfg = TrainConfig(seed=5, epochs=3, batch_size=16, warmup_epochs=1.0)
    resume, lines = tmp_path / "vit.resume.pt", []

    def stop_at_epoch_2(line: str) -> None:
        lines.append(line)
        if line.startswith("epoch 2/3"):
            raise _Stop

    with pytest.raises(_Stop):
        train_vit(cfg, TINY, log=stop_at_epoch_2, resume=resume)
    model, summary = train_vit(cfg, TINY, log=lines.append, resume=resume)
    whole, whole_summary = train_vit(cfg, TINY, log=lambda line: None)
    assert_same_weights(model, whole)
    assert summary["history"] == whole_summary["history"] and len(summary["history"]) == 3
    assert any(line.startswith("going on from the interrupted run") for line in lines)
