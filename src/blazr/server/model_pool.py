"""Several models behind one server: `ModelPool` loads each on first use, unloads the least recently used
beyond `--max-loaded-models`, and puts a model to sleep after `--sleep-idle-seconds` without requests
(anchors: llama-server's router mode, Ollama's keep_alive).

Per model (`PoolEntry`) a state: `unloaded` (never loaded, or unloaded to make room), `loading`, `loaded`,
`sleeping` (unloaded after idling; the next request reloads it) or `failed` (with a one-line reason; tried
again after RETRY_FAILED_S). All of it lives on the event loop's thread; a load runs on a worker thread so
the models already loaded keep serving.

- `acquire(name)` → the model's `Serving`, loading it first when needed (concurrent requests for a model
  that is loading wait for that same load, until a drain gives up on them: 503); it counts the request in
  use until `release`, and nothing in use — or with sequences in its engine, or requests waiting for its
  load (else a load queued behind it could unload it before they get it: two models thrashing) — is ever
  unloaded. Loads run one at a time.
- Room: before a load, while `max_loaded_models` are loaded, the least recently used idle one is
  unloaded (if every loaded model is busy, the load waits for one to go idle).
- One memory budget: a model's cache pools get an equal share of what is left of the budget
  (state/budget.py `shared_budget`) — `--cache-memory` is the total across loaded models.
- Unloading stops the engine thread, drops every reference to the weights and cache pools (waiting for a
  `--quantize` cache write in flight, which holds them), collects and hands freed heap back to the OS
  (glibc `malloc_trim`), so the process's resident memory really drops.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import gc
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from blazr.server.errors import APIError
from blazr.server.options import ServerConfig
from blazr.server.request_in import shorten
from blazr.server.response_store import ResponseStore
from blazr.server.serving import Serving

log = logging.getLogger("blazr.server")

ModelState = Literal["unloaded", "loading", "loaded", "sleeping", "failed"]
MODEL_STATES: tuple[ModelState, ...] = ("unloaded", "loading", "loaded", "sleeping", "failed")
RETRY_FAILED_S = 30.0  # a model that failed to load is refused for this long, then tried again
ROOM_POLL_S = 0.05  # how often a load waiting for room checks for an idle model
_GiB = 1 << 30

# (config of one model, cache bytes its budget allows) → (its Serving, the bytes its cache pools hold)
Starter = Callable[[ServerConfig], tuple[Serving, int]]


@dataclass
class PoolEntry:
    """One model of the pool: its name, what to load, its state and, while loaded, its `Serving`."""

    name: str
    spec: str  # what --model took: a path or a repo id ("" for the embedded model)
    state: ModelState = "unloaded"
    serving: Serving | None = None
    error: str | None = None  # why `failed`, one line
    failed_at: float = 0.0
    num_in_use: int = 0  # requests holding it (acquire … release)
    num_waiting: int = 0  # requests waiting for its load (so the next load cannot unload it before them)
    last_used: float = 0.0  # time.monotonic() of the last acquire or release
    cache_bytes: int = 0  # what its cache pools hold while loaded
    keep_alive: float | None = None  # Ollama's keep_alive of its last request (seconds; None: the server's)
    load_seconds: float = 0.0  # its last load
    num_loads: int = 0
    details: dict[str, Any] | None = None  # what listings say of it (LLM.details), once loaded
    loading: asyncio.Future[None] | None = None

    @property
    def is_idle(self) -> bool:
        """Loaded, no request holds it or waits for it, and its engine has nothing left to run."""
        s = self.serving
        idle = self.num_in_use == 0 and self.num_waiting == 0
        return s is not None and idle and s.engine.num_unfinished_seqs == 0


class ModelPool:
    """The models of a multi-model server (see the module docstring)."""

    def __init__(self, config: ServerConfig, models: dict[str, str], start: Starter) -> None:
        """`models`: {name: spec} (model_catalog.py), the first the default; `start`: loads one model's
        config into a running `Serving` (worker thread)."""
        self.config = config
        self.entries = {name: PoolEntry(name, spec) for name, spec in models.items()}
        self.default = next(iter(self.entries))
        self.start = start
        self.responses = ResponseStore()  # shared: a stored response is found whichever model wrote it
        self.created = int(time.time())
        self._load_lock = asyncio.Lock()
        self._closed = False
        self._stop_waiting = asyncio.Event()
        # loads run on a thread of their own, not the loop's default executor, which asyncio.run joins as it
        # ends: a server stopped mid-load would wait there for the load instead of exiting (app.py `serve`)
        self._loader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="blazr-load")

    # -------------------------------------------------------------------------------------- lookup

    def entry(self, name: str | None) -> PoolEntry:
        """The model a request names (Ollama's `:latest` optional; none: the default); else a 404."""
        if not name:
            return self.entries[self.default]
        found = self.entries.get(name) or self.entries.get(name.removesuffix(":latest"))
        if found is None:
            message = f"The model `{shorten(name)}` does not exist."
            raise APIError(404, message, param="model", code="model_not_found")
        return found

    def loaded(self) -> list[PoolEntry]:
        return [e for e in self.entries.values() if e.serving is not None]

    def any_serving(self) -> Serving | None:
        """A loaded model, if any (routes that need no particular model: stored responses)."""
        return next((e.serving for e in self.entries.values() if e.serving is not None), None)

    def timeout(self, entry: PoolEntry) -> float | None:
        """Seconds of idling after which `entry` sleeps (None: never)."""
        return entry.keep_alive if entry.keep_alive is not None else self.config.sleep_idle_seconds

    # ---------------------------------------------------------------------------------- acquire

    async def acquire(self, name: str | None) -> tuple[PoolEntry, Serving]:
        """The model's Serving, loaded if needed, counted in use until `release(entry)`. 404 for an unknown
        name, 503 with a one-line reason when it cannot be loaded."""
        entry = self.entry(name)
        while True:
            if self._closed:
                raise APIError(503, "the server is shutting down", code="shutting_down")
            if entry.serving is not None and entry.state == "loaded":
                entry.num_in_use += 1
                entry.last_used = time.monotonic()
                return entry, entry.serving
            if entry.state == "failed" and time.monotonic() - entry.failed_at < RETRY_FAILED_S:
                raise self._failed(entry)
            if entry.loading is None:
                entry.loading = asyncio.ensure_future(self._load(entry))
            entry.num_waiting += 1
            try:
                await self._wait_for(entry.loading)
            finally:
                entry.num_waiting -= 1
            if entry.state == "failed":
                raise self._failed(entry)

    async def _wait_for(self, load: asyncio.Future[None]) -> None:
        """Until `load` ends — or the server's drain stops waiting for requests in flight (`stop_waiting`):
        a 503 then, while the load goes on (a load cannot stop part-way; `serve` exits past it)."""
        shielded = asyncio.shield(load)
        stop = asyncio.ensure_future(self._stop_waiting.wait())
        try:
            await asyncio.wait({shielded, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not shielded.done():
                shielded.cancel()  # this request stops waiting; the load itself is shielded
        if shielded.cancelled():
            raise APIError(503, "the server is shutting down", code="shutting_down")
        shielded.result()

    def stop_waiting(self) -> None:
        """The drain's window is over: requests waiting for a model's load are answered 503 now."""
        self._stop_waiting.set()

    def loading(self) -> list[str]:
        """The models whose load has started and not ended."""
        return [e.name for e in self.entries.values() if e.state == "loading"]

    def release(self, entry: PoolEntry) -> None:
        entry.num_in_use -= 1
        entry.last_used = time.monotonic()

    @staticmethod
    def _failed(entry: PoolEntry) -> APIError:
        message = f"model `{entry.name}` failed to load: {entry.error}"
        return APIError(503, message, param="model", code="model_load_failed")

    # ------------------------------------------------------------------------------ load / unload

    async def _load(self, entry: PoolEntry) -> None:
        entry.state = "loading"  # (queued behind another model's load, maybe)
        try:
            async with self._load_lock:
                await self._make_room()
                held = sum(e.cache_bytes for e in self.loaded())
                shares = max(1, min(self.config.max_loaded_models, len(self.entries)) - len(self.loaded()))
                t0 = time.perf_counter()
                try:
                    loop = asyncio.get_running_loop()
                    serving, cache_bytes = await loop.run_in_executor(
                        self._loader, self._start, entry, held, shares
                    )
                except Exception as e:
                    entry.state, entry.failed_at = "failed", time.monotonic()
                    entry.error = reason(e, entry)
                    print(f"blazr serve: model {entry.name} failed to load: {entry.error}", file=sys.stderr)
                    if not _is_expected(e):
                        log.exception("loading model %s failed", entry.name)
                    return
                if self._closed:
                    await asyncio.to_thread(_stop, serving)
                    return
                entry.serving, entry.cache_bytes, entry.error = serving, cache_bytes, None
                entry.details = serving.details
                entry.load_seconds = time.perf_counter() - t0
                entry.num_loads += 1
                entry.last_used = time.monotonic()
                entry.state = "loaded"
                what = "reloaded" if entry.num_loads > 1 else "loaded"
                print(
                    f"blazr serve: model {entry.name} {what} in {entry.load_seconds:.2f}s "
                    f"({serving.format.describe()})",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            entry.loading = None

    def _start(self, entry: PoolEntry, held_bytes: int, num_shares: int) -> tuple[Serving, int]:
        """Worker thread: this model's config, its share of the cache budget, loaded and started."""
        from blazr.state.budget import shared_budget

        cfg = self.config
        load = replace(cfg.load, model=entry.spec or None)
        engine = cfg.engine
        if not engine.num_kv_blocks:
            budget = shared_budget(engine, held_bytes, num_shares, "cpu" if load.cpu else None)
            engine = replace(engine, cache_memory_gib=budget / _GiB)
        one = replace(
            cfg, load=load, engine=engine, served_model_names=(entry.name,), models=(), models_dir=None
        )
        return self.start(one)

    async def _make_room(self) -> None:
        """Unload least recently used idle models until one more fits under max_loaded_models."""
        while len(self.loaded()) >= self.config.max_loaded_models:
            idle = [e for e in self.loaded() if e.is_idle]
            if not idle:
                await asyncio.sleep(ROOM_POLL_S)
                continue
            lru = min(idle, key=lambda e: e.last_used)
            await self.unload(lru, "unloaded", "to make room")

    async def unload(self, entry: PoolEntry, state: ModelState, why: str) -> None:
        """Stop `entry`'s engine and free its weights and cache pools (state `unloaded` or `sleeping`)."""
        serving = entry.serving
        if serving is None:
            return
        entry.serving, entry.cache_bytes, entry.keep_alive = None, 0, None
        entry.state = state
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry.loading = done  # a request for it now waits for the memory to be freed, then reloads it
        try:
            await asyncio.to_thread(_stop, serving)
            del serving
            await asyncio.to_thread(free_memory)
        finally:
            entry.loading = None
            done.set_result(None)
        print(f"blazr serve: model {entry.name} {state} ({why})", file=sys.stderr, flush=True)

    async def run_idle_timer(self) -> None:
        """Forever (a task of the lifespan): put models idle longer than their timeout to sleep."""
        timeouts = [self.config.sleep_idle_seconds or 1.0]
        while not self._closed:
            tick = min(1.0, max(0.02, min(timeouts) / 4))
            await asyncio.sleep(tick)
            now = time.monotonic()
            timeouts = [self.config.sleep_idle_seconds or 1.0]
            for entry in self.loaded():
                timeout = self.timeout(entry)
                if timeout is None:
                    continue
                timeouts.append(max(timeout, 0.02))
                if entry.is_idle and entry.loading is None and now - entry.last_used >= timeout:
                    try:
                        await self.unload(entry, "sleeping", f"idle for {timeout:g}s")
                    except Exception:  # the timer goes on for the other models
                        log.exception("unloading model %s failed", entry.name)

    async def close(self) -> None:
        """Stop every engine (the server is stopping)."""
        self._closed = True
        self._loader.shutdown(wait=False)
        for entry in self.loaded():
            serving, entry.serving = entry.serving, None
            if serving is not None:
                await asyncio.to_thread(_stop, serving)


def _stop(serving: Serving) -> None:
    serving.engine.shutdown()
    serving.close()


def free_memory() -> None:
    """Collect garbage and hand the heap's free pages back to the OS (glibc), so RSS reflects an unload.
    First the quantization cache's writes in flight finish (loading/quant_cache.py): a write holds the
    weights it writes, and a reload maps the file it leaves instead of quantizing again."""
    from blazr.loading import quant_cache

    quant_cache.wait()
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: the allocator keeps its free pages
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def _is_expected(e: Exception) -> bool:
    from blazr.errors import BlazrError

    return isinstance(e, (BlazrError, OSError, ValueError))


def reason(e: Exception, entry: PoolEntry) -> str:
    """Why a model failed to load, in one line for clients: a blazr error's own message with the model's
    path shown as its name (no directory of the server's reaches a client); anything else, no internals."""
    if not _is_expected(e):
        return "internal error (see the server log)"
    text = (str(e).strip().splitlines() or [type(e).__name__])[0]
    if entry.spec:
        from pathlib import Path

        for path in sorted({str(Path(entry.spec).expanduser().resolve()), entry.spec}, key=len, reverse=True):
            text = text.replace(path, entry.name)
    return shorten(text, 300)
