"""The pages' exports for other tools: member masks for nnsight and as plain JSON (Masks page), the
fused model as ONNX (Hydra page). The files come from :mod:`hydra_core.export`, the same calls as
``masks export`` and ``export`` on the command line."""

from __future__ import annotations

import tempfile
from pathlib import Path

import streamlit as st
from torch import nn

from hydra_core.errors import InputError
from hydra_core.export.masks import nnsight_module, plain_masks_text
from hydra_core.export.onnx import export_onnx
from hydra_core.masks import MemberMask
from hydra_core.models.family import UnsupportedModelError
from hydra_core.models.preprocess import describe

#: where the Hydra page keeps its last ONNX export (in ``results()``)
ONNX_KEY = "onnx"


def mask_downloads(members: list[MemberMask], loaded) -> None:
    """Downloads of the members for nnsight (a Python module) and as plain JSON."""
    st.markdown("**For other tools**")
    c1, c2 = st.columns(2)
    try:
        module = nnsight_module(members, loaded.model, loaded.identity())
    except UnsupportedModelError as exc:
        c1.caption(f"nnsight: {exc}.")
    else:
        c1.download_button(
            "For nnsight (Python module)",
            module,
            file_name="hydra_masks.py",
            mime="text/x-python",
            icon=":material/download:",
            key="masks-nnsight",
            on_click="ignore",
        )
    c2.download_button(
        "Plain JSON {layer: [heads kept]}",
        plain_masks_text(members),
        file_name="hydra_masks_plain.json",
        mime="application/json",
        icon=":material/download:",
        key="masks-plain",
        on_click="ignore",
    )
    st.caption(
        "nnsight: `import hydra_masks`, then `hydra_masks.apply(model, member)` inside "
        "`with model.trace(...)` switches the member's dropped heads off, exactly as Hydra Lab "
        "does (needs only torch). Plain JSON: each member's kept heads per layer (one member: "
        "`{layer: [heads]}`)."
    )


def onnx_export(hydra: nn.Module, loaded, member_names: list[str], store: dict) -> None:
    """A button that writes ``hydra`` as ONNX (checked under onnxruntime against torch), then the
    file's download; ``store`` (the page's results) keeps the file for this model."""
    if st.button("Export as ONNX", icon=":material/conversion_path:"):
        with st.spinner("Writing the ONNX graph and running it under onnxruntime"):
            try:
                data, note = onnx_bytes(hydra, loaded, member_names)
            except (InputError, UnsupportedModelError) as exc:
                st.error(str(exc))
            else:
                store[ONNX_KEY] = {"model": id(hydra), "bytes": data, "note": note}
    found = store.get(ONNX_KEY)
    if found is not None and found["model"] == id(hydra):
        st.download_button(
            "Fused model (ONNX)",
            found["bytes"],
            file_name="hydra.onnx",
            mime="application/octet-stream",
            icon=":material/download:",
            key="hydra-onnx",
            on_click="ignore",
        )
        st.caption(found["note"])


def onnx_bytes(hydra: nn.Module, loaded, member_names: list[str]) -> tuple[bytes, str]:
    """The ONNX file of ``hydra`` and a note on its inputs, outputs and the onnxruntime check."""
    description = {
        "source": loaded.name,
        "classes": list(loaded.classes) if loaded.classes else None,
        "preprocess": describe(loaded.preprocess),
        "members": list(member_names),
    }
    description = {k: v for k, v in description.items() if v is not None}
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder) / "hydra.onnx"  # a download: the file lives in memory, not on disk
        written = export_onnx(hydra, tmp, description=description)
        data = tmp.read_bytes()

    def shapes(entries: dict) -> str:
        return ", ".join(f"`{n}` ({', '.join(map(str, s))})" for n, s in entries.items())

    note = (
        f"Inputs {shapes(written.inputs)}, after the source's preprocessing; outputs "
        f"{shapes(written.outputs)}: each member's logits and the ensemble's probabilities. "
        f"onnxruntime vs torch: max |difference| {written.max_difference:.1e} on "
        f"{written.checked_on}."
    )
    return data, note
