"""Commands that hand Hydra Lab's results to other tools: ``export`` (a fused Hydra model, or one
structurally pruned member, as ONNX) and ``masks export`` (a mask file for nnsight, or as plain
JSON)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from hydra_core.cli.common import add_model_arguments, command, global_options, zero_shot_options
from hydra_core.errors import InputError


def _loaded_model(args: argparse.Namespace):
    """The model ``--model`` names (an analysable one: masks were made on it)."""
    from hydra_core.zoo.registry import load_model, parse_arch_kwargs

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
    p.add_argument(
        "--no-check",
        action="store_true",
        help="skip running the graph under onnxruntime against the torch model",
    )


@command("export", _export_arguments)
def _export(args: argparse.Namespace) -> int:
    """Export a fused Hydra model (or one pruned member) as ONNX, checked under onnxruntime."""
    from hydra_core.export.onnx import export_onnx, export_pruned_onnx
    from hydra_core.hydra.fused import fuse_members
    from hydra_core.models.preprocess import describe
    from hydra_core.zoo.registry import load_model

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
    out = Path(args.onnx)
    out.parent.mkdir(parents=True, exist_ok=True)
    check = not args.no_check
    if hydra is None:
        keep = members[0].keep
        written = export_pruned_onnx(loaded.model, keep, out, description=description, check=check)
    else:
        written = export_onnx(hydra, out, description=description, check=check)

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
        help="the file to write (default: results/masks/<mask file>_nnsight.py or _plain.json)",
    )
    e.set_defaults(run=_masks_export)


def _masks_export(args: argparse.Namespace) -> int:
    """Write a mask file's members for nnsight or as plain JSON."""
    from hydra_core.export.masks import nnsight_module, plain_masks_text

    loaded = _loaded_model(args)
    members = _members(args, loaded)
    stem = re.sub(r"\W", "_", Path(args.masks).stem)
    suffix = "_nnsight.py" if args.to == "nnsight" else "_plain.json"
    out = Path(args.out or f"results/masks/{stem}{suffix}")
    out.parent.mkdir(parents=True, exist_ok=True)
    count = f"{len(members)} member{'s' if len(members) > 1 else ''}"
    if args.to == "plain":
        out.write_text(plain_masks_text(members))
        print(f"wrote {out}: {count}, {{layer: [heads kept]}}")
        return 0
    module = re.sub(r"\W", "_", out.stem)
    out.write_text(nnsight_module(members, loaded.model, loaded.identity(), module=module))
    print(
        f"wrote {out}: {count} for nnsight; inside `with model.trace(...)`, "
        f"`{module}.apply(model, {members[0].name!r})` switches that member's dropped heads off"
    )
    return 0
