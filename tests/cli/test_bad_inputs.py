"""A user's own files and options, wrong in the ways users get them wrong: each case ends in one
line that names the input and the fix (exit code 2), or a warning, never in a traceback or a
silently wrong number. The table in docs/bad-inputs.md lists these cases."""

from __future__ import annotations

import json

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import save_file

from hydra_core.cli import STOPPED, main
from hydra_core.errors import InputError
from hydra_core.zoo.default import save_checkpoint
from hydra_core.zoo.registry import load_model

DATA = ["--n-search", "16", "--n-report", "24", "--ood", "noise", "--device", "cpu"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))


def run(capsys, *argv: str) -> tuple[int, str]:
    """Exit code and stderr of one command (its stdout stays in ``run.out``)."""
    code = main(list(argv))
    captured = capsys.readouterr()
    run.out = captured.out
    return code, captured.err


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def save_state(model: torch.nn.Module, path) -> str:
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return str(path)


def tiny_timm_vit(**kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        **{"img_size": 32, "patch_size": 8, "depth": 2, "num_classes": 10, **kwargs},
    ).eval()


TINY_KWARGS = '{"img_size": 32, "patch_size": 8, "depth": 2}'


# --- model files --------------------------------------------------------------------------------


def test_vit_without_classifier_is_refused(tmp_path, capsys):
    path = save_state(tiny_timm_vit(num_classes=0), tmp_path / "features.safetensors")
    code, err = run(
        capsys, "eval", "--model", path, "--arch", "vit_tiny_patch16_224",
        "--arch-kwargs", TINY_KWARGS, *DATA,
    )  # fmt: skip
    assert code == 2
    assert "has no classifier" in one_error_line(err) and path in err


def test_model_outputs_must_be_the_id_classes(tmp_path, capsys):
    path = save_state(tiny_timm_vit(num_classes=7), tmp_path / "seven.safetensors")
    code, err = run(
        capsys, "eval", "--model", path, "--arch", "vit_tiny_patch16_224",
        "--arch-kwargs", TINY_KWARGS, *DATA,
    )  # fmt: skip
    assert code == 2
    assert "has 7 outputs but the ID set 'fashion_mnist'" in one_error_line(err)


@pytest.mark.parametrize(
    "content, suffix, expected",
    [
        (b"\xff" * 1000, ".safetensors", "not a valid safetensors file"),
        (b"not a pickle" * 20, ".pt", "never pickled code"),
    ],
)
def test_garbage_file_is_named(tmp_path, capsys, content, suffix, expected):
    path = tmp_path / f"garbage{suffix}"
    path.write_bytes(content)
    code, err = run(capsys, "eval", "--model", str(path), "--arch", "vit_tiny_patch16_224", *DATA)
    line = one_error_line(err)
    assert code == 2 and expected in line and str(path) in line
    assert "weights_only=False" not in err  # never advise unpickling an untrusted file


def test_not_a_vit_state_dict(tmp_path, capsys):
    path = save_state(timm.create_model("resnet18", num_classes=10), tmp_path / "r18.safetensors")
    code, err = run(capsys, "eval", "--model", path, "--arch", "resnet18", *DATA)
    assert code == 2 and "is not a timm ViT state dict" in one_error_line(err)


def test_wrong_architecture_size_says_the_width(tmp_path, capsys):
    path = save_state(tiny_timm_vit(embed_dim=96, num_heads=3), tmp_path / "w96.safetensors")
    code, err = run(
        capsys, "eval", "--model", path, "--arch", "vit_tiny_patch16_224",
        "--arch-kwargs", TINY_KWARGS, *DATA,
    )  # fmt: skip
    line = one_error_line(err)
    assert code == 2 and "tensors differ in shape" in line and "width 96" in line
    assert "size mismatch" not in err  # not torch's table


def test_bad_arch_kwargs(tmp_path, capsys):
    path = save_state(tiny_timm_vit(), tmp_path / "t.safetensors")
    code, err = run(
        capsys, "eval", "--model", path, "--arch", "vit_tiny_patch16_224",
        "--arch-kwargs", "{img_size: 32}", *DATA,
    )  # fmt: skip
    assert code == 2 and "is not JSON" in one_error_line(err)


