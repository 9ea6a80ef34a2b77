"""Parity of the training recipes between two checkouts: every recipe trains the same weights,
bit for bit, with the code of this checkout and with the code of another one (the commit before a
change to the training loop).

    git worktree add /tmp/hydra-old <commit>              # the code to compare against
    python scripts/check_trainer_parity.py --old /tmp/hydra-old            # every short case
    python scripts/check_trainer_parity.py --old /tmp/hydra-old --cases vit finetune
    python scripts/check_trainer_parity.py --old /tmp/hydra-old --new /tmp/hydra-new  # 2 commits
    python scripts/check_trainer_parity.py --compare A.safetensors B.safetensors

Each case runs once per checkout, in a fresh process whose ``hydra_core`` is that checkout's,
with the same thread count, and saves every trained tensor and every training history; the two
runs must agree exactly (``torch.equal``, histories ``==``). The cases are short versions of the
shipped recipes, minutes in all on 2 CPU cores:

- ``vit``: ``train_vit`` with the default recipe (AdamW, warm-up then cosine, flips) and the
  default architecture, 2 epochs on 2,600 Fashion-MNIST training images (42 steps, the last of
  each epoch 40 images), validation and test on 500; ``vit-crop``: the same with the
  random-crop augmentation on; ``vit-epoch`` (only when named, 4 minutes on an idle machine): the
  default recipe for 1 epoch of all 55,000 training images (430 steps, the last of 88 images).
- ``minilm``: ``train_minilm`` (``train-text``), 2 epochs on 400 Rotten Tomatoes sentences,
  validation and test on 200 (epoch choice included).
- ``mpnet``: ``train_mpnet_head`` (``train-text --base mpnet``), 3 epochs on 200 sentences,
  validation and test on 100, the encoder's states computed in a fresh cache.
- ``finetune``: ``finetune_member`` on the shipped default ViT with 24 of 72 heads pruned: the
  default recipe (SGD, cosine to a floor, clipping) for 1.5 epochs of 1,000 images (12 steps,
  the second epoch cut short), and AdamW with weight decay, label smoothing and no clipping for
  7 steps of 5-batch epochs.
- ``finetune-text``: ``finetune_member`` on minilm-sentiment with 12 heads pruned (AdamW, 5
  steps; its dropout draws from the global random state, seeded 0 before the call).
- ``top``: ``finetune_top`` on minilm-sentiment: a pruned copy, top layer trained 2 epochs with
  the epoch chosen on validation sentences; the same for 11 steps (steps mode, across an epoch);
  ``deep_heads`` (fresh heads, shared encoder states) for seeds 0 and 1.

``--compare`` checks two safetensors files tensor by tensor (e.g. a ``train-text --output``
run against the shipped asset).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CASES = ("vit", "vit-crop", "minilm", "mpnet", "finetune", "finetune-text", "top")
#: longer cases, run only when named
LONG_CASES = ("vit-epoch",)


def compare_files(a: str | Path, b: str | Path) -> list[str]:
    """Names of the tensors that differ between two safetensors files (or that one lacks)."""
    from safetensors.torch import load_file

    x, y = load_file(str(a)), load_file(str(b))
    differ = sorted(set(x) ^ set(y))
    differ += [k for k in sorted(set(x) & set(y)) if not torch.equal(x[k], y[k])]
    return differ


# --- the cases (run inside a checkout's process; only names both checkouts have) ---------------


def _zoo(name: str):
    """A shipped model's module (or the registry): ``hydra_core.zoo.<name>``, or
    ``hydra_core.models.<name>`` in a checkout from before ``zoo/``."""
    import hydra_core

    # by the folder, not find_spec: an editable install would find another checkout's zoo/
    zoo = (Path(hydra_core.__file__).parent / "zoo").is_dir()
    return importlib.import_module(f"hydra_core.{'zoo' if zoo else 'models'}.{name}")


def _pruned_mask(layers: int, heads: int, per_layer: int) -> torch.Tensor:
    keep = torch.ones(layers, heads, dtype=torch.bool)
    for layer in range(layers):
        for j in range(per_layer):
            keep[layer, (5 * layer + 3 * j) % heads] = False
    return keep


def _fashion_mnist_subsets(sizes: dict[str, int]):
    """Swap ``load_fashion_mnist`` for one returning the first images of each split."""
    from hydra_core.data import fashion_mnist

    full = fashion_mnist.load_fashion_mnist

    def first(split: str):
        data = full(split)
        return data.subset(torch.arange(sizes[split]))

    fashion_mnist.load_fashion_mnist = first


def _state(prefix: str, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {f"{prefix}/{k}": v.detach().cpu().clone() for k, v in model.state_dict().items()}


def _case_vit(crop: bool = False, full_epoch: bool = False) -> tuple[dict, dict]:
    default = _zoo("default")
    if not full_epoch:
        _fashion_mnist_subsets({"train": 2600, "validation": 500, "test": 500})
    cfg = default.TrainConfig(epochs=1 if full_epoch else 2, pad_crop=2 if crop else 0)
    model, summary = default.train_vit(cfg, default.VitConfig(), log=lambda line: None)
    return _state("vit", model), {"history": summary["history"], "test": summary["test_accuracy"]}


def _case_minilm() -> tuple[dict, dict]:
    minilm = _zoo("minilm")
    cfg = minilm.TextTrainConfig(n_train=400, n_eval=200, epochs=2)
    model, header = minilm.train_minilm(cfg, log=lambda line: None)
    state = minilm.trained_state(model, header["trained"])
    tensors = {f"minilm/{k}": v for k, v in state.items()}
    keys = ("history", "chosen_epoch", "validation_nll", "test_accuracy", "test_nll")
    return tensors, {k: header[k] for k in keys}


def _case_mpnet() -> tuple[dict, dict]:
    from hydra_core.cache import DiskCache

    mpnet = _zoo("mpnet")
    cfg = mpnet.HeadTrainConfig(n_train=200, n_eval=100, epochs=3)
    with tempfile.TemporaryDirectory(prefix="hydra-parity-") as folder:
        model, header = mpnet.train_mpnet_head(cfg, log=lambda line: None, cache=DiskCache(folder))
    keys = ("history", "chosen_epoch", "validation_nll", "test_accuracy", "test_nll")
    return _state("mpnet", model.classifier), {k: header[k] for k in keys}


def _case_finetune() -> tuple[dict, dict]:
    from hydra_core.hydra.finetune import FinetuneConfig, finetune_member

    default = _zoo("default")
    model, preprocess = default.load_default_model(), default.preprocess
    keep = _pruned_mask(6, 12, 4)
    configs = {
        "sgd": FinetuneConfig(n_train=1000, epochs=1.5),
        "adamw": FinetuneConfig(
            optimizer="adamw",
            lr=1e-3,
            weight_decay=0.05,
            label_smoothing=0.1,
            grad_clip=None,
            n_train=600,
            steps=7,
            warmup_steps=2,
        ),
    }
    tensors, meta = {}, {}
    for name, config in configs.items():
        member = finetune_member(model, keep, config, preprocess=preprocess, seed=3)
        tensors.update(_state(f"finetune-{name}", member.model))
        meta[name] = member.history
    return tensors, meta


def _minilm_sentiment():
    from hydra_core.data.text import load_rotten_tomatoes

    loaded = _zoo("registry").load_model("minilm-sentiment")
    train = load_rotten_tomatoes("train")
    validation = load_rotten_tomatoes("validation")
    return loaded, train, validation.subset(torch.arange(0, len(validation), 5))


def _case_finetune_text() -> tuple[dict, dict]:
    from hydra_core.hydra.finetune import FinetuneConfig, finetune_member

    loaded, train, _ = _minilm_sentiment()
    config = FinetuneConfig(optimizer="adamw", lr=1e-4, n_train=64, batch_size=16, steps=5)
    torch.manual_seed(0)  # the members' dropout draws from the global random state
    member = finetune_member(
        loaded.model, _pruned_mask(6, 12, 2), config, preprocess=loaded.preprocess, train_set=train
    )
    return _state("finetune-text", member.model), {"history": member.history}


def _case_top() -> tuple[dict, dict]:
    from hydra_core.baselines.shared_backbone import deep_heads
    from hydra_core.training.top import TopFinetuneConfig, finetune_top

    loaded, train, validation = _minilm_sentiment()
    keep = _pruned_mask(6, 12, 2)
    configs = {
        # warm-ups of 6 and 7 steps: lengths where the float order of the warm-up shows
        "epochs": TopFinetuneConfig(trained_layers=1, epochs=2, n_train=250, warmup=0.4),
        "steps": TopFinetuneConfig(trained_layers=1, steps=11, n_train=250, warmup=0.5),
    }
    tensors, meta = {}, {}
    for name, config in configs.items():
        tuned = finetune_top(
            loaded.model,
            train,
            config,
            preprocess=loaded.preprocess,
            keep=keep,
            validation_set=validation,
            seed=2,
        )
        tensors.update(_state(f"top-{name}", tuned.model))
        meta[name] = tuned.history
    heads = TopFinetuneConfig(
        trained_layers=0, epochs=2, lr=1e-3, n_train=250, warmup=0.45, reinit_head=True
    )
    _, members = deep_heads(
        loaded.model,
        train,
        heads,
        preprocess=loaded.preprocess,
        seeds=[0, 1],
        validation_set=validation,
    )
    for member in members:
        tensors.update(_state(f"deep-heads-{member.seed}", member.model))
        meta[f"deep-heads-{member.seed}"] = member.history
    return tensors, meta


RUNNERS = {
    "vit": _case_vit,
    "vit-crop": lambda: _case_vit(crop=True),
    "vit-epoch": lambda: _case_vit(full_epoch=True),
    "minilm": _case_minilm,
    "mpnet": _case_mpnet,
    "finetune": _case_finetune,
    "finetune-text": _case_finetune_text,
    "top": _case_top,
}


def run_case(case: str, out: Path) -> None:
    """Run ``case`` with the ``hydra_core`` of the checkout this process runs in; save its
    tensors and histories."""
    import hydra_core

    if not Path(hydra_core.__file__).resolve().is_relative_to(Path.cwd().resolve()):
        raise RuntimeError(f"hydra_core comes from {hydra_core.__file__}, not from {Path.cwd()}")
    tensors, meta = RUNNERS[case]()
    torch.save({"tensors": tensors, "meta": json.loads(json.dumps(meta))}, out)


# --- the two checkouts ------------------------------------------------------------------------


def run_in(checkout: Path, case: str, out: Path, threads: int) -> float:
    """Run ``case`` in a fresh process whose ``hydra_core`` is ``checkout``'s; seconds taken."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    env.setdefault("HYDRA_LAB_CACHE", str(ROOT / "cache"))  # the assembled MPNet zip, shared
    command = [sys.executable, __file__, "--run", case, "--out", str(out)]
    start = time.perf_counter()
    subprocess.run([*command, "--threads", str(threads)], cwd=checkout, env=env, check=True)
    return time.perf_counter() - start


