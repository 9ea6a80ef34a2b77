"""The disjoint search and report data that every result is computed on (docs/default.md,
"Protocol").

Heads are selected with scores computed on *search* data; results are reported on *report* data
that no head selection used (paper Appendix D.1.2, "OOD sets and fairness"):

- in-distribution: two disjoint pools. By default the search pool is Fashion-MNIST's validation
  split (5,000 training images held out from training the default model) and the report pool is
  the official test set (10,000).
- OOD, protocol ``"dedicated"`` (the default, the paper's): every OOD set has a role. The
  search-role sets (by default ``photos`` and ``faces``, :data:`~hydra_core.data.ood.SEARCH_OOD`)
  select heads and are never reported on; the report-role sets (by default the three near and two
  far sets, :data:`~hydra_core.data.ood.REPORT_OOD`) are reported on and never select heads. No set
  has both roles, so head selection never sees a reported distribution, as the paper extracts its
  circuits against a dedicated OOD validation set that no final table uses.
- ``"halves"`` (an explicit option only): every report set is cut once into two halves
  (:func:`~hydra_core.data.images.split_in_two`), one selects heads, the other is reported on:
  the search saw the reported distributions, so OOD numbers come out optimistic
  (:meth:`Benchmark.protocol_note` says so, as the command line and the app do).
- ``"synthetic"``: search sets made from the ID search items (:mod:`hydra_core.data.synthetic`).
- ``"far-to-near"`` / ``"near-to-far"`` (leave one group out): every set of the searched group
  selects heads; only the other group's report sets are reported on (docs/search-protocols.md).

``n_search`` and ``n_report`` cap each part at the first n items of a fixed shuffle (the one
:func:`~hydra_core.data.images.take` uses), so the same request always gives the same items and a
smaller n is a prefix of a larger one. Nothing depends on the random state of the process.

Text classification uses the same benchmark with :class:`~hydra_core.data.text.TextSet` parts
(:mod:`hydra_core.data.text`, :func:`default_text_benchmark`): Rotten Tomatoes validation sentences
to search, test sentences to report, the ``guardian`` headlines as the search set
(:data:`~hydra_core.data.text.TEXT_SEARCH_OOD`) and five report sets
(:data:`~hydra_core.data.text.TEXT_REPORT_OOD`). A benchmark's parts are all images or all texts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from hydra_core.data.fashion_mnist import load_fashion_mnist
from hydra_core.data.images import ImageSet, kind_of, split_in_two, stable_permutation, take
from hydra_core.data.images import resampled as resampled  # re-exported: moved to images
from hydra_core.data.ood import REPORT_OOD, SEARCH_OOD, load_ood_set
from hydra_core.data.sources import (
    Source,
    check_names,
    check_paths,
    parse_id_source,
    parse_source,
)
from hydra_core.data.text import (
    TEXT_REPORT_OOD,
    TEXT_SEARCH_OOD,
    DataSet,
    TextSet,
    load_rotten_tomatoes,
    load_text_ood_set,
    text_key,
)
from hydra_core.data.text_files import load_text_file
from hydra_core.errors import InputError, choice

#: how OOD data is divided between head selection and the report (docs/search-protocols.md)
PROTOCOLS = ("dedicated", "halves", "synthetic", "far-to-near", "near-to-far")
#: the protocol the command line, the app and the reports use unless told otherwise
DEFAULT_PROTOCOL = "dedicated"
#: the protocols whose search sets are named sets or sets of your own (not halves, not synthetic)
NAMED_SEARCH = ("dedicated", "far-to-near", "near-to-far")
#: the leave-one-group-out protocols: the group that selects heads
SEARCHED_GROUP = {"far-to-near": "far", "near-to-far": "near"}
#: the default ID sets' names (:func:`~hydra_core.data.fashion_mnist.load_fashion_mnist`,
#: :func:`~hydra_core.data.text.load_rotten_tomatoes`)
FASHION_MNIST, ROTTEN_TOMATOES = "fashion_mnist", "rotten_tomatoes"


@dataclass(frozen=True, eq=False)
class Benchmark:
    """ID data cut into a search part (to select heads) and a report part (to report on), and
    OOD sets in two roles: search sets select heads, report sets are reported on. Every part is
    an :class:`ImageSet`, or every part a :class:`~hydra_core.data.text.TextSet`."""

    id_search: DataSet  # ID images (or texts) used to select heads
    id_report: DataSet  # ID images (or texts) results are reported on
    ood_search: tuple[DataSet, ...]  # the search-role OOD sets ("halves": report set halves)
    ood_report: tuple[DataSet, ...]  # the report-role OOD sets ("halves": the other halves)
    protocol: str = "dedicated"  # one of PROTOCOLS

    def __post_init__(self) -> None:
        _check_protocol(self.protocol)
        for part in (self.id_search, self.id_report):
            if part.group != "id" or part.labels is None:
                raise ValueError(
                    f"the in-distribution set {part.name!r} needs labels and group 'id' "
                    f"(has group {part.group!r}, {'no ' if part.labels is None else ''}labels)"
                )
        parts = (self.id_search, self.id_report, *self.ood_search, *self.ood_report)
        _check_same_kind(self.id_search, parts)
        search_names, report_names = self.search_names(), self.report_names()
        for role, names in (("search", search_names), ("report", report_names)):
            if not names:
                raise InputError(
                    f"no {role} OOD set: choose at least one (search sets select heads, report "
                    "sets are reported on)"
                )
            if len(set(names)) != len(names):
                twice = next(n for n in names if names.count(n) > 1)
                raise InputError(
                    f"two {role} OOD sets are named {twice!r}: every set needs a name of its own "
                    "(tables and results are keyed by it); rename one (NAME=PATH for a folder or "
                    "file of your own)"
                )
        if self.id_search.name in (*search_names, *report_names):
            raise InputError(
                f"the ID set and an OOD set are both named {self.id_search.name!r}: every set "
                "needs a name of its own (tables and results are keyed by it); rename one "
                "(NAME=PATH for a folder or file of your own)"
            )
        if self.protocol != "halves":
            _check_disjoint(search_names, report_names)
        elif search_names != report_names:
            raise ValueError(
                f"protocol 'halves': the search parts {search_names} must be halves of the "
                f"report sets {report_names}, in the same order"
            )
        for part in (*self.ood_search, *self.ood_report):
            if part.group == "id":
                raise ValueError(
                    f"OOD set {part.name!r} has group 'id'; load it with group='near' or 'far'"
                )
        for part in parts:
            if len(part) == 0:
                raise ValueError(f"{part.name!r}: a search or report part is empty")
        if isinstance(self.id_search, TextSet):
            _check_texts_apart(self)
            return
        shape = tuple(self.id_search.images.shape[1:])
        for part in parts:
            if tuple(part.images.shape[1:]) != shape:
                raise ValueError(
                    f"{part.name!r} has images of shape {tuple(part.images.shape[1:])} but the "
                    f"in-distribution set has {shape}; load it with the same size and channels"
                )

    def search_names(self) -> list[str]:
        """The OOD sets heads are selected on."""
        return [s.name for s in self.ood_search]

    def report_names(self) -> list[str]:
        """The OOD sets results are reported on."""
        return [s.name for s in self.ood_report]

    def protocol_note(self) -> str | None:
        """A warning in words when the search saw the reported distributions (protocol
        ``"halves"``); None under ``"dedicated"``, where it did not."""
        if self.protocol == "dedicated":
            return None
        return (
            f"protocol 'halves': heads were selected on one half of each reported OOD set "
            f"({', '.join(self.report_names())}) and results are reported on the other half, so "
            "the search saw the reported distributions and the OOD numbers are optimistic; use "
            "the 'dedicated' protocol (the default) for numbers to report"
        )

    def pooled_ood_search(self, n: int | None = None) -> DataSet:
        """The OOD search sets pooled into one unlabelled set named ``"ood_search"`` (an image or
        a text set, as the parts are).

        Balanced across sets: ``n`` is split as evenly as possible (the first ``n % k`` sets give
        one item more), each set's share is a :func:`take` cut of its search part, and the pool
        is shuffled by a fixed permutation. ``n=None`` takes as many from every set as the smallest
        search part holds. Its group is the sets' common group, ``"far"`` when they are mixed.
        """
        shares = self._pool_shares(n)
        n = sum(shares)
        parts = [
            take(part, share, purpose="pooled")
            for part, share in zip(self.ood_search, shares, strict=True)
        ]
        order = stable_permutation(n, "ood_search", *self.search_names())
        groups = {p.group for p in parts}
        counts = ", ".join(f"{len(p)} {p.name}" for p in parts)
        pooled = concatenate(
            parts,
            name="ood_search",
            group=groups.pop() if len(groups) == 1 else "far",
            description=f"OOD search sets pooled: {counts}",
            source="pooled",
        )
        return pooled.subset(order)

    def _pool_shares(self, n: int | None) -> list[int]:
        """How many items each OOD search set gives to a balanced pool of ``n`` (see
        :meth:`pooled_ood_search`); refused in one line when a set is too small."""
        k, smallest = len(self.ood_search), min(len(s) for s in self.ood_search)
        n = k * smallest if n is None else n
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive number of items (or None), got {n!r}")
        if n < k:
            raise InputError(
                f"a pool of {n} OOD search {kind_of(self.ood_search[0])} cannot take one from "
                f"each of the {k} OOD search sets ({', '.join(self.search_names())}); ask for "
                f"at least {k} ({choice('n_search')})"
            )
        shares = [n // k + (i < n % k) for i in range(k)]
        for part, share in zip(self.ood_search, shares, strict=True):
            if share > len(part):
                raise ValueError(
                    f"a balanced pool of {n} {kind_of(part)} needs {share} from {part.name!r}, "
                    f"whose search part has {len(part)}; ask for at most {k * smallest}"
                )
        return shares

    def pooled_ood_search_sets(self, n: int | None = None) -> tuple[str, ...]:
        """The OOD search set each item of :meth:`pooled_ood_search` (same ``n``) comes from, in
        the pool's order: the strata for resampling each set within itself."""
        shares = self._pool_shares(n)
        names = [
            s.name for s, share in zip(self.ood_search, shares, strict=True) for _ in range(share)
        ]
        order = stable_permutation(sum(shares), "ood_search", *self.search_names())
        return tuple(names[i] for i in order.tolist())

    def describe(self):
        """One row per set (ID, then the report sets, then the search sets): name, group, role,
        n_search, n_report, description. Under ``"halves"`` every OOD set has both roles."""
        import pandas as pd

        def row(data_set: DataSet, role: str, n_search: int, n_report: int) -> dict:
            return {
                "name": data_set.name,
                "group": data_set.group,
                "role": role,
                "n_search": n_search,
                "n_report": n_report,
                "description": data_set.description,
            }

        rows = [row(self.id_search, "search + report", len(self.id_search), len(self.id_report))]
        if self.protocol == "halves":
            rows += [
                row(report, "search + report (halves)", len(search), len(report))
                for search, report in zip(self.ood_search, self.ood_report, strict=True)
            ]
        else:
            rows += [row(report, "report", 0, len(report)) for report in self.ood_report]
            rows += [row(search, "search", len(search), 0) for search in self.ood_search]
        return pd.DataFrame(rows)

    def fingerprint(self) -> str:
        """A hash of the protocol and of every image (or text) and label in every part, by role:
        part of cache keys computed from it."""
        h = hashlib.sha256(f"protocol:{self.protocol};".encode())
        for role, part in [("id_search", self.id_search), ("id_report", self.id_report)]:
            h.update(f"{role}:{part.fingerprint()};".encode())
        for role, parts in (("ood_search", self.ood_search), ("ood_report", self.ood_report)):
            for part in parts:
                h.update(f"{role}:{part.fingerprint()};".encode())
        return h.hexdigest()[:16]


