"""Setup: choose the model, the data and the device; see the model card."""

import dataclasses
from pathlib import Path

import streamlit as st
import torch

from hydra_core.data.benchmark import DEFAULT_PROTOCOL, PROTOCOLS
from hydra_core.data.generic import class_order_note
from hydra_core.errors import InputError
from hydra_core.evaluate import model_card
from hydra_core.hydra.fused import check_fusable
from hydra_core.models import hf
from hydra_core.models.modality import IMAGE_MODALITY, TEXT_MODALITY, Modality
from hydra_core.models.zero_shot import DEFAULT_TEMPLATE, PROMPT_SETS
from hydra_core.zoo.named import NamedModel, named_model, named_models
from hydra_core.zoo.registry import chance_note, check_fit
from hydra_core.zoo.sources import HUGGING_FACE, OPENCLIP, is_zero_shot
from hydra_ui.context import (
    PROTOCOL_LABELS,
    SetupConfig,
    disk_cache,
    get_config,
    get_context,
    set_config,
    setup_benchmark,
    setup_model,
)
from hydra_ui.waits import card_to_predict, items_bar
from hydra_ui.widgets import show_error, table_with_download

#: the sources of each modality where the user enters a name: label -> the kind of name
ENTERED = {
    IMAGE_MODALITY: {"timm model name (online)": "timm", "Checkpoint file": "file"},
    TEXT_MODALITY: {
        "Hugging Face name (text, online)": "hf-name",
        "Hugging Face folder (text)": "hf-folder",
    },
}
#: the Source radio: label -> a named model's name, or the kind of name the user enters; per
#: modality its named models (hydra_core.zoo.named), then the names to enter; OpenCLIP last
SOURCES = {
    **{
        label: source
        for modality, entered in ENTERED.items()
        for label, source in [
            *((m.label, m.name) for m in named_models(modality)),
            *entered.items(),
        ]
    },
    "OpenCLIP (zero-shot)": "openclip",
}
#: the modality of each source that is no named model
ENTERED_MODALITY = {
    **{kind: modality for modality, entered in ENTERED.items() for kind in entered.values()},
    "openclip": IMAGE_MODALITY,
}
#: the sources to choose for a model of each modality entered under a source of the other
SOURCE_FOR = {
    IMAGE_MODALITY: "the source 'Checkpoint file' or 'timm model name (online)'",
    TEXT_MODALITY: "the source 'Hugging Face folder (text)' or 'Hugging Face name (text, online)'",
}
#: the setup changes of a source without a timm architecture
NO_ARCH = {"arch": None, "arch_kwargs": ""}
#: the data choices that belong to one modality, and their defaults (the modality's own)
DATA_DEFAULTS = {"id_source": None, "ood": None, "search_ood": None, "ood_sources": ()}
#: the session-state key of the data choices last set with each modality, by its name
DATA_KEY = "setup_data"
#: the session-state key of the confirmation shown once after Apply
APPLIED_KEY = "setup_applied"


def source_of(model: str) -> str:
    """The Source a setup's model came from (a value of :data:`SOURCES`)."""
    if (named := named_model(model)) is not None:
        return named.name
    if is_zero_shot(model):
        return "openclip"
    if model.endswith((".safetensors", ".pt", ".pth", ".bin")):
        return "file"
    if hf.is_hf_folder(Path(model).expanduser()):
        return "hf-folder"
    if hf.is_hub_name(model) and not model.startswith(("/", "./", "../", "~")):
        return "hf-name"
    return "timm"


def modality_of(source: str) -> Modality:
    """What the models of a source take."""
    named = named_model(source)
    return named.modality if named is not None else ENTERED_MODALITY[source]


