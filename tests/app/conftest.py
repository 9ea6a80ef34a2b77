"""The app under Streamlit's AppTest: one factory for every test that drives the pages.

``make_app(setup, page=...)`` (a fixture) gives the app with a disk cache of its own, empty, under
the test's tmp_path; ``new_app(setup)`` a further visit of the same app (same disk cache, new
session). ``app`` is ``make_app(setup)`` on the ``setup`` fixture: the tiny checkpoint here, a
test file's own where it defines ``setup``. Tests outside tests/app/ import what they use from
here (``from tests.app.conftest import ...``)."""

from __future__ import annotations

import base64
import csv
import json
import random
from pathlib import Path

import numpy as np
import plotly.io as pio
import pytest
from streamlit.testing.v1 import AppTest

from hydra_ui.context import CONFIG_KEY, SetupConfig, disk_cache
from tests.conftest import make_tiny_text, save_tiny_clip

APP = Path(__file__).resolve().parents[2] / "app.py"
#: the pages after Setup
PAGES = [
    "pages/2_headmap.py",
    "pages/3_importance.py",
    "pages/4_representations.py",
    "pages/5_masks.py",
    "pages/6_hydra.py",
]
#: the tiny checkpoint's setup (``setup``): its OOD sets and sizes
OOD = ("mnist", "noise")
N_SEARCH, N_REPORT = 40, 60
#: (n_search, n_report) of the text setup (``text_setup``) and the OpenCLIP one (``clip_setup``)
TEXT_SIZES, CLIP_SIZES = (20, 30), (16, 16)


def new_app(setup: SetupConfig | None = None, *, timeout: float = 180) -> AppTest:
    """A new visit of the app (``app.py`` under AppTest, not run yet), ``setup`` applied as the
    Setup page's Apply does (when given). The disk cache is the one HYDRA_LAB_CACHE names."""
    at = AppTest.from_file(str(APP), default_timeout=timeout)
    if setup is not None:
        at.session_state[CONFIG_KEY] = setup
    return at