def concatenate(
    parts: Sequence[DataSet], *, name: str, group: str, description: str = "", source: str = ""
) -> DataSet:
    """The items of ``parts`` (all image sets or all text sets) in one unlabelled set, in order."""
    if not parts:
        raise ValueError("nothing to concatenate: give at least one set")
    _check_same_kind(parts[0], parts)
    if isinstance(parts[0], TextSet):
        texts = tuple(text for part in parts for text in part.texts)
        return TextSet(name, texts, group=group, description=description, source=source)
    images = torch.cat([part.images for part in parts])  # (N, C, H, W)
    return ImageSet(name, images, group=group, description=description, source=source)


def _check_same_kind(reference: DataSet, parts: Sequence[DataSet]) -> None:
    for part in parts:
        if kind_of(part) != kind_of(reference):
            raise InputError(
                f"{part.name!r} holds {kind_of(part)} but {reference.name!r} holds "
                f"{kind_of(reference)}; a benchmark's sets are all images or all texts: choose "
                f"{kind_of(reference)} for every part"
            )


def _check_texts_apart(benchmark: Benchmark) -> None:
    """Refuse a text that selects heads and is reported on (a search part's and a report part's),
    or that is both ID and OOD in one role: texts are compared up to case and punctuation, as
    duplicates are recognised everywhere (:func:`~hydra_core.data.text.text_key`)."""
    search = [("search", benchmark.id_search), *(("search", s) for s in benchmark.ood_search)]
    report = [("report", benchmark.id_report), *(("report", s) for s in benchmark.ood_report)]
    keys = {id(part): {text_key(t) or t: t for t in part.texts} for _, part in search + report}
    for i, (role_a, a) in enumerate(search + report):
        for role_b, b in (search + report)[i + 1 :]:
            ood_pair = a.group != "id" and b.group != "id"
            if role_a == role_b and ood_pair:
                continue  # two OOD sets of one role may share a text: no number mixes them
            shared = keys[id(a)].keys() & keys[id(b)].keys()
            if shared:
                example = keys[id(a)][min(shared)]
                why = (
                    "a text that selects heads may not be reported on"
                    if role_a != role_b
                    else "a text is either in-distribution or OOD"
                )
                raise InputError(
                    f"{len(shared)} text(s) are both in the {role_a} set {a.name!r} and the "
                    f"{role_b} set {b.name!r} (e.g. {example!r}; case and punctuation ignored): "
                    f"{why}; remove them from one of the files"
                )