def named_model_fields(config, named: NamedModel) -> dict:
    """A named model's description and the settings of its loader it offers; returns the setup
    changes."""
    st.caption(f"**{named.name}**: {named.description}")
    changes = {"model": named.name, **NO_ARCH}
    for option in named.options:
        value = st.select_slider(
            option.label, options=list(option.choices), value=getattr(config, option.setting)
        )
        changes[option.setting] = int(value)
    return changes


def image_model_fields(config, source: str) -> dict:
    """The fields of an image source, and only those: a named model's options (none for the
    embedded default, the input size for DINOv2), a name (and timm settings) for a timm model, a
    path (and its architecture when the file does not carry it) for a checkpoint file; returns the
    setup changes."""
    own = source_of(config.model) == source
    if (named := named_model(source)) is not None:
        return named_model_fields(config, named)
    if source == "timm":
        name = st.text_input(
            "timm model name",
            value=config.model if own else "",
            placeholder="vit_small_patch16_224",
            key="setup_model_name",
        )
        st.caption(
            "Pretrained weights come from the timm/Hugging Face hub: **this needs the network**."
        )
        arch, arch_kwargs = None, timm_settings(config if own else None)
    else:
        name = st.text_input(
            "Checkpoint file (.safetensors, .pt, .pth, .bin)",
            value=config.model if own else "",
            placeholder="/path/to/weights.safetensors",
            key="setup_model_name",
        )
        c1, c2 = st.columns(2)
        with c1:
            arch = st.text_input(
                "timm architecture (when the file does not carry its configuration)",
                value=(config.arch or "") if own else "",
                placeholder="vit_small_patch16_224",
                key="setup_arch",
            ).strip()
        with c2:
            arch_kwargs = timm_settings(config if own else None)
    return {"model": name.strip(), "arch": arch or None, "arch_kwargs": arch_kwargs}


def timm_settings(config) -> str:
    """The JSON keyword arguments for timm.create_model (the current setup's, if given)."""
    return st.text_input(
        "Architecture settings (JSON, optional)",
        value=config.arch_kwargs if config is not None else "",
        placeholder='{"img_size": 32, "patch_size": 8, "init_values": 1e-5}',
        help="Keyword arguments for timm.create_model beside the architecture (or the timm "
        "name): image size, patch size, layer scale, pooling, ...",
        key="setup_arch_kwargs",
    ).strip()


def text_model_fields(config, source: str) -> dict:
    """The hub name or folder of a text source; returns the setup changes."""
    own = source_of(config.model) == source
    if (named := named_model(source)) is not None:
        return named_model_fields(config, named)
    if source == "hf-name":
        name = st.text_input(
            "Hugging Face hub name",
            value=HUGGING_FACE.name_of(config.model) if own else "",
            placeholder="textattack/bert-base-uncased-SST-2",
            key="setup_model_name",
        )
        st.caption(
            "Downloads the model from the Hugging Face hub: **this needs the network**; offline "
            "it fails with an error (use MiniLM sentiment or a model folder instead). It must be "
            "a BERT, RoBERTa, MPNet or DistilBERT sequence classifier fine-tuned on your classes."
        )
        name = name.strip()
        hub = name if not name or hf.is_hub_name(name) else HUGGING_FACE.source(name)
        return {"model": hub, **NO_ARCH}
    name = st.text_input(
        "Model folder",
        value=config.model if own else "",
        placeholder="/path/to/my_classifier  (config.json, model.safetensors, tokenizer files)",
        help="What model.save_pretrained(folder) and tokenizer.save_pretrained(folder) write: a "
        "BERT, RoBERTa, MPNet or DistilBERT sequence classifier with its tokenizer.",
        key="setup_model_name",
    )
    return {"model": name.strip(), **NO_ARCH}


#: the prompt choices of an OpenCLIP model: label -> the set's name (None: templates of your own)
PROMPT_CHOICES = {
    f"paper: '{DEFAULT_TEMPLATE}'": "paper",
    "openai: open_clip's 80 ImageNet templates (averaged)": "openai",
    "simple: its 7 templates": "simple",
    "my own templates": None,
}


