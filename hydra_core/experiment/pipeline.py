"""The one experiment pipeline every report and sweep runs: load, search, prune, build members,
evaluate the systems, repeat the seeded ones, write the files. A report (image, text, zero-shot,
sweeps) is a short file under :mod:`hydra_core.report` that declares its configuration, its
loader, its systems and its tables, and calls these stages in order.

:class:`Pipeline` owns the output folder, the cache and the stage clock (each stage is logged with
its wall time, and ``setup["seconds"]`` records it); what a stage produces is kept on it
(``loaded``, ``benchmark``, ``inputs``: the search tensors, ``layout``). Head selection reads only
``inputs`` (the search split); evaluation only the report split.

A report's repeats (another search subsample, its searches and pruning seeds, on the same report
items) come from :meth:`Pipeline.search_repeats`. Under ``torchrun`` a report's processes share
its repeats out whole (:meth:`Pipeline.repeats`):
each works alone (:func:`hydra_core.distributed.alone`) on its own repeats, leaving their searches,
fine-tuned weights and predictions in the shared cache; rank 0, which also runs repeat 0 and every
table, then reads the others' repeats from the cache and writes the report. The numbers are those
of one process.
"""

from __future__ import annotations

import atexit
import datetime as _dt
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from hydra_core import distributed
from hydra_core.cache import DiskCache
from hydra_core.errors import InputError
from hydra_core.evaluate import resolve_device
from hydra_core.experiment.evaluate import evaluate_systems
from hydra_core.experiment.facts import nan_to_none, protocol_facts, records, run_facts
from hydra_core.experiment.pruning import HYDRA_CIRC, Budgets, Pruning, hydra_members
from hydra_core.experiment.results import SystemsReport
from hydra_core.experiment.run import STAGES
from hydra_core.experiment.systems import System
from hydra_core.hydra.members import (
    CIRCUIT_NAMES,
    CIRCUIT_OBJECTIVES,
    circuit_member,
    circuit_members,
    member_overlap,
    taylor_member,
    taylor_ranking,
)
from hydra_core.masks import MemberMask, save_masks
from hydra_core.models.adapter import HeadLayout, head_layout
from hydra_core.outputs import (
    claim_folder,
    data_identity,
    leftover_staging,
    write_csv,
    write_json,
    write_output,
    write_text,
)
from hydra_core.types import Log, StageProgress

if TYPE_CHECKING:
    from hydra_core.analysis.greedy import GreedyResult
    from hydra_core.analysis.inputs import SearchInputs
    from hydra_core.data.benchmark import Benchmark
    from hydra_core.zoo.registry import LoadedModel

#: the work of repeat 0 (every table: the searches, their stability, the evidence, all fine-tuned
#: variants) in units of one later repeat (its searches, pruning and fine-tuned Hydras), for
#: sharing the repeats out among processes. Measured on the image report, one thread a process:
#: repeat 0 about 25 min with the tables (its searches cached), a later repeat about 20 min
MAIN_COST = 1.25


