from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from hydra_core.cache import CorruptCacheEntry, DiskCache, cache_key, model_fingerprint
from tests.conftest import make_tiny_vit


@pytest.fixture
def cache(tmp_path) -> DiskCache:
    return DiskCache(tmp_path)


def test_round_trip(cache):
    value = {"order": [(0, 1), (2, 3)], "scores": torch.arange(3.0), "arr": np.eye(2)}
    cache.save("greedy", "abc", value)
    got = cache.load("greedy", "abc")
    assert got["order"] == value["order"]
    assert torch.equal(got["scores"], value["scores"])
    np.testing.assert_array_equal(got["arr"], value["arr"])


def test_missing_entry_is_none(cache):
    assert cache.load("greedy", "nothing") is None


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_corrupt_entry_is_detected_removed_and_recomputed(cache, damage):
    path = cache.save("features", "k", torch.arange(1000))
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        path.write_bytes(data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:])
    elif damage == "garbage":
        path.write_bytes(b"not a cache file at all")
    else:
        path.write_bytes(b"")
    with pytest.warns(CorruptCacheEntry, match="corrupt or incomplete"):
        assert cache.load("features", "k") is None
    assert not path.exists()
    calls = []
    value = cache.get_or_compute("features", "k", lambda: calls.append(1) or torch.ones(2))
    assert calls == [1] and torch.equal(value, torch.ones(2))
    assert torch.equal(cache.get_or_compute("features", "k", lambda: 1 / 0), torch.ones(2))


def test_failed_write_leaves_no_entry_and_no_temp_file(cache, monkeypatch):
    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        cache.save("greedy", "k", [1, 2, 3])
    assert cache.load("greedy", "k") is None
    assert list((cache.root / "greedy").iterdir()) == []


def test_keys_depend_on_every_part():
    base = cache_key("greedy", 1, objective="avg", x=torch.arange(4))
    assert base == cache_key("greedy", 1, objective="avg", x=torch.arange(4))
    assert base != cache_key("greedy", 2, objective="avg", x=torch.arange(4))
    assert base != cache_key("greedy", 1, objective="acc", x=torch.arange(4))
    assert base != cache_key("greedy", 1, objective="avg", x=torch.arange(1, 5))
    with pytest.raises(TypeError, match="cache key"):
        cache_key(object())


def test_model_fingerprint_tracks_weights():
    a, b = make_tiny_vit(seed=0), make_tiny_vit(seed=0)
    assert model_fingerprint(a) == model_fingerprint(b)
    before = model_fingerprint(a)
    with torch.no_grad():
        a.head.weight[0, 0] += 1
    assert model_fingerprint(a) != before
    assert model_fingerprint(make_tiny_vit(seed=1)) != model_fingerprint(b)


def test_bad_kind_is_refused(cache):
    with pytest.raises(ValueError, match="cache kind"):
        cache.path("../escape", "k")


def test_a_cache_folder_that_cannot_be_made_is_named_with_its_fix(tmp_path, monkeypatch, capsys):
    """A cache folder under a file (or anywhere unwritable) is the user's setting: one line
    naming it and how to give another, on the command line too (it was a bare OSError; the
    command line checks --cache-dir itself, the environment variable reaches the cache)."""
    from hydra_core.cli import main
    from hydra_core.errors import InputError
    from hydra_core.paths import cache_dir

    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(blocked / "cache"))
    with pytest.raises(InputError, match="cannot use .*a-file/cache as the cache folder"):
        cache_dir()
    argv = ["search", "--budget", "1", "--device", "cpu", "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "give a folder you can write with --cache-dir" in err[0]
