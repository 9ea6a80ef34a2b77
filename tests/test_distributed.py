"""Jobs split over processes (hydra_core.distributed): two gloo processes started with
torch.multiprocessing give exactly what one process gives.

One spawn (the module fixture ``job``) runs every distributed job; its two processes each save
what they ended with, and the tests compare both with the same jobs run here in one process.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import time
from functools import partial
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.distributed as dist

from hydra_core import distributed
from hydra_core.analysis import _suffix, greedy_circuit, load_greedy, saved_searches
from hydra_core.analysis.greedy import single_head_importance
from hydra_core.baselines.deep_ensembles import copy_path, train_deep_ensemble
from hydra_core.cache import DiskCache
from hydra_core.cli import main
from hydra_core.data.benchmark import build_benchmark
from hydra_core.experiment.evaluate import evaluate_systems
from hydra_core.experiment.pipeline import Pipeline
from hydra_core.masks import MemberMask
from hydra_core.zoo.default import TrainConfig
from hydra_core.zoo.registry import LoadedModel
from tests.analysis.test_greedy import assert_identical, make_data
from tests.cli.test_cli_hydra import _tiny_fashion_mnist
from tests.conftest import TINY, TINY_CONFIGS, make_tiny_vit
from tests.experiment.test_systems import image_set, preprocess
from tests.report.test_report_text import tiny_sentiment_bert
from tests.report.test_report_text import tokenizer as text_tokenizer

WORLD = 2
BUDGET = 7  # of the tiny models' 12 heads
#: (model configuration, objective, method, fast-path token rows per pass or None for the default)
SEARCHES = [
    ("token-bias", "avg", "fast", None),
    ("avgpool", "ood", "fast", 17 * 100),  # 2 heads per pass; every block on all tokens
    ("layerscale", "acc", "fast", 7 * 17),  # chunks of 7 samples: many passes per unit
    ("token-nobias", "avg", "plain", None),
]
RESUMED = ("token-bias", "avg")  # the search stopped and resumed with 1, 2, then 1 process
CLI_DATA = ["--n-search", "40", "--n-report", "60", "--ood", "mnist", "noise", "--device", "cpu"]
ENSEMBLE = dict(train_config=TrainConfig(epochs=1, batch_size=32), arch=TINY, reference="none")


@contextlib.contextmanager
def rows_per_pass(rows: int | None):
    saved = _suffix.CPU_ROWS_PER_PASS
    _suffix.CPU_ROWS_PER_PASS = rows or saved
    try:
        yield
    finally:
        _suffix.CPU_ROWS_PER_PASS = saved


def searches() -> dict[tuple, object]:
    found = {}
    for config, objective, method, rows in SEARCHES:
        with rows_per_pass(rows):
            found[config, objective, method] = greedy_circuit(
                make_tiny_vit(**TINY_CONFIGS[config]),
                *make_data(),
                objective=objective,
                budget=BUDGET,
                method=method,
            )
    # the guided search (K = 3 of 12): rank 0's candidates, each scored in a pass of its own
    found["token-bias", "avg", "guided-3"] = greedy_circuit(
        make_tiny_vit(**TINY_CONFIGS["token-bias"]), *make_data(), budget=BUDGET, candidates=3
    )
    return found


def systems_table(cache: DiskCache | None):
    """evaluate_systems on a tiny report of 60 ID and 2 x 30 OOD images, in batches of 16 (several
    per set, so that each process predicts some): the metrics table and the cost."""
    ood = [image_set("near_set", 30, "near", 2), image_set("far_set", 30, "far", 3)]
    benchmark = build_benchmark(image_set("id_set", 60, "id", 1, labelled=True), None, ood)
    loaded = LoadedModel("tiny", make_tiny_vit(depth=3, num_heads=4), preprocess)
    masks = torch.ones(2, 3, 4, dtype=torch.bool)
    masks[0, 0, :2] = False
    masks[1, 2, 1:] = False
    members = [MemberMask(f"m{i}", "test", masks[i]) for i in range(2)]
    deep = [loaded.model, make_tiny_vit(seed=7, depth=3, num_heads=4)]
    report = evaluate_systems(
        loaded,
        benchmark,
        members,
        deep_ensemble=deep,
        device="cpu",
        cache=cache,
        latency_batch=4,
        latency_repeats=2,
        batch_size=16,
    )
    return report.table(), report.cost


def deep_ensemble(root: Path) -> list[dict]:
    from hydra_core.data import fashion_mnist

    # train_vit reads Fashion-MNIST itself; a tiny stand-in keeps this to a few optimiser steps
    original = fashion_mnist.load_fashion_mnist
    fashion_mnist.load_fashion_mnist = _tiny_fashion_mnist
    try:
        models = train_deep_ensemble([1, 2, 3], root=root, log=lambda line: None, **ENSEMBLE)
    finally:
        fashion_mnist.load_fashion_mnist = original
    return [m.state_dict() for m in models]


def stop_after(steps: int, *, mid_step: bool = False):
    """A (progress, should_stop) pair that asks to stop once ``steps`` steps were reported: at the
    next poll, or (``mid_step``) at the second poll after it, inside the next step."""
    seen, polls = [], []

    def should_stop() -> bool:
        if len(seen) >= steps:
            polls.append(1)
        return len(polls) >= (2 if mid_step else 1)

    return (lambda step: seen.append(step.step)), should_stop


def stability():
    """Four resamples of a budget-5 search: each group's step shared between the processes."""
    from hydra_core.analysis.stability import greedy_stability

    return greedy_stability(
        make_tiny_vit(**TINY_CONFIGS["token-bias"]), *make_data(), budget=5, resamples=4, seed=1
    )