def test_debug_shows_the_traceback(tmp_path):
    path = tmp_path / "garbage.safetensors"
    path.write_bytes(b"\xff" * 100)
    with pytest.raises(InputError, match="not a valid safetensors file"):
        main(["eval", "--model", str(path), "--arch", "vit_tiny_patch16_224", "--debug", *DATA])


def test_ctrl_c_says_progress_is_saved(monkeypatch, capsys, checkpoint):
    import hydra_core.evaluate

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(hydra_core.evaluate, "evaluate_model", interrupted)
    code, err = run(capsys, "eval", "--model", checkpoint, *DATA)
    assert code == 130
    assert err.strip() == STOPPED


# --- a ViT of one's own configuration, loaded both ways -----------------------------------------


CUSTOM = dict(img_size=32, patch_size=8, in_chans=3, depth=2, init_values=1e-2, global_pool="avg")


def test_custom_vit_by_name_and_arch_kwargs(tmp_path):
    model = tiny_timm_vit(**CUSTOM)
    path = save_state(model, tmp_path / "custom.safetensors")
    loaded = load_model(
        path, arch="vit_tiny_patch16_224", arch_kwargs={k: v for k, v in CUSTOM.items()}
    )
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    x = loaded.preprocess(images)
    assert x.shape == (4, 3, 32, 32)  # the model's own size, not the 224 of the name
    with torch.no_grad():
        assert torch.equal(loaded.model(x), model(x))


