"""Data of one's own fed through the command line as a user gives it, wrong in the ways of issue 25
(causes 1-3): sets of one name, text labels that are not the model's class names, text rows that
are numbers, duplicates or contradictions. Each mistake ends in exit code 2 and one line naming
the input and the fix, with nothing written; each fix the message offers works."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from hydra_core.data.benchmark import text_file_benchmark
from hydra_core.data.text import text_key
from tests.cli.test_bad_inputs import one_error_line, run
from tests.conftest import WORDS, save_tiny_folder

#: the tiny text model's classes, as minilm-sentiment's
CLASSES = ("negative", "positive")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))


def snapshot(*roots: Path) -> dict[str, str]:
    """Every file under ``roots``: path -> hash of its bytes (folders as ``/``)."""
    found = {}
    for root in roots:
        for path in sorted(Path(root).rglob("*")):
            found[str(path)] = (
                "/" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
            )
    return found


def sentences(n: int, start: int = 0) -> list[str]:
    """``n`` distinct short sentences of the tiny vocabulary."""
    words = WORDS[5:]
    made = []
    for i in range(start, start + 10 * n):
        digits = [int(d) for d in np.base_repr(i, len(words)).rjust(3, "0")]
        made.append(" ".join(words[d] for d in digits))
        if len(made) == n:
            break
    return made


def write_csv(path: Path, rows: list[dict]) -> str:
    pd.DataFrame(rows).to_csv(path, index=False)
    return str(path)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """A tiny BERT classifier whose config names its classes negative, positive."""
    folder = tmp_path_factory.mktemp("text-model") / "model"
    save_tiny_folder(folder, CLASSES)
    return str(folder)


@pytest.fixture
def files(tmp_path) -> dict[str, str]:
    """An ID file labelled by the model's names (lower case), and OOD files."""
    texts = sentences(80)
    made = {
        "id": write_csv(
            tmp_path / "reviews.csv",
            [{"text": t, "label": CLASSES[i % 2]} for i, t in enumerate(texts[:40])],
        ),
        "near": write_csv(tmp_path / "near.csv", [{"text": t} for t in texts[40:60]]),
        "search": write_csv(tmp_path / "headlines.csv", [{"text": t} for t in texts[60:80]]),
    }
    return made


def data(files: dict, id_file: str | None = None, *extra: str) -> list[str]:
    return [
        "--id-file", id_file or files["id"],
        "--ood-file", f"near:{files['near']}", f"search:{files['search']}", *extra,
        "--device", "cpu",
    ]  # fmt: skip


def evaluation(capsys, model: str, argv: list[str]) -> dict:
    code, err = run(capsys, "eval", "--model", model, *argv, "--json")
    assert code == 0, err
    return json.loads(run.out)


# --- cause 1: set names --------------------------------------------------------------------------


def test_an_id_file_and_an_ood_file_of_one_name_are_refused_then_named(
    model, files, tmp_path, capsys
):
    other = tmp_path / "elsewhere"
    other.mkdir()
    clash = write_csv(other / "reviews.csv", [{"text": t} for t in sentences(10, start=200)])
    before = snapshot(tmp_path)
    code, err = run(capsys, "eval", "--model", model, *data(files, None, "far:" + clash))
    line = one_error_line(err)
    assert code == 2 and "named 'reviews', as the ID file" in line and clash in line
    assert f"NAME=PATH, e.g. far:reviews_far={clash}" in line
    assert snapshot(tmp_path) == before  # refused before anything was computed or cached
    # the fix the message offers
    named = evaluation(capsys, model, data(files, None, f"far:reviews_far={clash}"))
    assert named["id"]["name"] == "reviews" and named["id"]["accuracy"]["value"] >= 0
    assert {s["name"] for s in named["ood"]} == {"near", "reviews_far"}


