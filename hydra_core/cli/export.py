"""Commands that hand Hydra Lab's results to other tools: ``export`` (a fused Hydra model, or one
structurally pruned member, as ONNX) and ``masks export`` (a mask file for nnsight, or as plain
JSON)."""

from __future__ import annotations

import argparse
import keyword
import re
from pathlib import Path

import hydra_core.cli.options as options
from hydra_core.cli.common import (
    add_model_arguments,
    command,
    global_options,
    input_paths,
    zero_shot_options,
)
from hydra_core.errors import InputError


def _loaded_model(args: argparse.Namespace):
    """The model ``--model`` names (an analysable one: masks were made on it)."""
    from hydra_core.hydra.source import load_model  # fused Hydra files registered as a source
    from hydra_core.zoo.registry import parse_arch_kwargs

    loaded = load_model(
        args.model,
        arch=args.arch,
        arch_kwargs=parse_arch_kwargs(args.arch_kwargs),
        **zero_shot_options(args),
    )
    loaded.check_analysable()
    return loaded


def _members(args: argparse.Namespace, loaded):
    """The members of ``--masks``, checked against the model (``--member``: that one alone)."""
    from hydra_core.export.masks import select_members
    from hydra_core.masks import load_masks
    from hydra_core.models.adapter import head_layout

    layout = head_layout(loaded.model)
    members = load_masks(
        args.masks, layout, loaded.identity(), allow_identical=args.allow_identical
    )
    return select_members(members, args.member)


def _source_arguments(p: argparse.ArgumentParser) -> None:
    """--model and the rest, --classes, --masks, --member, --allow-identical."""
    add_model_arguments(p)
    p.add_argument(
        "--classes",
        default=None,
        metavar="A,B,C",
        help="OpenCLIP models: the zero-shot classes in output order (default: Fashion-MNIST's)",
    )
    p.add_argument(
        "--member",
        default=None,
        metavar="NAME_OR_POSITION",
        help="one member of the mask file, by name or position (default: every member)",
    )
    p.add_argument(
        "--allow-identical",
        action="store_true",
        help="accept members that keep the same heads (identical-members ablation)",
    )


# --- export ---------------------------------------------------------------------------------------


def _export_arguments(p: argparse.ArgumentParser) -> None:
    _source_arguments(p)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--masks",
        metavar="MASKS.json",
        help="a mask file: its members, pruned from --model, are fused (with --member, that "
        "member alone is exported as a structurally pruned model)",
    )
    source.add_argument(
        "--hydra",
        metavar="SAVED",
        help="a fused Hydra model saved by `hydra` or the Hydra page (hydra.safetensors), "
        "fine-tuned or not; needs no --model",
    )
    p.add_argument("--onnx", required=True, metavar="OUT.onnx", help="the ONNX file to write")
    _overwrite_argument(p, "--onnx")
    p.add_argument(
        "--no-check",
        action="store_true",
        help="skip running the graph under onnxruntime against the torch model",
    )
    for option in ("--model", "--arch", "--arch-kwargs", "--classes"):
        options.only_with(p, option, "--masks (a saved --hydra carries its model)", _from_masks)


def _from_masks(args: argparse.Namespace) -> bool:
    return not args.hydra


def _overwrite_argument(p: argparse.ArgumentParser, option: str) -> None:
    p.add_argument(
        "--overwrite",
        action="store_true",
        help=f"replace the file {option} names when it exists already (refused otherwise)",
    )


def _check_output(args: argparse.Namespace, path: str | Path, option: str) -> Path:
    """The output policy (:func:`hydra_core.outputs.check_output`) for ``path``, before any work:
    never an input of the command, a shipped file, an unwritable place, nor (without
    --overwrite) an existing file."""
    from hydra_core.outputs import check_output

    return check_output(path, overwrite=args.overwrite, option=option, reads=input_paths(args))


def module_name(stem: str) -> str:
    """A valid Python module name close to ``stem`` (``my-masks`` -> ``my_masks``, ``2026`` ->
    ``masks_2026``)."""
    name = re.sub(r"\W", "_", stem) or "masks"
    if name[0].isdigit():
        name = f"masks_{name}"
    return f"{name}_masks" if keyword.iskeyword(name) else name


def _check_module_file(path: Path, option: str = "--out") -> str:
    """The module name of the nnsight file ``path``, refused (one line with the fix) when
    ``import <name>`` could not import it: a name that is not a Python identifier, or no .py."""
    stem = path.stem
    if path.suffix != ".py" or not stem.isidentifier() or keyword.iskeyword(stem):
        fixed = path.with_name(f"{module_name(stem)}.py")
        raise InputError(
            f"{option} {path}: a module for nnsight must be a .py file whose name Python can "
            f"import (letters, digits and _, not starting with a digit); use {option} {fixed}"
        )
    return stem


