"""Surface features of a set's items: what a shortcut classifier sees instead of the content
(:mod:`hydra_core.analysis.shortcut`). Each modality names its function
(:attr:`~hydra_core.models.modality.Modality.surface_features`).

Images (uint8, any size and channels): mean and standard deviation of the pixel values, edge
density (the share of pixels whose gradient magnitude exceeds a tenth of the range) and the
share of saturated pixels (0 or 255). Texts: length in words and in characters, whether it ends
in ``.``, ``!`` or ``?``, the share of its words that start with a capital, the share of its
characters that are digits.
"""

from __future__ import annotations

import numpy as np
import torch

from hydra_core.data.images import ImageSet
from hydra_core.data.text import TextSet

IMAGE_FEATURES = ("mean", "std", "edge_density", "saturated_share")
TEXT_FEATURES = ("words", "characters", "final_punctuation", "capitalised_share", "digit_share")
#: gradient magnitude (in [0, 1] units) above which a pixel is on an edge
EDGE_THRESHOLD = 0.1


def image_surface_features(data: ImageSet, preprocess=None) -> np.ndarray:
    """(N, 4) float64: :data:`IMAGE_FEATURES` of every image (channels averaged first), on its
    stored pixels (``preprocess`` is not used: resizing and normalising keep these statistics
    apart)."""
    x = data.images.float().mean(dim=1) / 255.0  # (N, H, W) in [0, 1]
    flat = x.flatten(1)
    dx = x[:, :, 1:] - x[:, :, :-1]
    dy = x[:, 1:, :] - x[:, :-1, :]
    magnitude = torch.sqrt(dx[:, :-1, :] ** 2 + dy[:, :, :-1] ** 2)  # (N, H-1, W-1)
    edges = (magnitude > EDGE_THRESHOLD).flatten(1).double().mean(1)
    raw = data.images.flatten(1)
    saturated = ((raw == 0) | (raw == 255)).double().mean(1)
    columns = [flat.double().mean(1), flat.double().std(1, correction=0), edges, saturated]
    return torch.stack(columns, dim=1).numpy()


def text_surface_features(data: TextSet, preprocess=None) -> np.ndarray:
    """(N, 5) float64: :data:`TEXT_FEATURES` of every text, after ``preprocess.normalize`` (the
    model's tokenizer normalizer, :meth:`hydra_core.models.text.TextPreprocess.normalize`) where
    the preprocess has one."""
    normalize = getattr(preprocess, "normalize", None) or (lambda text: text)
    rows = []
    for text in data.texts:
        stripped = normalize(text).strip()
        words = stripped.split()
        capitalised = sum(w[:1].isupper() for w in words) / max(len(words), 1)
        digits = sum(c.isdigit() for c in stripped) / max(len(stripped), 1)
        rows.append(
            [
                len(words),
                len(stripped),
                float(stripped[-1:] in (".", "!", "?")),
                capitalised,
                digits,
            ]
        )
    return np.asarray(rows, dtype=np.float64).reshape(-1, len(TEXT_FEATURES))
