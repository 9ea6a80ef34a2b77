"""Greedy head search: the fast path against the plain reference on the default model.

    python bench/greedy.py                 # plain vs fast, 3 steps, 512 ID + 512 OOD images
    python bench/greedy.py --full          # ... then a budget-24 CircAvg search with the fast path
    python bench/greedy.py --json          # the same numbers as JSON
    python bench/greedy.py --model minilm-sentiment --steps 1   # a text model: Rotten Tomatoes
                                           # validation sentences vs Guardian headlines

Both methods run in this process on the same inputs; the table gives seconds per step, the
speed-up, seconds per candidate evaluation, whether the two made the same choices, and the FLOPs
per candidate each method needs for this architecture (the ratio the speed-up is bounded by when
both run at the same arithmetic efficiency). The machine's load average is printed beside each
timing: on a shared machine the timings move with it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hydra_core.analysis import greedy_circuit  # noqa: E402
from hydra_core.analysis._suffix import class_token_pooling, cpu_rows_per_pass  # noqa: E402
from hydra_core.models.adapter import embed, head_layout  # noqa: E402
from hydra_core.zoo.default import build_vit, load_default_model, preprocess  # noqa: E402


def loadavg() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return math.nan


def load_model(random_init: bool) -> tuple[torch.nn.Module, str]:
    if not random_init:
        try:
            return load_default_model(), "default checkpoint"
        except FileNotFoundError:
            pass
    torch.manual_seed(0)
    return build_vit().eval(), "randomly initialised default architecture (no checkpoint yet)"


def load_inputs(n_id: int, n_ood: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
    from hydra_core.data.fashion_mnist import load_fashion_mnist

    fmnist = load_fashion_mnist("validation")
    id_x, id_y = preprocess(fmnist.images[:n_id]), fmnist.labels[:n_id]
    try:
        from hydra_core.data.benchmark import default_benchmark

        ood = default_benchmark(n_search=n_ood).pooled_ood_search(n_ood)
        return id_x, id_y, preprocess(ood.images), ood.description
    except (
        ImportError,
        FileNotFoundError,
    ) as error:  # data not installed; too large an n_ood raises
        noise = torch.randn(n_ood, 1, 28, 28, generator=torch.Generator().manual_seed(0))
        return id_x, id_y, noise, f"Gaussian noise (OOD sets unavailable: {error})"


def load_named(name: str, n_id: int, n_ood: int):
    """A registry model and its search inputs (ID search part, pooled search-role OOD sets)."""
    from hydra_core.analysis.inputs import search_inputs
    from hydra_core.zoo.registry import load_model as load_registered

    loaded = load_registered(name)
    benchmark = loaded.modality.benchmark(n_search=n_id)  # the modality's default sets
    inputs = search_inputs(loaded.preprocess, benchmark, n_ood=n_ood)
    note = f"{len(inputs.id_x)} {benchmark.id_search.name} (search part)"
    return (
        loaded.model,
        loaded.name,
        (inputs.id_x, inputs.id_y, inputs.ood_x),
        note,
        inputs.describe(),
    )


def text_flops(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    batch_size: int,
    kept: list[int] | None = None,
) -> dict[str, float]:
    """Multiply-adds x 2 per candidate and sample of a post-LN text encoder (matmuls, attention
    scores and values): the plain forward at the padded length of its batches (in the order
    given), and the fast path at each sample's own length (it sorts by length), per layer of the
    candidate: its fc2 and fc1 as a rank-d_k update, the full blocks after it, the class-token
    row of the last block with W_K and W_V folded onto the query. ``kept``: heads kept per layer
    (all when None); removed heads are cut out of the blocks after a candidate."""
    from hydra_core.models.adapter import family_of

    layout = head_layout(model)
    family = family_of(model)
    d, dk, layers = layout.embed_dim, layout.head_dim, layout.num_layers
    kept = list(layout.num_heads) if kept is None else kept
    hidden = family.cost_sizes(model).mlp_hidden
    lengths = inputs[:, 1].sum(1).double()
    padded = torch.cat(
        [torch.full((len(chunk),), float(chunk.max())) for chunk in lengths.split(batch_size)]
    )

    def block(n: torch.Tensor, h: int) -> torch.Tensor:  # one block keeping h heads, n tokens
        return 2 * n * (4 * d * h * dk + 2 * d * hidden) + 2 * 2 * h * n * n * dk

    h = kept[-1]
    last_cls = 2 * d * h * dk * 2 + 2 * h * (2 * dk * d + 2 * lengths * d) + 2 * 2 * d * hidden
    plain = float(sum(block(padded, k) for k in kept).mean())
    own = 2 * lengths * (dk * d + dk * hidden + hidden * d)
    per_layer = [
        float((own + sum(block(lengths, k) for k in kept[layer + 1 : -1]) + last_cls).mean())
        for layer in range(layers - 1)
    ]
    per_layer.append(float((2 * dk * d + 2 * 2 * d * hidden) + 0 * lengths.mean()))
    fast = sum(per_layer) / layers
    return {
        "tokens": float(lengths.mean()),
        "plain_padded_tokens": float(padded.mean()),
        "plain_per_candidate": plain,
        "fast_per_candidate": fast,
        "fast_per_candidate_by_layer": per_layer,
        "ratio": plain / fast,
    }


def flops(model: torch.nn.Module) -> dict[str, float]:
    """Multiply-adds x 2 per sample: a plain forward, and the fast path's cost per candidate of
    each layer with every head kept (matmuls only; attention scores and values included)."""
    layout = head_layout(model)
    d, dk, layers = layout.embed_dim, layout.head_dim, layout.num_layers
    channels = model.patch_embed.proj.in_channels
    with torch.inference_mode():
        n = embed(model, torch.zeros(1, channels, *model.patch_embed.img_size)).shape[1]
    hidden = model.blocks[0].mlp.fc1.out_features
    classes = model.num_classes
    cls = class_token_pooling(model)
    heads = layout.num_heads[0]
    qkv, proj, mlp = 2 * n * d * 3 * d, 2 * n * d * d, 2 * 2 * n * d * hidden
    attention = 2 * 2 * heads * n * n * dk
    block = qkv + attention + proj + mlp
    patch = 2 * n * d * channels * math.prod(model.patch_embed.patch_size)
    plain = layers * block + patch + 2 * d * classes
    # last block, CLS only: query, W_K and W_V folded onto the query side, CLS rows of proj and MLP
    last_cls = (
        2 * d * d + 2 * heads * (dk * d + n * d + n * d + dk * d) + 2 * d * d + 2 * 2 * d * hidden
    )
    last = last_cls if cls else block
    # candidate's own layer: its head's share (rank d_k), fc1 as a rank-d_k update, fc2
    own = 2 * n * dk * d + 2 * n * dk * hidden + 2 * n * hidden * d
    per_layer = []
    for layer in range(layers):
        if layer == layers - 1:
            per_layer.append((2 * dk * d + 2 * 2 * d * hidden) if cls else own)
        else:
            per_layer.append(own + (layers - 2 - layer) * block + last)
    fast = sum(per_layer) / layers
    return {
        "tokens": n,
        "plain_per_candidate": plain,
        "fast_per_candidate": fast,
        "fast_per_candidate_by_layer": per_layer,
        "ratio": plain / fast,
    }


def search_flops(model: torch.nn.Module, inputs: torch.Tensor, order, batch_size: int) -> float:
    """Multiply-adds x 2 that a fast search removing heads in ``order`` (layer, head) computed
    (text models): at each step, every kept head of each layer at that layer's fast-path cost
    under the step's mask, for every sample."""
    kept = list(head_layout(model).num_heads)
    total = 0.0
    for layer, _ in order:  # one step per removal, scored under the mask before it
        per_layer = text_flops(model, inputs, batch_size, kept)["fast_per_candidate_by_layer"]
        total += sum(k * c for k, c in zip(kept, per_layer, strict=True)) * len(inputs)
        kept[layer] -= 1
    return total


