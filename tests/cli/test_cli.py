"""The command line, run as a user runs it, on a tiny checkpoint written by the fixture."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from hydra_core.cli import COMMANDS, build_parser, main
from hydra_core.masks import load_masks
from hydra_core.models.adapter import HeadLayout
from hydra_core.zoo.default import build_vit
from tests.conftest import TINY

DATA = ["--n-search", "40", "--n-report", "60", "--ood", "mnist", "noise", "--device", "cpu"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([name, "--help"])
    assert exit_info.value.code == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_command_parsed_alone_has_what_the_whole_parser_gives_it(name, capsys):
    """``main`` gives only the named command its arguments (:func:`build_parser` with the
    argv): that command's help is the one the parser of every command prints."""
    helps = []
    for parser in (build_parser(), build_parser([name, "--help"])):
        with pytest.raises(SystemExit):
            parser.parse_args([name, "--help"])
        helps.append(capsys.readouterr().out)
    assert helps[0] == helps[1]


#: libraries that take seconds to import, none of which the command list needs
HEAVY = ("timm", "sklearn", "scipy", "open_clip", "transformers", "torch_uncertainty", "peft",
         "matplotlib", "torchvision", "streamlit")  # fmt: skip


def test_the_command_list_imports_no_model_or_analysis_library():
    """``python -m hydra_core --help`` (and a mistyped command) answer in the time torch takes
    to import, not the 10 s of every library the commands use."""
    code = (
        "import sys\n"
        "from hydra_core.cli import main\n"
        "for argv in (['--help'], ['serch']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert "invalid choice: 'serch'" in out.stderr


def test_version_is_the_installed_projects(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.split()[-1] == version("hydra-lab")


def test_command_list_shows_each_summary_whole(capsys):
    """A summary wrapped over two docstring lines is shown whole in ``--help``, not cut at the
    line break (it used to end mid-sentence: "... goes on from its last")."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    listing = "".join(capsys.readouterr().out.split())  # argparse wraps at spaces and hyphens
    for name, (_, run) in COMMANDS.items():
        first = run.__doc__.strip().split("\n\n")[0]
        assert first.rstrip().endswith((".", ")")), name  # a whole sentence in the source
        assert "".join(first.split()) in listing, name


def test_eval_json(checkpoint, capsys):
    assert main(["eval", "--model", checkpoint, *DATA, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"]["layers"] == 2 and out["model"]["heads"] == 4
    assert out["id"]["n"] == 60 and 0 <= out["id"]["accuracy"]["value"] <= 1
    assert [o["name"] for o in out["ood"]] == ["mnist", "noise"]  # the report sets, no search set
    assert {o["group"] for o in out["ood"]} == {"near", "far"}
    assert all(0 <= o["auroc"]["value"] <= 1 and o["n"] == 60 for o in out["ood"])


def test_eval_on_folders_of_ones_own(checkpoint, tmp_path, capsys):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for folder, count in (("mine/a", 6), ("mine/b", 6), ("odd", 8)):
        (tmp_path / folder).mkdir(parents=True)
        for i in range(count):
            pixels = rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / folder / f"{i}.png")
    args = ["--id-folder", str(tmp_path / "mine"), "--ood-folder", f"near:{tmp_path / 'odd'}"]
    assert main(["eval", "--model", checkpoint, "--device", "cpu", *args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["id"]["name"] == "mine" and out["id"]["n"] == 6  # the report half of 12
    assert [(o["name"], o["group"], o["n"]) for o in out["ood"]] == [("odd", "near", 8)]
    args[-1] = f"search:{tmp_path / 'odd'}"  # the same folder as a search set: never evaluated
    assert main(["eval", "--model", checkpoint, "--device", "cpu", *args, "--ood", "noise"]) == 0
    table = capsys.readouterr().out
    assert "noise" in table and "odd" not in table


def test_info_json(checkpoint, capsys):
    assert main(["info", "--model", checkpoint, *DATA, "--json"]) == 0
    card = json.loads(capsys.readouterr().out)
    assert card["params"] == sum(p.numel() for p in build_vit(TINY).parameters())
    assert set(card["ood_auroc"]) == {"mnist", "noise"}


def test_search_importance_represent(checkpoint, tmp_path, capsys):
    out = tmp_path / "search"
    assert main(["search", "--model", checkpoint, *DATA, "--budget", "3", "--out", str(out)]) == 0
    steps = pd.read_csv(out / "greedy_avg_steps.csv")
    assert len(steps) == 3 and steps["head"].str.match(r"L\dH\d").all()
    members = load_masks(out / "greedy_avg_masks.json", HeadLayout((4, 4), 6, 24))
    assert members[0].kept == 8 - 3
    result = json.loads((out / "greedy_avg.json").read_text())
    assert result["scores"] == pytest.approx(steps["score"].tolist())

    imp = tmp_path / "importance"
    assert (
        main(
            [
                "importance",
                "--model",
                checkpoint,
                *DATA,
                "--greedy",
                str(out / "greedy_avg.json"),
                "--taylor-samples",
                "20",
                "--out",
                str(imp),
            ]
        )
        == 0
    )
    for name in ("delta_accuracy", "delta_auroc", "taylor", "greedy_avg_step"):
        assert pd.read_csv(imp / f"{name}.csv", index_col=0).shape == (2, 4)
    spearman = pd.read_csv(imp / "spearman.csv", index_col=0)
    assert spearman.loc["Taylor", "Taylor"] == pytest.approx(1.0)

    rep = tmp_path / "represent"
    assert (
        main(
            [
                "represent",
                "--model",
                checkpoint,
                *DATA,
                "--masks",
                str(out / "greedy_avg_masks.json"),
                "--out",
                str(rep),
            ]
        )
        == 0
    )
    distances = pd.read_csv(rep / "distances_layer1.csv")
    assert len(distances) == 4 * 2 and (distances["mahalanobis"] >= 0).all()
    table5 = pd.read_csv(rep / "dense_vs_circuit.csv")
    assert list(table5["dataset"]) == ["mnist", "noise", "Average"]  # the report sets
    assert set(distances["ood_set"]) == {"mnist", "noise"}
    assert len(pd.read_csv(rep / "pca_layer1.csv")) == 60 + 2 * 60  # the report parts, whole


def test_cahp_accuracy_knee(checkpoint, tmp_path):
    out = tmp_path / "cahp"
    argv = ["cahp", "--model", checkpoint, *DATA, "--variant", "accuracy-knee", "--k-step", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    summary = json.loads((out / "cahp.json").read_text())
    members = load_masks(out / "cahp_masks.json", HeadLayout((4, 4), 6, 24))
    assert (summary["variant"], summary["curve"], summary["seed"]) == (
        "accuracy-knee",
        "accuracy",
        0,
    )
    assert members[0].kept == len(summary["kept"]) >= summary["knee_k"]
    assert members[0].source.startswith("CAHP accuracy-knee")
    assert list(pd.read_csv(out / "cahp_curve.csv").columns) == ["k", "accuracy", "fitted"]


def test_cahp_official(tmp_path, capsys):
    """The default variant, on a tiny checkpoint with enough heads for t-SNE (3 x 6 = 18)."""
    from hydra_core.zoo.default import VitConfig
    from tests.conftest import write_tiny_checkpoint

    config = VitConfig(embed_dim=24, depth=3, num_heads=6, mlp_ratio=2.0)
    model = write_tiny_checkpoint(tmp_path / "18heads.safetensors", config)
    out = tmp_path / "cahp"
    assert main(["cahp", "--model", model, *DATA, "--out", str(out)]) == 0
    summary = json.loads((out / "cahp.json").read_text())
    assert (summary["variant"], summary["curve"], summary["seed"], summary["degree"]) == (
        "official",
        "mss",
        42,
        6,
    )
    members = load_masks(out / "cahp_masks.json", HeadLayout((6, 6, 6), 4, 24))
    assert (
        members[0].kept
        == len(summary["kept"])
        == summary["knee_k"] + len(summary["added_for_empty_layers"])
    )
    assert "CAHP official" in capsys.readouterr().out
    curve = pd.read_csv(out / "cahp_curve.csv")
    assert list(curve.columns) == ["k", "mss", "fitted"] and curve["k"].tolist() == list(
        range(2, 18)
    )
    # the official variant has no k grid; the tiny 8-head model is too small for it
    assert main(["cahp", "--model", model, *DATA, "--k-step", "2", "--out", str(out)]) == 2
    assert "k-step is an option of the accuracy-knee variant" in capsys.readouterr().err


def test_masks_by_cahp_name_their_variant(checkpoint, tmp_path):
    from hydra_core.zoo.default import VitConfig
    from tests.conftest import write_tiny_checkpoint

    out = tmp_path / "members.json"
    argv = ["masks", "--strategy", "cahp", "--m", "2", "--allow-identical", *DATA]
    knee = ["--cahp-variant", "accuracy-knee", "--cahp-k-step", "2"]
    assert main([*argv, "--model", checkpoint, *knee, "--out", str(out)]) == 0
    members = load_masks(out, HeadLayout((4, 4), 6, 24))
    assert [m.name for m in members] == ["CAHP accuracy-knee seed 0", "CAHP accuracy-knee seed 1"]
    config = VitConfig(embed_dim=24, depth=3, num_heads=6, mlp_ratio=2.0)
    model = write_tiny_checkpoint(tmp_path / "18heads.safetensors", config)
    out = tmp_path / "members-18.json"  # another model: another file (the first is not replaced)
    assert main([*argv, "--model", model, "--out", str(out)]) == 0
    members = load_masks(out, HeadLayout((6, 6, 6), 4, 24))
    assert [m.name for m in members] == ["CAHP official seed 42", "CAHP official seed 43"]
    assert all(m.source.startswith("CAHP official: knee of the mean simplified") for m in members)


def test_cahp_refuses_a_model_too_small_for_t_sne(checkpoint, tmp_path, capsys):
    assert main(["cahp", "--model", checkpoint, *DATA, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "perplexity 10" in err and "--cahp-variant accuracy-knee" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv, match",
    [
        (["eval", "--model", "/nonexistent.safetensors"], "does not exist"),
        (["eval", "--model", "vit_tiny_patch16_2244"], "did you mean"),
        (["eval", "--model", "{checkpoint}", "--ood", "cifar"], "unknown OOD set"),
        (
            ["eval", "--model", "{checkpoint}", "--n-search", "0"],
            "argument --n-search: must be at least 1, got 0",
        ),
        (
            ["eval", "--model", "{checkpoint}", "--search-ood", "cifar"],
            "unknown OOD set(s) 'cifar'; valid names: mnist",
        ),
        (
            ["eval", "--model", "{checkpoint}", "--ood", "mnist", "--search-ood", "mnist"],
            "'mnist' named both as search and as report set",
        ),
        (
            ["search", "--model", "{checkpoint}", "--protocol", "halves", "--search-ood", "faces"],
            "apply to the 'dedicated' protocol",
        ),
    ],
)
def test_bad_arguments_are_explained(argv, match, checkpoint, capsys):
    assert main([a.format(checkpoint=checkpoint) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and match in err and len(err.splitlines()) == 1


def test_installed_console_script_runs_from_any_folder(tmp_path):
    """`make setup` installs the project into the venv: `hydra-lab` and `import hydra_core` work
    outside the checkout."""
    script = Path(sys.executable).parent / "hydra-lab"
    assert script.exists(), "hydra-lab is missing: run `make setup` (pip install -e .)"
    out = subprocess.run([script, "--help"], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: hydra-lab") and "search" in out.stdout
    where = subprocess.run(
        [sys.executable, "-c", "import hydra_core; print(hydra_core.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(where.stdout.strip()).parent.name == "hydra_core"
