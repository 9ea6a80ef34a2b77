"""Times said before a long run (hydra_ui.estimates), against plain arithmetic."""

from __future__ import annotations

import dataclasses
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


def test_hydra_stages_are_counts_times_units():
    """Each stage of a Hydra evaluation: its items times the seconds per item of what predicts
    them; cached predictions count nothing; fine-tuning is three forwards per training item."""
    run = estimates.HydraRun(
        items=1000,
        search_items=200,
        members=(("H: a", True), ("H: b", False)),
        fused=("H (fused)", False),
        single_cached=False,
        finetune=0,
        temperature=True,
        mc=("MC Dropout", 5, False),
        copies=0,
        latency_rounds=4,
    )
    units = estimates.HydraUnits(model=0.01, fused=0.02, mc_pass=0.015, intervals=2.0)
    stages = {s.name: s.seconds for s in estimates.hydra_stages(run, units)}
    assert list(stages) == [
        "evaluation: single",
        "evaluation: H: a",
        "evaluation: H: b",
        "evaluation: H (fused)",
        "temperature fit",
        "evaluation: MC Dropout",
        "multiply-adds",
        "latency",
        "intervals",
    ]
    assert stages["evaluation: single"] == pytest.approx(1000 * 0.01)
    assert stages["evaluation: H: a"] == 0  # read from the cache
    assert stages["evaluation: H (fused)"] == pytest.approx(1000 * 0.02)
    assert stages["temperature fit"] == pytest.approx(200 * 0.01)
    assert stages["evaluation: MC Dropout"] == pytest.approx(1000 * 5 * 0.015)
    assert stages["multiply-adds"] == pytest.approx(0.01 * 32 * 6)  # single, a, b, fused, T, MC
    # every system once per round: single, a, b, unfused (a + b), fused, T, MC (5 passes)
    per_round = 0.01 * 6 + 0.02 + 0.015 * 5
    assert stages["latency"] == pytest.approx(4 * 32 * per_round)
    assert stages["intervals"] == pytest.approx(2.0 * 7)
    # timed in the latency's batches of 32 too: the rounds use those, the predictions do not
    small = dataclasses.replace(units, small=(0.03, 0.05, 0.04))
    again = {s.name: s.seconds for s in estimates.hydra_stages(run, small)}
    assert again["latency"] == pytest.approx(4 * 32 * (0.03 * 6 + 0.05 + 0.04 * 5))
    assert again["evaluation: single"] == stages["evaluation: single"]
    tuned = estimates.hydra_stages(dataclasses.replace(run, finetune=640), units)
    names = [s.name for s in tuned]
    assert names[1:3] == ["fine-tuning: H: a", "fine-tuning: H: b"]  # after the single model
    assert tuned[1].seconds == pytest.approx(3 * 0.01 * 640)
    assert tuned[3].seconds == pytest.approx(1000 * 0.01)  # a fine-tuned member is predicted


def test_the_hydra_note_offers_what_finishes_in_minutes():
    from hydra_ui.hydra_wait import hydra_note, scaled_seconds

    run = estimates.HydraRun(
        items=12000,
        search_items=512,
        members=(("H: a", False),),
        fused=("H (fused)", False),
        mc=("MC Dropout", 5, False),
        latency_rounds=6,
    )
    units = estimates.HydraUnits(model=0.01, fused=0.02, mc_pass=0.01, intervals=5.0)
    stages = estimates.hydra_stages(run, units)
    total = estimates.total_seconds(stages)
    mc = next(s.seconds for s in stages if s.label == "MC Dropout")
    assert total > 600 >= total - mc
    note = hydra_note(stages, units, run, "images", per_set=2000)
    assert f"about **{estimates.format_seconds(total)}**" in note
    assert f"without MC Dropout: {estimates.format_seconds(total - mc)}" in note
    fits = max(n for n in (250, 500, 1000) if scaled_seconds(stages, n / 2000) <= 600)
    assert f"{fits:,} report images per set (Setup)" in note
