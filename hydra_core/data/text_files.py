"""Texts of your own: a CSV file with a header, or a JSONL file (one object a line), checked row by
row before a number is computed on them.

- **Texts** are the ``text`` column (key). A row without one is skipped (a warning counts them); a
  JSON value that is not a string (``42``, ``true``, a list) is refused, never dropped or
  converted: a number meant as a text is written in quotes.
- **Labels** (an in-distribution file's ``label``) are class indices (0, 1, ...) or class names,
  one kind in a file. Names are matched to the model's class names, ignoring case
  (``Positive`` is the class ``positive``), or to the order given as ``classes``; a name that is
  neither is refused with the names expected. Only a model that names no classes numbers the
  names in sorted order, with a warning. ``nan``, ``none``, ``null`` or an empty cell is a missing
  label, refused with its row.
- **Duplicates** (texts equal up to case and punctuation, as the embedded sets are deduplicated)
  are kept once, with a warning, so that one text can never land in both the search and the
  report half of a file; a text given two different labels is refused.
"""

from __future__ import annotations

import csv
import io
import json
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from hydra_core.data.images import GROUPS
from hydra_core.data.sources import TEXT_FILE_TYPES
from hydra_core.data.text import TextSet, text_key
from hydra_core.errors import InputError

#: label cells that mean "no label" (pandas writes NaN as ``nan``; other tools ``None``, ``NA``)
MISSING_LABELS = frozenset({"", "nan", "none", "null", "na", "n/a"})


class LabelOrderWarning(UserWarning):
    """A file's label names were numbered in sorted order: the model names no classes."""


class DuplicateTextWarning(UserWarning):
    """Rows of a text file were skipped: duplicates of an earlier text, or rows with no text."""


def _decode(path: Path) -> str:
    data = path.read_bytes()
    try:
        content = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path}: not UTF-8 text (byte {data[exc.start]:#x} at position {exc.start}); save "
            "the file as UTF-8"
        ) from None
    if not content.strip():
        raise InputError(f"{path}: the file is empty; give a header line and one text per row")
    return content


def _read_rows(path: Path) -> tuple[list[tuple[str, dict]], set[str]]:
    """The rows of a CSV or JSONL file as (where, row): ``where`` names the row in messages
    (``row 3`` of a CSV file's data, ``line 3`` of a JSONL file); and the columns (keys) seen."""
    content = _decode(path)
    if path.suffix.lower() == ".csv":
        limit = csv.field_size_limit()
        csv.field_size_limit(max(limit, len(content)))  # a long text is a text, not a fault
        try:
            reader = csv.DictReader(io.StringIO(content, newline=""))
            rows = [(f"row {i}", row) for i, row in enumerate(reader, start=1)]
        except csv.Error as exc:
            raise InputError(
                f"{path}: not a readable CSV file ({exc}); check its quoting"
            ) from None
        finally:
            csv.field_size_limit(limit)
        for where, row in rows[-1:]:  # an open quote reads the rest of the file as one field
            runs_on = any(isinstance(v, str) and "\n" in v for v in row.values())
            if runs_on and any(v is None for v in row.values()):
                raise InputError(
                    f"{path}: {where}: a quote opened there is never closed, so the rest of the "
                    "file reads as one text; check its quoting"
                )
        columns = {(c or "").strip() for c in reader.fieldnames or ()}
        rows = [(where, {(k or "").strip(): v for k, v in row.items()}) for where, row in rows]
        return rows, columns
    rows = []
    for number, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict):
            raise InputError(
                f"{path}, line {number}: not a JSON object; write one object per line, "
                'e.g. {"text": "...", "label": "positive"}'
            )
        rows.append((f"line {number}", row))
    return rows, set().union(*(row for _, row in rows)) if rows else set()


def _text(path: Path, where: str, value: object) -> str | None:
    """A row's text, or None for a row without one; a value that is not a string is refused."""
    if value is None:
        return None
    if not isinstance(value, str):
        kind = {bool: "true/false", int: "a number", float: "a number", list: "a list"}
        raise InputError(
            f"{path}, {where}: the text is {json.dumps(value)}, "
            f"{kind.get(type(value), 'an object')}, not a string; write it in quotes "
            f'("{json.dumps(value)}") to use it as a text'
        )
    return value.strip() or None


def _is_missing(value: object) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in MISSING_LABELS)


