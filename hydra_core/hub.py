"""Whether the Hugging Face hub can be reached, asked once before a download, not after retries.

A model named by its hub name (a Hugging Face text classifier, a pretrained timm name, an OpenCLIP
tag or ``hf-hub:`` repository) downloads its weights. Offline, the libraries retry with back-off
for half a minute and log each attempt; Hydra Lab asks first: the hub's offline mode
(``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``), else one quick connection to the hub's host.
Offline, the model is looked for in the local Hugging Face cache only (no request is made), and a
model that is not there is one line saying so (:func:`from_hub`).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar
from urllib.parse import urlparse

from hydra_core.errors import InputError

T = TypeVar("T")

#: seconds the quick check waits for the hub's host (name lookup and connection together)
CHECK_SECONDS = 3.0


def hub_host() -> str:
    """The hub's host name: ``$HF_ENDPOINT``'s, else huggingface.co."""
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    return urlparse(endpoint).hostname or "huggingface.co"


def _offline_mode() -> bool:
    words = ("1", "true", "yes", "on")
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    if any(os.environ.get(name, "").lower() in words for name in names):
        return True
    try:
        from huggingface_hub import constants
    except ImportError:
        return False
    return bool(constants.HF_HUB_OFFLINE)


def offline_reason(timeout: float = CHECK_SECONDS) -> str | None:
    """Why the hub cannot be reached (``"HF_HUB_OFFLINE is set"``, ``"huggingface.co cannot be
    reached: ..."``), or None when one connection to it succeeds within ``timeout`` seconds."""
    if _offline_mode():
        return "HF_HUB_OFFLINE is set"
    host, found = hub_host(), []

    def connect() -> None:
        try:
            socket.create_connection((host, 443), timeout=timeout).close()
            found.append(None)
        except OSError as exc:
            found.append(f"{host} cannot be reached: {exc.strerror or exc}")

    check = threading.Thread(target=connect, daemon=True)  # a name lookup takes no timeout
    check.start()
    check.join(timeout)
    return found[0] if found else f"{host} did not answer within {timeout:g} s"


@contextmanager
def cache_only() -> Iterator[None]:
    """Within the block the Hugging Face libraries read their local cache and make no request
    (the hub's offline mode, restored afterwards)."""
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


def _missing(exc: BaseException) -> bool:
    """Whether an error (or one it came from) says a file is neither downloadable nor cached."""
    while exc is not None:
        name = type(exc).__name__
        if isinstance(exc, (OSError, ConnectionError)) or "Offline" in name or "NotFound" in name:
            return True
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return False


def from_hub(load: Callable[[], T], what: str, hint: str) -> T:
    """``load()`` of something the hub holds. Online, as it is; offline (:func:`offline_reason`),
    from the local cache alone, and where it is not there an InputError in one line naming
    ``what``, the reason and ``hint`` (what to use offline) at once, without retries."""
    reason = offline_reason()
    if reason is None:
        return load()
    try:
        with cache_only():
            return load()
    except Exception as exc:
        if not _missing(exc):
            raise
        raise InputError(
            f"cannot load {what}: this machine is offline ({reason}) and it is not in the local "
            f"Hugging Face cache; {hint}"
        ) from exc