@pytest.fixture
def app_cache(tmp_path, monkeypatch) -> Path:
    """An empty disk cache of the test's own (HYDRA_LAB_CACHE), every test starting empty."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(cache))
    disk_cache.clear()  # the next DiskCache() reads the variable
    return cache


@pytest.fixture
def make_app(app_cache):
    """The app factory: ``make_app(setup=None, *, page=None, timeout=180)`` gives :func:`new_app`
    on the test's own empty cache; with ``page``, opened there (run, switch, run, no
    exception)."""

    def make(
        setup: SetupConfig | None = None, *, page: str | None = None, timeout: float = 180
    ) -> AppTest:
        at = new_app(setup, timeout=timeout)
        return open_page(at, page) if page else at

    return make


@pytest.fixture
def setup(checkpoint) -> SetupConfig:
    """The tiny checkpoint with two small OOD sets, on the CPU."""
    return SetupConfig(
        model=checkpoint, ood=OOD, n_search=N_SEARCH, n_report=N_REPORT, device="cpu"
    )


@pytest.fixture
def app(make_app, setup) -> AppTest:
    return make_app(setup)


@pytest.fixture(scope="module")
def reference(checkpoint):
    """The model and search tensors the pages use on ``setup``, built directly with hydra_core."""
    from hydra_core.analysis.inputs import search_inputs
    from hydra_core.data.benchmark import default_benchmark
    from hydra_core.zoo.registry import load_model

    loaded = load_model(checkpoint)
    benchmark = default_benchmark(n_search=N_SEARCH, n_report=N_REPORT, ood=list(OOD))
    return loaded, search_inputs(loaded.preprocess, benchmark)


# --- a text model and an OpenCLIP model with files of one's own ---------------------------------

TEXT_CLASSES = ("neg", "pos", "mixed")
TEXT_WORDS = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "good",
    "bad",
    "film",
    "a",
    "very",
    "is",
]
#: every sentence the files hold: each is made once, as a text is either ID or OOD, in one file
MADE: set[str] = set()


def sentences(seed: int, count: int, extra: tuple[str, ...] = ()) -> list[str]:
    """Short random sentences of the vocabulary's words (and ``extra`` words, [UNK] to it), none
    made before."""
    rng = random.Random(seed)
    words = [*TEXT_WORDS[5:], *extra]
    made = []
    while len(made) < count:
        text = " ".join(rng.choices(words, k=rng.randint(2, 10)))
        if text not in MADE:
            MADE.add(text)
            made.append(text)
    return made


@pytest.fixture(scope="module")
def text_files(tmp_path_factory) -> dict[str, str]:
    """A tiny random BERT classifier saved as a Hugging Face folder, a labelled ID file (CSV) and
    OOD files: near (JSONL), far (CSV) and search (CSV)."""
    import transformers

    root = tmp_path_factory.mktemp("text")
    model = make_tiny_text("bert")
    model.config.id2label = dict(enumerate(TEXT_CLASSES))
    model.config.label2id = {c: i for i, c in enumerate(TEXT_CLASSES)}
    model.save_pretrained(root / "model")
    transformers.BertTokenizer(vocab={w: i for i, w in enumerate(TEXT_WORDS)}).save_pretrained(
        root / "model"
    )
    with open(root / "id.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        for i, text in enumerate(sentences(0, 60)):
            writer.writerow([text, TEXT_CLASSES[i % 3]])
    with open(root / "tweets.jsonl", "w") as f:
        for text in sentences(1, 40, ("wow", "lol")):
            f.write(json.dumps({"text": text}) + "\n")
    for name, seed in (("recipes", 2), ("headlines", 3)):
        with open(root / f"{name}.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["text"])
            writer.writerows([t] for t in sentences(seed, 40, ("salt", "news")))
    return {
        "model": str(root / "model"),
        "id": str(root / "id.csv"),
        "near": str(root / "tweets.jsonl"),
        "far": str(root / "recipes.csv"),
        "search": str(root / "headlines.csv"),
    }


@pytest.fixture(scope="module")
def text_setup(text_files) -> SetupConfig:
    n_search, n_report = TEXT_SIZES
    return SetupConfig(
        model=text_files["model"],
        id_source=text_files["id"],
        ood_sources=(
            f"near: {text_files['near']}",
            f"far: {text_files['far']}",
            f"search: {text_files['search']}",
        ),
        ood=(),
        search_ood=(),
        n_search=n_search,
        n_report=n_report,
        device="cpu",
    )


CLIP_CLASS_FOLDERS = ("sea-lion", "cat", "golden_retriever")


@pytest.fixture(scope="module")
def clip_files(tmp_path_factory) -> dict[str, str]:
    """A tiny random OpenCLIP folder, an ID folder of three classes (24 images each, not square)
    and flat OOD folders: near, far and search."""
    from PIL import Image

    root = tmp_path_factory.mktemp("clip_app")
    save_tiny_clip(root / "model")
    rng = np.random.default_rng(0)
    counts = {f"pets/{name}": 24 for name in CLIP_CLASS_FOLDERS}
    counts |= {"toys": 12, "noise": 12, "street": 12}
    for folder, count in counts.items():
        (root / folder).mkdir(parents=True)
        for i in range(count):
            pixels = rng.integers(0, 256, (40, 36, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / folder / f"{i}.png")
    return {name: str(root / name) for name in ("model", "pets", "toys", "noise", "street")}


@pytest.fixture(scope="module")
def clip_setup(clip_files) -> SetupConfig:
    n_search, n_report = CLIP_SIZES
    return SetupConfig(
        model=f"openclip:local-dir:{clip_files['model']}",
        id_source=clip_files["pets"],
        ood_sources=(
            f"near: {clip_files['toys']}",
            f"far: {clip_files['noise']}",
            f"search: {clip_files['street']}",
        ),
        ood=(),
        search_ood=(),
        n_search=n_search,
        n_report=n_report,
        device="cpu",
    )


# --- reading and driving the pages ------------------------------------------------------------


def open_page(at: AppTest, page: str) -> AppTest:
    at.run()
    at.switch_page(page)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def button(at: AppTest, label: str):
    return next(b for b in at.button if b.label == label)


def figures(at: AppTest) -> list:
    return [pio.from_json(chart.proto.spec) for chart in at.get("plotly_chart")]


def array(value) -> np.ndarray:
    """A Plotly JSON array: a list, or the typed-array dict Plotly 6 writes (dtype, bdata)."""
    if isinstance(value, dict):
        data = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        return data.reshape([int(n) for n in str(value.get("shape", len(data))).split(",")])
    return np.asarray(value, dtype=float)


def finish_job(at: AppTest, name: str, timeout: float = 180) -> None:
    """Wait for a page's background job to end, then rerun the page as its timer would."""
    job = at.session_state["results"]["jobs"][name]
    assert job.wait(timeout), f"{name} still running after {timeout} s"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