def resumed_search(cache: DiskCache, steps: int, *, mid_step: bool = False, stops: bool = True):
    config, objective = RESUMED
    progress, should_stop = stop_after(steps, mid_step=mid_step)
    return greedy_circuit(
        make_tiny_vit(**TINY_CONFIGS[config]),
        *make_data(),
        objective=objective,
        budget=BUDGET,
        cache=cache,
        progress=progress,
        should_stop=should_stop if stops else None,
    )


SHARED = ("seed 0", "seed 1", "seed 2")


def shared_first(folder: Path, rank: int) -> tuple[list[str], list[str]]:
    """Pipeline.share_first in this process: (the pieces it ran, the pieces' files it finds
    once it returns). The processes start together and each piece takes a second, so without
    its wait a process would return while the other's piece is unwritten."""
    folder.mkdir(exist_ok=True)
    ran = []

    def piece(name: str) -> None:
        time.sleep(1)
        (folder / name).write_text(str(rank))
        ran.append(name)

    run = Pipeline(folder / "out", DiskCache(folder / "cache"), "cpu", None, lambda _: None)
    distributed.barrier()
    run.share_first({name: partial(piece, name) for name in SHARED})
    return ran, sorted(p.name for p in folder.iterdir() if p.name in SHARED)


def _worker(rank: int, port: int, folder: str, checkpoint: str) -> None:
    """One process of the job: every distributed job, its results saved as rank<r>.pt."""
    folder = Path(folder)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        HYDRA_LAB_CACHE=str(folder / "cli-cache"),
    )
    torch.set_num_threads(1)
    assert distributed.init_from_env()
    try:
        results = {"rank": distributed.rank(), "searches": searches()}
        with distributed.alone():  # as the reports ask: inside alone, for pieces taken whole
            results["claims"] = [distributed.claim(name) for name in ("a", "b", "a", "c")]
            results["shared"] = shared_first(folder / "shared", rank)
        cache = DiskCache(folder / "resume")
        # rank 1 alone asks to stop: after one more step, then in the middle of the second
        results["stopped"] = [
            resumed_search(cache, 1, stops=rank == 1).steps,
            resumed_search(cache, 1, mid_step=True, stops=rank == 1).steps,
        ]
        results["stability"] = stability()
        results["importance"] = single_head_importance(
            make_tiny_vit(**TINY_CONFIGS["token-bias"]), *make_data(), cache=DiskCache(folder)
        )
        results["systems"] = systems_table(DiskCache(folder / "predictions"))
        results["deep_ensemble"] = deep_ensemble(folder / "deep_ensembles")
        out = folder / f"cli-rank{rank}"
        with contextlib.redirect_stdout(io.StringIO()) as stdout:
            code = main(
                ["search", "--model", checkpoint, *CLI_DATA, "--budget", "3", "--json"]
                + ["--out", str(out)]
            )
        results["cli"] = (code, stdout.getvalue(), sorted(p.name for p in out.glob("*")))
        out = folder / f"transfer-rank{rank}"
        with contextlib.redirect_stdout(io.StringIO()) as stdout:
            code = main([*transfer_command(checkpoint), "--out", str(out)])
        results["transfer"] = (code, stdout.getvalue(), sorted(p.name for p in out.glob("*")))
        with contextlib.redirect_stdout(io.StringIO()) as log:
            report = main([*report_command(checkpoint), "--out", str(folder / "report")])
        results["report"] = (report, log.getvalue())
        with contextlib.redirect_stdout(io.StringIO()) as log:
            text = main([*text_report_command(folder), "--out", str(folder / "text-report")])
        results["text_report"] = (text, log.getvalue())
    finally:
        distributed.shutdown()
    torch.save(results, folder / f"rank{rank}.pt")


