"""What the commands share: the command registry, the common arguments, progress bars, loading."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import torch

import hydra_core.cli.options as options
from hydra_core import distributed
from hydra_core.errors import InputError

if TYPE_CHECKING:
    from hydra_core.models.modality import Modality

COMMANDS: dict[
    str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
] = {}


def command(name: str, add_arguments: Callable[[argparse.ArgumentParser], None]):
    """Register ``run(args) -> exit code`` as the sub-command ``name``."""

    def register(run: Callable[[argparse.Namespace], int]):
        COMMANDS[name] = (add_arguments, run)
        return run

    return register


def global_options() -> argparse.ArgumentParser:
    """Options every command (and sub-command) takes, as a parent parser."""
    from hydra_core.cli.options import folder, positive_int

    options = argparse.ArgumentParser(add_help=False)
    g = options.add_argument_group("every command")
    g.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="torch CPU threads, 1 or more (default: torch's choice)",
    )
    g.add_argument(
        "--cache-dir",
        type=folder,
        default=None,
        metavar="PATH",
        help="where computed results are kept (default: $HYDRA_LAB_CACHE, else cache/ in the "
        "checkout)",
    )
    g.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return options


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """--model/--arch/--device: which model to load and where to run it."""
    from hydra_core.models.modality import IMAGE_MODALITY
    from hydra_core.zoo.named import default_model, named_models

    named = ", ".join(f"'{m.name}'" + (f" ({m.note})" if m.note else "") for m in named_models())
    p.add_argument(
        "--model",
        default=default_model(IMAGE_MODALITY).name,
        help=f"{named}, a timm model name (online), a Hugging "
        "Face text classifier by hub name (online; hf:NAME) or folder, a checkpoint file, or an "
        "OpenCLIP model as a zero-shot classifier of the ID classes: openclip:NAME/TAG (e.g. "
        "openclip:ViT-B-32/laion2b_s34b_b79k) or openclip:hf-hub:ORG/REPO, which download the "
        "weights and so need the network, or openclip:local-dir:PATH (a folder with "
        "open_clip_config.json and the weights; works offline) (default: %(default)s)",
    )
    p.add_argument(
        "--arch",
        default=None,
        help="timm architecture of a checkpoint file that does not carry its configuration",
    )
    p.add_argument(
        "--arch-kwargs",
        default=None,
        metavar="JSON",
        help="timm.create_model keyword arguments beside --arch, e.g. "
        '\'{"img_size": 32, "patch_size": 8, "init_values": 1e-5}\'',
    )
    p.add_argument(
        "--prompts",
        nargs="+",
        default=None,
        metavar="SET_OR_TEMPLATE",
        help="OpenCLIP models only: the prompt templates of the zero-shot classifier: a set, "
        "paper ('A photo of a {label}.', the default), openai (open_clip's 80 ImageNet templates, "
        "embeddings averaged per class) or simple (its 7), or templates of your own, each with "
        "{label} where the class name goes",
    )
    p.add_argument(
        "--towers",
        choices=("both", "image"),
        default=None,
        help="OpenCLIP models only: whose heads are pruned: both (the image tower's layers, then "
        "the text tower's, in one head layout, as the paper's D.3; the default) or image (the "
        "image tower alone)",
    )
    p.add_argument(
        "--device",
        type=options.device,
        default="auto",
        help="auto (cuda when available), cpu, cuda or cuda:N (default: %(default)s)",
    )
    p.add_argument(
        "--batch-size", type=options.positive_int, default=256, help="default: %(default)s"
    )


def zero_shot_options(args: argparse.Namespace) -> dict:
    """``classes``, ``templates`` and ``towers`` for :func:`~hydra_core.zoo.registry.load_model`
    of an OpenCLIP model: the classes are --classes, else the --id-folder's class folders
    (sorted), else Fashion-MNIST's; --prompts or --towers on any other model is refused."""
    from hydra_core.models.zero_shot import folder_classes
    from hydra_core.zoo.sources import is_zero_shot

    prompts = getattr(args, "prompts", None)
    towers = getattr(args, "towers", None)
    if not is_zero_shot(args.model):
        for flag, given in (("--prompts", prompts), ("--towers", towers)):
            if given:
                raise InputError(
                    f"{flag} applies to zero-shot OpenCLIP models (--model openclip:...), not to "
                    f"{args.model}"
                )
        return {}
    given, folder = getattr(args, "classes", None), getattr(args, "id_folder", None)
    if given:
        classes = [c.strip() for c in given.split(",") if c.strip()]
    else:
        classes = folder_classes(folder) if folder else None
    return {"classes": classes, "templates": prompts, "towers": towers}


