"""How `blazr serve` stops: a graceful drain on SIGTERM / SIGINT, an immediate non-zero exit when the
engine dies.

Drain (first SIGTERM or SIGINT): the status turns "draining" — `/health` and every new /v1 request answer
503 JSON while the listening socket stays open, so a load balancer sees the state instead of refused
connections. Requests already in flight run to completion for up to `shutdown_timeout` seconds; what is
left then is cancelled (a stream ends with an SSE error event and `data: [DONE]`, a non-streaming call gets
503 JSON), and uvicorn shuts down. The process exits 0. A second signal skips the wait.

Engine death (`on_engine_fatal`, called on the engine thread): the status turns "failed" (`/health` 503),
open streams have already been failed by the engine, and the server exits at once with status 1 so that a
supervisor restarts it — never a live process that answers 500 forever. A watchdog ends the process if the
orderly exit hangs.

The drain waits on `ServerState.num_in_flight`, kept by the `InFlight` middleware (middleware.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

import uvicorn

from blazr.engine.async_engine import RequestCancelledError
from blazr.server.state import ServerState

log = logging.getLogger("blazr.server")

EXIT_ENGINE_FAILED = 1
FATAL_EXIT_GRACE_S = 10.0  # how long an orderly exit after engine death may take before os._exit
CANCEL_GRACE_S = 5.0  # after cancelling what is left of a drain, how long responses get to finish


class BlazrServer(uvicorn.Server):
    """uvicorn.Server whose signals start a drain instead of cutting connections."""

    def __init__(self, config: uvicorn.Config, state: ServerState, shutdown_timeout: float) -> None:
        super().__init__(config)
        self.state = state
        self.shutdown_timeout = shutdown_timeout
        self.exit_code = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self._hurry = asyncio.Event()  # a second signal: stop waiting for in-flight requests

    async def startup(self, sockets: list[Any] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Signal handler (main thread). Not recorded in `_captured_signals`: uvicorn would re-raise it
        after shutdown and the process would die of it instead of exiting 0."""
        loop = self._loop
        if loop is None or self.should_exit:  # not serving yet, or already stopping: stop now
            if self.should_exit:
                self.force_exit = True
            self.should_exit = True
            return
        if self._drain_task is None:
            name = signal.Signals(sig).name
            loop.call_soon_threadsafe(self._start_drain, name)
        else:
            loop.call_soon_threadsafe(self._hurry.set)

    def _start_drain(self, reason: str) -> None:
        if self._drain_task is None:
            self._drain_task = asyncio.ensure_future(self.drain(reason))

    async def drain(self, reason: str) -> None:
        """Stop admitting, let in-flight requests finish (bounded), cancel the rest, then stop uvicorn."""
        state = self.state
        if state.status == "ready":
            state.status = "draining"
        t0 = time.monotonic()
        if not state.num_in_flight:  # nothing to wait for: one line
            print(f"blazr serve: {reason}, nothing in flight — drained in 0.0s; stopping", file=sys.stderr)
            self.should_exit = True
            return
        print(
            f"blazr serve: {reason} — draining: new requests get 503; {state.num_in_flight} in flight get "
            f"up to {self.shutdown_timeout:g}s to finish (send the signal again to stop now)",
            file=sys.stderr,
            flush=True,
        )
        if not await self._wait_idle(self.shutdown_timeout):
            left = state.num_in_flight
            for serving in state.servings():
                serving.engine.cancel_all(RequestCancelledError("the server is shutting down"))
            if state.pool is not None:  # and requests waiting for a model's load
                state.pool.stop_waiting()
            await self._wait_idle(CANCEL_GRACE_S, hurry=False)
            print(f"blazr serve: cancelled {left} request(s) still in flight", file=sys.stderr, flush=True)
        print(f"blazr serve: drained in {time.monotonic() - t0:.1f}s; stopping", file=sys.stderr, flush=True)
        self.should_exit = True

    async def _wait_idle(self, timeout: float, hurry: bool = True) -> bool:
        """Wait until no /v1 request is in flight (True) or `timeout` passes / a second signal (False)."""
        deadline = time.monotonic() + timeout
        while self.state.num_in_flight > 0:
            if time.monotonic() >= deadline or (hurry and self._hurry.is_set()):
                return False
            await asyncio.sleep(0.02)
        return True

    def on_engine_fatal(self, error: BaseException) -> None:
        """The engine loop stopped (engine thread): mark the server failed and exit non-zero now."""
        self.state.status = "failed"
        self.state.error = "the engine stopped after an internal error"
        self.exit_code = EXIT_ENGINE_FAILED
        print(
            f"blazr serve: the engine stopped ({type(error).__name__}, traceback above); exiting with "
            f"status {EXIT_ENGINE_FAILED} so that a supervisor can restart the server",
            file=sys.stderr,
            flush=True,
        )
        watchdog = threading.Timer(FATAL_EXIT_GRACE_S, os._exit, args=(EXIT_ENGINE_FAILED,))
        watchdog.daemon = True
        watchdog.start()
        self.should_exit = True  # uvicorn's main loop polls it every 0.1 s
