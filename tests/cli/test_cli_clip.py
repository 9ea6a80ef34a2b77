"""The command line on an OpenCLIP zero-shot classifier: a tiny random model saved as an open_clip
folder (``--model openclip:local-dir:PATH``), its classes from the ``--id-folder``'s class
folders, ``--prompts``, ``--towers`` (both towers' heads by default, or the image tower's), mask
files that say their layout, and one-line refusals (exit code 2)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from hydra_core.cli import build_parser, main
from hydra_core.cli.common import zero_shot_options
from tests.conftest import save_tiny_clip

CLASS_FOLDERS = ("golden_retriever", "sea-lion", "cat")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """A tiny random OpenCLIP folder, an ID image folder of three classes (not square, so they
    are resized and cropped) and two flat OOD folders."""
    root = tmp_path_factory.mktemp("clip_cli")
    save_tiny_clip(root / "model")
    rng = np.random.default_rng(0)
    counts = {f"pets/{name}": 8 for name in CLASS_FOLDERS} | {"odd": 10, "other": 10}
    for folder, count in counts.items():
        (root / folder).mkdir(parents=True)
        for i in range(count):
            pixels = rng.integers(0, 256, (40, 30, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / folder / f"{i}.png")
    return {name: str(root / name) for name in ("model", "pets", "odd", "other")}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))


def clip_args(files: dict[str, str]) -> list[str]:
    return [
        "--model",
        f"openclip:local-dir:{files['model']}",
        "--id-folder",
        files["pets"],
        "--ood-folder",
        f"far:{files['odd']}",
        f"search:{files['other']}",
        "--n-search",
        "8",
        "--n-report",
        "12",
        "--device",
        "cpu",
    ]


def test_info_shows_the_zero_shot_card(files, capsys):
    assert main(["info", *clip_args(files), "--json"]) == 0
    card = json.loads(capsys.readouterr().out)
    assert card["family"] == "openclip" and (card["layers"], card["heads"]) == (4, 4)
    assert card["towers"] == "both: image 3 layers x 4 heads + text 1 layer x 2 heads"
    assert card["classes"] == 3 and card["prompts"] == "paper: 'A photo of a {label}.'"
    assert card["weights"].startswith("RANDOM initialisation")
    assert card["id_set"] == "pets (report split, n=12)" and set(card["ood_auroc"]) == {"odd"}
    assert main(["eval", *clip_args(files), "--json"]) == 0
    evaluation = json.loads(capsys.readouterr().out)
    assert evaluation["id"]["n"] == 12 and [o["name"] for o in evaluation["ood"]] == ["odd"]
    assert evaluation["id"]["accuracy"]["value"] == pytest.approx(card["id_accuracy"])
    assert main(["info", *clip_args(files), "--towers", "image", "--json"]) == 0
    image_only = json.loads(capsys.readouterr().out)
    assert (image_only["layers"], image_only["towers"]) == (3, "image: image 3 layers x 4 heads")
    assert image_only["id_accuracy"] == card["id_accuracy"]  # the same classifier


def test_the_text_card_and_a_zero_shot_chance_note(files, capsys):
    assert main(["info", *clip_args(files), "--prompts", "openai"]) == 0
    captured = capsys.readouterr()
    assert "openai: 80 templates" in captured.out and "RANDOM initialisation" in captured.out
    if "near chance" in captured.err:  # a random model's accuracy is about 1/3 here
        assert "knows the classes only by name" in captured.err


def test_classes_come_from_the_folder_or_the_class_order(files):
    parser = build_parser()
    args = parser.parse_args(["eval", *clip_args(files)])
    assert zero_shot_options(args) == {
        "classes": tuple(sorted(CLASS_FOLDERS)),
        "templates": None,
        "towers": None,
    }
    ordered = parser.parse_args(
        [
            "eval",
            *clip_args(files),
            "--classes",
            "sea-lion, cat,golden_retriever",
            "--prompts",
            "a {label}",
            "--towers",
            "image",
        ]
    )
    assert zero_shot_options(ordered) == {
        "classes": ["sea-lion", "cat", "golden_retriever"],
        "templates": ["a {label}"],
        "towers": "image",
    }
    fashion = parser.parse_args(["eval", "--model", f"openclip:local-dir:{files['model']}"])
    assert zero_shot_options(fashion) == {"classes": None, "templates": None, "towers": None}
    assert zero_shot_options(parser.parse_args(["eval"])) == {}  # not an OpenCLIP model


def test_search_runs_on_both_towers_or_the_image_tower(files, tmp_path):
    out = tmp_path / "search"
    argv = ["search", *clip_args(files), "--budget", "13", "--out", str(out)]
    assert main(argv) == 0
    steps = pd.read_csv(out / "greedy_avg_steps.csv")
    assert len(steps) == 13 and steps["head"].str.match(r"L[0-3]H[0-3]").all()
    assert steps["head"].isin(["L3H0", "L3H1"]).any()  # the text tower's heads are searched
    masks = json.loads((out / "greedy_avg_masks.json").read_text())
    assert masks["model"]["towers"] == {"image": 3, "text": 1}
    image = tmp_path / "image"
    argv = ["search", *clip_args(files), "--towers", "image", "--budget", "2", "--out", str(image)]
    assert main(argv) == 0
    steps = pd.read_csv(image / "greedy_avg_steps.csv")
    assert len(steps) == 2 and steps["head"].str.match(r"L[0-2]H[0-3]").all()
    assert json.loads((image / "greedy_avg_masks.json").read_text())["model"]["towers"] == {
        "image": 3
    }


def test_members_fuse_over_both_towers_and_mask_files_keep_their_layout(files, tmp_path, capsys):
    members = tmp_path / "members.json"
    argv = [*clip_args(files), "--strategy", "seed-sampling", "--m", "2", "--budget", "4"]
    assert main(["masks", *argv, "--out", str(members)]) == 0
    out = tmp_path / "hydra"
    assert main(["hydra", *clip_args(files), "--masks", str(members), "--out", str(out)]) == 0
    capsys.readouterr()
    # an image-only mask file as Hydra Lab wrote them before the text tower joined (no towers
    # entry) stays image-only: refused on the joint layout, with the way to load the model
    image_members = tmp_path / "image.json"
    assert main(["masks", *argv, "--towers", "image", "--out", str(image_members)]) == 0
    old = json.loads(image_members.read_text())
    assert old["model"].pop("towers") == {"image": 3}
    legacy = tmp_path / "legacy.json"
    legacy.write_text(json.dumps(old))
    capsys.readouterr()
    assert main(["hydra", *clip_args(files), "--masks", str(legacy), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "image 3 layers" in err and "--towers image" in err and len(err.splitlines()) == 1
    argv = ["hydra", *clip_args(files), "--towers", "image", "--masks", str(legacy)]
    # the image-only layout is another model to the output folder of the joint one
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "+ text" in err and "(image 3 layers, weights" in err  # the two layouts, named
    assert main([*argv, "--out", str(tmp_path / "hydra-image")]) == 0


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--model", "default", "--prompts", "openai"], "--prompts applies to zero-shot OpenCLIP"),
        (["--model", "default", "--towers", "image"], "--towers applies to zero-shot OpenCLIP"),
        (["--model", "{model}", "--prompts", "A photo."], "has no {label} where the class name"),
        (["--model", "openclip:ViT-B-32"], "names no pretrained weights"),
        (["--model", "openclip:ViT-B-32/laion2b_s34b_b79k"], "needs the network"),
        (["--model", "openclip:local-dir:{pets}"], "has no open_clip_config.json"),
        (["--model", "{model}", "--id-folder", "{odd}"], "has no class sub-folders"),
        (["--model", "{model}", "--arch", "vit_tiny_patch16_224"], "do not apply to openclip:"),
    ],
)
def test_bad_arguments_are_one_line(files, monkeypatch, capsys, argv, match):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no downloads
    names = {**files, "model": f"openclip:local-dir:{files['model']}"}
    assert main(["eval", *(a.format(**names) for a in argv), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and match in err and len(err.splitlines()) == 1


def test_help_says_which_sources_need_the_network(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["info", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "openclip:NAME/TAG" in text and "need the network" in text
    assert "openclip:local-dir:PATH" in text and "works offline" in text
    assert "--prompts SET_OR_TEMPLATE" in text and "--towers {both,image}" in text