def _check_protocol(protocol: str) -> None:
    if protocol not in PROTOCOLS:
        raise InputError(
            f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)} (see "
            "docs/search-protocols.md)"
        )


def _check_disjoint(search_names: Sequence[str], report_names: Sequence[str]) -> None:
    if both := [name for name in search_names if name in report_names]:
        raise InputError(
            f"OOD set(s) {', '.join(map(repr, both))} named both as search and as report set: a "
            "set that selects heads may not be reported on; drop it from one of the two lists"
        )


def check_ood_choice(
    ood: Sequence[str],
    search_ood: Sequence[str] | None,
    ood_folders: Sequence[str] = (),
    protocol: str = "dedicated",
    *,
    default_search: Sequence[str] = SEARCH_OOD,
) -> None:
    """Refuse, before anything is loaded, OOD choices that make no benchmark (InputError).

    ``ood`` and ``search_ood`` name the report and search sets (``search_ood=None``: the default
    search sets ``default_search``, :data:`~hydra_core.data.text.TEXT_SEARCH_OOD` for texts, or
    only the ``search:`` folders or files when there are some); ``ood_folders`` are entries as
    :func:`parse_ood_folder` reads them. Refused: nothing to report on; under ``"dedicated"``
    nothing to search on, or a set named in both roles; under ``"halves"`` any search set or
    ``search:`` folder, since its search uses halves of the report sets.
    """
    _check_protocol(protocol)
    roles = [parse_ood_folder(entry)[0] for entry in ood_folders]
    if not ood and "report" not in roles:
        raise InputError(
            "choose at least one OOD set or OOD folder to report on (a near: or far: folder or "
            "file)"
        )
    if protocol not in NAMED_SEARCH:  # halves, synthetic: no search set of their own
        if search_ood is not None or "search" in roles:
            what = "halves of the report sets" if protocol == "halves" else "the ID search items"
            raise InputError(
                "search OOD sets and search: folders apply to the 'dedicated' protocol; under "
                f"{protocol!r} heads are selected on {what}: leave them out"
            )
        return
    if protocol in SEARCHED_GROUP:
        return  # the groups are known once the sets are loaded (build_benchmark)
    if search_ood is None:
        search_ood = () if "search" in roles else default_search
    elif not search_ood and "search" not in roles:
        raise InputError("choose at least one search OOD set or search: folder: they select heads")
    _check_disjoint(search_ood, ood)


