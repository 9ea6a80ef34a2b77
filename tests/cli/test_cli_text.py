"""The command line on a text model: a tiny Hugging Face folder and CSV/JSONL files of one's own,
through eval, search, importance, represent, masks and hydra; data options of the other modality
refused in one line."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from hydra_core.cli import main
from tests.conftest import WORDS, save_tiny_folder

CLASSES = ("neg", "pos", "mixed")


@pytest.fixture(scope="module")
def text_setup(tmp_path_factory):
    """A tiny 3-class BERT folder, an ID CSV (labels by name), a near OOD JSONL and a search CSV."""
    root = tmp_path_factory.mktemp("text-cli")
    save_tiny_folder(root / "model", CLASSES)
    words = WORDS[5:]

    def sentence(i: int, k: int) -> str:
        return " ".join(words[(i * 7 + j * k) % len(words)] for j in range(3 + i % 5))

    rows = [{"text": sentence(i, 3), "label": CLASSES[i % 3]} for i in range(60)]
    pd.DataFrame(rows).to_csv(root / "id.csv", index=False)
    with open(root / "near.jsonl", "w") as f:
        for i in range(30):
            f.write(json.dumps({"text": sentence(i, 5) + " very very"}) + "\n")
    pd.DataFrame({"text": [sentence(i, 2) + " a" for i in range(30)]}).to_csv(
        root / "search.csv", index=False
    )
    data = [
        "--id-file",
        str(root / "id.csv"),
        "--ood-file",
        f"near:{root / 'near.jsonl'}",
        f"search:{root / 'search.csv'}",
        "--classes",
        ",".join(CLASSES),
        "--device",
        "cpu",
    ]
    return root, ["--model", str(root / "model"), *data]


def test_eval_search_importance_represent_masks_hydra(text_setup, tmp_path, capsys):
    root, common = text_setup
    assert main(["eval", *common, "--json"]) == 0
    evaluation = json.loads(capsys.readouterr().out)
    assert "near" in json.dumps(evaluation) and "search" not in json.dumps(evaluation)

    out = tmp_path / "search"
    assert main(["search", *common, "--budget", "3", "--out", str(out)]) == 0
    steps = pd.read_csv(out / "greedy_avg_steps.csv")
    assert len(steps) == 3 and steps["head"].str.match(r"L\dH\d").all()

    imp = tmp_path / "importance"
    argv = ["importance", *common, "--greedy", str(out / "greedy_avg.json"), "--out", str(imp)]
    assert main([*argv, "--taylor-samples", "20"]) == 0
    assert pd.read_csv(imp / "taylor.csv", index_col=0).shape == (2, 4)

    rep = tmp_path / "represent"
    masks = str(out / "greedy_avg_masks.json")
    assert main(["represent", *common, "--masks", masks, "--out", str(rep)]) == 0
    assert set(pd.read_csv(rep / "distances_layer1.csv")["ood_set"]) == {"near"}

    members = tmp_path / "members.json"
    assert (
        main(
            [
                "masks",
                *common,
                "--strategy",
                "seed-sampling",
                "--m",
                "2",
                "--budget",
                "2",
                "--pool",
                "6",
                "--seeds",
                "0",
                "2",
                "--out",
                str(members),
            ]
        )
        == 0
    )
    hydra = tmp_path / "hydra"
    argv = ["hydra", *common, "--masks", str(members), "--no-latency", "--out", str(hydra)]
    assert main(argv) == 0
    summary = pd.read_csv(hydra / "summary.csv")
    assert len(summary) >= 3  # single, members..., fused
    exported = sorted(hydra.glob("*.safetensors"))
    assert exported, "the hydra command exports the fused model"
    capsys.readouterr()
    # the export loads back with its tokenizer and evaluates like the fused row
    assert main(["eval", "--model", str(exported[0]), *common[2:], "--json"]) == 0
    fused = json.loads(capsys.readouterr().out)
    assert "near" in json.dumps(fused)


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--id-folder", "{root}"], "text model: give your own data as --id-file"),
        (["--ood-file", "nowhere.csv"], "the OOD file nowhere.csv does not exist"),
        (["--ood-file", "{root}"], "is a folder; a text set is one CSV"),
    ],
)
def test_text_data_errors_are_one_line(text_setup, extra, match, capsys):
    root, common = text_setup
    assert main(["eval", *common, *(a.format(root=root) for a in extra)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and match in err


def test_image_model_refuses_text_files(checkpoint, text_setup, capsys):
    root, _ = text_setup
    assert main(["eval", "--model", checkpoint, "--id-file", str(root / "id.csv")]) == 2
    assert "image model" in capsys.readouterr().err
