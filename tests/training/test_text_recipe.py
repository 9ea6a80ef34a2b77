"""The named text fine-tuning recipes (issue 34, item 6): ``fast`` and ``paper`` (D.2: every
layer, AdamW at lr 1e-5, 10% linear warm-up then linear decay, clipping 1.0, up to 7 epochs, early
stopping on held-out training sentences with patience 2), through the one training loop.

The schedule against Hugging Face's ``get_linear_schedule_with_warmup``, clipping against a plain
loop with ``torch.nn.utils.clip_grad_norm_``, early stopping against a scripted validation, a
resumed run against the whole run, the recipes kept apart in cache keys, and ``train-text
--max-length`` beyond the model's positions refused as a user types it (issue 38)."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from torch import nn

from hydra_core.cache import DiskCache
from hydra_core.models.text import TextClassifier
from hydra_core.training.prefix import state_batches
from hydra_core.training.schedules import warmup_linear
from hydra_core.training.top import (
    DEFAULT_TOP_RECIPE,
    TOP_RECIPES,
    TopFinetuneConfig,
    finetune_top,
    held_out_split,
    top_recipe,
    train_top,
)
from hydra_core.training.trainer import TrainerConfig, train
from hydra_core.zoo import minilm
from hydra_core.zoo.minilm import TEXT_RECIPES, TextTrainConfig, train_command
from tests.cli.test_bad_inputs import one_error_line, run
from tests.conftest import make_tiny_text, make_tiny_vit
from tests.training.test_training import (
    _plain_top,
    _Stop,
    assert_same_weights,
    blobs,
    preprocess,
    tiny_texts,
)

# --- the recipes as named -----------------------------------------------------------------------


def test_the_paper_recipes_are_d2():
    top, text = TOP_RECIPES["paper"], TEXT_RECIPES["paper"]
    for config in (top, text):
        assert (config.recipe, config.lr, config.warmup, config.grad_clip) == (
            "paper",
            1e-5,
            0.1,
            1,
        )
        assert (config.epochs, config.patience, config.choose_on) == (7, 2, "accuracy")
        assert config.n_validation == 600 and config.weight_decay == 0.01
    assert top.trained_layers is None and top.n_train is None  # every layer, every sentence
    assert text.trained_layers == 6 and text.n_train is None
    assert TOP_RECIPES["fast"] == TopFinetuneConfig() and TEXT_RECIPES["fast"] == TextTrainConfig()
    assert top_recipe("paper") is top
    short = TOP_RECIPES["paper-short"]  # the paper's, shorter: what a report affords
    assert replace(short, recipe="paper", n_train=None, epochs=7, patience=2) == top
    assert (short.n_train, short.epochs, short.patience) == (2000, 3, 1)
    from hydra_core.cli.hydra import DEFAULT_FINETUNE_RECIPE, FINETUNE_RECIPES

    assert FINETUNE_RECIPES == tuple(TOP_RECIPES)
    assert DEFAULT_FINETUNE_RECIPE == DEFAULT_TOP_RECIPE  # what --help says is the default
    with pytest.raises(ValueError, match="recipe must be one of fast, paper"):
        top_recipe("slow")
    with pytest.raises(ValueError, match="recipe must be one of"):
        TopFinetuneConfig(recipe="slow")


def test_the_fast_recipes_keep_the_cache_keys_of_the_runs_before_recipes_had_names():
    """The fields added with the recipes stay out of a ``fast`` configuration's identity (so
    earlier cache entries are found); any other value of them is part of it."""
    old_top = {
        "trained_layers": 2, "epochs": 1, "steps": None, "batch_size": 32, "lr": 3e-4,
        "weight_decay": 0.01, "warmup": 0.1, "grad_clip": 1.0, "n_train": 2000,
        "reinit_head": False,
    }  # fmt: skip
    assert TopFinetuneConfig().identity() == old_top
    old_text = {
        "seed": 0, "trained_layers": 2, "epochs": 3, "batch_size": 32, "lr": 3e-4,
        "weight_decay": 0.01, "warmup": 0.1, "max_length": 64, "n_train": None, "n_eval": None,
    }  # fmt: skip
    assert TextTrainConfig().identity() == old_text
    assert TOP_RECIPES["paper"].identity() == asdict(TOP_RECIPES["paper"])
    assert TEXT_RECIPES["paper"].identity() == asdict(TEXT_RECIPES["paper"])
    assert replace(TopFinetuneConfig(), patience=2).identity()["patience"] == 2


def test_train_command_names_the_recipe_and_what_differs_from_it():
    threads = torch.get_num_threads()
    assert train_command(TEXT_RECIPES["paper"]) == (
        f"python -m hydra_core train-text --threads {threads} --recipe paper"
    )
    assert train_command(replace(TEXT_RECIPES["paper"], epochs=3, seed=1)) == (
        f"python -m hydra_core train-text --threads {threads} --recipe paper --seed 1 --epochs 3"
    )
    assert train_command(TextTrainConfig(lr=1e-4)).endswith(f"{threads} --lr 0.0001")


# --- the schedule and clipping ------------------------------------------------------------------


def _top_run(config: TopFinetuneConfig, frozen: int, seed: int = 3):
    model = TextClassifier(make_tiny_text("bert", scale=1.0))
    data, packed = tiny_texts(28)
    val, _ = tiny_texts(12, seed=1)
    batches = state_batches(model, packed, data, frozen, config.batch_size, torch.device("cpu"))
    validation = state_batches(model, packed, val, frozen, 256, torch.device("cpu"))
    return model, batches, validation


def test_the_schedule_is_hugging_faces_linear_warm_up_and_decay():
    """Every step's learning rate: the plain formula; against ``get_linear_schedule_with_warmup``
    (whose scheduler steps after the optimiser, so its first step runs at lr 0), the warm-up is
    one step ahead and the decay the same."""
    from transformers import get_linear_schedule_with_warmup

    config = replace(TOP_RECIPES["paper"], batch_size=8, n_validation=None, patience=None)
    model, batches, validation = _top_run(config, frozen=0)
    history = train_top(model, batches, config, 0, 3, validation, None)
    lrs = [h["lr"] for h in history if "step" in h]
    total = config.epochs * len(batches)  # 7 epochs of 4 batches
    warmup = round(0.1 * total)
    assert len(lrs) == total == 28 and warmup == 3
    plain = [
        1e-5 * ((s + 1) / warmup) if s < warmup else 1e-5 * (total - s) / (total - warmup)
        for s in range(total)
    ]
    assert lrs == pytest.approx(plain, rel=1e-12, abs=0)
    optimizer = torch.optim.AdamW([nn.Parameter(torch.zeros(1))], lr=1e-5)
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup, total)
    hf = []
    for _ in range(total + 1):
        hf.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[:warmup] == pytest.approx(hf[1 : warmup + 1], rel=1e-12)
    assert lrs[warmup:] == pytest.approx(hf[warmup:total], rel=1e-12)
    assert lrs == pytest.approx([warmup_linear(1e-5, warmup, total)(s) for s in range(total)])


def test_every_layer_trained_with_clipping_is_the_plain_loop_with_clip_grad_norm():
    """The paper recipe's optimisation (every block and the head, AdamW, clipping at 1.0) equals a
    plain loop that calls ``torch.nn.utils.clip_grad_norm_``; the clipping bites (a large
    learning rate, so the gradients are large): without it the weights differ."""
    config = replace(
        TOP_RECIPES["paper"], epochs=2, batch_size=8, lr=0.05, n_validation=None, patience=None,
        choose_on="nll",
    )  # fmt: skip
    runs = [_top_run(config, frozen=0) for _ in range(3)]
    (ours, b, v), (plain, pb, pv), (unclipped, ub, uv) = runs
    history = train_top(ours, b, config, 0, 3, v, None)
    expected = _plain_top(plain, pb, config, 0, 3, pv)
    assert_same_weights(ours, plain)
    assert [h["lr"] for h in history if "step" in h] == [h["lr"] for h in expected if "step" in h]
    train_top(unclipped, ub, replace(config, grad_clip=None), 0, 3, uv, None)
    assert any(
        not torch.equal(a, b)
        for a, b in zip(ours.state_dict().values(), unclipped.state_dict().values(), strict=True)
    )
    trained = [n for n, p in ours.named_parameters() if "embeddings" not in n]
    source = _top_run(config, frozen=0)[0]
    before = dict(source.named_parameters())
    changed = {n for n, p in ours.named_parameters() if not torch.equal(p, before[n])}
    assert changed == set(trained)  # every block and the head; the embedding frozen


# --- early stopping -----------------------------------------------------------------------------


def _scripted_run(accuracies, patience, *, resume=None, on_epoch=None, seen=None):
    """A tiny ViT trained on blobs for up to 8 epochs of 3 steps, its validation accuracies
    scripted per epoch; ``seen`` gets each complete epoch's weights."""
    model = make_tiny_vit(depth=2, num_heads=2, scale=1.0)
    data = blobs(24, 0)
    parameters = dict(model.named_parameters())
    done = []

    def validate() -> dict:
        done.append(1)
        return {"accuracy": accuracies[len(done) - 1], "nll": 1.0}

    def record(epoch) -> None:
        if seen is not None:
            seen[epoch.epoch] = {k: p.detach().clone() for k, p in parameters.items()}
        if on_epoch is not None:
            on_epoch(epoch)

    result = train(
        model,
        parameters,
        lambda index: (model(preprocess(data.images[index])), data.labels[index]),
        lambda g: torch.randperm(24, generator=g).split(8),
        TrainerConfig(steps=24, lr=0.05, seed=1, patience=patience),
        warmup_linear(0.05, 2, 24),
        validate=validate,
        rank=lambda s: (-s["accuracy"], s["nll"]),
        on_epoch=record,
        resume=resume,
    )
    return model, result


