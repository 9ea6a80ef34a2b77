"""Benchmark Hydra Lab's BatchEnsemble layer against TorchUncertainty's own ``BatchLinear``.

``TokenBatchLinear`` (hydra_core.baselines.batch_ensemble) gives the numbers of
``torch_uncertainty.layers.BatchLinear.forward`` bit for bit, but broadcasts the fast weights r, s
and the bias over each member's rows where TorchUncertainty repeats them row by row (three
(rows, features) copies per layer and call). Two measurements, in one process, round-robin:

- one layer of the default ViT's MLP shape (192 -> 384, E = 3, the rows of 32 images x 17 tokens
  per member), both forwards on the same weights;
- the whole BatchEnsemble of the default ViT (E = 3, random fast weights; batch 32, each image
  through every member) with every layer's forward ours or TorchUncertainty's, beside the single
  model, as the report's Table 7 times it.

Outputs are checked equal first (``torch.equal``). Latency is the median of round-robin repeats
(``hydra_core.hydra.cost.measure_latencies``).

    python bench/batch_ensemble.py             # table
    python bench/batch_ensemble.py --json      # JSON
    python bench/batch_ensemble.py --threads 2 --repeats 50
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch
from torch_uncertainty.layers import BatchLinear

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hydra_core.baselines.batch_ensemble import TokenBatchLinear, batch_ensemble  # noqa: E402
from hydra_core.hydra.cost import measure_latencies  # noqa: E402
from hydra_core.zoo.default import VitConfig, build_vit  # noqa: E402

ESTIMATORS = 3


class LibraryForward(TokenBatchLinear):
    """The same layer with TorchUncertainty's forward (tokens flattened into the batch)."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        flat = BatchLinear.forward(self, inputs.reshape(-1, inputs.shape[-1]))
        return flat.reshape(*inputs.shape[:-1], -1)


def with_library_forward(model: torch.nn.Module) -> torch.nn.Module:
    """Every ``TokenBatchLinear`` of ``model`` (or ``model`` itself) switched to
    TorchUncertainty's forward, in place."""
    for module in model.modules():
        if type(module) is TokenBatchLinear:
            module.__class__ = LibraryForward
    return model


def layer_rows(repeats: int) -> dict:
    torch.manual_seed(0)
    ours = TokenBatchLinear(192, 384, ESTIMATORS)
    with torch.no_grad():
        ours.r_group.normal_(1, 0.5)
        ours.s_group.normal_(1, 0.5)
        ours.bias.normal_()
    x = torch.randn(ESTIMATORS * 32, 17, 192)
    library = with_library_forward(copy.deepcopy(ours))  # the same weights
    with torch.inference_mode():
        equal = torch.equal(ours(x), library(x))
        times = measure_latencies(
            {"Hydra Lab": lambda: ours(x), "TorchUncertainty": lambda: library(x)},
            warmup=5,
            repeats=repeats,
        )
    return {"equal": equal, "times": times}


def model_rows(repeats: int) -> dict:
    torch.manual_seed(0)
    single = build_vit(VitConfig()).eval()
    ours = batch_ensemble(single, ESTIMATORS, seed=0)
    library = with_library_forward(copy.deepcopy(ours))  # the same weights
    x = torch.randn(32, 1, 28, 28)
    with torch.inference_mode():
        equal = torch.equal(ours(x), library(x))
        times = measure_latencies(
            {
                "single model": lambda: single(x),
                "BatchEnsemble, Hydra Lab": lambda: ours(x),
                "BatchEnsemble, TorchUncertainty": lambda: library(x),
            },
            warmup=3,
            repeats=repeats,
        )
    return {"equal": equal, "times": times}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--repeats", type=int, default=30, help="timed rounds (default 30)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = {
        "threads": args.threads,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
        "layer": layer_rows(args.repeats),
        "model": model_rows(args.repeats),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for part, reference in (("layer", "TorchUncertainty"), ("model", "single model")):
        rows = result[part]
        print(f"{part} (outputs equal bit for bit: {rows['equal']})")
        base = rows["times"][reference]["median_ms"]
        for name, t in rows["times"].items():
            ratio = t["median_ms"] / base
            print(f"  {name:34s} {t['median_ms']:8.2f} ms  IQR {t['iqr_ms']:6.2f}  {ratio:5.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
