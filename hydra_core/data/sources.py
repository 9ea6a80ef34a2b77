"""Data of your own as the command line and the Setup page name it: image folders or text files,
each a set with a role and a name, checked before anything is loaded.

An entry is ``[near:|far:|search:][NAME=]PATH`` (an in-distribution entry takes no role):

- the role prefix: ``near:`` or ``far:`` to report on the set (a bare path is far), ``search:``
  to select heads on it (never reported);
- ``NAME=``: the set's name in every table, cache key and result file. Without it a set is named
  after its folder (``/data/textures`` -> ``textures``) or its file without the suffix
  (``reviews.csv`` -> ``reviews``).

Names must differ from each other and from the named sets (``--ood mnist``) and the ID set's, or a
table would show two rows of one name (and a result keyed by the name would belong to both): two
sets of one name are refused, saying which and how to name one of them. Paths are checked the same
way: a folder that is missing, a file where a folder belongs, a file of another type.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hydra_core.errors import InputError

#: a set's name given as ``NAME=PATH``: letters, digits, ``_``, ``-`` and ``.``
_NAMED = re.compile(r"(?P<name>[\w.-]+)=(?P<path>.+)")
#: role prefix -> (role, group)
PREFIXES = {"near": ("report", "near"), "far": ("report", "far"), "search": ("search", "far")}
#: what a text file may be
TEXT_FILE_TYPES = (".csv", ".jsonl", ".ndjson")


@dataclass(frozen=True)
class Source:
    """One set of your own: where it is, its role and group, and its name.

    Args:
        entry: the text as given (``"far: mine=/data/x"``), for messages.
        path: the folder or file.
        name: the ``NAME=`` given, else the folder's name or the file's stem.
        role: ``"id"``, ``"search"`` or ``"report"``.
        group: ``"id"``, ``"near"`` or ``"far"`` (a search set is labelled far; it is never
            reported).
        files: a text file (True) or an image folder (False).
        named: whether the name was given with ``NAME=``.
    """

    entry: str
    path: str
    name: str
    role: str
    group: str
    files: bool
    named: bool = False

    @property
    def kind(self) -> str:
        """``"file"`` or ``"folder"``: what messages call it."""
        return "file" if self.files else "folder"

    @property
    def prefix(self) -> str:
        """The role prefix that gives this source its role again (``"far:"``; ``""`` for ID)."""
        if self.role == "id":
            return ""
        return "search:" if self.role == "search" else f"{self.group}:"

    def renamed(self, name: str) -> str:
        """This entry with another name, as a user would write it."""
        return f"{self.prefix}{name}={self.path}"


def split_name(text: str) -> tuple[str | None, str]:
    """``"mine=/data/x"`` -> ``("mine", "/data/x")``; ``"/data/x"`` -> ``(None, "/data/x")``. A
    path that exists as written (a file named ``a=b.csv``) is a path, never a name."""
    text = text.strip()
    match = _NAMED.fullmatch(text)
    if match is None or Path(text).expanduser().exists():
        return None, text
    return match["name"], match["path"].strip()


def _default_name(path: str, files: bool) -> str:
    where = Path(path).expanduser()
    return where.stem if files else where.name


def parse_source(entry: str, *, files: bool) -> Source:
    """An OOD entry ``[near:|far:|search:][NAME=]PATH`` as a :class:`Source` (a bare path is a
    far report set)."""
    prefix, sep, rest = entry.partition(":")
    if sep and prefix.strip() in PREFIXES:
        role, group = PREFIXES[prefix.strip()]
    else:
        looks_like_role = re.fullmatch(r"[A-Za-z][\w-]+", prefix.strip()) is not None
        if sep and looks_like_role and not Path(entry).expanduser().exists():
            raise InputError(
                f"{entry}: {prefix.strip()!r} is not a role; begin with near:, far: or search: "
                "(or give a bare path, a far report set)"
            )
        role, group, rest = "report", "far", entry
    name, path = split_name(rest)
    return Source(entry, path, name or _default_name(path, files), role, group, files, bool(name))


def parse_id_source(entry: str, *, files: bool) -> Source:
    """The in-distribution entry ``[NAME=]PATH`` as a :class:`Source`."""
    name, path = split_name(entry)
    return Source(entry, path, name or _default_name(path, files), "id", "id", files, bool(name))


def source_path(entry: str) -> str:
    """The path of an entry, without its role prefix or name."""
    prefix, sep, rest = entry.partition(":")
    return split_name(rest if sep and prefix.strip() in PREFIXES else entry)[1]


def check_paths(sources: Sequence[Source]) -> None:
    """Refuse, before anything is loaded, a source whose path is missing or of the wrong kind: an
    image set is a folder, a text set a ``.csv``/``.jsonl``/``.ndjson`` file (InputError)."""
    for source in sources:
        path = Path(source.path).expanduser()
        what = f"the {'ID' if source.role == 'id' else 'OOD'} {source.kind} {source.path}"
        if not path.exists():
            given = "" if source.entry.strip() == source.path else f" (given as {source.entry})"
            raise InputError(f"{what} does not exist; check the path{given}")
        if source.files and path.is_dir():
            raise InputError(
                f"{what} is a folder; a text set is one CSV (header text,label) or JSONL file"
            )
        if source.files and path.suffix.lower() not in TEXT_FILE_TYPES:
            raise InputError(
                f"{what}: expected a {', '.join(TEXT_FILE_TYPES)} file; save the texts as CSV with "
                "a header (text,label) or as JSONL"
            )
        if not source.files and not path.is_dir():
            raise InputError(
                f"{what} is a file; an image set is a folder of images (or of class folders)"
            )


def check_names(
    id_name: str,
    id_source: Source | None,
    named: Sequence[tuple[str, str]],
    sources: Sequence[Source],
) -> None:
    """Refuse two sets of one name, before anything is loaded (InputError naming both and how to
    name one of them).

    Args:
        id_name: the ID set's name (a default set's, or ``id_source``'s).
        id_source: the ID data of your own, or None for the default set.
        named: the named OOD sets, as (name, role): ``("mnist", "report")``.
        sources: the OOD data of your own.
    """
    seen = {id_name: _described(id_source, id_name)}
    for name, role in named:
        what = f"the {role} OOD set {name!r}"
        if name in seen and name == id_name and id_source is not None:
            raise InputError(
                f"{seen[name]} is named {name!r}, as {what}: two sets may not share a name; name "
                f"it with NAME=PATH, e.g. {id_source.renamed(f'my_{name}')}"
            )
        if name in seen:
            raise InputError(f"{what} is chosen twice; name each set once")
        seen[name] = what
    for source in sources:
        if source.name in seen:
            suffix = "search" if source.role == "search" else source.group
            raise InputError(
                f"{_described(source, source.name)} is named {source.name!r}, as "
                f"{seen[source.name]}: two sets may not share a name; name one of them with "
                f"NAME=PATH, e.g. {source.renamed(f'{source.name}_{suffix}')}"
            )
        seen[source.name] = _described(source, source.name)


def _described(source: Source | None, name: str) -> str:
    """How a message names a set: ``the ID folder /data/x``, ``the near OOD file a.csv``."""
    if source is None:
        return f"the ID set {name!r}"
    role = "ID" if source.role == "id" else f"{source.prefix.rstrip(':')} OOD"
    return f"the {role} {source.kind} {source.path}"