def test_two_ood_files_of_one_name_say_how_to_name_one(model, files, tmp_path, capsys):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    a = write_csv(tmp_path / "a" / "news.csv", [{"text": t} for t in sentences(8, start=300)])
    b = write_csv(tmp_path / "b" / "news.csv", [{"text": t} for t in sentences(8, start=400)])
    code, err = run(capsys, "eval", "--model", model, *data(files, None, f"near:{a}", f"far:{b}"))
    line = one_error_line(err)
    assert code == 2 and f"the far OOD file {b} is named 'news', as the near OOD file {a}" in line
    assert "name one of them with NAME=PATH" in line
    assert not (tmp_path / "cache").exists()
    named = evaluation(capsys, model, data(files, None, f"near:{a}", f"far:news_b={b}"))
    assert [s["name"] for s in named["ood"]] == ["near", "news", "news_b"]


def test_image_folders_of_one_name(checkpoint, tmp_path, capsys):
    for folder in ("id/set/a", "id/set/b", "ood/set"):
        (tmp_path / folder).mkdir(parents=True)
    for i, folder in enumerate(("id/set/a", "id/set/a", "id/set/b", "id/set/b", "ood/set")):
        Image.fromarray(np.full((28, 28), 50 * i, np.uint8)).save(tmp_path / folder / f"{i}.png")
    before = snapshot(tmp_path)
    argv = ["eval", "--model", checkpoint, "--id-folder", str(tmp_path / "id" / "set"),
            "--ood-folder", str(tmp_path / "ood" / "set"), "--device", "cpu"]  # fmt: skip
    code, err = run(capsys, *argv)
    line = one_error_line(err)
    assert code == 2 and "is named 'set', as the ID folder" in line and "NAME=PATH" in line
    assert snapshot(tmp_path) == before
    argv[-3] = f"far:other={tmp_path / 'ood' / 'set'}"
    code, err = run(capsys, *argv, "--json")
    assert code == 0, err
    assert json.loads(run.out)["ood"][0]["name"] == "other"


# --- cause 2: labels matched to the model's class names ----------------------------------------


def relabelled(files: dict, folder: Path, names: dict) -> str:
    """The ID file with its labels renamed by ``names``, under its own name in ``folder`` (the
    name seeds the split into halves: the same name, the same halves)."""
    frame = pd.read_csv(files["id"])
    frame["label"] = frame["label"].map(names)
    folder.mkdir()
    return write_csv(folder / Path(files["id"]).name, frame.to_dict("records"))


def test_label_names_match_the_model_classes_in_any_case(model, files, tmp_path, capsys):
    reference = evaluation(capsys, model, data(files))["id"]
    capitals = relabelled(
        files, tmp_path / "caps.csv", {"negative": "negative", "positive": "Positive"}
    )
    indices = relabelled(files, tmp_path / "ints.csv", {"negative": 0, "positive": 1})
    for id_file in (capitals, indices):
        same = evaluation(capsys, model, data(files, id_file))["id"]
        assert same["accuracy"] == reference["accuracy"] and same["nll"] == reference["nll"]


def test_a_file_of_one_name_keeps_that_class(model, files, tmp_path, capsys):
    texts = sentences(20, start=500)
    only = write_csv(tmp_path / "only.csv", [{"text": t, "label": "positive"} for t in texts])
    ones = write_csv(tmp_path / "ones.csv", [{"text": t, "label": 1} for t in texts])
    code, err = run(capsys, "eval", "--model", model, *data(files, only), "--json")
    assert code == 0 and "holds a single class (positive)" in err  # warned, and labelled 1
    by_name = json.loads(run.out)["id"]
    code, err = run(capsys, "eval", "--model", model, *data(files, ones), "--json")
    assert code == 0 and "holds a single class (positive)" in err  # integer labels warn too
    assert json.loads(run.out)["id"]["accuracy"] == by_name["accuracy"]


@pytest.mark.parametrize(
    "labels, message",
    [
        (["fresh", "rotten"], "label(s) 'fresh', 'rotten' are not classes of the model "
         "(negative, positive); use its class names (any case), or give your label names in its "
         "output order with --classes"),
        (["negative", "nan"], "needs a 'label' for every text (row 2 has 'nan')"),
        (["1", "2"], "label 2 but only 2 classes of the model (negative, positive)"),
    ],
)  # fmt: skip
def test_labels_that_are_not_the_model_classes_are_refused(
    model, files, tmp_path, capsys, labels, message
):
    texts = sentences(20, start=600)
    path = write_csv(
        tmp_path / "mine.csv", [{"text": t, "label": labels[i % 2]} for i, t in enumerate(texts)]
    )
    before = snapshot(tmp_path)
    for extra in (["eval"], ["search", "--out", str(tmp_path / "out")]):
        code, err = run(capsys, *extra, "--model", model, *data(files, path))
        line = one_error_line(err)
        assert code == 2 and message in line and path in line
    assert snapshot(tmp_path) == before


