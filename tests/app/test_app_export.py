"""The pages' exports for other tools, driven with Streamlit's AppTest on an image, a text and a
zero-shot CLIP model (tiny, random): the Masks page offers the members for nnsight and as plain
JSON (nnsight refused, saying why, on OpenCLIP), and the Hydra page's ONNX export runs under
onnxruntime with the fused model's member logits; an export that fails is one line."""

from __future__ import annotations

import csv
import random

import numpy as np
import pytest
import torch
from PIL import Image
from streamlit.testing.v1 import AppTest

from hydra_core.export.onnx import example_inputs, onnx_session, read_description, run_onnx
from hydra_core.hydra.layers import ACTIVATIONS_INPLACE
from hydra_core.masks import MemberMask
from hydra_ui.context import SetupConfig
from tests.app.conftest import button, finish_job, open_page
from tests.conftest import make_tiny_text, save_tiny_clip, write_tiny_checkpoint

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "film", "a", "very", "is"]
CLASSES = ("neg", "pos", "mixed")
FAMILIES = ("image", "text", "clip")


def image_setup(root) -> SetupConfig:
    checkpoint = write_tiny_checkpoint(root / "tiny.safetensors")
    return SetupConfig(model=checkpoint, ood=("noise",), n_search=24, n_report=24, device="cpu")


def text_setup(root) -> SetupConfig:
    """A tiny BERT folder, a labelled ID CSV and near/search OOD CSVs of the vocabulary's words."""
    import transformers

    model = make_tiny_text("bert")
    model.config.id2label = dict(enumerate(CLASSES))
    model.config.label2id = {c: i for i, c in enumerate(CLASSES)}
    model.save_pretrained(root / "model")
    vocab = {w: i for i, w in enumerate(WORDS)}
    transformers.BertTokenizer(vocab=vocab).save_pretrained(root / "model")
    rng = random.Random(0)

    def write(name: str, header: list[str], count: int, labelled: bool) -> str:
        with open(root / name, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            for i in range(count):
                text = " ".join(rng.choices(WORDS[5:], k=rng.randint(2, 9)))
                writer.writerow([text, CLASSES[i % 3]] if labelled else [text])
        return str(root / name)

    return SetupConfig(
        model=str(root / "model"),
        id_source=write("id.csv", ["text", "label"], 48, True),
        ood_sources=(
            f"near: {write('near.csv', ['text'], 24, False)}",
            f"search: {write('search.csv', ['text'], 24, False)}",
        ),
        ood=(),
        search_ood=(),
        n_search=12,
        n_report=16,
        device="cpu",
    )


def clip_setup(root) -> SetupConfig:
    """A tiny OpenCLIP folder, an ID folder of three classes and near/search OOD folders."""
    save_tiny_clip(root / "model")
    rng = np.random.default_rng(0)
    counts = {"pets/cat": 12, "pets/dog": 12, "pets/ship": 12, "toys": 12, "street": 12}
    for folder, count in counts.items():
        (root / folder).mkdir(parents=True)
        for i in range(count):
            pixels = rng.integers(0, 256, (36, 36, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / folder / f"{i}.png")
    return SetupConfig(
        model=f"openclip:local-dir:{root / 'model'}",
        id_source=str(root / "pets"),
        ood_sources=(f"near: {root / 'toys'}", f"search: {root / 'street'}"),
        ood=(),
        search_ood=(),
        n_search=8,
        n_report=12,
        device="cpu",
    )


#: each family's setup, and its model's heads per layer (the tiny OpenCLIP model: 3 image-tower
#: layers of 4 heads and 1 text-tower layer of 2, both towers pruned by default)
SETUPS = {
    "image": (image_setup, (4, 4)),
    "text": (text_setup, (4, 4)),
    "clip": (clip_setup, (4, 4, 4, 2)),
}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory) -> tuple[SetupConfig, tuple[int, ...]]:
    make, layers = SETUPS[request.param]
    return make(tmp_path_factory.mktemp(request.param)), layers


@pytest.fixture
def setup(family) -> SetupConfig:
    return family[0]


@pytest.fixture
def app(family, make_app) -> AppTest:
    """The app on the family's setup, with two members: "a" drops L0H0, "b" heads 2-3 of L1."""
    setup, heads = family
    at = make_app(setup)
    every = torch.tensor([[h < n for h in range(max(heads))] for n in heads])  # (L, H_max)
    first, second = every.clone(), every.clone()
    first[0, 0], second[1, 2:] = False, False
    members = [MemberMask("a", "test", first), MemberMask("b", "test", second)]
    at.session_state["results"] = {"_setup": setup.key, "jobs": {}, "members": members}
    return at


def downloads(at: AppTest) -> list[str]:
    return [d.proto.label for d in at.get("download_button")]


def test_masks_page_offers_the_members_for_nnsight_and_as_plain_json(app, setup):
    open_page(app, "pages/5_masks.py")
    assert not app.error, [e.value for e in app.error]
    labels = downloads(app)
    assert "Plain JSON {layer: [heads kept]}" in labels
    openclip = setup.model.startswith("openclip:")
    assert ("For nnsight (Python module)" in labels) is not openclip
    if openclip:  # nnsight cannot reach W_O inside nn.MultiheadAttention: the page says why
        assert any("nnsight: nnsight cannot switch heads off" in c.value for c in app.caption)


def test_hydra_page_exports_onnx_with_the_fused_member_logits(app, monkeypatch, tmp_path):
    open_page(app, "pages/6_hydra.py")
    for label in ("Measure latency", "Temperature scaling", "MC Dropout"):
        next(c for c in app.checkbox if c.label == label).uncheck()
    button(app, "Assemble and evaluate").click()
    app.run()
    finish_job(app, "hydra")
    assert not app.error, [e.value for e in app.error]
    report, used = app.session_state["results"]["hydra"]
    hydra = report.info[report.find(report.setup["label"], "fused")].models[0]

    from tests.export.test_export_onnx import _softsign

    with monkeypatch.context() as patch:  # an operator ONNX has no form: one line, no file
        patch.setitem(ACTIVATIONS_INPLACE, "gelu", _softsign)
        patch.setitem(ACTIVATIONS_INPLACE, "quick_gelu", _softsign)
        button(app, "Export as ONNX").click()
        app.run()
    assert not app.exception
    errors = [e.value for e in app.error]
    assert len(errors) == 1 and errors[0].startswith("cannot export to ONNX: the operator")
    assert "Fused model (ONNX)" not in downloads(app)

    button(app, "Export as ONNX").click()
    app.run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    assert "Fused model (ONNX)" in downloads(app)
    assert any("onnxruntime vs torch: max |difference|" in c.value for c in app.caption)
    onnx_file = tmp_path / "hydra.onnx"  # the bytes the download button hands out
    onnx_file.write_bytes(app.session_state["results"]["onnx"]["bytes"])
    assert read_description(onnx_file)["members"] == used == ["a", "b"]
    inputs = example_inputs(hydra, batch=5, tokens=7, seed=3)
    logits, _ = run_onnx(onnx_session(onnx_file), inputs)
    with torch.no_grad():
        if len(inputs) == 2:
            expected = hydra(input_ids=inputs[0], attention_mask=inputs[1])
        else:
            expected = hydra(*inputs)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
