"""Whether the Hugging Face hub can be reached, asked once before a download, not after retries.

A model named by its hub name (a Hugging Face text classifier, a pretrained timm name, an OpenCLIP
tag or ``hf-hub:`` repository) downloads its weights. Offline, the libraries retry with back-off
for half a minute and log each attempt; Hydra Lab asks first: the hub's offline mode
(``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``), else one quick connection to the hub's host.
Offline, the model is looked for in the local Hugging Face cache only (no request is made), and a
model that is not there is one line saying so (:func:`from_hub`).

That line comes before the seconds of importing torch, timm or open_clip where the name alone
tells: :func:`offline_refusal` reads a model name as a text model's, a timm model's or an OpenCLIP
hub name without importing anything, and refuses it offline unless a local cache may hold its
weights (``python -m hydra_core`` asks it before its imports, ``load_model`` before its loaders).
"""

from __future__ import annotations

import os
import re
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
    (``hf:owner/name`` or ``owner/name`` that is no file or folder here), else None."""
    name = model.removeprefix("hf:")
    if ":" in name or name.count("/") != 1 or name.startswith(("/", ".", "~")):
        return None
    if name.endswith(_FILE_SUFFIXES) or Path(name).expanduser().exists():
        return None
    return name


#: what an OpenCLIP name or tag can use offline instead (open_openclip says it too)
OPENCLIP_OFFLINE_HINT = (
    "downloading pretrained OpenCLIP weights needs the network (Hugging Face hub); offline, use "
    "openclip:local-dir:/path with open_clip_config.json and the weights"
)
#: the prefix of an OpenCLIP source (hydra_core.zoo.sources; this module imports nothing heavy)
_OPENCLIP = "openclip:"
#: the named models' names that read like timm names (the records of hydra_core.zoo.named, which
#: import torch; tests/test_hub_offline.py checks that no record's name is refused)
_BUILT_IN = ("default", "dinov2")
#: how a timm model name reads (``vit_small_patch16_224``, with its pretrained tag after a dot)
_TIMM_NAME = re.compile(r"[a-z0-9_]+(\.[a-z0-9_]+)?")
#: the hub owners of the pretrained weights of timm 1.0.31 and open_clip 3.3.0
#: (tests/test_hub_offline.py checks them against the installed versions)
_TIMM_OWNERS = ("apple", "belfner", "jienengchen", "microsoft", "munehiro-k", "naver-ai", "timm")
_OPENCLIP_OWNERS = ("UCSC-VLAA", "apple", "jienengchen", "laion", "timm", "visheratin")


def timm_offline_hint(name: str) -> str:
    """What a pretrained timm name can use offline instead (_load_timm says it too)."""
    return (
        "pretrained timm weights come from the Hugging Face hub, so the machine must be online; "
        f"offline, pass a checkpoint file instead (--model path/to/weights.safetensors --arch "
        f"{name})"
    )


def _cached_repos() -> set[str]:
    """The model repositories (``owner/name``) in the local Hugging Face cache."""
    from huggingface_hub import constants  # a light module: no torch behind it

    try:
        names = os.listdir(constants.HF_HUB_CACHE)
    except OSError:
        return set()
    return {n.removeprefix("models--").replace("--", "/", 1) for n in names if n[:8] == "models--"}


def _url_downloads() -> bool:
    """Whether torch's download folder holds a file: weights some timm models fetch from a URL,
    not the hub (``$TORCH_HOME/hub/checkpoints``)."""
    home = os.environ.get("TORCH_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "torch"
    )
    try:
        return any(os.scandir(os.path.join(home, "hub", "checkpoints")))
    except OSError:
        return False


def timm_may_be_cached(repos: set[str]) -> bool:
    """Whether the cached hub repositories ``repos`` may hold a timm name's weights: any
    repository of an owner timm downloads from (``timm/NAME.TAG`` and a few others; which name's
    weights are where needs timm itself: some names share another's repository)."""
    return any(r.split("/")[0] in _TIMM_OWNERS for r in repos)


def openclip_may_be_cached(repos: set[str]) -> bool:
    """Whether the cached hub repositories ``repos`` may hold an OpenCLIP tag's weights: any
    repository of an owner open_clip downloads from (which tag is where needs open_clip)."""
    return any(r.split("/")[0] in _OPENCLIP_OWNERS for r in repos)


def hub_model(model: str) -> tuple[str, str] | None:
    """What a model name downloads, read from the name alone (nothing imported):
    ``("hf-repo", REPO)``, ``("timm", NAME)``, ``("clip-tag", NAME/TAG)`` or
    ``("clip-repo", ORG/REPO)``; None for built-in names, files, folders and local OpenCLIP
    folders (and names the loaders refuse for another reason)."""
    if model.startswith(_OPENCLIP):
        source = model.removeprefix(_OPENCLIP).strip()
        if source.startswith("hf-hub:"):
            return "clip-repo", source.removeprefix("hf-hub:")
        name, _, tag = source.partition("/")
        if source.startswith("local-dir:") or not name or not tag:
            return None
        if tag.endswith(_FILE_SUFFIXES) or Path(tag).expanduser().exists():
            return None  # a checkpoint file after the name
        return "clip-tag", source
    if (repo := text_hub_repo(model)) is not None:
        return "hf-repo", repo
    name = model.removeprefix("timm:")
    if name in _BUILT_IN or not _TIMM_NAME.fullmatch(name) or Path(name).exists():
        return None
    if name == model and name.endswith(_FILE_SUFFIXES):
        return None  # a checkpoint file that is not here: the loader says so, not "offline"
    return "timm", name


def offline_refusal(model: str) -> str | None:
    """The one-line refusal of a model named by its hub name (:func:`hub_model`) on a machine
    that cannot reach the hub (:func:`offline_reason`), where no local cache may hold it: what
    the loaders say after the seconds of importing timm or open_clip, said before them. None in
    every other case (online, a name that is no hub name, weights perhaps cached): the loaders
    decide."""
    found = hub_model(model)
    if found is None:
        return None
    kind, name = found
    repos = _cached_repos()
    if kind == "hf-repo" and name in repos:
        return None
    if kind == "timm" and (timm_may_be_cached(repos) or _url_downloads()):
        return None
    if kind == "clip-tag" and openclip_may_be_cached(repos):
        return None
    if kind == "clip-repo" and name in repos:
        return None
    reason = offline_reason()
    if reason is None:
        return None
    what, hint = {
        "hf-repo": (
            f"Hugging Face model {name!r}",
            f"a Hugging Face hub model needs the network: {TEXT_OFFLINE_HINT}",
        ),
        "timm": (f"timm model {name!r}", timm_offline_hint(name)),
        "clip-tag": (model, OPENCLIP_OFFLINE_HINT),
        "clip-repo": (model, OPENCLIP_OFFLINE_HINT),
    }[kind]
    return (
        f"cannot load {what}: this machine is offline ({reason}) and it is not in the local "
        f"Hugging Face cache; {hint}"
    )


def early_refusal(argv: Sequence[str]) -> str | None:
    """For a command whose ``--model`` is a hub name (:func:`hub_model`) on a machine that
    cannot reach the hub and has no copy of it: the one-line refusal (:func:`offline_refusal`)
    found before the seconds of imports (``python -m hydra_core`` asks first). None in every
    other case: the command goes on."""
    model = model_argument(argv)
    return None if model is None else offline_refusal(model)


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
