"""The FastAPI app: `build_app(config)` and `serve(args)` (what `blazr serve` runs).

Startup: uvicorn binds at once and the lifespan starts a loader thread, so `/health` answers 503 while the
model loads and 200 once the engine thread runs; a model that fails to load stops the server (exit 1,
one-line error). With several models (`ServerConfig.is_multi_model`) a `ModelPool` (model_pool.py) loads
each on first use instead: `/health` answers 200 at once, and a model that fails to load is that model's
503 while the others serve. SIGTERM / SIGINT drain (lifecycle.py); an engine that dies ends the process
with status 1.
Routes: OpenAI's (routes.py), Anthropic's (routes_anthropic.py), Ollama's (routes_ollama.py); the chat
page at / (chat_page.py).
Middlewares (middleware.py), outermost first: request id + in-flight count, API key (/v1/*, /api/* and the
docs; /health, /metrics and /version stay open so probes and scrapers need no secret), body-size limit.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from blazr.config import dtype_name
from blazr.engine.async_engine import AsyncEngine
from blazr.engine.engine import LLMEngine
from blazr.engine.pooling import Pooling
from blazr.errors import BlazrError
from blazr.exit_now import exit_now
from blazr.kernels.build import usable_cores
from blazr.server.chat_page import install_chat_page
from blazr.server.error_handlers import install_error_handlers
from blazr.server.lifecycle import BlazrServer
from blazr.server.metrics import Metrics
from blazr.server.middleware import ApiKey, BodyLimit, RequestContext
from blazr.server.model_catalog import catalog
from blazr.server.model_pool import ModelPool
from blazr.server.openapi import install_openapi
from blazr.server.options import ServerConfig
from blazr.server.response_store import ResponseStore
from blazr.server.routes import router
from blazr.server.routes_anthropic import router as anthropic_router
from blazr.server.routes_ollama import router as ollama_router
from blazr.server.serving import Serving
from blazr.server.state import ServerState
from blazr.tokenizer import Tokenizer

log = logging.getLogger("blazr.server")


@dataclass
class LoadedModel:
    """What a loader hands the server: the engine to drive, the tokenizer, and the names to answer to."""

    engine: LLMEngine
    tokenizer: Tokenizer
    model_names: list[str]
    root: str
    description: str = ""
    is_cpu: bool = False
    details: dict[str, Any] = field(default_factory=dict)  # format, family, sizes (Ollama's /api/show, /tags)
    pooling: Pooling | None = None  # embeddings (engine/pooling.py); None: the engine's default, mean
    cache_bytes: int = 0  # what its cache pools hold (a model pool's shared budget counts it)


Loader = Callable[[ServerConfig], LoadedModel]


def load_model(cfg: ServerConfig) -> LoadedModel:
    """The default loader: `blazr.LLM` with the server's load and engine configs."""
    from blazr.llm import LLM

    llm = LLM(load_config=cfg.load, engine_config=cfg.engine)
    engine = llm.engine
    names = list(cfg.served_model_names) or [cfg.load.model or llm.path.name.split(".")[0]]
    dtype, kv = dtype_name(llm.dtype), dtype_name(llm.kv_dtype)
    prefix = "on" if llm.engine_config.enable_prefix_caching else "off"
    desc = f"{llm.config.architecture}, {dtype}, kv cache {kv}, prefix cache {prefix}, {llm.device.type}"
    # root: the checkpoint's name, not its path (no absolute path reaches clients)
    loaded = LoadedModel(engine, llm.tokenizer, names, llm.name, desc, llm.device.type == "cpu")
    loaded.details = llm.details()
    loaded.pooling = llm.pooling
    if llm.runner is not None:
        loaded.cache_bytes = llm.runner.cache_plan.bytes
    return loaded


def engine_threads(cfg: ServerConfig, is_cpu: bool) -> int | None:
    """--num-threads, else on CPU one thread per core, but one core left to the event loop above 2 cores
    (so decode barriers never wait on a descheduled worker; vLLM's CPU backend reserves cores the same
    way). On 2 cores both go to the engine: measured there with the decode kernels, 2 threads beat 1 at
    concurrency 1 (62 vs 58 out tok/s) and 16 (114 vs 71)."""
    if cfg.load.num_threads or not is_cpu:
        return cfg.load.num_threads
    cores = usable_cores()
    return cores if cores <= 2 else cores - 1


def start_serving(
    config: ServerConfig,
    loaded: LoadedModel,
    metrics: Metrics,
    on_fatal: Callable[[BaseException], None] | None = None,
    responses: ResponseStore | None = None,
) -> Serving:
    """A loaded model's engine thread started and its `Serving` around it."""
    threads = engine_threads(config, loaded.is_cpu)
    engine = AsyncEngine(loaded.engine, observer=metrics, num_threads=threads, on_fatal=on_fatal)
    serving = Serving(
        engine,
        loaded.tokenizer,
        loaded.model_names,
        loaded.root,
        tool_call_parser=config.tool_call_parser,
        reasoning_parser=config.reasoning_parser,
        details=loaded.details,
        pooling=loaded.pooling,
        responses=responses,
    )
    engine.start()
    serving.warm_up()
    return serving


def _load(
    state: ServerState, loader: Loader, on_fatal: Callable[[BaseException], None] | None = None
) -> None:
    t0 = time.perf_counter()
    try:
        loaded = loader(state.config)
        serving = start_serving(state.config, loaded, state.metrics, on_fatal)
        engine = serving.engine
        state.metrics.bind_engine(
            lambda: engine.num_running,
            lambda: engine.num_waiting,
            lambda: engine.cache_usage,
            lambda: engine.prefix_cache_queries,
            lambda: engine.prefix_cache_hits,
            lambda: engine.spec_stats,
        )
        state.serving = serving
        state.load_seconds = time.perf_counter() - t0
        if state.status == "loading":  # (a drain may have begun while loading)
            state.status = "ready"
    except Exception as e:
        if isinstance(e, BlazrError):
            print(f"blazr serve: error: {e}", file=sys.stderr, flush=True)
        else:
            log.exception("loading the model failed")
        state.error = "the model failed to load (see the server log)"
        state.status = "failed"
        for callback in state.on_load_failed:
            callback(str(e))
        return
    threads = f", {engine.num_threads} threads" if engine.num_threads else ""
    print(
        f"blazr serve: ready — {loaded.model_names[0]} ({loaded.description}{threads}, "
        f"{serving.format.describe()}) loaded in {state.load_seconds:.1f}s",
        file=sys.stderr,
        flush=True,
    )


def shut_down(state: ServerState) -> None:
    """Stop a one-model server's engine thread and its preprocessing pool (both idempotent)."""
    if state.serving is not None:
        state.serving.engine.shutdown()
        state.serving.close()


def build_app(
    config: ServerConfig,
    loader: Loader = load_model,
    on_engine_fatal: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    """The app with its state, routes, error handlers and middlewares; the lifespan loads the model.
    `on_engine_fatal` is called (engine thread) if the engine loop stops; `serve` exits on it."""
    metrics = Metrics(config.engine.max_model_len or 1 << 17)
    state = ServerState(config=config, metrics=metrics)
    if config.is_multi_model:
        state.pool = _pool(config, loader, metrics, on_engine_fatal)
        state.status = "ready"

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = state.pool
        if pool is not None:
            timer = asyncio.create_task(pool.run_idle_timer())
            try:
                yield
            finally:
                timer.cancel()
                await pool.close()
            return
        state.loading = threading.Thread(
            target=_load, args=(state, loader, on_engine_fatal), name="blazr-load", daemon=True
        )
        state.loading.start()
        try:
            yield
        finally:
            shut_down(state)

    app = FastAPI(title="blazr", version=_version(), lifespan=lifespan)
    app.state.blazr = state
    app.include_router(router)
    app.include_router(anthropic_router)
    app.include_router(ollama_router)
    install_chat_page(app)  # the browser chat page at / (public; it asks for the key on a 401)
    install_error_handlers(app, metrics.on_error)
    install_openapi(app, has_api_key=bool(config.api_key))
    # add_middleware wraps: the last added is the outermost
    app.add_middleware(BodyLimit, max_bytes=config.max_request_bytes, on_reject=metrics.on_error)
    if config.api_key:
        app.add_middleware(ApiKey, api_key=config.api_key, on_reject=metrics.on_error)
    app.add_middleware(RequestContext, on_in_flight=state.add_in_flight, on_error=metrics.on_error)
    if config.allowed_origins:  # outermost: preflights and errors (401, 413) carry the CORS headers too
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.allowed_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "X-Request-Id"],
            expose_headers=["X-Request-Id", "Retry-After"],
        )
    return app


def _pool(
    config: ServerConfig,
    loader: Loader,
    metrics: Metrics,
    on_fatal: Callable[[BaseException], None] | None,
) -> ModelPool:
    """The model pool of a multi-model server, its gauges bound to /metrics."""
    if config.load.tensor_parallel_size > 1:
        raise BlazrError("several models (--model repeated, --models, --models-dir) cannot use -tp yet")

    def start(one: ServerConfig) -> tuple[Serving, int]:
        loaded = loader(one)
        return start_serving(one, loaded, metrics, on_fatal, pool.responses), loaded.cache_bytes

    pool = ModelPool(config, catalog(config), start)

    def engines() -> list[AsyncEngine]:
        return [e.serving.engine for e in pool.loaded() if e.serving is not None]

    metrics.bind_engine(
        lambda: sum(e.num_running for e in engines()),
        lambda: sum(e.num_waiting for e in engines()),
        lambda: max((e.cache_usage for e in engines()), default=0.0),
        lambda: sum(e.prefix_cache_queries for e in engines()),
        lambda: sum(e.prefix_cache_hits for e in engines()),
    )
    metrics.bind_models(lambda: {e.name: e.state for e in pool.entries.values()})
    return pool


def _version() -> str:
    import blazr

    return blazr.__version__


_UVICORN_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def serve(args: argparse.Namespace) -> None:
    """`blazr serve`: run uvicorn until drained after a signal; raise BlazrError if the model cannot be
    loaded or the engine died (the CLI exits 1 on it)."""
    import uvicorn

    config = ServerConfig.from_args(args)
    if config.load.chat_template is not None and not Path(config.load.chat_template).is_file():
        raise BlazrError(f"--chat-template {config.load.chat_template}: no such file")
    fatal: list[Callable[[BaseException], None]] = []
    app = build_app(config, on_engine_fatal=lambda e: fatal[0](e))
    state: ServerState = app.state.blazr
    level = config.log_level if config.log_level in _UVICORN_LEVELS else "warning"
    server = BlazrServer(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level=level,
            access_log=level in ("info", "debug", "trace"),
            timeout_graceful_shutdown=5,
            lifespan="on",
        ),
        state,
        config.shutdown_timeout,
    )
    fatal.append(server.on_engine_fatal)

    def stop(_: str) -> None:
        server.should_exit = True

    state.on_load_failed.append(stop)
    auth = "API key required on /v1/*" if config.api_key else "no API key"
    if state.pool is not None:
        names = ", ".join(state.pool.entries)
        what = f"serving {len(state.pool.entries)} model(s), each loaded on first use: {names}"
    else:
        what = f"loading {config.load.model or 'the embedded SmolLM2'} — GET /health answers 503 until ready"
    print(f"blazr serve: http://{config.host}:{config.port} ({auth}); {what}", file=sys.stderr, flush=True)
    server.run()
    # Stopped while a model loads: a load cannot stop part-way, and the interpreter's exit would kill the
    # loader inside torch (std::terminate, status 134) or, a pool's load being an executor thread, wait for it
    # to end (a multi-model server stopped mid-load had hung there). Requests are answered by now.
    pooled = state.pool.loading() if state.pool is not None else []
    if pooled or (state.loading is not None and state.loading.is_alive()):
        what = f"model {', '.join(pooled)}" if pooled else "the model"
        print(f"blazr serve: stopped while {what} was loading", file=sys.stderr, flush=True)
        exit_now(0)
    shut_down(state)  # the loader may have finished after the lifespan closed: its engine thread too
    if state.serving is None and state.status == "failed":
        raise BlazrError("the model failed to load")
    if server.exit_code:
        raise BlazrError("the engine stopped after an internal error (traceback above)")
