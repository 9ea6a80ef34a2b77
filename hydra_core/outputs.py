"""Where a command writes, and whose results a folder holds.

Every output folder a command writes (``search --out``, ``hydra --out``, a report's folder) holds
``.hydra-run.json``: the model (name, layers, heads, a fingerprint of its weights) and, per
command, the data its results were computed on. A later run into the same folder must be of the
same model and, for the same command, the same data: anything else would replace finished results
of another run without a word, so it is refused unless the user says ``--overwrite``. A folder
that holds files no run claims (a folder of one's own, or results from before these files) is
refused the same way. Result files (a search's JSON, a mask file) carry the model and the data
too, so that a command that reads one (``importance --greedy``) can refuse another model's.

The output policy, one for every writer (see docs/output-policy.md): :func:`check_output` before
the work starts (an existing file refused without ``--overwrite``; never an input of the same
command nor a file inside the installed package, such as a shipped checkpoint; the place
writable: its folder a folder one may write, the target not a folder), then :func:`write_output`
(atomic: a temporary file beside the target, then a rename; a failure leaves neither the
temporary file nor its name in the message). Folders are claimed with :func:`claim_folder`, which
checks the same place rules; every file written into a claimed folder still goes through
:func:`write_output`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from hydra_core.errors import InputError
from hydra_core.files import atomic_write
from hydra_core.paths import PACKAGE_DIR

#: the file in an output folder that says whose results it holds
MANIFEST = ".hydra-run.json"
FORMAT = "hydra-run"


def same_model(a: dict | None, b: dict | None) -> bool:
    """Whether two model identities (``LoadedModel.identity()``) are the same weights."""
    keys = ("layers", "heads", "weights")
    return bool(a) and bool(b) and all(a.get(k) == b.get(k) for k in keys)


def describe_towers(towers: dict | None) -> str:
    """``image 12 + text 12 layers`` for a mask file's or a layout's towers."""
    if not towers:
        return "one transformer"
    return " + ".join(f"{name} {count}" for name, count in towers.items()) + " layers"


def describe_model(identity: dict) -> str:
    """``'fmnist-vit-default' (6 x 12 heads, weights 1a2b3c...)``; a model of several towers
    says which (``image 12 + text 12 layers``)."""
    towers = identity.get("towers")
    layers = (
        describe_towers(towers)
        if towers
        else f"{identity.get('layers')} x {identity.get('heads')} heads"
    )
    return f"{identity.get('name')!r} ({layers}, weights {identity.get('weights')})"


def _read_manifest(folder: Path) -> dict | None:
    try:
        record = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        return None
    return record


def _results(folder: Path) -> list[str]:
    """The files in ``folder`` a run may have written (not hidden files, not sub-folders)."""
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def data_identity(benchmark, parts: str = "all") -> dict:
    """What a result was computed on: the sets' names and a fingerprint of their items, of a
    :class:`~hydra_core.data.benchmark.Benchmark`'s ``search`` parts (ID search split, search OOD
    sets), its ``report`` parts, or ``all``."""
    chosen = {
        "search": [benchmark.id_search, *benchmark.ood_search],
        "report": [benchmark.id_report, *benchmark.ood_report],
    }
    sets = chosen[parts] if parts in chosen else chosen["search"] + chosen["report"]
    h = hashlib.sha256(f"{benchmark.protocol};".encode())
    for part in sets:
        h.update(f"{part.name}:{part.fingerprint()};".encode())
    return {"sets": [s.name for s in sets], "fingerprint": h.hexdigest()[:16]}


def claim_folder(
    folder: str | Path,
    *,
    model: dict,
    data: dict,
    command: str,
    overwrite: bool = False,
    option: str = "--out",
    reads: Mapping | None = None,
    options: Mapping | None = None,
    record: bool = True,
    run: str | None = None,
) -> Path:
    """Make ``folder`` the output of this run, or refuse it (InputError) when it holds the results
    of another: another model, the same command on other data, or files no run claims; unless
    ``overwrite``. Creates the folder and records the run in its manifest; returns the folder.

    Args:
        folder: the output folder.
        model: the model's identity (:meth:`~hydra_core.zoo.registry.LoadedModel.identity`).
        data: the data's identity (``{"sets": [...], "fingerprint": ...}``).
        command: the command (or report) writing; each keeps its data in the manifest.
        overwrite: replace another run's results (the user said ``--overwrite``).
        option: the option that named the folder, for messages.
        reads: the command's inputs (option -> path), never written onto (:func:`check_place`).
        options: every option that changes the results (its name as the user gives it ->
            value): part of the run's identity, so that the same command with other options
            (``sweep --points 2`` into a sweep of other points) is refused, not taken as a
            resume, naming the option that differs.
        record: write the manifest now (False: only check; the caller records the run when its
            files are in place, so that a run that fails leaves no folder holding only the
            manifest).
        run: the name ``options`` are kept under (default ``command``): a command that writes
            several runs into one folder (a search per objective) names each.
    """
    run = run or command
    folder = Path(folder).expanduser()
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{option} {folder} is a file; give a folder (it is created if missing)")
    check_place(folder, option=option, reads=reads)
    record_now = record
    record, files = _read_manifest(folder), _results(folder)
    again = "choose another " + option + " (a new folder), or pass --overwrite to replace them"
    if files and not overwrite:
        if record is None:
            shown = ", ".join(files[:3]) + (", ..." if len(files) > 3 else "")
            raise InputError(
                f"{folder} already holds files that no Hydra Lab run of this version claims "
                f"({shown}); {again}"
            )
        if not same_model(record.get("model"), model):
            raise InputError(
                f"{folder} holds the results of another model, "
                f"{describe_model(record.get('model') or {})}, not {describe_model(model)}; "
                f"{again}"
            )
        earlier = record.get("data", {}).get(command)
        if earlier is not None and earlier.get("fingerprint") != data.get("fingerprint"):
            raise InputError(
                f"{folder} holds {command} results of this model on other data (sets "
                f"{', '.join(earlier.get('sets', []))}, fingerprint {earlier.get('fingerprint')}; "
                f"now {', '.join(data.get('sets', []))}, {data.get('fingerprint')}); {again}"
            )
        before = (record.get("options") or {}).get(run)
        now = _plain(options) if options is not None else None
        # an option the folder's version did not have reads as None (its value then)
        differ = (
            []
            if before is None or now is None
            else sorted(k for k in {*before, *now} if before.get(k) != now.get(k))
        )
        if differ:
            name = differ[0]
            raise InputError(
                f"{folder} holds {run} results made with {name} {_shown(before.get(name))}, "
                f"not {_shown(now.get(name))} (other options are another run, not a resume); "
                f"{again}"
            )
    if not record_now:
        return folder
    if record is None or not same_model(record.get("model"), model):
        record = {"format": FORMAT, "model": model, "data": {}}
    record["data"] = {**record.get("data", {}), command: data}
    if options is not None:
        record["options"] = {**(record.get("options") or {}), run: _plain(options)}
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    if created:
        _CREATED.append(folder)
    atomic_write(folder / MANIFEST, lambda tmp: tmp.write_text(json.dumps(record, indent=1)))
    return folder


#: folders :func:`claim_folder` created in this process (see :func:`release_unfinished`)
_CREATED: list[Path] = []


def _plain(options: Mapping) -> dict:
    """``options`` as JSON gives them back (tuples as lists), to compare with a manifest's."""
    return json.loads(json.dumps(dict(options), default=str))


