"""Hydra Lab: `streamlit run app.py`. This file only routes; each page is a file in pages/."""

import streamlit as st

from hydra_core.errors import surface
from hydra_core.evaluate import resolve_device
from hydra_core.models.zero_shot import declares_random_weights
from hydra_ui.context import device_label, get_config

st.set_page_config(page_title="Hydra Lab", page_icon=":material/hub:", layout="wide")

PAGES = [
    st.Page("pages/1_setup.py", title="Setup", icon="⚙️", default=True),
    st.Page("pages/2_headmap.py", title="Headmap search", icon=":material/travel_explore:"),
    st.Page("pages/3_importance.py", title="Head importance", icon=":material/grid_view:"),
    st.Page("pages/4_representations.py", title="Representations", icon=":material/scatter_plot:"),
    st.Page("pages/5_masks.py", title="Masks", icon=":material/masks:"),
    st.Page("pages/6_hydra.py", title="Hydra", icon=":material/hub:"),
]

navigation = st.navigation(PAGES)
with st.sidebar:
    config = get_config()
    st.markdown(f"**Model:** `{config.model}`")
    if declares_random_weights(config.model):
        st.warning("Random weights: every number checks the mechanics; none is a zero-shot result.")
    try:
        st.markdown(
            f"**Device:** {device_label(resolve_device(config.device))} · {config.precision}"
        )
    except RuntimeError as exc:
        st.warning(str(exc))
with surface("app"):  # messages name the pages' controls, not the command line's options
    navigation.run()
