"""The reports' leave-one-set-out choice: the preferred set when reported, else a near one, and
none where no other set is left to search on (a report on sets of the user's choosing never
fails at its last stage for want of the default's set)."""

from __future__ import annotations

import pandas as pd

from hydra_core.data.text import TextSet
from hydra_core.report.transfer import left_out_set, transfer_section


def _set(name: str, group: str) -> TextSet:
    return TextSet(name, ("a", "b"), group=group)


def test_the_preferred_set_when_reported_else_the_first_near_one():
    sets = [_set("abc_news", "far"), _set("imdb", "near"), _set("tweets", "near")]
    assert left_out_set(sets, "tweets").name == "tweets"
    assert left_out_set(sets, "mnist").name == "imdb"  # not reported: the first near set
    far = [_set("textures", "far"), _set("noise", "far")]
    assert left_out_set(far, "mnist").name == "textures"  # no near set: the first one


def test_none_when_skipped_or_nothing_else_to_search_on():
    sets = [_set("imdb", "near"), _set("abc_news", "far")]
    assert left_out_set(sets, None) is None
    assert left_out_set(sets[:1], "imdb") is None


def test_the_section_states_near_and_far_means_and_counts():
    rows = [
        ("CircOOD", "guardian", "imdb", "near", 0.02, 0.01, 0.03),
        ("CircOOD", "guardian", "tweets", "near", -0.04, -0.06, -0.02),
        ("CircOOD", "guardian", "abc_news", "far", 0.10, 0.08, 0.12),
    ]
    columns = ["circuit", "searched_on", "ood_set", "group", "delta_auroc"]
    frame = pd.DataFrame(rows, columns=[*columns, "delta_auroc_lo", "delta_auroc_hi"])
    text = "\n".join(transfer_section(frame))
    assert (
        "**CircOOD** (searched on guardian): near -1.00 (2 sets: 1 up, 1 down); "
        "far +10.00 (1 set: 1 up, 0 down)"
    ) in text
