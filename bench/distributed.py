"""Greedy search over processes: one process against ``torchrun --nproc-per-node 2``.

    python bench/distributed.py            # default model, budget 4, 128 ID + 128 OOD images
    python bench/distributed.py --json     # the same numbers as JSON
    python bench/distributed.py --costs    # time per candidate of each layer vs the cost model

Each run is the command a user types (``python -m hydra_core search ... --json``), with a cache of
its own (no run resumes another's) and one torch thread per process; the runs alternate (one
process, two, two, one, ...) so that a drift in the machine's load hits both alike. The speed-up
divides the median search time of one process by that of two, the search time being the JSON's
``seconds`` (the search's own compute, without start-up and loading). Both must find the same
removal order with the same scores. The machine's load average is printed beside each run: on a
shared machine the timings move with it.

``--costs`` checks the cost model the processes share a step by
(:meth:`hydra_core.analysis._shares.ShardedSuffixEvaluator.candidate_cost`): the measured time per
candidate of each layer (one thread, median of 3 passes over every candidate), divided by the
model's cost, should be about the same number for every layer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def loadavg() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return float("nan")


def search(processes: int, args: argparse.Namespace) -> dict:
    """One search as a user runs it; its JSON, wall time (start-up included) and load."""
    command = [
        *(["-m", "hydra_core"] if processes == 1 else []),
        "search",
        "--model",
        args.model,
        "--objective",
        args.objective,
        "--budget",
        str(args.budget),
        "--n-search",
        str(args.n_search),
        "--threads",
        "1",
        "--device",
        "cpu",
        "--json",
    ]
    if processes == 1:
        launcher = [str(BIN / "python")]
    else:
        launcher = [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={processes}"]
        launcher += ["-m", "hydra_core"]
    with tempfile.TemporaryDirectory() as folder:
        full = [*launcher, *command, "--cache-dir", f"{folder}/cache", "--out", f"{folder}/out"]
        before, start = loadavg(), time.perf_counter()
        done = subprocess.run(
            full,
            cwd=ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(full)} failed:\n{done.stderr[-3000:]}")
    found = json.loads(done.stdout)
    return {
        "processes": processes,
        "seconds": found["seconds"],
        "wall_s": wall,
        "loadavg_before": before,
        "loadavg_after": loadavg(),
        "order": found["order"],
        "scores": found["scores"],
        "n_id": found["n_id"],
        "n_ood": found["n_ood"],
    }


def layer_costs(args: argparse.Namespace) -> list[dict]:
    """Measured milliseconds per candidate of each layer, and the cost model's estimate."""
    import torch

    sys.path.insert(0, str(ROOT))
    import hydra_core as hc
    from hydra_core.analysis._shares import ShardedSuffixEvaluator

    torch.set_num_threads(1)
    loaded = hc.load_model(args.model)
    inputs = hc.search_inputs(loaded.preprocess, hc.default_benchmark(n_search=args.n_search))
    rows = []
    with torch.inference_mode():
        evaluator = ShardedSuffixEvaluator(loaded.model, torch.cat([inputs.id_x, inputs.ood_x]))
        times: list[list[float]] = []
        for _ in range(3):
            start, times = time.perf_counter(), times + [[]]
            for heads, _logits in evaluator.candidate_logits():
                times[-1].append((time.perf_counter() - start) / len(heads))
                start = time.perf_counter()
    for layer, measured in enumerate(zip(*times, strict=True)):
        ms = 1000 * statistics.median(measured)
        cost = evaluator.candidate_cost(layer)
        rows.append(
            {"layer": layer, "ms_per_candidate": ms, "cost": cost, "ms_per_cost": ms / cost}
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="default")
    parser.add_argument("--objective", default="avg")
    parser.add_argument("--budget", type=int, default=4)
    parser.add_argument("--n-search", type=int, default=128, help="ID and pooled OOD images")
    parser.add_argument("--processes", type=int, default=2, help="processes of the torchrun job")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each (default: 2)")
    parser.add_argument("--costs", action="store_true", help="check the cost model, then stop")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    say = (lambda *a: None) if args.json else (lambda *a: print(*a, flush=True))
    if args.costs:
        rows = layer_costs(args)
        say(f"{'layer':>6}{'ms/candidate':>14}{'cost':>8}{'ms/cost':>9}")
        for r in rows:
            say(
                f"{r['layer']:>6}{r['ms_per_candidate']:>14.1f}{r['cost']:>8.3f}{r['ms_per_cost']:>9.1f}"
            )
        if args.json:
            print(json.dumps(rows, indent=2))
        return

    say(
        f"model {args.model}, budget {args.budget}, {args.n_search} ID + {args.n_search} OOD "
        f"search images, one thread per process, {os.cpu_count()} CPUs"
    )
    say(f"{'processes':>10}{'search s':>10}{'wall s':>9}{'load before/after':>20}")
    pattern = [1, args.processes, args.processes, 1] * ((args.repeats + 1) // 2)
    runs = []
    for processes in pattern[: 2 * args.repeats]:
        run = search(processes, args)
        runs.append(run)
        say(
            f"{processes:>10}{run['seconds']:>10.2f}{run['wall_s']:>9.1f}"
            f"{run['loadavg_before']:>12.2f} / {run['loadavg_after']:.2f}"
        )
    one = [r for r in runs if r["processes"] == 1]
    many = [r for r in runs if r["processes"] == args.processes]
    reference = one[0]
    same_order = all(r["order"] == reference["order"] for r in runs)
    worst = max(
        abs(a - b) for r in runs for a, b in zip(r["scores"], reference["scores"], strict=True)
    )
    speedup = statistics.median(r["seconds"] for r in one) / statistics.median(
        r["seconds"] for r in many
    )
    report = {
        "model": args.model,
        "budget": args.budget,
        "n_id": reference["n_id"],
        "n_ood": reference["n_ood"],
        "processes": args.processes,
        "cpus": os.cpu_count(),
        "runs": runs,
        "same_order": same_order,
        "max_score_difference": worst,
        "speedup": speedup,
    }
    say(
        f"search-time speed-up with {args.processes} processes: {speedup:.2f}x; same order: "
        f"{same_order} ({' '.join(reference['order'])}); largest score difference {worst:.1e}"
    )
    if args.json:
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
