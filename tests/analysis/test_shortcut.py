"""The shortcut check (hydra_core.analysis.shortcut): surface features through the modality, the
cross-validated AUROC a plain scikit-learn computation gives, a warning where OOD differs only in
brightness and none where it matches ID's surface statistics; the search records it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from hydra_core.analysis.shortcut import shortcut_check, surface_auroc
from hydra_core.cli import main
from hydra_core.data.images import ImageSet
from hydra_core.data.surface import image_surface_features, text_surface_features
from hydra_core.data.text import TextSet
from hydra_core.models.modality import IMAGE_MODALITY, TEXT_MODALITY

DATA = ["--n-search", "40", "--n-report", "60", "--ood", "mnist", "noise", "--device", "cpu"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))


def blobs(n: int, seed: int, brightness: int = 0, name: str = "set") -> ImageSet:
    """Smooth random 28 x 28 images around grey 100, ``brightness`` added."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, 7, 7, generator=g) * 120 + 40
    x = torch.nn.functional.interpolate(x, size=(28, 28), mode="bilinear") + brightness
    group = "id" if name == "id" else "far"
    labels = torch.zeros(n, dtype=torch.long) if group == "id" else None
    images = x.round().clamp(0, 255).to(torch.uint8)
    return ImageSet(name, images, labels=labels, group=group)


def test_ood_that_differs_only_in_brightness_warns_and_matching_ood_does_not():
    id_items = blobs(200, 0, name="id")
    brighter, matching = blobs(200, 1, 60, "brighter"), blobs(200, 2, 0, "matching")
    dense = {"brighter": 0.8, "matching": 0.8}  # a model that separates both at 0.8
    found = shortcut_check(IMAGE_MODALITY, id_items, [brighter, matching], dense)
    assert found["brighter"].auroc > 0.99 and found["brighter"].warns
    assert found["matching"].hi < 0.8 and not found["matching"].warns
    assert 0.3 < found["matching"].auroc < 0.7
    entry = found["brighter"].to_dict()
    assert set(entry) == {"auroc", "lo", "hi", "dense_auroc", "warns"}
    assert entry["lo"] <= entry["auroc"] <= entry["hi"] and entry["dense_auroc"] == 0.8
    assert "'brighter'" in found["brighter"].warning()


def test_the_interval_reaching_the_model_warns_too():
    id_items = blobs(60, 0, name="id")
    slightly = blobs(60, 3, 8, "slightly")
    check = shortcut_check(IMAGE_MODALITY, id_items, [slightly], {"slightly": 1.0})["slightly"]
    assert not check.warns  # nothing reaches a perfect model
    point = check.auroc + (check.hi - check.auroc) / 2  # above the point, inside the interval
    above = shortcut_check(IMAGE_MODALITY, id_items, [slightly], {"slightly": point})
    assert check.auroc < point <= check.hi and above["slightly"].warns


def test_surface_auroc_is_scikit_learns_out_of_fold_auroc():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(50, 3)), rng.normal(0.5, size=(40, 3))
    value, lo, hi = surface_auroc(a, b, seed=3)
    x, y = np.r_[a, b], np.r_[np.zeros(50), np.ones(40)].astype(int)
    scores = cross_val_predict(
        make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)),
        x,
        y,
        cv=StratifiedKFold(5, shuffle=True, random_state=3),
        method="decision_function",
    )
    assert value == pytest.approx(roc_auc_score(y, scores), abs=1e-12)
    assert lo < value < hi


def test_surface_features_are_the_plain_computation():
    texts = TextSet("t", ("Hello World 2020!", "a quiet review of it", "X"), group="far")
    assert text_surface_features(texts).tolist() == [
        [3, 17, 1, 2 / 3, 4 / 17],
        [5, 20, 0, 0, 0],
        [1, 1, 0, 1, 0],
    ]
    images = torch.zeros(1, 1, 4, 4, dtype=torch.uint8)
    images[0, 0, :, 2:] = 255  # a vertical edge between columns 1 and 2
    features = image_surface_features(ImageSet("i", images, group="far"))[0]
    x = images[0, 0].double() / 255
    assert features[0] == pytest.approx(x.mean().item())
    assert features[1] == pytest.approx(x.std(correction=0).item())
    assert features[2] == pytest.approx(3 / 9)  # one column of 3 of the 3 x 3 gradient pixels
    assert features[3] == 1.0  # every pixel is 0 or 255
    # each modality names its own features: the seam, not a model name, decides
    assert IMAGE_MODALITY.surface_features is image_surface_features
    assert TEXT_MODALITY.surface_features is text_surface_features


