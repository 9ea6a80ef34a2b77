"""The error a user can fix: a file, a name, a folder or an option that does not fit.

Raised with a message that names the input and says what to do instead. The command line prints
it as one line on stderr (exit code 2), the app as a message in the page; neither shows a
traceback for it. It is a ``ValueError``, so code that caught bad values before still does."""

from __future__ import annotations


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
