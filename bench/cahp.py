"""CAHP's variants side by side on the same search inputs: heads kept, knee, run time, overlap.

    python bench/cahp.py                                         # default ViT, 512 search images
    python bench/cahp.py --model minilm-sentiment --n-search 256  # the text default, 256 sentences
    python bench/cahp.py --json                                  # the same numbers as JSON

The inputs are those of ``python -m hydra_core cahp`` with the same ``--model`` and
``--n-search`` (the ID search split). Each variant runs once, in this process, with its own
defaults (official: seed 42, degree 6; accuracy-knee: seed 0, degree 3, every k from 1 to the
number of heads), accuracy-knee with either representative. The times are those of
``cahp_select`` alone (wall clock and this process's CPU time), with the machine's load average
beside them: on a shared machine the wall clock moves with it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hydra_core.analysis.cahp import cahp_select  # noqa: E402
from hydra_core.analysis.inputs import search_inputs  # noqa: E402
from hydra_core.cli import build_parser  # noqa: E402
from hydra_core.cli.common import load_for_cli  # noqa: E402
from hydra_core.models.adapter import head_label, head_layout  # noqa: E402

RUNS = {
    "official": {"variant": "official"},
    "accuracy-knee (medoid)": {"variant": "accuracy-knee", "representative": "medoid"},
    "accuracy-knee (importance)": {"variant": "accuracy-knee", "representative": "importance"},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument("--n-search", type=int, default=512)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cli = build_parser().parse_args(
        ["cahp", "--model", args.model, "--n-search", str(args.n_search), "--device", "cpu"]
    )
    loaded, benchmark = load_for_cli(cli)
    inputs = search_inputs(loaded.preprocess, benchmark)
    total = head_layout(loaded.model).total_heads
    rows, kept = [], {}
    for name, options in RUNS.items():
        load = os.getloadavg()[0]
        wall, cpu = time.perf_counter(), time.process_time()
        result = cahp_select(loaded.model, inputs.id_x, inputs.id_y, **options)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        kept[name] = {head_label(*h) for h in result.keep.nonzero().tolist()}
        rows.append(
            {
                "variant": name,
                "knee_k": result.knee_k,
                "kept": len(kept[name]),
                "added_for_layers": len(result.added),
                "wall_s": round(wall, 1),
                "cpu_s": round(cpu, 1),
                "load": load,
            }
        )
    names = list(kept)
    jaccard = {
        f"{a} / {b}": round(len(kept[a] & kept[b]) / len(kept[a] | kept[b]), 3)
        for i, a in enumerate(names)
        for b in names[i + 1 :]
    }
    info = {
        "model": loaded.name,
        "heads": total,
        "search_samples": len(inputs.id_x),
        "threads": args.threads,
        "runs": rows,
        "jaccard": jaccard,
        "kept": {name: sorted(heads) for name, heads in kept.items()},
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return
    samples = len(inputs.id_x)
    print(f"{loaded.name}: {total} heads, {samples} ID search samples, {args.threads} thread(s)")
    header = ("knee", "kept", "+layers", "wall s", "CPU s", "load")
    print(f"{'variant':28} " + " ".join(f"{h:>7}" for h in header))
    for r in rows:
        print(
            f"{r['variant']:28} {r['knee_k']:7d} {r['kept']:7d} {r['added_for_layers']:7d} "
            f"{r['wall_s']:7.1f} {r['cpu_s']:7.1f} {r['load']:7.1f}"
        )
    for pair, value in jaccard.items():
        print(f"Jaccard {pair}: {value}")


if __name__ == "__main__":
    main()
