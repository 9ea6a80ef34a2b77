"""Bring your own images: a folder on disk, or a torchvision data set already downloaded.

Both return an :class:`ImageSet` of uint8 (N, C, H, W) images, so they plug into
:func:`hydra_core.data.benchmark.build_benchmark` like the default sets. Images are taken as they
are: a model trained on white-on-black images (Fashion-MNIST) needs OOD images in that convention
too, and these loaders do not invert anything.
"""

from __future__ import annotations

import errno
import re
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, UnidentifiedImageError

from hydra_core.data.images import GROUPS, ImageSet, stable_permutation
from hydra_core.errors import InputError

#: File endings read as images (torchvision's ImageFolder list); other files are ignored.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def _is_image(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMAGE_EXTENSIONS


def _entries(folder: Path) -> list[Path]:
    """The visible entries of ``folder``; a symbolic link that loops (points at itself, or at a
    link that points back) is named in one line (InputError)."""
    found = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):
            continue
        if path.is_symlink():
            try:
                path.stat()
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise InputError(
                        f"{path} is a symbolic link loop (it leads back to itself); remove the "
                        "link or point to a folder without it"
                    ) from None
                continue  # a broken link: nothing to read
        found.append(path)
    return found


def _image_files(folder: Path) -> list[Path]:
    return [p for p in _entries(folder) if _is_image(p)]


def _class_folders(folder: Path) -> list[Path]:
    return [p for p in _entries(folder) if p.is_dir()]


def _images_below(folder: Path, above: frozenset = frozenset()) -> list[Path]:
    """Every image in ``folder`` and its sub-folders, in torchvision ImageFolder's order (its
    ``make_dataset``: ``sorted(os.walk(folder, followlinks=True))``, each folder's files sorted);
    a folder link that leads back to a folder above it (``above``: their real paths) is a loop,
    named in one line, where ``os.walk`` would go round it until the path is too long."""
    by_folder: dict[str, list[Path]] = {}

    def visit(current: Path, chain: frozenset) -> None:
        real = current.resolve()
        if real in chain:
            raise InputError(
                f"{current} is a symbolic link back to {real}, a folder above it (a loop); "
                "remove the link or point to a folder without it"
            )
        chain = chain | {real}
        entries = _entries(current)
        by_folder[str(current)] = [p for p in entries if _is_image(p)]
        for sub in entries:
            if sub.is_dir():
                visit(sub, chain)

    visit(folder, above)
    return [path for key in sorted(by_folder) for path in by_folder[key]]


class MissingFolderError(InputError, FileNotFoundError):
    """An image folder that does not exist: a user's mistake (InputError) and a missing file."""


class ClassOrderWarning(UserWarning):
    """The class folders' sorted order is probably not the model's class order."""


