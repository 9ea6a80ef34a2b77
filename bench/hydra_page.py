"""The Hydra page against `python -m hydra_core hydra`: the same systems on the same data, timed
in one process, each from a cold prediction cache.

    python bench/hydra_page.py                     # 64 search / 500 report images per set
    python bench/hydra_page.py --n-search 512 --n-report 2000   # Setup's default sizes
    python bench/hydra_page.py --gc                # ... and the page as it ran before the fix
    python bench/hydra_page.py --rounds 3          # page, CLI (, page --gc), three times over
    python bench/hydra_page.py --stages            # where the time goes: each stage timed
    python bench/hydra_page.py --mc-dropout        # with post-hoc MC Dropout ticked as well
    python bench/hydra_page.py --json

Members: seed sampling (M = 3, budget 4, pool 48, seeds 0-2) from a fixed seeded ranking of the
default model's 72 heads; the cost of evaluating them does not depend on which heads they drop.

- **page**: the app's Hydra page driven with Streamlit's AppTest (pages/6_hydra.py with the
  members in the session, every control at its default: temperature scaling ticked; post-hoc MC
  Dropout (5 passes) is opt-in for a model trained without dropout and ticked only with
  ``--mc-dropout``; 5 timed calls per system after one warm-up round), from the click
  on "Assemble and evaluate"
  until the page shows the results. While the job runs the page is rerun once a second, as its
  progress fragment's timer does in the browser; the stage labels it shows are recorded.
- **page --gc**: the same with a full garbage collection after every rerun, what the Streamlit
  server does after each script run unless ``runner.postScriptGC = false`` (.streamlit/config.toml)
  switches it off. AppTest itself never collects, so this adds what the server did.
- **CLI**: ``hydra_core.cli.main(["hydra", ...])`` with the same members, sizes, baselines and
  timed calls, from loading the model to writing its files, in a worker thread as the page runs
  its job. ``--main-thread`` adds a run in this process's main thread: after the page's runs
  (other threads of the process having used torch) it was 1.4-4.8x slower than in a worker
  thread and varied from run to run on the shared development machine, its latency stage
  most; a fresh ``hydra`` process is not affected that way, so it is no fair reference here.

The ratio page / CLI (each against the worker-thread CLI run of its round) is what the page's own
path costs; wall and CPU seconds, and the load average before and after each run, are printed,
as the machine may be shared: compare runs made at the same load.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hydra_core.hydra.members import seed_sampled_members  # noqa: E402
from hydra_core.masks import save_masks  # noqa: E402
from hydra_core.models.adapter import head_layout  # noqa: E402
from hydra_core.zoo.registry import load_model  # noqa: E402

BUDGET, POOL, SEEDS = 4, 48, (0, 1, 2)


def loadavg() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return math.nan


def members_of(loaded) -> list:
    layout = head_layout(loaded.model)
    heads = [(layer, h) for layer in range(layout.num_layers) for h in range(layout.max_heads)]
    order = torch.randperm(len(heads), generator=torch.Generator().manual_seed(0)).tolist()
    ranking = [heads[i] for i in order]
    return seed_sampled_members(
        ranking, layout, budget=BUDGET, seeds=SEEDS, ranking_name="Bench", pool=POOL
    )


def fresh_cache(root: Path, name: str) -> None:
    """Point the disk cache at an empty folder (predictions are computed, not read)."""
    from hydra_ui.context import disk_cache

    os.environ["HYDRA_LAB_CACHE"] = str(root / name)
    disk_cache.clear()


def page_run(args, members, root: Path, *, collect: bool) -> dict:
    """The Hydra page from the click to the results, rerun every second while it works."""
    from streamlit.testing.v1 import AppTest

    from hydra_ui.context import CONFIG_KEY, SetupConfig

    root.mkdir(parents=True, exist_ok=True)
    fresh_cache(root, f"page-{'gc' if collect else 'nogc'}")
    setup = SetupConfig(
        model="default", n_search=args.n_search, n_report=args.n_report, device="cpu"
    )
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=600)
    at.session_state[CONFIG_KEY] = setup
    at.session_state["results"] = {"_setup": setup.key, "jobs": {}, "members": members}
    at.run()
    at.switch_page("pages/6_hydra.py")
    at.run()
    if args.mc_dropout:
        next(c for c in at.checkbox if c.label == "MC Dropout").check()
        at.run()
    repeats = next(n for n in at.number_input if n.label == "Timed calls per system").value
    button = next(b for b in at.button if b.label == "Assemble and evaluate")
    load = loadavg()
    start, cpu = time.perf_counter(), time.process_time()
    button.click()
    at.run()
    job = at.session_state["results"]["jobs"]["hydra"]
    labels: list[str] = []
    while job.running:
        time.sleep(1.0)
        at.run()
        if collect:
            gc.collect(2)
        text = str(job.progress)
        if not labels or labels[-1] != text:
            labels.append(text)
    at.run()  # the page with the results
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    if job.error is not None or at.exception:
        raise RuntimeError(f"the page failed: {job.error or at.exception[0].value}")
    report = job.result
    stages = list(dict.fromkeys(label.split("**")[1] for label in labels if "**" in label))
    return {
        "path": "page (with a full GC after every rerun)" if collect else "page",
        "seconds": round(seconds, 1),
        "cpu_seconds": round(cpu, 1),
        "job_seconds": round(job.elapsed(), 1),
        "stage_seconds": {k: round(v, 1) for k, v in report.setup["seconds"].items()},
        "stages_shown": stages,
        "timed_calls": repeats,
        "systems": report.systems,
        "load_before": load,
        "load_after": loadavg(),
    }


def cli_run(args, members, root: Path, repeats: int, *, thread: bool) -> dict:
    """The CLI's hydra command, in this thread or (``thread``) in a worker thread, as the page
    runs its job."""
    from hydra_core.cli import main

    root.mkdir(parents=True, exist_ok=True)
    fresh_cache(root, "cli")
    loaded = load_model("default")
    masks = root / "members.json"
    save_masks(masks, members, loaded.identity())
    out = root / "cli-out"
    argv = [
        "hydra",
        "--model",
        "default",
        "--masks",
        str(masks),
        "--n-search",
        str(args.n_search),
        "--n-report",
        str(args.n_report),
        "--device",
        "cpu",
        "--baselines",
        "temperature",
        *(["mc-dropout", "--mc-dropout-rate", "0.1"] if args.mc_dropout else []),
        "--latency-repeats",
        str(repeats),
        "--latency-warmup",
        "1",  # as the page
        "--out",
        str(out),
    ]
    load = loadavg()
    start, cpu = time.perf_counter(), time.process_time()
    codes = []
    if thread:
        worker = threading.Thread(target=lambda: codes.append(main(argv)), name="bench-cli")
        worker.start()
        worker.join()
    else:
        codes.append(main(argv))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    if codes != [0]:
        raise RuntimeError(f"the CLI failed with exit code {codes}")
    setup = json.loads((out / "systems.json").read_text())["setup"]
    return {
        "path": "CLI (in a worker thread)" if thread else "CLI (main thread)",
        "seconds": round(seconds, 1),
        "cpu_seconds": round(cpu, 1),
        "stage_seconds": {k: round(v, 1) for k, v in setup["seconds"].items()},
        "timed_calls": repeats,
        "systems": [s["name"] for s in setup["systems"]],
        "load_before": load,
        "load_after": loadavg(),
    }


def stage_run(args, members, root: Path, repeats: int) -> dict:
    """Where the time goes: ``evaluate_systems`` with the page's systems and settings (Single,
    the Hydra members, unfused and fused, temperature scaling, and with ``--mc-dropout`` post-hoc
    MC Dropout with 5 passes; latency after one warm-up round), in a worker thread as the page
    runs it, each stage timed from its progress callback (a stage's seconds run from the end of
    the stage before, so work done before a stage's first report, the fusion or the temperature
    fit, counts in it)."""
    from hydra_core.baselines.systems import MCDropoutBaseline, TemperatureBaseline
    from hydra_core.cache import DiskCache
    from hydra_core.data.benchmark import default_benchmark
    from hydra_core.experiment.evaluate import evaluate_systems, hydra_systems

    root.mkdir(parents=True, exist_ok=True)
    loaded = load_model("default")
    benchmark = default_benchmark(n_search=args.n_search, n_report=args.n_report)
    systems = hydra_systems(members, label="Hydra")
    systems += [TemperatureBaseline()]
    if args.mc_dropout:
        systems.append(MCDropoutBaseline(passes=5, rate=0.1))
    ended: dict[str, float] = {}  # stage -> when its latest report came

    def progress(stage: str, done: int, total: int) -> None:
        kind = stage.split(":")[0]  # "evaluation: <system>" per system; "latency", "intervals"
        ended[stage if kind == "evaluation" else kind] = time.perf_counter()

    load = loadavg()
    start, cpu = time.perf_counter(), time.process_time()
    work = lambda: evaluate_systems(
        loaded,
        benchmark,
        systems,
        device="cpu",
        cache=DiskCache(root / "stages-cache"),
        progress=progress,
        latency_repeats=repeats,
        latency_warmup=1,
    )
    worker = threading.Thread(target=work, name="bench-stages")
    worker.start()
    worker.join()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    stages, before = {}, start
    for stage, at in ended.items():  # in the order the stages ran
        stages[stage], before = round(at - before, 1), at
    return {
        "path": "evaluate_systems, stage by stage",
        "seconds": round(seconds, 1),
        "cpu_seconds": round(cpu, 1),
        "stage_seconds": stages,
        "timed_calls": repeats,
        "load_before": load,
        "load_after": loadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-search", type=int, default=64)
    parser.add_argument("--n-report", type=int, default=500)
    parser.add_argument("--gc", action="store_true", help="also run the page with a GC per rerun")
    parser.add_argument(
        "--rounds", type=int, default=1, help="page then CLI, this many times (load drifts)"
    )
    parser.add_argument(
        "--main-thread", action="store_true", help="also run the CLI in this process's main thread"
    )
    parser.add_argument(
        "--stages",
        action="store_true",
        help="time each stage of the page's evaluation instead (no page or CLI run)",
    )
    parser.add_argument(
        "--mc-dropout",
        action="store_true",
        help="tick post-hoc MC Dropout (5 passes, p = 0.1) on the page and pass it to the CLI",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.chdir(REPO)  # the app reads .streamlit/config.toml and its pages from here
    members = members_of(load_model("default"))
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for round_ in range(args.rounds):
            folder = root / f"{round_}"
            if args.stages:  # the page's default of 5 timed calls
                rows.append({**stage_run(args, members, folder, 5), "round": round_ + 1})
                continue
            runs = [page_run(args, members, folder, collect=False)]
            calls = runs[0]["timed_calls"]
            runs.append(cli_run(args, members, folder / "thread", calls, thread=True))
            if args.main_thread:
                runs.append(cli_run(args, members, folder / "main", calls, thread=False))
            if args.gc:
                runs.append(page_run(args, members, folder, collect=True))
            for row in runs:  # each against the CLI run of its own round, in a worker thread
                row["round"] = round_ + 1
                row["ratio_to_cli"] = round(row["seconds"] / runs[1]["seconds"], 2)
            rows += runs
    result = {
        "sizes": {"n_search": args.n_search, "n_report": args.n_report},
        "mc_dropout": args.mc_dropout,
        "members": [m.name for m in members],
        "torch_threads": torch.get_num_threads(),
        "runs": rows,
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(
        f"default model, {args.n_search} search / {args.n_report} report images per set, "
        f"members {', '.join(result['members'])}, {result['torch_threads']} torch threads"
    )
    for row in rows:
        stages = ", ".join(f"{k} {v} s" for k, v in row["stage_seconds"].items())
        ratio = f"x{row['ratio_to_cli']:.2f} of the CLI" if "ratio_to_cli" in row else ""
        print(
            f"{row['round']}  {row['path']:<40} {row['seconds']:7.1f} s "
            f"(CPU {row['cpu_seconds']:.0f} s)  {ratio}  "
            f"(load {row['load_before']:.1f} -> {row['load_after']:.1f}; {stages})"
        )
        if row.get("stages_shown"):
            print(f"{'':<43} stages shown: {', '.join(row['stages_shown'])}")


if __name__ == "__main__":
    main()