def add_data_arguments(
    p: argparse.ArgumentParser, *, n_search: int | None = 512, n_report: int | None = None
) -> None:
    """--n-search/--n-report/--ood/--search-ood/--protocol and folders: which images the command
    uses, and in which role."""
    from hydra_core.data.benchmark import DEFAULT_PROTOCOL, PROTOCOLS
    from hydra_core.data.ood import REPORT_OOD, SEARCH_OOD
    from hydra_core.data.text import TEXT_REPORT_OOD, TEXT_SEARCH_OOD

    p.add_argument(
        "--n-search",
        type=options.positive_int,
        default=n_search,
        help="images per set in the search data: ID and each search set (default: %(default)s)",
    )
    p.add_argument(
        "--n-report",
        type=options.positive_int,
        default=n_report,
        help="images per set in the report data: ID and each report set (default: all)",
    )
    p.add_argument(
        "--ood",
        nargs="+",
        default=None,
        metavar="NAME",
        help="OOD sets to report on, never used to select heads (default: "
        f"{', '.join(REPORT_OOD)}; for a text model {', '.join(TEXT_REPORT_OOD)}; none when a "
        "near:/far: --ood-folder or --ood-file is given)",
    )
    p.add_argument(
        "--search-ood",
        nargs="+",
        default=None,
        metavar="NAME",
        help="OOD sets that select heads only, never reported on (default: "
        f"{', '.join(SEARCH_OOD)}; for a text model {', '.join(TEXT_SEARCH_OOD)}; none when a "
        "search: --ood-folder or --ood-file is given). A set may not be both a search and a "
        "report set",
    )
    p.add_argument(
        "--protocol",
        default=DEFAULT_PROTOCOL,
        choices=PROTOCOLS,
        help="which data selects heads (docs/search-protocols.md). dedicated: the search sets "
        "only (the paper's protocol); synthetic: sets made from the ID search items (shuffled "
        "patches or words, permuted pixels, random words, strong corruptions), no outside set; "
        "far-to-near / near-to-far: every set of one group selects heads and only the other "
        "group's report sets are reported on; halves: one half of each report set, reporting on "
        "the other half, so the search sees the reported distributions (optimistic OOD numbers; "
        "a warning says so) (default: %(default)s)",
    )
    p.add_argument(
        "--id-folder",
        default=None,
        metavar="PATH",
        help="an ImageFolder of your own (one sub-folder per class, in the model's class order) "
        "instead of Fashion-MNIST; split once into search and report halves. For an OpenCLIP "
        "model its class folders are the zero-shot classes (in --classes order when given; '_' "
        "and '-' become spaces in the prompts)",
    )
    p.add_argument(
        "--ood-folder",
        nargs="+",
        default=[],
        metavar="[near:|far:|search:]PATH",
        help="extra OOD image folders, e.g. near:/data/a far:/data/b to report on (a bare path is "
        "far), search:/data/c to select heads on",
    )
    p.add_argument(
        "--id-file",
        default=None,
        metavar="PATH",
        help="text models: a CSV (header text,label) or JSONL file of your own instead of Rotten "
        "Tomatoes; split once into search and report halves",
    )
    p.add_argument(
        "--ood-file",
        nargs="+",
        default=[],
        metavar="[near:|far:|search:]PATH",
        help="text models: extra OOD files (CSV with a text column, or JSONL), e.g. near:a.csv "
        "far:b.jsonl to report on (a bare path is far), search:c.csv to select heads on",
    )
    p.add_argument(
        "--classes",
        default=None,
        metavar="A,B,C",
        help="the model's classes in output order, matched to --id-folder's class folders (or "
        "--id-file's label names) by name (default: the folders or names in sorted order, as "
        "torchvision's ImageFolder)",
    )


def progress_bar(description: str):
    """A tqdm-backed ``progress(done, total)`` callback, silent when stderr is not a terminal
    (and outside rank 0 of a distributed job)."""
    from tqdm import tqdm

    bar = tqdm(desc=description, total=None, disable=not shows_progress(), leave=False)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return update


def shows_progress() -> bool:
    """Whether progress bars are drawn: on a terminal, by rank 0 of a distributed job."""
    return sys.stderr.isatty() and distributed.is_main()


