"""Where Hydra Lab keeps its files: the shipped assets and the disk cache."""

from __future__ import annotations

import os
from pathlib import Path

from hydra_core.errors import InputError

PACKAGE_DIR = Path(__file__).resolve().parent
ASSETS_DIR = PACKAGE_DIR / "assets"
REPO_DIR = PACKAGE_DIR.parent


def cache_dir() -> Path:
    """The cache root: ``$HYDRA_LAB_CACHE`` if set, else ``cache/`` beside the package."""
    root = Path(os.environ.get("HYDRA_LAB_CACHE", REPO_DIR / "cache"))
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            f"cannot use {root} as the cache folder ({exc.strerror or exc}): give a folder you "
            "can write with --cache-dir (the environment variable HYDRA_LAB_CACHE)"
        ) from None
    return root