@command("export", _export_arguments)
def _export(args: argparse.Namespace) -> int:
    """Export a fused Hydra model (or one pruned member) as ONNX, checked under onnxruntime."""
    from hydra_core.export.onnx import export_onnx, export_pruned_onnx
    from hydra_core.hydra.fused import fuse_members
    from hydra_core.hydra.source import load_model  # fused Hydra files registered as a source
    from hydra_core.models.preprocess import describe
    from hydra_core.outputs import write_output

    out = _check_output(args, args.onnx, "--onnx")  # before the model loads
    if args.hydra:
        if args.member is not None:
            raise InputError("--member picks a member of --masks; a saved Hydra is exported whole")
        loaded = load_model(args.hydra)
        if not loaded.is_fused:
            raise InputError(
                f"--hydra {args.hydra} is not a fused Hydra model (a file `hydra` or the Hydra "
                "page saved); export a model of your own with --model and --masks"
            )
        hydra, names, what = loaded.model, None, f"the saved Hydra {args.hydra}"
    else:
        loaded = _loaded_model(args)
        members = _members(args, loaded)
        names = [m.name for m in members]
        hydra = None
        if args.member is None:
            hydra = fuse_members([(loaded.model, m.keep) for m in members])
            what = (
                f"Hydra of {len(members)} member{'s' if len(members) > 1 else ''} of {args.masks}"
            )
        else:
            what = f"member {names[0]!r} of {args.masks}, structurally pruned"
    description = {
        "source": loaded.name,
        "classes": list(loaded.classes) if loaded.classes else None,
        "preprocess": describe(loaded.preprocess),
        "members": names,
    }
    description = {k: v for k, v in description.items() if v is not None}
    check = not args.no_check
    done = []

    def write(tmp: Path) -> None:  # the checked run of onnxruntime reads the file written
        if hydra is None:
            keep = members[0].keep
            done.append(
                export_pruned_onnx(loaded.model, keep, tmp, description=description, check=check)
            )
        else:
            done.append(export_onnx(hydra, tmp, description=description, check=check))

    write_output(out, write)
    written = done[0]

    def shapes(entries: dict) -> str:
        return ", ".join(f"{n} ({', '.join(map(str, s))})" for n, s in entries.items())

    print(f"wrote {out}: {what}")
    print(f"inputs: {shapes(written.inputs)}; outputs: {shapes(written.outputs)}")
    if written.max_difference is not None:
        difference = f"{written.max_difference:.1e}"
        print(f"onnxruntime vs torch: max |difference| {difference} on {written.checked_on}")
    return 0


# --- masks export ---------------------------------------------------------------------------------


def add_masks_export(p: argparse.ArgumentParser) -> None:
    """``masks export`` as a sub-command of ``masks`` (which builds mask files)."""
    from hydra_core.export.masks import TARGETS

    sub = p.add_subparsers(dest="masks_action", metavar="{export}")
    doc = "Write a mask file's members for nnsight (a Python module) or as plain JSON."
    e = sub.add_parser("export", help=doc, description=doc, parents=[global_options()])
    _source_arguments(e)
    e.add_argument("--masks", required=True, metavar="MASKS.json", help="the mask file")
    e.add_argument(
        "--to",
        required=True,
        choices=TARGETS,
        help="nnsight: a Python module (needs only torch) whose apply(model, member) switches "
        "heads off inside an nnsight trace, as ablate does (timm ViTs, Hugging Face encoders); "
        "plain: {member: {layer: [heads kept]}} JSON ({layer: [heads kept]} for one --member)",
    )
    e.add_argument(
        "--out",
        default=None,
        help="the file to write (default: results/masks/<mask file>_nnsight.py or _plain.json; "
        "for nnsight a .py file whose name Python can import)",
    )
    _overwrite_argument(e, "--out")
    e.set_defaults(run=_masks_export)


def _masks_export(args: argparse.Namespace) -> int:
    """Write a mask file's members for nnsight or as plain JSON."""
    from hydra_core.export.masks import nnsight_module, plain_masks_text
    from hydra_core.outputs import write_text

    stem = module_name(Path(args.masks).stem)
    suffix = "_nnsight.py" if args.to == "nnsight" else "_plain.json"
    out = _check_output(args, args.out or f"results/masks/{stem}{suffix}", "--out")
    module = _check_module_file(out) if args.to == "nnsight" else None
    loaded = _loaded_model(args)
    members = _members(args, loaded)
    count = f"{len(members)} member{'s' if len(members) > 1 else ''}"
    if args.to == "plain":
        write_text(out, plain_masks_text(members))
        print(f"wrote {out}: {count}, {{layer: [heads kept]}}")
        return 0
    write_text(out, nnsight_module(members, loaded.model, loaded.identity(), module=module))
    print(
        f"wrote {out}: {count} for nnsight; inside `with model.trace(...)`, "
        f"`{module}.apply(model, {members[0].name!r})` switches that member's dropped heads off"
    )
    return 0
