"""Search protocols measured by how their circuit transfers to the near and the far report sets.

    HYDRA_LAB_CACHE=/work/cache nice -n 10 python bench/protocols.py            # image default
    python bench/protocols.py --n-search 128 --budget 12 --repeats 3 --n-report 1000
    python bench/protocols.py --model minilm-sentiment --n-search 128 --budget 8
    python bench/protocols.py --table-only     # the table again from the CSV written so far

For every protocol (:data:`PROTOCOLS`: which data selects heads, and how the search AUROC
combines its OOD sets) and every repeat r (another subsample of the ID search items and of each
search set, ``search-repeat-r``; repeat 0 is the default subsample; the synthetic sets are made
again from the repeat's ID items with seed r), one CircOOD search (objective ``ood``), then
:func:`~hydra_core.evaluate.auroc_changes`: the circuit's MSP AUROC minus the dense model's on the
protocol's report sets, with its paired 95% bootstrap interval (report items resampled, both
models on the same items), per set and as near and far means. A leave-one-group-out protocol
reports only on the group it did not search on.

Rows are appended to ``protocols.csv`` as each (repeat, protocol) finishes, repeat by repeat, so
an interrupted run keeps what it measured and a rerun skips it; ``protocols.md`` summarises the
near and far means over repeats with a Student t 95% interval over the repeats (the per-repeat
paired intervals are in the CSV).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: measured protocols: name -> (benchmark protocol, --ood-aggregate)
PROTOCOLS = {
    "pooled": ("dedicated", "pooled"),
    "mean": ("dedicated", "mean"),
    "min": ("dedicated", "min"),
    "synthetic": ("synthetic", "mean"),
    "far-to-near": ("far-to-near", "mean"),
    "near-to-far": ("near-to-far", "mean"),
}
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}


def log(message: str) -> None:
    load = os.getloadavg()[0]
    print(f"{time.strftime('%H:%M:%S')} (load {load:.1f}) {message}", flush=True)


def repeat_benchmark(modality, protocol: str, n_search: int, n_report: int, repeat: int):
    """The protocol's benchmark with repeat ``repeat``'s search subsample."""
    from hydra_core.experiment.pipeline import search_repeat

    benchmark = modality.benchmark(protocol=protocol, n_search=n_search, n_report=n_report)
    if repeat == 0:
        return benchmark
    from hydra_core.data.images import ImageSet
    from hydra_core.data.ood import load_ood_set
    from hydra_core.data.text import load_text_ood_set

    id_pool = modality.load_id("validation")
    load = load_ood_set if isinstance(id_pool, ImageSet) else load_text_ood_set
    pools = [load(s.name) if s.name in modality.ood_sets else s for s in benchmark.ood_search]
    return search_repeat(benchmark, id_pool, pools, n_search, repeat)


def measure(loaded, name: str, repeat: int, args, cache) -> list[dict]:
    from hydra_core.analysis import greedy_circuit
    from hydra_core.analysis.inputs import search_inputs
    from hydra_core.evaluate import auroc_changes

    protocol, aggregate = PROTOCOLS[name]
    benchmark = repeat_benchmark(loaded.modality, protocol, args.n_search, args.n_report, repeat)
    inputs = search_inputs(loaded.preprocess, benchmark)
    start = time.perf_counter()
    result = greedy_circuit(
        loaded.model,
        inputs.id_x,
        inputs.id_y,
        inputs.ood_x,
        objective="ood",
        budget=args.budget,
        ood_sets=inputs.ood_sets,
        ood_aggregate=aggregate,
        cache=cache,
    )
    seconds = time.perf_counter() - start
    changes = auroc_changes(
        loaded, benchmark, result.keep_mask(), name=f"CircOOD {name} r{repeat}", cache=cache
    )
    searched = ", ".join(benchmark.search_names())
    return [
        {
            "protocol": name,
            "data_protocol": protocol,
            "ood_aggregate": aggregate,
            "repeat": repeat,
            "searched_on": searched,
            "n_id_search": len(inputs.id_x),
            "n_ood_search": len(inputs.ood_x),
            "budget": args.budget,
            "search_seconds": round(seconds, 1),
            "search_auroc_dense": result.base_auroc,
            "search_auroc_circuit": result.auroc[-1],
            **row,
        }
        for row in changes.to_dict("records")
    ]


def t_interval(values) -> tuple[float, float, float]:
    """Mean and Student t 95% interval over repeats (NaN bounds for one repeat)."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan, math.nan, math.nan
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    half = T_975.get(len(values) - 1, 1.96) * sd / len(values) ** 0.5
    return mean, mean - half, mean + half


def group_changes(frame: pd.DataFrame, name: str, label: str) -> dict[int, float]:
    """Repeat -> the protocol's change (x100) of one group average."""
    mine = frame[(frame["protocol"] == name) & (frame["set"] == label)]
    return {
        int(r): 100 * float(d) for r, d in zip(mine["repeat"], mine["delta_auroc"], strict=True)
    }


