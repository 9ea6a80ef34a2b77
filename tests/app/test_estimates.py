"""Times said before a long run (hydra_ui.estimates), against plain arithmetic."""

from __future__ import annotations

import math

import pytest

from hydra_ui import estimates


def test_cost_of_one_candidate_from_a_search_steps():
    # step t of a 10-head model scores 10 - t candidates; a NaN step was not timed
    assert estimates.seconds_per_candidate([2.0, 1.8, math.nan], 10) == pytest.approx(3.8 / 19)
    assert estimates.seconds_per_candidate([], 10) is None
    assert estimates.seconds_per_candidate([math.nan], 10) is None


def test_search_and_stability_seconds():
    assert estimates.search_seconds(0.1, 10, 3) == pytest.approx(0.1 * (10 + 9 + 8))
    assert estimates.search_seconds(0.1, 10, 3, done=1) == pytest.approx(0.1 * (9 + 8))
    # the search part is 75% of the samples: 1 + 3 searches on it, 3 held-out evaluations
    expected = 0.1 * 0.75 * (10 + 9) * 4 + 0.1 * 0.25 * 3
    assert estimates.stability_seconds(0.1, 10, 2, 3, 0.25) == pytest.approx(expected)
    assert estimates.largest_within(lambda v: 100.0 * v, [1, 2, 3, 4], limit=250) == 2
    assert estimates.largest_within(lambda v: 100.0 * v, [5, 6], limit=250) is None


def test_notes_offer_sizes_that_finish_in_minutes():
    assert estimates.search_note(None, 72, 24, 0, "x") is None  # nothing measured yet
    assert estimates.search_note(1.0, 72, 24, 24, "x") is None  # saved already: instant
    # 1 s per candidate: budget 24 of 72 heads is 1,452 s; budget 8 (548 s) fits in 10 min
    note = estimates.search_note(1.0, 72, 24, 0, "the saved avg search")
    assert "about **24 min 12 s**" in note and "Budget 8 finishes within 10 min 00 s" in note
    assert estimates.search_seconds(1.0, 72, 8) <= 600 < estimates.search_seconds(1.0, 72, 9)
    assert "run the search above first" in estimates.stability_note(None, 72, 24, 5, 0.25, "")
    note = estimates.stability_note(0.5, 72, 24, 5, 0.25, "the saved avg search")
    seconds = estimates.stability_seconds(0.5, 72, 24, 5, 0.25)
    assert f"up to about **{estimates.format_seconds(seconds)}**" in note
    fits = max(k for k in range(1, 25) if estimates.stability_seconds(0.5, 72, k, 5, 0.25) <= 600)
    assert f"budget {fits} at B = 5" in note
    short = estimates.stability_note(0.001, 72, 24, 5, 0.25, "x")
    assert "Within" not in short  # it finishes in minutes already