def transfer_command(checkpoint: str) -> list[str]:
    """The transfer matrix on the tiny checkpoint: 3 sets, a budget-2 search on each."""
    data = [*CLI_DATA, "--search-ood", "faces", "--budget", "2", "--json"]
    return ["transfer", "--model", checkpoint, *data]


def report_command(checkpoint: str) -> list[str]:
    """The quick report on the tiny checkpoint: repeat 0 and repeat 1 (two processes: one each)."""
    data = ["--ood", "mnist", "noise", "--device", "cpu", "--seeds", "0", "2", "3"]
    return ["report", "--quick", "--model", checkpoint, *data]


def text_report_command(folder: Path) -> list[str]:
    """The quick text report on a tiny BERT (saved in ``folder`` by the ``job`` fixture)."""
    data = ["--ood", "imdb", "abc_news", "--device", "cpu"]
    return ["report", "--task", "text", "--quick", "--model", str(folder / "tiny-bert"), *data]


def report_tables(folder: Path) -> dict[str, pd.DataFrame]:
    """Every CSV of a report, without the columns that are times (latency, seconds) or say
    whether a training run was found in the cache (another process may have run it first)."""
    tables = {}
    for path in sorted(folder.glob("*.csv")):
        table = pd.read_csv(path)
        timed = [c for c in table.columns if "latency" in c or "seconds" in c or c == "cached"]
        tables[path.name] = table.drop(columns=timed)
    return tables


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def job(tmp_path_factory, checkpoint):
    """What each of the two processes ended with, and the folder they worked in."""
    folder = tmp_path_factory.mktemp("distributed")
    tiny_sentiment_bert().save_pretrained(folder / "tiny-bert")
    text_tokenizer().save_pretrained(folder / "tiny-bert")
    # one process searches first and stops after 2 steps; the two processes resume from there
    assert resumed_search(DiskCache(folder / "resume"), 2).steps == 2
    torch.multiprocessing.spawn(
        _worker, args=(free_port(), str(folder), checkpoint), nprocs=WORLD, join=True
    )
    ranks = [torch.load(folder / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    assert [r["rank"] for r in ranks] == list(range(WORLD))
    return ranks, folder


# --- the greedy search --------------------------------------------------------------------------


def test_distributed_search_is_the_single_process_search(job):
    ranks, _ = job
    alone = searches()
    for key, expected in alone.items():
        for found in ranks:
            assert_identical(found["searches"][key], expected)  # bit for bit, on every process
        assert expected.steps == BUDGET


def test_a_stop_on_one_process_stops_all_and_resumes_with_any_number(job):
    ranks, folder = job
    # resumed at 2 (saved by one process): rank 1 stopped it after step 3, then during step 5
    assert all(r["stopped"] == [3, 4] for r in ranks)
    cache = DiskCache(folder / "resume")
    config, objective = RESUMED
    model, data = make_tiny_vit(**TINY_CONFIGS[config]), make_data()
    partial = load_greedy(model, *data, objective, cache)  # what the two processes saved
    assert (partial.steps, partial.complete) == (4, False)
    assert list(saved_searches(model, *data, cache)) == [objective]
    finished = greedy_circuit(model, *data, objective=objective, budget=BUDGET, cache=cache)
    uninterrupted = greedy_circuit(model, *data, objective=objective, budget=BUDGET)
    assert_identical(finished, uninterrupted)
    assert_identical(load_greedy(model, *data, objective, cache), uninterrupted)


def test_distributed_stability_is_the_single_process_one(job):
    ranks, _ = job
    alone = stability()
    for found in ranks:
        assert found["stability"].orders == alone.orders
        assert found["stability"].scores == alone.scores  # bit for bit
        assert found["stability"].group_steps == alone.group_steps


# --- importance, evaluation, Deep Ensembles -----------------------------------------------------


def test_distributed_importance_is_the_single_process_one(job):
    ranks, _ = job
    alone = single_head_importance(make_tiny_vit(**TINY_CONFIGS["token-bias"]), *make_data())
    for found in ranks:
        assert found["importance"].keys() == alone.keys()
        for name, value in alone.items():
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(found["importance"][name], value, rtol=0, atol=0)
            else:
                assert found["importance"][name] == value


def test_distributed_evaluation_is_the_single_process_one(job):
    ranks, folder = job
    table, cost = systems_table(None)
    assert len(list((folder / "predictions").rglob("*.pt"))) > 0  # rank 0 stored them
    for found in ranks:
        found_table, found_cost = found["systems"]
        # metrics, intervals and AUROCs from the predictions of all images: the same numbers
        pd.testing.assert_frame_equal(found_table, table, check_exact=True)
        assert list(found_cost.index) == list(cost.index)
        assert found_cost["params"].tolist() == cost["params"].tolist()
    # the cost (latency included) is rank 0's measurement, given to every process
    pd.testing.assert_frame_equal(ranks[0]["systems"][1], ranks[1]["systems"][1], check_exact=True)


def test_deep_ensemble_copies_are_trained_one_share_per_process(job, tmp_path):
    ranks, folder = job
    alone = deep_ensemble(tmp_path)
    for found in ranks:
        assert len(found["deep_ensemble"]) == 3
        for state, expected in zip(found["deep_ensemble"], alone, strict=True):
            assert state.keys() == expected.keys()
            assert all(torch.equal(state[k], expected[k]) for k in expected)
    for seed in (1, 2, 3):  # each stored by the process that trained it
        settings = {k: ENSEMBLE[k] for k in ("train_config", "arch")}
        assert copy_path(seed, root=folder / "deep_ensembles", **settings).is_file()


# --- the command line ---------------------------------------------------------------------------


def test_search_json_comes_from_rank_0_alone(job, checkpoint, tmp_path, monkeypatch, capsys):
    ranks, _ = job
    (code, stdout, files), (code1, stdout1, files1) = (r["cli"] for r in ranks)
    assert (code, code1) == (0, 0)
    assert stdout1 == "" and files1 == []  # rank 1 prints and writes nothing
    found = json.loads(stdout)  # one JSON object, nothing else on stdout
    assert "greedy_avg.json" in files and found["budget"] == 3 and found["seconds"] > 0
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))
    args = ["search", "--model", checkpoint, *CLI_DATA, "--budget", "3", "--json"]
    assert main([*args, "--out", str(tmp_path / "out")]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert found["order"] == alone["order"]
    assert found["scores"] == pytest.approx(alone["scores"], abs=1e-6)
    assert {k: found[k] for k in ("search_ood", "n_id", "n_ood", "objective")} == {
        k: alone[k] for k in ("search_ood", "n_id", "n_ood", "objective")
    }


def test_the_transfer_matrix_comes_from_rank_0_alone_and_is_the_single_process_one(
    job, checkpoint, tmp_path, monkeypatch, capsys
):
    ranks, _ = job
    (code, stdout, files), (code1, stdout1, files1) = (r["transfer"] for r in ranks)
    assert (code, code1) == (0, 0)
    assert stdout1 == "" and files1 == []  # rank 1 prints and writes nothing
    assert "transfer_ood.csv" in files and "transfer_ood.png" in files
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))
    assert main([*transfer_command(checkpoint), "--out", str(tmp_path / "out")]) == 0
    found = json.loads(stdout)  # one JSON object, nothing else on stdout
    assert len(found["cells"]) == 9
    assert found == json.loads(capsys.readouterr().out)  # the same matrix, every digit


