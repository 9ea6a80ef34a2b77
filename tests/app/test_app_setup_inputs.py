"""The Setup page's Apply validates every path and file the way the command line does (issue 25):
a folder or file that is missing, of the wrong kind or unreadable, two sets of one name, labels
that are not the model's classes, a hub name offline. Each is one error line in the page, never a
traceback, and the setup stays as it was."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from streamlit.testing.v1 import AppTest

from hydra_ui.context import CONFIG_KEY, SetupConfig
from tests.conftest import block_network, save_tiny_folder

SMALL = SetupConfig(n_search=64, n_report=300)


@pytest.fixture
def app(make_app) -> AppTest:
    return make_app(SMALL).run()


def apply(app: AppTest) -> list[str]:
    """Click Apply; the error messages the page shows then."""
    app.button[0].click()
    app.run()
    assert not app.exception, app.exception
    return [e.value for e in app.error]


def one_error(app: AppTest, errors: list[str], *parts: str) -> None:
    """One error line that holds every part, no traceback behind it, the setup not applied."""
    assert len(errors) == 1 and "\n" not in errors[0], errors
    assert all(part in errors[0] for part in parts), errors
    assert not app.expander  # the Details expander holds a traceback: none for a user's mistake
    assert app.session_state[CONFIG_KEY] == SMALL


def images(folder, count: int = 4, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    for i in range(count):
        Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8)).save(folder / f"{i}.png")


def ood_folders(app: AppTest):
    return next(t for t in app.text_area if t.label.startswith("Extra OOD folders"))


def test_a_missing_ood_folder_is_refused_on_apply(app, tmp_path):
    ood_folders(app).set_value(f"near: {tmp_path / 'nowhere'}")
    errors = apply(app)
    one_error(app, errors, f"the OOD folder {tmp_path / 'nowhere'} does not exist")


def test_a_file_given_as_a_folder_is_refused(app, tmp_path):
    (tmp_path / "notes.txt").write_text("not images")
    app.text_input(key="setup_id_folder").set_value(str(tmp_path / "notes.txt"))
    one_error(app, apply(app), "is a file; an image set is a folder of images")


def test_two_ood_folders_of_one_name_are_refused_saying_how_to_name_one(app, tmp_path):
    images(tmp_path / "a" / "odd")
    images(tmp_path / "b" / "odd", seed=1)
    ood_folders(app).set_value(f"near: {tmp_path / 'a' / 'odd'}\nfar: {tmp_path / 'b' / 'odd'}")
    one_error(app, apply(app), "is named 'odd'", "NAME=PATH", f"far:odd_far={tmp_path / 'b'}")
    ood_folders(app).set_value(
        f"near: {tmp_path / 'a' / 'odd'}\nfar: odd2={tmp_path / 'b' / 'odd'}"
    )
    assert apply(app) == []
    assert app.session_state[CONFIG_KEY].ood_sources[1] == f"far: odd2={tmp_path / 'b' / 'odd'}"
    assert "odd2" in list(app.dataframe[0].value["OOD set"])


def test_an_unreadable_image_is_refused_on_apply(app, tmp_path):
    for label in ("a", "b"):
        images(tmp_path / "mine" / label, seed=len(label))
    (tmp_path / "mine" / "b" / "broken.png").write_bytes(b"not a png")
    app.text_input(key="setup_id_folder").set_value(str(tmp_path / "mine"))
    one_error(app, apply(app), "cannot read image", "broken.png")


@pytest.fixture(scope="module")
def text_model(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("setup-text") / "model"
    save_tiny_folder(folder, ("negative", "positive"))
    return str(folder)


def choose_text_folder(app: AppTest, model: str, id_file: str) -> None:
    app.radio[0].set_value("Hugging Face folder (text)")
    app.run()
    app.text_input(key="setup_model_name").set_value(model)
    app.text_input(key="setup_id_file").set_value(id_file)


def test_labels_that_are_not_the_model_classes_are_refused_on_apply(app, text_model, tmp_path):
    texts = [f"good film {i}" for i in range(12)]
    pd.DataFrame({"text": texts, "label": ["fresh", "rotten"] * 6}).to_csv(
        tmp_path / "mine.csv", index=False
    )
    choose_text_folder(app, text_model, str(tmp_path / "mine.csv"))
    one_error(
        app, apply(app), "'fresh', 'rotten' are not classes of the model (negative, positive)"
    )


def test_a_missing_id_file_is_refused_before_the_model_loads(app, text_model, tmp_path):
    choose_text_folder(app, text_model, str(tmp_path / "nowhere.csv"))
    one_error(app, apply(app), f"the ID file {tmp_path / 'nowhere.csv'} does not exist")


@pytest.mark.parametrize(
    "source, field, name, what",
    [
        (
            "Hugging Face name (text, online)",
            "setup_model_name",
            "textattack/bert-base-uncased-SST-2",
            "Hugging Face model 'textattack/bert-base-uncased-SST-2'",
        ),
        (
            "timm model name (online)",
            "setup_model_name",
            "vit_small_patch16_224",
            "timm model 'vit_small_patch16_224'",
        ),
        (
            "OpenCLIP (zero-shot)",
            "setup_openclip_name",
            "ViT-B-32/laion2b_s34b_b79k",
            "openclip:ViT-B-32/laion2b_s34b_b79k",
        ),
    ],
)
def test_a_hub_name_offline_says_so_at_once(app, monkeypatch, tmp_path, source, field, name, what):
    """Refused from the name before timm builds the model or open_clip is imported (the local
    caches empty: nothing there may hold the weights)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    attempts = block_network(monkeypatch)
    app.radio[0].set_value(source)
    app.run()
    app.text_input(key=field).set_value(name)
    one_error(
        app,
        apply(app),
        f"cannot load {what}: this machine is offline (huggingface.co cannot be reached",
    )
    assert len(attempts) == 1