def matmul_rate(rows: int, d: int, hidden: int, repeats: int = 5) -> float:
    """This machine's fp32 matmul rate (FLOP/s) at the current thread count, on a (rows, d) x
    (d, hidden) product: the MLP's shape in a pass, the search's largest and most efficient op."""
    a, b = torch.randn(rows, d), torch.randn(d, hidden)
    for _ in range(2):
        a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * rows * d * hidden * repeats / (time.perf_counter() - start)


def run(model, data, method: str, budget: int, batch_size: int) -> dict:
    """One search; wall and CPU seconds per step (CPU time moves less with the machine's load)."""
    before = loadavg()
    cpu_marks: list[float] = []  # CPU time when step 0 starts and when each step ends

    def poll() -> bool:  # polled first just before step 0
        if not cpu_marks:
            cpu_marks.append(time.process_time())
        return False

    start = time.perf_counter()
    result = greedy_circuit(
        model,
        *data,
        objective="avg",
        budget=budget,
        method=method,
        batch_size=batch_size,
        progress=lambda step: cpu_marks.append(time.process_time()),
        should_stop=poll,
    )
    wall = time.perf_counter() - start
    cpu = [b - a for a, b in zip(cpu_marks[:-1], cpu_marks[1:], strict=True)]
    candidates = sum(int((~c.isnan()).sum()) for c in result.candidate_scores)
    return {
        "method": method,
        "budget": budget,
        "wall_s": wall,
        "step_s": result.step_seconds,
        "step_cpu_s": cpu,
        "mean_step_s": sum(result.step_seconds) / len(result.step_seconds),
        "mean_step_cpu_s": sum(cpu) / len(cpu),
        "per_candidate_s": sum(result.step_seconds) / candidates,
        "loadavg_before": before,
        "loadavg_after": loadavg(),
        "result": result,
    }