def _natural_key(name: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _class_order(folder: Path, names: list[str], classes: Sequence[str] | None) -> list[str]:
    """The label order of ``folder``'s class folders ``names`` (sorted): ``classes`` when
    given (every folder must be among them), else ``names``, with a warning where numbered
    names sort differently as strings and as numbers (c1, c10, c2 against c1, c2, ..., c10)."""
    if classes is not None:
        classes = [str(c).strip() for c in classes]
        unknown = [n for n in names if n not in classes]
        if unknown or len(set(classes)) != len(classes):
            problem = (
                f"its class folders {', '.join(unknown)} are not among the classes given"
                if unknown
                else "the classes given repeat a name"
            )
            raise InputError(
                f"{folder}: {problem} ({', '.join(classes)}); list each of the model's classes "
                "once, in output order, with the folder names spelled as on disk"
            )
        return classes
    note = class_order_note(folder, names)
    if note:
        warnings.warn(note, ClassOrderWarning, stacklevel=3)
    return names


def class_order_note(folder: str | Path, names: Sequence[str]) -> str | None:
    """A warning when class folders ``names`` (sorted as text, as labels follow them) are
    numbered and their number order differs (c1, c10, c2 against c1, c2, ..., c10), else None."""
    natural = sorted(names, key=_natural_key)
    if list(natural) == list(names):
        return None
    return (
        f"{folder}: its class folders are numbered, and sorted as text "
        f"({', '.join(names[:3])}, ...) they are not in number order "
        f"({', '.join(natural[:3])}, ...); labels follow the text order, as torchvision's "
        "ImageFolder does. If the model's classes are in number order, give that order "
        "explicitly (--classes, or 'Class order' on the Setup page)"
    )


#: PIL modes of more than 8 bits a channel (16-bit PNG/PGM/TIFF, 32-bit integer and float)
DEEP_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")


def _eight_bit(image: Image.Image) -> Image.Image:
    """A greyscale image of more than 8 bits as 8 bits, scaled over its type's range: 16-bit (and
    32-bit integer, read as 16-bit) values x 255/65535, float values in [0, 1] x 255 (others
    clipped to [0, 255]). PIL's own conversion clips 16-bit values at 255, so nearly every pixel
    of a 16-bit photo turns white, and a float image in [0, 1] black."""
    values = np.asarray(image, dtype=np.float64)
    if image.mode == "F":
        scaled = values * 255 if values.size and np.nanmax(values) <= 1 else values
    else:
        scaled = np.clip(values, 0, 65535) * (255 / 65535)
    pixels = np.clip(np.rint(np.nan_to_num(scaled)), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels)  # (H, W) uint8: mode L


def _read_image(path: Path, size: int, grayscale: bool) -> np.ndarray:
    """One image as uint8 (C, size, size): shorter side resized to ``size``, centre cropped."""
    try:
        with Image.open(path) as image:
            if image.mode in DEEP_MODES:
                image = _eight_bit(image)
            image = image.convert("L" if grayscale else "RGB")
            scale = size / min(image.size)
            width = max(size, round(image.width * scale))
            height = max(size, round(image.height * scale))
            # PIL's bilinear filter widens its support when shrinking, so this is antialiased
            image = image.resize((width, height), Image.Resampling.BILINEAR)
            left, top = (width - size) // 2, (height - size) // 2
            image = image.crop((left, top, left + size, top + size))
            pixels = np.asarray(image, dtype=np.uint8)  # (size, size) or (size, size, 3)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise InputError(f"cannot read image {path}: {exc}; remove or replace the file") from exc
    return pixels[None] if grayscale else pixels.transpose(2, 0, 1)  # (C, size, size)


def load_image_folder(
    path: str | Path,
    *,
    size: int,
    name: str | None = None,
    group: str = "id",
    grayscale: bool = False,
    max_images: int | None = None,
    classes: Sequence[str] | None = None,
) -> ImageSet:
    """Images from a folder, labelled by class sub-folder or unlabelled.

    Two layouts are understood:

    - torchvision's ImageFolder: ``path/<class name>/<image>``; labels are the class folders in
      sorted order; images in sub-folders of a class folder belong to it (read recursively, in
      ImageFolder's order). Needed for an in-distribution set (accuracy needs labels).
    - a flat folder ``path/<image>``: an unlabelled set, for OOD (``group="near"`` or ``"far"``).

    Args:
        path: the folder.
        size: every image is resized so its shorter side is ``size`` and centre-cropped to
            ``size`` x ``size``.
        name: the set's name in tables and cache keys; the folder's name by default.
        group: ``"id"``, ``"near"`` or ``"far"``.
        grayscale: one channel (PIL's "L" conversion) instead of three (RGB).
        max_images: keep this many images, a fixed sample of the files (by name), before any
            file is decoded; all of them when None.
        classes: the model's classes in output order; class folders are matched to them by
            name (label = position in this list; a folder may be missing, an unknown folder is
            an error). None: the folders in sorted (string) order, as torchvision's
            ImageFolder; a :class:`ClassOrderWarning` when that order looks like a mistake.

    Raises:
        MissingFolderError: the folder does not exist (an InputError and a FileNotFoundError).
        InputError: no images, loose images beside class folders, an empty class folder, an
            unlabelled folder asked for as ``group="id"``, or a file that cannot be decoded
            (the message names it).
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise MissingFolderError(f"image folder {folder} does not exist (or is not a folder)")
    if size < 1:
        raise ValueError(f"size must be a positive number of pixels, got {size}")
    if max_images is not None and max_images < 1:
        raise ValueError(f"max_images must be at least 1 (or None for all), got {max_images}")
    if group not in GROUPS:
        raise ValueError(f"group must be one of {GROUPS}, got {group!r}")
    name = name or folder.name
    class_dirs, loose = _class_folders(folder), _image_files(folder)
    if class_dirs and loose:
        raise InputError(
            f"{folder} holds both class sub-folders and loose images ({loose[0].name}, ...); "
            "move the images into class folders, or point to a folder with one layout only"
        )
    if class_dirs:
        order = _class_order(folder, [d.name for d in class_dirs], classes)
        files, labels = [], []
        top = frozenset({folder.resolve()})
        for class_dir in class_dirs:  # read as torchvision's ImageFolder: sub-folders too
            found = _images_below(class_dir, top)
            if not found:
                raise InputError(
                    f"class folder {class_dir} holds no images ({', '.join(IMAGE_EXTENSIONS)}), "
                    "not in its sub-folders either"
                )
            files += found
            labels += [order.index(class_dir.name)] * len(found)
        classes = tuple(order)
    elif loose:
        if group == "id":
            raise InputError(
                f"{folder} has no class sub-folders, so its images have no labels; an "
                "in-distribution set needs them. Put the images in one folder per class, or load "
                "this folder as an OOD set with group='near' or group='far'"
            )
        files, labels, classes = loose, None, None
    else:
        raise InputError(
            f"{folder} holds no images ({', '.join(IMAGE_EXTENSIONS)}) and no class folders"
        )

    index = torch.arange(len(files))
    if max_images is not None and max_images < len(files):
        index = stable_permutation(len(files), name, "max_images")[:max_images].sort().values
    images = np.stack([_read_image(files[i], size, grayscale) for i in index.tolist()])
    kind = f"{len(classes)} classes" if classes else "unlabelled"
    return ImageSet(
        name=name,
        images=torch.from_numpy(images),  # (N, C, size, size)
        labels=None if labels is None else torch.tensor(labels, dtype=torch.int64)[index],
        group=group,
        classes=classes,
        description=f"{len(index)} images from {folder} ({kind}), {size}x{size}",
        source=str(folder),
    )


#: torchvision data sets :func:`load_torchvision_set` reads: class name -> how a split is chosen.
TORCHVISION_SETS = {
    "MNIST": "train",
    "FashionMNIST": "train",
    "KMNIST": "train",
    "CIFAR10": "train",
    "CIFAR100": "train",
    "SVHN": "split",
    "STL10": "split",
}


def _as_nchw(data: torch.Tensor | np.ndarray) -> torch.Tensor:
    """torchvision's stored images as uint8 (N, C, H, W), whatever their layout on disk."""
    images = torch.as_tensor(np.asarray(data))
    if images.ndim == 3:  # (N, H, W): MNIST family
        return images.unsqueeze(1)
    if images.shape[-1] == 3:  # (N, H, W, 3): CIFAR
        return images.permute(0, 3, 1, 2).contiguous()
    return images  # (N, 3, H, W): SVHN, STL10


def load_torchvision_set(
    name: str,
    root: str | Path,
    *,
    train: bool = False,
    size: int | None = None,
    group: str = "id",
    download: bool = False,
    grayscale: bool = False,
) -> ImageSet:
    """A torchvision data set stored under ``root`` (as torchvision lays it out), as an ImageSet.

    Args:
        name: one of :data:`TORCHVISION_SETS` (``"CIFAR10"``, ``"SVHN"``, ...).
        root: the folder passed to torchvision as ``root``.
        train: the training split instead of the test split.
        size: resize to ``size`` x ``size`` (bilinear, antialiased); native size when None.
        group: ``"id"``, ``"near"`` or ``"far"``.
        download: let torchvision download the files into ``root`` (needs internet access).
        grayscale: colour images to one channel (ITU-R 601 luma weights, as PIL's "L").

    Raises:
        ValueError: unknown name.
        FileNotFoundError: the files are not under ``root`` (or the download failed); the message
            says how to get them.
    """
    if name not in TORCHVISION_SETS:
        raise ValueError(
            f"unknown torchvision data set {name!r}; supported: {', '.join(TORCHVISION_SETS)}"
        )
    if group not in GROUPS:
        raise ValueError(f"group must be one of {GROUPS}, got {group!r}")
    import torchvision.datasets

    split = "train" if train else "test"
    kwargs = {"train": train} if TORCHVISION_SETS[name] == "train" else {"split": split}
    try:
        dataset = getattr(torchvision.datasets, name)(str(root), download=download, **kwargs)
    except (RuntimeError, OSError) as exc:  # "Dataset not found or corrupted", or no network
        if download:
            raise FileNotFoundError(
                f"downloading torchvision's {name} into {root} failed ({exc}); run it on a machine "
                f"with internet access and copy {root} here"
            ) from exc
        raise FileNotFoundError(
            f"torchvision's {name} ({split} split) was not found under {root}. Call again with "
            "download=True on a machine with internet access, or copy the files torchvision "
            f"downloads for {name} into {root}"
        ) from exc
    labels = getattr(dataset, "targets", None)
    if labels is None:
        labels = dataset.labels
    images = _as_nchw(dataset.data)  # (N, C, H, W) uint8
    if grayscale and images.shape[1] == 3:
        weights = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
        gray = (images.float() * weights).sum(1, keepdim=True)  # (N, 1, H, W)
        images = gray.round().clamp(0, 255).to(torch.uint8)
    if size is not None and images.shape[-2:] != (size, size):
        resized = F.interpolate(images.float(), size=(size, size), mode="bilinear", antialias=True)
        images = resized.round().clamp(0, 255).to(torch.uint8)
    classes = getattr(dataset, "classes", None)
    return ImageSet(
        name=name.lower(),
        images=images,
        labels=torch.as_tensor(np.asarray(labels), dtype=torch.int64),
        group=group,
        classes=tuple(classes) if classes else None,
        description=f"torchvision {name}, {split} split, {len(images)} images",
        source=str(root),
    )
