"""Attribution-guided greedy search against the exact search (``search --candidates K``).

    python bench/attribution.py                      # default model, 512 + 512 search items,
                                                     # budget 24, CircAvg, K = 4, 8, 16
    python bench/attribution.py --model minilm-sentiment --n 256 --budget 24
    python bench/attribution.py --timing vit-b16     # ViT-B/16 shape, random weights: s/step
    python bench/attribution.py --timing mpnet-sentiment --n 16 --steps 2
    python bench/attribution.py --timing vit-b16 --flops   # FLOPs of a step, exact vs guided
    python bench/attribution.py --inputs report --budget 24 --csv guided.csv   # the report's data
    python bench/attribution.py --inputs report --model minilm-sentiment --budget 36

Search mode: the modality's search split with ``2 n`` ID items and ``2 n`` pooled OOD items is cut
in two (stratified, :func:`~hydra_core.analysis.holdout.holdout_split`, fraction 0.5, seed 0): the
searches run on one half (about n + n), the held-out objective at the end (with its 95% interval
over resamples of the held-out items) is read on the other. For the exact search and each K:
candidates evaluated exactly, compute seconds, the Jaccard agreement of the removed set with the
exact search's, the held-out objective at the budget.

``--inputs report``: the searches run on the report's own search tensors (``n`` per search part,
default 256 as the reports: n ID + n pooled OOD items), and the held-out objective is read on the
report's held-out sample (search-role items the search did not use, at most 512 per set for
images, 256 for text, :func:`~hydra_core.experiment.stability.held_out_sample`). The exact search is
then the report's own search, so its stability Jaccard is the committed report's
(docs/report/stability.csv, docs/report/text/stability.csv, read where its budget is the bench's
and ``n`` the report's 256), and its held-out objective the one there (printed beside it as a
check). ``--exact report`` does not run the exact search: its removed heads are the committed
report's circuit (docs/report/circuits.csv, docs/report/text/circuit.csv; the same search on the
same data), its candidates every remaining head at every step, its time the report run's.
Searches are cached (``--cache-dir``,
default ``$HYDRA_LAB_CACHE``): a re-run reads them back and reports their stored compute time.

``--stability B`` measures the yardstick on the bench's own search data, at any ``n``: the exact
search on B stratified bootstrap resamples of it (``greedy_stability``, seed 0, as
``search --stability B``), whose mean pairwise Jaccard replaces the committed report's. Under
``torchrun --nproc-per-node N`` every search shares its candidates out over the N processes (the
same result bit for bit); rank 0 alone prints and writes.

Timing mode: a few steps of the exact search and of the guided search (K = 8) on a small batch,
seconds per step. The machine's load average is printed beside each timing.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hydra_core import distributed  # noqa: E402
from hydra_core.analysis.greedy import greedy_circuit  # noqa: E402
from hydra_core.analysis.greedy_result import GreedyResult  # noqa: E402
from hydra_core.analysis.holdout import held_out_curve, holdout_split  # noqa: E402
from hydra_core.cache import DiskCache  # noqa: E402
from hydra_core.errors import InputError  # noqa: E402
from hydra_core.outputs import check_output, write_csv, write_json  # noqa: E402

STABILITY_CSV = Path(__file__).resolve().parents[1] / "docs" / "report" / "stability.csv"
TEXT_STABILITY_CSV = STABILITY_CSV.parent / "text" / "stability.csv"
CIRCUITS_CSV = STABILITY_CSV.parent / "circuits.csv"
TEXT_CIRCUITS_CSV = STABILITY_CSV.parent / "text" / "circuit.csv"
#: items per search part of the reports (ReportConfig / TextReportConfig n_search)
REPORT_N = 256


def loadavg() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return math.nan


def log(message: str) -> None:
    if distributed.is_main():
        print(message, flush=True)


def jaccard(a, b) -> float:
    a, b = set(a), set(b)
    return len(a & b) / len(a | b) if a | b else 1.0


def split_data(name: str, n: int):
    """(model, search part, held-out part): each part (id_x, id_y, ood_x, strata)."""
    from hydra_core.analysis.inputs import search_inputs
    from hydra_core.zoo.registry import load_model

    loaded = load_model(name)
    benchmark = loaded.modality.benchmark(n_search=2 * n)
    inputs = search_inputs(loaded.preprocess, benchmark, n_ood=2 * n)
    strata = inputs.ood_strata()
    split = holdout_split(inputs.id_y, strata, 0.5, seed=0)

    def part(id_rows, ood_rows):
        return (
            inputs.id_x[id_rows],
            inputs.id_y[id_rows],
            inputs.ood_x[ood_rows],
            tuple(strata[i] for i in ood_rows.tolist()),
        )

    return (
        loaded.model,
        part(split.id_search, split.ood_search),
        part(split.id_held_out, split.ood_held_out),
    )


def stability_row(text: bool, objective: str, budget: int) -> dict | None:
    """The committed report's stability row of the exact search of ``objective`` (image:
    docs/report/stability.csv; text: docs/report/text/stability.csv); None where there is none
    or its budget is not ``budget``."""
    circuit = {"avg": "CircAvg", "acc": "CircAcc", "ood": "CircOOD"}[objective]
    path = TEXT_STABILITY_CSV if text else STABILITY_CSV
    try:
        with path.open() as f:
            for row in csv.DictReader(f):
                if row["circuit"] == circuit and int(row["budget"]) == budget:
                    return row
    except OSError:
        pass
    return None


def report_circuit(text: bool, objective: str, budget: int) -> dict | None:
    """The committed report's circuit of ``objective`` (its exact search: image
    docs/report/circuits.csv, text docs/report/text/circuit.csv); None where there is none or it
    removed another number of heads than ``budget``."""
    path = TEXT_CIRCUITS_CSV if text else CIRCUITS_CSV
    try:
        with path.open() as f:
            for row in csv.DictReader(f):
                if row["objective"] == objective and int(row["heads_removed"]) == budget:
                    return row
    except OSError:
        pass
    return None


def exact_from_report(model, text: bool, objective: str, budget: int) -> GreedyResult:
    """The report's exact search as a :class:`GreedyResult` (its removal order; the search
    objective at the budget from its search accuracy and AUROC, the steps before it unknown:
    NaN; ``seconds`` the report run's), refused in one line where the report has none."""
    from hydra_core.models.adapter import head_layout, parse_head_label

    row = report_circuit(text, objective, budget)
    if row is None:
        raise InputError(
            f"--exact report: the committed report has no {objective} circuit of {budget} heads; "
            "pass the report's budget (24 image, 36 text) or --exact run"
        )
    acc, auroc = float(row["search_accuracy"]), float(row["search_auroc"])
    final = {"acc": acc, "ood": auroc, "avg": (acc + auroc) / 2}[objective]
    nan = [math.nan] * (budget - 1)
    return GreedyResult(
        objective=objective,
        budget=budget,
        order=[parse_head_label(h) for h in row["removed"].split()],
        scores=[*nan, final],
        accuracy=[*nan, acc],
        auroc=[*nan, auroc],
        base_accuracy=float(row["dense_search_accuracy"]),
        base_auroc=float(row["dense_search_auroc"]),
        base_score=math.nan,
        candidate_scores=[],
        complete=True,
        seconds=float(row["seconds"]),
        num_heads=head_layout(model).num_heads,
    )