def test_early_stopping_stops_after_patience_epochs_without_improvement_and_keeps_the_best():
    seen = {}
    accuracies = [0.5, 0.7, 0.6, 0.7, 0.9, 0.95, 0.96, 0.97]  # epoch 4 ties 2: no improvement
    model, result = _scripted_run(accuracies, 2, seen=seen)
    assert [e.epoch for e in result.epochs] == [1, 2, 3, 4] and len(result.steps) == 12
    assert result.stopped_early and result.chosen == 2
    assert result.chosen_scores == {"accuracy": 0.7, "nll": 1.0}
    for name, p in model.named_parameters():
        assert torch.equal(p, seen[2][name]), name
    assert not torch.equal(seen[2]["head.weight"], seen[4]["head.weight"])
    # patience 3 reaches epoch 5's improvement and runs to the end
    _, longer = _scripted_run(accuracies, 3)
    assert len(longer.epochs) == 8 and not longer.stopped_early and longer.chosen == 8
    # no patience: every epoch
    _, whole = _scripted_run(accuracies, None)
    assert len(whole.epochs) == 8 and not whole.stopped_early
    with pytest.raises(ValueError, match="patience must be >= 1"):
        TrainerConfig(steps=1, lr=0.1, patience=0)


@pytest.mark.parametrize("cut_after", [2, 4], ids=["mid-run", "at-the-stopping-epoch"])
def test_a_resumed_early_stopped_run_is_the_whole_run(tmp_path, cut_after):
    accuracies = [0.5, 0.7, 0.6, 0.7, 0.9, 0.95, 0.96, 0.97]
    whole, whole_result = _scripted_run(accuracies, 2)
    resume = tmp_path / "run.resume.pt"

    def stop(epoch) -> None:
        if epoch.epoch == cut_after:
            raise _Stop

    with pytest.raises(_Stop):
        _scripted_run(accuracies, 2, resume=resume, on_epoch=stop)
    cut, cut_result = _scripted_run(accuracies[cut_after:], 2, resume=resume)
    assert_same_weights(cut, whole)
    assert cut_result.steps == whole_result.steps and cut_result.epochs == whole_result.epochs
    assert cut_result.chosen == whole_result.chosen == 2
    assert cut_result.stopped_early and cut_result.resumed_after == cut_after