#: the towers an OpenCLIP model's heads are pruned in: label -> load_model's ``towers``
TOWER_CHOICES = {
    "both: image and text heads, jointly (the paper's D.3)": "both",
    "image: the image tower's heads only": "image",
}


def zero_shot_fields(config, source: str) -> dict:
    """The open_clip model and the prompt templates of a zero-shot source; returns the setup
    changes."""
    own = source_of(config.model) == source
    name = st.text_input(
        "open_clip model: NAME/TAG, local-dir:PATH or hf-hub:ORG/REPO",
        value=OPENCLIP.name_of(config.model) if own else "",
        placeholder="ViT-B-32/laion2b_s34b_b79k  or  local-dir:/path/to/folder",
        key="setup_openclip_name",
    )
    st.caption(
        "Pretrained weights (NAME/TAG, hf-hub:) are downloaded from the Hugging Face hub: **this "
        "needs the network**. Offline only a local folder works: local-dir:/path with "
        "open_clip_config.json and the weights (e.g. a copy of the model's hub repository). No "
        "CLIP weights ship with Hydra Lab or any package registry. The classes are the ID set's "
        "(an image folder's class folders, '_' and '-' read as spaces), embedded by the text "
        "tower in each prompt."
    )
    towers = st.radio(
        "Towers",
        list(TOWER_CHOICES),
        index=list(TOWER_CHOICES.values()).index(config.towers),
        key="setup_towers",
        help="Both: one head layout of the image tower's layers, then the text tower's; a "
        "member's class embeddings come from its own pruned text tower (the paper's D.3). "
        "Image: only the image tower's heads are searched and pruned (its Appendix E.3.2). Mask "
        "files say which layout they were made for.",
    )
    chosen = tuple(config.prompts)
    current = next(
        (i for i, v in enumerate(PROMPT_CHOICES.values()) if (v,) == chosen),
        len(PROMPT_CHOICES) - 1,
    )
    label = st.radio("Prompts", list(PROMPT_CHOICES), index=current, key="setup_prompt_set")
    templates = st.text_area(
        "My own prompt templates, one per line ({label} marks the class name)",
        value="\n".join(t for t in chosen if t not in PROMPT_SETS),
        placeholder="a photo of a {label}.\na sketch of a {label}.",
        help="Used when 'my own templates' is chosen above. A class's prompts are embedded by "
        "the text tower, normalised and averaged.",
        key="setup_prompts",
    )
    prompts = (PROMPT_CHOICES[label],) if PROMPT_CHOICES[label] else lines(templates)
    name = OPENCLIP.name_of(name.strip())
    return {
        "model": OPENCLIP.source(name) if name else "",
        "prompts": prompts,
        "towers": TOWER_CHOICES[towers],
        **NO_ARCH,
    }


#: the fields that name the model, by source; the other sources take their modality's
MODEL_FIELDS = {"openclip": zero_shot_fields}
MODALITY_FIELDS = {IMAGE_MODALITY: image_model_fields, TEXT_MODALITY: text_model_fields}