def report_data(name: str, n: int, held_out: int | None):
    """(model, search part, held-out part, text) on the report's data: the search tensors of the
    modality's benchmark with ``n`` items per search part (as the report builds them) and the
    report's held-out sample of the search-role items they leave (at most ``held_out`` per set;
    None: the report's default, 512 for images, 256 for text)."""
    from hydra_core.analysis.inputs import search_inputs
    from hydra_core.experiment.stability import held_out_sample
    from hydra_core.report.run import ReportConfig
    from hydra_core.report.text import TextReportConfig
    from hydra_core.zoo.registry import load_model

    loaded = load_model(name)
    text = loaded.modality.name == "text"
    if held_out is None:
        held_out = (TextReportConfig() if text else ReportConfig()).held_out
    benchmark = loaded.modality.benchmark(n_search=n)
    inputs = search_inputs(loaded.preprocess, benchmark)
    full = loaded.modality.benchmark(n_search=None)
    held = held_out_sample(loaded.preprocess, full, benchmark, inputs, held_out)
    search = (inputs.id_x, inputs.id_y, inputs.ood_x, tuple(inputs.ood_strata()))
    return loaded.model.eval(), search, held, text


def search_mode(args) -> dict:
    text = False
    if args.inputs == "report":
        model, search, held, text = report_data(args.model, args.n, args.held_out)
    else:
        model, search, held = split_data(args.model, args.n)
    id_x, id_y, ood_x, _ = search
    log(
        f"{args.model}: search {len(id_x)} ID + {len(ood_x)} OOD, held out {len(held[0])} + "
        f"{len(held[2])} ({args.inputs}); budget {args.budget}, objective {args.objective}"
    )
    cache = DiskCache(args.cache_dir) if args.cache_dir else None
    rows = []
    exact = None
    for k in [None, *args.ks]:
        label = "exact" if k is None else f"K={k}"
        load = loadavg()
        start = time.perf_counter()
        from_report = k is None and args.exact == "report"
        if from_report:
            result = exact_from_report(model, text, args.objective, args.budget)
            log(f"  exact: the committed report's circuit, {result.seconds:.0f} s in its run")
        else:
            result = greedy_circuit(
                model,
                id_x,
                id_y,
                ood_x,
                objective=args.objective,
                budget=args.budget,
                candidates=k,
                cache=cache,
                progress=lambda s, label=label: log(
                    f"  {label} step {s.step + 1}: {s.seconds:.1f} s, score {s.score:.4f}"
                ),
            )
        wall = time.perf_counter() - start
        curve = held_out_curve(model, result, held[0], held[1], held[2], ood_strata=held[3])
        exact = exact or result
        if from_report:  # every remaining head at every step
            total = sum(result.num_heads)
            evaluated = sum(total - t for t in range(result.steps))
        elif len(result.evaluated) == result.steps:
            evaluated = sum(result.evaluated)
        else:
            evaluated = math.nan
        row = {
            "search": label,
            "source": "report" if from_report else "this bench (or its cache)",
            "candidates_evaluated": evaluated,
            "compute_seconds": result.seconds,
            "seconds_per_step": result.seconds / max(result.steps, 1),
            "wall_seconds_this_run": wall,
            "load_before": load,
            "load_after": loadavg(),
            "jaccard_vs_exact": jaccard(result.order, exact.order),
            "same_order_as_exact": result.order == exact.order,
            "search_objective": result.scores[-1],
            "held_out": curve.held_out[-1],
            "held_out_lo": curve.held_out_lo[-1],
            "held_out_hi": curve.held_out_hi[-1],
            "removed": " ".join(result.labels()),
        }
        rows.append(row)
        log(
            f"{label}: {evaluated} candidates evaluated, {result.seconds:.0f} s compute "
            f"(this run {wall:.0f} s, load {load:.1f} -> {loadavg():.1f}); Jaccard vs exact "
            f"{row['jaccard_vs_exact']:.3f}; held-out {row['held_out']:.4f} "
            f"[{row['held_out_lo']:.4f}, {row['held_out_hi']:.4f}]"
        )
    reference = None
    where = "docs/report/text/stability.csv" if text else "docs/report/stability.csv"
    if args.stability:
        reference = own_stability(args, model, search, cache)
        where = f"this bench, {args.stability} resamples"
    elif args.inputs == "report" and args.n == REPORT_N:
        reference = stability_row(text, args.objective, args.budget)
    elif args.inputs == "halves" and args.model == "default":
        reference = stability_row(False, args.objective, args.budget)
    stab = float(reference["jaccard"]) if reference else math.nan
    log(f"exact search's stability Jaccard ({where}): {stab:.3f}")
    if reference and args.inputs == "report" and not args.stability:
        log(
            f"the report's held-out objective of this search at the budget: "
            f"{float(reference['held_out_at_budget']):.4f} "
            f"[{float(reference['held_out_at_budget_lo']):.4f}, "
            f"{float(reference['held_out_at_budget_hi']):.4f}] (this run: "
            f"{rows[0]['held_out']:.4f})"
        )
    base = rows[0]
    log(
        "\n| search | candidates evaluated | fewer | compute s | Jaccard vs exact | "
        "held-out objective [95% interval] |"
    )
    log("|---|---|---|---|---|---|")
    for row in rows:
        fewer = base["candidates_evaluated"] / row["candidates_evaluated"]
        log(
            f"| {row['search']} | {row['candidates_evaluated']} | {fewer:.1f}x | "
            f"{row['compute_seconds']:.0f} | {row['jaccard_vs_exact']:.3f} | "
            f"{row['held_out']:.4f} [{row['held_out_lo']:.4f}, {row['held_out_hi']:.4f}] |"
        )
    return {
        "model": args.model,
        "inputs": args.inputs,
        "n": args.n,
        "search_n_id": len(id_x),
        "search_n_ood": len(ood_x),
        "held_out_n_id": len(held[0]),
        "held_out_n_ood": len(held[2]),
        "budget": args.budget,
        "objective": args.objective,
        "stability_jaccard": stab,
        "stability_resamples": int(reference["resamples"]) if reference else None,
        "stability_source": where if reference else None,
        "stability_removed": reference.get("removed") if reference else None,
        "rows": rows,
    }


