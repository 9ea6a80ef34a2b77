"""The error a user can fix: a file, a name, a folder or an option that does not fit.

Raised with a message that names the input and says what to do instead. The command line prints
it as one line on stderr (exit code 2), the app as a message in the page; neither shows a
traceback for it. It is a ``ValueError``, so code that caught bad values before still does."""

from __future__ import annotations


class InputError(ValueError):
    """Something the user gave does not fit; the message names it and the fix."""
