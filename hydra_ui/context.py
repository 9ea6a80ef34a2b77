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
from hydra_core.data.benchmark import Benchmark, folder_benchmark, text_file_benchmark
from hydra_core.data.ood import REPORT_OOD, SEARCH_OOD
from hydra_core.data.text import TEXT_REPORT_OOD, TEXT_SEARCH_OOD
from hydra_core.evaluate import resolve_device
from hydra_core.models.preprocess import input_format
from hydra_core.models.registry import OPENCLIP_PREFIX, LoadedModel, load_model, parse_arch_kwargs
from hydra_core.models.zero_shot import folder_classes

CONFIG_KEY = "setup_config"
RESULTS_KEY = "results"
#: what the pages call one item of a model's data, by modality
NOUNS = {"image": "images", "text": "sentences"}


@dataclass(frozen=True)
class SetupConfig:
    """The Setup page's choices; every analysis depends on all of them."""

    model: str = "default"  # "default", "dinov2-s", "minilm-sentiment", "mpnet-sentiment", a timm
    # or HF name, a path, or "openclip:..." (a zero-shot classifier of the ID set's classes)
    arch: str | None = None  # timm architecture of a checkpoint without its configuration
    arch_kwargs: str = ""  # JSON keyword arguments for timm.create_model beside arch
    dinov2_img_size: int = 56  # 4x4 patches: the accuracy of 112 px at a quarter of the cost
    ood: tuple[str, ...] = REPORT_OOD  # OOD sets reported on, never used to select heads
    search_ood: tuple[str, ...] = SEARCH_OOD  # OOD sets that select heads, never reported on
    protocol: str = "dedicated"  # "halves": search on halves of the report sets (leaks them)
    id_folder: str | None = None  # an ImageFolder of your own instead of Fashion-MNIST
    ood_folders: tuple[str, ...] = ()  # extra OOD folders, "near:" / "far:" / "search:" + path
    classes: tuple[str, ...] | None = None  # the model's classes in order, for the ID folder/file
    n_search: int = 512  # images (texts) per set used to select heads
    n_report: int | None = 2000  # images (texts) per set results are reported on (None = all)
    # A text model's data, used instead of the image choices above when the model takes text:
    text_ood: tuple[str, ...] = TEXT_REPORT_OOD  # text OOD sets reported on
    text_search_ood: tuple[str, ...] = TEXT_SEARCH_OOD  # text OOD sets that select heads
    id_file: str | None = None  # a CSV/JSONL of text,label instead of Rotten Tomatoes
    ood_files: tuple[str, ...] = ()  # extra OOD CSV/JSONL files, "near:" / "far:" / "search:"
    # An OpenCLIP model's prompt templates: a set ("paper", "openai", "simple") or templates
    prompts: tuple[str, ...] = ("paper",)
    device: str = "auto"
    precision: str = "fp32"  # "bf16" only on CUDA

    @property
    def key(self) -> str:
        return cache_key("setup", asdict(self))

    @property
    def search_sets(self) -> tuple[str, ...] | None:
        """The search sets the benchmark is given: None under "halves", whose search uses halves
        of the report sets instead."""
        return None if self.protocol == "halves" else self.search_ood

    @property
    def text_search_sets(self) -> tuple[str, ...] | None:
        """:attr:`search_sets` for a text model."""
        return None if self.protocol == "halves" else self.text_search_ood

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
    def is_text(self) -> bool:
        return self.loaded.modality == "text"

    @property
    def noun(self) -> str:
        """What the pages call the items of this model's data: "images" or "sentences"."""
        return NOUNS[self.loaded.modality]


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
    dinov2_img_size: int,
    arch_kwargs: str = "",
    classes: tuple[str, ...] | None = None,
    prompts: tuple[str, ...] | None = None,
) -> LoadedModel:
    """The model of a setup; ``classes`` and ``prompts`` for an OpenCLIP model only."""
    if model.startswith(OPENCLIP_PREFIX):
        return load_model(model, classes=classes, templates=prompts)
    options = {"img_size": dinov2_img_size} if model in ("dinov2-s", "dinov2") else {}
    return load_model(model, arch=arch, arch_kwargs=parse_arch_kwargs(arch_kwargs), **options)


def setup_model(config: SetupConfig) -> LoadedModel:
    """The model a setup names, loaded once per its arguments: an OpenCLIP model becomes a
    zero-shot classifier of the ID set's classes (the class order given, else the ID folder's
    class folders, else Fashion-MNIST's)."""
    if config.model.startswith(OPENCLIP_PREFIX):
        classes = config.classes or (folder_classes(config.id_folder) if config.id_folder else None)
        return cached_model(
            config.model, None, config.dinov2_img_size, "", classes, tuple(config.prompts)
        )
    return cached_model(config.model, config.arch, config.dinov2_img_size, config.arch_kwargs)


@st.cache_resource(show_spinner="Loading the data sets...")
def cached_benchmark(
    ood: tuple[str, ...],
    n_search: int,
    n_report: int | None,
    id_folder: str | None = None,
    ood_folders: tuple[str, ...] = (),
    image_format: tuple[int, int] = (1, 28),
    classes: tuple[str, ...] | None = None,
    search_ood: tuple[str, ...] | None = None,
    protocol: str = "dedicated",
    modality: str = "image",
) -> Benchmark:
    """The benchmark of a setup. For ``modality="text"``, ``ood`` and ``search_ood`` name text
    sets, ``id_folder`` is a CSV/JSONL file of texts and labels and ``ood_folders`` are OOD files
    (the same role prefixes); ``image_format`` is not used."""
    if modality == "text":
        return text_file_benchmark(
            id_file=id_folder,
            ood=ood,
            search_ood=search_ood,
            ood_files=ood_folders,
            protocol=protocol,
            n_search=n_search,
            n_report=n_report,
            classes=classes,
        )
    return folder_benchmark(
        id_folder=id_folder,
        ood=ood,
        search_ood=search_ood,
        ood_folders=ood_folders,
        protocol=protocol,
        channels=image_format[0],
        size=image_format[1],
        n_search=n_search,
        n_report=n_report,
        classes=classes,
    )


@st.cache_resource
def disk_cache() -> DiskCache:
    return DiskCache()


def get_context() -> Context:
    """The loaded model and data for the current setup (loaded once per setup, then cached): the
    image choices of the setup for an image model, its text choices for a text model."""
    config = get_config()
    device = resolve_device(config.device)
    loaded = setup_model(config)
    loaded.model.to(device)
    if loaded.modality == "text":
        # labels of an ID file of your own are matched to the model's class names unless the
        # setup gives another order
        classes = (config.classes or loaded.classes) if config.id_file else None
        benchmark = cached_benchmark(
            config.text_ood,
            config.n_search,
            config.n_report,
            config.id_file,
            config.ood_files,
            classes=classes,
            search_ood=config.text_search_sets,
            protocol=config.protocol,
            modality="text",
        )
        return Context(config, loaded, benchmark, device)
    benchmark = cached_benchmark(
        config.ood,
        config.n_search,
        config.n_report,
        config.id_folder,
        config.ood_folders,
        input_format(loaded.model),  # used only when folders are involved
        config.classes,
        search_ood=config.search_sets,
        protocol=config.protocol,
    )
    return Context(config, loaded, benchmark, device)


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
