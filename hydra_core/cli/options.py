"""What an option's value may be, checked by the parser itself: every bad value is refused before
anything loads, in one line that names the option (``argument --epochs: must be at least 1, got
0``), never later in a library's words.

Each function here is an argparse ``type``: it takes the text on the command line and returns the
value, or raises :class:`argparse.ArgumentTypeError` with what is wrong."""

from __future__ import annotations

import argparse
import difflib
import math
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from hydra_core.errors import InputError


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are an :class:`InputError` (one line on stderr, exit code 2,
    as every other user error), not a usage block and ``SystemExit``. Options are taken whole:
    argparse's abbreviations let ``cahp --m 0`` (no ``--m`` there) silently mean ``--model 0``,
    and would change meaning whenever a command gains an option."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise InputError(f"{self.prog}: {message} (see {self.prog} --help)")

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but words left over are refused by the command they were given to
        (whose ``--help`` lists its options), with the closest option where one was misspelt;
        argparse refuses them on the command list's parser."""
        try:
            parsed, extras = self.parse_known_args(args, namespace)
        except InputError:
            # an unknown option's value read as a positional (masks --greedy FILE: "invalid
            # choice: FILE") is the unknown option's error
            self._refuse_unknown_option(args)
            raise
        if extras:
            where = self._commands().get(getattr(parsed, "command", None), self)
            where.error(f"unrecognized arguments: {' '.join(extras)}{_closest(where, extras[0])}")
        return parsed

    def _commands(self) -> dict[str, argparse.ArgumentParser]:
        """This parser's commands by name (none when it has none)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    def _refuse_unknown_option(self, args) -> None:
        """Refuse the first ``--option`` of ``args`` that the named command (or any of its own
        commands) does not take, if there is one."""
        args = sys.argv[1:] if args is None else list(args)
        where = self._commands().get(named_command(args))
        if where is None:
            return
        known = [where, *where._commands().values()]  # subparsers are of this parser's class
        for arg in args:
            name = arg.split("=")[0]
            if not name.startswith("--") or name == "--":
                continue
            if not any(name in p._option_string_actions for p in known):
                where.error(f"unrecognized arguments: {name}{_closest(where, name)}")


def named_command(argv: Sequence[str]) -> str:
    """The command ``argv`` names: its first word that is not an option ("" when none is; the
    command list takes no option but ``--help`` and ``--version``)."""
    return next((a for a in argv if not a.startswith("-")), "")


def _closest(parser: argparse.ArgumentParser, word: str) -> str:
    """``; did you mean --x?`` when ``word`` looks like a misspelt option of ``parser``."""
    options = [o for o in parser._option_string_actions if o.startswith("--")]
    close = difflib.get_close_matches(word.split("=")[0], options, n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if word.startswith("-") and close else ""


def _number(text: str, kind: type) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        noun = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"must be {noun}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def at_least(least: int):
    """An int option of at least ``least``."""

    def check(text: str) -> int:
        value = _number(text, int)
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value

    check.__name__ = f"int >= {least}"
    return check


#: a count of things (threads, images, epochs, members, ...): 1 or more
positive_int = at_least(1)
#: a count that may be zero (padding, warm-up steps, heads removed per layer)
non_negative_int = at_least(0)
#: a random seed: torch takes any non-negative 64-bit integer
seed = at_least(0)


def boot(text: str) -> int:
    """Bootstrap resamples per interval (``--boot``): at least
    :data:`~hydra_core.metrics.bootstrap.MIN_BOOT`, below which a "95%" interval is not one."""
    from hydra_core.metrics.bootstrap import MIN_BOOT

    value = _number(text, int)
    if value < MIN_BOOT:
        raise argparse.ArgumentTypeError(
            f"must be at least {MIN_BOOT} for a 95% interval (1,000 recommended), got {value}"
        )
    return value


boot.__name__ = "resamples"


def positive_float(text: str) -> float:
    """A float above 0 (a learning rate, epochs of fine-tuning)."""
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {value:g}")
    return value


def non_negative_float(text: str) -> float:
    """A float of 0 or more (warm-up epochs)."""
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value:g}")
    return value


def open_unit(text: str) -> float:
    """A float strictly between 0 and 1 (a dropout rate)."""
    value = _number(text, float)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must lie strictly between 0 and 1, got {value:g}")
    return value


def smoothing(text: str) -> float:
    """A label smoothing: 0 (none) up to, not including, 1."""
    value = _number(text, float)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1, got {value:g}")
    return value


#: the devices a command runs on: ``auto`` (cuda when available), ``cpu``, ``cuda``, ``cuda:N``
DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?|mps")


def device(text: str) -> str:
    """``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps`` (whether the machine has it is checked
    when the command starts)."""
    value = text.strip().lower()
    if not DEVICE.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a device Hydra Lab runs on; choose auto, cpu, cuda or cuda:N"
        )
    return value


def folder(text: str) -> str:
    """A folder that exists or can be created: no file in its place or above it, and writable."""
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder; give a folder")
    above = path
    while not above.exists():
        above = above.parent
    if not above.is_dir():
        raise argparse.ArgumentTypeError(f"{above} is a file, so {text} cannot be a folder")
    if not os.access(above, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{above} is not writable; give a folder you can write")
    return text


# --- options that other options make meaningless ------------------------------------------------


def only_with(p: argparse.ArgumentParser, option: str, needs: str, when) -> None:
    """Declare that ``option`` of the command ``p`` is read only when ``when(args)`` holds
    (``needs`` says what the user adds for that, e.g. ``--baselines mc-dropout``): a value
    other than its default given otherwise is refused by :func:`refuse_ignored` in one line,
    never silently ignored."""
    dest = option.lstrip("-").replace("-", "_")
    rules = list(p.get_default("_only_with") or [])
    rules.append((option, dest, p.get_default(dest), needs, when))
    p.set_defaults(_only_with=rules)


def refuse_ignored(args: argparse.Namespace) -> None:
    """Refuse (InputError, one line) every option given where the command would ignore it
    (declared with :func:`only_with`), and a ``--device`` this machine does not have: the
    command would otherwise run on another device without a word."""
    for option, dest, default, needs, when in getattr(args, "_only_with", None) or []:
        if getattr(args, dest, default) != default and not when(args):
            raise InputError(
                f"{option} is read only with {needs}, so it would be ignored here; add that, or "
                f"leave {option} out"
            )
    check_device(getattr(args, "device", None))


def check_device(value: str | None) -> None:
    """``--device cuda`` (or ``cuda:N``, ``mps``) refused on a machine without it, at the start
    of every command, whether the command computes on it or (``export``) only on the CPU."""
    if value in (None, "auto", "cpu"):
        return
    import torch

    if value.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(value.partition(":")[2] or 0)
        if index >= count:
            have = f"{count} CUDA GPU{'s' if count != 1 else ''}" if count else "no CUDA GPU"
            raise InputError(
                f"--device {value}: this machine has {have}; pass --device cpu (or auto)"
            )
    elif value == "mps" and not torch.backends.mps.is_available():
        raise InputError("--device mps: this machine has no Apple GPU; pass --device cpu (or auto)")


def ood_scores(text: str) -> tuple[str, ...]:
    """Comma-separated OOD scores (``msp,energy``) or ``all``
    (:data:`hydra_core.ood_scores.SCORES`)."""
    from hydra_core.ood_scores import parse_scores

    try:
        return parse_scores(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_search_method_argument(p: argparse.ArgumentParser) -> None:
    """``--method`` of every command that runs greedy searches (search, transfer)."""
    p.add_argument(
        "--method",
        default="fast",
        choices=("fast", "plain"),
        help="fast: suffix recomputation; plain: full forward per candidate (reference)",
    )


def add_candidates_argument(p: argparse.ArgumentParser) -> None:
    """``--candidates K`` of every command that runs greedy searches (search, transfer, masks,
    report): the guided search (docs/guided-search.md)."""
    p.add_argument(
        "--candidates",
        type=positive_int,
        default=None,
        metavar="K",
        help="guided search: at each step evaluate exactly only the K heads with the best "
        "attribution estimate (one forward and a few backward passes), re-estimated after each "
        "removal; K at least the model's heads is the exact search (default: exact)",
    )


def add_scores_argument(p: argparse.ArgumentParser, effect: str) -> None:
    """``--scores`` of every command that reports OOD metrics (eval, hydra); ``effect``: what
    the scores beyond the first change in this command's output."""
    p.add_argument(
        "--scores",
        type=ood_scores,
        default=("msp",),
        metavar="SCORE[,SCORE...]",
        help="OOD scores, comma-separated, or all: msp, max_logit, energy, entropy, "
        "mutual_information (ensembles), mahalanobis, vim, knn (fitted on the ID search split); "
        f"{effect} (default: msp)",
    )
