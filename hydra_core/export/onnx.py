"""ONNX export of a fused Hydra model, and of one structurally pruned model, for every family.

The graph takes what the model takes after ``preprocess``: ``images`` (B, C, H, W) float32 for
timm ViTs and OpenCLIP image towers; ``input_ids`` and ``attention_mask`` (B, T) int64 for text
encoders. The batch axis (and for text the sequence axis) is dynamic. Two outputs:
``member_logits`` (B, M, C), each member's logits (a zero-shot CLIP model: its zero-shot logits),
and ``probs`` (B, C), the ensemble's prediction, the mean of the members' softmax probabilities
(:func:`~hydra_core.hydra.fused.ensemble_probs`).

A single pruned model is exported as a Hydra model of one member (M = 1): the member's own
weights with only its kept heads' Q/K/V rows and W_O columns, as
:func:`~hydra_core.prune_heads` keeps them (fusion is checked against it to 1e-5 on every
family), through the same graph code as the fused ensemble.

The export runs torch's TorchScript-based exporter (``torch.onnx.export(..., dynamo=False)``),
which needs no package beyond ``onnx``: the newer exporter needs ``onnxscript``. It traces one
forward; the graph is then checked under onnxruntime (CPU provider) against the torch model on
inputs of another batch size (and, for text, another length, with padded rows). Where the fused
text model first drops padding columns that no sample uses (a shape that depends on the mask's
values, which a traced graph cannot have), the graph computes every column: padding keys get the
most negative score, so the numbers are the same up to float rounding.

Hydra Lab's own description rides along in the file's metadata (``metadata_props``, key
``hydra_lab``, JSON): inputs, outputs, the members and their kept heads, the source model, the
classes and the preprocessing.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from hydra_core.errors import InputError
from hydra_core.files import atomic_write
from hydra_core.hydra.fused import check_fusable, ensemble_probs, fuse_members
from hydra_core.hydra.fused_clip import HydraZeroShot
from hydra_core.hydra.fused_text import HydraText
from hydra_core.models.family import UnsupportedModelError

#: the ONNX operator set written (LayerNormalization is an operator from 17 on)
OPSET = 17
IMAGE_INPUTS = ("images",)
TEXT_INPUTS = ("input_ids", "attention_mask")
OUTPUTS = ("member_logits", "probs")
#: the key of Hydra Lab's description in the ONNX file's metadata_props
METADATA_KEY = "hydra_lab"


class OnnxExportError(InputError):
    """A model that the ONNX exporter cannot write (an operator without an ONNX form)."""


@dataclass(frozen=True)
class OnnxExport:
    """What :func:`export_onnx` wrote.

    Attributes:
        path: the ONNX file.
        inputs: the graph's inputs, by name, with their shapes ("B", "T": dynamic axes).
        outputs: the graph's outputs, by name, with their shapes.
        members: M.
        max_difference: the largest |onnxruntime - torch| difference of the member logits on
            the check inputs (None when not checked).
        checked_on: what the check ran on, in words.
    """

    path: Path
    inputs: dict[str, tuple]
    outputs: dict[str, tuple]
    members: int
    max_difference: float | None
    checked_on: str


class _Graph(nn.Module):
    """The traced module: the fused model's member logits, and the ensemble's probabilities."""

    def __init__(self, hydra: nn.Module) -> None:
        super().__init__()
        self.hydra = hydra
        self.text = isinstance(hydra, HydraText)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        member_logits = self.hydra.logits_from_tokens(*inputs) if self.text else self.hydra(*inputs)
        return member_logits, ensemble_probs(member_logits)  # (B, M, C), (B, C)


def _image_config(hydra: nn.Module):
    return hydra.visual.config if isinstance(hydra, HydraZeroShot) else hydra.config


def graph_inputs(hydra: nn.Module) -> dict[str, tuple]:
    """The inputs of ``hydra``'s ONNX graph, by name, with their shapes."""
    if isinstance(hydra, HydraText):
        return {name: ("B", "T") for name in TEXT_INPUTS}
    config = _image_config(hydra)
    return {IMAGE_INPUTS[0]: ("B", config.in_chans, *config.img_size)}


