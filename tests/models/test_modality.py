"""The modality objects: reached from the family and the loaded model, their defaults, and their
one benchmark builder, which gives the same benchmark as the data module's builders it wraps."""

from __future__ import annotations

import pytest
from PIL import Image

from hydra_core.data.benchmark import (
    Benchmark,
    default_benchmark,
    folder_benchmark,
    text_file_benchmark,
)
from hydra_core.data.fashion_mnist import load_fashion_mnist
from hydra_core.data.ood import OOD_SETS, REPORT_OOD, SEARCH_OOD
from hydra_core.data.text import TEXT_OOD, TEXT_REPORT_OOD, TEXT_SEARCH_OOD, load_rotten_tomatoes
from hydra_core.errors import InputError
from hydra_core.models.adapter import family_of
from hydra_core.models.modality import (
    IMAGE_MODALITY,
    MODALITIES,
    TEXT_MODALITY,
    modality_named,
)
from hydra_core.zoo.registry import LoadedModel, load_model
from tests.conftest import make_tiny_clip, make_tiny_text, make_tiny_vit, missing_data


def parts(benchmark: Benchmark) -> list[tuple[str, str, int, str]]:
    """Every part of a benchmark as (name, group, size, fingerprint), search parts first."""
    return [
        (p.name, p.group, len(p), p.fingerprint())
        for p in (
            benchmark.id_search,
            benchmark.id_report,
            *benchmark.ood_search,
            *benchmark.ood_report,
        )
    ]


def same(a: Benchmark, b: Benchmark) -> bool:
    return a.protocol == b.protocol and parts(a) == parts(b)


def write_png(path, color, size=(40, 30)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)


@pytest.fixture
def folders(tmp_path) -> dict[str, str]:
    """An ID image folder (2 classes x 5 images) and two flat OOD folders."""
    for label, colour in (("red", (200, 0, 0)), ("blue", (0, 0, 200))):
        for i in range(5):
            write_png(tmp_path / "mine" / label / f"{i}.png", (colour[0], i * 10, colour[2]))
    for i in range(6):
        write_png(tmp_path / "other" / f"{i}.png", (i * 30, 100, 100))
        write_png(tmp_path / "more" / f"{i}.png", (100, i * 30, 100))
    return {name: str(tmp_path / name) for name in ("mine", "other", "more")}


@pytest.fixture
def files(tmp_path) -> dict[str, str]:
    """A labelled ID file (CSV, 20 texts) and two OOD files (CSV, JSONL)."""
    (tmp_path / "id.csv").write_text(
        "text,label\n" + "".join(f"text {i},{('neg', 'pos')[i % 2]}\n" for i in range(20))
    )
    (tmp_path / "near.csv").write_text("text\n" + "".join(f"near {i}\n" for i in range(6)))
    (tmp_path / "s.jsonl").write_text("".join(f'{{"text": "s {i}"}}\n' for i in range(5)))
    return {name: str(tmp_path / file) for name, file in (("id", "id.csv"), ("near", "near.csv"))}


def test_each_modality_states_its_defaults():
    assert (IMAGE_MODALITY.name, IMAGE_MODALITY.noun) == ("image", "images")
    assert (TEXT_MODALITY.name, TEXT_MODALITY.noun) == ("text", "sentences")
    assert IMAGE_MODALITY.ood_sets is OOD_SETS and TEXT_MODALITY.ood_sets is TEXT_OOD
    assert (IMAGE_MODALITY.report_ood, IMAGE_MODALITY.search_ood) == (REPORT_OOD, SEARCH_OOD)
    assert (TEXT_MODALITY.report_ood, TEXT_MODALITY.search_ood) == (
        TEXT_REPORT_OOD,
        TEXT_SEARCH_OOD,
    )
    assert (IMAGE_MODALITY.takes_files, TEXT_MODALITY.takes_files) == (False, True)
    assert IMAGE_MODALITY.load_id is load_fashion_mnist
    assert TEXT_MODALITY.load_id is load_rotten_tomatoes
    assert MODALITIES == {"image": IMAGE_MODALITY, "text": TEXT_MODALITY}


def test_a_modality_stands_for_its_saved_name():
    """Files and older callers hold the names: a modality equals, hashes and prints as its
    name, and the name gives the modality back."""
    assert IMAGE_MODALITY == "image" and "text" == TEXT_MODALITY
    assert IMAGE_MODALITY != "text" and IMAGE_MODALITY != TEXT_MODALITY
    assert {"image": 1, "text": 2}[TEXT_MODALITY] == 2
    assert (
        f"a {IMAGE_MODALITY} model" == "a image model" and repr(TEXT_MODALITY) == "Modality('text')"
    )
    assert modality_named("text") is TEXT_MODALITY and modality_named("image") is IMAGE_MODALITY
    with pytest.raises(ValueError, match="unknown modality 'audio'; expected one of image, text"):
        modality_named("audio")


