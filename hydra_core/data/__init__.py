"""Data: the in-distribution set, the OOD sets, your own images, and the search/report benchmark."""

from hydra_core.data.benchmark import Benchmark, build_benchmark, default_benchmark
from hydra_core.data.fashion_mnist import load_fashion_mnist
from hydra_core.data.generic import load_image_folder, load_torchvision_set
from hydra_core.data.images import ImageSet, split_in_two, take
from hydra_core.data.ood import OOD_SETS, load_ood_set, load_ood_sets

__all__ = [
    "OOD_SETS",
    "Benchmark",
    "ImageSet",
    "build_benchmark",
    "default_benchmark",
    "load_fashion_mnist",
    "load_image_folder",
    "load_ood_set",
    "load_ood_sets",
    "load_torchvision_set",
    "split_in_two",
    "take",
]