def image_data_fields(config) -> dict:
    """Fashion-MNIST or an image folder, and the image OOD sets; returns the setup changes."""
    id_folder = st.text_input(
        "In-distribution set: an image folder of your own (empty = Fashion-MNIST)",
        value=config.id_source or "",
        placeholder="/data/my_set  (one sub-folder per class, classes in the model's order)",
        help="Empty: Fashion-MNIST, search split = 5,000 held-out training images, report "
        "split = the 10,000 test images. A folder is split once into disjoint search and report "
        "halves.",
        key="setup_id_folder",
    )
    classes = st.text_input(
        "Class order of your ID folder (optional)",
        value=",".join(config.classes or ()),
        placeholder="c1,c2,c3,...,c10  (the model's classes in output order)",
        help="Empty: class folders in sorted text order (c1, c10, c2, ...), as torchvision's "
        "ImageFolder. Given: each folder's label is its position in this list.",
        key="setup_classes",
    )
    ood_sets = ood_set_fields(
        config,
        IMAGE_MODALITY,
        search_help="The greedy search, single-head importance and member masks score heads on "
        "these sets; no reported number uses them (the paper's dedicated OOD validation set). "
        "Defaults: generic natural images (photographs, faces). A set may not be in both lists.",
    )
    protocol = protocol_field(config)
    ood_folders = st.text_area(
        "Extra OOD folders, one per line (optional)",
        value="\n".join(config.ood_sources),
        placeholder="near: /data/similar_objects\nfar: /data/other_images\nsearch: /data/more",
        help="Prefix a folder with 'near:' or 'far:' to report on it (a bare path is far), or "
        "with 'search:' to select heads on it. Flat folders of images, or class folders (their "
        "labels are ignored).",
    )
    return {
        "id_source": id_folder.strip() or None,
        "classes": class_list(classes),
        **ood_sets,
        "protocol": protocol,
        "ood_sources": lines(ood_folders),
    }


def text_data_fields(config) -> dict:
    """Rotten Tomatoes or a CSV/JSONL file, and the text OOD sets; returns the setup changes."""
    id_file = st.text_input(
        "In-distribution set: a CSV or JSONL file of your own (empty = Rotten Tomatoes)",
        value=config.id_source or "",
        placeholder='/data/mine.csv  (columns text,label; JSONL: one {"text", "label"} a line)',
        help="Empty: Rotten Tomatoes sentences, search split = 1,000 validation sentences, "
        "report split = 1,500 test sentences. A file is split once into disjoint search and "
        "report halves. Labels are class indices (0, 1, ...) or class names.",
        key="setup_id_file",
    )
    classes = st.text_input(
        "Class order of your ID file (optional)",
        value=",".join(config.classes or ()),
        placeholder="negative,positive  (the model's classes in output order)",
        help="Empty: label names are matched to the model's class names (from its config), or "
        "numbered in sorted order when the model has none. Given: a label's class is its "
        "position in this list.",
        key="setup_classes",
    )
    ood_sets = ood_set_fields(
        config,
        TEXT_MODALITY,
        search_help="The greedy search, single-head importance and member masks score heads on "
        "these sets; no reported number uses them (the paper's dedicated OOD validation set, "
        "AG's News for its text models). Default: Guardian news headlines. A set may not be in "
        "both lists.",
    )
    protocol = protocol_field(config)
    ood_files = st.text_area(
        "Extra OOD files, one per line (optional)",
        value="\n".join(config.ood_sources),
        placeholder="near: /data/reviews.csv\nfar: /data/recipes.jsonl\nsearch: /data/news.csv",
        help="CSV files with a 'text' column or JSONL files with a 'text' key (labels are "
        "ignored). Prefix a file with 'near:' or 'far:' to report on it (a bare path is far), "
        "or with 'search:' to select heads on it.",
    )
    return {
        "id_source": id_file.strip() or None,
        "classes": class_list(classes),
        **ood_sets,
        "protocol": protocol,
        "ood_sources": lines(ood_files),
    }


#: the data fields of a model of each modality
DATA_FIELDS = {IMAGE_MODALITY: image_data_fields, TEXT_MODALITY: text_data_fields}


def ood_set_fields(config, modality: Modality, search_help: str) -> dict:
    """The report and the search sets among the modality's named OOD sets; returns the setup
    changes (None where the choice is the modality's default)."""
    sets = modality.ood_sets
    ood = st.multiselect(
        "Report OOD sets (every table and metric, never used to select heads)",
        list(sets),
        default=list(config.report_sets(modality)),
        format_func=lambda n: f"{n} ({sets[n].group})",
    )
    search_ood = st.multiselect(
        "Search OOD sets (head selection only, never reported)",
        list(sets),
        default=list(modality.search_ood if config.search_ood is None else config.search_ood),
        format_func=lambda n: f"{n} ({sets[n].group})",
        help=search_help,
    )
    return {
        "ood": or_default(ood, modality.report_ood),
        "search_ood": or_default(search_ood, modality.search_ood),
    }


