"""The cost and the accuracy of the text fine-tuning recipes (``fast``, ``paper``) on the text
report's fine-tuning: one pruned model of the committed text report (``docs/report/text/
members.json``, Taylor-36 by default: 6 of 12 heads kept in every layer of minilm-sentiment)
fine-tuned with each recipe on the Rotten Tomatoes training sentences, as
:func:`~hydra_core.report.text.run_text_report` does, then scored on the report's ID test items
(all 1,500 Rotten Tomatoes test sentences).

    nice -n 10 python scripts/measure_text_recipe.py --recipes fast paper --threads 1

prints, per recipe: steps, epochs run (and whether early stopping ended the run), wall and CPU
seconds per epoch (training steps and validation; CPU seconds of this process, the time an idle
core takes at one thread, where the wall time on a shared machine is mostly its load), the
validation accuracy of every epoch and the chosen one, and the test accuracy; a progress line at
every 25th step and every epoch's end; ``--json`` writes the results to a file. Nothing is
cached: every run trains.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's hydra_core, whatever is installed
MEMBERS = ROOT / "docs" / "report" / "text" / "members.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", nargs="+", default=["fast", "paper"])
    parser.add_argument("--member", default="Taylor-36", help="a member of --masks")
    parser.add_argument("--masks", default=str(MEMBERS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=None, help="override the recipe's epochs")
    parser.add_argument("--n-train", type=int, default=None, help="override the recipe's n_train")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    import hydra_core.training.top as top
    from hydra_core.data.text import load_rotten_tomatoes
    from hydra_core.evaluate import callable_model
    from hydra_core.inference import predict
    from hydra_core.models.adapter import head_layout
    from hydra_core.training.top import finetune_top, top_recipe
    from hydra_core.zoo.registry import load_model

    def epoch_line(epoch) -> None:  # every epoch's validation as it ends, not only at the end
        scores = {k: round(v, 4) for k, v in epoch.scores.items()}
        print(f"  epoch {epoch.epoch}: {epoch.steps} steps, validation {scores}", flush=True)

    train = top.train
    top.train = lambda *a, **k: train(*a, **k, on_epoch=epoch_line)
    loaded = load_model("minilm-sentiment")
    layout = head_layout(loaded.model)
    member = next(m for m in json.loads(Path(args.masks).read_text())["members"]
                  if m["name"] == args.member)  # fmt: skip
    keep = torch.zeros(len(layout.num_heads), max(layout.num_heads), dtype=torch.bool)
    for layer, heads in member["keep"].items():
        keep[int(layer), heads] = True
    train_set, test = load_rotten_tomatoes("train"), load_rotten_tomatoes("test")
    results = []
    for name in args.recipes:
        config = top_recipe(name)
        overrides = {"epochs": args.epochs, "n_train": args.n_train}
        config = replace(config, **{k: v for k, v in overrides.items() if v is not None})
        started, cpu, load = time.perf_counter(), time.process_time(), os.getloadavg()[0]
        marks = []
        epochs = 1 if config.steps else config.epochs

        def progress(
            done: int, total: int, marks=marks, started=started, name=name, cpu=cpu, epochs=epochs
        ) -> None:
            # wall and CPU seconds of this process (CPU: what an idle core would take, at 1
            # thread; the machine is shared, so wall time is mostly the load)
            marks.append((done, time.perf_counter() - started, time.process_time() - cpu))
            if done % 25 == 0 or done == total or done % (total // epochs) == 0:
                print(
                    f"{name}: step {done}/{total} ({marks[-1][1]:.0f} s wall, {marks[-1][2]:.0f} "
                    f"s CPU, load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )

        tuned = finetune_top(
            loaded.model,
            train_set,
            config,
            preprocess=loaded.preprocess,
            keep=keep,
            seed=0,
            name=args.member,
            progress=progress,
        )
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
        logits = predict(callable_model(tuned.model), test.inputs, loaded.preprocess)
        accuracy = float((logits.argmax(-1) == test.labels).float().mean())
        steps = [h for h in tuned.history if "step" in h]
        ends = [h for h in steps if "val_accuracy" in h]
        chosen = next((h for h in tuned.history if "chosen_epoch" in h), {})
        row = {
            "recipe": name,
            "config": asdict(config),
            "member": args.member,
            "steps": len(steps),
            "epochs_run": len(ends) or (config.epochs if config.steps is None else None),
            "stopped_early": bool(chosen.get("stopped_early")),
            "chosen_epoch": chosen.get("chosen_epoch"),
            "validation_accuracy_per_epoch": [h["val_accuracy"] for h in ends],
            "validation_nll_per_epoch": [h["val_nll"] for h in ends],
            "seconds": round(seconds, 1),
            "seconds_in_loop": round(tuned.seconds, 1),
            "cpu_seconds": round(cpu_seconds, 1),
            "test_accuracy": accuracy,
            "test_items": len(test),
            "threads": args.threads,
            "load_average": [round(load, 2), round(os.getloadavg()[0], 2)],
        }
        if row["epochs_run"]:
            row["seconds_per_epoch"] = round(tuned.seconds / row["epochs_run"], 1)
            row["cpu_seconds_per_epoch"] = round(cpu_seconds / row["epochs_run"], 1)
        results.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "config"}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
