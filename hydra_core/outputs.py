"""Where a command writes, and whose results a folder holds.

Every output folder a command writes (``search --out``, ``hydra --out``, a report's folder) holds
``.hydra-run.json``: the model (name, layers, heads, a fingerprint of its weights) and, per
command, the data its results were computed on. A later run into the same folder must be of the
same model and, for the same command, the same data: anything else would replace finished results
of another run without a word, so it is refused unless the user says ``--overwrite``. A folder
that holds files no run claims (a folder of one's own, or results from before these files) is
refused the same way. Result files (a search's JSON, a mask file) carry the model and the data
too, so that a command that reads one (``importance --greedy``) can refuse another model's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from hydra_core.errors import InputError
from hydra_core.files import atomic_write

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
    """
    folder = Path(folder).expanduser()
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{option} {folder} is a file; give a folder (it is created if missing)")
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
    if record is None or not same_model(record.get("model"), model):
        record = {"format": FORMAT, "model": model, "data": {}}
    record["data"] = {**record.get("data", {}), command: data}
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / MANIFEST, lambda tmp: tmp.write_text(json.dumps(record, indent=1)))
    return folder


def check_new_file(path: str | Path, *, overwrite: bool = False, option: str = "--out") -> Path:
    """A file a command is about to write: refused (InputError) where a folder is, or where a
    file is already, unless ``overwrite``. Returns the path (its folder is made when the file is
    written, so that a refused command leaves nothing behind)."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise InputError(f"{option} {path} is a folder; give the path of the file to write")
    if path.exists() and not overwrite:
        raise InputError(
            f"{option} {path} exists already (an earlier run, or a file shipped with Hydra Lab); "
            "choose another path, or pass --overwrite to replace it"
        )
    return path


def check_result_file(
    path: str | Path, *, model: dict, overwrite: bool = False, option: str = "--out"
) -> Path:
    """A result file (JSON with a ``model`` entry, such as a mask file) a command is about to
    write: an existing one of the same model is replaced, anything else refused (InputError)
    unless ``overwrite``. Returns the path."""
    path = Path(path).expanduser()
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
    return check_new_file(path, overwrite=True, option=option)


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
