"""Percentile bootstrap intervals over the report images, stratified and paired (docs/metrics.md,
"Intervals": every reported metric carries a 95% bootstrap interval;
comparisons between systems use paired intervals).

What is resampled, and why:

- A resample draws, with replacement, as many images as there are **within each stratum**: the ID
  images within each true class, and each OOD set within itself. Every resample so keeps the class
  counts, the size of every OOD set and the ID/OOD ratio of the report split. The reported numbers
  are conditional on that composition (the split fixes it); resampling across strata would add
  variance from a random class mix or ID/OOD ratio that no run of the experiment has, could leave
  a class or an OOD set empty (an undefined metric), and would move the 95% recall threshold of
  FPR@95 and the equal-mass bins of adaptive ECE from resample to resample.
- One resample of the ID images serves the ID metrics and every OOD set, so the near/far averages
  of a resample are averages over the same ID images; each part (ID, each OOD set) draws from its
  own stream of the seed, so adding an OOD set leaves the resamples of the others unchanged.
- **Paired**: the resamples depend on the seed and the split only, never on the system, so two
  systems evaluated on the same images see the same resamples; the interval of a difference is the
  percentile interval of the per-resample differences. A difference whose interval contains 0 is
  "not significant" (at the 95% level).
- **Percentile interval**: the (1 - level) / 2 and (1 + level) / 2 quantiles of the B resample
  values (numpy's default linear interpolation). The point value is the metric on the images
  themselves, not the mean of the resamples.

Over repeats of an experiment (seeds, search samples) on the same items, :func:`two_level_interval`
gives a Student t interval over the repeats that adds the items' sampling (docs/intervals.md), not a
percentile bootstrap of the repeats, which cannot reach beyond the repeats' own range at R = 3.

Minimum sizes: :data:`MIN_BOOT` resamples per interval (`heads --boot` and the Evidence page refuse
fewer; :func:`check_n_boot` for other callers) and :data:`MIN_ITEMS` items per part (fewer give NaN
intervals with a warning, :func:`blank_small_parts`, so nothing is marked significant).

How it is fast: a resample is stored as counts, ``counts[b, i]`` = how often image i is drawn in
resample b (shape (B, N)). Every metric of docs/metrics.md is a function of
per-image values and these counts, so all B resamples are computed together and each set is sorted
once per system, not once per resample:

- accuracy, NLL, Brier, MI, disagreement: counts @ per-image value / N;
- ECE: an image's equal-width bin depends only on its confidence, so bin sums are counts @ one-hot;
- adaptive ECE: the images are sorted once by (confidence, correct); a resample is that order with
  image i repeated counts[b, i] times, so a bin's sums are differences of the piecewise-linear
  cumulative sums at the bin edges (a repeated image may straddle an edge, as in the plain
  computation);
- AUROC, FPR@95, AUPR-In/Out, FPR@95TPR-ID: ID and OOD scores sorted once; cumulative counts over
  the sorted scores give, per resample, the ID and OOD weight above or below any score.

Each equals the plain metric of :mod:`hydra_core.metrics` on the resampled images (to float
rounding; the tests check 1e-9). Measured on one CPU core for 10,000 ID images (10 classes) and
20,000 OOD images in 4 sets, 1,000 resamples: the draw takes about 0.9 s (once per report), every
metric of one system about 1 s; a report of 20 systems (half of them 3-member ensembles, with
their diversity) about 20 s. The generic :func:`bootstrap_interval` and
:func:`paired_difference` call any statistic once per resample instead, for the odd number that has
no vectorised form.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from hydra_core.errors import InputError
from hydra_core.metrics._validation import (
    UndefinedMetricWarning,
    as_float64,
    check_classification,
    check_n_bins,
    check_scores,
)
from hydra_core.metrics.classification import (
    N_BINS,
    _checked_log_p,
    _equal_width_bin,
    per_sample_nll,
)
from hydra_core.metrics.ood import RECALL_LEVEL

#: A seed for numpy's generator: an int, ints, or a SeedSequence (one stream of a seed).
Seed = int | Sequence[int] | np.random.SeedSequence
#: The confidence level of every reported interval.
LEVEL = 0.95
#: The fewest resamples an interval may come from: with B resamples the 2.5% and 97.5% quantiles
#: lie (B - 1) x 2.5% positions inside the extremes, at least one position from B = 41 on, so that a
#: single outlying resample cannot be a bound by itself; 50 rounds it up. Below it, the CLI's
#: ``--boot`` and the app's resample controls refuse (:func:`check_n_boot`).
MIN_BOOT = 50
#: The fewest items a part of the data (the ID part; each OOD set) may hold for an interval: below
#: it a resample can take only a handful of distinct values (2 items: 3), the percentile interval
#: describes the resampling, not the population, and a metric of 1 item (AUROC 1, FPR@95 0) is
#: certain only in appearance. Intervals touching such a part are NaN, with a warning, and so
#: never "significant" (:func:`blank_small_parts`).
MIN_ITEMS = 10
#: Work on blocks of resamples of about this many (resample, image) cells, to bound memory.
_BLOCK_CELLS = 1 << 20
#: Resamples drawn per call of the random generator (fixed, so that a seed gives the same draws
#: whatever ``n_boot`` is: the first 100 resamples of 1,000 are the 100 resamples of 100).
_DRAW_ROWS = 64


@dataclass(frozen=True)
class BootstrapConfig:
    """How many resamples and from which seed.

    Args:
        n_boot: resamples per interval. With 1,000, the bounds of a 95% interval move by about a
            tenth of its half-width from seed to seed.
        seed: the same seed and split give the same resamples, for every system (pairing).
    """

    n_boot: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.n_boot, bool) or not isinstance(self.n_boot, int) or self.n_boot < 1:
            raise ValueError(f"n_boot must be a positive integer, got {self.n_boot!r}")


def check_n_boot(n_boot: int, option: str = "--boot") -> int:
    """``n_boot`` when it is at least :data:`MIN_BOOT`; else one line naming ``option`` and the
    minimum (an InputError, so the CLI exits 2)."""
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < MIN_BOOT:
        raise InputError(
            f"{option} {n_boot}: a 95% interval needs at least {MIN_BOOT} bootstrap resamples "
            f"(1,000 recommended); use {option} {MIN_BOOT} or more"
        )
    return n_boot


def blank_small_parts(
    id_replicates: dict[str, np.ndarray],
    ood_replicates: Sequence[dict[str, np.ndarray]],
    n_id: int,
    ood_sizes: Sequence[int],
    names: Sequence[str] | None = None,
) -> None:
    """Set to NaN, in place, the resample values of every part with fewer than
    :data:`MIN_ITEMS` items (an OOD set's metrics also use the ID part, so a small ID part blanks
    them all), and warn once naming them: their intervals become NaN and are never significant.
    The point values are left alone."""
    blank_id = n_id < MIN_ITEMS
    if blank_id:
        for key in id_replicates:
            id_replicates[key] = np.full_like(id_replicates[key], np.nan, dtype=np.float64)
    for reps, n in zip(ood_replicates, ood_sizes, strict=True):
        if blank_id or n < MIN_ITEMS:
            for key in reps:
                reps[key] = np.full_like(reps[key], np.nan, dtype=np.float64)
    warn_small_parts(n_id, ood_sizes, names, stacklevel=3)


#: the start of :func:`warn_small_parts`' message (a filter that stands in one warning for many
#: matches it)
SMALL_PARTS = "fewer than {} items in "


def warn_small_parts(
    n_id: int, ood_sizes: Sequence[int], names: Sequence[str] | None = None, *, stacklevel: int = 2
) -> None:
    """Warn once naming every part with fewer than :data:`MIN_ITEMS` items, if any: the
    metrics that use it have no interval (NaN) and are never significant."""
    blanked = [f"the ID part ({n_id})"] if n_id < MIN_ITEMS else []
    blanked += [
        f"{names[k] if names else f'OOD set {k + 1}'} ({n})"
        for k, n in enumerate(ood_sizes)
        if n < MIN_ITEMS
    ]
    if blanked:
        warnings.warn(
            f"{SMALL_PARTS.format(MIN_ITEMS)}{', '.join(blanked)}: no 95% interval (NaN) for "
            "the metrics that use them, and none is marked significant; use more items",
            UndefinedMetricWarning,
            stacklevel=stacklevel,
        )


# --- drawing resamples ---------------------------------------------------------------------------


def _check_strata(strata: Any) -> np.ndarray:
    array = np.asarray(strata)
    if array.ndim != 1:
        raise ValueError(f"strata must be 1-D (one stratum per sample), got shape {array.shape}")
    return array


def _index_blocks(strata: np.ndarray, n_boot: int, seed: Seed) -> Iterator[np.ndarray]:
    """Blocks of rows of stratified resample indices, (rows, N) each, ``n_boot`` rows in all.

    Row b holds, at each position p, an index drawn uniformly from the positions of p's stratum;
    the positions of a stratum in a row are its resample."""
    n = len(strata)
    _, stratum_of, sizes = np.unique(strata, return_inverse=True, return_counts=True)
    members = np.argsort(stratum_of, kind="stable")  # positions grouped by stratum
    start = np.r_[0, np.cumsum(sizes)[:-1]][stratum_of]  # (N,) where p's stratum begins
    size = sizes[stratum_of]  # (N,) its size
    rng = np.random.default_rng(seed)
    for first in range(0, n_boot, _DRAW_ROWS):
        rows = min(_DRAW_ROWS, n_boot - first)
        offset = rng.integers(0, size, size=(rows, n))  # (rows, N) position within the stratum
        yield members[start + offset]


#: where a user asks for more search samples: the CLI option and the app's Setup control
MORE_SEARCH = "--n-search; in the app, Setup's 'Search ... per set'"


def check_resampled(strata: Any, what: str = "search items") -> None:
    """Refuse strata in which every stratum holds one item (every stratified resample is then the
    sample itself: agreement between resamples would be certain by construction), and warn when
    some items are alone in theirs (those items never vary)."""
    strata = _check_strata(strata)
    if len(strata) == 0:
        return
    _, stratum_of, sizes = np.unique(strata, return_inverse=True, return_counts=True)
    alone = int((sizes[stratum_of] < 2).sum())
    if alone == len(strata):
        raise InputError(
            f"every class and OOD set holds a single one of the {len(strata)} {what}: each "
            "bootstrap resample would be the sample itself, so agreement between resamples would "
            f"say nothing; use more search samples ({MORE_SEARCH})"
        )
    if alone:
        warnings.warn(
            f"{alone} of {len(strata)} {what} are alone in their class or OOD set: resamples "
            "cannot vary them, so agreement between resamples overstates stability; use more "
            f"search samples ({MORE_SEARCH})",
            UndefinedMetricWarning,
            stacklevel=2,
        )


def stratified_indices(strata: Any, *, n_boot: int = 1000, seed: Seed = 0) -> np.ndarray:
    """(n_boot, N) indices of stratified resamples: row b is resample b, and position p of every
    row draws from p's stratum (so every row keeps each stratum's size). ``strata`` (N,) holds any
    hashable labels (e.g. the true classes); deterministic given ``seed``."""
    strata = _check_strata(strata)
    if len(strata) == 0:
        return np.zeros((n_boot, 0), dtype=np.int64)
    return np.concatenate(list(_index_blocks(strata, n_boot, seed)))


def stratified_counts(strata: Any, *, n_boot: int = 1000, seed: Seed = 0) -> np.ndarray:
    """(n_boot, N) counts of the resamples of :func:`stratified_indices` (same strata and seed):
    ``counts[b, i]`` = how often sample i is drawn in resample b. Drawn block by block, so the
    indices are never all in memory."""
    strata = _check_strata(strata)
    n = len(strata)
    dtype = np.min_scalar_type(max(n, 1))  # a count never exceeds its stratum's size
    if n == 0:
        return np.zeros((n_boot, 0), dtype=dtype)
    blocks = []
    for index in _index_blocks(strata, n_boot, seed):
        rows = len(index)
        flat = (index + n * np.arange(rows)[:, None]).ravel()  # row b's indices shifted by b * N
        blocks.append(np.bincount(flat, minlength=rows * n).reshape(rows, n).astype(dtype))
    return np.concatenate(blocks)


def _labels(labels: Any) -> np.ndarray:
    """Class labels (numpy or torch) as a contiguous int64 array."""
    if hasattr(labels, "detach"):
        labels = labels.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(labels, dtype=np.int64))


@dataclass(frozen=True, eq=False)
class Resamples:
    """The resamples of one evaluation's images, shared by every system evaluated on them.

    Attributes:
        id_counts: (B, N_id) counts of the ID images, stratified by true class.
        ood_counts: one (B, N_k) array per OOD set, in the evaluation's order.
        key: what they were drawn from (n_boot, seed, a digest of the ID labels, OOD set sizes);
            equal keys mean equal counts.
    """

    id_counts: np.ndarray
    ood_counts: tuple[np.ndarray, ...]
    key: tuple

    @classmethod
    def draw(cls, id_labels: Any, ood_sizes: Sequence[int], config: BootstrapConfig) -> Resamples:
        """Resamples of the ID images (strata: ``id_labels``) and of OOD sets of ``ood_sizes``."""
        labels = _labels(id_labels)
        key = cls.key_for(labels, ood_sizes, config)
        streams = np.random.SeedSequence(config.seed).spawn(1 + len(ood_sizes))
        id_counts = stratified_counts(labels, n_boot=config.n_boot, seed=streams[0])
        ood_counts = tuple(
            stratified_counts(np.zeros(n, dtype=np.int64), n_boot=config.n_boot, seed=stream)
            for n, stream in zip(ood_sizes, streams[1:], strict=True)
        )
        return cls(id_counts, ood_counts, key)

    @staticmethod
    def key_for(id_labels: Any, ood_sizes: Sequence[int], config: BootstrapConfig) -> tuple:
        """The :attr:`key` of the resamples :meth:`draw` gives for these arguments."""
        digest = hashlib.sha256(_labels(id_labels).tobytes()).hexdigest()
        return (config.n_boot, config.seed, digest, tuple(int(n) for n in ood_sizes))

    @property
    def n_boot(self) -> int:
        return len(self.id_counts)


# --- intervals -----------------------------------------------------------------------------------


def _check_level(level: float) -> float:
    if not 0 < level < 1:
        raise ValueError(f"level must lie strictly between 0 and 1 (e.g. 0.95), got {level!r}")
    return float(level)


def percentile_interval(replicates: Any, level: float = LEVEL) -> tuple[float, float]:
    """(lo, hi): the (1 - level) / 2 and (1 + level) / 2 quantiles of the resample values (linear
    interpolation); (NaN, NaN) when any resample value is NaN or there are none."""
    level = _check_level(level)
    values = np.asarray(replicates, dtype=np.float64)
    if values.size == 0 or np.isnan(values).any():
        return float("nan"), float("nan")
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def two_level_interval(
    values: Sequence[float],
    replicates: Sequence[Any],
    *,
    level: float = LEVEL,
) -> tuple[float, float, float]:
    """(mean, lo, hi) of a statistic measured in R repeats (seeds, search samples), each with its
    item-level bootstrap replicates: a Student t interval over the repeats whose variance adds the
    item sampling that the repeats' spread does not hold (docs/intervals.md).

    Model: repeat r measures d_r = mu + b_r + e_r, b_r the repeat's own randomness (variance
    sigma_b^2, independent over repeats) and e_r the sampling of the items; when the repeats are
    evaluated on the same items, the e_r are correlated (a shared part). The mean over repeats has
    Var(mean) = sigma_b^2 / R + Var(mean of e_r). From the data:

    - s^2: the sample variance of the R values. It estimates sigma_b^2 + i, where i is the part of
      the item noise that differs between repeats (all of it for independent items, none of it for
      one shared item sample and repeats that move together);
    - v: the variance over b of the mean over repeats of the b-th replicates (replicates are
      paired by index: the same resample of the same items in every repeat, as the evaluations
      draw them); it estimates Var(mean of e_r), shared part included. Replicate arrays of
      different lengths are taken as independent: v = mean w_r / R;
    - i_hat = R / (R - 1) * (mean w_r - v), w_r the variance of repeat r's replicates: the mean
      over b of the sample variance over repeats of the centred replicates, so it estimates i.

    se^2 = max(s^2 - i_hat, 0) / R + v: the repeats' spread less the item noise already in it
    (nothing counted twice), plus the item noise of the mean. With independent items this is
    max(s^2, mean w_r) / R; with one shared item sample it is s^2 / R + v. The quantile is Student
    t with Welch-Satterthwaite degrees of freedom df = (R - 1) * (se^2 / (s^2 / R))^2 (s^2 is the
    only estimated part; df = R - 1 where the repeats' spread dominates, towards the normal where
    the item noise does). The interval is mean +- t_{df, (1 + level) / 2} * se.

    Simulated coverage (tests/metrics/test_bootstrap.py: repeats with a known mean, between-repeat
    variance and shared or independent item noise) is 0.94-0.96 at R = 3, 5 and 10, where the
    former percentile bootstrap over repeats covered 0.78 at R = 3 with shared items.

    With one repeat it is that repeat's item-level percentile interval. (mean, NaN, NaN) when any
    value or replicate is NaN, or when R > 1 and a repeat has fewer than 2 replicates.

    Args:
        values: (R,) the statistic in each repeat; its mean is the point value.
        replicates: R arrays, each the statistic on that repeat's item resamples.
    """
    level = _check_level(level)
    point = np.asarray(values, dtype=np.float64)
    reps = [np.asarray(r, dtype=np.float64) for r in replicates]
    if point.ndim != 1 or len(point) == 0 or len(point) != len(reps):
        raise ValueError(
            f"two_level_interval needs one value and one replicate array per repeat, got "
            f"{point.shape} values and {len(reps)} replicate arrays"
        )
    if any(r.ndim != 1 or len(r) == 0 for r in reps):
        raise ValueError("every repeat needs a non-empty 1-D array of item-level replicates")
    nan = float("nan")
    mean = float(point.mean())
    if np.isnan(point).any() or any(np.isnan(r).any() for r in reps):
        return mean, nan, nan
    if len(point) == 1:
        lo, hi = percentile_interval(reps[0], level)
        return mean, lo, hi
    if any(len(x) < 2 for x in reps):
        return mean, nan, nan
    item_var, item_between = item_variance_parts(reps)
    lo, hi = repeat_interval(point, item_var, item_between, level)
    return mean, lo, hi


def item_variance_parts(replicates: Sequence[Any]) -> tuple[float, float]:
    """(v, i_hat) of :func:`two_level_interval` from R >= 2 repeats' item-level replicates: v the
    item sampling variance of the mean over repeats, i_hat the part of the item noise that differs
    between repeats (already in the repeats' spread). Stored beside the per-repeat values, they let
    :func:`repeat_interval` recompute the interval without the replicates."""
    reps = [np.asarray(x, dtype=np.float64) for x in replicates]
    r = len(reps)
    if r < 2 or any(x.ndim != 1 or len(x) < 2 for x in reps):
        raise ValueError("item_variance_parts needs 2 or more repeats of 2 or more replicates each")
    w = float(np.mean([x.var(ddof=1) for x in reps]))
    if len({len(x) for x in reps}) == 1:  # paired by index: the mean's replicates
        v = float(np.mean([x - x.mean() for x in reps], axis=0).var(ddof=1))
    else:
        v = w / r
    return v, r / (r - 1) * max(w - v, 0.0)


def repeat_interval(
    values: Sequence[float], item_var: float, item_between: float, level: float = LEVEL
) -> tuple[float, float]:
    """(lo, hi) of :func:`two_level_interval` from the R >= 2 per-repeat values and the item parts
    of :func:`item_variance_parts`: mean +- t_df * se, se^2 = max(s^2 - item_between, 0) / R +
    item_var, df = (R - 1) * (se^2 / (s^2 / R))^2 (the normal quantile where s^2 = 0)."""
    level = _check_level(level)
    point = np.asarray(values, dtype=np.float64)
    r = len(point)
    if r < 2:
        raise ValueError(f"repeat_interval needs 2 or more repeats, got {r}")
    if np.isnan(point).any() or item_var != item_var or item_between != item_between:
        return float("nan"), float("nan")
    s2 = float(point.var(ddof=1))
    se2 = max(s2 - item_between, 0.0) / r + item_var
    df = math.inf if s2 == 0 else (r - 1) * (se2 / (s2 / r)) ** 2
    q = float(stats.t.ppf((1 + level) / 2, df)) if np.isfinite(df) else _normal_quantile(level)
    half = q * math.sqrt(se2)
    mean = float(point.mean())
    return mean - half, mean + half


def _normal_quantile(level: float) -> float:
    return float(stats.norm.ppf((1 + level) / 2))


def _resampled(data: Sequence[Any], index: np.ndarray) -> list[Any]:
    return [d[index] for d in data]


def _check_data(data: Sequence[Any], strata: Any) -> tuple[list[np.ndarray], np.ndarray]:
    """Arrays sharing their first axis (the samples), and the strata (one stratum if None)."""
    arrays = [np.asarray(d) for d in data]
    if not arrays:
        raise ValueError("no data: pass the arrays the statistic takes")
    sizes = {len(a) for a in arrays}
    if len(sizes) != 1:
        raise ValueError(
            f"the data arrays must share their first axis, got lengths {sorted(sizes)}"
        )
    n = sizes.pop()
    strata = np.zeros(n, dtype=np.int64) if strata is None else _check_strata(strata)
    if len(strata) != n:
        raise ValueError(f"strata has {len(strata)} entries for {n} samples")
    return arrays, strata


def bootstrap_replicates(
    statistic: Callable[..., float],
    *data: Any,
    strata: Any = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> np.ndarray:
    """(n_boot,) values of ``statistic(*resampled data)`` over the resamples of
    :func:`stratified_indices` (one stratum when ``strata`` is None). Every array of ``data`` is
    indexed along its first axis with the same resample indices."""
    arrays, strata = _check_data(data, strata)
    index = stratified_indices(strata, n_boot=n_boot, seed=seed)  # (B, N)
    return np.array([statistic(*_resampled(arrays, row)) for row in index], dtype=np.float64)


def bootstrap_interval(
    statistic: Callable[..., float],
    *data: Any,
    strata: Any = None,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = LEVEL,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic(*data)``, resampling within ``strata``.

    Example: ``bootstrap_interval(metrics.accuracy, probs, labels, strata=labels)``."""
    replicates = bootstrap_replicates(statistic, *data, strata=strata, n_boot=n_boot, seed=seed)
    return percentile_interval(replicates, level)


def paired_difference(
    statistic: Callable[..., float],
    data_a: Sequence[Any],
    data_b: Sequence[Any],
    *,
    strata: Any = None,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = LEVEL,
) -> tuple[float, float, float]:
    """(difference, lo, hi) of ``statistic(*data_a) - statistic(*data_b)`` for two systems
    evaluated on the same samples: both are resampled with the same indices, and the interval is
    that of the per-resample differences. It contains 0 when the difference is not significant.

    Example: ``paired_difference(metrics.accuracy, (probs_a, labels), (probs_b, labels),
    strata=labels)``."""
    arrays_a, strata = _check_data(data_a, strata)
    arrays_b, _ = _check_data(data_b, None)
    if len(arrays_a[0]) != len(arrays_b[0]):
        raise ValueError(
            f"a paired difference needs the same samples for both systems, got "
            f"{len(arrays_a[0])} and {len(arrays_b[0])}"
        )
    index = stratified_indices(strata, n_boot=n_boot, seed=seed)  # (B, N)
    diffs = np.array(
        [
            statistic(*_resampled(arrays_a, row)) - statistic(*_resampled(arrays_b, row))
            for row in index
        ],
        dtype=np.float64,
    )
    return (statistic(*arrays_a) - statistic(*arrays_b), *percentile_interval(diffs, level))


# --- vectorised metrics over all resamples -------------------------------------------------------


def _check_counts(counts: Any, n: int, name: str) -> np.ndarray:
    array = np.asarray(counts)
    if array.ndim != 2 or array.shape[1] != n:
        raise ValueError(f"{name} must be (B, {n}) counts per resample, got shape {array.shape}")
    if array.size and (not np.issubdtype(array.dtype, np.integer) or array.min() < 0):
        raise ValueError(f"{name} must hold non-negative integer counts")
    return array


def _blocks(n_boot: int, width: int) -> Iterator[slice]:
    rows = max(1, _BLOCK_CELLS // max(width, 1))
    for first in range(0, n_boot, rows):
        yield slice(first, min(first + rows, n_boot))


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator as float64, NaN where the denominator is 0 (an empty resample)."""
    out = np.full(np.broadcast(numerator, denominator).shape, np.nan)
    return np.divide(numerator, denominator, out=out, where=denominator > 0)


def _columns(array: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``array[:, index]`` (np.take is several times faster than fancy indexing here)."""
    return np.take(array, index, axis=1)


def _running(weights: np.ndarray) -> np.ndarray:
    """(b, N + 1) running totals of ``weights`` (b, N) along each row, starting at 0 (float64:
    totals of counts stay exact integers)."""
    out = np.empty((len(weights), weights.shape[1] + 1))
    out[:, 0] = 0.0
    np.cumsum(weights, axis=1, out=out[:, 1:])
    return out


def _rowdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(b,) dot product of each row of ``a`` with the same row of ``b``."""
    return np.einsum("ij,ij->i", a, b)


def mean_replicates(values: Any, counts: Any) -> np.ndarray:
    """Means of per-sample ``values`` over each resample of ``counts`` (B, N): (B,) for values
    (N,), (B, K) for K columns (N, K); e.g. diversity with ``reduction="none"``."""
    v = as_float64(values, "values")
    if v.ndim not in (1, 2):
        raise ValueError(f"values must be (N,) or (N, K), got shape {v.shape}")
    c = _check_counts(counts, len(v), "counts")
    out = np.empty((len(c), *v.shape[1:]))
    for rows in _blocks(len(c), len(v)):
        block = c[rows].astype(np.float64)  # (b, N)
        total = block.sum(axis=1)  # (b,)
        out[rows] = _ratio(block @ v, total if v.ndim == 1 else total[:, None])
    return out


def _adaptive_ece(
    counts: np.ndarray, confidence: np.ndarray, correct: np.ndarray, n_bins: int
) -> np.ndarray:
    """(b,) adaptive ECE of each resample of ``counts`` (b, N): equal-mass bins over the resample
    sorted by (confidence, correct), as :func:`hydra_core.metrics.adaptive_ece`.

    In sorted order the resample is image j repeated w_j times. Bin k covers the resample positions
    [e_(k-1), e_k); the image at position e lies at sorted index i with C_(i-1) <= e < C_i (C: the
    cumulative counts), so the sum of x up to e is the sum of w_j x_j over j < i plus
    (e - C_(i-1)) x_i copies of image i."""
    b, n = counts.shape
    order = np.lexsort((correct, confidence))
    taken = _columns(counts, order)  # (b, N) counts in sorted order
    upto = np.cumsum(taken, axis=1, dtype=np.int64)  # (b, N) C_i
    total = upto[:, -1]  # (b,)
    sizes = total[:, None] // n_bins + (np.arange(n_bins) < total[:, None] % n_bins)  # (b, bins)
    edges = np.zeros((b, n_bins + 1), dtype=np.int64)
    np.cumsum(sizes, axis=1, out=edges[:, 1:])  # (b, bins + 1) e_k
    # i at every edge, one searchsorted for all rows: each row shifted above the previous one
    row = np.arange(b)[:, None]  # (b, 1)
    shift = row * (total.max() + 1)
    at = np.searchsorted((upto + shift).ravel(), (edges + shift).ravel(), side="right")
    at = at.reshape(b, n_bins + 1) - row * n  # (b, bins + 1) sorted index, N past the end
    before = np.where(at > 0, np.take_along_axis(upto, np.maximum(at - 1, 0), axis=1), 0)
    partial = edges - before  # (b, bins + 1) copies of image i before the edge
    # reduceat sums from each start to the next: bin k of row r runs from i_(k-1) to i_k, the last
    # bin on into the next row's leading zero-count images (adding 0); an empty bin (i_(k-1) =
    # i_k, where reduceat gives one element, or i_(k-1) = N, past the end) is set to 0
    starts = np.minimum(at[:, :-1] + row * n, b * n - 1).ravel()  # (b * bins,)
    empty = at[:, 1:] == at[:, :-1]  # (b, bins)
    gap = np.zeros((b, n_bins))
    for sign, x in ((1.0, correct[order]), (-1.0, confidence[order])):
        segment = np.add.reduceat((taken * x).ravel(), starts).reshape(b, n_bins)
        segment[empty] = 0.0  # sum of w_j x_j over [i_(k-1), i_k)
        x_at = np.append(x, 0.0)[at] * partial  # (b, bins + 1) partial copies at each edge
        gap += sign * (segment + x_at[:, 1:] - x_at[:, :-1])
    return _ratio(np.abs(gap).sum(axis=1), total)


def classification_replicates(
    probs: Any, labels: Any, counts: Any, *, n_bins: int = N_BINS, log_p_true: Any = None
) -> dict[str, np.ndarray]:
    """Accuracy, NLL, Brier, ECE and adaptive ECE of every resample: keys as
    :func:`hydra_core.metrics.classification_metrics`, each (B,).

    Args:
        probs: (N, C) class probabilities; labels: (N,) true classes.
        counts: (B, N) how often each image is drawn in each resample.
        log_p_true: (N,) exact log p_y for the NLL (as in ``classification_metrics``).
    """
    n_bins = check_n_bins(n_bins)
    p, y = check_classification(probs, labels)
    c = _check_counts(counts, len(y), "counts")
    confidence = p.max(axis=1)  # (N,)
    correct = (p.argmax(axis=1) == y).astype(np.float64)  # (N,)
    nll = per_sample_nll(p, y, _checked_log_p(log_p_true, len(y)))  # (N,)
    onehot = np.zeros_like(p)
    onehot[np.arange(len(y)), y] = 1.0
    brier = np.sum((p - onehot) ** 2, axis=1)  # (N,)
    in_bin = np.eye(n_bins)[_equal_width_bin(confidence, n_bins)]  # (N, bins)
    per_image = np.column_stack(
        [correct, nll, brier, in_bin * confidence[:, None], in_bin * correct[:, None]]
    )  # (N, 3 + 2 bins)
    out = {k: np.full(len(c), np.nan) for k in ("accuracy", "nll", "brier", "ece", "adaptive_ece")}
    if len(y) == 0:
        return out
    for rows in _blocks(len(c), len(y)):
        block = c[rows]  # (b, N)
        total = block.sum(axis=1, dtype=np.int64)  # (b,)
        sums = block.astype(np.float64) @ per_image  # (b, 3 + 2 bins)
        out["accuracy"][rows] = _ratio(sums[:, 0], total)
        out["nll"][rows] = _ratio(sums[:, 1], total)
        out["brier"][rows] = _ratio(sums[:, 2], total)
        conf_in, correct_in = sums[:, 3 : 3 + n_bins], sums[:, 3 + n_bins :]
        out["ece"][rows] = _ratio(np.abs(correct_in - conf_in).sum(axis=1), total)
        out["adaptive_ece"][rows] = _adaptive_ece(block, confidence, correct, n_bins)
    return out


def _reaching(total: np.ndarray) -> np.ndarray:
    """Per resample, the smallest count c with c / total >= RECALL_LEVEL, evaluated in float64
    exactly as :mod:`hydra_core.metrics.ood` compares ``tps / tps[-1]``."""
    c = np.ceil(RECALL_LEVEL * total).astype(np.int64)
    c += (c / np.maximum(total, 1)) < RECALL_LEVEL
    c -= ((c - 1) / np.maximum(total, 1)) >= RECALL_LEVEL
    return c


def ood_replicates(
    id_scores: Any, ood_scores: Any, id_counts: Any, ood_counts: Any
) -> dict[str, np.ndarray]:
    """AUROC, FPR@95, AUPR-In, AUPR-Out and FPR@95TPR-ID of every resample: keys as
    :func:`hydra_core.metrics.ood_metrics`, each (B,); NaN for all when either set is empty.

    Args:
        id_scores: (N_id,), ood_scores: (N_ood,) scores, higher = more in-distribution.
        id_counts: (B, N_id), ood_counts: (B, N_ood) how often each image is drawn in each
            resample (the same B resamples).
    """
    return ood_replicates_per_set(id_scores, [ood_scores], id_counts, [ood_counts])[0]


def _tie_group_edges(sorted_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each sorted position, the first position of its run of equal scores and one past the
    last, (N,) each."""
    return (
        np.searchsorted(sorted_scores, sorted_scores, side="left"),
        np.searchsorted(sorted_scores, sorted_scores, side="right"),
    )


@dataclass(frozen=True)
class _SortedSet:
    """An OOD set sorted once, and where its scores and the ID scores fall among each other's.
    Everything is in sorted order; ``*_tied`` lists the positions where a tie changes a count."""

    order: np.ndarray  # (N_ood,) sorting permutation
    scores: np.ndarray  # (N_ood,) sorted
    counts: np.ndarray  # (B, N_ood) in the original order
    id_below: np.ndarray  # (N_ood,) ID scores < each OOD score
    id_tied: np.ndarray  # OOD positions that tie with ID scores
    id_upto_tied: np.ndarray  # ID scores <= the OOD score at those positions
    ood_tied: np.ndarray  # OOD positions whose run of equal OOD scores goes on after them
    ood_upto_tied: np.ndarray  # OOD scores <= the OOD score at those positions
    ood_below_id: np.ndarray  # (N_id,) OOD scores < each sorted ID score

    @classmethod
    def of(cls, scores: np.ndarray, counts: np.ndarray, id_sorted: np.ndarray) -> _SortedSet:
        order = np.argsort(scores, kind="stable")
        ood_sorted = scores[order]
        id_below = np.searchsorted(id_sorted, ood_sorted, side="left")
        id_upto = np.searchsorted(id_sorted, ood_sorted, side="right")
        id_tied = np.flatnonzero(id_upto > id_below)
        ood_upto = _tie_group_edges(ood_sorted)[1]
        ood_tied = np.flatnonzero(ood_upto > np.arange(1, len(order) + 1))
        return cls(
            order,
            ood_sorted,
            counts,
            id_below,
            id_tied,
            id_upto[id_tied],
            ood_tied,
            ood_upto[ood_tied],
            np.searchsorted(ood_sorted, id_sorted, side="left"),
        )


def ood_replicates_per_set(
    id_scores: Any, ood_scores: Sequence[Any], id_counts: Any, ood_counts: Sequence[Any]
) -> list[dict[str, np.ndarray]]:
    """:func:`ood_replicates` for several OOD sets against the same ID images, sharing the work on
    the ID images (sorted and accumulated once per block of resamples).

    Per resample, with weights w (counts) and every set in its sorted order:
    AUROC = sum_j w_j (ID weight above s_j + half the ID weight equal to s_j) / (n_id n_ood);
    AUPR-Out = sum_j w_j precision(s_j) / n_ood, OOD positive, flagged when score <= s_j;
    AUPR-In = sum_i w_i precision(s_i) / n_id, ID positive, accepted when score >= s_i;
    FPR@95 = ID weight <= t / n_id at the lowest OOD score t whose OOD weight <= t reaches 95%;
    FPR@95TPR-ID = OOD weight >= t / n_ood at the highest ID score t whose ID weight >= t reaches
    95%. Zero-weight images add nothing, so each equals the metric on the resampled images."""
    s_id = check_scores(id_scores, "id_scores")
    c_id = _check_counts(id_counts, len(s_id), "id_counts")
    if len(ood_scores) != len(ood_counts):
        raise ValueError(f"{len(ood_scores)} OOD score arrays but {len(ood_counts)} count arrays")
    keys = ("auroc", "fpr95", "aupr_in", "aupr_out", "fpr95_tpr_id")
    out = [{k: np.full(len(c_id), np.nan) for k in keys} for _ in ood_scores]
    id_order = np.argsort(s_id, kind="stable")
    id_sorted = s_id[id_order]
    sets: dict[int, _SortedSet] = {}
    for k, (scores, counts) in enumerate(zip(ood_scores, ood_counts, strict=True)):
        s_ood = check_scores(scores, "ood_scores")
        c_ood = _check_counts(counts, len(s_ood), "ood_counts")
        if len(c_ood) != len(c_id):
            raise ValueError(f"id_counts has {len(c_id)} resamples, ood_counts {len(c_ood)}")
        if len(s_id) and len(s_ood):
            sets[k] = _SortedSet.of(s_ood, c_ood, id_sorted)
    if not sets:
        return out
    id_start = _tie_group_edges(id_sorted)[0]
    id_tied = np.flatnonzero(id_start < np.arange(len(s_id)))  # runs of equal ID scores
    width = len(s_id) + max(len(s.order) for s in sets.values())
    for rows in _blocks(len(c_id), width):
        w_id = _columns(c_id[rows], id_order).astype(np.float64)  # (b, N_id) sorted order
        cum_id = _running(w_id)  # (b, N_id + 1) ID weight before each sorted position
        n_id = cum_id[:, -1]  # (b,)
        tp_in = n_id[:, None] - cum_id[:, :-1]  # (b, N_id) ID weight >= s_i
        tp_in[:, id_tied] = n_id[:, None] - _columns(cum_id, id_start[id_tied])
        last = (tp_in >= _reaching(n_id)[:, None]).sum(axis=1) - 1  # (b,) FPR@95TPR-ID's t
        t_id = id_sorted[np.maximum(last, 0)]
        for k, s in sets.items():
            w_ood = _columns(s.counts[rows], s.order).astype(np.float64)  # (b, N_ood) sorted
            cum_ood = _running(w_ood)  # (b, N_ood + 1)
            n_ood = cum_ood[:, -1]
            id_le = _columns(cum_id, s.id_below)  # (b, N_ood) ID weight < s_j ...
            id_lt_tied = id_le[:, s.id_tied]
            id_le[:, s.id_tied] = _columns(cum_id, s.id_upto_tied)  # ... now <= s_j
            ties = _rowdot(w_ood[:, s.id_tied], id_le[:, s.id_tied] - id_lt_tied)
            pairs = 2 * n_id * n_ood - 2 * _rowdot(w_ood, id_le) + ties
            out[k]["auroc"][rows] = _ratio(pairs, 2 * n_id * n_ood)
            tp = cum_ood[:, 1:].copy()  # (b, N_ood) OOD weight <= s_j
            tp[:, s.ood_tied] = _columns(cum_ood, s.ood_upto_tied)
            precision = tp / np.maximum(tp + id_le, 1)  # 0 / 1 only where w_j = 0
            out[k]["aupr_out"][rows] = _ratio(_rowdot(w_ood, precision), n_ood)
            total_in = tp_in + n_ood[:, None] - _columns(cum_ood, s.ood_below_id)  # (b, N_id)
            precision_in = tp_in / np.maximum(total_in, 1)
            out[k]["aupr_in"][rows] = _ratio(_rowdot(w_id, precision_in), n_id)
            first = (cum_ood[:, 1:] < _reaching(n_ood)[:, None]).sum(axis=1)  # (b,)
            t = s.scores[np.minimum(first, len(s.order) - 1)]
            flagged = np.take_along_axis(cum_id, np.searchsorted(id_sorted, t, "right")[:, None], 1)
            out[k]["fpr95"][rows] = _ratio(flagged[:, 0], n_id)
            below = np.take_along_axis(cum_ood, np.searchsorted(s.scores, t_id, "left")[:, None], 1)
            out[k]["fpr95_tpr_id"][rows] = _ratio(n_ood - below[:, 0], n_ood)
    return out
