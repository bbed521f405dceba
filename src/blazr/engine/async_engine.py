"""AsyncEngine: the LLMEngine loop on its own thread, bridged to asyncio.

Callers (HTTP handlers) `await generate(requests)`: a group of requests (one per prompt of an API call) is
handed to the engine thread, which adds them between two steps and acknowledges. Errors a request can meet
when it is added (`BlazrError` → HTTP 400, `QueueFullError` → 503, `EngineDeadError` → 500) are raised by
`generate` itself, before any byte is streamed. It then returns a `RequestStream` that yields every
`SeqOutput` of the group (deltas of all prompts and all n samples, interleaved as the engine produces them)
and raises `RequestFailedError` if the engine failed one of them (the rest of the group is aborted), or
`RequestCancelledError` when the server cancels it (shutdown).

Admission is counted in sequences (n per request): the engine holds at most `max_num_seqs` running plus
`max_waiting` waiting, so a burst is refused (QueueFullError) only when it truly exceeds both, and a call
that needs more than that at once can never run (BlazrError).

The engine thread applies queued adds/aborts between steps, runs `step()` while there is work and sleeps
on a condition when idle. A step's outputs go to their groups' asyncio.Queues in one `call_soon_threadsafe`
per event loop (one wake-up per step, not per token); `RequestStream.batches()` hands a reader everything
already delivered, so a server can answer a step's tokens in one write. Leaving a
stream early (client disconnect, cancellation, `aclose()`) aborts its unfinished requests, which frees
their cache blocks and state slots at the next step boundary.

Metrics: an optional `EngineObserver` sees, on the engine thread, every token batch (with time to first
token and inter-token gaps measured from submission) and every finished request; the engine's own counts
(sequences running and waiting, cache usage, the prefix cache's queries and hits) are properties any
thread may read.

If the loop itself raises (a bug, a broken device, see engine.py), every open stream fails with
`EngineDeadError` and `on_fatal(error)` is called (the server exits non-zero on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from blazr.engine.engine import LLMEngine
from blazr.engine.failures import QueueFullError
from blazr.engine.grammar import StructuredOutput
from blazr.engine.outputs import SeqOutput
from blazr.engine.sampling import SamplingParams
from blazr.engine.speculative import SpecStats
from blazr.errors import BlazrError

log = logging.getLogger("blazr.engine")


class EngineDeadError(RuntimeError):
    """The engine loop stopped (a bug or shutdown); requests fail with HTTP 500 instead of hanging."""


class RequestFailedError(RuntimeError):
    """The engine failed this request (an exception while serving it, logged under `request_id`)."""

    def __init__(self, request_id: str) -> None:
        super().__init__(f"request {request_id} failed")
        self.request_id = request_id


class RequestCancelledError(RuntimeError):
    """The server cancelled the request before it finished (shutdown)."""


@dataclass(frozen=True)
class EngineRequest:
    """One prompt of an API call, already tokenized and validated by the caller's schema layer."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams


class EngineObserver(Protocol):
    """Metrics hooks, called on the engine thread (keep them cheap and non-blocking)."""

    def on_tokens(self, num_tokens: int, ttft: float | None, itl: float | None) -> None:
        """One sequence produced `num_tokens`; `ttft` on the request's first token, else the `itl` gap."""

    def on_prompt(self, num_prompt_tokens: int) -> None:
        """A request's prompt was computed (its first token was sampled)."""

    def on_finished(
        self, finish_reason: str, e2e: float, num_prompt_tokens: int, num_generation_tokens: int
    ) -> None:
        """A request finished: its last sequence ended (`stop`, `length` or `abort`)."""


_ACCEPTED = object()  # first queue item of a group the engine took


@dataclass
class _Group:
    requests: list[EngineRequest]
    queue: asyncio.Queue[object]
    loop: asyncio.AbstractEventLoop
    submitted: float


@dataclass
class _Live:
    """A request the engine holds: where its outputs go, and its timing for the observer."""

    group: _Group
    submitted: float
    num_prompt_tokens: int
    num_seqs: int  # sequences not finished yet (of n)
    first_token: float | None = None
    last_token: dict[int, float] = field(default_factory=dict)  # sequence index → time of its last token
    num_generated: int = 0
    reasons: set[str] = field(default_factory=set)