def test_classes_in_the_files_own_names(model, files, tmp_path, capsys):
    reference = evaluation(capsys, model, data(files))["id"]
    renamed = relabelled(files, tmp_path / "rt", {"negative": "rotten", "positive": "fresh"})
    argv = data(files, renamed, "--classes", "rotten,fresh")
    assert evaluation(capsys, model, argv)["id"]["accuracy"] == reference["accuracy"]


def test_search_warns_near_chance_as_eval_does(model, files, tmp_path, capsys):
    code, eval_err = run(capsys, "eval", "--model", model, *data(files))
    assert code == 0 and "is near chance" in eval_err  # a random tiny model
    code, err = run(capsys, "search", "--model", model, *data(files), "--budget", "1", "--out",
                    str(tmp_path / "s"))  # fmt: skip
    assert code == 0 and "is near chance" in err and "file's labels" in err


# --- cause 3: rows ------------------------------------------------------------------------------


def test_a_text_that_is_a_number_is_refused_not_dropped(model, files, tmp_path, capsys):
    path = tmp_path / "mine.jsonl"
    rows = [{"text": t, "label": "negative"} for t in sentences(10, start=700)]
    rows[3]["text"] = 42
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, err = run(capsys, "eval", "--model", model, *data(files, str(path)))
    line = one_error_line(err)
    assert code == 2 and f"{path}, line 4: the text is 42, a number, not a string" in line
    assert 'write it in quotes ("42")' in line


def test_duplicates_are_kept_once_and_never_in_both_halves(model, files, tmp_path, capsys):
    texts = sentences(30, start=800)
    rows = [{"text": t, "label": CLASSES[i % 2]} for i, t in enumerate(texts)]
    rows += [{"text": r["text"].upper() + " !", "label": r["label"]} for r in rows[:12]]
    path = write_csv(tmp_path / "dupes.csv", rows)
    code, err = run(capsys, "eval", "--model", model, *data(files, path), "--json")
    assert code == 0 and "12 duplicate text(s) kept once (the first" in err
    assert json.loads(run.out)["id"]["n"] == 15  # 30 distinct texts, the report half
    bench = text_file_benchmark(id_file=path, ood_files=[f"far:{files['near']}"])
    halves = [{text_key(t) for t in part.texts} for part in (bench.id_search, bench.id_report)]
    assert not halves[0] & halves[1] and len(halves[0] | halves[1]) == 30


def test_one_text_with_two_labels_is_refused(model, files, tmp_path, capsys):
    texts = sentences(10, start=900)
    rows = [{"text": t, "label": "negative"} for t in texts] + [
        {"text": texts[2] + ".", "label": "positive"}
    ]
    path = write_csv(tmp_path / "twice.csv", rows)
    code, err = run(capsys, "eval", "--model", model, *data(files, path))
    line = one_error_line(err)
    assert code == 2 and f"the text {texts[2]!r} (row 3) is given two labels" in line
    assert "'negative' and 'positive' (row 11)" in line


def test_a_search_text_that_is_also_reported_is_refused(model, files, tmp_path, capsys):
    shared = pd.read_csv(files["search"])["text"].tolist()[:3]
    near = write_csv(tmp_path / "near2.csv", [{"text": t} for t in [*shared, "good film"]])
    argv = ["--id-file", files["id"], "--ood-file", f"near:{near}", f"search:{files['search']}"]
    code, err = run(capsys, "eval", "--model", model, *argv, "--device", "cpu")
    line = one_error_line(err)
    assert (
        code == 2 and "3 text(s) are both in the search set 'headlines' and the report set" in line
    )
    assert "a text that selects heads may not be reported on" in line
