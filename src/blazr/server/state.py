"""ServerState: what the routes read — lifecycle status, the serving object once ready (or the model pool of
a multi-model server), metrics, and the count of /v1 requests in flight (what a drain waits on)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from blazr.server.metrics import Metrics
from blazr.server.model_pool import ModelPool
from blazr.server.options import ServerConfig
from blazr.server.serving import Serving

# loading → ready → draining (SIGTERM) ; loading → failed (load error) ; ready → failed (engine died)
Status = Literal["loading", "ready", "draining", "failed"]


@dataclass
class ServerState:
    config: ServerConfig
    metrics: Metrics
    status: Status = "loading"
    error: str | None = None  # why `failed`: one line for /health, never internal exception text
    serving: Serving | None = None  # one model, once loaded
    pool: ModelPool | None = None  # several models (model_pool.py): then `serving` stays None
    load_seconds: float = 0.0
    loading: threading.Thread | None = None  # the loader of a one-model server (daemon; app.py `_load`)
    num_in_flight: int = 0  # /v1 requests whose response is not complete (event-loop thread only)
    on_load_failed: list[Callable[[str], None]] = field(default_factory=list)

    def add_in_flight(self, delta: int) -> None:
        self.num_in_flight += delta

    def servings(self) -> list[Serving]:
        """Every model loaded now."""
        if self.pool is not None:
            return [e.serving for e in self.pool.loaded() if e.serving is not None]
        return [self.serving] if self.serving is not None else []