def load_for_cli(args: argparse.Namespace, *, fused_ok: bool = False, every_set: bool = False):
    """The model and benchmark named by the common arguments, checked to fit each other; a fused
    Hydra file only where ``fused_ok`` (commands that evaluate, not analyse). ``every_set``: every
    OOD set both searched on and reported on, each cut in two (``transfer``,
    :func:`~hydra_core.analysis.transfer.every_set_options`)."""
    from hydra_core.data.sources import check_paths, parse_id_source, parse_source
    from hydra_core.hydra.source import load_model  # fused Hydra files registered as a source
    from hydra_core.zoo.registry import check_fit, parse_arch_kwargs

    own = []  # checked before the model loads: a wrong path is named at once
    for files, id_source, ood_sources in (
        (False, args.id_folder, args.ood_folder),
        (True, args.id_file, args.ood_file),
    ):
        own += [parse_id_source(id_source, files=files)] if id_source else []
        own += [parse_source(entry, files=files) for entry in ood_sources]
    check_paths(own)
    loaded = load_model(
        args.model,
        arch=args.arch,
        arch_kwargs=parse_arch_kwargs(args.arch_kwargs),
        **zero_shot_options(args),
    )
    if not fused_ok:
        loaded.check_analysable()
    _check_data_kind(args, loaded.modality)
    id_source = args.id_folder or args.id_file  # the other modality's options were refused
    # report folders/files alone replace the default report sets (search ones the search sets)
    roles = dict(
        ood=args.ood,
        search_ood=args.search_ood,
        ood_sources=[*args.ood_folder, *args.ood_file],
        protocol=args.protocol,
    )
    if every_set:
        from hydra_core.analysis.transfer import every_set_options

        roles = every_set_options(loaded.modality, **roles)
    benchmark = loaded.modality.benchmark(
        id_source=id_source,
        **roles,
        n_search=args.n_search,
        n_report=args.n_report,
        classes=[c.strip() for c in (args.classes or "").split(",") if c.strip()] or None,
        model_classes=loaded.classes,
        image_format=loaded.image_format,
    )
    for note in check_fit(loaded, benchmark.id_search, own_folder=id_source is not None):
        warn(note)
    if not every_set and (note := benchmark.protocol_note()):
        warn(note)
    return loaded, benchmark


def _check_data_kind(args: argparse.Namespace, modality: Modality) -> None:
    """Refuse data options of the other modality, naming the one to use."""
    if modality.takes_files and (args.id_folder or args.ood_folder):
        raise InputError(
            f"{args.model} is a text model: give your own data as --id-file / --ood-file (CSV or "
            "JSONL), not --id-folder / --ood-folder"
        )
    if not modality.takes_files and (args.id_file or args.ood_file):
        raise InputError(
            f"{args.model} is an image model: give your own data as --id-folder / --ood-folder, "
            "not --id-file / --ood-file (those are for text models such as minilm-sentiment)"
        )


def warn_near_chance(args: argparse.Namespace, loaded, accuracy: float) -> None:
    """On an ID folder of the user's own, warn when accuracy is near chance (labels that do not
    match the model's classes)."""
    from hydra_core.zoo.registry import chance_note

    own = args.id_folder or getattr(args, "id_file", None)
    zero_shot = loaded.is_zero_shot
    if own and (note := chance_note(accuracy, loaded.num_outputs(), zero_shot=zero_shot)):
        warn(note)


def warn(message: str) -> None:
    """A warning for the user: one line on stderr."""
    print(f"warning: {message}", file=sys.stderr)


def format_table(table) -> str:
    """A metrics table as aligned text (4 decimals)."""
    return table.to_string(index=False, float_format=lambda v: f"{v:.4f}")


def stage_bars():
    """A ``progress(stage, done, total)`` callback with one tqdm bar per stage."""
    bars: dict = {}

    def report(stage: str, done: int, total: int) -> None:
        bars.setdefault(stage, progress_bar(stage))(done, total)

    return report


def head_map_frame(values: torch.Tensor) -> pd.DataFrame:
    """An (L, H) map as a table: one row per layer, one column per head."""
    frame = pd.DataFrame(values.double().numpy(), columns=[f"H{h}" for h in range(values.shape[1])])
    frame.index = [f"L{layer}" for layer in range(values.shape[0])]
    return frame.rename_axis("layer")


