"""The benchmark scripts, the measurement scripts and the docs' examples are not run by the unit
tests (they take minutes to hours), so a refactor that moves a function can break them unseen
(bench/attribution.py imported ``held_out_sample`` from a module it had left). Every
``from hydra_core... import name`` in them must resolve."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*ROOT.glob("bench/*.py"), *ROOT.glob("scripts/*.py"), *ROOT.glob("docs/*.py")])


def _project_imports(path: Path) -> list[tuple[str, str | None, int]]:
    """(module, name or None, line) of every hydra_core import in the file, nested ones too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hydra_core"):
            found += [(node.module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [
                (alias.name, None, node.lineno)
                for alias in node.names
                if alias.name.startswith("hydra_core")
            ]
    return found


def _resolves(module: str, name: str | None) -> bool:
    try:
        imported = importlib.import_module(module)
    except ImportError:
        return False
    if name is None or hasattr(imported, name):
        return True
    try:  # a submodule: from hydra_core.analysis import greedy
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        return False
    return True


def test_the_scripts_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in SCRIPTS}
    assert {"bench/attribution.py", "docs/example.py"} <= names


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_project_import_resolves(path):
    broken = [
        f"line {line}: from {module} import {name}" if name else f"line {line}: import {module}"
        for module, name, line in _project_imports(path)
        if not _resolves(module, name)
    ]
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


def test_a_moved_name_is_caught(tmp_path):
    script = tmp_path / "moved.py"
    script.write_text("def f():\n    from hydra_core.report.stability import held_out_sample\n")
    ((module, name, _),) = _project_imports(script)
    assert not _resolves(module, name)