def _check_size(value: int | None, what: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(
            f"{what} must be a positive number of items per part (or None for all), got {value!r}"
        )


def _as_list(sets: Sequence[str | DataSet] | str | DataSet) -> list[str | DataSet]:
    return [sets] if isinstance(sets, (str, ImageSet, TextSet)) else list(sets)


def _name(data_set: str | DataSet) -> str:
    return data_set if isinstance(data_set, str) else data_set.name


def build_benchmark(
    id_search_pool: DataSet,
    id_report_pool: DataSet | None,
    ood_sets: Sequence[str | DataSet],
    *,
    search_ood: Sequence[str | DataSet] | None = None,
    protocol: str = "dedicated",
    n_search: int | None = None,
    n_report: int | None = None,
    image_format: tuple[int, int] | None = None,
    synthetic: Sequence[str] | None = None,
) -> Benchmark:
    """Cut the pools into a :class:`Benchmark`, of images or of texts as the ID pool is.

    Args:
        id_search_pool: labelled ID images (or texts) to select heads on.
        id_report_pool: labelled ID images (or texts) to report on, disjoint from
            ``id_search_pool``; None splits ``id_search_pool`` in two instead (for a single folder
            of ID images or a single file of ID texts).
        ood_sets: the report-role OOD sets, as ImageSets (TextSets) or names of the default sets
            (:data:`~hydra_core.data.ood.OOD_SETS`; for texts
            :data:`~hydra_core.data.text.TEXT_OOD`): reported on whole under ``"dedicated"``,
            each split into a search and a report half under ``"halves"``.
        search_ood: the search-role OOD sets, as sets or names; None for the default ones
            (:data:`~hydra_core.data.ood.SEARCH_OOD`; for texts
            :data:`~hydra_core.data.text.TEXT_SEARCH_OOD`). Must stay None under ``"halves"``,
            whose search uses halves of ``ood_sets``. No set may be in both lists.
        protocol: ``"dedicated"`` or ``"halves"`` (see the module docstring).
        n_search: at most this many images (texts) in each search part (ID and every search
            set); all when None.
        n_report: the same for each report part (ID and every report set).
        image_format: (channels, size): bring every part to uint8 (N, channels, size, size)
            (:func:`resampled`) once it is cut, for pools of different formats. None keeps the
            parts as they are, except that image sets given by name (28 x 28 grey) are brought
            to the ID pool's format. Must stay None for texts.
        synthetic: under ``"synthetic"``, the synthetic sets to make from the ID search part
            (:mod:`hydra_core.data.synthetic`); None for every one of its kind of item.
    """
    _check_size(n_search, "n_search")
    _check_size(n_report, "n_report")
    texts = isinstance(id_search_pool, TextSet)
    if texts and image_format is not None:
        raise InputError("image_format applies to images; leave it out for a text benchmark")
    load_named, default_search = (
        (load_text_ood_set, TEXT_SEARCH_OOD) if texts else (load_ood_set, SEARCH_OOD)
    )
    report_sets = _as_list(ood_sets)
    search_sets = None if search_ood is None else _as_list(search_ood)
    check_ood_choice(  # refused before anything is loaded
        [_name(s) for s in report_sets],
        None if search_sets is None else [_name(s) for s in search_sets],
        protocol=protocol,
        default_search=default_search,
    )
    if id_report_pool is None:
        id_search_pool, id_report_pool = split_in_two(id_search_pool)
    elif id_report_pool.fingerprint() == id_search_pool.fingerprint():
        raise ValueError(
            f"the ID search and report pools are the same {kind_of(id_search_pool)} "
            f"({id_search_pool.name!r}); pass disjoint pools (e.g. validation and test), or "
            "id_report_pool=None to split one in two"
        )
    id_format = None if texts else (id_search_pool.images.shape[1], id_search_pool.images.shape[-1])

    def resolve(sets: list[str | DataSet]) -> list[tuple[DataSet, tuple[int, int] | None]]:
        """Each set with the format its parts are brought to (None: kept as they are)."""
        resolved = [
            (load_named(s), image_format or id_format) if isinstance(s, str) else (s, image_format)
            for s in sets
        ]
        _check_same_kind(id_search_pool, [pool for pool, _ in resolved])
        return resolved

    def part(pool: DataSet, fmt: tuple[int, int] | None, n: int | None, purpose: str) -> DataSet:
        cut = take(pool, n, purpose=purpose)
        return cut if fmt is None else resampled(cut, fmt[1], fmt[0])

    reports = resolve(report_sets)
    id_search = part(id_search_pool, image_format, n_search, "search")
    id_report = part(id_report_pool, image_format, n_report, "report")
    if protocol == "halves":
        halves = [(split_in_two(pool), fmt) for pool, fmt in reports]
        ood_search = [part(search, fmt, n_search, "search") for (search, _), fmt in halves]
        ood_report = [part(report, fmt, n_report, "report") for (_, report), fmt in halves]
    elif protocol == "synthetic":
        from hydra_core.data.synthetic import synthetic_search

        ood_report = [part(pool, fmt, n_report, "report") for pool, fmt in reports]
        ood_search = synthetic_search(id_search, [id_report, *ood_report], synthetic)
    elif protocol in SEARCHED_GROUP:
        group = SEARCHED_GROUP[protocol]
        searched = resolve(default_search if search_sets is None else search_sets) + reports
        ood_search = [part(p, f, n_search, "search") for p, f in searched if p.group == group]
        ood_report = [part(p, f, n_report, "report") for p, f in reports if p.group != group]
        if not ood_search or not ood_report:
            raise InputError(
                f"protocol {protocol!r} needs a {group} set to search on and a report set of the "
                "other group: add one (--ood, --search-ood) or choose another protocol"
            )
    else:
        searched = default_search if search_sets is None else search_sets
        ood_search = [part(pool, fmt, n_search, "search") for pool, fmt in resolve(searched)]
        ood_report = [part(pool, fmt, n_report, "report") for pool, fmt in reports]
    return Benchmark(
        id_search=id_search,
        id_report=id_report,
        ood_search=tuple(ood_search),
        ood_report=tuple(ood_report),
        protocol=protocol,
    )


def default_benchmark(
    *,
    n_search: int | None = 512,
    n_report: int | None = None,
    ood: Sequence[str | ImageSet] | None = None,
    search_ood: Sequence[str | ImageSet] | None = None,
    protocol: str = "dedicated",
    synthetic: Sequence[str] | None = None,
) -> Benchmark:
    """The embedded default: Fashion-MNIST (validation to search, test to report) and OOD sets.

    Args:
        n_search: images per search part (ID and each search set); all when None.
        n_report: images per report part (ID and each report set); all when None.
        ood: the report-role OOD sets, by name (see :data:`hydra_core.data.ood.OOD_SETS`) or as
            ImageSets; the five default report sets (:data:`~hydra_core.data.ood.REPORT_OOD`)
            when None.
        search_ood: the search-role OOD sets, the same way; the default search sets
            (:data:`~hydra_core.data.ood.SEARCH_OOD`) when None. None under ``"halves"``.
        protocol: one of :data:`PROTOCOLS` (see the module docstring).
        synthetic: the synthetic sets under ``"synthetic"`` (None: every image one).
    """
    return build_benchmark(
        load_fashion_mnist("validation"),
        load_fashion_mnist("test"),
        REPORT_OOD if ood is None else ood,
        search_ood=search_ood,
        protocol=protocol,
        synthetic=synthetic,
        n_search=n_search,
        n_report=n_report,
    )


def default_text_benchmark(
    n_search: int | None = None,
    n_report: int | None = None,
    *,
    ood: Sequence[str | TextSet] | None = None,
    search_ood: Sequence[str | TextSet] | None = None,
    protocol: str = "dedicated",
    synthetic: Sequence[str] | None = None,
) -> Benchmark:
    """The embedded text default: Rotten Tomatoes sentences (validation to search, test to
    report) and the text OOD sets (:mod:`hydra_core.data.text`).

    Args:
        n_search: texts per search part (ID and each search set); all when None (1,000 ID
            sentences, 4,079 headlines).
        n_report: texts per report part (ID and each report set); all when None.
        ood: the report-role OOD sets, by name (see :data:`hydra_core.data.text.TEXT_OOD`) or as
            TextSets; the five default report sets (:data:`~hydra_core.data.text.TEXT_REPORT_OOD`)
            when None.
        search_ood: the search-role OOD sets, the same way; the default search set
            (:data:`~hydra_core.data.text.TEXT_SEARCH_OOD`, ``guardian``) when None. None under
            ``"halves"``.
        protocol: one of :data:`PROTOCOLS` (see the module docstring).
        synthetic: the synthetic sets under ``"synthetic"`` (None: every text one).
    """
    return build_benchmark(
        load_rotten_tomatoes("validation"),
        load_rotten_tomatoes("test"),
        TEXT_REPORT_OOD if ood is None else ood,
        search_ood=search_ood,
        protocol=protocol,
        synthetic=synthetic,
        n_search=n_search,
        n_report=n_report,
    )


def parse_ood_folder(entry: str) -> tuple[str, str, str]:
    """An OOD folder entry as (role, group, path): ``"far: /data/textures"`` -> ``("report",
    "far", "/data/textures")``, ``"search: x=/data/x"`` -> ``("search", "far", "/data/x")``; a
    bare path is a far report set. A search folder is never reported, so its group only labels
    it. The entry's ``NAME=`` (:mod:`hydra_core.data.sources`) is left out."""
    source = parse_source(entry, files=False)
    return source.role, source.group, source.path


def own_sources(
    id_source: str | None,
    ood_sources: Sequence[str],
    *,
    files: bool,
    default_id: str,
    ood: Sequence[str],
    search_ood: Sequence[str] | None,
    protocol: str,
    default_search: Sequence[str],
) -> tuple[Source | None, list[Source]]:
    """The ID and OOD data of your own as :class:`~hydra_core.data.sources.Source` objects,
    checked before anything is loaded: every path exists and is a folder (``files=False``) or a
    CSV/JSONL file (``files=True``), and no two sets share a name (the named sets ``ood`` and
    ``search_ood`` included; ``default_id`` is the default ID set's name). InputError otherwise."""
    check_ood_choice(ood, search_ood, ood_sources, protocol, default_search=default_search)
    own_id = None if id_source is None else parse_id_source(id_source, files=files)
    entries = [parse_source(entry, files=files) for entry in ood_sources]
    check_paths([s for s in (own_id, *entries) if s is not None])
    if search_ood is None and protocol in NAMED_SEARCH:
        search_ood = () if any(e.role == "search" for e in entries) else default_search
    named = [(n, "report") for n in ood] + [(n, "search") for n in search_ood or ()]
    check_names(default_id if own_id is None else own_id.name, own_id, named, entries)
    return own_id, entries


def _with_own_sets(
    ood: Sequence[str],
    search_ood: Sequence[str] | None,
    entries: Sequence[Source],
    protocol: str,
    default_search: Sequence[str],
    load: Callable[[Source], DataSet],
) -> tuple[list[str | DataSet], list[str | DataSet] | None]:
    """The report and the search sets of a benchmark with OOD data of your own: the named sets,
    then each entry (:func:`own_sources`) loaded by ``load(source)`` in its role. Under
    ``"dedicated"`` and without ``search_ood``, ``search:`` entries replace the default search
    sets."""
    if search_ood is None and protocol in NAMED_SEARCH:
        search_ood = [] if any(e.role == "search" for e in entries) else default_search
    search_sets: list[str | DataSet] | None = None if search_ood is None else list(search_ood)
    report_sets: list[str | DataSet] = list(ood)
    for entry in entries:
        (search_sets if entry.role == "search" else report_sets).append(load(entry))
    return report_sets, search_sets


def folder_benchmark(
    *,
    id_folder: str | None = None,
    ood: Sequence[str] = (),
    search_ood: Sequence[str] | None = None,
    ood_folders: Sequence[str] = (),
    protocol: str = "dedicated",
    size: int = 28,
    channels: int = 1,
    n_search: int | None = 512,
    n_report: int | None = None,
    classes: Sequence[str] | None = None,
    synthetic: Sequence[str] | None = None,
) -> Benchmark:
    """A benchmark mixing the embedded sets with image folders of your own.

    Args:
        id_folder: an ImageFolder layout (one sub-folder per class) for the in-distribution set,
            split once into disjoint search and report halves; None for Fashion-MNIST. Its classes
            are numbered in sorted order: they must be the model's output classes in that order.
        ood: default OOD sets to report on, by name (:data:`hydra_core.data.ood.OOD_SETS`).
        search_ood: default OOD sets to select heads on, by name; None for
            :data:`~hydra_core.data.ood.SEARCH_OOD` (with ``search:`` folders: the folders only).
            Must stay None under ``"halves"``.
        ood_folders: extra OOD folders: ``"near: path"`` or ``"far: path"`` (or a bare path, far)
            to report on, ``"search: path"`` to select heads on. Flat folders of images or class
            folders (labels are ignored).
        protocol: ``"dedicated"`` (the default) or ``"halves"`` (see the module docstring).
        size, channels: the image format every part is brought to when folders are involved
            (folder images are resized on their shorter side and centre-cropped, parts of the
            embedded sets resampled once cut); use the model's input size and channels, its
            preprocessing does the rest. Without folders the embedded sets stay as they are
            (28 x 28, one channel).
        classes: the model's classes in output order, to label the ID folder's class folders by
            name rather than by sorted position (see
            :func:`~hydra_core.data.generic.load_image_folder`).
    """
    from hydra_core.data.generic import load_image_folder

    own_id, entries = own_sources(
        id_folder,
        ood_folders,
        files=False,
        default_id=FASHION_MNIST,
        ood=ood,
        search_ood=search_ood,
        protocol=protocol,
        default_search=SEARCH_OOD,
    )
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 (grayscale) or 3 (RGB), got {channels}")
    if classes is not None and id_folder is None:
        raise InputError("a class order applies to an ID folder of your own, not to Fashion-MNIST")
    if id_folder is None and not ood_folders:
        return default_benchmark(
            n_search=n_search,
            n_report=n_report,
            ood=list(ood),
            search_ood=search_ood,
            protocol=protocol,
            synthetic=synthetic,
        )
    grayscale = channels == 1
    report_sets, search_sets = _with_own_sets(
        ood,
        search_ood,
        entries,
        protocol,
        SEARCH_OOD,
        lambda entry: load_image_folder(
            entry.path, size=size, name=entry.name, group=entry.group, grayscale=grayscale
        ),
    )
    options = {
        "search_ood": search_sets,
        "protocol": protocol,
        "n_search": n_search,
        "n_report": n_report,
        "image_format": (channels, size),
        "synthetic": synthetic,
    }
    if id_folder is None:
        return build_benchmark(
            load_fashion_mnist("validation"), load_fashion_mnist("test"), report_sets, **options
        )
    id_pool = load_image_folder(
        own_id.path,
        size=size,
        name=own_id.name,
        group="id",
        grayscale=grayscale,
        classes=classes,
    )
    if len(id_pool) < 4:
        raise InputError(
            f"the ID folder {own_id.path} holds {len(id_pool)} images; a search and a report half "
            "need at least 2 each"
        )
    return build_benchmark(id_pool, None, report_sets, **options)


def text_file_benchmark(
    *,
    id_file: str | None = None,
    ood: Sequence[str] = (),
    search_ood: Sequence[str] | None = None,
    ood_files: Sequence[str] = (),
    protocol: str = "dedicated",
    n_search: int | None = None,
    n_report: int | None = None,
    classes: Sequence[str] | None = None,
    model_classes: Sequence[str] | None = None,
    synthetic: Sequence[str] | None = None,
) -> Benchmark:
    """A text benchmark mixing the embedded text sets with CSV or JSONL files of your own (see
    :func:`~hydra_core.data.text_files.load_text_file`), as :func:`folder_benchmark` does for
    images.

    Args:
        id_file: texts with a ``label`` column for the in-distribution set, split once into
            disjoint search and report halves; None for Rotten Tomatoes (validation and test).
        ood: default text OOD sets to report on, by name (:data:`hydra_core.data.text.TEXT_OOD`).
        search_ood: default text OOD sets to select heads on, by name; None for
            :data:`~hydra_core.data.text.TEXT_SEARCH_OOD` (with ``search:`` files: the files
            only). Must stay None under ``"halves"``.
        ood_files: extra OOD files: ``"near: path"`` or ``"far: path"`` (or a bare path, far) to
            report on, ``"search: path"`` to select heads on; a ``text`` column (labels ignored).
        protocol: ``"dedicated"`` (the default) or ``"halves"`` (see the module docstring).
        n_search: texts per search part (ID and each search set); all when None.
        n_report: texts per report part (ID and each report set); all when None.
        classes: the model's classes in output order, to map the ID file's labels (names, or
            indices below their count) to the model's outputs.
        model_classes: the model's class names, which the ID file's label names are matched to
            (any case) when ``classes`` is not given.
    """
    own_id, entries = own_sources(
        id_file,
        ood_files,
        files=True,
        default_id=ROTTEN_TOMATOES,
        ood=ood,
        search_ood=search_ood,
        protocol=protocol,
        default_search=TEXT_SEARCH_OOD,
    )
    if classes is not None and id_file is None:
        raise InputError("a class order applies to an ID file of your own, not to Rotten Tomatoes")
    report_sets, search_sets = _with_own_sets(
        ood,
        search_ood,
        entries,
        protocol,
        TEXT_SEARCH_OOD,
        lambda entry: load_text_file(entry.path, name=entry.name, group=entry.group),
    )
    options = {
        "search_ood": search_sets,
        "protocol": protocol,
        "n_search": n_search,
        "n_report": n_report,
        "synthetic": synthetic,
    }
    if id_file is None:
        return build_benchmark(
            load_rotten_tomatoes("validation"), load_rotten_tomatoes("test"), report_sets, **options
        )
    id_pool = load_text_file(
        own_id.path, name=own_id.name, group="id", classes=classes, model_classes=model_classes
    )
    if len(id_pool) < 4:
        raise InputError(
            f"the ID file {own_id.path} holds {len(id_pool)} text{'s' * (len(id_pool) != 1)}; a "
            "search and a report half need at least 2 each: give at least 4"
        )
    return build_benchmark(id_pool, None, report_sets, **options)