def test_checkpoint_carrying_its_config_loads_with_no_flags(tmp_path):
    model = tiny_timm_vit(**CUSTOM)
    arch = {**CUSTOM, "num_classes": 10, "embed_dim": 192, "num_heads": 3}
    path = tmp_path / "own.safetensors"
    save_checkpoint(
        model, path, arch, preprocess={"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.2, 0.2]},
        classes=[f"c{i}" for i in range(10)],
    )  # fmt: skip
    loaded = load_model(str(path))
    assert loaded.classes == tuple(f"c{i}" for i in range(10))
    images = torch.full((2, 1, 20, 20), 255, dtype=torch.uint8)  # grey, another size
    x = loaded.preprocess(images)
    assert x.shape == (2, 3, 32, 32)
    assert torch.allclose(x[0, :, 0, 0], torch.tensor([2.5, 3.0, 3.5]))  # (1 - mean) / std
    with torch.no_grad():
        assert torch.equal(loaded.model(x), model(x))


def test_custom_config_on_the_command_line(tmp_path, capsys):
    model = tiny_timm_vit(**{**CUSTOM, "in_chans": 1})
    path = tmp_path / "own.safetensors"
    save_checkpoint(model, path, {**CUSTOM, "in_chans": 1, "num_classes": 10, "embed_dim": 192,
                                  "num_heads": 3})  # fmt: skip
    assert main(["eval", "--model", str(path), *DATA, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"]["layers"] == 2 and out["id"]["n"] == 24


# --- ID folders ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def numbered_folder(tmp_path_factory):
    """Fashion-MNIST test images in class folders c1 ... c10 (c1 = class 0)."""
    from hydra_core.data.fashion_mnist import load_fashion_mnist

    root = tmp_path_factory.mktemp("numbered")
    test = load_fashion_mnist("test")
    for label in range(10):
        folder = root / f"c{label + 1}"
        folder.mkdir()
        for i in (test.labels == label).nonzero().flatten()[:6].tolist():
            Image.fromarray(test.images[i, 0].numpy()).save(folder / f"{i}.png")
    return root


def test_numbered_class_folders_out_of_order_warn(numbered_folder, capsys):
    code, err = run(capsys, "info", "--id-folder", str(numbered_folder), *DATA[:4], "--ood",
                    "noise", "--n-report", "30")  # fmt: skip
    assert code == 0
    assert "not in number order (c1, c2, c3, ...)" in err and "--classes" in err


def test_explicit_class_order(numbered_folder, capsys):
    order = ",".join(f"c{i}" for i in range(1, 11))
    code, err = run(capsys, "info", "--id-folder", str(numbered_folder), "--classes", order,
                    *DATA, "--json")  # fmt: skip
    assert code == 0 and "number order" not in err
    assert json.loads(run.out)["id_accuracy"] > 0.5  # in text order it is near chance


def test_unknown_class_folder_is_an_error(numbered_folder, capsys):
    code, err = run(capsys, "info", "--id-folder", str(numbered_folder), "--classes", "c1,c2",
                    *DATA)  # fmt: skip
    assert code == 2 and "are not among the classes given" in one_error_line(err)


def test_folder_with_fewer_classes_warns(tmp_path, capsys):
    for name in ("a", "b"):
        (tmp_path / "two" / name).mkdir(parents=True)
        for i in range(4):
            pixels = np.full((28, 28), 40 * i, dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "two" / name / f"{i}.png")
    code, err = run(capsys, "info", "--id-folder", str(tmp_path / "two"), *DATA)
    assert code == 0 and "has 2 classes and fmnist-vit-default 10 outputs" in err


# --- mask files ---------------------------------------------------------------------------------


def mask_file(tmp_path, checkpoint, members: list[dict]) -> str:
    """A mask file for the tiny checkpoint (2 layers x 4 heads) with these members."""
    loaded = load_model(checkpoint)
    path = tmp_path / "masks.json"
    path.write_text(
        json.dumps(
            {"format": "hydra-masks", "version": 1, "model": loaded.identity(), "members": members}
        )
    )
    return str(path)


def test_mask_member_omitting_a_layer_is_an_error(tmp_path, checkpoint, capsys):
    masks = mask_file(
        tmp_path,
        checkpoint,
        [{"name": "a", "keep": {"0": [0, 1]}}, {"name": "b", "keep": {"0": [2], "1": [3]}}],
    )
    code, err = run(capsys, "hydra", "--model", checkpoint, "--masks", masks, *DATA)
    line = one_error_line(err)
    assert code == 2 and "member 'a': layer(s) 1 missing from 'keep'" in line and "[]" in line


def test_explicitly_empty_layer_is_accepted(tmp_path, checkpoint):
    from hydra_core.masks import load_masks
    from hydra_core.models.adapter import head_layout

    masks = mask_file(tmp_path, checkpoint, [{"name": "a", "keep": {"0": [0, 1], "1": []}}])
    layout = head_layout(load_model(checkpoint).model)
    (member,) = load_masks(masks, layout)
    assert member.keep.sum() == 2 and not member.keep[1].any()


def test_duplicate_members_are_refused_by_hydra(tmp_path, checkpoint, capsys):
    keep = {"0": [0, 1], "1": [2]}
    masks = mask_file(
        tmp_path, checkpoint, [{"name": "a", "keep": keep}, {"name": "b", "keep": keep}]
    )
    code, err = run(capsys, "hydra", "--model", checkpoint, "--masks", masks, *DATA)
    assert code == 2 and "members 'a' and 'b' keep the same heads" in one_error_line(err)


# --- searches -----------------------------------------------------------------------------------


SEARCH = ["search", "--objective", "acc", "--n-search", "16", "--ood", "noise", "--device", "cpu"]


def test_budget_must_leave_a_head(tmp_path, checkpoint, capsys):
    code, err = run(capsys, *SEARCH, "--model", checkpoint, "--budget", "8", "--out",
                    str(tmp_path))  # fmt: skip
    line = one_error_line(err)
    assert code == 2 and "--budget must be between 1 and 7" in line and "at least one" in line
    assert not list(tmp_path.glob("*masks.json"))  # nothing written that `hydra` would refuse


def test_starting_over_keeps_a_longer_finished_search(tmp_path, checkpoint, capsys, monkeypatch):
    from hydra_core.analysis import greedy

    out = ["--model", checkpoint, "--out", str(tmp_path)]
    assert main([*SEARCH, *out, "--budget", "5"]) == 0
    capsys.readouterr()
    code, err = run(capsys, *SEARCH, *out, "--budget", "2", "--no-resume")
    assert code == 0 and "the saved 5-step search is kept" in err

    def no_search(*args, **kwargs):
        raise AssertionError("the 5-step search should have come from the cache")

    monkeypatch.setattr(greedy, "_search", no_search)
    code, err = run(capsys, *SEARCH, *out, "--budget", "5")
    assert code == 0 and "the saved search has 5 steps" in err


def test_a_resumed_search_says_where(tmp_path, checkpoint, capsys):
    out = ["--model", checkpoint, "--out", str(tmp_path)]
    assert main([*SEARCH, *out, "--budget", "2"]) == 0
    capsys.readouterr()
    code, err = run(capsys, *SEARCH, *out, "--budget", "4")
    assert code == 0 and "resumed at step 2 of 4" in err
    steps = json.loads((tmp_path / "greedy_acc.json").read_text())["order"]
    assert len(steps) == 4


# --- files written at once, options every command takes ---------------------------------------


def test_concurrent_saves_of_one_path_never_collide(tmp_path):
    """Two writers of the same file (two CLI processes saving the same masks): each writes its
    own temporary file, so every save succeeds and the file is always one whole version."""
    from concurrent.futures import ThreadPoolExecutor

    from hydra_core.files import atomic_write

    path = tmp_path / "shared.json"
    versions = [json.dumps({"writer": i, "pad": "x" * 200_000}) for i in range(8)]

    def save(text: str) -> None:
        for _ in range(5):
            atomic_write(path, lambda tmp, text=text: tmp.write_text(text))
            assert path.read_text() in versions  # never a torn or truncated file

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(save, versions))
    assert path.read_text() in versions
    assert not list(tmp_path.glob("*.tmp"))  # no temporary file left behind


@pytest.mark.parametrize("command", ["info", "search", "importance", "masks", "hydra", "report"])
def test_every_command_takes_threads_and_cache_dir(command, tmp_path):
    from hydra_core.cli import build_parser

    cache = str(
        tmp_path / "cache"
    )  # a folder yet to be made (never a fixed path: /tmp/x may be a file)
    args = build_parser().parse_args(
        [command, "--threads", "1", "--cache-dir", cache, "--debug"]
        + (["--masks", "m.json"] if command == "hydra" else [])
    )
    assert (args.threads, args.cache_dir, args.debug) == (1, cache, True)


def test_cache_dir_is_where_results_go(tmp_path, checkpoint, capsys, monkeypatch):
    monkeypatch.delenv("HYDRA_LAB_CACHE")
    assert main(["eval", "--model", checkpoint, *DATA, "--cache-dir", str(tmp_path / "c")]) == 0
    assert list((tmp_path / "c" / "predictions").glob("*.pt"))


# --- the app ------------------------------------------------------------------------------------


def test_setup_refuses_a_model_that_cannot_be_fused(tmp_path, monkeypatch):
    from hydra_ui.context import CONFIG_KEY, SetupConfig
    from tests.app.conftest import new_app

    arch = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=24, depth=2,
                num_heads=4, dynamic_img_size=True)  # fmt: skip
    torch.manual_seed(0)
    path = tmp_path / "dynamic.safetensors"
    save_checkpoint(timm.models.vision_transformer.VisionTransformer(**arch), path, arch)
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))
    app = new_app(SetupConfig(n_search=32, n_report=64))
    app.run()
    app.radio[0].set_value("Checkpoint file")
    app.run()  # the source's own fields appear
    app.text_input(key="setup_model_name").set_value(str(path))
    app.button[0].click()
    app.run()
    assert not app.exception
    assert any("cannot be fused: dynamic image sizes" in e.value for e in app.error)
    assert app.session_state[CONFIG_KEY].model == "default"  # the setup was not applied


