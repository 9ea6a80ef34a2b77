"""Waits the app shows (issue 39, item 2): the model card's progress bar on Setup, counted over
every report set, and the Hydra page's estimate before a run and one time left for the whole
run while it goes."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from hydra_ui import waits
from hydra_ui.context import CONFIG_KEY, SetupConfig
from hydra_ui.jobs import Job

SMALL = SetupConfig(n_search=64, n_report=300)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_items_counted_over_every_set_with_the_time_left_at_the_rate_so_far():
    clock = Clock()
    count = waits.ItemCount({"id": 300, "faces": 200}, clock=clock)
    assert count.seconds_left() is None and count.fraction() == 0
    clock.now += 10
    count.update("id", 100)
    assert count.fraction() == pytest.approx(100 / 500)
    assert count.seconds_left() == pytest.approx(400 * 10 / 100)
    count.update("id", 300)
    count.update("faces", 200)
    count.update("elsewhere", 50)  # a set read from the cache is not counted
    assert count.fraction() == 1 and count.seconds_left() == 0
    assert "500 of 500 images · 0 s left · 10 s so far" in count.describe("Card", "images")


def test_a_whole_run_weighs_each_stage_by_its_estimate():
    job = Job("t", lambda job: None)
    run = waits.WholeRun(job, [("a", 10.0), ("b", 30.0), ("c", 60.0)])
    run.report("x", "a", 5, 10)
    assert job.fraction() == pytest.approx(5 / 100)
    run.report("x", "c", 1, 4)  # b read from the cache: done when a later stage reports
    assert job.fraction() == pytest.approx((10 + 30 + 15) / 100)
    run.report("x", "other", 1, 1)  # not in the plan: weighs nothing
    assert job.fraction() == pytest.approx(40 / 100)
    run.report("x", "c", 4, 4)
    assert job.fraction() == 1


@pytest.fixture
def app(tmp_path, monkeypatch) -> AppTest:
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path))
    at = AppTest.from_file("../app.py", default_timeout=300)
    at.session_state[CONFIG_KEY] = SMALL
    return at


def test_the_model_card_shows_a_bar_that_reaches_every_report_item(app, monkeypatch):
    seen = []
    update = waits.ItemCount.update

    def recorded(self, name, done):
        update(self, name, done)
        seen.append((self.count, self.total))

    monkeypatch.setattr(waits.ItemCount, "update", recorded)
    app.run()
    assert not app.exception, app.exception
    sets = app.dataframe[0].value  # the model card's OOD table: one row per report OOD set
    assert seen and seen[-1] == (300 * (1 + len(sets)), 300 * (1 + len(sets)))
    assert [c for c, _ in seen] == sorted(c for c, _ in seen)
    assert not app.get("progress")  # the bar is gone once the card is there
    seen.clear()
    app.run()  # read from the cache: no bar
    assert not seen and not app.exception
