"""Running a model over stored inputs (images or texts): device choice and batched, preprocessed
prediction.

Below the model families and the evaluation harness, so that both (and the DINOv2 probe fit) use
the same loop without importing each other."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext

import torch


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """``"auto"`` (or None) -> cuda when available, else cpu; anything else as given, checked."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "device 'cuda' was requested but no CUDA GPU is available; use 'cpu' or 'auto'"
        )
    return device


@torch.inference_mode()
def predict(
    system: Callable[[torch.Tensor], torch.Tensor],
    inputs: torch.Tensor | Sequence[str],
    preprocess: Callable[[torch.Tensor | Sequence[str]], torch.Tensor],
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
    bf16: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> torch.Tensor:
    """Logits of ``system`` for ``inputs``, preprocessed batch by batch: what a data set's
    ``inputs`` are (uint8 images (N, C, H, W), or a tuple of texts for a text model, whose
    ``preprocess`` tokenizes them), or model inputs already preprocessed (with an identity
    ``preprocess``). Preprocessed batches move to ``device`` as they are (token ids stay ints).

    Returns float32 logits on the CPU: (N, classes), or (N, M, classes) for an ensemble.
    ``bf16`` runs under bfloat16 autocast (meant for CUDA; on CPU it is slow but works).
    """
    if len(inputs) == 0:
        raise ValueError("no inputs to predict: the set is empty")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    device = torch.device(device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    outputs = []
    for start in range(0, len(inputs), batch_size):
        x = preprocess(inputs[start : start + batch_size]).to(device, non_blocking=True)
        with autocast:
            outputs.append(system(x).float().cpu())
        if progress:
            progress(min(start + batch_size, len(inputs)), len(inputs))
    return torch.cat(outputs)