# --- issue 25, cause 6: every option checked by the parser ---------------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        (["eval", "--threads", "0"], "argument --threads: must be at least 1, got 0"),
        (["eval", "--threads", "-1"], "argument --threads: must be at least 1, got -1"),
        (["eval", "--batch-size", "0"], "argument --batch-size: must be at least 1, got 0"),
        (["eval", "--n-report", "-3"], "argument --n-report: must be at least 1, got -3"),
        (["eval", "--device", "tpu"], "argument --device: 'tpu' is not a device Hydra Lab runs on; "
         "choose auto, cpu, cuda or cuda:N"),
        (["eval", "--cache-dir", "{file}"], "argument --cache-dir: {file} is a file, not a folder"),
        (["eval", "--cache-dir", "{file}/cache"], "argument --cache-dir: {file} is a file, so"),
        (["search", "--budget", "0"], "argument --budget: must be at least 1, got 0"),
        (["search", "--batch-size", "x"], "argument --batch-size: must be a whole number, got 'x'"),
        (["masks", "--m", "0"], "argument --m: must be at least 1, got 0"),
        (["masks", "--seeds", "1", "-2"], "argument --seeds: must be at least 0, got -2"),
        (["hydra", "--masks", "m.json", "--mc-passes", "0"], "argument --mc-passes: must be at"),
        (["hydra", "--masks", "m.json", "--ft-lr", "0"], "argument --ft-lr: must be above 0"),
        (["hydra", "--masks", "m.json", "--ft-label-smoothing", "1"], "must be at least 0 and "
         "below 1, got 1"),
        (["represent", "--n-images", "0"], "argument --n-images: must be at least 1, got 0"),
        (["cahp", "--k-step", "0"], "argument --k-step: must be at least 1, got 0"),
        (["train-ensemble", "--epochs", "0"], "argument --epochs: must be at least 1, got 0"),
        (["evaluate"], "argument COMMAND: invalid choice: 'evaluate'"),
    ],
)  # fmt: skip
def test_every_option_is_checked_by_the_parser(tmp_path, monkeypatch, capsys, argv, message):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.chdir(tmp_path)
    file = str(tmp_path / "file")
    before = sorted(p.name for p in tmp_path.iterdir())
    code, err = run(capsys, *(a.format(file=file) for a in argv))
    assert code == 2 and message.format(file=file) in one_error_line(err)
    assert "usage:" not in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_represent_refuses_layers_and_heads_the_model_lacks(checkpoint, tmp_path, capsys):
    out = ["--out", str(tmp_path / "rep")]
    code, err = run(capsys, "represent", "--model", checkpoint, *DATA, "--layer", "5", *out)
    assert code == 2 and "--layer 5 does not exist: file:tiny.safetensors has layers 0..1" in (
        one_error_line(err)
    )
    code, err = run(capsys, "represent", "--model", checkpoint, *DATA, "--heads", "H3", *out)
    assert code == 2 and "--heads 'H3' is not a head label" in one_error_line(err)