def prepare(
    args: argparse.Namespace,
    *,
    report_sample_size: int | None = None,
    check: Callable[[object, object], None] | None = None,
    run: tuple[str, dict] | None = None,
):
    """Model (on the requested device), benchmark, input tensors, the cache and the output folder,
    for a command.

    The tensors are the search data (:func:`~hydra_core.analysis.inputs.search_inputs`) for
    commands that select heads; with ``report_sample_size``, a sample of that many report images
    per set (:func:`~hydra_core.analysis.inputs.report_sample`) for commands that describe the
    reported distributions. ``check(loaded, benchmark)`` refuses the command's own options that the
    model or the data decide (a budget, a layer, a file made for another model or on other data)
    before the output folder is claimed (:func:`claim_output`): a refused command writes nothing.
    ``run``: (the name of the files it writes, the options that change them), part of the run's
    identity in the folder (a folder of other options is refused without ``--overwrite``)."""
    from hydra_core.analysis.inputs import report_sample, search_inputs
    from hydra_core.cache import DiskCache
    from hydra_core.evaluate import resolve_device
    from hydra_core.outputs import data_identity

    loaded, benchmark = load_for_cli(args)
    if check is not None:
        check(loaded, benchmark)
    device = resolve_device(args.device)
    loaded.model.to(device)
    if report_sample_size is None:
        inputs = search_inputs(loaded.preprocess, benchmark)
    else:
        inputs = report_sample(loaded.preprocess, benchmark, n=report_sample_size)
    out = Path(args.out or f"results/{args.command}")
    data = data_identity(benchmark, "search" if report_sample_size is None else "report")
    if distributed.is_main():
        claim_output(args, out, loaded, data, run)
        print(f"{loaded.name} on {device}: {inputs.describe()}", file=sys.stderr)
    return loaded, benchmark, inputs.to(device), DiskCache(), out


#: options that name where a command writes (or its cache), never one of its inputs
OUTPUT_OPTIONS = ("out", "onnx", "output", "cache_dir")


def input_paths(args: argparse.Namespace) -> dict[str, str]:
    """Every file or folder the command's options name that exists (``--model``, ``--masks``,
    ``--stability``, ``--id-folder``, ...): the inputs the output policy never writes onto
    (:func:`hydra_core.outputs.check_output`), by the option that names each."""
    found = {}
    for name, value in vars(args).items():
        if name in OUTPUT_OPTIONS or name.startswith("_"):
            continue
        for given in value if isinstance(value, list | tuple) else [value]:
            if isinstance(given, str) and given and Path(given).expanduser().exists():
                found.setdefault(f"--{name.replace('_', '-')}", given)
    return found


#: options that change where or how fast a command runs, or what it prints, never its results
NOT_RESULT_OPTIONS = (
    *OUTPUT_OPTIONS, "overwrite", "threads", "debug", "json", "device", "batch_size",
)  # fmt: skip


def result_options(args: argparse.Namespace) -> dict:
    """The options of a command that change its results (every option, less
    :data:`NOT_RESULT_OPTIONS`), as the user gives them (``--name`` -> value; a path as its
    resolved absolute path): part of the identity of the run in its output folder, so that the
    same command with another ``--budget``, ``--masks`` or ``--boot`` is another run, refused
    without ``--overwrite``, not taken as a resume."""
    found = {}
    for name, value in sorted(vars(args).items()):
        if name in NOT_RESULT_OPTIONS or name in ("command", "run") or name.startswith("_"):
            continue
        if callable(value):
            continue
        if isinstance(value, str) and value and Path(value).expanduser().exists():
            value = str(Path(value).expanduser().resolve())
        found[f"--{name.replace('_', '-')}"] = value
    return found


def claim_output(
    args: argparse.Namespace, out: Path, loaded, data: dict, run: tuple[str, dict] | None = None
) -> None:
    """Refuse an output folder that holds another run's results, unless --overwrite (see
    :mod:`hydra_core.outputs`); create it and record this run. ``run``: (the files' name, the
    options that change them): the same files of other options are another run's, refused (a
    search's folder holds one search per objective, each with its own options)."""
    from hydra_core.outputs import claim_folder

    if run is None:
        name, options = None, result_options(args)
    else:
        name, options = f"{args.command} {run[0]}", run[1]
    claim_folder(
        out,
        model=loaded.identity(),
        data=data,
        command=args.command,
        overwrite=args.overwrite,
        reads=input_paths(args),
        options=options,
        run=name,
    )


