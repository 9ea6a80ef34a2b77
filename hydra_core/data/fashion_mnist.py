"""Fashion-MNIST, the default in-distribution set.

Looked for, in order: Debian's ``dataset-fashion-mnist`` package, a copy downloaded earlier into the
cache, and (only when the machine is online) torchvision's download into the cache.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import torch

from hydra_core.data.images import ImageSet, stable_permutation
from hydra_core.paths import cache_dir

CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
#: Images of the official training set held out from training the default model; they are the
#: in-distribution ``search`` pool (head selection), the official test set is the ``report`` pool.
VALIDATION_SIZE = 5000

HOW_TO_GET = (
    "Fashion-MNIST was not found. Install Debian's package (`sudo apt-get install "
    "dataset-fashion-mnist`, files under {debian}), or set HYDRA_FASHION_MNIST_DIR to a folder "
    "with the four *-ubyte.gz files, or run once on a machine with internet access so torchvision "
    "can download it into {cache}."
)


def read_idx(path: Path) -> np.ndarray:
    """Read one gzip-compressed IDX file (the MNIST format) into a numpy array."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte IDX file (bad magic number)")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    offset = 4 + 4 * ndim
    expected = int(np.prod(shape))
    if len(data) - offset != expected:
        raise ValueError(
            f"{path}: header says {shape} ({expected} bytes) but holds {len(data) - offset}"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(shape)


def _candidate_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("HYDRA_FASHION_MNIST_DIR"):
        dirs.append(Path(os.environ["HYDRA_FASHION_MNIST_DIR"]))
    dirs += [DEBIAN_DIR, cache_dir() / "fashion_mnist" / "FashionMNIST" / "raw"]
    return dirs


def find_files() -> Path:
    """The folder holding the Fashion-MNIST files, downloading them only when nothing is found."""
    for folder in _candidate_dirs():
        if all((folder / name).is_file() for pair in FILES.values() for name in pair):
            return folder
    target = cache_dir() / "fashion_mnist"
    try:
        from torchvision.datasets import FashionMNIST

        FashionMNIST(str(target), train=True, download=True)
        FashionMNIST(str(target), train=False, download=True)
    except Exception as exc:  # no network, blocked host, ...
        raise FileNotFoundError(HOW_TO_GET.format(debian=DEBIAN_DIR, cache=target)) from exc
    return target / "FashionMNIST" / "raw"


def load_fashion_mnist(split: str = "test") -> ImageSet:
    """Fashion-MNIST as an :class:`ImageSet` of 28x28 grayscale images.

    Args:
        split: ``"test"`` (10,000 images, the report pool), ``"train"`` (the 55,000 images the
            default model was trained on), ``"validation"`` (the 5,000 held-out training images,
            the search pool) or ``"train-full"`` (all 60,000).
    """
    if split not in ("train", "test", "validation", "train-full"):
        raise ValueError(
            f"unknown Fashion-MNIST split {split!r}; expected train, validation, test or train-full"
        )
    folder = find_files()
    images_file, labels_file = FILES["test" if split == "test" else "train"]
    images = torch.from_numpy(read_idx(folder / images_file).copy()).unsqueeze(1)  # (N, 1, 28, 28)
    labels = torch.from_numpy(read_idx(folder / labels_file).astype(np.int64))
    name = "fashion_mnist"
    if split in ("train", "validation"):
        order = stable_permutation(len(images), "fashion_mnist", "validation")
        index = order[:VALIDATION_SIZE] if split == "validation" else order[VALIDATION_SIZE:]
        index = index.sort().values
        images, labels = images[index], labels[index]
    return ImageSet(
        name=name,
        images=images,
        labels=labels,
        group="id",
        classes=CLASSES,
        description=f"Fashion-MNIST {split}: 28x28 grayscale photos of clothing, 10 classes",
        source=str(folder),
    )