def _message_strings() -> dict[str, set[str]]:
    """Every ``--flag`` that a string of hydra_core names (docstrings left out: they document the
    code), by flag, with the files naming it."""
    import ast
    import re
    from pathlib import Path

    import hydra_core

    found: dict[str, set[str]] = {}
    for path in Path(hydra_core.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
                continue
            if id(node) in docstrings:
                continue
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]", node.value):
                found.setdefault(flag, set()).add(path.name)
    return found


#: options of the other commands messages tell the user to run
OTHER_TOOLS_OPTIONS = {
    "--no-deps": "pip install, for the data wheels",
    "--force-reinstall": "pip install, for a corrupt wheel",
    "--nproc-per-node": "torchrun",
    "--standalone": "torchrun, one machine",
}


def test_no_message_suggests_an_option_that_does_not_exist():
    import argparse

    from hydra_core.cli import build_parser

    options = set()

    def collect(parser: argparse.ArgumentParser) -> None:
        """Every option of ``parser`` and of its sub-commands, at any depth."""
        for action in parser._actions:
            options.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    collect(sub)

    collect(build_parser())
    named = _message_strings()
    assert "--allow-other-weights" in named  # the mask-mismatch message names a real flag
    missing = {
        flag: files
        for flag, files in named.items()
        if flag not in options and flag not in OTHER_TOOLS_OPTIONS
    }
    assert not missing, f"messages name options no command has: {missing}"


# --- cause 7: hub names offline ------------------------------------------------------------------


@pytest.mark.parametrize(
    "model, what",
    [
        ("hf:textattack/bert-base-uncased-SST-2", "Hugging Face model"),
        ("vit_small_patch16_224", "timm model 'vit_small_patch16_224'"),
        ("openclip:ViT-B-32/laion2b_s34b_b79k", "openclip:ViT-B-32/laion2b_s34b_b79k"),
    ],
)
def test_hub_names_offline_are_one_line_at_once(monkeypatch, capsys, model, what):
    import huggingface_hub.constants

    from tests.conftest import block_network

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    attempts = block_network(monkeypatch)
    code, err = run(capsys, "eval", "--model", model, *DATA)
    line = one_error_line(err)
    assert (
        code == 2 and f"cannot load {what}" in line and "huggingface.co cannot be reached" in line
    )
    assert "offline, " in line and len(err.strip().splitlines()) == 1  # no retry logs
    assert len(attempts) == 1  # one quick check, no retries


