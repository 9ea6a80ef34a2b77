"""Command line: ``python -m hydra_core <command> --help``, installed as ``hydra-lab`` too.

Each command lives in the module of its concern (``model``, ``analysis``, ``masks``, ``hydra``) and
registers itself with ``common.command``; this module builds the parser from the registry."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from hydra_core.cli.common import COMMANDS

# Importing a command module registers its commands, in this order in ``--help``.
for _module in ("model", "analysis", "masks", "hydra"):
    importlib.import_module(f"hydra_core.cli.{_module}")


def build_parser() -> argparse.ArgumentParser:
    installed = Path(sys.argv[0]).name == "hydra-lab"  # the console script, not python -m
    parser = argparse.ArgumentParser(
        prog="hydra-lab" if installed else "python -m hydra_core",
        description="Hydra Lab: find the attention heads that carry a transformer's uncertainty, "
        "and fuse pruned members into one Hydra ensemble.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (add_arguments, run) in COMMANDS.items():
        doc = (run.__doc__ or "").strip().splitlines()[0] if run.__doc__ else ""
        p = sub.add_parser(name, help=doc, description=doc)
        add_arguments(p)
        p.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)
