"""Command line: ``python -m hydra_core <command> --help``, installed as ``hydra-lab`` too.

Each command lives in the module of its concern (``model``, ``analysis``, ``masks``, ``hydra``) and
registers itself with ``common.command``; this module builds the parser from the registry."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path

import hydra_core.cli.options as options
from hydra_core import distributed, errors
from hydra_core.cli.common import COMMANDS, global_options, warn
from hydra_core.errors import InputError, Terminated, raise_terminated

# Importing a command module registers its commands, in this order in ``--help``.
for _module in (
    "model",
    "text",
    "analysis",
    "transfer",
    "heads",
    "masks",
    "hydra",
    "sweep",
    "export",
):
    importlib.import_module(f"hydra_core.cli.{_module}")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line's parser. Given the ``argv`` it will parse, only the command named there
    gets its arguments (a command's defaults and choices import the modules they come from, so
    ``--help`` and every other command need not): every command does when ``argv`` is None."""
    named = None if argv is None else options.named_command(argv)
    installed = Path(sys.argv[0]).name == "hydra-lab"  # the console script, not python -m
    parser = options.OneLineParser(
        prog="hydra-lab" if installed else "python -m hydra_core",
        description="Hydra Lab: find the attention heads that carry a transformer's uncertainty, "
        "and fuse pruned members into one Hydra ensemble.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    shared = global_options()
    for name, (add_arguments, run) in COMMANDS.items():
        doc = summary(run.__doc__)
        # argparse %-formats a help string (not a description): "95% intervals" is text there
        p = sub.add_parser(name, help=doc.replace("%", "%%"), description=doc, parents=[shared])
        if named is None or named == name:
            add_arguments(p)
        p.set_defaults(run=run)
    return parser


def _version() -> str:
    """The installed project's version (``pyproject.toml``), or "unknown" in a checkout that
    was never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hydra-lab")
    except PackageNotFoundError:
        return "unknown (not installed: make setup)"


def summary(docstring: str | None) -> str:
    """A command's one-sentence summary for ``--help``: its docstring's first paragraph on one
    line (a summary wrapped over two source lines is not cut at the line break)."""
    first = (docstring or "").strip().split("\n\n")[0]
    return " ".join(first.split())


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    warn(str(message))


#: the commands that split their work over the processes of ``torchrun`` (hydra_core.distributed)
DISTRIBUTED_COMMANDS = ("search", "transfer", "importance", "hydra", "train-ensemble", "report")

#: what Ctrl-C (exit code 130) or SIGTERM (143) prints: searches save every step and training every
#: epoch, so a rerun goes on from there; a run stopped before its first step saved nothing yet
STOPPED = (
    "stopped; run the same command again to go on from the last saved step or epoch (nothing is "
    "saved before the first one)"
)

#: errors that a user's input causes: ours (InputError is a ValueError) and the libraries' for
#: unreadable files, impossible devices and the like; shown as one line, not a traceback
USER_ERRORS = (ValueError, OSError, RuntimeError)


def main(argv: list[str] | None = None) -> int:
    """Run a command; a user error ends as one line on stderr and exit code 2 (``--debug`` shows
    the traceback), Ctrl-C as a note that saved work resumes (exit code 130), SIGTERM the same
    way (exit code 143, after the clean-up Ctrl-C gets: :class:`~hydra_core.errors.Terminated`).

    Under ``torchrun`` (``WORLD_SIZE`` > 1) the commands of :data:`DISTRIBUTED_COMMANDS` run as
    one job over its processes; rank 0 alone writes and prints the results."""
    from hydra_core import outputs

    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    started, on_term, finished = False, None, False
    outputs.forget_created()
    if threading.current_thread() is threading.main_thread():  # signals reach the main thread
        on_term = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        args = build_parser(argv).parse_args(argv)
        options.refuse_ignored(args)  # contradictions and an absent --device, before any work
        warnings.showwarning = _one_line_warning
        if args.cache_dir:
            os.environ["HYDRA_LAB_CACHE"] = str(Path(args.cache_dir).expanduser())
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        if distributed.launched():
            started = _start_distributed(args)
        with errors.surface("cli"):  # messages name this command's options
            code = args.run(args)
        finished = code == 0
        return code
    except KeyboardInterrupt as stop:
        if debug:
            raise
        print(STOPPED, file=sys.stderr)
        return Terminated.exit_code if isinstance(stop, Terminated) else 130
    except USER_ERRORS as exc:
        if debug:
            raise
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        hint = "" if isinstance(exc, InputError) else " (--debug shows the traceback)"
        print(f"error: {lines[0]}{hint}", file=sys.stderr)
        return 2
    finally:
        if not finished:  # a refused, failed or stopped run leaves no folder of a manifest alone
            outputs.release_unfinished()
        outputs.forget_created()
        if started:
            distributed.shutdown()
        if on_term is not None:
            signal.signal(signal.SIGTERM, on_term)


def _start_distributed(args: argparse.Namespace) -> bool:
    """The process group of a torchrun job, on the command's device; True when created here."""
    from hydra_core.inference import resolve_device

    if args.command not in DISTRIBUTED_COMMANDS:
        raise InputError(
            f"{args.command} runs in one process; under torchrun run one of "
            f"{', '.join(DISTRIBUTED_COMMANDS)}"
        )
    cuda = resolve_device(getattr(args, "device", "cpu")).type == "cuda"
    return distributed.init_from_env(cuda=cuda)