def own_stability(args, model, search, cache) -> dict:
    """The exact search on ``args.stability`` bootstrap resamples of the bench's search data: its
    mean pairwise Jaccard at the budget, and each resample's removed heads."""
    from hydra_core.analysis.stability import greedy_stability
    from hydra_core.models.family import head_label

    start = time.perf_counter()
    result = greedy_stability(
        model,
        *search[:3],  # id_x, id_y, ood_x
        objective=args.objective,
        budget=args.budget,
        resamples=args.stability,
        seed=0,
        ood_strata=search[3],
        cache=cache,
        progress=lambda p: log(
            f"  stability: {p.done}/{p.total} resample-steps, {p.groups} sharing, {p.seconds:.1f} s"
        ),
    )
    log(
        f"stability: {result.resamples} resamples, {result.group_steps} group steps, "
        f"{result.seconds:.0f} s compute (this run {time.perf_counter() - start:.0f} s)"
    )
    return {
        "jaccard": result.jaccard(),
        "resamples": result.resamples,
        "removed": [" ".join(head_label(*head) for head in o) for o in result.orders],
    }


def timing_model(name: str, n: int):
    """(model, id_x, id_y, ood_x) for timing: a ViT-B/16-shaped timm model with random weights
    on random 224 px images, or a registry model on its search data."""
    if name == "vit-b16":
        import timm

        torch.manual_seed(0)
        model = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=10).eval()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(2 * n, 3, 224, 224, generator=g)
        return model, x[:n], torch.randint(0, 10, (n,), generator=g), x[n:] * 2
    from hydra_core.analysis.inputs import search_inputs
    from hydra_core.zoo.registry import load_model

    loaded = load_model(name)
    inputs = search_inputs(loaded.preprocess, loaded.modality.benchmark(n_search=n), n_ood=n)
    return loaded.model, inputs.id_x, inputs.id_y, inputs.ood_x


