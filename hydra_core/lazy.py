"""Public names of a package imported on first use (PEP 562), so that importing one module of the
package, as the command line does, does not import every module's libraries."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_exports(
    package: dict, exports: Mapping[str, tuple[str, ...]]
) -> tuple[Callable, Callable]:
    """``__getattr__`` and ``__dir__`` for the package whose ``globals()`` is ``package``:
    ``exports`` maps a module to the names it gives the package. Sets the package's ``__all__``
    and ``_WHERE`` (each name's module)."""
    where = {name: module for module, names in exports.items() for name in names}
    package["__all__"], package["_WHERE"] = sorted(where), where

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package['__name__']!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        package[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(package) | set(where))

    return __getattr__, __dir__
