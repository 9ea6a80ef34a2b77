"""Seconds per optimiser step of the efficient ensembles (docs/baselines.md, "Cost on this
machine"), against the single default ViT, at each recipe's batch size:

    nice -n 10 python scripts/time_efficient_ensembles.py --steps 6 --threads 1

One untimed step, then ``--steps - 1`` timed ones per system (medians): wall seconds and the
process's CPU seconds (what one idle core would take). Fashion-MNIST training images, AdamW; the
from-scratch systems freshly initialised, BatchEnsemble and the LoRA member on the shipped ViT.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from hydra_core.baselines import efficient
from hydra_core.baselines.batch_ensemble import batch_ensemble
from hydra_core.baselines.lora import lora_member
from hydra_core.baselines.mimo import mimo_batch
from hydra_core.data.fashion_mnist import load_fashion_mnist
from hydra_core.zoo.default import VitConfig, build_vit, load_default_model, preprocess


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    train = load_fashion_mnist("train")

    def timed(name, model, parameters, batch, step) -> None:
        optimizer = torch.optim.AdamW(list(parameters), lr=1e-4)
        model.train()
        times = []
        for i in range(args.steps):
            x, y = (
                train.images[i * batch : (i + 1) * batch],
                train.labels[i * batch : (i + 1) * batch],
            )
            wall, cpu = time.perf_counter(), time.process_time()
            logits, labels = step(model, preprocess(x), y)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            times.append((time.perf_counter() - wall, time.process_time() - cpu))
        walls = statistics.median(t for t, _ in times[1:])
        cpus = statistics.median(c for _, c in times[1:])
        print(f"{name}: {walls:.3f} s/step wall, {cpus:.3f} s/step CPU (batch {batch})", flush=True)

    plain = lambda m, x, y: (m(x), y)  # noqa: E731
    single = build_vit(VitConfig())
    timed("single ViT", single, single.parameters(), 128, plain)
    settings = efficient.EfficientSettings()
    packed = efficient.build_scratch(efficient.PACKED, VitConfig(), settings)
    timed(
        "packed-ensembles",
        packed,
        packed.parameters(),
        128,
        lambda m, x, y: (m(x).reshape(-1, 10), y.repeat_interleave(settings.estimators)),
    )
    mimo = efficient.build_scratch(efficient.MIMO, VitConfig(), settings)

    def mimo_step(m, x, y):
        xs, ys = mimo_batch(x, y, settings.estimators, settings.rho, settings.batch_repeat, 0)
        return m.grouped(xs), ys

    timed("mimo", mimo, mimo.parameters(), 128, mimo_step)
    base = load_default_model()
    be = batch_ensemble(base, settings.estimators)
    trained = [p for n, p in be.named_parameters() if not efficient._embedding(n)]
    timed("batch-ensemble", be, trained, efficient.FINETUNE.batch_size, plain)
    member = lora_member(base, 0)
    adapters = [p for p in member.parameters() if p.requires_grad]
    timed("lora member", member, adapters, 128, lambda m, x, y: (m.base_model.model(x), y))


if __name__ == "__main__":
    main()