def test_each_name_is_claimed_by_exactly_one_process(job):
    ranks, _ = job
    claims = [r["claims"] for r in ranks]
    assert [sum(c[i] for c in claims) for i in (0, 1, 3)] == [1, 1, 1]
    assert not any(c[2] for c in claims)  # "a" again: taken already, by this process or another


def test_work_shared_first_is_done_once_and_seen_by_every_process(job):
    ranks, _ = job
    ran = [r["shared"][0] for r in ranks]
    assert sorted(ran[0] + ran[1]) == list(SHARED)  # each piece once, by one process or the other
    for r in ranks:  # once share_first returns, every piece is there for every process
        assert r["shared"][1] == list(SHARED)


def assert_stability_shared(*logs: str) -> None:
    """Each circuit's stability run, and the transfer table's leave-one-set-out search, was made
    by exactly one process before the wait (rank 0 read them all from the cache)."""
    for name in ("CircAvg", "CircAcc", "CircOOD"):
        made = [log.count(f"stability of {name} (2 resamples) ...") for log in logs]
        assert sorted(made) == [0, 1], (name, made)
    made = [log.count(" left out, shared by the processes ...") for log in logs]
    assert sorted(made) == [0, 1], made


def test_a_report_shares_its_repeats_and_writes_what_one_process_writes(
    job, checkpoint, tmp_path, monkeypatch
):
    ranks, folder = job
    (code0, log0), (code1, log1) = (r["report"] for r in ranks)
    assert (code0, code1) == (0, 0)
    assert "[report, process 1] repeats 1\n" in log1 and "greedy search" in log1
    assert "repeats 1" not in log0 and "wrote" in log0 and "wrote" not in log1
    assert_stability_shared(log0, log1)
    assert not list(folder.glob(".report.partial-*"))  # rank 0 staged and wrote, alone
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([*report_command(checkpoint), "--out", str(tmp_path / "report")]) == 0
    shared, alone = report_tables(folder / "report"), report_tables(tmp_path / "report")
    assert shared.keys() == alone.keys() and "table12_seeds.csv" in shared
    assert set(shared["table12_seeds.csv"]["repeat"]) == {0, 1}  # repeat 1 came from process 1
    for name, table in alone.items():
        pd.testing.assert_frame_equal(shared[name], table, check_exact=True, obj=name)
    summary = json.loads((folder / "report" / "report.json").read_text())["setup"]
    assert summary["seconds"]  # the stage times are rank 0's


