"""Tensor-parallel ranks 1 … N-1: how they start, load their shard and mirror rank 0's steps.

Rank 0 (the `LLM` that the CLI, the server or a script builds with `tensor_parallel_size=N`) owns the
scheduler, the sampler and the server. It either finds a torchrun launch (RANK / WORLD_SIZE in the
environment: every rank runs the same `blazr …` command, ranks > 0 end up in `run_worker`, several nodes
with `torchrun --nnodes`), or spawns ranks 1 … N-1 itself on this machine (distributed/ranks.py: `python
-m blazr.distributed.worker` with the rendezvous in the environment), and keeps them for its next model.

The protocol (`TPGroup.broadcast_object`, rank 0 → all), once per model:
1. `Setup`: what to load (rank 0's LoadConfig, its device and dtype) — ranks load their shards
   at the same time;
2. the engine config, the `CachePlan` rank 0 made and its KV dtype, so every rank's pools have the same
   blocks, state slots and element type;
3. then one command per runner action: `("step", ids, batch, restores, saves)` — a forward on the shard
   (the all-reduces inside it and the logits' all-gather meet rank 0's), `("copy_blocks", pairs)`,
   `("copy_states", pairs)` — and `("stop",)`: the model is dropped and the rank waits for the next
   `Setup`, or for `EXIT`, which ends it.
A rank's runner is the same `ModelRunner` as rank 0's; it only never samples.

Liveness: a spawned worker exits when its parent (rank 0) is gone; collectives time out after
`COLLECTIVE_TIMEOUT_S` (an idle server sends nothing, so it is long).

Stopping: a spawned worker ignores SIGINT — Ctrl-C in a terminal signals the whole foreground process
group, and the worker stops on rank 0's word, after rank 0 has drained — and a worker that fails says so
in one line on stderr (rank 0 reports the failed step), never with a traceback.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from blazr.distributed.group import TPGroup, destroy_group, init_group
from blazr.exit_now import exit_now
from blazr.load_config import LoadConfig

if TYPE_CHECKING:
    from blazr.engine.runner import ModelRunner

log = logging.getLogger("blazr.distributed")

PARENT_POLL_S = 1.0
EXIT = ("exit",)  # rank 0 → every rank, in place of the next model's Setup: leave


@dataclass(frozen=True)
class Setup:
    """What every rank loads: rank 0's LoadConfig (its model resolved to a local path) and what rank 0
    resolved from it (device, dtype) and from the engine config (the context limit)."""

    load: LoadConfig
    device: str
    dtype: torch.dtype
    max_model_len: int


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def is_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def run_worker(world: int | None = None, device_type: str | None = None) -> None:
    """A rank > 0 from start to `EXIT`: join the group, then for each model rank 0 names: load its shard,
    mirror its steps until `stop`. `device_type`: rank 0's (its collectives' backend); by default CUDA
    where there is one."""
    world = world or int(os.environ["WORLD_SIZE"])
    parent = os.environ.get("BLAZR_TP_PARENT")
    if parent:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0's word ends this rank (module docstring)
        _exit_with_parent(int(parent))
    device_type = device_type or os.environ.get("BLAZR_TP_DEVICE")
    probe = torch.device(device_type or ("cuda" if torch.cuda.is_available() else "cpu"))
    tp = init_group(world, probe)
    while (setup := tp.broadcast_object()) != EXIT:
        serve_model(setup, tp)
        gc.collect()  # the model's tensors go before the next one loads
    destroy_group()


def serve_model(setup: Setup, group: TPGroup) -> None:
    """One model on this rank: load the shard `setup` names, build its runner as rank 0 says, mirror rank
    0's steps until `stop`."""
    from blazr.detect import inspect_checkpoint
    from blazr.engine.runner import ModelRunner
    from blazr.loading.loader import load_model
    from blazr.model.qlinear import keep_head_x_fp32

    device = torch.device(setup.device)
    tp = TPGroup(group.rank, group.world, device)
    load = setup.load
    assert load.model is not None
    ckpt = inspect_checkpoint(Path(load.model), vocab_name=load.vocab)
    model = load_model(ckpt, device, setup.dtype, setup.max_model_len, quantize=load.quantize, tp=tp)
    keep_head_x_fp32(model.lm_head, load.head_precision == "fp32")  # rank 0 resolved "auto"
    engine_cfg, plan, kv_dtype = tp.broadcast_object()
    runner = ModelRunner(model, engine_cfg, device, setup.dtype, kv_dtype, tp=tp, cache_plan=plan)
    log.info("tensor-parallel rank %d of %d ready: %s", tp.rank, tp.world, ckpt.name)
    serve_steps(runner, tp)


def serve_steps(runner: ModelRunner, tp: TPGroup) -> None:
    """Mirror rank 0's runner commands until `stop`."""
    while True:
        cmd = tp.broadcast_object()
        kind = cmd[0]
        if kind == "stop":
            return
        if kind == "step":
            runner.mirror_step(*cmd[1:])
        elif kind == "copy_blocks":
            runner.copy_blocks(cmd[1])
        elif kind == "copy_states":
            runner.copy_states(cmd[1])
        else:
            raise RuntimeError(f"unknown tensor-parallel command {kind!r}")


def _exit_with_parent(pid: int) -> None:
    """A spawned worker must not outlive rank 0 (it would wait in a collective for a long time)."""

    def watch() -> None:
        while True:
            try:
                os.kill(pid, 0)
            except OSError:
                os._exit(0)
            time.sleep(PARENT_POLL_S)

    threading.Thread(target=watch, daemon=True, name="blazr-tp-parent").start()


def main() -> int:
    """A spawned rank's process: `run_worker`, a failure as one line on stderr (status 1)."""
    logging.basicConfig(level=os.environ.get("BLAZR_LOG_LEVEL", "WARNING").upper())
    try:
        run_worker()
    except Exception as e:  # rank 0 reports what it saw; the traceback only at debug level
        log.debug("tensor-parallel rank failed", exc_info=True)
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"blazr tensor-parallel rank {os.environ.get('RANK', '?')}: {first}", file=sys.stderr)
        return 1
    return 0


def _leave(status: int) -> None:
    """Exit without the interpreter's teardown: a spawned rank holds nothing to write (its shard is loaded
    without the quantization cache; no thread of its own but the parent watch), and unloading torch's
    modules took ~1 s of CPU on a 2-core Zen 3 — time rank 0's `close` waited for."""
    exit_now(status)


if __name__ == "__main__":
    _leave(main())
