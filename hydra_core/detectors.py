"""The OOD detectors behind :mod:`hydra_core.ood_scores`, on logits or penultimate features:
pytorch-ood's classes where it has the detector (docs/ood-scores.md). Outlier scores here are
higher = more OOD, as pytorch-ood returns them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

#: Every OOD score, in the order tables list them.
SCORES = (
    "msp",
    "max_logit",
    "energy",
    "entropy",
    "mutual_information",
    "mahalanobis",
    "vim",
    "knn",
)
#: Scores computed from the logits alone (mutual information: an ensemble's member logits).
LOGIT_SCORES = SCORES[:5]
#: Scores computed from penultimate features, fitted on the ID search split.
FEATURE_SCORES = ("mahalanobis", "vim", "knn")
#: KNN's k: pytorch-ood's default, the paper's choice for CIFAR-10 (at most the fit items).
KNN_K = 50


def parse_scores(text: str) -> tuple[str, ...]:
    """``"msp,energy"`` -> ("msp", "energy"); ``"all"`` -> :data:`SCORES`. A ValueError names an
    unknown score and the valid ones."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return SCORES
    unknown = [n for n in names if n not in SCORES]
    if unknown or not names:
        raise ValueError(
            f"unknown OOD score {', '.join(map(repr, unknown)) or repr(text)}; choose from "
            f"{', '.join(SCORES)}, or all"
        )
    return tuple(dict.fromkeys(names))


def logit_outlier_scores(score: str, logits: torch.Tensor) -> np.ndarray:
    """Per-sample outlier score (higher = more OOD) of a logit score, float64 (N,): pytorch-ood's
    detector on (N, C) logits; an ensemble's (N, M, C) member logits are reduced first (see the
    module's docstring)."""
    from pytorch_ood.detector import EnergyBased, Entropy, MaxLogit, MaxSoftmax

    from hydra_core import metrics

    z = logits.detach().cpu().double()
    ensemble = z.ndim == 3
    if score == "mutual_information":
        if not ensemble or z.shape[1] < 2:
            raise ValueError(
                "mutual information needs an ensemble's member logits (N, M, C) with M >= 2; a "
                "single model has none"
            )
        return metrics.mutual_information(logits.float().softmax(-1), reduction="none")
    if score in ("max_logit", "energy"):
        reduced = z.mean(1) if ensemble else z
    elif score in ("msp", "entropy"):
        reduced = z.softmax(-1).mean(1).log() if ensemble else z
    else:
        raise ValueError(f"{score!r} is not a logit score; expected one of {LOGIT_SCORES}")
    detector = {"msp": MaxSoftmax, "max_logit": MaxLogit, "energy": EnergyBased}.get(score, Entropy)
    return detector(None).predict_logits(reduced).numpy()


# --- features -----------------------------------------------------------------------------------


def classifier_layer(model: nn.Module) -> nn.Linear:
    """The model's last linear classifier layer, through its family (UnsupportedModelError for
    a model no family knows, or one without such a layer)."""
    from hydra_core.models.adapter import family_of

    return family_of(model).classifier_layer(model)


def has_features(model: nn.Module) -> bool:
    """Whether the model's family gives penultimate features (feature scores are offered)."""
    from hydra_core.models.adapter import UnsupportedModelError

    try:
        classifier_layer(model)
    except UnsupportedModelError:
        return False
    return True


@dataclass(eq=False)
class FeatureSource:
    """A single model (under a head mask) whose penultimate features feature scores read: what
    :func:`~hydra_core.evaluate.evaluate_model` evaluated, kept on its evaluation
    (``evaluation.extra["feature_sources"]``; an ensemble keeps its members')."""

    model: nn.Module
    keep: torch.Tensor | None
    preprocess: Callable
    device: torch.device | str = "cpu"
    batch_size: int = 256
    cache: object = None  # a DiskCache, or None
    _features: dict = field(default_factory=dict, init=False, repr=False)
    _detectors: dict = field(default_factory=dict, init=False, repr=False)

    def features(self, data) -> torch.Tensor:
        """Penultimate features (N, D), float32 on the CPU, of every item of the data set
        ``data``: the input of the classifier layer in the model's forward (under its mask);
        kept, and cached on disk under the model's weights, mask and the set's fingerprint."""
        key = data.fingerprint()
        if key not in self._features:
            self._features[key] = self._load_or_predict(data)
        return self._features[key]

    def _load_or_predict(self, data) -> torch.Tensor:
        from hydra_core.cache import cache_key, model_fingerprint

        if self.cache is None:
            return self._predict(data)
        key = cache_key("features-v1", model_fingerprint(self.model), self.keep, data.fingerprint())
        stored = self.cache.load("features", key)
        if stored is None:
            stored = self._predict(data)
            self.cache.save("features", key, stored)
        return stored

    def _predict(self, data) -> torch.Tensor:
        from contextlib import nullcontext

        from hydra_core.inference import predict
        from hydra_core.models.adapter import ablate, family_of

        layer = classifier_layer(self.model)
        system = family_of(self.model).callable_model(self.model)

        def features(x: torch.Tensor) -> torch.Tensor:
            seen = []
            handle = layer.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
            try:
                with ablate(self.model, self.keep) if self.keep is not None else nullcontext():
                    system(x)
            finally:
                handle.remove()
            return seen[-1]

        self.model.to(self.device).eval()
        return predict(
            features, data.inputs, self.preprocess, batch_size=self.batch_size, device=self.device
        )

    def detector(self, score: str, benchmark):
        """pytorch-ood's detector for ``score``, fitted on the features of the benchmark's ID
        search split (with its labels) and nothing else; kept per score."""
        fit = benchmark.id_search
        key = (score, fit.fingerprint())
        if key not in self._detectors:
            self._detectors[key] = fit_detector(
                score, self.features(fit), fit.labels, classifier_layer(self.model)
            )
        return self._detectors[key]


