"""Rank 0's side of tensor parallelism: the other ranks this process leads, kept from one model to the next.

A process that builds `LLM(tensor_parallel_size=N)` leads N-1 other ranks: spawned here (`spawn_workers`:
`python -m blazr.distributed.worker` on this machine) or found under torchrun (every rank runs the same
command; ranks > 0 end up in `worker.run_worker`). Starting them is most of what a small model's load
costs — a fresh interpreter importing torch and the gloo / NCCL rendezvous, ~5 s on a 2-core Zen 3 against
~0.1 s for the load itself — so they outlive the model that started them:

    lead(world, device)  →  Setup, … steps …, ("stop",)  →  release(True)   (the ranks wait, idle)
    lead(world, device)  →  the same ranks, the same group: the next model's Setup
    at exit (or `finish()`) →  ("exit",): the ranks leave their loop and exit

One model at a time: a second `lead` while the first model holds the ranks is refused. Ranks that may be
out of step — a step that failed part-way (they wait in a collective rank 0 never reaches), a load that
failed on some rank — are never handed on: `release(False)` kills the spawned ones and leaves the group.
Ranks of another world size or device kind are ended and new ones started.
"""

from __future__ import annotations

import atexit
import logging
import os
import subprocess
import sys
from dataclasses import dataclass, field

import torch

from blazr.distributed.group import TPGroup, destroy_group, init_group
from blazr.distributed.worker import EXIT, free_port, is_torchrun
from blazr.errors import BlazrError
from blazr.kernels.build import usable_cores

log = logging.getLogger("blazr.distributed")

STOP_WAIT_S = 30.0  # for a rank told to exit; past it, it is stuck in a collective and killed


@dataclass
class _Ranks:
    """The ranks this process leads: their world size, device kind, the processes spawned here (none under
    torchrun) and whether a model holds them now."""

    world: int
    device_type: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    is_held: bool = True

    def are_alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)


_ranks: _Ranks | None = None
_is_torchrun_over = False  # torchrun's ranks were ended: they cannot be started again from here


def threads_per_rank(world: int) -> int:
    """The machine's cores shared by the ranks on it: two teams of spinning OpenMP threads on the same
    cores wait at barriers for descheduled peers (benchmarks/NOTES.md §23: decode 20-100x slower)."""
    return max(1, usable_cores() // world)


def spawn_workers(world: int, device: torch.device) -> list[subprocess.Popen[bytes]]:
    """Start ranks 1 … world-1 on this machine and point this process (rank 0) at the rendezvous; every
    rank gets its share of the cores (this one too) and rank 0's device kind (its collectives' backend)."""
    port = free_port()
    threads = threads_per_rank(world)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    procs = []
    for rank in range(1, world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "BLAZR_TP_PARENT": str(os.getpid()),
            "BLAZR_TP_DEVICE": device.type,
            "OMP_NUM_THREADS": str(threads),
        }
        procs.append(subprocess.Popen([sys.executable, "-m", "blazr.distributed.worker"], env=env))
    torch.set_num_threads(threads)
    return procs


def lead(world: int, device: torch.device) -> TPGroup:
    """Rank 0's group of `world` ranks, waiting for a model's `Setup`: the idle ranks an earlier model of
    this process left, when they are alive and of this size and device kind; else new ones."""
    global _ranks
    if _ranks is not None:
        if _ranks.is_held:
            raise BlazrError(
                "a tensor-parallel model of this process holds its ranks: close it before loading another"
            )
        if _ranks.world == world and _ranks.device_type == device.type and _ranks.are_alive():
            _ranks.is_held = True
            log.debug("tensor parallel: the %d idle ranks taken by the next model", world - 1)
            return TPGroup(0, world, device)
        finish()
    if is_torchrun():
        started = int(os.environ["WORLD_SIZE"])
        if started != world:
            raise BlazrError(f"tensor_parallel_size {world} but torchrun started {started} ranks")
        if _is_torchrun_over:
            raise BlazrError("torchrun's other ranks have exited: a new model needs a new launch")
        procs = []
    else:
        procs = spawn_workers(world, device)
    _ranks = _Ranks(world, device.type, procs)
    try:
        return init_group(world, device, rank=0)
    except BaseException:
        release(False)
        raise


def release(is_in_step: bool) -> None:
    """The model that held the ranks is done. `is_in_step`: they were told `stop` and wait for the next
    model — kept; else they may wait in a collective: spawned ranks are killed and the group left."""
    if _ranks is None:
        return
    if is_in_step and _ranks.are_alive():
        _ranks.is_held = False
        return
    _end(can_tell=False)


def finish() -> None:
    """End the idle ranks (told to exit; one stuck past `STOP_WAIT_S` is killed) and leave the group; ranks
    a model still holds are its `close`'s to release first. Run at exit, after every model's own `close`
    (registered when this module is imported, before any model's: atexit runs in reverse)."""
    if _ranks is not None and not _ranks.is_held:
        _end(can_tell=True)


def _end(can_tell: bool) -> None:
    """End the ranks this process leads: told `EXIT` and waited for when `can_tell`, else killed; the group
    left. Torchrun's (none spawned here) cannot be led again."""
    global _ranks, _is_torchrun_over
    assert _ranks is not None
    ranks, _ranks = _ranks, None
    if not ranks.procs:
        _is_torchrun_over = True
    if can_tell:
        try:
            TPGroup(0, ranks.world, torch.device(ranks.device_type)).broadcast_object(EXIT)
        except RuntimeError as e:  # a rank already gone
            log.debug("tensor parallel: a rank is already gone (%s)", e)
    for p in ranks.procs:
        if not can_tell:
            p.kill()
        try:
            p.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    destroy_group()


def spawned() -> list[subprocess.Popen[bytes]]:
    """The rank processes this process spawned and leads now (none under torchrun or without ranks)."""
    return list(_ranks.procs) if _ranks is not None else []


atexit.register(finish)