def test_the_family_and_the_loaded_model_reach_it(checkpoint):
    assert family_of(make_tiny_vit()).modality is IMAGE_MODALITY
    assert family_of(make_tiny_clip()).modality is IMAGE_MODALITY
    assert family_of(make_tiny_text("bert")).modality is TEXT_MODALITY
    loaded = load_model(checkpoint)
    assert loaded.modality is IMAGE_MODALITY and loaded.image_format == (1, 28)
    text = LoadedModel("tiny-bert", make_tiny_text("bert"), preprocess=tuple)
    assert text.modality is TEXT_MODALITY and text.image_format is None


@pytest.mark.parametrize(
    "options", [{}, {"search_ood": ["faces"]}, {"protocol": "halves"}], ids=str
)
def test_image_builder_without_own_data_is_the_default_benchmark(options):
    ours = IMAGE_MODALITY.benchmark(ood=["digits8x8"], n_search=20, n_report=30, **options)
    default = default_benchmark(ood=["digits8x8"], n_search=20, n_report=30, **options)
    assert same(ours, default)
    by_default = IMAGE_MODALITY.benchmark(n_search=8, n_report=8, image_format=(1, 28))
    assert by_default.report_names() == list(REPORT_OOD)
    assert by_default.search_names() == list(SEARCH_OOD)


def test_image_builder_with_folders_is_folder_benchmark(folders):
    sources = [f"near: {folders['other']}", f"search: {folders['more']}"]
    ours = IMAGE_MODALITY.benchmark(
        id_source=folders["mine"],
        ood=["digits8x8"],
        ood_sources=sources,
        n_search=4,
        classes=["red", "blue"],
        image_format=(3, 12),
    )
    theirs = folder_benchmark(
        id_folder=folders["mine"],
        ood=["digits8x8"],
        ood_folders=sources,
        size=12,
        channels=3,
        n_search=4,
        classes=["red", "blue"],
    )
    assert same(ours, theirs)
    assert ours.id_search.classes == ("red", "blue")


def test_own_report_data_alone_replaces_the_default_report_sets(folders):
    """ood=None: the modality's report sets, unless a near:/far: source is given (the command
    line's rule); a search: source leaves them."""
    reported = IMAGE_MODALITY.benchmark(
        ood_sources=[f"far: {folders['other']}"], n_search=4, image_format=(1, 12)
    )
    assert reported.report_names() == ["other"] and reported.search_names() == list(SEARCH_OOD)
    searched = IMAGE_MODALITY.benchmark(
        ood_sources=[f"search: {folders['more']}"], n_search=4, n_report=4, image_format=(1, 12)
    )
    assert searched.report_names() == list(REPORT_OOD) and searched.search_names() == ["more"]


def test_text_builder_with_files_is_text_file_benchmark(files, tmp_path):
    sources = [f"near: {files['near']}", f"search: {tmp_path / 's.jsonl'}"]
    ours = TEXT_MODALITY.benchmark(
        id_source=files["id"], ood_sources=sources, n_search=None, classes=["pos", "neg"]
    )
    theirs = text_file_benchmark(id_file=files["id"], ood_files=sources, classes=["pos", "neg"])
    assert same(ours, theirs)
    assert ours.report_names() == ["near"] and ours.search_names() == ["s"]
    assert ours.id_search.classes == ("pos", "neg")


def test_text_builder_without_own_data_is_the_text_default():
    try:
        load_rotten_tomatoes("test")
        ours = TEXT_MODALITY.benchmark(ood=["abc_news"], n_search=20, n_report=30)
    except FileNotFoundError as exc:  # the text data wheels are not installed on this machine
        missing_data(str(exc))
    theirs = text_file_benchmark(ood=["abc_news"], n_search=20, n_report=30)
    assert same(ours, theirs)
    assert ours.id_search.name == "rotten_tomatoes" and ours.search_names() == ["guardian"]


def test_text_refuses_an_image_format_and_checks_with_its_own_search_sets(files):
    with pytest.raises(InputError, match=r"image_format applies to images.*\(got \(1, 28\)\)"):
        TEXT_MODALITY.benchmark(id_source=files["id"], image_format=(1, 28))
    TEXT_MODALITY.check_choice(["abc_news"], None)  # guardian searches, abc_news is reported
    with pytest.raises(InputError, match="'guardian' named both as search and as report set"):
        TEXT_MODALITY.check_choice(["guardian"], None)
    with pytest.raises(InputError, match="'faces' named both"):
        IMAGE_MODALITY.check_choice(["faces"], None)