def _shown(value) -> str:
    if value is None:
        return "not given"
    if isinstance(value, list):
        return " ".join(map(str, value)) or "(none)"
    return json.dumps(value) if isinstance(value, dict) else str(value)


def release_unfinished() -> list[Path]:
    """Remove the folders this process created with :func:`claim_folder` that hold nothing but
    the manifest (a command refused or failed after claiming its folder): a failed run leaves
    no folder behind. Returns the folders removed."""
    removed = []
    while _CREATED:
        folder = _CREATED.pop()
        try:
            if [p.name for p in folder.iterdir()] == [MANIFEST]:
                (folder / MANIFEST).unlink()
                folder.rmdir()
                removed.append(folder)
        except OSError:
            continue
    return removed


def forget_created() -> None:
    """The folders claimed so far hold finished results: :func:`release_unfinished` keeps them."""
    _CREATED.clear()


def leftover_staging(folder: str | Path) -> list[Path]:
    """The staging folders (``.<name>.partial-*``) beside ``folder`` that a report or sweep into
    it left when it was killed (a run still going has one too)."""
    folder = Path(folder).expanduser()
    parent = folder.parent if folder.parent.is_dir() else None
    if parent is None:
        return []
    return sorted(p for p in parent.glob(f".{folder.name}.partial-*") if p.is_dir())


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder)
    except ValueError:
        return False
    return True


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_place(path: str | Path, *, option: str = "--out", reads: Mapping | None = None) -> Path:
    """Whether ``path`` (a file or a folder to write) may be written at all, whatever it holds:
    not inside the installed package (a shipped checkpoint, the code), not an input the command
    reads (``reads``: option -> path; a file inside an input folder counts), and its nearest
    existing folder a folder this user may write. Refused in one line (InputError) naming
    ``option``, the path and the fix; returns the path."""
    path = Path(path).expanduser()
    resolved = path.resolve()
    if _inside(resolved, PACKAGE_DIR):
        raise InputError(
            f"{option} {path} is inside the installed Hydra Lab package ({PACKAGE_DIR}), whose "
            "files (the shipped checkpoints among them) are never replaced; write somewhere "
            "else, such as results/"
        )
    for name, given in (reads or {}).items():
        if not given:
            continue
        source = Path(given).expanduser()
        same = resolved == source.resolve() or _same_file(path, source)
        # a file that is there inside an input folder is part of that input (a model folder's
        # config.json, an image of a data folder); a new file or a folder beside them is not
        within = source.is_dir() and path.is_file() and _inside(resolved, source.resolve())
        if same or within:
            raise InputError(
                f"{option} {path} is {'' if same else 'inside '}the {name} this command reads; "
                f"choose another {option} path"
            )
    above = path if path.is_dir() else path.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise InputError(
            f"{option} {path} cannot be written: {above} is a file, not a folder; choose a path "
            "in a folder"
        )
    if not os.access(above, os.W_OK | os.X_OK):
        raise InputError(
            f"{option} {path} cannot be written: {above} is not writable for you; choose a "
            "folder you can write to"
        )
    return path