def step_flops(model, inputs: torch.Tensor, k: int) -> dict:
    """FLOPs (multiply-adds x 2) per item of the first step, exact against guided: the exact step
    scores every head at its layer's fast-path cost (bench/greedy.py's counts); the guided step
    runs one forward and 4 backward passes to the head outputs (no weight gradients: each about a
    forward, counted as one) and scores K heads at the mean fast-path cost per head."""
    from bench.greedy import flops, text_flops
    from hydra_core.models.adapter import head_layout, model_and_inputs

    layout = head_layout(model)
    text = not inputs.is_floating_point()
    counts = text_flops(model, inputs, 64) if text else flops(model)
    per_layer = counts["fast_per_candidate_by_layer"]
    exact = sum(n * c for n, c in zip(layout.num_heads, per_layer, strict=True))
    passes = 1 + 4  # forward + backward passes of the estimate (4 with more than 4 classes)
    with torch.inference_mode():
        classes = model_and_inputs(model, inputs[:1])[0](inputs[:1]).shape[-1]
    if classes <= 4:
        passes = 1 + classes
    mean = sum(n * c for n, c in zip(layout.num_heads, per_layer, strict=True)) / sum(
        layout.num_heads
    )
    guided = passes * counts["plain_per_candidate"] + k * mean
    return {
        "heads": layout.total_heads,
        "plain_forward": counts["plain_per_candidate"],
        "exact_step": exact,
        "guided_step": guided,
        "estimate_passes": passes,
        "ratio": exact / guided,
    }


