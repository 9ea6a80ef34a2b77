"""The ``heads`` command: which heads drive OOD separation, and how sure (per-head evidence with 95%
intervals over the report data, :mod:`hydra_core.analysis.evidence`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import hydra_core.cli.options as options
from hydra_core.analysis.inputs import REPORT_SAMPLE
from hydra_core.cli.common import (
    SAME_DATA,
    add_data_arguments,
    add_model_arguments,
    add_output_arguments,
    claim_output,
    command,
    load_for_cli,
    stage_bars,
    warn,
    warn_near_chance,
    write_csv,
    write_json,
)
from hydra_core.outputs import data_identity

#: the columns of heads.csv, in order
CSV_COLUMNS = (
    "label",
    "layer",
    "head",
    *(
        f"{key}{suffix}"
        for key in ("delta_auroc", "delta_accuracy", "detector_auroc")
        for suffix in ("", "_lo", "_hi", "_significant")
    ),
    "keep_frequency",
    "rank_delta_auroc",
    "rank_detector_auroc",
    "rank_keep_frequency",
    "mean_rank",
    "agreed_rank",
    "disagreement",
    "disagrees",
)
#: the columns ``--attribution`` adds after them: the first-order (AtP) estimates of delta_auroc
#: and delta_accuracy, beside the exact ablation's
ATTRIBUTION_COLUMNS = ("atp_delta_auroc", "atp_delta_accuracy")


def _heads_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    add_data_arguments(p, n_report=REPORT_SAMPLE)
    add_output_arguments(p, "results/heads")
    p.add_argument(
        "--boot",
        type=options.boot,
        default=1000,
        help="bootstrap resamples of the report data per interval (default: %(default)s)",
    )
    p.add_argument(
        "--seed", type=options.seed, default=0, help="bootstrap seed (default: %(default)s)"
    )
    p.add_argument(
        "--stability",
        default=None,
        metavar="PATH",
        help="a stability result (JSON, format hydra-stability) of this model: the share of its "
        "resamples that kept each head (1 - removal frequency) joins the evidence and the "
        "ranking, higher = more important",
    )
    p.add_argument(
        "--attribution",
        action="store_true",
        help="add the attribution estimates (AtP, one forward and a few backward passes) of "
        "ΔAUROC and Δaccuracy beside the exact ablation's, with their rank agreement (Spearman)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (the dense model, the columns' meaning, the ranking rule, one "
        "entry per head in agreed order) on stdout; everything else goes to stderr",
    )


@command("heads", _heads_arguments)
def _heads(args: argparse.Namespace) -> int:
    """Per-head evidence with 95% intervals: ΔAUROC/Δaccuracy ablated, own-output detector AUROC,
    keep frequency (1 - its removal frequency); the heads ranked by the evidence that agrees."""
    from hydra_core.analysis.evidence import head_evidence, read_stability
    from hydra_core.cache import DiskCache
    from hydra_core.evaluate import resolve_device
    from hydra_core.models.adapter import head_layout

    loaded, benchmark = load_for_cli(args)
    frequency = None
    if args.stability:  # another model's file is refused before any work
        frequency = read_stability(
            args.stability,
            head_layout(loaded.model),
            name=f"--stability {args.stability}",
            model=loaded.identity(),
            data=data_identity(benchmark, "search"),
            hint=SAME_DATA,
            warn=warn,
        )
    device = resolve_device(args.device)
    loaded.model.to(device)
    out = Path(args.out or "results/heads")
    claim_output(args, out, loaded, data_identity(benchmark, "all"))
    preprocess = loaded.preprocess
    report_ood = {s.name: preprocess(s.inputs) for s in benchmark.ood_report}
    summary = sys.stderr if args.json else sys.stdout  # --json: stdout holds the JSON alone
    print(
        f"{loaded.name} on {device}: detectors fitted on {len(benchmark.id_search)} ID search "
        f"samples; {len(benchmark.id_report)} ID report samples and "
        f"{', '.join(f'{len(s)} {s.name}' for s in benchmark.ood_report)}",
        file=sys.stderr,
    )
    found = head_evidence(
        loaded.model,
        preprocess(benchmark.id_search.inputs).to(device),
        benchmark.id_search.labels,
        preprocess(benchmark.id_report.inputs).to(device),
        benchmark.id_report.labels,
        {name: x.to(device) for name, x in report_ood.items()},
        frequency=frequency,
        n_boot=args.boot,
        seed=args.seed,
        batch_size=args.batch_size,
        cache=DiskCache(),
        progress=stage_bars(),
    )
    warn_near_chance(args, loaded, found.dense["accuracy"][0])
    agreement = None
    if args.attribution:
        agreement = _add_attribution(
            found.table,
            loaded.model,
            preprocess(benchmark.id_report.inputs).to(device),
            benchmark.id_report.labels,
            {name: x.to(device) for name, x in report_ood.items()},
            min(args.batch_size, 64),
        )
    columns = [c for c in (*CSV_COLUMNS, *ATTRIBUTION_COLUMNS) if c in found.table]
    write_csv(out / "heads.csv", found.table.sort_values("agreed_rank")[columns], index=False)
    data = {
        **found.to_json(),
        "model": loaded.identity(),
        "data": data_identity(benchmark, "all"),
    }
    if agreement is not None:
        data["attribution"] = agreement
    write_json(out / "heads.json", data)
    print(_summary(found), file=summary)
    if agreement is not None:
        print(
            "attribution (AtP) vs exact ablation, Spearman over the heads: ΔAUROC "
            f"{agreement['spearman_delta_auroc']:.3f}, Δaccuracy "
            f"{agreement['spearman_delta_accuracy']:.3f} (columns atp_delta_auroc, "
            "atp_delta_accuracy)",
            file=summary,
        )
    print(f"wrote {out}/heads.csv, heads.json", file=summary)
    if args.json:
        print(json.dumps(data, indent=2))
    return 0


def _add_attribution(table, model, id_x, id_y, ood_per_set, batch_size: int) -> dict:
    """Add the AtP estimates of ΔAUROC (mean over the report OOD sets) and Δaccuracy to the
    evidence table (columns ``atp_delta_auroc``, ``atp_delta_accuracy``); returns their
    Spearman correlations with the exact columns and what the estimates are."""
    from hydra_core.analysis.attribution import attribution_per_set

    found = attribution_per_set(model, id_x, id_y, ood_per_set, batch_size=batch_size)
    layers, heads = table["layer"].astype(int), table["head"].astype(int)
    agreement = {
        "estimate": "first-order (AtP) change of each score when the head alone is zeroed, "
        "from one forward and a few backward passes over the report data",
    }
    for key in ("delta_auroc", "delta_accuracy"):
        values = found[key].numpy()
        table[f"atp_{key}"] = values[layers.to_numpy(), heads.to_numpy()]
        rho = table[key].corr(table[f"atp_{key}"], method="spearman")
        agreement[f"spearman_{key}"] = None if rho != rho else float(rho)
    return agreement


def _summary(found) -> str:
    """The dense model and the ten heads of best agreed rank, one line each."""
    (acc, acc_lo, acc_hi), (roc, roc_lo, roc_hi) = found.dense["accuracy"], found.dense["auroc"]
    lines = [
        f"dense: accuracy {acc:.4f} [{acc_lo:.4f}, {acc_hi:.4f}], AUROC {roc:.4f} "
        f"[{roc_lo:.4f}, {roc_hi:.4f}] ({found.n_boot} resamples; * = interval excludes "
        "0, or 0.5 for the detector)",
        "rank  head     ΔAUROC [95% CI]               detector AUROC [95% CI]     kept  spread",
    ]
    for row in found.top(10).itertuples():
        ablated = _cell(row, "delta_auroc", signed=True)
        detector = _cell(row, "detector_auroc", signed=False)
        kept = row.keep_frequency
        frequency = "" if kept != kept else f"{kept:.2f}"
        lines.append(
            f"{row.agreed_rank:>4}  {row.label:<7} {ablated}  {detector}  {frequency:>4}  "
            f"{row.disagreement:>6.1f}"
        )
    return "\n".join(lines)


def _cell(row, key: str, *, signed: bool) -> str:
    """``value [lo, hi]`` of one evidence column, ``*`` when the interval excludes the null."""
    value, lo, hi = (getattr(row, f"{key}{s}") for s in ("", "_lo", "_hi"))
    if value != value:  # NaN: a head without this evidence (a text tower's detector)
        return f"{'–':<26}"
    sign = "+" if signed else ""
    mark = "*" if getattr(row, f"{key}_significant") else " "
    return f"{value:{sign}.4f} [{lo:{sign}.4f}, {hi:{sign}.4f}]{mark}"