def test_a_text_hub_name_offline_is_refused_before_the_imports(monkeypatch, capsys, tmp_path):
    """``python -m hydra_core`` asks for the hub before importing torch and the commands: a
    text model's hub name, offline and not in the local cache, is its one line at once (the
    commands cannot even be imported here)."""
    import sys

    import huggingface_hub.constants

    import hydra_core.__main__ as entry
    from hydra_core.hub import early_refusal, text_hub_repo
    from tests.conftest import block_network

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    attempts = block_network(monkeypatch)
    monkeypatch.setitem(sys.modules, "hydra_core.cli", None)  # importing it would fail
    model = "hf:textattack/bert-base-uncased-SST-2"
    monkeypatch.setattr(sys, "argv", ["hydra_core", "eval", "--model", model, *DATA])
    with pytest.raises(SystemExit) as stopped:
        entry.run()
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and len(err.strip().splitlines()) == 1
    line = one_error_line(err)
    assert "cannot load Hugging Face model 'textattack/bert-base-uncased-SST-2'" in line
    assert "huggingface.co cannot be reached" in line and "minilm-sentiment" in line
    assert len(attempts) == 1
    # in the local cache: the loaders decide, after the imports; a timm name is refused first
    # too (tests/test_hub_offline.py)
    (tmp_path / "hub" / "models--textattack--bert-base-uncased-SST-2").mkdir(parents=True)
    assert early_refusal(["eval", "--model", model]) is None
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    assert "timm model" in early_refusal(["eval", "--model=vit_small_patch16_224"])
    assert text_hub_repo("openclip:ViT-B-32/laion2b_s34b_b79k") is None
    assert text_hub_repo("models/tiny.safetensors") is None
    assert text_hub_repo("owner/name") == "owner/name"


# --- cause 8: degenerate inputs ------------------------------------------------------------------


def _grey_folder(root, save) -> str:
    """The same 8-bit greyscale images (two classes) saved by ``save(pixels, path)``."""
    rng = np.random.default_rng(0)
    for label in ("a", "b"):
        (root / "set" / label).mkdir(parents=True)
        for i in range(3):
            save(rng.integers(0, 256, (28, 28), dtype=np.uint8), root / "set" / label / str(i))
    return str(root / "set")


def test_16_bit_and_float_images_are_scaled_not_clipped(checkpoint, tmp_path, capsys):
    from hydra_core.data.generic import load_image_folder

    folders = {
        "8-bit": _grey_folder(
            tmp_path / "u8", lambda a, p: Image.fromarray(a).save(p.with_suffix(".png"))
        ),
        "16-bit": _grey_folder(
            tmp_path / "u16",
            lambda a, p: Image.fromarray(a.astype(np.uint16) * 257).save(p.with_suffix(".png")),
        ),
        "float": _grey_folder(
            tmp_path / "f32",
            lambda a, p: Image.fromarray(a.astype(np.float32) / 255).save(p.with_suffix(".tif")),
        ),
    }
    assert Image.open(next((tmp_path / "u16").rglob("*.png"))).mode == "I;16"
    pixels = {k: load_image_folder(f, size=28, grayscale=True).images for k, f in folders.items()}
    assert torch.equal(pixels["16-bit"], pixels["8-bit"]) and torch.equal(
        pixels["float"], pixels["8-bit"]
    )
    results = []
    for folder in folders.values():
        code, err = run(
            capsys, "eval", "--model", checkpoint, "--id-folder", folder, *DATA, "--json"
        )
        assert code == 0, err
        results.append(json.loads(run.out)["id"])
    assert results[0] == results[1] == results[2]


