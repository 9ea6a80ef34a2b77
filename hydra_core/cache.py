"""Disk cache for computed artefacts (activations, search runs, fitted heads, trained models).

Every entry is keyed by a hash of everything that determines it (model weights, data, config, the
algorithm's version) and written atomically: to a temporary file in the same folder, then renamed.
Each file carries a checksum of its payload, so a truncated or corrupt entry is detected, removed
and recomputed, never returned.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from hydra_core.files import atomic_write
from hydra_core.paths import cache_dir

MAGIC = b"HYDRA01\n"
T = TypeVar("T")


class CorruptCacheEntry(RuntimeWarning):
    """A cache file failed its checksum and was removed; the value will be recomputed."""


def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, torch.Tensor):
        return {
            "tensor": hashlib.sha256(
                value.detach().cpu().contiguous().numpy().tobytes()
            ).hexdigest(),
            "shape": list(value.shape),
            "dtype": str(value.dtype),
        }
    if isinstance(value, np.ndarray):
        return _canonical(torch.from_numpy(np.ascontiguousarray(value)))
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and value != value:
        return "nan"
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(
        f"cannot build a cache key from {type(value).__name__}; "
        "pass str, numbers, lists, dicts or tensors"
    )


def cache_key(*parts: Any, **named: Any) -> str:
    """A stable hex key (24 chars) of JSON-like parts; tensors are hashed by their contents."""
    text = json.dumps(_canonical([list(parts), named]), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def model_fingerprint(model: torch.nn.Module) -> str:
    """A hash of a model's parameter and buffer names, shapes and values (16 hex chars).

    Remembered on the model and recomputed when any tensor was modified in place since."""
    state = model.state_dict()
    versions = tuple(int(v._version) for v in state.values())
    cached = getattr(model, "_hydra_fingerprint", None)
    if cached is not None and cached[0] == (versions, tuple(state)):
        return cached[1]
    h = hashlib.sha256()
    for name, tensor in state.items():
        h.update(name.encode())
        h.update(str((tuple(tensor.shape), str(tensor.dtype))).encode())
        h.update(
            tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            if tensor.numel()
            else b""
        )
    digest = h.hexdigest()[:16]
    object.__setattr__(model, "_hydra_fingerprint", ((versions, tuple(state)), digest))
    return digest


class DiskCache:
    """A folder of checksummed entries, grouped by kind (``greedy``, ``features``, ...).

    Args:
        root: the cache folder; defaults to :func:`hydra_core.paths.cache_dir`.
    """

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else cache_dir()

    def path(self, kind: str, key: str) -> Path:
        if not kind.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"cache kind {kind!r} must be letters, digits, '-' or '_'")
        return self.root / kind / f"{key}.pt"

    def load(self, kind: str, key: str) -> Any | None:
        """The stored value, or None when absent or corrupt (a corrupt file is removed)."""
        path = self.path(kind, key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        payload = data[len(MAGIC) + 32 :]
        if (
            data[: len(MAGIC)] != MAGIC
            or hashlib.sha256(payload).digest() != data[len(MAGIC) : len(MAGIC) + 32]
        ):
            warnings.warn(
                f"cache entry {path} is corrupt or incomplete; removing it and recomputing",
                CorruptCacheEntry,
                stacklevel=2,
            )
            path.unlink(missing_ok=True)
            return None
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)

    def save(self, kind: str, key: str, value: Any) -> Path:
        """Store ``value`` (anything ``torch.save`` accepts) atomically; returns the file path."""
        path = self.path(kind, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch.save(value, buffer)
        payload = buffer.getvalue()
        checked = MAGIC + hashlib.sha256(payload).digest() + payload

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                f.write(checked)
                f.flush()
                os.fsync(f.fileno())

        atomic_write(path, write)
        return path

    def delete(self, kind: str, key: str) -> None:
        self.path(kind, key).unlink(missing_ok=True)

    def get_or_compute(self, kind: str, key: str, compute: Callable[[], T]) -> T:
        """The cached value for ``key``, computing and storing it first when needed."""
        value = self.load(kind, key)
        if value is None:
            value = compute()
            self.save(kind, key, value)
        return value