class RequestStream:
    """The outputs of one `generate` call; iterate it (`async for out in stream`) once. Closing it early
    (`aclose()`, or a cancelled consumer) aborts the requests that have not finished."""

    def __init__(self, engine: AsyncEngine, group: _Group) -> None:
        self._engine = engine
        self._group = group
        self._remaining = sum(r.params.n for r in group.requests)
        self._unfinished = {r.request_id: r.params.n for r in group.requests}

    @property
    def request_ids(self) -> list[str]:
        return [r.request_id for r in self._group.requests]

    def __aiter__(self) -> AsyncIterator[SeqOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[SeqOutput]:
        try:
            async for batch in self.batches():
                for out in batch:
                    yield out
        finally:  # left early: abort now, not when the inner generator is collected
            self.abort()

    async def batches(self) -> AsyncIterator[list[SeqOutput]]:
        """The outputs in batches: each waits for one, then takes every output already delivered (one
        engine step's worth, or more when the reader fell behind), so a reader can answer them in one
        write. An engine error is raised after the outputs that came before it."""
        queue = self._group.queue
        error: BaseException | None = None  # met after some outputs: raised once they are delivered
        try:
            while self._remaining:
                if error is not None:
                    raise error
                batch: list[SeqOutput] = []
                item = await queue.get()
                while True:
                    if isinstance(item, BaseException):
                        if not batch:
                            raise item
                        error = item
                        break
                    assert isinstance(item, SeqOutput)
                    batch.append(item)
                    if item.finished:
                        self._remaining -= 1
                        self._unfinished[item.request_id] -= 1
                    if not self._remaining or queue.empty():
                        break
                    item = queue.get_nowait()
                yield batch
        finally:
            self.abort()

    def __del__(self) -> None:  # a stream dropped without being iterated to the end
        if self._remaining:
            self.abort()

    def abort(self) -> None:
        """Abort every request of the group that has not finished (idempotent)."""
        ids = [rid for rid, left in self._unfinished.items() if left > 0]
        if ids:
            self._unfinished = dict.fromkeys(self._unfinished, 0)
            self._remaining = 0
            self._engine.abort(ids)


class AsyncEngine:
    """Owns the engine thread. `start()` it once; `generate()` from any asyncio loop; `shutdown()`."""

    def __init__(
        self,
        engine: LLMEngine,
        observer: EngineObserver | None = None,
        num_threads: int | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.engine = engine
        self.observer = observer
        self.num_threads = num_threads  # torch intra-op threads of the engine thread (None: torch's default)
        self.on_fatal = on_fatal  # called on the engine thread when the loop cannot go on
        self._cv = threading.Condition()
        self._adds: list[_Group] = []
        self._aborts: list[str] = []
        self._cancel: BaseException | None = None  # cancel_all() asked: fail every request with this
        self._live: dict[str, _Live] = {}  # request id → its state (engine thread only)
        self._outbox: dict[asyncio.AbstractEventLoop, list[tuple[_Group, object]]] = {}  # (engine thread)
        self._num_seqs = 0  # sequences (Σ n) of the requests accepted and not finished (under _cv)
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="blazr-engine", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the loop after the current step; every stream still open fails with EngineDeadError."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and self.error is None and not self._stop

    # ------------------------------------------------------------------------------------ stats (any thread)

    @property
    def num_running(self) -> int:
        return self.engine.num_running

    @property
    def num_waiting(self) -> int:
        return self.engine.num_waiting + sum(len(g.requests) for g in list(self._adds))

    @property
    def num_unfinished_seqs(self) -> int:
        """Sequences (Σ n) of the requests accepted and not finished yet."""
        return self._num_seqs

    @property
    def capacity(self) -> int:
        """Sequences admitted at once: a full running batch plus the waiting queue."""
        return self.engine.cfg.max_num_seqs + self.engine.cfg.max_waiting

    @property
    def cache_usage(self) -> float:
        return self.engine.cache_usage

    @property
    def prefix_cache_queries(self) -> int:
        """Prompt tokens looked up in the prefix cache since the engine started."""
        return self.engine.prefix_cache_queries

    @property
    def prefix_cache_hits(self) -> int:
        """Of those, the tokens found cached (their prefill skipped)."""
        return self.engine.prefix_cache_hits

    @property
    def spec_stats(self) -> SpecStats | None:
        """Speculative decoding's cumulative counts (None: speculation off)."""
        spec = self.engine.speculator
        return spec.stats if spec is not None else None

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    @property
    def max_model_len(self) -> int:
        return self.engine.cfg.max_model_len

    # ------------------------------------------------------------------------------------ caller side

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """The engine's own checks (empty prompt, token ids out of range, context length) → BlazrError."""
        self.engine.validate(prompt_ids, params)

    def compile_grammar(self, spec: StructuredOutput) -> None:
        """Check and compile a structured-output spec (BlazrError if invalid); cached, so that `generate`
        finds it compiled. Thread-safe: the server calls it off its event loop."""
        self.engine.grammars.compile(spec)

    async def generate(self, requests: Sequence[EngineRequest]) -> RequestStream:
        """Hand the requests to the engine; returns once they are queued (or raises: BlazrError for a request
        that can never run, QueueFullError when the waiting queue is full, EngineDeadError)."""
        if not requests:
            raise BlazrError("no prompt given")
        for r in requests:
            self.engine.validate(r.prompt_ids, r.params)
        need = sum(r.params.n for r in requests)
        if need > self.capacity:
            raise BlazrError(
                f"this request needs {need} sequences (prompts × n) but the server holds at most "
                f"{self.capacity} at once (max_num_seqs {self.engine.cfg.max_num_seqs} + max_waiting "
                f"{self.engine.cfg.max_waiting})"
            )
        group = _Group(list(requests), asyncio.Queue(), asyncio.get_running_loop(), time.monotonic())
        with self._cv:
            if self.error is not None or self._stop:
                raise EngineDeadError("the engine has stopped")
            if self._num_seqs + need > self.capacity:
                raise QueueFullError(
                    f"the server is busy: {self._num_seqs} sequences are running or waiting, the most it "
                    f"holds is {self.capacity}"
                )
            self._num_seqs += need
            self._adds.append(group)
            self._cv.notify()
        stream = RequestStream(self, group)
        try:
            first = await group.queue.get()
        except BaseException:  # cancelled while queued: the engine may have taken it already
            stream.abort()
            raise
        if isinstance(first, BaseException):
            raise first
        assert first is _ACCEPTED
        return stream

    def abort(self, request_ids: Sequence[str]) -> None:
        with self._cv:
            self._aborts.extend(request_ids)
            self._cv.notify()

    def cancel_all(self, error: BaseException) -> None:
        """Fail every accepted request with `error` (at the next step boundary); the engine goes on."""
        with self._cv:
            self._cancel = error
            self._cv.notify()

    # ------------------------------------------------------------------------------------ engine side

    def _loop(self) -> None:
        try:
            if self.num_threads:
                torch.set_num_threads(self.num_threads)
            while True:
                with self._cv:
                    while not (
                        self._stop
                        or self._adds
                        or self._aborts
                        or self._cancel
                        or self.engine.has_unfinished()
                    ):
                        self._cv.wait()
                    if self._stop:
                        break
                    adds, self._adds = self._adds, []
                    aborts, self._aborts = self._aborts, []
                    cancel, self._cancel = self._cancel, None
                for group in adds:
                    self._apply(group)
                for rid in aborts:
                    self._abort(rid)
                if cancel is not None:
                    self._cancel_live(cancel)
                self._flush()  # acceptances and cancellations before the step runs
                for out in self.engine.step():
                    self._deliver(out)
                self._flush()
            self._fail_all(EngineDeadError("the server is shutting down"))
        except BaseException as e:  # the loop cannot go on: fail every stream instead of hanging it
            log.critical("the engine loop stopped", exc_info=e)
            with self._cv:
                self.error = e
            self._fail_all(EngineDeadError("the engine stopped after an internal error"))
            if self.on_fatal is not None:
                self.on_fatal(e)

    def _post(self, group: _Group, item: object) -> None:
        """Queue `item` for `group`'s stream; sent with the rest of the step's items by `_flush`."""
        self._outbox.setdefault(group.loop, []).append((group, item))

    def _flush(self) -> None:
        """Hand the items posted since the last flush to their event loops: one wake-up per loop and step,
        not one per token."""
        outbox, self._outbox = self._outbox, {}
        for loop, items in outbox.items():
            with contextlib.suppress(RuntimeError):  # the caller's loop is closed (shutdown): nobody to tell
                loop.call_soon_threadsafe(_dispatch, items)

    def _fail_all(self, error: BaseException) -> None:
        with self._cv:
            pending, self._adds = self._adds, []
            self._num_seqs = 0
        groups = {id(g): g for g in [*(live.group for live in self._live.values()), *pending]}
        for g in groups.values():
            self._post(g, error)
        self._live.clear()
        self._flush()

    def _cancel_live(self, error: BaseException) -> None:
        """Abort every live request (its cache freed) and fail its stream with `error`."""
        for rid in list(self._live):
            live = self._live[rid]
            self._abort(rid)
            self._post(live.group, error)

    def _release(self, num_seqs: int) -> None:
        """`num_seqs` accepted sequences finished (or were aborted): room for as many new ones."""
        with self._cv:
            self._num_seqs -= num_seqs

    def _apply(self, group: _Group) -> None:
        added: list[str] = []
        try:
            for r in group.requests:
                self.engine.add_request(r.request_id, r.prompt_ids, r.params)
                added.append(r.request_id)
        except Exception as e:  # validated already: n > max_num_seqs, a duplicate id
            for rid in added:
                self.engine.abort_request(rid)
            with self._cv:
                self._num_seqs -= sum(r.params.n for r in group.requests)
            self._post(group, e)
            return
        for r in group.requests:
            self._live[r.request_id] = _Live(group, group.submitted, len(r.prompt_ids), r.params.n)
        self._post(group, _ACCEPTED)

    def _abort(self, request_id: str) -> None:
        outs = self.engine.abort_request(request_id)  # not delivered: nobody is listening any more
        live = self._live.pop(request_id, None)
        if live is None:
            return
        self._release(live.num_seqs)
        if outs and self.observer is not None:
            e2e = time.monotonic() - live.submitted
            self.observer.on_finished("abort", e2e, live.num_prompt_tokens, live.num_generated)

    def _deliver(self, out: SeqOutput) -> None:
        live = self._live.get(out.request_id)
        if live is None:
            return
        if out.finish_reason == "error":  # the engine logged why; the client gets the request id
            del self._live[out.request_id]
            self._release(live.num_seqs)
            self._post(live.group, RequestFailedError(out.request_id))
            if self.observer is not None:
                e2e = time.monotonic() - live.submitted
                self.observer.on_finished("error", e2e, live.num_prompt_tokens, live.num_generated)
            return
        self._post(live.group, out)
        now = time.monotonic()
        obs = self.observer
        if out.token_ids:
            ttft = itl = None
            if live.first_token is None:
                live.first_token = now
                ttft = now - live.submitted
                if obs is not None:
                    obs.on_prompt(live.num_prompt_tokens)
            elif out.index in live.last_token:
                itl = now - live.last_token[out.index]
            live.last_token[out.index] = now
            live.num_generated += len(out.token_ids)
            if obs is not None:
                obs.on_tokens(len(out.token_ids), ttft, itl)
        if out.finished:
            live.reasons.add(out.finish_reason or "abort")
            live.num_seqs -= 1
            self._release(1)
            if live.num_seqs <= 0:
                del self._live[out.request_id]
                if obs is not None:
                    reason = next((r for r in ("abort", "length") if r in live.reasons), "stop")
                    obs.on_finished(reason, now - live.submitted, live.num_prompt_tokens, live.num_generated)


def _dispatch(items: list[tuple[_Group, object]]) -> None:
    """On the event loop: one engine step's items into their streams' queues."""
    for group, item in items:
        group.queue.put_nowait(item)
