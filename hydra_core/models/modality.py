"""What a model's inputs are (images or text), and the data that follows from it.

A :class:`Modality` is reached from a model's family (``family_of(model).modality``, or
``loaded.modality`` of a :class:`~hydra_core.zoo.registry.LoadedModel`): its default
in-distribution set, its named OOD sets and their default roles, what its items are called, and
one benchmark builder (:meth:`Modality.benchmark`) that the command line, the app and the tests
share. Code above :mod:`hydra_core.models` asks the modality instead of comparing names.

There are two: :data:`IMAGE_MODALITY` (uint8 images; Fashion-MNIST, image folders of your own)
and :data:`TEXT_MODALITY` (strings; Rotten Tomatoes, CSV/JSONL files of your own). A modality's
``name`` ("image", "text") is the word in messages and the string saved files hold; a modality
compares equal to its name, so that code and files still holding the string keep working.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hydra_core.data.benchmark import (
    FASHION_MNIST,
    ROTTEN_TOMATOES,
    Benchmark,
    folder_benchmark,
    own_sources,
    parse_ood_folder,
    text_file_benchmark,
)
from hydra_core.data.fashion_mnist import load_fashion_mnist
from hydra_core.data.ood import OOD_SETS, REPORT_OOD, SEARCH_OOD, OODSource
from hydra_core.data.surface import (
    IMAGE_FEATURES,
    TEXT_FEATURES,
    image_surface_features,
    text_surface_features,
)
from hydra_core.data.synthetic import IMAGE_SYNTHETIC, TEXT_SYNTHETIC
from hydra_core.data.text import (
    TEXT_OOD,
    TEXT_REPORT_OOD,
    TEXT_SEARCH_OOD,
    DataSet,
    load_rotten_tomatoes,
)
from hydra_core.errors import InputError


@dataclass(frozen=True, eq=False, repr=False)
class Modality:
    """The kind of input a model takes, and its data.

    Args:
        name: ``"image"`` or ``"text"``: the word in messages and in saved files.
        noun: what the items of its data are called, plural (``"images"``, ``"sentences"``).
        default_id: the embedded in-distribution set, as messages name it.
        id_name: the embedded in-distribution set's name in tables (no OOD set may take it).
        load_id: split (``"train"``, ``"validation"``, ``"test"``) -> that split of the
            embedded in-distribution set (validation selects heads, test is reported on).
        ood_sets: the named OOD sets of this modality (group, default role, description).
        report_ood: the named OOD sets reported on by default.
        search_ood: the named OOD sets that select heads by default.
        takes_files: data of your own comes as CSV/JSONL files of texts rather than as image
            folders.
        follows_model_classes: the labels of your own ID data are matched to the model's class
            names when no class order is given (a file's label names); image folders are
            numbered in sorted order instead, as torchvision's ImageFolder.
        shows_as_text: an item can be shown as it is, in a table or a hover label (a sentence).
        deep_ensemble: how the paper's baseline ensemble is built for this modality's models:
            ``"copies"`` (Deep Ensembles: independently trained full models, Table 1;
            ``train-ensemble``) or ``"shared-backbone"`` (Deep Ensembles (D): one backbone, a
            head per seed, Table 2).
        results_folder: where the committed results of this modality's default model lie below
            ``docs/report`` (``""``: there itself; the sweeps in ``sweeps/`` below it).
        synthetic_ood: the synthetic OOD sets the ``"synthetic"`` protocol makes from the ID
            search items (:mod:`hydra_core.data.synthetic`): image or text transforms.
        builder: the data module's builder behind :meth:`benchmark`, which calls it with its own
            arguments (:func:`~hydra_core.data.benchmark.folder_benchmark` or
            :func:`~hydra_core.data.benchmark.text_file_benchmark`, adapted).
        surface_features: (a set, the model's preprocess or None) -> (N, F) surface features
            of its items as the model sees them, what a shortcut classifier sees
            (:mod:`hydra_core.data.surface`; :mod:`hydra_core.analysis.shortcut`).
        surface_feature_names: the F features' names.
        batch_ensemble_blocks: how many top blocks BatchEnsemble converts, with the layers
            after the blocks (the head): None converts every linear layer (a ViT trained here
            from scratch, Wen et al.'s whole network); a number keeps the blocks below as they
            are, frozen, as fine-tuning a pre-trained encoder's top does (Uncertainty
            Baselines' ``be_layers``; :mod:`hydra_core.baselines.batch_ensemble`).
    """

    name: str
    noun: str
    default_id: str
    id_name: str
    load_id: Callable[[str], DataSet]
    ood_sets: Mapping[str, OODSource]
    report_ood: tuple[str, ...]
    search_ood: tuple[str, ...]
    takes_files: bool
    follows_model_classes: bool
    shows_as_text: bool
    deep_ensemble: str
    results_folder: str
    builder: Callable[..., Benchmark]
    surface_features: Callable[[DataSet, object], np.ndarray]
    surface_feature_names: tuple[str, ...]
    synthetic_ood: tuple[str, ...] = ()
    batch_ensemble_blocks: int | None = None

    def benchmark(
        self,
        *,
        id_source: str | None = None,
        ood: Sequence[str] | None = None,
        search_ood: Sequence[str] | None = None,
        ood_sources: Sequence[str] = (),
        protocol: str = "dedicated",
        n_search: int | None = 512,
        n_report: int | None = None,
        classes: Sequence[str] | None = None,
        model_classes: Sequence[str] | None = None,
        image_format: tuple[int, int] | None = None,
    ) -> Benchmark:
        """The search/report benchmark of this modality's data (see
        :mod:`hydra_core.data.benchmark`): the embedded sets mixed with data of your own.

        Args:
            id_source: in-distribution data of your own, split once into disjoint search and
                report halves: an image folder (one sub-folder per class) or a CSV/JSONL file
                of texts with a ``label``; None for :attr:`default_id`.
            ood: named OOD sets to report on (:attr:`ood_sets`); None for :attr:`report_ood`,
                or none of them when ``ood_sources`` holds a set to report on.
            search_ood: named OOD sets to select heads on; None for :attr:`search_ood`, or only
                the ``search:`` sources when there are some. Must stay None under ``"halves"``.
            ood_sources: OOD data of your own (folders or files): ``"near: path"`` or
                ``"far: path"`` (a bare path is far) to report on, ``"search: path"`` to select
                heads on.
            protocol: one of :data:`~hydra_core.data.benchmark.PROTOCOLS`.
            n_search: items per search part (ID and each search set); all when None.
            n_report: items per report part (ID and each report set); all when None.
            classes: the model's classes in output order, to label ``id_source`` by class name.
            model_classes: the model's own class names
                (:attr:`~hydra_core.zoo.registry.LoadedModel.classes`): when
                :attr:`follows_model_classes`, the label names of ``id_source`` are matched to
                them (any case) unless ``classes`` gives another order.
            image_format: (channels, size) of the model's input
                (:attr:`~hydra_core.zoo.registry.LoadedModel.image_format`): image parts are
                brought to it when folders are involved; None keeps 1 x 28. None for text.
        """
        if ood is None:
            reported = any(parse_ood_folder(entry)[0] == "report" for entry in ood_sources)
            ood = () if reported else self.report_ood
        return self.builder(
            id_source=id_source,
            ood=ood,
            search_ood=search_ood,
            ood_sources=ood_sources,
            protocol=protocol,
            n_search=n_search,
            n_report=n_report,
            classes=classes,
            model_classes=model_classes if self.follows_model_classes else None,
            image_format=image_format,
            synthetic=self.synthetic_ood or None,
        )

    def check_choice(
        self,
        ood: Sequence[str],
        search_ood: Sequence[str] | None,
        ood_sources: Sequence[str] = (),
        protocol: str = "dedicated",
        *,
        id_source: str | None = None,
    ) -> None:
        """Refuse data choices that make no benchmark, before anything is loaded (InputError):
        the OOD sets' roles (:func:`~hydra_core.data.benchmark.check_ood_choice` with this
        modality's search sets), and the data of your own (``id_source``, ``ood_sources``):
        every path there and of this modality's kind (a folder of images, a CSV/JSONL file), no
        two sets of one name (:func:`~hydra_core.data.benchmark.own_sources`)."""
        own_sources(
            id_source,
            ood_sources,
            files=self.takes_files,
            default_id=self.id_name,
            ood=ood,
            search_ood=search_ood,
            protocol=protocol,
            default_search=self.search_ood,
        )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):  # the name a saved file or an older caller holds
            return other == self.name
        return self is other

    def __hash__(self) -> int:
        return hash(self.name)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Modality({self.name!r})"


def _image_benchmark(
    *, id_source, ood_sources, image_format: tuple[int, int] | None, model_classes, **options
) -> Benchmark:
    channels, size = image_format or (1, 28)
    return folder_benchmark(
        id_folder=id_source, ood_folders=ood_sources, channels=channels, size=size, **options
    )


def _text_benchmark(
    *, id_source, ood_sources, image_format: tuple[int, int] | None, model_classes, **options
) -> Benchmark:
    if image_format is not None:
        raise InputError(
            f"image_format applies to images; leave it out for a text benchmark (got "
            f"{image_format})"
        )
    if options["classes"] is not None or id_source is None:
        model_classes = None  # an order given replaces the model's names; no file, no labels
    return text_file_benchmark(
        id_file=id_source, ood_files=ood_sources, model_classes=model_classes, **options
    )


IMAGE_MODALITY = Modality(
    name="image",
    noun="images",
    default_id="Fashion-MNIST",
    id_name=FASHION_MNIST,
    load_id=load_fashion_mnist,
    ood_sets=OOD_SETS,
    report_ood=REPORT_OOD,
    search_ood=SEARCH_OOD,
    takes_files=False,
    follows_model_classes=False,
    shows_as_text=False,
    deep_ensemble="copies",
    results_folder="",
    builder=_image_benchmark,
    surface_features=image_surface_features,
    surface_feature_names=IMAGE_FEATURES,
    synthetic_ood=IMAGE_SYNTHETIC,
)
TEXT_MODALITY = Modality(
    name="text",
    noun="sentences",
    default_id="Rotten Tomatoes",
    id_name=ROTTEN_TOMATOES,
    load_id=load_rotten_tomatoes,
    ood_sets=TEXT_OOD,
    report_ood=TEXT_REPORT_OOD,
    search_ood=TEXT_SEARCH_OOD,
    takes_files=True,
    follows_model_classes=True,
    shows_as_text=True,
    deep_ensemble="shared-backbone",
    results_folder="text",
    builder=_text_benchmark,
    surface_features=text_surface_features,
    surface_feature_names=TEXT_FEATURES,
    synthetic_ood=TEXT_SYNTHETIC,
    # the top two encoder layers and the head: what the text recipes fine-tune (train-text, the
    # fast recipe), the part Deep Ensembles (D) does not share (docs/baselines.md)
    batch_ensemble_blocks=2,
)
#: every modality, by name
MODALITIES = {m.name: m for m in (IMAGE_MODALITY, TEXT_MODALITY)}


def modality_named(name: str) -> Modality:
    """The modality a saved name (``"image"``, ``"text"``) stands for."""
    if name not in MODALITIES:
        raise ValueError(f"unknown modality {name!r}; expected one of {', '.join(MODALITIES)}")
    return MODALITIES[name]
