"""A hub model name offline is refused from its name, before the seconds of importing torch, timm
or open_clip (issue 39, item 7), unless a local cache may hold its weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hydra_core import hub

ROOT = Path(__file__).resolve().parents[1]
TIMM = "timm:vit_small_patch16_224"
OPENCLIP = "openclip:ViT-B-32/laion2b_s34b_b79k"

#: runs the command line's entry point in a fresh interpreter and says what it imported
ENTRY = """
import json, sys
import hydra_core.__main__ as entry
sys.argv = ["hydra_core", *sys.argv[1:]]
try:
    entry.run()
except SystemExit as stop:
    code = stop.code
print(json.dumps({"code": code, **{m: m in sys.modules for m in ("torch", "timm", "open_clip")}}))
"""


@pytest.fixture
def empty_caches(tmp_path, monkeypatch):
    """Empty Hugging Face and torch download caches (for this process and its children)."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    return tmp_path


@pytest.fixture
def no_network(monkeypatch):
    """The quick check finds no hub (its offline mode off): returns the connection attempts."""
    import huggingface_hub.constants

    from tests.conftest import block_network

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    return block_network(monkeypatch)


@pytest.mark.parametrize(
    "model, what",
    [(TIMM, "timm model 'vit_small_patch16_224'"), (OPENCLIP, OPENCLIP)],
)
def test_the_command_line_refuses_before_importing_torch(empty_caches, model, what):
    """``python -m hydra_core`` offline (the hub's offline mode, as a user sets it): exit 2 with
    one line, and neither torch nor timm nor open_clip was imported."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", ENTRY, "eval", "--model", model],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"code": 2, "torch": False, "timm": False, "open_clip": False}, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot load {what}: ")
    assert "this machine is offline (HF_HUB_OFFLINE is set)" in lines[0]
    assert "offline, " in lines[0]  # what to use instead


def test_load_model_refuses_an_openclip_tag_before_importing_open_clip(empty_caches):
    """What the app calls: load_model offline says the line before open_clip is imported."""
    code = (
        "import sys\n"
        "from hydra_core.errors import InputError\n"
        "from hydra_core.zoo.registry import load_model\n"
        "try:\n"
        f"    load_model({OPENCLIP!r})\n"
        "except InputError as exc:\n"
        "    print('open_clip' in sys.modules, str(exc))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )
    imported, _, line = done.stdout.strip().partition(" ")
    assert imported == "False" and line.startswith(f"cannot load {OPENCLIP}: "), done.stderr
    assert "this machine is offline (HF_HUB_OFFLINE is set)" in line


def test_the_early_line_is_the_loaders_line(empty_caches, no_network, monkeypatch):
    """Said before timm builds the model and before open_clip is imported, the refusal is word
    for word what the loaders say after (when the hub's cache is asked for the weights)."""
    from hydra_core.errors import InputError
    from hydra_core.models import zero_shot
    from hydra_core.zoo import registry

    for model in (TIMM, OPENCLIP):
        with pytest.raises(InputError) as early:
            registry.load_model(model)
        with monkeypatch.context() as patch:
            for module in (registry, zero_shot):
                patch.setattr(module, "offline_refusal", lambda _: None)
            with pytest.raises(InputError) as late:
                registry.load_model(model)
        assert str(early.value) == str(late.value) == hub.offline_refusal(model)
    # a timm name is checked first, with timm (imported already by the loaders)
    with pytest.raises(InputError, match="did you mean"):
        registry.load_model("vit_tiny_patch16_2244")


def test_what_reads_as_a_hub_name(tmp_path):
    assert hub.hub_model("vit_small_patch16_224") == ("timm", "vit_small_patch16_224")
    assert hub.hub_model("timm:vit_base_patch16_224.augreg_in21k") == (
        "timm",
        "vit_base_patch16_224.augreg_in21k",
    )
    assert hub.hub_model(OPENCLIP) == ("clip-tag", "ViT-B-32/laion2b_s34b_b79k")
    assert hub.hub_model("openclip:hf-hub:laion/CLIP-ViT-B-32") == (
        "clip-repo",
        "laion/CLIP-ViT-B-32",
    )
    assert hub.hub_model("hf:textattack/bert-base-uncased-SST-2") == (
        "hf-repo",
        "textattack/bert-base-uncased-SST-2",
    )
    weights = tmp_path / "w.pt"
    weights.write_bytes(b"")
    local = [
        "openclip:local-dir:/some/folder",
        "openclip:ViT-B-32",  # no tag: open_clip's own message names the tags
        f"openclip:ViT-B-32/{weights}",  # a checkpoint file after the name
        "models/tiny.safetensors",
        "missing.safetensors",  # a file name that is not here, not a timm name with a tag
        "./my_model",
        "bert-base-uncased",  # a text model's hub name; the HF loader asks the hub
    ]
    for name in local:
        assert hub.hub_model(name) is None, name


def test_built_in_names_are_never_refused(no_network):
    from hydra_core.zoo.named import named_models

    for name in (n for m in named_models() for n in m.names):  # every record's names and aliases
        assert hub.offline_refusal(name) is None, name
    assert not no_network  # not even a connection was tried


def test_cached_weights_leave_the_decision_to_the_loaders(empty_caches, no_network):
    repos = empty_caches / "hub"
    assert hub.offline_refusal(TIMM) is not None
    (repos / "models--timm--vit_small_patch16_224.augreg_in21k_ft_in1k").mkdir(parents=True)
    assert hub.offline_refusal(TIMM) is None
    assert hub.offline_refusal(OPENCLIP) is None  # timm's repositories hold OpenCLIP tags too
    (repos / "models--timm--vit_small_patch16_224.augreg_in21k_ft_in1k").rmdir()
    (repos / "models--laion--CLIP-ViT-B-32-laion2B-s34B-b79K").mkdir()
    assert hub.offline_refusal(OPENCLIP) is None
    assert hub.offline_refusal("openclip:hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K") is None
    assert hub.offline_refusal("openclip:hf-hub:laion/other") is not None
    assert hub.offline_refusal(TIMM) is not None
    checkpoints = empty_caches / "torch" / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "jx_vit_base_p16_224-80ecf9dd.pth").write_bytes(b"")  # a URL download
    assert hub.offline_refusal(TIMM) is None


def test_the_owners_cover_every_pretrained_weight_of_timm_and_open_clip():
    """Where a timm name's or an OpenCLIP tag's weights are in the cache, the name is never
    refused early: checked against every pretrained configuration of the installed versions."""
    import open_clip
    import timm
    from timm.models import get_pretrained_cfg

    assert all(hub.hub_model(name) == ("timm", name) for name in timm.list_models())
    missed = []
    for name in timm.list_pretrained():
        repo = getattr(get_pretrained_cfg(name), "hf_hub_id", None)
        if repo and not hub.timm_may_be_cached({repo}):
            missed.append((name, repo))
    for name, tag in open_clip.list_pretrained():
        repo = open_clip.get_pretrained_cfg(name, tag).get("hf_hub", "").rstrip("/")
        if repo and not hub.openclip_may_be_cached({repo}):
            missed.append((f"{name}/{tag}", repo))
    assert not missed, missed[:10]
