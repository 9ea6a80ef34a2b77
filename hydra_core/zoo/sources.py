"""The kinds of model source that are not a named model (:mod:`hydra_core.zoo.named`): the ones
named by a prefix (``openclip:``, ``hf:``, ``timm:``), and the kinds of safetensors file that say
what they hold in their header, which packages above the zoo register (a fused Hydra file:
:mod:`hydra_core.hydra.source`). Above :mod:`hydra_core.zoo` nothing compares a source's prefix:
it asks the kind here (``tests/test_layering.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PrefixedSource:
    """A source kind named by a prefix before the name: ``openclip:ViT-B-32/laion2b_s34b_b79k``."""

    prefix: str

    def names(self, source: str) -> bool:
        """Whether ``source`` is of this kind (starts with the prefix)."""
        return source.startswith(self.prefix)

    def name_of(self, source: str) -> str:
        """The name in ``source`` without the prefix."""
        return source.removeprefix(self.prefix)

    def source(self, name: str) -> str:
        """The source of ``name``: the prefix, then the name."""
        return self.prefix + name


#: an OpenCLIP model as a zero-shot classifier: ``openclip:NAME/TAG``,
#: ``openclip:hf-hub:ORG/REPO``, ``openclip:local-dir:PATH`` (only the last works offline)
OPENCLIP = PrefixedSource("openclip:")
#: the prefix of an OpenCLIP source
OPENCLIP_PREFIX = OPENCLIP.prefix
#: a Hugging Face text classifier by hub name (the prefix is optional where the name says it)
HUGGING_FACE = PrefixedSource("hf:")
#: a timm model name (the prefix is optional)
TIMM = PrefixedSource("timm:")


def is_zero_shot(source: str) -> bool:
    """Whether ``source`` names a zero-shot classifier (an OpenCLIP model), whose classes are the
    ID set's, named in prompts (``classes``, ``templates`` and ``towers`` of ``load_model``)."""
    return OPENCLIP.names(source)


@dataclass(frozen=True)
class FileKind:
    """A kind of safetensors model file that says what it is in its header.

    Args:
        header_key: the header entry that marks it.
        what: what it is, for messages ("a fused Hydra model").
        load: ``load(path, header)`` -> :class:`~hydra_core.zoo.loaded.LoadedModel`.
    """

    header_key: str
    what: str
    load: Callable[[Path, dict[str, str]], object]


#: the registered file kinds, by their header key
FILE_KINDS: dict[str, FileKind] = {}


def register_file_kind(kind: FileKind) -> FileKind:
    """Make ``load_model`` load files whose header holds ``kind.header_key`` with ``kind.load``
    (registering the same key again replaces it)."""
    FILE_KINDS[kind.header_key] = kind
    return kind


def file_kind(header: dict[str, str]) -> FileKind | None:
    """The registered kind of a safetensors file with this header, if any."""
    return next((k for key, k in FILE_KINDS.items() if key in header), None)