def test_a_resume_file_of_another_patience_is_refused(tmp_path):
    from hydra_core.errors import InputError

    resume = tmp_path / "run.resume.pt"
    with pytest.raises(_Stop):
        _scripted_run([0.5] * 8, 3, resume=resume, on_epoch=lambda e: (_ for _ in ()).throw(_Stop))
    with pytest.raises(InputError, match="holds the state of another run"):
        _scripted_run([0.5] * 8, 2, resume=resume)


# --- the paper recipe through finetune_top ------------------------------------------------------


def test_the_held_out_validation_sentences_are_training_sentences_never_trained_on():
    data, _ = tiny_texts(40)
    config = replace(TOP_RECIPES["paper"], n_validation=10, n_train=25)
    trained, held = held_out_split(data, config)
    assert len(held) == 10 and len(trained) == 25
    assert not set(trained.texts) & set(held.texts) and set(held.texts) <= set(data.texts)
    again, held_again = held_out_split(data, replace(config, n_train=None))
    assert held_again.texts == held.texts and len(again) == 30  # the same hold-out, any n_train
    with pytest.raises(ValueError, match="leaves no training sentence"):
        held_out_split(data, replace(config, n_validation=40))


def test_finetune_top_with_the_paper_recipe_stops_early_and_keeps_recipes_apart(tmp_path):
    data, packed = tiny_texts(48)
    source = TextClassifier(make_tiny_text("bert", scale=1.0))
    keep = torch.ones(2, 4, dtype=torch.bool)
    keep[0, 1] = False
    paper = replace(TOP_RECIPES["paper"], n_validation=12, batch_size=8, lr=0.02, patience=1)
    cache = DiskCache(tmp_path / "cache")
    options = dict(preprocess=packed, keep=keep, cache=cache, seed=0)
    tuned = finetune_top(source, data, paper, **options)
    steps = [h for h in tuned.history if "step" in h]
    ends = [h for h in steps if "val_accuracy" in h]
    chosen = tuned.history[-1]
    assert len(steps) % 5 == 0 and len(ends) == len(steps) // 5  # 36 sentences: 5 batches
    best = max(ends, key=lambda h: (h["val_accuracy"], -h["val_nll"]))
    assert chosen["chosen_epoch"] == ends.index(best) + 1
    assert chosen["val_accuracy"] == best["val_accuracy"]
    if len(ends) < 7:
        assert chosen["stopped_early"] and len(ends) == chosen["chosen_epoch"] + 1
    fast = replace(TOP_RECIPES["fast"], n_train=36, batch_size=8)
    finetune_top(source, data, fast, **options)
    assert len(list((tmp_path / "cache").rglob("*.pt"))) == 2  # two entries, one per recipe
    again = finetune_top(source, data, paper, **options)
    assert again.cached and again.history == tuned.history
    assert_same_weights(again.model, tuned.model)
    with pytest.raises(ValueError, match="pass no validation_set"):
        finetune_top(source, data, paper, validation_set=data, **options)


