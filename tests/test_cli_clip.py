"""The command line on an OpenCLIP zero-shot classifier: a tiny random model saved as an open_clip
folder (``--model openclip:local-dir:PATH``), its classes from the ``--id-folder``'s class
folders, ``--prompts``, and one-line refusals (exit code 2)."""

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
    assert card["family"] == "openclip" and (card["layers"], card["heads"]) == (3, 4)
    assert card["classes"] == 3 and card["prompts"] == "paper: 'A photo of a {label}.'"
    assert card["weights"].startswith("RANDOM initialisation")
    assert card["id_set"] == "pets (report split, n=12)" and set(card["ood_auroc"]) == {"odd"}
    assert main(["eval", *clip_args(files), "--json"]) == 0
    evaluation = json.loads(capsys.readouterr().out)
    assert evaluation["id"]["n"] == 12 and [o["name"] for o in evaluation["ood"]] == ["odd"]
    assert evaluation["id"]["accuracy"]["value"] == pytest.approx(card["id_accuracy"])


def test_the_text_card_and_a_zero_shot_chance_note(files, capsys):
    assert main(["info", *clip_args(files), "--prompts", "openai"]) == 0
    captured = capsys.readouterr()
    assert "openai: 80 templates" in captured.out and "RANDOM initialisation" in captured.out
    if "near chance" in captured.err:  # a random model's accuracy is about 1/3 here
        assert "knows the classes only by name" in captured.err


def test_classes_come_from_the_folder_or_the_class_order(files):
    parser = build_parser()
    args = parser.parse_args(["eval", *clip_args(files)])
    assert zero_shot_options(args) == {"classes": tuple(sorted(CLASS_FOLDERS)), "templates": None}
    ordered = parser.parse_args(
        [
            "eval",
            *clip_args(files),
            "--classes",
            "sea-lion, cat,golden_retriever",
            "--prompts",
            "a {label}",
        ]
    )
    assert zero_shot_options(ordered) == {
        "classes": ["sea-lion", "cat", "golden_retriever"],
        "templates": ["a {label}"],
    }
    fashion = parser.parse_args(["eval", "--model", f"openclip:local-dir:{files['model']}"])
    assert zero_shot_options(fashion) == {"classes": None, "templates": None}
    assert zero_shot_options(parser.parse_args(["eval"])) == {}  # not an OpenCLIP model


def test_search_runs_on_the_image_tower(files, tmp_path):
    out = tmp_path / "search"
    argv = ["search", *clip_args(files), "--budget", "2", "--out", str(out)]
    assert main(argv) == 0
    steps = pd.read_csv(out / "greedy_avg_steps.csv")
    assert len(steps) == 2 and steps["head"].str.match(r"L[0-2]H[0-3]").all()


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--model", "default", "--prompts", "openai"], "--prompts applies to zero-shot OpenCLIP"),
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
    assert "--prompts SET_OR_TEMPLATE" in text
