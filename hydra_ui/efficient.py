"""The Hydra page's block of the paper's efficient ensembles (Packed-Ensembles, MIMO,
BatchEnsemble, LoRA Ensembles): a stored trained copy can be ticked and is evaluated with the
other systems; a missing one shows the exact command that trains it (hours for the from-scratch
ones on a CPU, minutes for the fine-tuned ones: the page never trains them)."""

from __future__ import annotations

import streamlit as st

from hydra_core.baselines import efficient
from hydra_core.baselines.deep_ensembles import reference_checkpoint
from hydra_core.baselines.systems import EfficientBaseline
from hydra_core.cache import model_fingerprint
from hydra_core.models.modality import IMAGE_MODALITY
from hydra_core.zoo.named import default_model


def efficient_rows(loaded, model_source: str) -> list[dict]:
    """One row per method: its settings, whether a trained copy of it is stored for this model
    (its files, its training time) and, when not, the command that trains it or why it does not
    apply."""
    reference = reference_checkpoint(model_source)
    rows = []
    settings = efficient.EfficientSettings()
    for method, name in efficient.NAMES.items():
        row = {
            "method": method,
            "system": name,
            "settings": ", ".join(f"{k}={v}" for k, v in settings.of(method).items()),
            "stored": False,
            "status": "",
            "command": "",
        }
        if method in efficient.FROM_SCRATCH and reference is None:
            row["status"] = "trained from scratch with a Hydra Lab checkpoint's recipe: n/a here"
            rows.append(row)
            continue
        paths = efficient.stored_copy(method, loaded.model, loaded.preprocess, reference=reference)
        if paths is None:
            row["status"] = "not trained"
            row["command"] = command_for(method, model_source)
        else:
            seconds = sum(
                efficient.read_meta(p).get("summary", {}).get("train_seconds", 0) for p in paths
            )
            row["stored"] = True
            row["status"] = f"trained copy stored ({seconds / 60:.0f} min of training)"
        rows.append(row)
    return rows


def command_for(method: str, model_source: str) -> str:
    """The command that trains ``method`` for the page's model."""
    command = efficient.train_command(method)
    if model_source != default_model(IMAGE_MODALITY).name:  # the command's default --model
        command += f" --model {model_source}"
    return command


def efficient_choices(context, running: bool) -> list:
    """The block: a tick box per stored copy, the command that trains each missing one;
    returns the systems ticked."""
    st.markdown("**Efficient ensembles** (paper Table 1; trained copies from the cache)")
    source = context.config.model
    key = ("efficient-rows", source, model_fingerprint(context.loaded.model))
    memo = st.session_state.setdefault("_efficient_rows", {})
    if key not in memo:  # the fine-tuned copies' keys hash their training items: once per model
        memo.clear()
        memo[key] = efficient_rows(context.loaded, source)
    rows = memo[key]
    chosen = []
    reference = reference_checkpoint(source)
    for row in rows:
        label = f"{row['system']} ({row['settings']})"
        if row["stored"]:
            if st.checkbox(
                label,
                value=False,
                disabled=running,
                key=f"efficient-{row['method']}",
                help=row["status"],
            ):
                chosen.append(EfficientBaseline(row["method"], reference=reference, train=False))
        elif row["command"]:
            st.caption(f"{label}: {row['status']}; train it with `{row['command']}`")
        else:
            st.caption(f"{label}: {row['status']}")
    if not any(r["stored"] for r in rows):
        st.caption(
            "No trained copy is stored for this model yet: the commands above store them in the "
            "cache folder (Ctrl-C and run again: it goes on from the last epoch)."
        )
    return chosen
