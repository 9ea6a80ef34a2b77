"""Loading OpenCLIP models as zero-shot classifiers (``load_model("openclip:...")``): tiny random
models saved as open_clip folders, exactly as open_clip 3.3 reads them (no CLIP weights exist
offline: docs/clip.md), every refusal as one line, the prompt templates and the cache of
the class embeddings."""

from __future__ import annotations

import json
from pathlib import Path

import open_clip
import pytest
import torch
from safetensors.torch import save_file

import hydra_core.models.zero_shot as zero_shot
from hydra_core.cache import DiskCache
from hydra_core.errors import InputError
from hydra_core.models.preprocess import describe, input_format
from hydra_core.models.zero_shot import (
    DEFAULT_TEMPLATE,
    class_words,
    describe_templates,
    folder_classes,
    prompt_templates,
    prompts,
)
from hydra_core.zoo.registry import load_model
from tests.conftest import (
    CLIP_CLASSES,
    PREPROCESS_CFG,
    clip_images,
    make_tiny_clip,
    make_tiny_zero_shot,
    save_tiny_clip,
    tiny_clip_config,
)


@pytest.fixture(autouse=True)
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def offline(monkeypatch):
    """The Hugging Face hub unreachable at once, as on the machines here (no test downloads)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.mark.parametrize(
    ("weights", "settings"),
    [
        ("open_clip_model.safetensors", {}),
        ("open_clip_pytorch_model.bin", {"layer_scale": True, "pool": "avg", "quick_gelu": True}),
    ],
)
def test_a_local_folder_gives_the_zero_shot_classifier_of_its_model(tmp_path, weights, settings):
    folder = save_tiny_clip(tmp_path / "clip", weights=weights, **settings)
    loaded = load_model(f"openclip:local-dir:{folder}", classes=CLIP_CLASSES)
    reference = make_tiny_zero_shot(CLIP_CLASSES, **settings)
    assert loaded.name == f"openclip:local-dir:{folder}"
    assert loaded.classes == CLIP_CLASSES and loaded.model.classes == CLIP_CLASSES
    assert loaded.model.templates == (DEFAULT_TEMPLATE,)
    torch.testing.assert_close(loaded.model.class_embeddings, reference.class_embeddings)
    assert float(loaded.model.logit_scale) == pytest.approx(float(reference.logit_scale))
    images = clip_images(6)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(images), reference(images), rtol=1e-5, atol=1e-5)


def test_preprocessing_is_the_folders_own(tmp_path):
    folder = save_tiny_clip(tmp_path / "clip")
    loaded = load_model(f"openclip:local-dir:{folder}", classes=CLIP_CLASSES)
    assert input_format(loaded.model) == (3, 32) == input_format(loaded.model.visual)
    spec = describe(loaded.preprocess)
    assert spec == {"size": 32, "channels": 3, **PREPROCESS_CFG}
    gray = torch.full((2, 1, 28, 28), 255, dtype=torch.uint8)
    x = loaded.preprocess(gray)  # grey images become three channels at the model's size
    expected = (1.0 - torch.tensor(PREPROCESS_CFG["mean"])) / torch.tensor(PREPROCESS_CFG["std"])
    assert x.shape == (2, 3, 32, 32)
    torch.testing.assert_close(x[0, :, 5, 5], expected)
    assert "bicubic" in loaded.details["preprocessing"]  # where open_clip's own resize differs


def test_without_a_preprocess_cfg_clip_statistics_are_used(tmp_path):
    folder = save_tiny_clip(tmp_path / "clip", preprocess_cfg={})
    spec = describe(load_model(f"openclip:local-dir:{folder}").preprocess)
    assert spec["mean"] == list(open_clip.OPENAI_DATASET_MEAN)
    assert spec["std"] == list(open_clip.OPENAI_DATASET_STD)


def test_the_default_classes_are_fashion_mnists_and_the_details_say_what_was_loaded(tmp_path):
    from hydra_core.data.fashion_mnist import CLASSES

    folder = save_tiny_clip(tmp_path / "clip")
    loaded = load_model(f"openclip:local-dir:{folder}", templates="simple")
    assert loaded.classes == CLASSES and loaded.model.class_embeddings.shape == (10, 32)
    assert loaded.details["classes"] == 10
    assert loaded.details["prompts"] == "simple: 7 templates"
    assert loaded.details["weights"].startswith("RANDOM initialisation")
    assert loaded.details["logit_scale"] == pytest.approx(1 / 0.07, rel=1e-4)
    assert "zero-shot classifier of 10 classes" in loaded.description
    honest = save_tiny_clip(tmp_path / "trained", random_weights=False)
    details = load_model(f"openclip:local-dir:{honest}").details
    assert details["weights"] == "open_clip_model.safetensors"


def test_class_embeddings_are_computed_once_and_then_read_from_the_cache(tmp_path, monkeypatch):
    folder = save_tiny_clip(tmp_path / "clip")
    first = load_model(f"openclip:local-dir:{folder}", classes=CLIP_CLASSES)
    assert len(list((DiskCache().root / "zero-shot-classes").iterdir())) == 1

    def refuse(*args, **kwargs):
        raise AssertionError("class embeddings recomputed")

    monkeypatch.setattr(zero_shot, "class_embeddings", refuse)
    again = load_model(f"openclip:local-dir:{folder}", classes=CLIP_CLASSES)
    assert torch.equal(again.model.class_embeddings, first.model.class_embeddings)
    for changed in ({"classes": CLIP_CLASSES[:3]}, {"templates": "a {label}"}):
        with pytest.raises(AssertionError, match="recomputed"):  # another key
            load_model(f"openclip:local-dir:{folder}", **{"classes": CLIP_CLASSES, **changed})
    other = save_tiny_clip(tmp_path / "other", seed=1)  # other weights, same source otherwise
    with pytest.raises(AssertionError, match="recomputed"):
        load_model(f"openclip:local-dir:{other}", classes=CLIP_CLASSES)


def test_prompt_sets_and_templates():
    assert prompt_templates() == prompt_templates("paper") == (DEFAULT_TEMPLATE,)
    openai = prompt_templates("openai")
    assert len(openai) == 80 and all("{label}" in t for t in openai)
    assert openai[0] == "a bad photo of a {label}."
    assert len(prompt_templates(["simple"])) == 7
    own = prompt_templates(["a sketch of a {label}.", "a {label}"])
    assert own == ("a sketch of a {label}.", "a {label}")
    assert prompt_templates("itap of a {label}") == ("itap of a {label}",)
    assert describe_templates(own) == "2 of your own: 'a sketch of a {label}.', 'a {label}'"
    assert describe_templates(openai) == "openai: 80 templates"
    assert prompts("golden_retriever", ["a {label}.", "{label}!"]) == [
        "a golden retriever.",
        "golden retriever!",
    ]
    assert class_words("ankle-boot") == "ankle boot" and class_words("_") == "_"


def test_the_openai_prompt_ensemble_averages_normalised_prompt_embeddings():
    clip = make_tiny_clip()
    tokenizer = open_clip.SimpleTokenizer(context_length=16)
    templates = prompt_templates("simple")
    embeddings = zero_shot.class_embeddings(clip, tokenizer, ["cat", "sea_lion"], templates)
    with torch.no_grad():
        texts = [t.replace("{label}", "sea lion") for t in templates]
        each = torch.nn.functional.normalize(clip.encode_text(tokenizer(texts)), dim=-1)
    torch.testing.assert_close(
        embeddings[1], torch.nn.functional.normalize(each.mean(0), dim=0), rtol=1e-6, atol=1e-6
    )


def test_folder_classes_are_the_sorted_sub_folders(tmp_path):
    for name in ("zebra", "ankle_boot", ".hidden", "cat"):
        (tmp_path / "set" / name).mkdir(parents=True)
    (tmp_path / "set" / "notes.txt").write_text("x")
    assert folder_classes(tmp_path / "set") == ("ankle_boot", "cat", "zebra")
    with pytest.raises(InputError, match="does not exist"):
        folder_classes(tmp_path / "nowhere")
    (tmp_path / "flat").mkdir()
    with pytest.raises(InputError, match="has no class sub-folders"):
        folder_classes(tmp_path / "flat")


@pytest.fixture
def tiny_builtin(tmp_path, monkeypatch):
    """The tiny architecture registered with open_clip as the built-in name ``hydra-tiny``, with
    one pretrained tag ``fake`` whose "download" is a local file (no network)."""
    folder = save_tiny_clip(tmp_path / "weights", quick_gelu=False)
    monkeypatch.setitem(open_clip.factory._MODEL_CONFIGS, "hydra-tiny", tiny_clip_config())
    tag = {
        "hf_hub": "nobody/fake",
        "quick_gelu": True,
        **PREPROCESS_CFG,
        "interpolation": "bilinear",
    }
    real = open_clip.get_pretrained_cfg
    monkeypatch.setattr(
        open_clip,
        "get_pretrained_cfg",
        lambda model, tag_name: (
            tag if (model, tag_name) == ("hydra-tiny", "fake") else real(model, tag_name)
        ),
    )
    monkeypatch.setattr(
        open_clip,
        "list_pretrained_tags_by_model",
        lambda model: ["fake"] if model == "hydra-tiny" else [],
    )
    monkeypatch.setattr(
        open_clip.pretrained,
        "download_pretrained",
        lambda cfg, **_: str(folder / "open_clip_model.safetensors"),
    )
    # its "hub" is that local file: the refusal of a hub name offline does not apply
    monkeypatch.setattr(zero_shot, "offline_refusal", lambda _: None)
    return folder


def test_a_pretrained_tag_brings_its_activation_and_normalisation(tiny_builtin):
    from open_clip.transformer import QuickGELU

    loaded = load_model("openclip:hydra-tiny/fake", classes=CLIP_CLASSES)
    assert loaded.name == "openclip:hydra-tiny/fake"
    assert isinstance(loaded.model.visual.transformer.resblocks[0].mlp.gelu, QuickGELU)
    spec = describe(loaded.preprocess)
    assert spec["mean"] == PREPROCESS_CFG["mean"] and spec["std"] == PREPROCESS_CFG["std"]
    assert loaded.details["weights"] == "pretrained fake (Hugging Face hub)"
    assert loaded.details["preprocessing"].endswith("as open_clip's")  # bilinear, shortest side
    state = make_tiny_clip().state_dict()
    for name, tensor in loaded.model.visual.state_dict().items():
        assert torch.equal(tensor, state[f"visual.{name}"]), name


def test_a_checkpoint_file_after_the_name(tiny_builtin):
    path = tiny_builtin / "open_clip_model.safetensors"
    loaded = load_model(f"openclip:hydra-tiny/{path}", classes=CLIP_CLASSES)
    assert loaded.details["weights"] == f"checkpoint {path}"
    other = save_tiny_clip(tiny_builtin.parent / "deep", layers=2)
    with pytest.raises(InputError, match="cannot load openclip:hydra-tiny/.*strict"):
        load_model(f"openclip:hydra-tiny/{other / 'open_clip_model.safetensors'}")


def test_no_tag_is_refused_naming_the_tags(tiny_builtin):
    with pytest.raises(InputError) as info:
        load_model("openclip:hydra-tiny")
    message = str(info.value)
    assert "random weights give no zero-shot result" in message
    assert "openclip:hydra-tiny/fake" in message and "\n" not in message


def test_an_image_tower_other_than_open_clips_vit_is_refused(tmp_path):
    from open_clip.model import CLIP

    config = tiny_clip_config()
    config["vision_cfg"] = {"layers": [1, 1, 1, 1], "width": 16, "image_size": 32}  # a ResNet
    folder = tmp_path / "resnet"
    folder.mkdir()
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": config}))
    save_file(CLIP(**config).state_dict(), str(folder / "open_clip_model.safetensors"))
    with pytest.raises(InputError, match="has a ModifiedResNet image tower: Hydra Lab prunes"):
        load_model(f"openclip:local-dir:{folder}")


def test_a_zero_shot_chance_note_speaks_of_class_names():
    from hydra_core.zoo.registry import chance_note

    note = chance_note(0.3, 3, zero_shot=True)
    assert "knows the classes only by name" in note and "--classes" not in note
    assert "--classes" in chance_note(0.3, 3) and chance_note(0.9, 3, zero_shot=True) is None


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path.parent


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("openclip:", "openclip: names no model"),
        ("openclip:ViT-B-3", "unknown open_clip model 'ViT-B-3'.*did you mean ViT-B-32"),
        ("openclip:ViT-B-32", "names no pretrained weights.*laion2b_s34b_b79k"),
        # offline, a tag is refused before open_clip is imported to check it (test below)
        ("openclip:ViT-B-32/nonsense", "cannot load openclip:ViT-B-32/nonsense: this machine is"),
        ("openclip:local-dir:{tmp}/nowhere", "is not a folder: openclip:local-dir: needs"),
        ("openclip:local-dir:{tmp}", "has no open_clip_config.json"),
        ("openclip:local-dir:{config_only}", "holds no weights"),
        ("openclip:local-dir:{no_model_cfg}", "has no 'model_cfg'"),
        ("openclip:local-dir:{bad_json}", "cannot read .* as JSON"),
        ("openclip:local-dir:{mismatch}", "cannot load openclip:local-dir:.*strict"),
        ("openclip:ViT-B-32/laion2b_s34b_b79k", "needs the network.*openclip:local-dir:/path"),
        ("openclip:hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K", "needs the network"),
    ],
)
def test_bad_sources_are_one_line_naming_the_fix(tmp_path, offline, source, message):
    folders = {
        "tmp": tmp_path,
        "config_only": write(
            tmp_path / "c" / "open_clip_config.json", json.dumps({"model_cfg": tiny_clip_config()})
        ),
        "no_model_cfg": write(tmp_path / "n" / "open_clip_config.json", "{}"),
        "bad_json": write(tmp_path / "j" / "open_clip_config.json", "{not json"),
        "mismatch": tmp_path / "m",
    }
    save_tiny_clip(folders["mismatch"])
    config = json.loads((folders["mismatch"] / "open_clip_config.json").read_text())
    config["model_cfg"]["vision_cfg"]["layers"] = 2  # the weights have 3
    (folders["mismatch"] / "open_clip_config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match=message) as info:
        load_model(source.format(**folders))
    assert "\n" not in str(info.value)


def test_a_tag_that_is_no_tag_is_named_online(monkeypatch):
    monkeypatch.setattr(zero_shot, "offline_refusal", lambda _: None)  # as online
    with pytest.raises(InputError, match="'nonsense' is neither a pretrained tag.*laion2b_s34b"):
        load_model("openclip:ViT-B-32/nonsense")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"templates": "A photo."}, r"has no \{label\}"),
        ({"templates": []}, "no prompt templates given"),
        ({"classes": []}, "needs at least two classes, got 0"),
        ({"classes": ["cat"]}, r"needs at least two classes, got 1 \(cat\)"),
        ({"arch": "vit_tiny_patch16_224"}, "do not apply to openclip:"),
    ],
)
def test_bad_options_are_refused_before_loading(tmp_path, kwargs, message):
    folder = save_tiny_clip(tmp_path / "clip")
    with pytest.raises(InputError, match=message):
        load_model(f"openclip:local-dir:{folder}", **kwargs)


@pytest.mark.parametrize("kwargs", [{"templates": "openai"}, {"classes": ["a", "b"]}])
def test_prompts_and_classes_are_refused_on_other_models(kwargs):
    with pytest.raises(InputError, match="apply to zero-shot OpenCLIP models"):
        load_model("default", **kwargs)


@pytest.mark.parametrize("templates", ["paper", "simple"])
def test_zero_shot_logits_equal_open_clips_own_computation(templates):
    """Our classifier against open_clip's own zero-shot recipe: ``encode_image`` and the class
    weights of ``open_clip.build_zero_shot_classifier`` (prompt ensembling), normalised, times
    ``logit_scale.exp()``."""
    from hydra_core.models.zero_shot import zero_shot_classifier

    clip = make_tiny_clip(layer_scale=True)
    tokenizer = open_clip.SimpleTokenizer(context_length=16)
    chosen = prompt_templates(templates)
    ours = zero_shot_classifier(clip, tokenizer, CLIP_CLASSES, chosen)
    x = clip_images(5)
    with torch.no_grad():
        weights = open_clip.build_zero_shot_classifier(
            clip,
            tokenizer=tokenizer,
            classnames=CLIP_CLASSES,
            templates=[lambda c, t=t: t.replace("{label}", c) for t in chosen],
            num_classes_per_batch=2,
            device="cpu",
            use_tqdm=False,
        )  # (D, C)
        image = clip.encode_image(x, normalize=True)
        expected = clip.logit_scale.exp() * image @ weights
        got = ours(x)
    assert torch.allclose(got, expected, atol=1e-5)


def test_random_weights_are_declared_without_loading(tmp_path):
    """The app's sidebar says so on every page: read from open_clip_config.json alone."""
    from hydra_core.models.zero_shot import declares_random_weights

    random = save_tiny_clip(tmp_path / "random")
    honest = save_tiny_clip(tmp_path / "honest", random_weights=False)
    assert declares_random_weights(f"openclip:local-dir:{random}")
    assert not declares_random_weights(f"openclip:local-dir:{honest}")
    assert not declares_random_weights(f"openclip:local-dir:{tmp_path / 'missing'}")
    assert not declares_random_weights("openclip:ViT-B-32/laion2b_s34b_b79k")
    assert not declares_random_weights("default")