def differences(a: dict, b: dict) -> list[str]:
    """What differs between two saved runs: tensor names, then history keys."""
    ta, tb = a["tensors"], b["tensors"]
    out = sorted(set(ta) ^ set(tb))
    out += [k for k in sorted(set(ta) & set(tb)) if not torch.equal(ta[k], tb[k])]
    out += [
        f"history {k}"
        for k in sorted(set(a["meta"]) | set(b["meta"]))
        if a["meta"].get(k) != b["meta"].get(k)
    ]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, help="the checkout to compare against")
    parser.add_argument(
        "--new", type=Path, default=ROOT, help="the checkout compared (default: this one)"
    )
    parser.add_argument("--cases", nargs="+", choices=CASES + LONG_CASES, default=list(CASES))
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--compare", nargs=2, metavar="FILE", help="two safetensors files")
    parser.add_argument("--run", choices=CASES + LONG_CASES, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.run:
        run_case(args.run, args.out)
        return 0
    if args.compare:
        differ = compare_files(*args.compare)
        print("bit for bit" if not differ else f"{len(differ)} tensors differ: {differ[:5]}")
        return 1 if differ else 0
    if args.old is None:
        parser.error("give --old CHECKOUT (or --compare A B)")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="hydra-parity-") as folder:
        for case in args.cases:
            old, new = Path(folder) / f"{case}-old.pt", Path(folder) / f"{case}-new.pt"
            seconds = run_in(args.old.resolve(), case, old, args.threads)
            seconds += run_in(args.new.resolve(), case, new, args.threads)
            a, b = torch.load(old), torch.load(new)
            differ = differences(a, b)
            verdict = "bit for bit" if not differ else f"DIFFER: {', '.join(differ[:4])}"
            print(f"{case:14s} {len(a['tensors']):4d} tensors  {verdict}  ({seconds:.0f} s)")
            failed += bool(differ)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