def fit_detector(
    score: str, features: torch.Tensor, labels: torch.Tensor, classifier: nn.Linear | None = None
):
    """pytorch-ood's ``Mahalanobis``, ``ViM`` or ``KNN`` fitted on ``features`` (N, D) with their
    class ``labels`` (N,); ViM needs the ``classifier`` layer (weight (C, D), bias (C,)). Callers
    outside tests go through :meth:`FeatureSource.detector`, which fits on the ID search split."""
    from pytorch_ood.detector import KNN, Mahalanobis, ViM

    z, y = features.detach().float().cpu(), labels.detach().long().cpu()
    if score == "mahalanobis":
        missing = sorted(set(range(int(y.max()) + 1)) - set(y.tolist()))
        if missing:
            from hydra_core.errors import InputError, choice

            raise InputError(
                f"Mahalanobis needs every class among the fit items; classes {missing} have none "
                f"(use a larger ID search split: {choice('n_search')})"
            )
        detector = Mahalanobis(None).fit_features(z, y)
        if len(z) - len(y.unique()) < z.shape[1]:
            shrink_covariance(detector, z, y)
        return detector
    if score == "vim":
        if classifier is None or classifier.bias is None:
            raise ValueError("ViM needs the classifier layer's weight and bias")
        w, b = classifier.weight.detach().cpu(), classifier.bias.detach().cpu()
        return ViM(None, d=vim_dimension(*z.shape), w=w, b=b).fit_features(z, y)
    if score == "knn":
        return KNN(None, k=min(KNN_K, len(z))).fit_features(z, y)
    raise ValueError(f"{score!r} is not a feature score; expected one of {FEATURE_SCORES}")


def shrink_covariance(detector, z: torch.Tensor, y: torch.Tensor) -> None:
    """Give a fitted pytorch-ood ``Mahalanobis`` the Ledoit-Wolf shrunk covariance of the
    class-centred features (:func:`~hydra_core.metrics.covariance.regularised_covariance`,
    as the per-head detectors and Table 5 have it), at pytorch-ood's scale (a sum over the N
    items, not a mean). For fits of fewer items than feature dimensions plus classes (the
    text default: 256 search sentences of 384 dimensions), whose class-centred scatter is
    singular: pytorch-ood's 1e-6 ridge then gives its null space a precision of 1e6, and the
    "distance" measures how far an item lies outside the span of the fit items, not the
    Mahalanobis distance (docs/ood-scores.md)."""
    from hydra_core.metrics.covariance import regularised_covariance

    centred = (z - detector.mu.cpu()[y]).double().numpy()
    cov = torch.from_numpy(regularised_covariance(centred) * len(z))
    detector.cov = cov.to(detector.mu)
    detector.precision = torch.linalg.inv(cov).to(detector.mu)


def vim_dimension(n: int, dims: int) -> int:
    """ViM's principal subspace dimension for ``n`` fit items of ``dims`` dimensions: D // 2,
    as pytorch-ood and the default ViT's 96 of 192; but at most n - 1, so that the subspace
    comes from the nonzero eigenvalues that n items give, not from eigh's arbitrary choice
    among zero ones (a warning says so)."""
    d = max(1, dims // 2)
    if n - 1 < d:
        import warnings

        from hydra_core.errors import choice

        warnings.warn(
            f"ViM: {n} fit items span at most {n - 1} of the {d} principal dimensions it uses for "
            f"{dims}-dimensional features; fitted with d = {max(1, n - 1)} (raise "
            f"{choice('n_search')} for the usual D // 2)",
            stacklevel=3,
        )
        d = max(1, n - 1)
    return d


def feature_outlier_scores(detector, features: torch.Tensor) -> np.ndarray:
    """The fitted ``detector``'s outlier scores (higher = more OOD) of ``features``, float64."""
    return detector.predict_features(features.detach().float().cpu()).double().cpu().numpy()
