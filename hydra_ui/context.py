"""What every page shares: the Setup choices, the loaded model and data, and derived results.

Everything lives in ``st.session_state``. Results computed by a page are stored with the key of the
setup they were computed under (:func:`results`), so changing the model or the data makes them
disappear instead of showing numbers that belong to another model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import streamlit as st
import torch

from hydra_core.cache import DiskCache, cache_key
from hydra_core.data.benchmark import DEFAULT_PROTOCOL, NAMED_SEARCH, Benchmark
from hydra_core.evaluate import resolve_device
from hydra_core.hydra.source import load_model  # fused Hydra files registered as a source
from hydra_core.models.modality import Modality, modality_named
from hydra_core.models.zero_shot import folder_classes
from hydra_core.zoo.named import named_model
from hydra_core.zoo.registry import LoadedModel, parse_arch_kwargs
from hydra_core.zoo.sources import is_zero_shot

#: each protocol in a few words, for choosers
PROTOCOL_LABELS = {
    "dedicated": "dedicated search sets",
    "halves": "halves of the report sets (leaks: the search sees the reported sets)",
    "synthetic": "synthetic OOD from the ID search items",
    "far-to-near": "far sets search, near sets report",
    "near-to-far": "near sets search, far sets report",
}
CONFIG_KEY = "setup_config"
RESULTS_KEY = "results"


@dataclass(frozen=True)
class SetupConfig:
    """The Setup page's choices; every analysis depends on all of them. The data choices are
    those of the model's modality (:mod:`hydra_core.models.modality`): images or texts."""

    model: str = "default"  # "default", "dinov2-s", "minilm-sentiment", "mpnet-sentiment", a timm
    # or HF name, a path, or "openclip:..." (a zero-shot classifier of the ID set's classes)
    arch: str | None = None  # timm architecture of a checkpoint without its configuration
    arch_kwargs: str = ""  # JSON keyword arguments for timm.create_model beside arch
    dinov2_img_size: int = 56  # 4x4 patches: the accuracy of 112 px at a quarter of the cost
    ood: tuple[str, ...] | None = None  # OOD sets reported on (None: the modality's defaults)
    search_ood: tuple[str, ...] | None = None  # OOD sets that select heads (None: the defaults)
    protocol: str = DEFAULT_PROTOCOL  # which data selects heads (docs/search-protocols.md)
    # ID data of your own instead of the modality's (Fashion-MNIST, Rotten Tomatoes): an
    # ImageFolder for an image model, a CSV/JSONL of text,label for a text model
    id_source: str | None = None
    ood_sources: tuple[str, ...] = ()  # extra OOD folders (files), "near:" / "far:" / "search:"
    classes: tuple[str, ...] | None = None  # the model's classes in order, for the ID source
    n_search: int = 512  # images (texts) per set used to select heads
    n_report: int | None = 2000  # images (texts) per set results are reported on (None = all)
    # An OpenCLIP model's prompt templates: a set ("paper", "openai", "simple") or templates
    prompts: tuple[str, ...] = ("paper",)
    # An OpenCLIP model's pruned heads: "both" towers' (the paper's D.3) or the "image" tower's
    towers: str = "both"
    device: str = "auto"
    precision: str = "fp32"  # "bf16" only on CUDA

    @property
    def key(self) -> str:
        return cache_key("setup", asdict(self))

    def report_sets(self, modality: Modality) -> tuple[str, ...]:
        """The named OOD sets reported on: the chosen ones, else the modality's defaults."""
        return modality.report_ood if self.ood is None else self.ood

    def search_sets(self, modality: Modality) -> tuple[str, ...] | None:
        """The named OOD sets the benchmark selects heads on (the chosen ones, else the
        modality's defaults); None under "halves" and "synthetic", whose search uses halves of
        the report sets or sets made from the ID search items instead."""
        if self.protocol not in NAMED_SEARCH:
            return None
        return modality.search_ood if self.search_ood is None else self.search_ood

    def replace(self, **changes) -> SetupConfig:
        return replace(self, **changes)


@dataclass
class Context:
    config: SetupConfig
    loaded: LoadedModel
    benchmark: Benchmark
    device: torch.device

    @property
    def bf16(self) -> bool:
        return self.config.precision == "bf16"

    @property
    def noun(self) -> str:
        """What the pages call the items of this model's data: "images" or "sentences"."""
        return self.loaded.modality.noun


