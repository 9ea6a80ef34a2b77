"""The Hydra page's estimate against the run it estimates (docs/app-notes.md): the default
model, three members of random head masks, temperature scaling, latency (1 + 5 rounds), on a
fresh cache; prints each stage's estimated and measured seconds.

    PYTHONPATH=. python scripts/measure_hydra_estimate.py --n-report 250
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from types import SimpleNamespace

import torch

from hydra_core.baselines.systems import TemperatureBaseline
from hydra_core.cache import DiskCache
from hydra_core.experiment.evaluate import evaluate_systems, hydra_systems
from hydra_core.masks import MemberMask
from hydra_core.models.adapter import head_layout
from hydra_core.zoo.registry import load_model
from hydra_ui.hydra_wait import hydra_estimate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="default")
    parser.add_argument("--n-search", type=int, default=512)
    parser.add_argument("--n-report", type=int, default=250)
    args = parser.parse_args()
    loaded = load_model(args.model)
    benchmark = loaded.modality.benchmark(
        n_search=args.n_search,
        n_report=args.n_report,
        model_classes=loaded.classes,
        image_format=loaded.image_format,
    )
    layout = head_layout(loaded.model)
    generator = torch.Generator().manual_seed(0)
    members = []
    for i in range(3):
        keep = torch.rand(layout.shape, generator=generator) > 1 / 3
        members.append(MemberMask(f"m{i}", "random", keep))
    context = SimpleNamespace(
        loaded=loaded, benchmark=benchmark, device=torch.device("cpu"), bf16=False,
        noun=loaded.modality.noun,
    )  # fmt: skip
    cache = DiskCache(tempfile.mkdtemp())
    start = time.perf_counter()
    stages, note = hydra_estimate(
        context, members, "Hydra", {}, cache=cache, baselines=[TemperatureBaseline()], repeats=5
    )
    print(f"estimate made in {time.perf_counter() - start:.1f} s", flush=True)
    print(f"load average at the start: {os.getloadavg()[0]:.1f}", flush=True)
    print(note, flush=True)
    seen: dict[str, list[float]] = {}

    def progress(stage: str, done: int, total: int) -> None:
        now = time.perf_counter()
        seen.setdefault(stage, [now, now])[1] = now

    start = time.perf_counter()
    evaluate_systems(
        loaded,
        benchmark,
        hydra_systems(members, label="Hydra") + [TemperatureBaseline()],
        device="cpu",
        cache=cache,
        progress=progress,
        latency_repeats=5,
        latency_warmup=1,
    )
    total = time.perf_counter() - start
    ends = dict(zip(seen, [start, *(v[1] for v in seen.values())][:-1], strict=True))
    print(f"{'stage':<28} {'estimated':>10} {'measured':>10}")
    for s in stages:
        took = seen[s.name][1] - ends[s.name] if s.name in seen else 0.0
        print(f"{s.name:<28} {s.seconds:>10.1f} {took:>10.1f}")
    print(f"{'whole run':<28} {sum(s.seconds for s in stages):>10.1f} {total:>10.1f}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
