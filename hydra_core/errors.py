"""The error a user can fix: a file, a name, a folder or an option that does not fit.

Raised with a message that names the input and says what to do instead. The command line prints
it as one line on stderr (exit code 2), the app as a message in the page; neither shows a
traceback for it. It is a ``ValueError``, so code that caught bad values before still does."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

#: where the user meets the messages: "python" (the library), "cli" (``hydra_core.cli.main``
#: sets it for a command's run), "app" (the pages' run and their background jobs); a context
#: variable, so that each thread (an app job, a test) has its own
_SURFACE: contextvars.ContextVar[str] = contextvars.ContextVar("hydra_surface", default="python")

#: the choices messages offer, by the library's name -> how each surface names it: the command
#: line's option, the app's control (None: the app has none), the Python keyword
CHOICES = {
    "allow_identical": (
        "--allow-identical",
        None,
        "allow_identical=True",
    ),
    "allow_other_weights": (
        "--allow-other-weights",
        "the Masks page's box 'Accept masks made for other weights of the same shape'",
        "allow_other_weights=True",
    ),
    "removed_per_layer": (
        "--removed-per-layer",
        "the Masks page's 'r: heads removed per layer'",
        "removed_per_layer",
    ),
    "points": ("--points", "the sweep's points", "removed_per_layer"),
    "data_files": (
        "--id-file / --ood-file",
        "the Setup page's data fields",
        "text_file_benchmark(id_file=..., ood_files=...)",
    ),
    "budget": ("--budget", "the Masks page's 'B: heads to prune'", "budget"),
    "n_search": (
        "--n-search",
        "the Setup page's 'Search ... per set'",
        "n_search",
    ),
}


@contextlib.contextmanager
def surface(name: str) -> Iterator[None]:
    """Messages raised inside speak to ``name``'s user (``"cli"``, ``"app"``, ``"python"``)."""
    token = _SURFACE.set(name)
    try:
        yield
    finally:
        _SURFACE.reset(token)


def choice(name: str) -> str:
    """How the user at hand names the choice ``name`` (:data:`CHOICES`): the command line's
    option, the app's control, or the Python keyword; where the app has no such control, the
    command line's option, said to be one. A message that offers a choice builds it with this, so
    that it names an option or a control the user actually has."""
    cli, app, python = CHOICES[name]
    where = _SURFACE.get()
    if where == "cli":
        return cli
    if where == "app":
        return app or f"{cli} of the command line (the app has no such control)"
    return python


class InputError(ValueError):
    """Something the user gave does not fit; the message names it and the fix."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a scheduler's time limit, ``torchrun`` ending its workers) raised as an
    interruption, so that a command stops as it does on Ctrl-C: ``finally`` blocks and ``atexit``
    run (a report's staging folder is removed, a search has saved its last step), and it ends
    with the conventional exit code 143 instead of dying with nothing cleaned up."""

    exit_code = 143


def raise_terminated(signum, frame) -> None:
    """The SIGTERM handler of the command line (:func:`hydra_core.cli.main`)."""
    raise Terminated()