def or_default(chosen: list[str], default: tuple[str, ...]) -> tuple[str, ...] | None:
    """The sets chosen; None when they are the defaults, so that a setup applied unchanged
    keeps its key (and its results)."""
    return None if tuple(chosen) == default else tuple(chosen)


def shown_data(config: SetupConfig, modality: Modality) -> SetupConfig:
    """The setup whose data choices the form shows for a model of ``modality``: the current
    one when its model is of that modality, else the current one with the data choices last
    set with such a model (the modality's defaults at first)."""
    if modality_of(source_of(config.model)) is modality:
        return config
    return config.replace(**(DATA_DEFAULTS | st.session_state[DATA_KEY].get(modality.name, {})))


def remember_data(config: SetupConfig) -> None:
    """Keep the setup's data choices for its modality, to show them again when the Source
    returns to a model of that modality."""
    remembered = st.session_state.setdefault(DATA_KEY, {})
    remembered[modality_of(source_of(config.model)).name] = {
        field: getattr(config, field) for field in DATA_DEFAULTS
    }


def protocol_field(config) -> str:
    return st.radio(
        "Protocol",
        PROTOCOLS,
        index=PROTOCOLS.index(config.protocol),
        format_func=lambda p: PROTOCOL_LABELS[p] + (" (default)" if p == DEFAULT_PROTOCOL else ""),
        horizontal=True,
        help="Which data selects heads (docs/search-protocols.md). synthetic: sets made from the "
        "ID search items (shuffled patches or words, permuted pixels, random words, strong "
        "corruptions), no outside set. far-to-near / near-to-far: every set of one group selects "
        "heads and only the other group's report sets are reported on. halves, the earlier "
        "protocol, selects heads on one half of each report set and reports on the other half: "
        "the search sees the reported distributions, so OOD numbers come out optimistic. The "
        "search sets above are used by dedicated, far-to-near and near-to-far only.",
    )


def class_list(text: str) -> tuple[str, ...] | None:
    return tuple(c.strip() for c in text.split(",") if c.strip()) or None


def lines(text: str) -> tuple[str, ...]:
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def check_choice(chosen: SetupConfig, modality: Modality) -> None:
    """Refuse data choices that make no benchmark (OOD roles, paths, set names), before anything
    is loaded (InputError)."""
    modality.check_choice(
        chosen.report_sets(modality),
        chosen.search_sets(modality),
        chosen.ood_sources,
        chosen.protocol,
        id_source=chosen.id_source,
    )


def class_order_notes(config: SetupConfig, context) -> list[str | None]:
    """Warnings on the class order of ID data of your own when the setup gives none."""
    zero_shot = context.loaded.is_zero_shot  # its classes are the folder's: no order to get wrong
    if not config.id_source or config.classes or zero_shot:
        return []
    classes = context.benchmark.id_search.classes or ()
    if not context.loaded.modality.follows_model_classes:
        return [class_order_note(config.id_source, classes)]
    if context.loaded.classes:  # the labels were matched to its class names
        return []
    return [
        f"the labels of {config.id_source} are taken as outputs in this order: "
        f"{', '.join(classes)}; give the class order if the model's outputs are in another"
    ]


