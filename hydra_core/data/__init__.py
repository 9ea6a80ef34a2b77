"""Data: the in-distribution set, the OOD sets in their two roles (search, report), your own images,
and the search/report benchmark."""

from hydra_core.data.benchmark import PROTOCOLS, Benchmark, build_benchmark, default_benchmark
from hydra_core.data.fashion_mnist import load_fashion_mnist
from hydra_core.data.generic import load_image_folder, load_torchvision_set
from hydra_core.data.images import ImageSet, split_in_two, take
from hydra_core.data.ood import OOD_SETS, REPORT_OOD, SEARCH_OOD, load_ood_set, load_ood_sets

__all__ = [
    "OOD_SETS",
    "PROTOCOLS",
    "REPORT_OOD",
    "SEARCH_OOD",
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
