"""Hugging Face text classifiers by hub name (online) or from a local folder.

A folder is what ``model.save_pretrained(folder)`` and ``tokenizer.save_pretrained(folder)`` write:
``config.json``, the weights (``model.safetensors`` or ``pytorch_model.bin``) and the tokenizer
files. A hub name (``textattack/bert-base-uncased-SST-2``) needs the network, or the model in the
local Hugging Face cache; offline (:mod:`hydra_core.hub`) only the cache is read, and a model that
is not there is refused at once. Either way the checkpoint must be a BERT, RoBERTa, MPNet or
DistilBERT *sequence classifier* with its trained classifier: a bare encoder (``bert-base-uncased``
itself is a masked-language model) would get a random classifier, whose outputs mean nothing, so
it is refused with what to load instead. Remote code is never run.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from hydra_core.errors import InputError
from hydra_core.hub import TEXT_OFFLINE_HINT, from_hub
from hydra_core.models.text import MAX_TOKENS, SUPPORTED, TextClassifier, TextPreprocess

#: ``model_type`` in config.json -> the classifier Hydra Lab builds for it
MODEL_TYPES = {
    "bert": "BertForSequenceClassification",
    "roberta": "RobertaForSequenceClassification",
    "mpnet": "MPNetForSequenceClassification",
    "distilbert": "DistilBertForSequenceClassification",
}
#: a name that starts with one of these (or has an owner, ``owner/name``) is a hub name, not timm's
HUB_NAME_PREFIXES = ("bert", "roberta", "distilbert", "distilroberta", "mpnet", "all-mpnet")
#: a folder holds its tokenizer in one of these (transformers' AutoTokenizer makes an empty one
#: from config.json alone, which turns every word into [UNK])
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model")
OFFLINE_HINT = TEXT_OFFLINE_HINT


@dataclass(frozen=True)
class HFText:
    """A loaded Hugging Face text classifier and what the registry needs beside it."""

    name: str
    model: TextClassifier  # eval mode
    preprocess: TextPreprocess
    description: str
    classes: tuple[str, ...] | None


def is_hub_name(name: str) -> bool:
    """Whether ``name`` reads as a Hugging Face hub name of a text model (``hf:`` prefix,
    ``owner/name``, or a BERT-family name such as ``bert-base-uncased``)."""
    return name.startswith("hf:") or "/" in name or name.lower().startswith(HUB_NAME_PREFIXES)


def is_hf_folder(path: Path) -> bool:
    """A folder with a ``config.json``: a Hugging Face model saved with ``save_pretrained``."""
    return path.is_dir() and (path / "config.json").is_file()


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _check_type(config, what: str) -> None:
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_TYPES:
        architectures = ", ".join(getattr(config, "architectures", None) or []) or "?"
        raise InputError(
            f"{what} is a {model_type or 'model of unknown type'} model ({architectures}): Hydra "
            f"Lab analyses the heads of {', '.join(SUPPORTED)}; pass one of those"
        )


def _classes(config) -> tuple[str, ...] | None:
    """The class names of ``config.id2label``, unless they are the default ``LABEL_i``."""
    labels = [str(config.id2label.get(i, "")) for i in range(config.num_labels)]
    default = [f"LABEL_{i}" for i in range(config.num_labels)]
    return None if labels == default or not all(labels) else tuple(labels)


class UntrainedClassifierWarning(UserWarning):
    """A Hugging Face checkpoint loaded without trained weights for some layers (its classifier)."""


def _load(source: str, what: str, *, local: bool) -> tuple[nn.Module, object]:
    """The classifier and tokenizer of a hub name or folder, checked."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # one line per problem from us, not the library's progress bars and loading reports
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    where = "" if local else f"; a Hugging Face hub model needs the network: {OFFLINE_HINT}"
    try:
        config = AutoConfig.from_pretrained(source, local_files_only=local)
    except Exception as exc:  # offline, unknown name, unreadable config.json
        raise InputError(f"could not load {what} ({_first_line(exc)}){where}") from exc
    _check_type(config, what)
    try:
        model, info = AutoModelForSequenceClassification.from_pretrained(
            source, config=config, local_files_only=local, output_loading_info=True
        )
    except Exception as exc:
        raise InputError(
            f"could not load the weights of {what} ({_first_line(exc)}); a folder needs "
            f"model.safetensors or pytorch_model.bin beside config.json{where}"
        ) from exc
    missing = sorted(info.get("missing_keys", ()))
    if missing:  # e.g. bert-base-uncased: a pre-trained encoder whose classifier is new
        warnings.warn(
            f"{what} has no trained weights for {', '.join(missing[:3])}"
            f"{' and more' if len(missing) > 3 else ''}: it is not a fine-tuned sequence "
            "classifier, so these start random and its accuracy is at chance; fine-tune it "
            "first or pass a *ForSequenceClassification checkpoint fine-tuned on your classes "
            "(e.g. textattack/bert-base-uncased-SST-2)",
            UntrainedClassifierWarning,
            stacklevel=2,
        )
    if type(model).__name__ not in SUPPORTED:
        expected = MODEL_TYPES[config.model_type]
        raise InputError(f"{what} loads as a {type(model).__name__}; expected {expected}")
    save_hint = "save it beside the model with tokenizer.save_pretrained(folder)"
    if local and not any((Path(source) / name).is_file() for name in TOKENIZER_FILES):
        raise InputError(f"{what} has no tokenizer ({', '.join(TOKENIZER_FILES)}); {save_hint}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local)
    except Exception as exc:
        raise InputError(
            f"could not load the tokenizer of {what} ({_first_line(exc)}); {save_hint}"
        ) from exc
    size, vocab = len(tokenizer), int(config.vocab_size)
    if size > vocab or size <= len(tokenizer.all_special_tokens):
        raise InputError(
            f"the tokenizer of {what} has {size} tokens and the model's embedding {vocab}: they "
            f"do not belong together; {save_hint}"
        )
    return model, tokenizer


#: model types whose position ids start after the padding token's (RoBERTa's scheme): their
#: usable positions are ``max_position_embeddings - pad_token_id - 1``
OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert", "mpnet")


def model_positions(config) -> int | None:
    """How many tokens the model's position embedding holds (None: no limit stated)."""
    positions = getattr(config, "max_position_embeddings", None)
    if positions is None:
        return None
    if getattr(config, "model_type", None) in OFFSET_POSITIONS:
        positions -= int(getattr(config, "pad_token_id", None) or 0) + 1
    return int(positions)


def _loaded(name: str, model: nn.Module, tokenizer, origin: str) -> HFText:
    max_length = min(MAX_TOKENS, int(getattr(tokenizer, "model_max_length", MAX_TOKENS)))
    description = f"Hugging Face {type(model).__name__} {origin}"
    positions = model_positions(model.config)
    if positions is not None and positions < max_length:
        # texts are cut to the model's positions, never past them (a raw torch size error)
        max_length = positions
        description += f"; texts cut to its {positions} positions"
    return HFText(
        name=name,
        model=TextClassifier(model.eval()),
        preprocess=TextPreprocess(tokenizer, max_length=max_length),
        description=description,
        classes=_classes(model.config),
    )


def load_hub(name: str) -> HFText:
    """A sequence classifier by hub name (``hf:`` prefix optional); needs the network unless the
    model is in the local Hugging Face cache."""
    name = name.removeprefix("hf:")
    what = f"Hugging Face model {name!r}"
    hint = f"a Hugging Face hub model needs the network: {OFFLINE_HINT}"
    model, tokenizer = from_hub(lambda: _load(name, what, local=False), what, hint)
    return _loaded(f"hf:{name}", model, tokenizer, f"{name} (hub)")


def load_folder(path: str | Path) -> HFText:
    """A sequence classifier saved with ``save_pretrained`` in ``path``, loaded without network."""
    folder = Path(path).expanduser()
    if not is_hf_folder(folder):
        raise InputError(
            f"{folder} is not a Hugging Face model folder (no config.json); save the model there "
            "with model.save_pretrained(folder) and tokenizer.save_pretrained(folder)"
        )
    model, tokenizer = _load(str(folder), f"the model in {folder}", local=True)
    return _loaded(f"folder:{folder.name}", model, tokenizer, f"from {folder}")