def test_a_one_class_classifier_is_refused(tmp_path, capsys, monkeypatch):
    import huggingface_hub.constants

    from tests.conftest import save_tiny_clip

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    clip = save_tiny_clip(tmp_path / "clip")
    (tmp_path / "pets" / "cat").mkdir(parents=True)
    for i in range(4):
        Image.fromarray(np.full((32, 32, 3), 60 * i, np.uint8)).save(
            tmp_path / "pets" / "cat" / f"{i}.png"
        )
    code, err = run(capsys, "eval", "--model", f"openclip:local-dir:{clip}", "--id-folder",
                    str(tmp_path / "pets"), *DATA)  # fmt: skip
    line = one_error_line(err)
    assert code == 2 and "has one class folder (cat)" in line and "two classes or more" in line
    path = save_state(tiny_timm_vit(num_classes=1), tmp_path / "one.safetensors")
    code, err = run(capsys, "eval", "--model", path, "--arch", "vit_tiny_patch16_224",
                    "--arch-kwargs", TINY_KWARGS, *DATA)  # fmt: skip
    assert code == 2 and "has 1 output: a classifier of one class" in one_error_line(err)


# --- cause 9: Ctrl-C during start-up -------------------------------------------------------------


def test_ctrl_c_while_starting_exits_130_without_a_traceback():
    """Ctrl-C while torch is being imported (the first seconds of every command)."""
    import subprocess
    import sys
    from pathlib import Path

    interrupt_at_torch = (
        "import runpy, sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "sys.argv = ['hydra_core', 'info']\n"
        "runpy.run_module('hydra_core', run_name='__main__', alter_sys=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", interrupt_at_torch],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip() == "stopped while starting; nothing was done"


def wait_for_handler(pid: int, signum: int, timeout: float = 60.0) -> None:
    """Wait until process ``pid`` catches ``signum`` (its ``SigCgt`` in /proc; on a loaded
    machine the interpreter's own start can take longer than a fixed sleep)."""
    import time
    from pathlib import Path

    status, deadline = Path(f"/proc/{pid}/status"), time.monotonic() + timeout
    while status.exists() and time.monotonic() < deadline:
        caught = next(
            (ln.split()[1] for ln in status.read_text().splitlines() if ln.startswith("SigCgt:")),
            "0",
        )
        if int(caught, 16) >> (signum - 1) & 1:
            return
        time.sleep(0.01)


def test_a_real_ctrl_c_early_in_a_command_exits_130_without_a_traceback(tmp_path):
    """A real SIGINT while the command's modules are imported. The child stops at the import of
    torch (after the entry point's handler is in place) and says so in a file; the signal is sent
    then, so it lands in start-up on any machine, however loaded (a fixed sleep let a fast start
    finish the command first, exit 0)."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    ready = tmp_path / "importing-torch"
    stop_at_torch = (
        "import runpy, sys, time\n"
        "from pathlib import Path\n"
        "class Pause:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch':\n"
        f"            Path({str(ready)!r}).touch()\n"
        "            while True:\n"
        "                time.sleep(0.05)  # until the Ctrl-C\n"
        "sys.meta_path.insert(0, Pause())\n"
        "sys.argv = ['hydra_core', 'info', '--device', 'cpu']\n"
        "runpy.run_module('hydra_core', run_name='__main__', alter_sys=True)\n"
    )
    started = subprocess.Popen(
        [sys.executable, "-c", stop_at_torch],
        cwd=Path(__file__).parents[2],
        env={**__import__("os").environ, "HYDRA_LAB_CACHE": str(tmp_path / "cache")},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as from a terminal: a test runner's worker (pytest-xdist) may ignore SIGINT, and an
        # ignored signal stays ignored in its children
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while not ready.exists() and started.poll() is None:
        assert time.monotonic() < deadline, "the command did not reach the import of torch"
        time.sleep(0.02)
    wait_for_handler(started.pid, signal.SIGTERM)  # the entry point's handlers are in place
    started.send_signal(signal.SIGINT)
    _, err = started.communicate(timeout=120)
    assert started.returncode == 130, err
    assert "Traceback" not in err and err.strip() == "stopped while starting; nothing was done"


def test_sigterm_during_a_report_stops_it_as_ctrl_c_does_and_leaves_no_staging_folder(
    tmp_path, checkpoint
):
    """``kill`` (or torchrun ending its workers) gets the clean-up Ctrl-C gets: the report's
    staging folder is removed, the message says the work resumes, and the exit code is 143."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from hydra_core.cli import STOPPED

    out = tmp_path / "report"
    command = ["report", "--quick", "--model", checkpoint, "--ood", "noise", "--device", "cpu"]
    started = subprocess.Popen(
        [sys.executable, "-m", "hydra_core", *command, "--out", str(out)],
        cwd=Path(__file__).parents[2],
        env={**__import__("os").environ, "HYDRA_LAB_CACHE": str(tmp_path / "cache")},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".report.partial-*")) and started.poll() is None:
        assert time.monotonic() < deadline, "the report made no staging folder in 120 s"
        time.sleep(0.05)
    started.send_signal(signal.SIGTERM)
    _, err = started.communicate(timeout=120)
    assert started.returncode == 143, err
    assert "Traceback" not in err and err.strip().endswith(STOPPED)
    assert not list(tmp_path.glob(".report.partial-*"))