def example_inputs(hydra: nn.Module, batch: int, tokens: int = 8, seed: int = 0) -> tuple:
    """Random inputs for ``hydra``'s graph: images from a normal distribution, or token ids
    whose rows are padded to different lengths (the first row full; padding takes the model's
    padding id, else 0, and no real token does)."""
    g = torch.Generator().manual_seed(seed)
    if not isinstance(hydra, HydraText):
        config = _image_config(hydra)
        return (torch.randn(batch, config.in_chans, *config.img_size, generator=g),)
    config = hydra.config
    pad = config.padding_idx if config.padding_idx is not None else 0
    low = 1 if pad == 0 else pad + 1  # real tokens never take the padding id
    ids = torch.randint(low, max(low + 1, config.vocab_size), (batch, tokens), generator=g)
    lengths = torch.randint(1, tokens + 1, (batch,), generator=g)
    lengths[0] = tokens
    mask = (torch.arange(tokens)[None] < lengths[:, None]).long()  # (B, T)
    ids[:, 0] = 0 if pad != 0 else low
    ids[mask == 0] = pad
    return ids, mask


def export_onnx(
    hydra: nn.Module,
    path: str | Path,
    *,
    description: dict | None = None,
    check: bool = True,
) -> OnnxExport:
    """Write a fused Hydra model (:func:`~hydra_core.fuse_members`,
    :func:`~hydra_core.load_hydra`) as an ONNX file (fp32, CPU; written atomically).

    Args:
        hydra: a HydraViT, HydraText or HydraZeroShot (any device and precision: it is copied
            to fp32 on the CPU first).
        path: the ONNX file.
        description: more entries for the file's ``hydra_lab`` metadata (``source``,
            ``classes``, ``preprocess``, ``members``: the members' names).
        check: run the graph under onnxruntime against the torch model (on 3 inputs; text: 9
            tokens, padded rows) and report the largest member-logit difference.

    Raises :class:`OnnxExportError`, one line naming the operator, where an operator has no
    ONNX form.
    """
    if not hasattr(hydra, "kept_heads"):
        raise TypeError(
            f"export_onnx takes a fused Hydra model (fuse_members, load_hydra), not a "
            f"{type(hydra).__name__}; for one model, export_pruned_onnx(model, keep, path)"
        )
    path = Path(path)
    model = copy.deepcopy(hydra).float().cpu().eval()
    graph = _Graph(model)
    inputs = graph_inputs(model)
    dynamic = {  # the named axes ("B", "T") vary
        name: {axis: size for axis, size in enumerate(shape) if isinstance(size, str)}
        for name, shape in inputs.items()
    }
    dynamic.update({"member_logits": {0: "B"}, "probs": {0: "B"}})
    members = len(model.kept_heads)
    with torch.no_grad():
        classes = int(graph(*example_inputs(model, 2))[0].shape[-1])
    outputs = {"member_logits": ("B", members, classes), "probs": ("B", classes)}
    with tempfile.TemporaryDirectory() as folder:
        traced = Path(folder) / "model.onnx"
        _trace(graph, example_inputs(model, 2), traced, inputs, dynamic)
        _write_metadata(traced, inputs, outputs, model, description or {})
        atomic_write(path, lambda tmp: tmp.write_bytes(traced.read_bytes()))
    difference, checked_on = None, "not checked"
    if check:
        difference, checked_on = check_onnx(path, model)
    return OnnxExport(path, inputs, outputs, members, difference, checked_on)


def export_pruned_onnx(
    model: nn.Module,
    keep: torch.Tensor,
    path: str | Path,
    *,
    description: dict | None = None,
    check: bool = True,
) -> OnnxExport:
    """Write the structurally pruned ``model`` (its heads where ``keep`` is True) as an ONNX file
    with the graph of :func:`export_onnx`: one member, ``member_logits`` (B, 1, C).

    Raises :class:`OnnxExportError` for a model whose pruned form cannot be written (a model
    Hydra fusion does not support, or an operator without an ONNX form)."""
    try:
        check_fusable(model)  # says "this model", where fusing would say "member 0"
        single = fuse_members([(model, keep)])
    except UnsupportedModelError as error:
        raise OnnxExportError(f"cannot export to ONNX: {error}") from None
    return export_onnx(single, path, description=description, check=check)