def applied_message(old: SetupConfig, new: SetupConfig, noun: str) -> str:
    """The confirmation shown after Apply: what is in use now and what changed."""
    changed = [
        f"{field.name} {getattr(old, field.name)!r} → {getattr(new, field.name)!r}"
        for field in dataclasses.fields(SetupConfig)
        if getattr(old, field.name) != getattr(new, field.name)
    ]
    report = "all" if new.n_report is None else f"{new.n_report:,}"
    in_use = (
        f"Setup applied: **{new.model}**, {new.n_search:,} search and {report} report {noun} "
        f"per set, device {new.device}, {new.precision}."
    )
    if not changed:
        return f"{in_use} Nothing changed: the results computed so far stay."
    return (
        f"{in_use} Changed: {'; '.join(changed)}. Results computed under the previous setup were "
        "cleared from the pages (the disk cache keeps them for when you return to it)."
    )


def missing_name(source: str, model: str) -> str | None:
    """What to enter first when the source needs a name or path and none (or no folder) was
    given; None when the model can be loaded."""
    if named_model(source) is not None or (model and source != "hf-folder"):
        return None
    what = {
        "openclip": "an open_clip model name and tag, or local-dir:PATH",
        "timm": "a timm model name",
        "file": "a checkpoint path",
        "hf-name": "a Hugging Face model name",
        "hf-folder": "the model folder",
    }[source]
    if not model:
        return f"Enter {what} first."
    if not Path(model).expanduser().is_dir():
        return (
            f"Model folder {model} not found: give the folder save_pretrained wrote (config.json, "
            "weights, tokenizer files)."
        )
    return None


st.title("Setup")
st.caption(
    "Everything the other pages compute depends on these choices; changing them clears "
    "results computed under the old ones (cached results on disk come back when you return)."
)

if message := st.session_state.pop(APPLIED_KEY, None):
    st.success(message, icon=":material/check_circle:")
config = get_config()
remember_data(config)
st.subheader("Model")
labels = list(SOURCES)
current = labels.index(next(k for k, v in SOURCES.items() if v == source_of(config.model)))
source = SOURCES[st.radio("Source", labels, index=current, horizontal=True, key="setup_source")]
modality = modality_of(source)
noun = modality.noun

with st.form("setup"):
    model_changes = MODEL_FIELDS.get(source, MODALITY_FIELDS[modality])(config, source)

    st.subheader("Data")
    data_changes = DATA_FIELDS[modality](shown_data(config, modality))
    c1, c2 = st.columns(2)
    n_search = c1.number_input(
        f"Search {noun} per set (head selection)", 16, 5000, config.n_search, step=64
    )
    n_report = c2.number_input(
        f"Report {noun} per set (0 = all)", 0, 10000, config.n_report or 0, step=500
    )

    st.subheader("Device")
    c1, c2 = st.columns(2)
    devices = ["auto", "cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    device = c1.selectbox(
        "Device",
        devices,
        index=devices.index(config.device) if config.device in devices else 0,
        help="auto = cuda when a GPU is available, else cpu",
    )
    precision = c2.selectbox(
        "Precision",
        ["fp32", "bf16"],
        index=["fp32", "bf16"].index(config.precision),
        help="bf16 autocast is meant for CUDA GPUs; on CPU it is slower",
    )
    applied = st.form_submit_button("Apply", type="primary")

if applied:
    model = model_changes["model"]
    if problem := missing_name(source, model):
        st.error(problem)
    else:
        if source == "hf-folder":
            model_changes["model"] = model = str(Path(model).expanduser())
        chosen = config.replace(
            **model_changes,
            **data_changes,
            n_search=int(n_search),
            n_report=int(n_report) or None,
            device=device,
            precision=precision,
        )
        with show_error("Cannot use this data"):
            check_choice(chosen, modality)
            with show_error(f"Cannot use {model}"):
                # Refused here rather than on the last page: every page analyses or fuses it.
                loaded = setup_model(chosen)
                if loaded.modality is not modality:
                    raise InputError(
                        f"{loaded.name} is a model of {loaded.modality.noun}, not of "
                        f"{noun}: choose {SOURCE_FOR[loaded.modality]} for it"
                    )
                loaded.check_analysable()
                check_fusable(loaded.model)
                # every file read now, so that data that cannot be used is never applied
                id_search = setup_benchmark(chosen, loaded).id_search
                check_fit(loaded, id_search, own_folder=chosen.id_source is not None)
                set_config(chosen)
                st.session_state[APPLIED_KEY] = applied_message(config, chosen, noun)
                st.rerun()

