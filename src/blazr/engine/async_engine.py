"""AsyncEngine: the LLMEngine loop on its own thread, bridged to asyncio.

Callers (HTTP handlers) `submit()` a request and iterate its outputs; the engine thread applies queued
adds/aborts between steps, runs `step()` while there is work and sleeps on a condition when idle. Outputs
are handed to each request's asyncio.Queue with `call_soon_threadsafe`. Leaving the iteration early (client
disconnect, cancellation) aborts the request, which frees its cache slots at the next step boundary.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from blazr.engine.engine import LLMEngine, QueueFullError, SeqOutput
from blazr.engine.sampling import SamplingParams

log = logging.getLogger("blazr.engine")


@dataclass
class _Add:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    queue: asyncio.Queue[SeqOutput | BaseException]
    loop: asyncio.AbstractEventLoop


class AsyncEngine:
    def __init__(self, engine: LLMEngine, on_step: Callable[[LLMEngine], None] | None = None) -> None:
        self.engine = engine
        self.on_step = on_step  # called on the engine thread after every step (metrics gauges)
        self._cv = threading.Condition()
        self._adds: list[_Add] = []
        self._aborts: list[str] = []
        self._streams: dict[str, _Add] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="blazr-engine", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=10)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    # ------------------------------------------------------------------------------------ caller side

    async def submit(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[SeqOutput]:
        """Validate (raises BlazrError / QueueFullError before anything streams), then stream outputs."""
        self.engine.validate(prompt_ids, params)
        queue: asyncio.Queue[SeqOutput | BaseException] = asyncio.Queue()
        add = _Add(request_id, prompt_ids, params, queue, asyncio.get_running_loop())
        with self._cv:
            if self.error is not None:
                raise RuntimeError(f"the engine stopped: {self.error}")
            if self.engine.num_waiting + len(self._adds) >= self.engine.cfg.max_waiting:
                raise QueueFullError(f"the waiting queue is full ({self.engine.cfg.max_waiting} requests)")
            self._adds.append(add)
            self._cv.notify()
        return self._stream(add)

    async def _stream(self, add: _Add) -> AsyncIterator[SeqOutput]:
        remaining = add.params.n
        try:
            while remaining:
                item = await add.queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item.finished:
                    remaining -= 1
                yield item
        finally:
            if remaining:
                self.abort(add.request_id)

    def abort(self, request_id: str) -> None:
        with self._cv:
            self._aborts.append(request_id)
            self._cv.notify()

    # ------------------------------------------------------------------------------------ engine side

    def _loop(self) -> None:
        try:
            while True:
                with self._cv:
                    while not (self._stop or self._adds or self._aborts or self.engine.has_unfinished()):
                        self._cv.wait()
                    if self._stop:
                        return
                    adds, self._adds = self._adds, []
                    aborts, self._aborts = self._aborts, []
                for add in adds:
                    self._apply_add(add)
                for rid in aborts:
                    self.engine.abort_request(rid)
                    self._streams.pop(rid, None)
                outputs = self.engine.step()
                for out in outputs:
                    self._deliver(out)
                if self.on_step is not None:
                    self.on_step(self.engine)
        except BaseException as e:  # a bug: fail every waiting stream instead of hanging them
            log.exception("engine loop crashed")
            self.error = e
            for add in list(self._streams.values()):
                add.loop.call_soon_threadsafe(add.queue.put_nowait, RuntimeError(f"engine failure: {e}"))

    def _apply_add(self, add: _Add) -> None:
        try:
            self.engine.add_request(add.request_id, add.prompt_ids, add.params)
        except Exception as e:  # validated already; a race with the queue bound, or a duplicate id
            add.loop.call_soon_threadsafe(add.queue.put_nowait, e)
            return
        self._streams[add.request_id] = add

    def _deliver(self, out: SeqOutput) -> None:
        add = self._streams.get(out.request_id)
        if add is None:
            return
        add.loop.call_soon_threadsafe(add.queue.put_nowait, out)
        if out.finished and out.request_id not in self.engine.requests:
            self._streams.pop(out.request_id, None)