def test_a_warning_names_the_set_its_figures_and_where_to_check_transfer():
    from hydra_core.analysis.shortcut import CHECK_IN_MATRIX, ShortcutCheck

    check = ShortcutCheck("photos", 0.97, 0.95, 0.99, dense_auroc=0.55, n_id=64, n_ood=64)
    assert check.warns
    line = check.warning()
    assert "'photos'" in line and "0.970 [0.950, 0.990]" in line and "0.550" in line
    assert line.endswith("(check the transfer matrix: python -m hydra_core transfer)")
    assert check.warning(CHECK_IN_MATRIX).endswith(f"({CHECK_IN_MATRIX})")


def test_the_search_records_and_warns(checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["search", "--model", checkpoint, *DATA, "--budget", "2", "--out", str(out), "--json"]
    assert main(argv) == 0
    printed = capsys.readouterr()
    found = json.loads(printed.out)
    assert set(found["shortcut"]) == {"photos", "faces"}
    for entry in found["shortcut"].values():
        assert set(entry) == {"auroc", "lo", "hi", "dense_auroc", "warns"}
        assert ("shortcut:" in printed.err) >= entry["warns"]
    written = json.loads((out / "greedy_avg.json").read_text())
    assert written["shortcut"] == found["shortcut"]


def test_a_search_on_one_item_per_set_is_refused_in_one_line(checkpoint, tmp_path, capsys):
    """The check scores out of fold, which takes 2 items of each side: fewer is the user's
    input, named with its fix, before the search starts (it was a bare ValueError)."""
    data = ["--n-search", "1", *DATA[2:]]
    argv = ["search", "--model", checkpoint, *data, "--budget", "1", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: the shortcut check") and "raise --n-search" in err
    assert "--debug" not in err and not (tmp_path / "o").exists()
    with pytest.raises(ValueError, match="at least 2 of each"):
        shortcut_check(IMAGE_MODALITY, blobs(1, 0), [blobs(5, 1, name="x")], {"x": 0.5})


@pytest.mark.slow
def test_guardian_headlines_warn_as_a_text_search_set():
    """The issue's done-when, on the real text default (minilm-sentiment, 512 + 512)."""
    from hydra_core.analysis.shortcut import benchmark_shortcuts
    from hydra_core.zoo.registry import load_model

    loaded = load_model("minilm-sentiment")
    benchmark = loaded.modality.benchmark(n_search=512, n_report=64)
    found = benchmark_shortcuts(loaded, benchmark, device="cpu")
    guardian = found["guardian"]
    print(guardian.to_dict())
    assert guardian.warns and guardian.auroc >= guardian.dense_auroc


def test_text_features_are_taken_as_the_models_tokenizer_normalizes_them():
    """Capitals that an uncased tokenizer lower-cases never reach the model, so they are no
    shortcut for it: OOD sentences that differ from ID only in case warn for a cased view and
    not through a lower-casing normalizer (a real BERT normalizer, as uncased models have)."""
    from tokenizers import normalizers
    from transformers import PreTrainedTokenizerFast

    from hydra_core.models.text import TextPreprocess

    rng = np.random.default_rng(0)
    words = ["good", "film", "plot", "slow", "actors", "scene", "fine", "dull", "story", "end"]

    def sentences(n: int, capitalise: bool) -> tuple[str, ...]:
        out = []
        for _ in range(n):
            chosen = [str(w) for w in rng.choice(words, size=int(rng.integers(4, 12)))]
            out.append(" ".join(w.capitalize() if capitalise else w for w in chosen) + ".")
        return tuple(out)

    id_items = TextSet("id", sentences(150, False), labels=torch.zeros(150, dtype=torch.long))
    titled = TextSet("titled", sentences(150, True), group="far")
    dense = {"titled": 0.75}
    assert shortcut_check(TEXT_MODALITY, id_items, [titled], dense)["titled"].warns

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=_word_tokenizer(words))
    tokenizer.backend_tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    uncased = TextPreprocess(tokenizer, max_length=16)
    assert uncased.normalize("Good Film.") == "good film."
    seen = shortcut_check(TEXT_MODALITY, id_items, [titled], dense, preprocess=uncased)["titled"]
    assert not seen.warns and seen.hi < 0.75
    assert text_surface_features(titled, uncased)[:, 3].max() == 0  # no capital left


def _word_tokenizer(words):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", "[PAD]", ".", *words])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer
