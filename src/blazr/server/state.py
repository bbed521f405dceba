"""ServerState: what the routes read — load status, the serving object once ready, metrics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from blazr.server.metrics import Metrics
from blazr.server.options import ServerConfig
from blazr.server.serving import OpenAIServing


@dataclass
class ServerState:
    config: ServerConfig
    metrics: Metrics
    status: Literal["loading", "ready", "failed"] = "loading"
    error: str | None = None
    serving: OpenAIServing | None = None
    load_seconds: float = 0.0
    on_load_failed: list[Callable[[str], None]] = field(default_factory=list)