#: what to do when a result file was computed on other data than this run's
SAME_DATA = (
    "give the same --n-search, --ood, --search-ood, --protocol and folders as the run that wrote "
    "it, or run that command again on this data"
)


def read_result_file(
    path: str,
    loaded,
    option: str,
    what: str,
    hint: str,
    parse: Callable,
    data: dict | None = None,
):
    """A result file a command wrote (JSON), read for ``loaded`` (and, given ``data``, this
    run's data identity): ``parse(data)`` of it, another model's or other data's refused
    (:func:`~hydra_core.outputs.check_source`; a file naming no model is warned about),
    anything unreadable one line naming ``option`` and the file, ``hint`` saying what to
    give."""
    from hydra_core.outputs import check_source

    identity = data

    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"{option} {path} does not exist; {hint}") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{option} {path} is not {what} ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"{option} {path} is not {what} (a JSON object)")
    where = f"{option} {path}"
    if note := check_source(data, loaded.identity(), identity, where, SAME_DATA):
        warn(note)
    try:
        return parse(data)
    except ValueError as exc:
        raise InputError(f"{option} {path}: {exc}") from None


def write_json(path: Path, data) -> None:
    """``data`` as JSON at ``path``, through the output policy's atomic write."""
    from hydra_core.outputs import write_json as write

    write(path, data)


def write_output(path: Path, write: Callable[[Path], object]) -> None:
    """``write(tmp)`` then an atomic rename to ``path`` (the output policy's last step)."""
    from hydra_core.outputs import write_output as written

    written(path, write)


def write_csv(path: Path, frame, **kwargs) -> None:
    """``frame`` as CSV at ``path``, through the output policy's atomic write."""
    from hydra_core.outputs import write_csv as write

    write(path, frame, **kwargs)


def add_output_arguments(p: argparse.ArgumentParser, default: str, what: str = "folder") -> None:
    """``--out`` and ``--overwrite``: where a command writes, and whether it may replace another
    run's results there."""
    p.add_argument("--out", default=None, help=f"output {what} (default: {default})")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help=f"replace what the {what} holds: the results of another model or other data, or "
        "files of unknown origin (refused otherwise)",
    )


def add_other_weights_argument(p: argparse.ArgumentParser) -> None:
    """``--allow-other-weights``: use a mask file made for other weights of the same shape."""
    p.add_argument(
        "--allow-other-weights",
        action="store_true",
        help="use a mask file made for other weights of the same shape (refused otherwise: its "
        "heads were chosen on another model)",
    )


def add_analysis_arguments(p: argparse.ArgumentParser) -> None:
    """The model, the data, ``--out`` and ``--overwrite``: what every analysis command takes."""
    add_model_arguments(p)
    add_data_arguments(p)
    add_output_arguments(p, "results/<command>")


def add_search_protocol_arguments(p: argparse.ArgumentParser) -> None:
    """--protocol and --ood-aggregate for a command whose defaults come from elsewhere (the
    report's configuration): None keeps them."""
    from hydra_core.analysis._maps import DEFAULT_OOD_AGGREGATE, OOD_AGGREGATES
    from hydra_core.data.benchmark import DEFAULT_PROTOCOL, PROTOCOLS

    p.add_argument(
        "--protocol",
        default=None,
        choices=PROTOCOLS,
        help="which data selects heads, as for search (docs/search-protocols.md; default: "
        f"{DEFAULT_PROTOCOL})",
    )
    p.add_argument(
        "--ood-aggregate",
        default=None,
        choices=OOD_AGGREGATES,
        help="how the searches' AUROC combines the OOD search sets: pooled, mean or min "
        f"(default: {DEFAULT_OOD_AGGREGATE})",
    )


def add_ood_aggregate_argument(p: argparse.ArgumentParser) -> None:
    """--ood-aggregate, for the commands that run greedy searches."""
    from hydra_core.analysis._maps import DEFAULT_OOD_AGGREGATE, OOD_AGGREGATES

    p.add_argument(
        "--ood-aggregate",
        default=DEFAULT_OOD_AGGREGATE,
        choices=OOD_AGGREGATES,
        help="how the search's AUROC combines its OOD search sets: pooled (one AUROC of ID "
        "against all of them at once), mean (the mean of one AUROC per set) or min (the worst "
        "set's AUROC) (docs/search-protocols.md; default: %(default)s)",
    )
