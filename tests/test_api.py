"""The public API resolves, and the engine never imports Streamlit."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import hydra_core


def test_every_export_is_the_object_its_module_defines():
    """``hydra_core.X`` is the module's own X (not a stale copy), and each is documented."""
    for name in hydra_core.__all__:
        module = importlib.import_module(hydra_core._WHERE[name])
        value = getattr(hydra_core, name)
        assert value is getattr(module, name), name
        assert getattr(value, "__module__", module.__name__).startswith("hydra_core."), name
        if callable(value):
            assert (value.__doc__ or "").strip(), f"hydra_core.{name} has no docstring"


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'greedy_circle'"):
        hydra_core.greedy_circle  # noqa: B018


def test_no_module_of_hydra_core_imports_streamlit():
    code = (
        "import importlib, pkgutil, sys, hydra_core\n"
        "for m in pkgutil.walk_packages(hydra_core.__path__, 'hydra_core.'):\n"
        "    if m.name != 'hydra_core.__main__':\n"
        "        importlib.import_module(m.name)\n"
        "print(sorted(k for k in sys.modules if k.split('.')[0] == 'streamlit'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