# --- train-text: the recipe option and --max-length (issue 38) ----------------------------------


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p): "/" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize("length", ["513", "600"])
def test_train_text_max_length_beyond_the_models_positions_is_refused(
    tmp_path, monkeypatch, capsys, length
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    before = snapshot(tmp_path)
    code, err = run(capsys, "train-text", "--max-length", length)
    assert code == 2
    line = one_error_line(err)
    assert f"--max-length {length}" in line and "512" in line
    assert "pass --max-length 512 or less" in line
    assert snapshot(tmp_path) == before


def test_the_refusal_knows_the_wheels_number_of_positions():
    assert minilm.model_positions() == 512
    minilm.check_max_length(512)  # the limit itself is fine
    with pytest.raises(Exception, match="more tokens than minilm's model has positions"):
        minilm.check_max_length(513)


def test_train_text_recipe_applies_to_minilm_only(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, err = run(capsys, "train-text", "--base", "mpnet", "--recipe", "paper")
    assert code == 2 and "--recipe applies to --base minilm" in one_error_line(err)
    code, err = run(capsys, "train-text", "--base", "mpnet", "--n-validation", "100")
    assert code == 2 and "--n-validation applies to --base minilm" in one_error_line(err)
    assert not list(tmp_path.iterdir())


def test_held_out_training_sentences_for_train_text():
    data, _ = tiny_texts(40)
    trained, held = minilm.held_out_training(data, 8)
    assert len(held) == 8 and len(trained) == 32 and not set(trained.texts) & set(held.texts)
    assert minilm.held_out_training(data, None) == (data, None)
    with pytest.raises(Exception, match="--n-validation 39 must leave training sentences"):
        minilm.held_out_training(data, 39)


# --- the text report ----------------------------------------------------------------------------


def test_the_text_report_takes_a_named_recipe_and_its_quick_version():
    from hydra_core.report.text_config import FINETUNE, TextReportConfig, text_config_from_args
    from hydra_core.training.top import DEFAULT_TOP_RECIPE, quick_version

    assert FINETUNE == TOP_RECIPES[DEFAULT_TOP_RECIPE] and TextReportConfig().finetune == FINETUNE
    assert text_config_from_args(False, "paper").finetune == TOP_RECIPES["paper"]
    assert text_config_from_args(False).finetune == FINETUNE
    quick = text_config_from_args(True, "paper").finetune
    assert quick == quick_version(TOP_RECIPES["paper"]) and quick.recipe == "paper"
    assert (quick.steps, quick.n_train, quick.n_validation, quick.patience) == (1, 32, None, None)
    assert DEFAULT_TOP_RECIPE == "paper-short"  # what two cores afford (docs/text.md)
    assert text_config_from_args(True, "fast").finetune == replace(
        TopFinetuneConfig(), steps=1, n_train=32, batch_size=16
    )  # the quick fast recipe as before


@pytest.mark.parametrize(
    "argv",
    [
        ("report", "--quick", "--finetune-recipe", "paper"),  # the image report
        ("report", "--quick", "--task", "zero-shot", "--finetune-recipe", "fast"),
        ("report", "--quick", "--task", "text", "--no-finetune", "--finetune-recipe", "paper"),
    ],
    ids=["image-report", "zero-shot-report", "no-finetune"],
)
def test_finetune_recipe_outside_the_text_reports_fine_tuning_is_refused(
    tmp_path, monkeypatch, capsys, argv
):
    monkeypatch.chdir(tmp_path)
    code, err = run(capsys, *argv, "--out", str(tmp_path / "out"))
    assert code == 2 and "--finetune-recipe applies to the text report" in one_error_line(err)
    assert not list(tmp_path.iterdir())


def test_mpnet_max_length_beyond_its_positions_is_refused(tmp_path, monkeypatch, capsys):
    from hydra_core.errors import InputError
    from hydra_core.zoo import mpnet

    try:
        positions = mpnet.model_positions()
    except InputError as exc:  # the mpnet wheels are not installed
        pytest.skip(str(exc))
    assert positions == 512  # 514 position embeddings, ids from the padding index + 1 (2) on
    monkeypatch.chdir(tmp_path)
    code, err = run(capsys, "train-text", "--base", "mpnet", "--max-length", "513")
    line = one_error_line(err)
    assert code == 2 and "mpnet's model has positions (512): pass --max-length 512" in line
    assert not list(tmp_path.iterdir())
