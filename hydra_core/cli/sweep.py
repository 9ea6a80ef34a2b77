"""The ``sweep`` command: the paper's sweeps (heads removed per layer, members, corruptions) on the
default model, into results/sweep/<kind> (see :mod:`hydra_core.report.sweeps`)."""

from __future__ import annotations

import argparse

import hydra_core.cli.options as options
from hydra_core.cli.common import add_output_arguments, command, stage_bars
from hydra_core.errors import InputError


def _sweep_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kind",
        required=True,
        choices=("layers", "members", "corruption"),
        help="layers: Taylor and CircAvg at 2/4/6/8 heads removed per layer, zero-shot and "
        "fine-tuned (paper B.3); members: Hydra with M = 2..5 (Table 10); corruption: corrupted "
        "ID data at 5 severities (Tables 13-14)",
    )
    p.add_argument("--task", choices=("image", "text"), default="image", help="image or text")
    p.add_argument("--quick", action="store_true", help="small subsets, two or three points")
    p.add_argument("--model", default=None, help="model source (default: the task's default)")
    p.add_argument("--device", type=options.device, default=None, help="auto, cpu or cuda")
    p.add_argument(
        "--n-search", type=options.positive_int, default=None, help="items per search part"
    )
    p.add_argument(
        "--n-report", type=options.positive_int, default=None, help="items per report part"
    )
    p.add_argument(
        "--n-corrupt",
        type=options.positive_int,
        default=None,
        help="corruption: ID report items per corrupted set (default 1000)",
    )
    p.add_argument(
        "--points",
        type=options.positive_int,
        nargs="+",
        default=None,
        help="layers: heads removed per layer (default 2 4 6 8); members: M (default 2 3 4 5)",
    )
    p.add_argument(
        "--corruptions",
        nargs="+",
        default=None,
        metavar="NAME",
        help="corruption: which (default: all)",
    )
    p.add_argument("--no-finetune", action="store_true", help="zero-shot systems only")
    p.add_argument("--no-deep-ensemble", action="store_true", help="leave Deep Ensembles out")
    add_output_arguments(
        p,
        "results/sweep/<kind>; the committed docs/report/sweeps/<kind> (text: "
        "docs/report/sweeps/text/<kind>) only when named, with --overwrite",
    )


@command("sweep", _sweep_arguments)
def _sweep(args: argparse.Namespace) -> int:
    """The paper's sweeps with 95% intervals: CSV, plot (PNG, SVG) and Markdown."""
    from tqdm import tqdm

    from hydra_core.report.sweep_config import sweep_config_from_args
    from hydra_core.report.sweeps import run_sweep

    only = {"--points": ("layers", "members"), "--n-corrupt": ("corruption",)}
    only["--corruptions"] = ("corruption",)
    given = {"--points": args.points, "--n-corrupt": args.n_corrupt}
    given["--corruptions"] = args.corruptions
    for option, kinds in only.items():
        if given[option] is not None and args.kind not in kinds:
            raise InputError(f"{option} applies to --kind {' or '.join(kinds)}, not {args.kind}")
    points = tuple(args.points) if args.points else None
    overrides = dict(
        task=args.task,
        model=args.model,
        device=args.device,
        n_search=args.n_search,
        n_report=args.n_report,
        n_corrupt=args.n_corrupt,
        corruptions=tuple(args.corruptions) if args.corruptions else None,
        removed_per_layer=points if args.kind == "layers" else None,
        members=points if args.kind == "members" else None,
    )
    config = sweep_config_from_args(args.quick, **overrides)
    if args.no_finetune:
        config = config.without("finetune")
    if args.no_deep_ensemble:
        config = config.without("deep_ensemble")
    run_sweep(
        args.kind, config, args.out, progress=stage_bars(), log=tqdm.write, overwrite=args.overwrite
    )
    return 0