def _trace(
    graph: nn.Module,
    example: tuple[torch.Tensor, ...],
    path: Path,
    inputs: dict[str, tuple],
    dynamic: dict[str, dict[int, str]],
) -> None:
    """``torch.onnx.export`` of ``graph``, quiet, its failures one line each."""
    try:
        with torch.no_grad(), warnings.catch_warnings(), _stdout_silenced():
            # the exporter warns about its own deprecation and about Python values fixed while
            # tracing: the shape checks of the fused models' forward, true for every input
            warnings.simplefilter("ignore")
            torch.onnx.export(
                graph,
                example,
                str(path),
                dynamo=False,
                input_names=list(inputs),
                output_names=list(OUTPUTS),
                dynamic_axes=dynamic,
                opset_version=OPSET,
            )
    except (torch.onnx.errors.OnnxExporterError, RuntimeError) as error:
        raise OnnxExportError(_one_line(error)) from None


def _one_line(error: Exception) -> str:
    """An exporter failure in one line: the operator it could not write, where it says which."""
    text = str(error)
    operator = re.search(r"\b([A-Za-z_][\w.]*::\w+(?:\.\w+)*)", text)
    if operator:
        return (
            f"cannot export to ONNX: the operator {operator.group(1)} has no ONNX form (opset "
            f"{OPSET}); the model uses it in its forward, so this model cannot be exported"
        )
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return f"cannot export to ONNX: {first}"


@contextlib.contextmanager
def _stdout_silenced() -> Iterator[None]:
    """File descriptor 1 sent to a temporary file: the exporter's C++ side prints the whole
    traced graph there when it fails, which the one-line error replaces."""
    try:
        saved = os.dup(1)
    except OSError:  # no stdout to silence
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def _write_metadata(
    tmp: Path, inputs: dict, outputs: dict, hydra: nn.Module, description: dict
) -> None:
    """Hydra Lab's description into the metadata of ``tmp``, the traced graph's temporary file."""
    import onnx

    proto = onnx.load(str(tmp))
    entry = {
        "format": "hydra-lab-onnx",
        "version": 1,
        "inputs": {k: list(v) for k, v in inputs.items()},
        "outputs": {k: list(v) for k, v in outputs.items()},
        "kept_heads": [[list(h) for h in member] for member in hydra.kept_heads],
        **description,
    }
    onnx.helper.set_model_props(proto, {METADATA_KEY: json.dumps(entry)})
    onnx.save(proto, str(tmp))


def read_description(path: str | Path) -> dict:
    """Hydra Lab's description in an exported ONNX file's metadata (see :func:`export_onnx`)."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    props = {p.key: p.value for p in proto.metadata_props}
    if METADATA_KEY not in props:
        raise InputError(f"{path} is an ONNX file but not one Hydra Lab exported")
    return json.loads(props[METADATA_KEY])


def onnx_session(path: str | Path, threads: int | None = None):
    """An onnxruntime session on the CPU provider (``threads``: its intra-op threads)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_onnx(session, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The graph's outputs (member logits (B, M, C), probabilities (B, C)) for ``inputs``, in
    the order of the graph's inputs (images; or token ids and attention mask)."""
    names = [i.name for i in session.get_inputs()]
    feed = {
        name: np.ascontiguousarray(x.detach().cpu().numpy())
        for name, x in zip(names, inputs, strict=True)
    }
    logits, probs = session.run(list(OUTPUTS), feed)
    return torch.from_numpy(logits), torch.from_numpy(probs)


def torch_outputs(hydra: nn.Module, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """``hydra``'s member logits as its own forward computes them (text: padding columns no
    sample uses dropped first), for the graph's inputs."""
    with torch.no_grad():
        if isinstance(hydra, HydraText):
            ids, mask = inputs
            return hydra(input_ids=ids, attention_mask=mask)
        return hydra(*inputs)


def check_onnx(path: str | Path, hydra: nn.Module) -> tuple[float, str]:
    """Run the exported graph under onnxruntime on inputs of another batch size than the traced
    one (text: another length, rows padded) and return the largest |onnxruntime - torch|
    member-logit difference, with what it ran on."""
    model = copy.deepcopy(hydra).float().cpu().eval()
    inputs = example_inputs(model, batch=3, tokens=9, seed=1)
    got, probs = run_onnx(onnx_session(path), inputs)
    expected = torch_outputs(model, inputs)
    difference = max(
        float((got - expected).abs().max()),
        float((probs - ensemble_probs(expected)).abs().max()),
    )
    shape = "x".join(str(s) for s in inputs[0].shape)
    what = "padded token rows" if len(inputs) == 2 else "random images"
    return difference, f"3 {what} ({shape}), onnxruntime CPU vs torch fp32"