with show_error("Could not load the model or data"):
    context = get_context()
    own_data = config.id_source
    notes = check_fit(context.loaded, context.benchmark.id_search, own_folder=own_data is not None)
    notes += class_order_notes(config, context)
    zero_shot = context.loaded.is_zero_shot
    for note in filter(None, notes):
        st.warning(note)
    st.subheader("Model card")
    static = context.loaded.card()
    cols = st.columns(5)
    cols[0].metric("Layers", static["layers"])
    cols[1].metric("Heads / layer", static["heads"])
    cols[2].metric("Head dim", static["head_dim"])
    cols[3].metric("Parameters", f"{static['params'] / 1e6:.2f} M")
    cols[4].metric("Device", context.device.type)
    st.caption(f"{context.loaded.name}: {context.loaded.description}")
    if zero_shot:
        details = context.loaded.details
        st.caption(
            f"Zero-shot classifier of {details['classes']} classes "
            f"({', '.join(context.loaded.classes or ())}); prompts {details['prompts']}; logits = "
            f"{details['logit_scale']} x cosine; weights: {details['weights']}. Heads pruned in "
            f"{details['towers']}. Preprocessing: {details['preprocessing']}."
        )
        if details["weights"].startswith("RANDOM"):
            st.warning(
                "These weights are a random initialisation: every number below checks the "
                "mechanics, none is a zero-shot result."
            )
    if context.loaded.modality.follows_model_classes:  # what an ID file's labels are matched to
        classes = ", ".join(context.loaded.classes or ()) or "not named in its config"
        st.caption(
            f"Text classifier; classes: {classes}. Each head's representation and the classifier "
            "read the CLS token (position 0)."
        )

    what = "Model card: predicting the report split (cached after the first time)"
    with items_bar(what, card_to_predict(context, disk_cache()), context.noun) as progress:
        card = model_card(
            context.loaded,
            context.benchmark,
            cache=disk_cache(),
            device=context.device,
            progress=progress,
        )
    lo, hi = card["id_accuracy_ci95"]
    st.metric(
        "ID accuracy",
        f"{card['id_accuracy']:.2%}",
        help=f"{card['id_set']}; 95% bootstrap interval {lo:.2%} to {hi:.2%}",
    )
    st.caption(
        f"ID accuracy 95% interval: [{lo:.2%}, {hi:.2%}] (bootstrap over the report {context.noun})"
    )
    outputs = context.loaded.num_outputs()
    if own_data and (note := chance_note(card["id_accuracy"], outputs, zero_shot=zero_shot)):
        st.warning(note)
    groups = {s.name: s.group for s in context.benchmark.ood_report}
    rows = [
        {
            "OOD set": n,
            "group": groups.get(n, ""),
            "AUROC (MSP)": a,
            "95% low": card["ood_auroc_ci95"][n][0],
            "95% high": card["ood_auroc_ci95"][n][1],
        }
        for n, a in card["ood_auroc"].items()
    ]
    table_with_download(rows, "model_card_ood_auroc.csv", float_format="{:.4f}")
    st.caption(
        "AUROC: OOD is the positive class, score = maximum softmax probability (higher = more "
        "in-distribution), as in OpenOOD."
    )
    st.subheader("Data")
    if note := context.benchmark.protocol_note():
        st.warning(note)
    table_with_download(context.benchmark.describe(), "data_splits.csv")
    st.caption(
        "role: search sets select heads only, report sets are what every table and metric is "
        f"computed on; the ID set's validation {context.noun} search and its test {context.noun} "
        "report."
    )