def get_config() -> SetupConfig:
    if CONFIG_KEY not in st.session_state:
        st.session_state[CONFIG_KEY] = SetupConfig()
    return st.session_state[CONFIG_KEY]


def set_config(config: SetupConfig) -> None:
    st.session_state[CONFIG_KEY] = config


@st.cache_resource(show_spinner="Loading the model...")
def cached_model(
    model: str,
    arch: str | None,
    options: tuple[tuple[str, object], ...] = (),
    arch_kwargs: str = "",
    classes: tuple[str, ...] | None = None,
    prompts: tuple[str, ...] | None = None,
    towers: str | None = None,
) -> LoadedModel:
    """The model of a setup; ``options`` (name, value) for a named model's loader (its
    :attr:`~hydra_core.zoo.named.NamedModel.options`), ``classes``, ``prompts`` and ``towers``
    for an OpenCLIP model only."""
    if is_zero_shot(model):
        return load_model(model, classes=classes, templates=prompts, towers=towers)
    return load_model(model, arch=arch, arch_kwargs=parse_arch_kwargs(arch_kwargs), **dict(options))


def model_options(config: SetupConfig) -> tuple[tuple[str, object], ...]:
    """The settings a setup gives its named model's loader (none for other sources)."""
    named = named_model(config.model)
    return tuple((o.name, getattr(config, o.setting)) for o in named.options) if named else ()


def setup_model(config: SetupConfig) -> LoadedModel:
    """The model a setup names, loaded once per its arguments: an OpenCLIP model becomes a
    zero-shot classifier of the ID set's classes (the class order given, else the ID folder's
    class folders, else Fashion-MNIST's)."""
    if is_zero_shot(config.model):
        classes = config.classes or (folder_classes(config.id_source) if config.id_source else None)
        return cached_model(
            config.model,
            None,
            (),
            "",
            classes,
            tuple(config.prompts),
            config.towers,
        )
    return cached_model(config.model, config.arch, model_options(config), config.arch_kwargs)


@st.cache_resource(show_spinner="Loading the data sets...")
def cached_benchmark(modality: str, **options) -> Benchmark:
    """The benchmark the modality named ``modality`` builds from ``options`` (the keyword
    arguments of :meth:`~hydra_core.models.modality.Modality.benchmark`, all hashable), loaded
    once per them."""
    return modality_named(modality).benchmark(**options)


def setup_benchmark(config: SetupConfig, loaded: LoadedModel) -> Benchmark:
    """The data a setup names, for its model's modality (loaded once per setup)."""
    modality = loaded.modality
    return cached_benchmark(
        modality.name,
        id_source=config.id_source,
        ood=config.report_sets(modality),
        search_ood=config.search_sets(modality),
        ood_sources=config.ood_sources,
        protocol=config.protocol,
        n_search=config.n_search,
        n_report=config.n_report,
        classes=None if config.classes is None else tuple(config.classes),
        # an ID file's label names are matched to them unless the setup gives an order
        model_classes=loaded.classes,
        image_format=loaded.image_format,  # used only when image folders are involved
    )


@st.cache_resource
def disk_cache() -> DiskCache:
    return DiskCache()


def get_context() -> Context:
    """The loaded model and data for the current setup (loaded once per setup, then cached)."""
    config = get_config()
    device = resolve_device(config.device)
    loaded = setup_model(config)
    loaded.model.to(device)
    return Context(config, loaded, setup_benchmark(config, loaded), device)


def results() -> dict:
    """Results computed under the current setup (a dict pages fill); emptied when the setup changes.

    ``results()["jobs"]`` holds the pages' background jobs (:mod:`hydra_ui.jobs`), by name; a new
    setup stops them."""
    key = get_config().key
    store = st.session_state.get(RESULTS_KEY)
    if store is None or store.get("_setup") != key:
        for job in (store or {}).get("jobs", {}).values():
            job.stop()  # background work for the old setup would only compete for the CPU
        store = {"_setup": key, "jobs": {}}
        st.session_state[RESULTS_KEY] = store
    return store


def device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"cpu ({torch.get_num_threads()} threads)"
