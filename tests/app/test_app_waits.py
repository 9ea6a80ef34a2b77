"""Waits the app shows (issue 39, item 2): the model card's progress bar on Setup, counted over
every report set, and the Hydra page's estimate before a run and one time left for the whole
run while it goes."""

from __future__ import annotations

import pytest
import torch
from streamlit.testing.v1 import AppTest

from hydra_ui import waits
from hydra_ui.context import CONFIG_KEY, SetupConfig
from hydra_ui.jobs import Job, format_seconds

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
    assert job.fraction() == pytest.approx((10 + 30 + 15) / 100)
    run.report("x", "a", 10, 10)  # never back
    assert job.fraction() == pytest.approx((10 + 30 + 15) / 100)
    run.report("x", "c", 4, 4)
    assert job.fraction() == 1


@pytest.fixture
def app(make_app) -> AppTest:
    return make_app(SMALL, timeout=300)


@pytest.mark.parametrize(
    "setup",
    [SMALL, SetupConfig(model="minilm-sentiment", n_search=64, n_report=100)],
    ids=["image-default", "text-default"],
)
def test_the_model_card_shows_a_bar_that_reaches_every_report_item(app, monkeypatch, setup):
    """The first page's model card, and the text default's after its Apply: a bar over every
    report item, gone once the card is there; none when the card is read from the cache."""
    app.session_state[CONFIG_KEY] = setup
    seen = []
    update = waits.ItemCount.update

    def recorded(self, name, done):
        update(self, name, done)
        seen.append((self.count, self.total))

    monkeypatch.setattr(waits.ItemCount, "update", recorded)
    app.run()
    assert not app.exception, app.exception
    sets = app.dataframe[0].value  # the model card's OOD table: one row per report OOD set
    total = setup.n_report * (1 + len(sets))  # the ID report set and each OOD set
    assert seen and seen[-1] == (total, total)
    assert [c for c, _ in seen] == sorted(c for c, _ in seen)
    assert not app.get("progress")  # the bar is gone once the card is there
    seen.clear()
    app.run()  # read from the cache: no bar
    assert not seen and not app.exception


# --- the Hydra page ------------------------------------------------------------------------------

HYDRA_OOD = ("mnist", "noise")
N_SEARCH, N_REPORT = 40, 60


@pytest.fixture
def hydra_app(checkpoint, make_app) -> AppTest:
    from hydra_core.masks import MemberMask

    setup = SetupConfig(
        model=checkpoint, ood=HYDRA_OOD, n_search=N_SEARCH, n_report=N_REPORT, device="cpu"
    )
    at = make_app(setup)
    keep = torch.ones(2, 4, dtype=torch.bool)
    first, second = keep.clone(), keep.clone()
    first[0, 0], second[1, 2] = False, False
    members = [MemberMask("a", "test", first), MemberMask("b", "test", second)]
    at.session_state["results"] = {"_setup": setup.key, "jobs": {}, "members": members}
    at.run()  # Setup: its model card predicts the single model on the report split (cached)
    at.switch_page("pages/6_hydra.py")
    return at


def estimate_caption(at: AppTest) -> str:
    found = [c.value for c in at.caption if c.value.startswith("At these sizes: about **")]
    assert len(found) == 1, ([e.value for e in at.error], [c.value[:60] for c in at.caption])
    return found[0]


def test_the_hydra_estimate_is_the_counts_times_the_measured_unit(hydra_app, monkeypatch):
    """With the timed units stubbed, the time said before the run is the plain sum: each
    system's report items times its seconds per item (the single model's predictions are
    cached by the model card: nothing), the temperature fit's ID search items, one batch per
    model for the multiply-adds, every system once per latency round, each system's
    intervals."""
    from hydra_core.data.benchmark import default_benchmark
    from hydra_ui import hydra_wait
    from hydra_ui.estimates import HydraUnits

    t, tf, boot = 0.01, 0.025, 0.5
    monkeypatch.setattr(
        hydra_wait, "measure_units", lambda *_: (HydraUnits(t, tf, None, boot), "not-cached")
    )
    hydra_app.run()
    assert not hydra_app.exception, hydra_app.exception
    hydra_app.number_input[0].set_value(3)  # timed calls per system: 1 + 3 latency rounds
    hydra_app.run()
    note = estimate_caption(hydra_app)
    benchmark = default_benchmark(n_search=N_SEARCH, n_report=N_REPORT, ood=list(HYDRA_OOD))
    items = len(benchmark.id_report) + sum(len(s) for s in benchmark.ood_report)
    predictions = items * (2 * t + tf)  # members a and b, the fused model; single: cached
    fit = t * len(benchmark.id_search)  # temperature scaling, ticked by default
    macs = t * 32 * 5  # single, a, b, fused, temperature
    latency = (1 + 3) * 32 * (t + 2 * t + 2 * t + tf + t)  # single, a, b, unfused, fused, T
    intervals = boot * 6  # single, a, b, unfused, fused, temperature
    total = predictions + fit + macs + latency + intervals
    assert f"about **{format_seconds(total)}** on this machine" in note
    assert "1 of the systems' predictions read from the cache" in note
    assert f"{items:,} report images in all" in note
    assert "Within" not in note  # well under 10 minutes


def test_the_hydra_run_counts_to_its_end_over_every_stage(hydra_app, monkeypatch):
    """Measured for real: a number before the start, and the job's share of the whole run
    goes up to 1 over its stages."""
    from hydra_ui import waits

    hydra_app.run()
    assert "ms per report item for the model" in estimate_caption(hydra_app)
    shares, seen, planned = [], [], []
    report = waits.WholeRun.report

    def recorded(self, payload, stage, done, total):
        report(self, payload, stage, done, total)
        shares.append(self.job.fraction())
        seen.append(stage)
        planned[:] = [n for n, s in zip(self.names, self.seconds, strict=True) if s > 0]

    monkeypatch.setattr(waits.WholeRun, "report", recorded)
    next(b for b in hydra_app.button if b.label == "Assemble and evaluate").click()
    hydra_app.run()
    job = hydra_app.session_state["results"]["jobs"]["hydra"]
    assert job.wait(180)
    hydra_app.run()
    assert not hydra_app.exception and not hydra_app.error
    assert shares == sorted(shares) and shares[-1] == 1 and job.fraction() == 1
    # every stage of the estimate is one the run names, in the order it runs them (the single
    # model's predictions, cached by the model card, report nothing)
    assert planned and [n for n in dict.fromkeys(seen) if n in planned] == planned, seen


def test_a_models_seconds_per_item_at_the_runs_batch_size(monkeypatch):
    """Timed on 8 and 32 items (a fake clock: 0.5 s a call plus 0.01 s an item), the seconds per
    item in batches of 256 are the cost per item plus the call's fixed part spread over 256; in
    the latency's batches of 32, over 32."""
    from hydra_ui import hydra_wait

    clock = Clock()

    def predict(module, items, preprocess, **options):
        clock.now += 0.5 + 0.01 * len(items)

    monkeypatch.setattr(hydra_wait, "predict", predict)
    monkeypatch.setattr(hydra_wait.time, "perf_counter", clock)
    seconds = hydra_wait.seconds_per_item(None, list(range(32)), None, "cpu", batch_size=256)
    assert seconds == pytest.approx((0.01 + 0.5 / 256, 0.01 + 0.5 / 32))