def summary(frame: pd.DataFrame, reference: str = "pooled") -> pd.DataFrame:
    """Per protocol and group (near, far): the mean change over repeats with a t interval, and
    the paired difference to ``reference`` (same repeat: same ID search items, same report
    items) with its t interval over repeats."""
    rows = []
    for name in [p for p in PROTOCOLS if p in set(frame["protocol"])]:
        mine = frame[frame["protocol"] == name]
        row = {"protocol": name, "searched_on": mine["searched_on"].iloc[0]}
        row["repeats"] = int(mine["repeat"].nunique())
        for group, label in (("near", "near-OOD average"), ("far", "far-OOD average")):
            changes = group_changes(frame, name, label)
            base = group_changes(frame, reference, label)
            row[f"{group}_delta"], row[f"{group}_lo"], row[f"{group}_hi"] = t_interval(
                list(changes.values())
            )
            row[f"{group}_repeats"] = "; ".join(f"{v:+.2f}" for v in changes.values())
            paired = [changes[r] - base[r] for r in changes if r in base]
            d = t_interval(paired)
            row[f"{group}_vs_{reference}"], row[f"{group}_vs_lo"], row[f"{group}_vs_hi"] = d
        rows.append(row)
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame, frame: pd.DataFrame, command: str) -> str:
    first = frame.iloc[0]
    lines = [
        "# Search protocols: transfer to the near and the far report sets",
        "",
        f"CircOOD (objective `ood`, budget {first['budget']}) searched on "
        f"{first['n_id_search']} ID + {first['n_ood_search']} OOD search items per repeat (the OOD "
        "items balanced across the search sets); "
        "AUROC (MSP, x100) of the circuit minus the dense model on the protocol's report sets, "
        "near and far means. Mean over repeats with a Student t 95% interval over the repeats "
        "(each repeat's own paired bootstrap interval is in `protocols.csv`). A leave-one-group-"
        "out protocol is not reported on the group it searched on (`-`). *vs pooled*: the "
        "protocol's change minus pooled's in the same repeat (same ID search items, same report "
        "items), mean and t interval over the repeats.",
        "",
        f"Command: `{command}`",
        "",
        "| protocol | searched on | repeats | near Δ | near 95% CI | far Δ | far 95% CI | "
        "near per repeat | far per repeat | near vs pooled | far vs pooled |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def fmt(v: float) -> str:
        return "-" if math.isnan(v) else f"{v:+.2f}"

    def ci(lo: float, hi: float) -> str:
        return "-" if math.isnan(lo) else f"[{lo:+.2f}, {hi:+.2f}]"

    def versus(r: dict, group: str) -> str:
        value = r[f"{group}_vs_pooled"]
        if math.isnan(value):
            return "-"
        return f"{fmt(value)} {ci(r[f'{group}_vs_lo'], r[f'{group}_vs_hi'])}"

    for r in table.to_dict("records"):
        lines.append(
            f"| {r['protocol']} | {r['searched_on']} | {r['repeats']} | {fmt(r['near_delta'])} "
            f"| {ci(r['near_lo'], r['near_hi'])} | {fmt(r['far_delta'])} | "
            f"{ci(r['far_lo'], r['far_hi'])} | {r['near_repeats'] or '-'} | "
            f"{r['far_repeats'] or '-'} | {versus(r, 'near')} | {versus(r, 'far')} |"
        )
    per_set = frame[~frame["set"].str.contains("average")].pivot_table(
        index="protocol", columns="set", values="delta_auroc", aggfunc="mean", sort=False
    )
    per_set = per_set.reindex([p for p in PROTOCOLS if p in per_set.index])
    sets = [c for c in dict.fromkeys(frame["set"]) if c in per_set.columns]
    lines += [
        "",
        "Per report set, mean over repeats (x100):",
        "",
        "| protocol | " + " | ".join(sets) + " |",
        "|---|" + "---|" * len(sets),
    ]
    for name, row in per_set.iterrows():
        cells = [fmt(100 * row[c]) if c in row else "-" for c in sets]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--n-search", type=int, default=128)
    p.add_argument("--n-report", type=int, default=1000)
    p.add_argument("--budget", type=int, default=12)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=list(PROTOCOLS))
    p.add_argument("--out", default=None, help="default: docs/report/protocols[/<model>]")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--table-only", action="store_true")
    p.add_argument("--merge", nargs="*", default=[], help="protocols.csv files to add")
    args = p.parse_args()
    out = Path(args.out or "docs/report/protocols" + ("" if args.model == "default" else "/text"))
    out.mkdir(parents=True, exist_ok=True)
    csv = out / "protocols.csv"
    command = (  # the run's command (a --table-only or --merge call rewrites the same table)
        f"HYDRA_LAB_CACHE=/work/cache nice -n 10 python bench/protocols.py --model {args.model} "
        f"--n-search {args.n_search} --n-report {args.n_report} --budget {args.budget} "
        f"--repeats {args.repeats}"
    )
    frame = pd.read_csv(csv) if csv.exists() else pd.DataFrame()
    for extra in args.merge:  # the CSVs of runs that measured other protocols in parallel
        frame = pd.concat([frame, pd.read_csv(extra)], ignore_index=True)
    if not args.table_only:
        from hydra_core.cache import DiskCache
        from hydra_core.zoo.registry import load_model

        torch.set_num_threads(args.threads)
        loaded = load_model(args.model)
        cache = DiskCache()
        for repeat in range(args.repeats):
            for name in args.protocols:
                done = (
                    not frame.empty
                    and ((frame["protocol"] == name) & (frame["repeat"] == repeat)).any()
                )
                if done:
                    continue
                log(f"{name}, repeat {repeat}: searching")
                rows = measure(loaded, name, repeat, args, cache)
                frame = pd.concat([frame, pd.DataFrame(rows)], ignore_index=True)
                frame.to_csv(csv, index=False)
                near = [r["delta_auroc"] for r in rows if r["set"] == "near-OOD average"]
                far = [r["delta_auroc"] for r in rows if r["set"] == "far-OOD average"]
                log(
                    f"{name}, repeat {repeat}: near {near} far {far} ({rows[0]['search_seconds']}s)"
                )
    table = summary(frame)
    table.to_csv(out / "summary.csv", index=False)
    (out / "protocols.md").write_text(markdown(table, frame, command))
    print(markdown(table, frame, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