def timing_mode(args) -> dict:
    model, id_x, id_y, ood_x = timing_model(args.timing, args.n)
    if args.flops:
        from hydra_core.models.adapter import model_and_inputs

        wrapped, x = model_and_inputs(model, torch.cat([id_x, ood_x]))
        counted = step_flops(model, x, args.k)
        log(
            f"{args.timing}: {counted['heads']} heads; per item, plain forward "
            f"{counted['plain_forward'] / 1e9:.2f} GFLOP; first step exact "
            f"{counted['exact_step'] / 1e9:.1f} GFLOP, guided (K = {args.k}, "
            f"{counted['estimate_passes']} passes for the estimate) "
            f"{counted['guided_step'] / 1e9:.1f} GFLOP: {counted['ratio']:.1f}x fewer"
        )
        return {"timing": args.timing, "flops": counted}
    found = {}
    for k in (args.k,) if args.skip_exact else (None, args.k):
        label = "exact" if k is None else f"K={k}"
        load = loadavg()
        result = greedy_circuit(
            model,
            id_x,
            id_y,
            ood_x,
            objective=args.objective,
            budget=args.steps,
            candidates=k,
            progress=lambda s, label=label: log(f"  {label} step {s.step + 1}: {s.seconds:.1f} s"),
        )
        per_step = result.step_seconds
        found[label] = {
            "step_seconds": per_step,
            "evaluated": result.evaluated,
            "order": result.labels(),
            "load": [load, loadavg()],
        }
        log(
            f"{label}: {sum(per_step) / len(per_step):.1f} s per step ({per_step}), evaluated "
            f"{result.evaluated}, load {load:.1f} -> {loadavg():.1f}"
        )
    return {"timing": args.timing, "n": args.n, "steps": args.steps, **found}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument(
        "--n",
        "--items",  # the same: under torchrun, whose parser takes --n for one of its own options
        dest="n",
        type=int,
        default=None,
        help="search items per side (default 512; --inputs report: 256; timing: 8)",
    )
    p.add_argument("--budget", type=int, default=24)
    p.add_argument("--objective", default="avg", choices=("acc", "ood", "avg"))
    p.add_argument("--ks", type=int, nargs="+", default=[16, 8, 4])
    p.add_argument("--timing", default=None, help="vit-b16 or a registry model: seconds per step")
    p.add_argument("--k", type=int, default=8, help="K of the timing run")
    p.add_argument("--steps", type=int, default=2, help="steps of the timing run")
    p.add_argument("--flops", action="store_true", help="timing mode: count FLOPs, run nothing")
    p.add_argument(
        "--skip-exact", action="store_true", help="timing mode: time the guided search alone"
    )
    p.add_argument(
        "--inputs",
        default="halves",
        choices=("halves", "report"),
        help="search mode: halves of 2n search items (default), or the report's search data",
    )
    p.add_argument(
        "--exact",
        default="run",
        choices=("run", "report"),
        help="--inputs report: run the exact search (default) or take the committed report's",
    )
    p.add_argument(
        "--held-out",
        type=int,
        default=None,
        help="--inputs report: held-out items per set (default: the report's, 512 / 256 text)",
    )
    p.add_argument(
        "--stability",
        type=int,
        default=None,
        metavar="B",
        help="search mode: measure the exact search's stability Jaccard on B bootstrap resamples "
        "of the bench's search data (default: the committed report's, at --inputs report --n 256)",
    )
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--cache-dir", default=os.environ.get("HYDRA_LAB_CACHE"))
    p.add_argument("--json", default=None, metavar="PATH", help="also write the figures here")
    p.add_argument(
        "--csv", default=None, metavar="PATH", help="search mode: also write one row per search"
    )
    p.add_argument("--overwrite", action="store_true", help="replace --json / --csv files")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    distributed.init_from_env()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.n is None:
        args.n = 8 if args.timing else REPORT_N if args.inputs == "report" else 512
    try:
        for option, path in (("--json", args.json), ("--csv", args.csv)):
            if path:
                check_output(path, overwrite=args.overwrite, option=option)
        if args.csv and args.timing:
            raise InputError("--csv writes the search mode's rows; leave it out with --timing")
        if args.exact == "report" and (args.inputs != "report" or args.n != REPORT_N):
            raise InputError(
                f"--exact report is the report's search on its data: pass --inputs report with "
                f"--n {REPORT_N} (or leave --exact out)"
            )
        if args.stability is not None and (args.timing or args.stability < 2):
            raise InputError(
                "--stability B resamples the search mode's data at least twice: pass B >= 2 "
                "and leave --timing out"
            )
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    found = timing_mode(args) if args.timing else search_mode(args)
    if not distributed.is_main():
        return 0
    if args.json:
        write_json(args.json, found)
    if args.csv:
        write_csv(args.csv, pd.DataFrame(found["rows"]), index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