def _as_index(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 0 else None
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _is_name(value: object) -> bool:
    """A class name: text with a letter in it (``"1.5"`` or ``"-1"`` is a bad number, not a
    name)."""
    return isinstance(value, str) and any(c.isalpha() for c in value)


def _unique_names(path: Path, names: Sequence[str], what: str) -> tuple[str, ...]:
    names = tuple(str(n).strip() for n in names)
    folded = [n.casefold() for n in names]
    if len(set(folded)) != len(folded):
        twice = next(n for n, f in zip(names, folded, strict=True) if folded.count(f) > 1)
        raise InputError(
            f"{path}: {what} name {twice!r} twice (case is ignored); list each class once"
        )
    return names


def label_indices(
    path: Path,
    raw: Sequence[object],
    classes: Sequence[str] | None = None,
    model_classes: Sequence[str] | None = None,
) -> tuple[list[int], tuple[str, ...]]:
    """Labels as class indices and the class names they index (see the module docstring).

    Args:
        path: the file, named in messages.
        raw: one label a row (none missing: see :func:`load_text_file`).
        classes: the model's classes in output order, in the file's own names (``--classes``):
            names are matched to them, indices must be below their count.
        model_classes: the model's class names (its config): names are matched to them when
            ``classes`` is not given, indices must be below their count.
    """
    indices = [_as_index(v) for v in raw]
    bad = [v for v, i in zip(raw, indices, strict=True) if i is None and not _is_name(v)]
    if bad:
        raise InputError(
            f"{path}: label {bad[0]!r} is neither a class index (0, 1, ...) nor a class name; "
            "give every row an integer label or a class name"
        )
    if any(i is None for i in indices) and any(i is not None for i in indices):
        raise InputError(
            f"{path}: labels mix class indices and class names; use one kind in every row"
        )
    given = None if classes is None else _unique_names(path, classes, "the classes given")
    known = None if model_classes is None else _unique_names(path, model_classes, "the model's")
    order = given or known
    if all(i is not None for i in indices):
        top = max(indices)
        if order is not None and top >= len(order):
            whose = "classes given" if given else "classes of the model"
            raise InputError(
                f"{path}: label {top} but only {len(order)} {whose} ({', '.join(order)}); labels "
                "are positions in that list, from 0"
            )
        return indices, order or tuple(str(i) for i in range(top + 1))
    names = [str(v).strip() for v in raw]
    if order is None:  # a model without class names: the names' sorted order
        spelling = {}
        for name in names:
            spelling.setdefault(name.casefold(), name)
        order = tuple(spelling[k] for k in sorted(spelling))
        warnings.warn(
            f"{path}: no class order and no class names of the model, so the label names are "
            f"outputs in sorted order ({', '.join(f'{n}={i}' for i, n in enumerate(order))}); if "
            "the model's outputs are in another order, give it (--classes, Setup: 'Class order')",
            LabelOrderWarning,
            stacklevel=3,
        )
    position = {name.casefold(): i for i, name in enumerate(order)}
    unknown = sorted({n for n in names if n.casefold() not in position}, key=str.casefold)
    if unknown and given is not None:
        raise InputError(
            f"{path}: label(s) {', '.join(map(repr, unknown))} are not among the classes given "
            f"({', '.join(order)}); list each of the model's classes once, in output order"
        )
    if unknown:
        raise InputError(
            f"{path}: label(s) {', '.join(map(repr, unknown))} are not classes of the model "
            f"({', '.join(order)}); use its class names (any case), or give your label names in "
            f"its output order with --classes (Setup: 'Class order'), one for each of "
            f"{', '.join(order)}"
        )
    return [position[n.casefold()] for n in names], order


def _dedupe(
    path: Path, texts: list[str], wheres: list[str], labels: list[object] | None
) -> list[int]:
    """The rows to keep: the first of each text (up to case and punctuation); a text given two
    labels is refused."""
    first: dict[str, int] = {}
    keep = []
    for i, text in enumerate(texts):
        key = text_key(text) or text
        j = first.setdefault(key, i)
        if j == i:
            keep.append(i)
        elif (
            labels is not None
            and str(labels[i]).strip().casefold() != str(labels[j]).strip().casefold()
        ):
            raise InputError(
                f"{path}: the text {texts[j]!r} ({wheres[j]}) is given two labels, "
                f"{labels[j]!r} and {labels[i]!r} ({wheres[i]}); give each text one label"
            )
    return keep


def load_text_file(
    path: str | Path,
    *,
    group: str = "id",
    name: str | None = None,
    classes: Sequence[str] | None = None,
    model_classes: Sequence[str] | None = None,
) -> TextSet:
    """Texts of your own from a CSV file with a header, or a JSONL file (one object a line).

    The column (key) ``text`` holds the texts; for an in-distribution file (``group="id"``)
    ``label`` holds each text's class, as an index (0, 1, ...) or a class name (see the module
    docstring for how names are matched). Other columns, and the labels of an OOD file, are
    ignored. Rows with an empty text are skipped and duplicate texts kept once (a warning says
    how many). Texts are taken as they are (not cut into sentences): the model's tokenizer
    truncates long ones.

    Args:
        path: a ``.csv``, ``.jsonl`` or ``.ndjson`` file, UTF-8.
        group: ``"id"``, ``"near"`` or ``"far"``.
        name: the set's name in tables and cache keys; the file's name without suffix by default.
        classes: the model's classes in output order, in the file's own names (``--classes``).
        model_classes: the model's class names, which label names are matched to (any case)
            when ``classes`` is not given.

    Raises:
        InputError: a missing file or one of another type, an encoding other than UTF-8, an
            empty file, no ``text`` column, a text that is not a string, an ID file without
            labels, labels that are neither integers nor class names or are not the model's
            classes, a text with two labels (the one-line message names the file and the fix).
    """
    file = Path(path).expanduser()
    if group not in GROUPS:
        raise InputError(f"group must be one of {', '.join(GROUPS)}, got {group!r}")
    if not file.is_file():
        raise InputError(f"text file {file} does not exist; give the path of a CSV or JSONL file")
    if file.suffix.lower() not in TEXT_FILE_TYPES:
        raise InputError(
            f"{file}: expected a {', '.join(TEXT_FILE_TYPES)} file; save the texts as CSV with a "
            "header (text,label) or as JSONL"
        )
    rows, columns = _read_rows(file)
    need = "text,label" if group == "id" else "text"
    if "text" not in columns:
        raise InputError(
            f"{file}: no 'text' column (found: {', '.join(sorted(columns)) or 'none'}); name the "
            f"columns {need} in the header (JSONL: the keys)"
        )
    found = [(where, row, _text(file, where, row.get("text"))) for where, row in rows]
    kept = [(where, row, text) for where, row, text in found if text is not None]
    if not kept:
        raise InputError(f"{file}: no texts in the file; give one text per row under 'text'")
    wheres = [where for where, _, _ in kept]
    texts = [text for _, _, text in kept]
    raw = None
    if group == "id":
        missing = next((w for w, row, _ in kept if _is_missing(row.get("label"))), None)
        if "label" not in columns or missing:
            value = next((row.get("label") for w, row, _ in kept if w == missing), None)
            shown = f" ({missing} has {'none' if value in (None, '') else repr(value)})"
            where = "" if "label" not in columns else shown
            raise InputError(
                f"{file}: an in-distribution file needs a 'label' for every text{where}; add a "
                "label column (class index or name), or load it as an OOD set (group near/far)"
            )
        raw = [row["label"] for _, row, _ in kept]
    keep = _dedupe(file, texts, wheres, raw)
    skipped, twice = len(rows) - len(kept), len(texts) - len(keep)
    if skipped or twice:
        what = [f"{skipped} row(s) without a text skipped"] if skipped else []
        what += (
            [
                f"{twice} duplicate text(s) kept once (the first, so that no text is both "
                "searched and reported; case and punctuation ignored)"
            ]
            if twice
            else []
        )
        warnings.warn(f"{file}: {'; '.join(what)}", DuplicateTextWarning, stacklevel=2)
    texts = [texts[i] for i in keep]
    labels, order = None, None
    if raw is not None:
        indices, order = label_indices(file, [raw[i] for i in keep], classes, model_classes)
        labels = torch.tensor(indices, dtype=torch.int64)
    what = f"{len(order)} classes" if order else f"{group} OOD"
    return TextSet(
        name=name or file.stem,
        texts=tuple(texts),
        labels=labels,
        group=group,
        classes=order,
        description=f"{len(texts):,} texts from {file.name} ({what})",
        source=str(file),
    )
