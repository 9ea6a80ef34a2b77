"""One job on several processes: torch.distributed under ``torchrun``, and nothing without it.

The long jobs (greedy search, single-head importance, the evaluation of a report, Deep Ensembles
training) split their work over the processes of torch's default process group when one with more
than one process exists (:func:`active`), and run exactly as before when none does: every function
here is then a no-op that returns its input. Under ``torchrun`` every process runs the same code and
calls the same functions in the same order (a collective waits for all processes), every process
ends with the same result, and rank 0 alone writes files (:func:`is_main`).

A job can also share its work out whole, one piece per process: inside :func:`alone` each process
works as if it were the only one (no collective, rank 0 of 1), and :func:`barrier` waits for the
others; :func:`job_rank` and :func:`job_size` still say where it stands (the report's repeats).
Pieces of unequal or unknown cost go to whichever process comes free first (:func:`claim`).

What travels between processes is small and lives on the CPU (score maps, logits, state dicts,
stored results), so the collectives run on gloo; a CUDA job's group is ``cpu:gloo,cuda:nccl``, so
that CUDA tensors would go over NCCL, with one GPU per process (``LOCAL_RANK``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")

#: How long a collective waits for the slowest process. Long: a process with fewer Deep Ensembles
#: copies to train waits for the others' (about 30 minutes each on a CPU core), a report's rank 0
#: for the others' repeats; a job whose process died is ended by torchrun, not by this timeout.
TIMEOUT = timedelta(hours=12)


def launched() -> bool:
    """True when the environment describes a job of several processes (``WORLD_SIZE`` > 1, as
    ``torchrun --nproc-per-node N`` with N > 1 sets it)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_from_env(*, cuda: bool = False) -> bool:
    """Create the default process group from torchrun's environment (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``); True when this call created it.

    Nothing happens (False) without such an environment, or when a group exists already.

    Args:
        cuda: the job runs on CUDA: this process takes GPU ``LOCAL_RANK`` (what ``"cuda"`` then
            means in it) and the group is ``cpu:gloo,cuda:nccl``; otherwise gloo alone.
    """
    if not launched() or dist.is_initialized():
        return False
    backend = "gloo"
    if cuda:
        local_rank, count = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
        if local_rank >= count:
            raise RuntimeError(
                f"LOCAL_RANK {local_rank} has no GPU: this machine has {count}; start at most "
                f"{count} processes per node (torchrun --nproc-per-node {count})"
            )
        torch.cuda.set_device(local_rank)
        backend = "cpu:gloo,cuda:nccl"
    dist.init_process_group(backend, timeout=TIMEOUT)
    return True


def shutdown() -> None:
    """Destroy the default process group, if there is one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


#: True inside :func:`alone`
_alone = False


def active() -> bool:
    """True inside a process group of more than one process (False inside :func:`alone`)."""
    return not _alone and job_size() > 1


def job_size() -> int:
    """The processes of the job, also inside :func:`alone` (1 without a process group)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def job_rank() -> int:
    """This process's rank in the job, also inside :func:`alone` (0 without a process group)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


@contextmanager
def alone() -> Iterator[None]:
    """Inside, this process works as if it were the only one: :func:`active` is False, so every
    function here runs as without ``torchrun`` and the long jobs split nothing. For work shared
    out whole, a piece per process (each piece computed as one process computes it); the pieces
    meet through files (the cache) after a :func:`barrier`."""
    global _alone
    saved, _alone = _alone, True
    try:
        yield
    finally:
        _alone = saved


def barrier() -> None:
    """Wait until every process of the job is here (inside :func:`alone` too); nothing without a
    process group. Waits up to :data:`TIMEOUT`: a process that died ends the job (torchrun)."""
    if job_size() > 1:
        dist.barrier()


def claim(name: str) -> bool:
    """True in exactly one process of the job for each ``name``: the first to ask (the job's
    store counts the asks atomically), False in the others; True without a process group. For
    pieces of work taken whole by whichever process comes free first (inside :func:`alone` too);
    what a piece gives reaches the others through files, after a :func:`barrier`. A name is
    claimed once per job: a job started again claims afresh."""
    if job_size() == 1:
        return True
    store = dist.distributed_c10d._get_default_store()
    return store.add(f"hydra_core/claim/{name}", 1) == 1


def rank() -> int:
    """This process's rank, 0 outside a distributed job."""
    return dist.get_rank() if active() else 0


def world_size() -> int:
    """The number of processes, 1 outside a distributed job."""
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    """True in the process that writes files and prints results: rank 0, or the only one."""
    return rank() == 0


def from_main(compute: Callable[[], T]) -> T:
    """``compute()`` run on rank 0 alone and its result given to every process (pickled): for
    reading rank 0's files, or for work that must not run on several processes at once (timing)."""
    if not active():
        return compute()
    box = [compute() if is_main() else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather(value: T) -> list[T]:
    """Every process's ``value``, in rank order (pickled); ``[value]`` outside a distributed job."""
    if not active():
        return [value]
    found: list = [None] * world_size()
    dist.all_gather_object(found, value)
    return found


def sum_over_processes(tensor: torch.Tensor) -> torch.Tensor:
    """The element-wise sum of ``tensor`` (a CPU tensor) over all processes, as a new tensor."""
    if not active():
        return tensor.clone()
    total = tensor.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def any_process(flag: bool) -> bool:
    """True on every process when ``flag`` is True on any of them."""
    if not active():
        return bool(flag)
    return bool(sum_over_processes(torch.tensor([float(flag)])).item() > 0)


def split(costs: Sequence[float], parts: int | None = None) -> list[range]:
    """Items ``0..n-1``, in order, cut into ``parts`` (default: the processes) contiguous runs of
    about equal total cost: item i goes to the run its cost's midpoint falls in, so a run's cost
    is off the ideal share by at most about half an item. Some runs are empty when there are
    fewer items than parts. Pure arithmetic on ``costs``: every process computes the same runs.
    """
    parts = world_size() if parts is None else parts
    if parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}")
    if any(c < 0 for c in costs):
        raise ValueError(f"costs must not be negative, got {list(costs)}")
    total = float(sum(costs))
    if total <= 0:  # nothing costs anything: split by count
        costs, total = [1.0] * len(costs), float(len(costs))
    owner, before = [], 0.0
    for cost in costs:
        owner.append(min(parts - 1, int((before + cost / 2) * parts / total)))
        before += cost
    starts = [sum(1 for o in owner if o < part) for part in range(parts + 1)]
    return [range(starts[p], starts[p + 1]) for p in range(parts)]


def shard(n: int, batch_size: int) -> slice:
    """This process's part of ``n`` items processed in batches of ``batch_size``: a contiguous
    run of whole batches (about equally many per process), so that each batch holds the items
    it holds in a single process."""
    batches = -(-n // batch_size)
    mine = split([1.0] * batches)[rank()]
    return slice(min(n, mine.start * batch_size), min(n, mine.stop * batch_size))