def check_output(
    path: str | Path,
    *,
    overwrite: bool = False,
    option: str = "--out",
    reads: Mapping | None = None,
) -> Path:
    """The output policy for a file a command is about to write, checked BEFORE the work: refused
    (InputError, one line naming ``option``, the path and the fix) where a folder is, where a
    file is already (unless ``overwrite``), where the file is an input of the command
    (``reads``: option -> path), inside the installed package, or in a place this user cannot
    write. Returns the path; :func:`write_output` writes it (its folder is made then, so that a
    refused command leaves nothing behind)."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise InputError(f"{option} {path} is a folder; give the path of the file to write")
    check_place(path, option=option, reads=reads)
    if path.exists() and not overwrite:
        raise InputError(
            f"{option} {path} exists already (an earlier run?); choose another path, or pass "
            "--overwrite to replace it"
        )
    return path


def check_new_file(path: str | Path, *, overwrite: bool = False, option: str = "--out") -> Path:
    """:func:`check_output` without inputs (kept for callers of an earlier version)."""
    return check_output(path, overwrite=overwrite, option=option)


def write_output(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Write ``path`` through the policy's last step: ``write(tmp)`` on a temporary file beside
    it, then an atomic rename. A failure removes the temporary file; an operating-system error
    (disk full, permission, a folder in the way) is one line naming ``path``, never the
    temporary file. Returns ``path``."""
    path = Path(path)
    try:
        atomic_write(path, write)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InputError(
            f"could not write {path}: {reason}; check that its folder exists, has space and is "
            "yours to write"
        ) from None
    return path


def write_text(path: str | Path, text: str) -> Path:
    """:func:`write_output` of a text."""
    return write_output(path, lambda tmp: tmp.write_text(text))


def write_json(path: str | Path, data, indent: int = 2) -> Path:
    """:func:`write_output` of ``data`` as JSON."""
    return write_text(path, json.dumps(data, indent=indent))


def write_csv(path: str | Path, frame, **kwargs) -> Path:
    """:func:`write_output` of a pandas frame as CSV (``kwargs`` go to ``to_csv``)."""
    return write_output(path, lambda tmp: frame.to_csv(tmp, **kwargs))


def check_result_file(
    path: str | Path,
    *,
    model: dict,
    overwrite: bool = False,
    option: str = "--out",
    reads: Mapping | None = None,
) -> Path:
    """A result file (JSON with a ``model`` entry, such as a mask file) a command is about to
    write: an existing one of the same model is replaced (the same command again), anything else
    refused (InputError) unless ``overwrite``; the place is checked as :func:`check_output`
    does. Returns the path."""
    path = Path(path).expanduser()
    if not path.is_dir():
        check_place(path, option=option, reads=reads)
    if path.is_file() and not overwrite:
        try:
            found = json.loads(path.read_text()).get("model")
        except (OSError, ValueError, AttributeError):
            found = None
        if not same_model(found, model):
            whose = f"the results of {describe_model(found)}" if found else "a file of another kind"
            raise InputError(
                f"{option} {path} exists and holds {whose}; choose another path, or pass "
                "--overwrite to replace it"
            )
    return check_output(path, overwrite=True, option=option, reads=reads)


def check_made_for(found: dict | None, model: dict, what: str) -> str | None:
    """Refuse a result made for another model (InputError naming both); a result that names no
    model (an older file) returns a warning to show instead. ``found`` is the result's
    ``model`` entry."""
    if not found:
        return f"{what} names no model (an older file): make sure it was made for this one"
    if not same_model(found, model):
        raise InputError(
            f"{what} was made for {describe_model(found)}, not the loaded model "
            f"{describe_model(model)}; use a result of this model, or load that one"
        )
    return None


def check_source(found: dict, model: dict, data: dict | None, what: str, hint: str) -> str | None:
    """The provenance of a file another run wrote (a JSON object with ``model`` and ``data``
    entries, as every result file carries), checked against this run: another model's refused
    (:func:`check_made_for`), one computed on other data (another data fingerprint) refused too,
    ``hint`` saying how to get a matching one. A file naming no model returns a warning to show;
    one naming no data (an older file) is taken on its model alone."""
    note = check_made_for(found.get("model"), model, what)
    earlier = found.get("data")
    if data and isinstance(earlier, dict) and earlier.get("fingerprint"):
        if earlier["fingerprint"] != data.get("fingerprint"):
            raise InputError(
                f"{what} was computed on other data (sets {', '.join(earlier.get('sets', []))}, "
                f"fingerprint {earlier['fingerprint']}) than this run's (sets "
                f"{', '.join(data.get('sets', []))}, fingerprint {data.get('fingerprint')}); "
                f"{hint}"
            )
    return note
