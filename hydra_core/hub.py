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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
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


#: what a text model named by its hub name can use offline instead (hf.load_hub says it too)
TEXT_OFFLINE_HINT = (
    "offline, use --model minilm-sentiment or a local folder with config.json, the weights and "
    "the tokenizer files (save_pretrained)"
)
#: file names that make a --model value a checkpoint path, never a hub name
_FILE_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt")


def model_argument(argv: Sequence[str]) -> str | None:
    """The value of ``--model`` in a command line (``--model X`` or ``--model=X``), or None."""
    for i, arg in enumerate(argv):
        if arg == "--model" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--model="):
            return arg.partition("=")[2]
    return None


def text_hub_repo(model: str) -> str | None:
    """The repository of a text model named by its hub name in the ``owner/name`` form
    (``hf:owner/name`` or ``owner/name`` that is no file or folder here), else None: other hub
    names (timm's, OpenCLIP's) are told apart by the loaders after the imports."""
    name = model.removeprefix("hf:")
    if ":" in name or name.count("/") != 1 or name.startswith(("/", ".", "~")):
        return None
    if name.endswith(_FILE_SUFFIXES) or Path(name).expanduser().exists():
        return None
    return name


def _in_local_cache(repo: str) -> bool:
    """Whether the local Hugging Face cache holds anything of the model repository ``repo``."""
    from huggingface_hub import constants

    return (Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}").is_dir()


def early_refusal(argv: Sequence[str]) -> str | None:
    """For a command whose ``--model`` is a text model's hub name (:func:`text_hub_repo`), on a
    machine that cannot reach the hub and has no copy of the model in its local cache: the
    one-line refusal :func:`from_hub` would give after the seconds of imports, found before them
    (``python -m hydra_core`` asks first). None in every other case: the command goes on."""
    model = model_argument(argv)
    repo = None if model is None else text_hub_repo(model)
    if repo is None or _in_local_cache(repo):
        return None
    reason = offline_reason()
    if reason is None:
        return None
    return (
        f"cannot load Hugging Face model {repo!r}: this machine is offline ({reason}) and it is "
        f"not in the local Hugging Face cache; a Hugging Face hub model needs the network: "
        f"{TEXT_OFFLINE_HINT}"
    )


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
