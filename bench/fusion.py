"""Benchmark the fused Hydra model against a single model, the pruned members one after another
and Deep Ensembles (full models one after another).

M = 3 members, each keeping 2/3 of the heads of every layer, chosen with a different seed per
member; random weights. Shapes: the default model (28 px, patch 7, d 192, depth 6, 12 heads, MLP
ratio 2), ViT-S/16 and ViT-B/16 (224 px), and a text encoder of MiniLM's shape (``minilm``: BERT,
6 layers x 12 heads, hidden 384, MLP 1536, vocabulary 30522; 64 tokens per sentence, no padding).
Batch sizes 1, 4 and 64; fp32 on the CPU, and on a GPU fp32 and bf16 autocast too. Latency is the
median of round-robin repeats (all rows take turns, so drifts in machine load hit them alike); each
cell gets a time budget, and a cell whose first round already exceeds it is reported from that one
round.

OpenCLIP image towers (``--clip``): open_clip's own ViT-B-32 architecture (``clip_b32``: 224 px,
patch 32, 12 layers x 12 heads, d 768; ``open_clip.create_model("ViT-B-32").visual``, random
weights, nothing downloaded) at batch 32, or with ``--quick`` ViT-S-32 (``clip_s32``: 6 heads,
d 384) at batch 8. Rows: the tower, its pruned members one by one (``prune_heads``) and the fused
Hydra (image embeddings (B, M, D)); no Deep Ensembles.

    python bench/fusion.py                    # all but CLIP (13 minutes on a quiet 2-core CPU)
    python bench/fusion.py --quick            # the default model only, short budgets
    python bench/fusion.py --text             # the text encoder (MiniLM's shape) only
    python bench/fusion.py --clip             # open_clip ViT-B-32, batch 32
    python bench/fusion.py --clip --quick     # open_clip ViT-S-32, batch 8, short budgets
    python bench/fusion.py --json             # JSON instead of a table
    python bench/fusion.py --quick --onnx     # + onnxruntime rows (CPU provider) beside torch's
    python bench/fusion.py --malloc-no-trim   # glibc keeps freed memory (as jemalloc would)

``--onnx`` adds, on the CPU, every row again as onnxruntime runs it (CPU provider, as many
intra-op threads as torch has): each model exported the way ``python -m hydra_core export`` writes
it (hydra_core.export.onnx; a single model or a member is a Hydra of one member keeping its heads),
timed in the same round-robin as the torch rows; the fused graph's member logits are checked
against torch's first.

On glibc, freeing activations of several MB returns them to the OS and the next forward pays page
faults to get them back; this hits the fused model's large (M x batch) activations hardest.
``--malloc-no-trim`` switches that off for every row alike (mallopt), to show the effect.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch
import transformers
from timm.models.vision_transformer import VisionTransformer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hydra_core.hydra import fuse_members  # noqa: E402
from hydra_core.hydra.cost import cost_table, forward_fn, measure_latencies  # noqa: E402
from hydra_core.models.adapter import head_layout, prune_heads  # noqa: E402
from hydra_core.models.text import TextClassifier, pack  # noqa: E402
from hydra_core.zoo.default import VitConfig  # noqa: E402

ONNX_SUFFIX = " (onnxruntime)"

SHAPES = {
    "default": asdict(VitConfig()),
    "vit_s16": dict(
        img_size=224,
        patch_size=16,
        in_chans=3,
        num_classes=1000,
        embed_dim=384,
        depth=12,
        num_heads=6,
        mlp_ratio=4.0,
    ),
    "vit_b16": dict(
        img_size=224,
        patch_size=16,
        in_chans=3,
        num_classes=1000,
        embed_dim=768,
        depth=12,
        num_heads=12,
        mlp_ratio=4.0,
    ),
}
#: Hugging Face BERT configurations (random weights), run on TEXT_TOKENS tokens per sentence
TEXT_SHAPES = {
    "minilm": dict(
        vocab_size=30522,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
        num_labels=2,
    ),
}
TEXT_TOKENS = 64
#: open_clip model configurations (image towers with random weights) and their batch sizes
CLIP_SHAPES = {
    "clip_s32": dict(model="ViT-S-32", img_size=224, batches=(8,)),
    "clip_b32": dict(model="ViT-B-32", img_size=224, batches=(32,)),
}
BATCHES = (1, 4, 64)
MEMBERS = 3


def member_masks(depth: int, heads: int) -> list[torch.Tensor]:
    """M masks keeping 2/3 of each layer's heads, drawn with seed m for member m."""
    masks = []
    for seed in range(MEMBERS):
        g = torch.Generator().manual_seed(seed)
        keep = torch.zeros(depth, heads, dtype=torch.bool)
        for layer in range(depth):
            keep[layer, torch.randperm(heads, generator=g)[: 2 * heads // 3]] = True
        masks.append(keep)
    return masks


def build(shape: str) -> dict[str, list[torch.nn.Module]]:
    """The models of every row, with random weights (eval mode, CPU); text models wrapped in a
    TextClassifier, so that every row takes the same packed token ids. An OpenCLIP tower has no
    Deep Ensembles row."""
    torch.manual_seed(0)  # the M models are Deep Ensembles' members; the first is the single one
    if shape in CLIP_SHAPES:
        import open_clip

        visual = open_clip.create_model(CLIP_SHAPES[shape]["model"]).visual.eval()
        blocks = visual.transformer.resblocks
        masks = member_masks(len(blocks), int(blocks[0].attn.num_heads))
        return {
            "single": [visual],
            "members one by one": [prune_heads(visual, k).eval() for k in masks],
            "Hydra fused": [fuse_members([(visual, k) for k in masks]).eval()],
        }
    if shape in TEXT_SHAPES:
        config = transformers.BertConfig(**TEXT_SHAPES[shape])
        hf = [transformers.BertForSequenceClassification(config) for _ in range(MEMBERS)]
        models = [TextClassifier(m.eval()) for m in hf]
        depth, heads = config.num_hidden_layers, config.num_attention_heads
    else:
        cfg = SHAPES[shape]
        models = [VisionTransformer(**cfg).eval() for _ in range(MEMBERS)]
        depth, heads = cfg["depth"], cfg["num_heads"]
    masks = member_masks(depth, heads)
    return {
        "single": models[:1],
        "members one by one": [prune_heads(models[0], k).eval() for k in masks],
        "Hydra fused": [fuse_members([(models[0], k) for k in masks]).eval()],
        "Deep Ensembles": models,
    }


def inputs_for(shape: str, batch: int, device: torch.device) -> torch.Tensor:
    """Random images, or random token ids packed with an all-ones attention mask (B, 2, T)."""
    g = torch.Generator().manual_seed(batch)
    if shape in TEXT_SHAPES:
        ids = torch.randint(TEXT_SHAPES[shape]["vocab_size"], (batch, TEXT_TOKENS), generator=g)
        return pack(ids).to(device)
    cfg = CLIP_SHAPES[shape] if shape in CLIP_SHAPES else SHAPES[shape]
    size = (batch, cfg.get("in_chans", 3), cfg["img_size"], cfg["img_size"])
    return torch.randn(size, generator=g).to(device)


@torch.inference_mode()
def fusion_error(rows: dict[str, list[torch.nn.Module]], shape: str) -> float:
    """Largest |fused - member| output difference (fp32, CPU, 2 inputs): the fusion is exact."""
    x = inputs_for(shape, 2, torch.device("cpu"))
    fused = rows["Hydra fused"][0](x)
    return max(
        (fused[:, m] - member(x)).abs().max().item()
        for m, member in enumerate(rows["members one by one"])
    )


def onnx_rows(rows: dict[str, list[torch.nn.Module]], folder: Path) -> dict[str, list]:
    """Every row's models as onnxruntime sessions (CPU provider, torch's thread count): each
    exported by hydra_core.export.onnx as ``export`` writes it, a model that is no Hydra as a
    Hydra of one member keeping all its heads."""
    from hydra_core.export.onnx import export_onnx, onnx_session

    sessions = {}
    for name, models in rows.items():
        sessions[name] = []
        for i, model in enumerate(models):
            hydra = model
            if not hasattr(model, "kept_heads"):
                hydra = fuse_members([(model, head_layout(model).all_kept())])
            path = folder / f"{name.replace(' ', '_')}_{i}.onnx"
            export_onnx(hydra, path, check=False)
            sessions[name].append(onnx_session(path, threads=torch.get_num_threads()))
    return sessions


def onnx_inputs(session, x: torch.Tensor) -> dict:
    """The session's feed for ``x``: images, or packed token ids split into ids and mask."""
    names = [i.name for i in session.get_inputs()]
    parts = (x[:, 0], x[:, 1]) if len(names) == 2 else (x,)
    return {n: t.contiguous().numpy() for n, t in zip(names, parts, strict=True)}


def onnx_fn(sessions: list, x: torch.Tensor):
    """A function of no arguments that runs ``sessions`` one after another on ``x``."""
    feeds = [onnx_inputs(s, x) for s in sessions]

    def run() -> list:
        return [s.run(None, feed) for s, feed in zip(sessions, feeds, strict=True)]

    return run


def onnx_error(sessions: dict[str, list], rows: dict, shape: str) -> float:
    """Largest |onnxruntime - torch| member-logit difference of the fused model (2 inputs)."""
    x = inputs_for(shape, 2, torch.device("cpu"))
    with torch.inference_mode():
        expected = forward_fn(rows["Hydra fused"], x)()[0]
    got = torch.from_numpy(onnx_fn(sessions["Hydra fused"], x)()[0][0])
    return float((got - expected).abs().max())


def time_cell(fns: dict, device: torch.device, budget_s: float, max_repeats: int) -> dict:
    """Round-robin latency within about ``budget_s``. The first round warms up and tells how long a
    round takes; then as many rounds as fit the budget (at least 2) are timed. A cell whose first
    round alone exceeds the budget is reported from that round (``warm`` False)."""
    first = measure_latencies(fns, warmup=0, repeats=1, device=device)
    round_s = sum(t["median_ms"] for t in first.values()) / 1e3
    if round_s > budget_s:
        return {name: {**t, "warm": False} for name, t in first.items()}
    repeats = max(2, min(max_repeats, int((budget_s - round_s) / round_s)))
    timed = measure_latencies(fns, warmup=0, repeats=repeats, device=device)
    return {name: {**t, "warm": True} for name, t in timed.items()}


def malloc_no_trim() -> bool:
    """Ask glibc to keep freed memory (no trimming, no mmap for large blocks); False elsewhere."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    return bool(libc.mallopt(m_trim_threshold, 2**30) and libc.mallopt(m_mmap_threshold, 2**30))


def settings() -> list[tuple[str, torch.dtype | None]]:
    out = [("cpu", None)]
    if torch.cuda.is_available():
        out += [("cuda", None), ("cuda", torch.bfloat16)]
    return out


def run(
    shapes: list[str],
    batches: list[int] | None,
    budget_s: float,
    max_repeats: int,
    log=print,
    onnx_folder: Path | None = None,
) -> tuple[list[dict], dict]:
    """Time every shape at ``batches`` (None: an OpenCLIP shape's own, BATCHES for the rest);
    with ``onnx_folder``, onnxruntime rows too (their files written there)."""
    results = []
    for shape in shapes:
        rows = build(shape)
        shape_batches = batches or CLIP_SHAPES.get(shape, {}).get("batches", BATCHES)
        error = fusion_error(rows, shape)
        # params and one image's multiply-adds; a batch's are one image's times the batch size
        cost = cost_table(rows, inputs_for(shape, 1, torch.device("cpu")), latency=False)
        log(f"# {shape}: fused vs members max |output difference| {error:.2e}")
        sessions = {}
        if onnx_folder is not None:
            sessions = onnx_rows(rows, onnx_folder)
            log(
                f"# {shape}: onnxruntime vs torch, fused, max |difference| "
                f"{onnx_error(sessions, rows, shape):.2e}"
            )
        for device_name, dtype in settings():
            device = torch.device(device_name)
            on_device = {name: [m.to(device) for m in models] for name, models in rows.items()}
            precision = "bf16-autocast" if dtype else "fp32"
            for batch in shape_batches:
                x = inputs_for(shape, batch, device)
                fns = {
                    name: forward_fn(models, x, autocast_dtype=dtype)
                    for name, models in on_device.items()
                }
                if device_name == "cpu":  # onnxruntime's CPU provider, fp32
                    fns.update({n + ONNX_SUFFIX: onnx_fn(s, x) for n, s in sessions.items()})
                start = time.perf_counter()
                timing = time_cell(fns, device, budget_s, max_repeats)
                for name in fns:
                    t = timing[name]
                    results.append(
                        {
                            "shape": shape,
                            "device": device_name,
                            "precision": precision,
                            "batch": batch,
                            "row": name,
                            "params": int(cost.loc[name.removesuffix(ONNX_SUFFIX), "params"]),
                            "macs": int(cost.loc[name.removesuffix(ONNX_SUFFIX), "macs"]) * batch,
                            "latency_ms": t["median_ms"],
                            "iqr_ms": t["iqr_ms"],
                            "min_ms": t["min_ms"],
                            "repeats": t["repeats"],
                            "warm": t["warm"],
                            "max_abs_fusion_error": error,
                        }
                    )
                cell = {r["row"]: r for r in results[-len(fns) :]}
                fused, single = cell["Hydra fused"], cell["single"]
                members = cell["members one by one"]
                onnx = ""
                if "Hydra fused" + ONNX_SUFFIX in cell:
                    ort = {n: cell[n + ONNX_SUFFIX]["latency_ms"] for n in rows}
                    onnx = (
                        f"  onnxruntime: fused/torch fused "
                        f"{ort['Hydra fused'] / fused['latency_ms']:.3f}, fused/single "
                        f"{ort['Hydra fused'] / ort['single']:.3f}"
                    )
                log(
                    f"{shape:8s} {device_name:4s} {precision:13s} B={batch:<3d} "
                    f"fused/members {fused['latency_ms'] / members['latency_ms']:.3f}  "
                    f"fused/single {fused['latency_ms'] / single['latency_ms']:.3f}  "
                    f"(MACs {fused['macs'] / single['macs']:.3f}){onnx}  "
                    f"[{fused['repeats']} rounds, {time.perf_counter() - start:.0f} s]"
                )
            for models in on_device.values():
                for m in models:
                    m.to("cpu")
    return results, environment()


def environment() -> dict:
    env = {
        "torch": torch.__version__,
        "onnxruntime": importlib.metadata.version("onnxruntime"),
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }
    try:
        env["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        env["loadavg"] = None
    return env


def summary_table(results: list[dict]) -> pd.DataFrame:
    """One line per row and cell, with the ratios the issue asks for next to each other."""
    table = pd.DataFrame(results)
    keys = ["shape", "device", "precision", "batch"]
    single = table[table.row == "single"].set_index(keys)[["latency_ms", "macs"]]
    members = table[table.row == "members one by one"].set_index(keys)[["latency_ms"]]
    table = table.join(single.add_prefix("single_"), on=keys)
    table = table.join(members.add_prefix("members_"), on=keys)
    table["latency/single"] = table["latency_ms"] / table["single_latency_ms"]
    table["MACs/single"] = table["macs"] / table["single_macs"]
    table["latency/members"] = table["latency_ms"] / table["members_latency_ms"]
    table["GMACs"] = table["macs"] / 1e9
    table["params_M"] = table["params"] / 1e6
    columns = keys + [
        "row",
        "params_M",
        "GMACs",
        "latency_ms",
        "iqr_ms",
        "repeats",
        "latency/single",
        "MACs/single",
        "latency/members",
    ]
    return table[columns]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="default model only, short budgets")
    parser.add_argument("--text", action="store_true", help="the text shape (minilm) only")
    parser.add_argument(
        "--clip",
        action="store_true",
        help="open_clip ViT-B-32 at batch 32 only (with --quick: ViT-S-32 at batch 8)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--shapes",
        nargs="+",
        choices=sorted(SHAPES) + sorted(TEXT_SHAPES) + sorted(CLIP_SHAPES),
        help="default: all but CLIP (with --quick: the default model; with --text: minilm; "
        "with --clip: clip_b32, or clip_s32 with --quick)",
    )
    parser.add_argument(
        "--batches",
        nargs="+",
        type=int,
        default=None,
        help=f"default {' '.join(map(str, BATCHES))} (CLIP: 32, quick 8)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="time budget per cell in seconds (default 40, quick 8)",
    )
    parser.add_argument("--max-repeats", type=int, default=50)
    parser.add_argument(
        "--onnx",
        action="store_true",
        help="also time every row under onnxruntime (CPU provider), exported as `export` does",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--malloc-no-trim",
        action="store_true",
        help="glibc: keep freed memory instead of returning it to the OS",
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    no_trim = malloc_no_trim() if args.malloc_no_trim else False
    everything = list(SHAPES) + list(TEXT_SHAPES)
    if args.shapes:
        shapes = args.shapes
    elif args.clip:
        shapes = ["clip_s32"] if args.quick else ["clip_b32"]
    else:
        shapes = list(TEXT_SHAPES) if args.text else ["default"] if args.quick else everything
    budget = args.budget_s if args.budget_s is not None else (8.0 if args.quick else 40.0)
    log = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    load_before = environment()["loadavg"]
    with tempfile.TemporaryDirectory() as folder:
        onnx_folder = Path(folder) if args.onnx else None
        results, env = run(shapes, args.batches, budget, args.max_repeats, log, onnx_folder)
    env["loadavg_before"] = load_before
    env["malloc_no_trim"] = no_trim
    if args.json:
        print(json.dumps({"environment": env, "results": results}, indent=1))
        return 0
    print()
    options = ("display.width", 200, "display.max_columns", 20, "display.max_rows", 500)
    with pd.option_context(*options):
        print(summary_table(results).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"\nenvironment: {env}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
