"""The public API resolves, and the engine never imports Streamlit."""

from __future__ import annotations

import subprocess
import sys

import hydra_core


def test_every_export_resolves():
    for name in hydra_core.__all__:
        assert getattr(hydra_core, name) is not None, name


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