def same_choices(a, b, tol: float = 1e-6) -> dict:
    """Whether two searches chose the same heads; a different choice counts as the same when the
    two heads' scores tie within ``tol`` in both candidate maps."""
    worst = 0.0
    for t in range(min(a.steps, b.steps)):
        ca, cb = a.candidate_scores[t], b.candidate_scores[t]
        worst = max(worst, float((ca - cb).abs().nan_to_num(0).max()))
        if a.order[t] != b.order[t]:
            tie = all(abs(float(c[a.order[t]]) - float(c[b.order[t]])) <= tol for c in (ca, cb))
            return {"same": tie, "first_difference": t, "max_candidate_score_difference": worst}
    return {"same": True, "first_difference": None, "max_candidate_score_difference": worst}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n-id", type=int, default=512)
    parser.add_argument("--n-ood", type=int, default=512)
    parser.add_argument("--steps", type=int, default=3, help="greedy steps timed for both methods")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument(
        "--full", action="store_true", help="also time a budget-24 CircAvg search (fast)"
    )
    parser.add_argument("--full-budget", type=int, default=24)
    parser.add_argument(
        "--no-compare", action="store_true", help="skip plain vs fast (with --full: time only that)"
    )
    parser.add_argument(
        "--random-init",
        action="store_true",
        help="use a random model even if the checkpoint exists",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="a registry model (e.g. minilm-sentiment) with its default benchmark's search data "
        "instead of the default ViT checkpoint",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.model:
        model, model_note, data, id_note, ood_note = load_named(args.model, args.n_id, args.n_ood)
        id_x, id_y, ood_x = data
    else:
        model, model_note = load_model(args.random_init)
        id_x, id_y, ood_x, ood_note = load_inputs(args.n_id, args.n_ood)
        data = (id_x, id_y, ood_x)
        id_note = f"{len(id_x)} Fashion-MNIST validation"
    text = not id_x.is_floating_point()
    report = {
        "model": model_note,
        "ood": ood_note,
        "n_id": len(id_x),
        "n_ood": len(ood_x),
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "cpu_rows_per_pass": cpu_rows_per_pass(),
        "flops": (
            text_flops(model, torch.cat([id_x, ood_x]), args.batch_size) if text else flops(model)
        ),
    }
    say = (lambda *a: None) if args.json else (lambda *a: print(*a, flush=True))
    f = report["flops"]
    say(f"model: {model_note}; ID: {id_note}; OOD: {len(ood_x)} ({ood_note})")
    say(
        f"torch {torch.__version__}, {report['threads']} threads on {report['cpus']} CPUs, "
        f"fast passes of <= {report['cpu_rows_per_pass']} token rows, batch_size {args.batch_size}"
    )
    say(
        f"FLOPs per candidate and sample: plain {f['plain_per_candidate'] / 1e6:.1f} M, fast "
        f"{f['fast_per_candidate'] / 1e6:.1f} M (mean over layers) -> ratio {f['ratio']:.2f}"
    )
    say(
        f"{'method':<8}{'steps':>6}{'s/step':>10}{'CPU s/step':>12}{'ms/candidate':>14}"
        f"{'load before/after':>20}"
    )
    if not args.no_compare:
        runs = []
        for method in ("fast", "plain", "fast"):  # fast twice: drift in the machine's load shows
            r = run(model, data, method, args.steps, args.batch_size)
            runs.append(r)
            say(
                f"{r['method']:<8}{r['budget']:>6}{r['mean_step_s']:>10.2f}{r['mean_step_cpu_s']:>12.2f}"
                f"{1000 * r['per_candidate_s']:>14.1f}"
                f"{r['loadavg_before']:>12.2f} / {r['loadavg_after']:.2f}"
            )
        fast, plain, fast_again = runs
        report["choices"] = same_choices(fast["result"], plain["result"])
        report["runs"] = [{k: v for k, v in r.items() if k != "result"} for r in runs]
        report["speedup"] = plain["mean_step_s"] / (
            (fast["mean_step_s"] + fast_again["mean_step_s"]) / 2
        )
        report["speedup_cpu"] = plain["mean_step_cpu_s"] / (
            (fast["mean_step_cpu_s"] + fast_again["mean_step_cpu_s"]) / 2
        )
        report["order"] = fast["result"].labels()
        c = report["choices"]
        say(
            f"speed-up (plain / mean of the fast runs): {report['speedup']:.2f}x wall, "
            f"{report['speedup_cpu']:.2f}x CPU time; same choices: {c['same']} "
            f"(max candidate score difference {c['max_candidate_score_difference']:.2e}); "
            f"order: {' '.join(report['order'])}"
        )
    if args.full:
        full = run(model, data, "fast", args.full_budget, args.batch_size)
        report["full"] = {k: v for k, v in full.items() if k != "result"}
        report["full"]["final_accuracy"] = full["result"].accuracy[-1]
        report["full"]["final_auroc"] = full["result"].auroc[-1]
        r = report["full"]
        say(
            f"budget-{args.full_budget} CircAvg search (fast): {r['wall_s']:.1f} s wall, "
            f"{r['mean_step_s']:.2f} s/step ({r['mean_step_cpu_s']:.2f} CPU s/step), "
            f"load {r['loadavg_before']:.2f} -> {r['loadavg_after']:.2f}; "
            f"accuracy {r['final_accuracy']:.4f}, AUROC {r['final_auroc']:.4f} after removal"
        )
        if text:  # how far the search is from what this machine's matmuls allow
            from hydra_core.models.adapter import family_of

            layout = head_layout(model)
            hidden = family_of(model).cost_sizes(model).mlp_hidden
            needed = search_flops(
                model, torch.cat([id_x, ood_x]), full["result"].order, args.batch_size
            )
            rate = matmul_rate(cpu_rows_per_pass(), layout.embed_dim, hidden)
            r.update(flop=needed, flop_per_s=needed / r["wall_s"], matmul_flop_per_s=rate)
            r["lower_bound_s"] = needed / rate
            say(
                f"it computed {needed / 1e12:.1f} TFLOP ({r['flop_per_s'] / 1e9:.0f} GFLOP/s); "
                f"this machine's fp32 matmul rate ({cpu_rows_per_pass()} x {layout.embed_dim} "
                f"@ {layout.embed_dim} x {hidden}) is {rate / 1e9:.0f} GFLOP/s, so the search "
                f"needs at least {r['lower_bound_s']:.0f} s here"
            )
    if args.json:
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