# --- cause 10: --arch-kwargs with num_classes ----------------------------------------------------


def test_arch_kwargs_num_classes_is_merged_with_the_checkpoint(tmp_path, capsys):
    path = save_state(tiny_timm_vit(), tmp_path / "ten.safetensors")
    argv = ["eval", "--model", path, "--arch", "vit_tiny_patch16_224", *DATA, "--json"]
    agree = '{"img_size": 32, "patch_size": 8, "depth": 2, "num_classes": 10}'
    code, err = run(capsys, *argv, "--arch-kwargs", agree)
    assert code == 0, err
    plain = run(capsys, *argv, "--arch-kwargs", TINY_KWARGS)
    assert plain[0] == 0 and json.loads(run.out)["id"]["accuracy"] is not None
    contradict = agree.replace("10}", "7}")
    code, err = run(capsys, *argv, "--arch-kwargs", contradict)
    line = one_error_line(err)
    assert code == 2 and f"num_classes 7 contradicts {path}" in line and "has 10 outputs" in line


def test_arch_kwargs_on_a_checkpoint_that_carries_its_config(tmp_path, capsys):
    arch = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=24, depth=2,
                num_heads=4)  # fmt: skip
    torch.manual_seed(0)
    path = tmp_path / "configured.safetensors"
    save_checkpoint(timm.models.vision_transformer.VisionTransformer(**arch), path, arch)
    argv = ["eval", "--model", str(path), *DATA]
    assert run(capsys, *argv, "--arch-kwargs", '{"num_classes": 10}')[0] == 0
    code, err = run(capsys, *argv, "--arch-kwargs", '{"num_classes": 3}')
    line = one_error_line(err)
    assert code == 2 and "--arch-kwargs num_classes=3 contradicts" in line
    assert "whose header says num_classes=10" in line


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["search", "--budgte", "3"], "search: unrecognized arguments: --budgte 3; did you mean "
         "--budget? (see python -m hydra_core search --help)"),
        (["search", "--n-serch=4"], "did you mean --n-search?"),
        (["eval", "--out", "x"], "eval: unrecognized arguments: --out x (see python -m hydra_core "
         "eval --help)"),  # nothing close enough to name
        (["search", "stray"], "search: unrecognized arguments: stray (see"),
        # an unknown option whose value argparse read as masks' own command ("export")
        (["masks", "--greedy", "g.json"], "masks: unrecognized arguments: --greedy (see"),
        (["masks", "--budgt", "3"], "masks: unrecognized arguments: --budgt; did you mean "
         "--budget?"),
        # options are taken whole: an abbreviation silently meant the one option it began
        (["cahp", "--m", "0"], "cahp: unrecognized arguments: --m 0 (see"),  # not --model 0
        (["search", "--budg", "3"], "unrecognized arguments: --budg 3; did you mean --budget?"),
        (["masks", "--budg", "3", "--m", "2"], "masks: unrecognized arguments: --budg; did you "
         "mean --budget?"),
    ],
)  # fmt: skip
def test_a_stray_argument_is_refused_by_its_command_with_the_closest_option(argv, expected, capsys):
    """Words a command does not take are refused in one line by that command (its ``--help``
    lists what it takes), naming the option meant when one is misspelt; argparse refused them
    on the command list, whose help lists no option."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert "did you mean" not in err[0] or argv[1] not in ("--out", "stray", "--greedy")