class Pipeline:
    """One report's run (see the module docstring).

    Args:
        out: the output folder (created). Every file of the report is written into a staging
            folder beside it first (:attr:`out` during the run) and moved into ``out`` by
            :meth:`write`, once all of them are ready: an interrupted run leaves ``out`` as it
            was. A folder holding another model's or other data's report is refused (after the
            model and data load, before any search) unless ``overwrite``.
        cache: searches, fine-tuned weights and predictions are read from and saved to it (None:
            the default cache).
        device: "auto", "cpu" or "cuda".
        progress: ``progress(stage, done, total)`` for long stages; log: one line per stage.
        overwrite: replace what ``out`` holds (see :func:`~hydra_core.outputs.claim_folder`).
        command: what the folder's manifest records the run as (``"report"``, ``"sweep layers"``).
        options: the options that change the results (:func:`run_options`): part of the run's
            identity in the folder's manifest (a finished run of other options is refused).
    """

    def __init__(
        self,
        out: str | Path,
        cache: DiskCache | None,
        device: str,
        progress: StageProgress | None,
        log: Log,
        *,
        overwrite: bool = False,
        command: str = "report",
        options: Mapping | None = None,
    ) -> None:
        self.command = command
        self.options = options
        self.final = Path(out).expanduser()
        if self.final.exists() and not self.final.is_dir():
            raise InputError(f"the report folder {self.final} is a file; give a folder")
        self.overwrite = overwrite
        self.out: Path | None = None  # the staging folder, once the model and data are loaded
        self.cache = cache or DiskCache()
        self.device = resolve_device(device)
        self.progress, self.log = progress, log
        self.ood_aggregate = "pooled"  # how the searches' AUROC combines the OOD search sets
        self.candidates: int | None = None  # the guided search's K for every search (None: exact)
        self.seconds: dict[str, float] = {}
        self.started = time.perf_counter()
        self.created = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        self.loaded: LoadedModel | None = None
        self.benchmark: Benchmark | None = None
        self.inputs = None
        # under torchrun: this process's place in the job (the report writes from rank 0)
        self.rank, self.processes = distributed.job_rank(), distributed.job_size()

    # --- the clock --------------------------------------------------------------------------

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """A stage of the run: logged when it starts and ends, its wall time recorded."""
        start = time.perf_counter()
        self.log(f"{self.tag} {name} ...")
        yield
        self.seconds[name] = time.perf_counter() - start
        self.log(f"{self.tag} {name}: {self.seconds[name]:.0f} s")

    @property
    def tag(self) -> str:
        """What the run's lines start with: the command's name (``[report]``, ``[sweep]``), and
        the process under torchrun."""
        name = self.command.split()[0]
        return f"[{name}, process {self.rank}]" if self.processes > 1 else f"[{name}]"

    def fine_tune_progress(self, name: str) -> Callable[[int, int], None] | None:
        """The run's progress for one training run, its stage named after the model."""
        if self.progress is None:
            return None
        stage = f"{STAGES['finetune']}: {name}"  # as evaluate_systems names it
        return lambda done, total: self.progress(stage, done, total)

    def total(self) -> float:
        """Seconds since the run began."""
        return time.perf_counter() - self.started

    # --- the stages ---------------------------------------------------------------------------

    def load(self, loader: Callable[[], tuple]) -> tuple:
        """Stage "load model and data": ``loader()`` gives (loaded model, benchmark, *anything
        else the report needs), which is returned; the model goes to the device in eval mode and
        the search split becomes the search tensors."""
        from hydra_core.analysis.greedy import guided_k
        from hydra_core.analysis.inputs import search_inputs

        with self.stage("load model and data"):
            loaded, benchmark, *extra = loader()
            loaded.model.to(self.device).eval()
            if benchmark.protocol_note():
                self.log(f"{self.tag} warning: {benchmark.protocol_note()}")
            self.inputs = search_inputs(loaded.preprocess, benchmark).to(self.device)
        self.loaded, self.benchmark = loaded, benchmark
        # K of every head is the exact search (and its cache entry): the run is not guided
        self.candidates = guided_k(self.candidates, self.layout.total_heads)
        if self.rank > 0:  # under torchrun rank 0 alone writes the report
            return tuple(extra)
        self._claim(record=False)  # refused before any search when it holds another run's
        for left in leftover_staging(self.final):
            self.log(
                f"{self.tag} note: {left} is the staging folder of an earlier run into "
                f"{self.final} that was killed (or is running now); it holds no finished "
                "results and can be deleted"
            )
        # the run's files go here until all are written (removed at exit if the run stops)
        self.final.parent.mkdir(parents=True, exist_ok=True)  # the folder itself comes last
        staging = tempfile.mkdtemp(prefix=f".{self.final.name}.partial-", dir=self.final.parent)
        self.out = Path(staging)
        atexit.register(shutil.rmtree, self.out, ignore_errors=True)
        return tuple(extra)

    def _claim(self, *, record: bool) -> None:
        """Check (``record`` False) or record (True, once the files are in place) the output
        folder as this run's: its model, data and options (:func:`claim_folder`)."""
        claim_folder(
            self.final,
            model=self.loaded.identity(),
            data=data_identity(self.benchmark),
            command=self.command,
            overwrite=self.overwrite or record,
            options=self.options,
            record=record,
        )

    def repeats(
        self, count: int, *, before_wait: Callable[[], None] | None = None
    ) -> Iterator[int]:
        """The repeats 1 .. ``count`` - 1 this process goes through, in order: all of them in
        one process. Under ``torchrun`` each process takes a contiguous share of about equal work,
        repeat 0 counting :data:`MAIN_COST` on rank 0; after its share a process runs
        ``before_wait`` (work taken piece by piece, :meth:`share_stability`), then waits for the
        others (:func:`~hydra_core.distributed.barrier`), and rank 0 goes on through theirs, which
        the cache now holds; the other processes are done."""
        later = range(1, count)
        if self.processes == 1:
            yield from later
            return
        shares = distributed.split([MAIN_COST] + [1.0] * len(later), self.processes)
        mine = [r for r in shares[self.rank] if r > 0]
        if mine:
            self.log(f"{self.tag} repeats {', '.join(map(str, mine))}")
        yield from mine
        if before_wait is not None:
            before_wait()
        with self.stage("wait for the other processes' repeats"):
            distributed.barrier()
        if self.rank == 0:
            yield from (r for r in later if r not in mine)

    def search_repeats(
        self,
        count: int,
        benchmark: Benchmark,
        n_search: int | None,
        pools: Callable[[], tuple],
        *,
        stability: tuple[int, int] | None = None,
        shared: Mapping[str, Callable[[], object]] | None = None,
    ) -> Iterator[tuple[int, Benchmark, SearchInputs]]:
        """The later repeats of a report's seeded systems, each as ``(r, benchmark_r, inputs_r)``:
        the repeats this process goes through (:meth:`repeats`), ``benchmark`` with its search
        split drawn again for repeat ``r`` (:func:`search_repeat`) and its search tensors. The
        report split stays, so the spread over repeats is the seeds' alone.

        Args:
            count: repeats in all, repeat 0 (the report's main run) included.
            n_search: items per search part of each repeat (None: the whole pools).
            pools: () -> (the ID search pool, one pool per OOD search set of ``benchmark``),
                called once, and only when there is a later repeat.
            stability: (budget, resamples) of the main circuits' stability runs, which a process
                under ``torchrun`` takes before it waits for the others
                (:meth:`share_stability`).
            shared: more work rank 0 needs after the repeats (``{name: work}``, each saving what it
                gives in the cache: the transfer table's leave-one-set-out search), which a
                process under ``torchrun`` takes the same way, piece by piece, after the
                stability runs.
        """
        from hydra_core.analysis.inputs import search_inputs

        id_pool, ood_pools = pools() if count > 1 else (None, ())

        def share() -> None:
            if stability is not None:
                self.share_stability(*stability)
            self._claim_each(shared or {})

        for r in self.repeats(count, before_wait=share):
            sub = search_repeat(benchmark, id_pool, ood_pools, n_search, r)
            yield r, sub, search_inputs(self.loaded.preprocess, sub).to(self.device)

    @property
    def layout(self) -> HeadLayout:
        return head_layout(self.loaded.model)

    def search(
        self,
        objective: str,
        budget: int,
        *,
        batch_size: int | None = None,
        inputs: SearchInputs | None = None,
        repeat: str = "",
    ) -> GreedyResult:
        """Stage "greedy search <circuit>": the greedy circuit of ``objective`` ("avg", "acc",
        "ood") on the search tensors (cached: a finished search loads, an interrupted one
        resumes). ``inputs``: other search tensors (a repeat on another subsample, named by
        ``repeat``)."""
        from hydra_core.analysis.greedy import greedy_circuit

        inputs = self.inputs if inputs is None else inputs
        name = CIRCUIT_NAMES[objective] + repeat
        on_step = None
        if self.progress is not None:
            on_step = lambda step: self.progress(f"greedy {name}", step.step + 1, budget)  # noqa: E731
        sizes = {} if batch_size is None else {"batch_size": batch_size}
        guided = "" if self.candidates is None else f", guided K = {self.candidates}"
        with self.stage(f"greedy search {name} ({budget} steps{guided})"):
            return greedy_circuit(
                self.loaded.model,
                inputs.id_x,
                inputs.id_y,
                inputs.ood_x,
                objective=objective,
                budget=budget,
                cache=self.cache,
                progress=on_step,
                ood_sets=inputs.ood_sets,
                ood_aggregate=self.ood_aggregate,
                candidates=self.candidates,
                **sizes,
            )

    def prune(
        self,
        circuit: GreedyResult,
        budgets: Budgets,
        seeds: Sequence[int],
        *,
        taylor_samples: int | None,
        batch_size: int,
        inputs: SearchInputs | None = None,
        repeat: str = "",
        circuits: Mapping[str, GreedyResult] | None = None,
    ) -> Pruning:
        """Stage "Taylor scores and layer-wise pruning", then the members: Taylor's layer-wise
        member and ranking, CircAvg from ``circuit`` (the ``"avg"`` search), one member per seed
        drawn from the pool of least useful heads of the CircAvg (B.5) and the Taylor ranking,
        and, when ``circuits`` holds the searches of the other criteria (``"acc"``, ``"ood"``),
        Hydra (Circ): one circuit per criterion (``inputs``, ``repeat``: as :meth:`search`)."""
        model, layout = self.loaded.model, self.layout
        inputs = self.inputs if inputs is None else inputs
        with self.stage("Taylor scores and layer-wise pruning" + repeat):
            options = dict(samples=taylor_samples, batch_size=batch_size)
            per_layer = budgets.removed_per_layer
            taylor = taylor_member(model, inputs, per_layer=per_layer, **options)
            taylor_rank = taylor_ranking(model, inputs, **options)
        ranking = circuit.ranking()
        circavg = circuit_member(ranking, layout, budget=budgets.budget, ranking_name="CircAvg")
        members = hydra_members(ranking, taylor_rank, layout, budgets, seeds)
        if circuits:
            rankings = {o: r.ranking() for o, r in circuits.items() if o != "avg"}
            rankings["avg"] = ranking
            # criteria that agree give equal members: kept, and the overlap in the setup says so
            members[HYDRA_CIRC] = circuit_members(
                rankings, layout, budget=budgets.budget, allow_identical=True
            )
        return Pruning(taylor, taylor_rank, circavg, members)

    def circuits_and_members(
        self,
        budgets: Budgets,
        seeds: Sequence[int],
        *,
        taylor_samples: int | None,
        batch_size: int,
        search_batch_size: int | None = None,
        inputs: SearchInputs | None = None,
        repeat: str = "",
    ) -> Pruning:
        """The three greedy searches (CircAvg, CircAcc, CircOOD: :meth:`search`, in batches of
        ``search_batch_size``, default the search's own), then :meth:`prune` with them: every
        report's members, Hydra (Circ) as the paper's method among them; the searches are the
        result's ``circuits``."""
        circuits = {
            o: self.search(
                o, budgets.budget, batch_size=search_batch_size, inputs=inputs, repeat=repeat
            )
            for o in ("avg", "acc", "ood")
        }
        pruning = self.prune(
            circuits["avg"],
            budgets,
            seeds,
            taylor_samples=taylor_samples,
            batch_size=batch_size,
            inputs=inputs,
            repeat=repeat,
            circuits=circuits,
        )
        pruning.circuits = circuits
        return pruning

    def share_first(self, pieces: Mapping[str, Callable[[], object]]) -> None:
        """Under ``torchrun``, before the processes part for their repeats: work every repeat
        needs the same (``{name: work}``, each piece saving what it gives in the cache), each piece
        taken whole by the first process free (:func:`~hydra_core.distributed.claim`); then every
        process waits for all, and reads the pieces from the cache where its repeats need them.
        Without it each process would compute every piece for itself, at the same time. Nothing in
        one process (each piece then runs where it is needed)."""
        if self.processes == 1:
            return
        self._claim_each(pieces)
        with self.stage("wait for the other processes' shared work"):
            distributed.barrier()

    def _claim_each(self, pieces: Mapping[str, Callable[[], object]]) -> None:
        """Under ``torchrun``, each piece (``{name: work}``) that no process has taken yet, taken
        whole (:func:`~hydra_core.distributed.claim`); nothing in one process."""
        if self.processes == 1:
            return
        for name, work in pieces.items():
            if distributed.claim(name):
                with self.stage(f"{name}, shared by the processes"):
                    work()

    def share_stability(self, budget: int, resamples: int) -> None:
        """Under ``torchrun``, before the processes wait for each other (``before_wait`` of
        :meth:`repeats`): the stability runs of the main circuits (CircAvg, CircAcc, CircOOD,
        ``budget`` steps) that no process has taken yet, each taken whole by the first process
        free (:func:`~hydra_core.distributed.claim`) and saved in the cache, where
        :meth:`stability` reads them on rank 0. Nothing in one process or without resamples."""
        from hydra_core.experiment.stability import search_stability

        if not resamples or self.processes == 1 or self.candidates is not None:
            return
        for objective in CIRCUIT_OBJECTIVES:
            if distributed.claim(f"stability {objective} {budget} {resamples}"):
                name = CIRCUIT_NAMES[objective]
                with self.stage(f"stability of {name} ({resamples} resamples)"):
                    search_stability(
                        self.loaded.model,
                        objective,
                        budget,
                        self.inputs,
                        resamples=resamples,
                        cache=self.cache,
                        progress=self.progress,
                    )

    def stability(
        self,
        circuits: Mapping[str, GreedyResult],
        full: Benchmark,
        *,
        resamples: int,
        held_out: int | None,
    ) -> pd.DataFrame | None:
        """Stage "stability of the circuits": each circuit's search on ``resamples`` bootstrap
        resamples of the search tensors, and its objective after every step on search-role items
        the search did not use (``full``: the same sets as the run's benchmark, uncapped; at most
        ``held_out`` per set); None when ``resamples`` is 0, or the searches are guided (the
        stability runs resample the exact search; see :mod:`hydra_core.experiment.stability`)."""
        from hydra_core.experiment.stability import circuit_stability, held_out_sample

        if not resamples:
            return None
        if self.candidates is not None:
            self.log(
                f"{self.tag} no stability runs: they resample the exact search, and this run's "
                f"searches are guided (K = {self.candidates})"
            )
            return None
        with self.stage(f"stability of the circuits ({resamples} resamples)"):
            sample = held_out_sample(
                self.loaded.preprocess, full, self.benchmark, self.inputs, held_out
            )
            return circuit_stability(
                self.loaded.model,
                circuits,
                self.inputs,
                sample,
                resamples=resamples,
                cache=self.cache,
                progress=self.progress,
            )

    def save_members(self, masks: Sequence[MemberMask]) -> None:
        """``members.json``: the masks of the run, with the model's identity."""
        identity = self.loaded.identity()
        write_output(self.out / "members.json", lambda tmp: save_masks(tmp, list(masks), identity))

    def evaluate(
        self,
        systems: Sequence[System],
        *,
        benchmark: Benchmark | None = None,
        loaded: LoadedModel | None = None,
        **options,
    ) -> SystemsReport:
        """:func:`~hydra_core.experiment.evaluate.evaluate_systems` of ``systems`` on the report
        split (of ``benchmark``, default the run's), on the run's device, cache and progress
        (latency is timed in one stage later); ``loaded``: the model with another preprocessing
        (the same numbers, e.g. trimmed padding), default the run's."""
        options.setdefault("latency", False)
        return evaluate_systems(
            self.loaded if loaded is None else loaded,
            self.benchmark if benchmark is None else benchmark,
            systems,
            device=self.device,
            cache=self.cache,
            progress=self.progress,
            **options,
        )

    # --- setup and files ----------------------------------------------------------------------

    def setup(
        self,
        task: str | None,
        budgets: Budgets,
        seeds: Mapping[str, object],
        members: Mapping[str, Sequence[MemberMask]],
    ) -> dict:
        """The facts every report's ``setup`` starts with: when and by what command, the
        protocol (which items selected heads and which were reported, every seed), the model,
        the data, the budgets and the members' overlap."""
        data = self.benchmark.describe()
        overlap = {label: member_overlap(ms) for label, ms in members.items()}
        facts = {
            "created": self.created,
            "command": " ".join(["python -m hydra_core", *sys.argv[1:]]) if sys.argv else "",
            "protocol": protocol_facts(
                self.benchmark, seeds, self.ood_aggregate, candidates=self.candidates
            ),
            "model": self.loaded.card(),
            "model_description": self.loaded.description,
            "data": data.drop(columns="description").to_dict(orient="records"),
            "data_descriptions": dict(zip(data["name"], data["description"], strict=True)),
            "budgets": asdict(budgets),
            "members": len(next(iter(members.values()), ())),
            "member_overlap": {
                label: {
                    "mean_pairwise_jaccard": o["mean_pairwise_jaccard"],
                    "kept_by_all": len(o["kept_by_all"]),
                    "kept_by_any": len(o["kept_by_any"]),
                }
                for label, o in overlap.items()
            },
        }
        return facts if task is None else {"task": task, **facts}

    def finish(self, setup: dict) -> dict:
        """``setup`` with where and how long the run took (its last entries)."""
        return {**setup, **run_facts(self.device, self.seconds, self.total())}

    def write(
        self,
        tables: Mapping[str, pd.DataFrame],
        setup: dict,
        systems: SystemsReport,
        markdown: Callable[[Mapping[str, pd.DataFrame], dict], str],
    ) -> dict:
        """Every file of the report: one CSV per table, ``report.json`` (setup, every table as
        records, every system), ``report.md`` (``markdown(tables, setup)``); returns the JSON."""
        for name, table in tables.items():
            write_csv(self.out / f"{name}.csv", table, index=False)
        payload = {
            "setup": setup,
            **{k: records(v) for k, v in tables.items()},
            "systems": systems.to_json()["systems"],
        }
        payload = nan_to_none(payload)
        write_json(self.out / "report.json", payload, indent=1)
        write_text(self.out / "report.md", markdown(tables, setup))
        self.final.mkdir(parents=True, exist_ok=True)
        for path in sorted(self.out.iterdir()):  # every file is ready: now into place
            os.replace(path, self.final / path.name)
        self.out.rmdir()
        self.out = self.final
        self._claim(record=True)  # the manifest last: a failed run leaves no claimed folder
        self.log(f"{self.tag} wrote {self.final} in {setup['total_seconds'] / 60:.1f} minutes")
        return payload


def search_repeat(
    benchmark: Benchmark, id_pool, ood_pools: Sequence, n: int | None, repeat: int
) -> Benchmark:
    """``benchmark`` with its search split drawn again for repeat ``repeat``: another fixed
    subsample of ``n`` items of the ID search pool and of each search OOD pool (the same items in
    another order when ``n`` takes them all); the report split stays. Under the ``"synthetic"``
    protocol the synthetic sets are made again from the new ID search items, with seed
    ``repeat`` (``ood_pools`` is not used)."""
    from hydra_core.data.images import take
    from hydra_core.data.synthetic import remade

    purpose = f"search-repeat-{repeat}"
    id_search = take(id_pool, n, purpose=purpose)
    if benchmark.protocol == "synthetic":
        reported = [benchmark.id_report, *benchmark.ood_report]
        ood_search = remade(benchmark.ood_search, id_search, reported, seed=repeat)
    else:
        ood_search = tuple(take(pool, n, purpose=purpose) for pool in ood_pools)
    return replace(benchmark, id_search=id_search, ood_search=ood_search)
