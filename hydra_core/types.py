"""Small types every layer of the engine shares."""

from __future__ import annotations

from collections.abc import Callable

#: an attention head, ``(layer, head)``, zero-based; shown as ``L{layer}H{head}``
Head = tuple[int, int]

#: ``progress(done, total)``: called as a long job advances
Progress = Callable[[int, int], None]

#: ``progress(stage, done, total)``: the same for a job made of named stages
StageProgress = Callable[[str, int, int], None]

#: ``log(line)``: one line of text for the user (``print``, ``tqdm.write``)
Log = Callable[[str], None]