def test_a_text_report_shares_its_repeats_and_writes_what_one_process_writes(
    job, tmp_path, monkeypatch
):
    ranks, folder = job
    (code0, log0), (code1, log1) = (r["text_report"] for r in ranks)
    assert (code0, code1) == (0, 0) and "[report, process 1] repeats 1\n" in log1
    assert_stability_shared(log0, log1)
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path / "cache"))
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([*text_report_command(folder), "--out", str(tmp_path / "text")]) == 0
    shared, alone = report_tables(folder / "text-report"), report_tables(tmp_path / "text")
    assert shared.keys() == alone.keys() and "repeats.csv" in shared
    assert set(shared["repeats.csv"]["repeat"]) == {0, 1}
    for name, table in alone.items():
        pd.testing.assert_frame_equal(shared[name], table, check_exact=True, obj=name)


def test_the_zero_shot_report_refuses_torchrun_in_one_line(checkpoint, monkeypatch, capsys):
    monkeypatch.setattr(distributed, "job_size", lambda: 2)
    assert main(["report", "--task", "zero-shot", "--model", checkpoint]) == 2
    assert "the zero-shot report has no repeats to share: run it alone" in capsys.readouterr().err


def test_other_commands_refuse_torchrun(checkpoint, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["info", "--model", checkpoint, *CLI_DATA]) == 2
    assert "info runs in one process; under torchrun run one of search" in capsys.readouterr().err
    assert not dist.is_initialized()


# --- the helpers --------------------------------------------------------------------------------


def test_without_torchrun_nothing_is_distributed(monkeypatch):
    for size in (None, "1"):
        if size is None:
            monkeypatch.delenv("WORLD_SIZE", raising=False)
        else:
            monkeypatch.setenv("WORLD_SIZE", size)
        assert not distributed.launched() and not distributed.init_from_env()
        assert not dist.is_initialized() and not distributed.active()
    assert (distributed.rank(), distributed.world_size(), distributed.is_main()) == (0, 1, True)
    assert distributed.from_main(lambda: 5) == 5 and distributed.all_gather("x") == ["x"]
    assert distributed.shard(10, 3) == slice(0, 10)


@pytest.mark.parametrize(
    "costs, parts, runs",
    [
        ([1, 1, 1, 1], 2, [(0, 2), (2, 4)]),
        ([4.5, 4.5, 3.5, 3.5, 0.5, 0.5], 2, [(0, 2), (2, 6)]),
        ([1, 1], 3, [(0, 1), (1, 1), (1, 2)]),  # fewer items than parts: an empty run
        ([], 2, [(0, 0), (0, 0)]),
        ([0, 0, 0], 2, [(0, 1), (1, 3)]),  # nothing costs anything: split by count
        ([5, 1, 1, 1, 1, 1], 2, [(0, 1), (1, 6)]),
    ],
)
def test_split_gives_contiguous_runs_of_about_equal_cost(costs, parts, runs):
    assert [(r.start, r.stop) for r in distributed.split(costs, parts)] == runs


def test_split_refuses_bad_arguments():
    with pytest.raises(ValueError, match="parts must be at least 1"):
        distributed.split([1.0], 0)
    with pytest.raises(ValueError, match="costs must not be negative"):
        distributed.split([1.0, -1.0], 2)
