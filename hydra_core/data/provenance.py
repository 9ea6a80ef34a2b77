"""What data chose a system, and the refusal to report a system on data that chose it.

A system's heads are searched, its weights fine-tuned or its temperature fitted on some items;
reporting it on any of those items measures how well it fits the data that chose it, not how well
it works. :class:`ChosenOn` carries those items (one content hash per item: equal pixels or equal
text give equal keys, whatever set they sit in) and :meth:`ChosenOn.check` refuses a report set
that shares any of them. :func:`hydra_core.experiment.evaluate.evaluate_systems` checks every system
against every report part before it predicts anything.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from hydra_core.errors import InputError


def row_keys(inputs: torch.Tensor | Sequence[str]) -> list[bytes]:
    """One hash per item, in order, of its pixels (uint8 images) or its text."""
    rows = (
        (row.contiguous().numpy().tobytes() for row in inputs.cpu())
        if isinstance(inputs, torch.Tensor)
        else (text.encode() for text in inputs)
    )
    return [hashlib.blake2b(row, digest_size=16).digest() for row in rows]


def item_keys(inputs: torch.Tensor | Sequence[str]) -> frozenset[bytes]:
    """The items' hashes (:func:`row_keys`) as a set."""
    return frozenset(row_keys(inputs))


@dataclass(frozen=True)
class ChosenOn:
    """The items a system was chosen on, and what they chose, in words.

    ``parts``: one line per set used, e.g. ``"heads: photos (n=256)"``; ``keys``: the items'
    hashes (:func:`item_keys`). Combine with ``|``. An empty ``ChosenOn()`` (the source model
    as it is) is never refused.
    """

    parts: tuple[str, ...] = ()
    keys: frozenset[bytes] = frozenset()

    @classmethod
    def of(cls, purpose: str, data_sets: Iterable) -> ChosenOn:
        """``purpose`` ("heads", "fine-tuning", "temperature", ...) was chosen on ``data_sets``
        (image or text sets with ``name`` and ``inputs``)."""
        data_sets = list(data_sets)
        return cls(
            tuple(f"{purpose}: {d.name} (n={len(d)})" for d in data_sets),
            frozenset().union(*(item_keys(d.inputs) for d in data_sets)),
        )

    def __or__(self, other: ChosenOn) -> ChosenOn:
        return ChosenOn(self.parts + other.parts, self.keys | other.keys)

    def seen(self, keys: frozenset[bytes]) -> int:
        """How many of the items ``keys`` chose this system."""
        return len(self.keys & keys)

    def check(self, system: str, report: Sequence[tuple[str, frozenset[bytes]]]) -> None:
        """Refuse to report ``system`` on any report set (name, item keys) that shares an item
        with the data that chose it."""
        seen = [(name, self.seen(keys), len(keys)) for name, keys in report]
        seen = [(name, n, total) for name, n, total in seen if n]
        if not seen:
            return
        where = ", ".join(f"{name} ({n} of {total} items)" for name, n, total in seen)
        raise InputError(
            f"system {system!r} would be reported on data that chose it: {where} were among the "
            f"items it was chosen on ({'; '.join(self.parts)}); report it only on sets its "
            "selection never used (remove those sets from the report, or choose it on other data)"
        )
