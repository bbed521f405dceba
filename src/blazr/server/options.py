"""`ServerConfig`: what `blazr serve` needs — the model to load (`LoadConfig`), the engine's settings
(`EngineConfig`) and the server's own HTTP fields — and the `blazr serve` flags generated from it.

Every flag is a field (config_flags.py walks the tree; tests/test_config_tree.py checks both directions).
The API key comes from --api-key, else the BLAZR_API_KEY environment variable; --log-level defaults to
BLAZR_LOG. --ray and the replica counts are read by server/ray_serve.py (replicas on Ray Serve).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from blazr import config_flags
from blazr.config_flags import option, positive_int, seconds
from blazr.engine_config import EngineConfig
from blazr.load_config import LoadConfig
from blazr.server.reasoning import CHANNEL_FORMATS, REASONING_PARSERS
from blazr.server.tool_parsers import TOOL_PARSERS


@dataclass(frozen=True)
class ServerConfig:
    """The HTTP server: address, API key, limits, parsers, replicas."""

    load: LoadConfig = field(default_factory=LoadConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    host: str = option("0.0.0.0", help="address to bind")
    port: int = option(8080, parse=positive_int, help="port")
    api_key: str | None = option(
        None,
        env="BLAZR_API_KEY",
        help="require `Authorization: Bearer KEY` on /v1/* (env BLAZR_API_KEY); /health, /metrics stay open",
    )
    served_model_names: tuple[str, ...] = option(
        (),
        flag="--served-model-name",
        metavar="NAME",
        help="model name(s) the API answers to; the first is reported in responses (default: --model as "
        "given, or the embedded model's name)",
    )
    models: tuple[str, ...] = option(
        (),
        metavar="MODEL",
        help="more models to serve beside --model, each a checkpoint dir, .gguf file or HF repo id "
        "(repeating --model adds to these); a request picks one by its `model` field, loaded on first use",
    )
    models_dir: str | None = option(
        None,
        metavar="DIR",
        help="serve every checkpoint in DIR (each *.gguf file, each subdirectory holding one), named by "
        "file stem / directory name, loaded on first use",
    )
    max_loaded_models: int = option(
        4,
        parse=positive_int,
        metavar="N",
        help="with several models: at most N loaded at once, the least recently used unloaded beyond "
        "(as llama-server's --models-max); they share one cache memory budget",
    )
    sleep_idle_seconds: float | None = option(
        None,
        parse=seconds,
        metavar="SECONDS",
        help="unload a model (weights and cache pools) after this long without requests; the next request "
        "reloads it (default: never)",
    )
    log_level: str = option(
        "warning", env="BLAZR_LOG", parse=str.lower, help="debug|info|warning|error (env BLAZR_LOG)"
    )
    max_request_bytes: int = option(
        8 << 20,  # 8 MiB: a 128k-token prompt is ~1 MB of text or of token ids
        parse=positive_int,
        help="largest request body accepted; larger ones get 413",
    )
    shutdown_timeout: float = option(
        30.0,
        parse=seconds,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, how long requests in flight may run on before they are cancelled",
    )
    allowed_origins: tuple[str, ...] = option(
        (),
        metavar="ORIGIN",
        help="enable CORS for these origins (e.g. https://app.example.com, or * for any); off by default",
    )
    tool_call_parser: str | None = option(
        None,
        choices=lambda: list(TOOL_PARSERS),
        auto_is_none=True,
        help="how the model writes tool calls (auto: from the chat template's markers; a template that "
        "renders no tools gets them described in the hermes format)",
    )
    reasoning_parser: str | None = option(
        None,
        choices=lambda: sorted([*REASONING_PARSERS, *CHANNEL_FORMATS]),
        help="split the model's <think>…</think> into reasoning_content (off by default; harmony, GPT-OSS's "
        "channels, is on with its template)",
    )
    ray: bool = option(
        False,
        help="engine replicas behind one endpoint on Ray Serve (local Ray, or the cluster in RAY_ADDRESS; "
        "pip install 'blazr[ray]')",
    )
    num_replicas: int | None = option(None, parse=positive_int, help="--ray: replicas (default 1)")
    min_replicas: int | None = option(
        None, parse=positive_int, help="--ray: autoscale, at least this many replicas"
    )
    max_replicas: int | None = option(
        None, parse=positive_int, help="--ray: autoscale, at most this many replicas"
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "log_level", str(self.log_level).lower())
        if not 0 < self.port < 65536:
            raise ValueError(f"port {self.port}: expected 1 … 65535")
        if self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes {self.max_request_bytes}: expected an integer ≥ 1")
        if not self.shutdown_timeout >= 0:
            raise ValueError(f"shutdown_timeout {self.shutdown_timeout}: expected seconds ≥ 0")
        if self.max_loaded_models < 1:
            raise ValueError(f"max_loaded_models {self.max_loaded_models}: expected an integer ≥ 1")
        if self.sleep_idle_seconds is not None and not self.sleep_idle_seconds > 0:
            raise ValueError(f"sleep_idle_seconds {self.sleep_idle_seconds}: expected seconds > 0")

    @property
    def is_multi_model(self) -> bool:
        """Served by the model pool (server/model_pool.py): several models, a models dir, or sleep when idle
        (one model given and no sleep: loaded at startup, as always)."""
        return bool(self.models or self.models_dir or self.sleep_idle_seconds is not None)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServerConfig:
        """Parsed `blazr serve` flags → the config (a value it refuses is a BlazrError)."""
        return config_flags.from_args(cls, args)

    @classmethod
    def of(cls, **values: Any) -> ServerConfig:
        """By leaf name, flat: `ServerConfig.of(model=…, max_num_seqs=4, api_key=…)` (config_flags.build);
        an unknown name is a TypeError."""
        return config_flags.build(cls, values)


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """Every flag of `blazr serve`: ServerConfig's tree (model loading, engine, speculative, HTTP); `--model`
    may be repeated: the first is `model`, each later one is added to `models`."""
    config_flags.add_flags(p, ServerConfig)
    for action in p._actions:
        if action.dest == "model":
            action.__class__ = _RepeatedModel
        elif action.dest == "models":
            action.__class__ = _MoreModels


class _RepeatedModel(argparse.Action):
    """`--model A --model B`: A is the model (LoadConfig.model), B is appended to `models`."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option: Any = None) -> None:
        if getattr(namespace, "model", None) is None:
            namespace.model = values
        else:
            namespace.models = [*(getattr(namespace, "models", None) or []), values]


class _MoreModels(argparse.Action):
    """`--models B C`: added to the models given so far (by a repeated --model too), in order."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option: Any = None) -> None:
        namespace.models = [*(getattr(namespace, "models", None) or []), *values]
