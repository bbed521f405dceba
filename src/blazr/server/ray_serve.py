"""Replicas on Ray Serve: `blazr serve --ray` — N blazr engines behind one OpenAI-compatible endpoint.

Shape (two deployments, as ray.llm's ingress → LLM server):

    client ─HTTP→ Ray Serve proxy → BlazrIngress (1 replica, 0 CPU) ─handle→ BlazrReplica × N (1 engine each)

- `BlazrReplica` runs blazr's own FastAPI app — `app.build_app`, the object `blazr serve` runs under uvicorn —
  driven in-process over ASGI. So every route, request check, error JSON, SSE framing and the API key are
  the code of `blazr serve`, not a copy. `forward()` is an async generator: the response's start (status,
  headers, plus `X-Blazr-Replica: <replica id>`) first, then its body bytes as the app sends them.
- `BlazrIngress` is the HTTP entry: blazr's `BodyLimit` and `ApiKey` middlewares (a bad key or an oversized
  body is refused there, with the same 401 / 413 JSON, before any replica is chosen), then it reads the
  body, computes the routing key (`routing_key`) and streams the chosen replica's answer back.
- Why not `@serve.ingress(build_app(...))` on the engine deployment itself: Ray's HTTP proxy hands that
  deployment's request router an ASGI scope without the body, so it could not route by the prompt.

Routing: the ingress keys each request by its prompt's prefix and `PrefixAffinityRouter` picks the replica
(ray_router.py): prefix affinity with bounded loads, so a shared system prompt keeps hitting the replica
that caches it.

Errors and streaming: the replica's answer passes through unchanged (a blazr error is blazr's JSON with its
status; an SSE stream is blazr's bytes, error event and `[DONE]` included). What only the ingress can see
becomes OpenAI error JSON too: a replica that dies or becomes unreachable before the answer is complete →
503 `replica_unavailable` (Retry-After: 1; the client may retry, another replica takes it); after an SSE
stream has begun → an SSE `error` event then `data: [DONE]`, so no stream hangs or is cut mid-event; all
replicas full and `max_waiting` more queued in the router → 503 `queue_full`, as `blazr serve` answers.
A replica whose engine stopped fails Ray's health check (`check_health`), and Ray replaces it.

Headers: Ray's proxy always adds its own `X-Request-Id`; blazr's id (the one its error messages and logs
name) is passed on as `X-Blazr-Request-Id`. `X-Blazr-Replica` names the replica that answered.

Resources: each replica reserves `--num-threads` CPUs (default 1) and runs its engine on that many threads,
or one GPU when the cluster has GPUs and `--cpu` is not given. A replica admits up to max_num_seqs +
max_waiting requests at once (`max_ongoing_requests`); Ray queues up to `max_waiting` more per ingress.
Autoscaling (`--min-replicas/--max-replicas`) targets max_num_seqs ongoing requests per replica.

Entry points: `blazr serve --ray` (`serve_ray`, local Ray or the cluster in RAY_ADDRESS), `build_ray_app`
(Python), and `app_builder` for `serve run blazr.server.ray_serve:app_builder model=… num_replicas=2`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
import typing
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import ray
import uvicorn
from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.exceptions import BackPressureError
from uvicorn.lifespan.on import LifespanOn

from blazr import config_flags
from blazr.errors import BlazrError
from blazr.server.app import build_app
from blazr.server.errors import APIError
from blazr.server.middleware import ApiKey, BodyLimit
from blazr.server.options import ServerConfig
from blazr.server.ray_router import DEFAULT_PREFIX_CHARS, PrefixAffinityRouter, routing_key
from blazr.server.state import ServerState

log = logging.getLogger("blazr.server")

APP_NAME = "blazr"
REPLICA_HEADER = b"x-blazr-replica"
REQUEST_ID_HEADER = b"x-blazr-request-id"
INGRESS_MAX_ONGOING = 100_000  # the ingress only forwards; replicas and the router queue bound the load
_HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"upgrade", b"te", b"trailer"}
_END = object()
Scope = dict[str, Any]


# ---------------------------------------------------------------------------------------------- replica


class _Start(typing.NamedTuple):
    """The first item `BlazrReplica.forward` yields."""

    status: int
    headers: list[tuple[bytes, bytes]]


@serve.deployment
class BlazrReplica:
    """One blazr engine: blazr's FastAPI app, loaded, answering forwarded HTTP requests over ASGI."""

    async def __init__(self, config: ServerConfig) -> None:
        t0 = time.perf_counter()
        self.fatal: BaseException | None = None
        self.app = build_app(config, on_engine_fatal=self._on_fatal)
        self.state: ServerState = self.app.state.blazr
        self.lifespan = LifespanOn(uvicorn.Config(self.app, lifespan="on", log_config=None))
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            raise BlazrError("the blazr app failed to start (see the replica log)")
        while self.state.status == "loading":
            await asyncio.sleep(0.05)
        if self.state.status != "ready":
            raise BlazrError(self.state.error or "the model failed to load")
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.replica_header = (REPLICA_HEADER, self.replica_id.encode())
        log.info("replica %s ready in %.1fs", self.replica_id, time.perf_counter() - t0)

    def _on_fatal(self, error: BaseException) -> None:
        self.fatal = error  # check_health reports it; Ray replaces the replica

    async def check_health(self) -> None:
        """Ray's periodic health check: raise (→ Ray restarts this replica) once the engine has stopped."""
        serving = self.state.serving
        if self.state.pool is not None:  # several models: alive while no engine died
            if self.fatal is not None:
                raise RuntimeError(f"an engine stopped: {self.fatal}")
            return
        if self.fatal is not None or serving is None or not serving.engine.is_alive:
            raise RuntimeError(f"the engine stopped: {self.fatal or self.state.error}")

    async def forward(
        self,
        method: str,
        path: str,
        query_string: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        routing_key: str | None = None,
    ) -> AsyncIterator[_Start | bytes]:
        """Run one HTTP request through blazr's app: yields its `_Start`, then body bytes (each item all
        the app has sent since the last one). Closing this generator early is a client disconnect.
        `routing_key` is for the router only."""
        messages: asyncio.Queue[Any] = asyncio.Queue()
        disconnected = asyncio.Event()
        body_read = False

        async def receive() -> dict[str, Any]:
            nonlocal body_read
            if not body_read:
                body_read = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            messages.put_nowait(message)

        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query_string,
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 0),
            "state": {},
        }

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            finally:
                messages.put_nowait(_END)

        task = asyncio.create_task(run())
        try:
            start = await messages.get()
            if start is _END or start["type"] != "http.response.start":
                await task  # re-raises what stopped the app
                raise RuntimeError("the app ended without a response")
            out = [(REQUEST_ID_HEADER if k == b"x-request-id" else k, v) for k, v in start.get("headers", [])]
            yield _Start(start["status"], [*out, self.replica_header])
            more = True
            while more:
                message = await messages.get()
                chunks = []
                while True:
                    if message is _END:
                        more = False
                        break
                    if message["type"] == "http.response.body":
                        chunks.append(message.get("body", b""))
                        more = message.get("more_body", False)
                        if not more:
                            break
                    if messages.empty():
                        break
                    message = messages.get_nowait()
                if chunks:
                    yield b"".join(chunks)
        finally:
            disconnected.set()
            if not task.done():
                task.cancel()

    async def __del__(self) -> None:
        await self.lifespan.shutdown()


# ---------------------------------------------------------------------------------------------- ingress


def _error_message(error: APIError) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ASGI messages of `error` as OpenAI error JSON."""
    body = json.dumps(error.payload()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in (error.headers or {}).items()]
    start = {"type": "http.response.start", "status": error.status, "headers": headers}
    return start, {"type": "http.response.body", "body": body}


def _sse_error(error: APIError) -> bytes:
    return b"data: " + json.dumps(error.payload()).encode() + b"\n\n" + b"data: [DONE]\n\n"


def _replica_error(error: BaseException) -> APIError:
    """What the client gets when the replica side failed before the answer was complete."""
    if isinstance(error, BackPressureError):
        return APIError(
            503,
            "every replica is busy and the queue is full",
            code="queue_full",
            headers={"Retry-After": "1"},
        )
    if isinstance(error, ray.exceptions.RayActorError | ray.exceptions.ActorUnavailableError):
        return APIError(
            503,
            "the replica serving this request stopped; retry",
            code="replica_unavailable",
            headers={"Retry-After": "1"},
        )
    log.error("forwarding a request failed", exc_info=error)
    return APIError(500, "internal server error while forwarding the request", code="internal_error")


class Forwarder:
    """The ingress's inner ASGI app: read the body, pick the key, stream the replica's answer back."""

    def __init__(self, replica: Any, prefix_chars: int) -> None:
        self.forward = replica.options(method_name="forward", stream=True)
        self.prefix_chars = prefix_chars

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        path, root = scope["path"], scope.get("root_path", "")  # root: the app's route prefix, if any
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        key = (
            await asyncio.to_thread(routing_key, path, body, self.prefix_chars)
            if len(body) > 1 << 20
            else routing_key(path, body, self.prefix_chars)
        )
        headers = [(k, v) for k, v in scope["headers"] if k not in _HOP_BY_HOP]
        stream = self.forward.remote(
            scope["method"], path, scope.get("query_string", b""), headers, body, routing_key=key
        )
        finished = False
        try:
            await self._relay(stream, send)
            finished = True
        finally:
            if not finished:
                stream.cancel()

    @staticmethod
    async def _relay(stream: Any, send: Any) -> None:
        try:
            start: _Start = await stream.__anext__()
        except Exception as e:
            for message in _error_message(_replica_error(e)):
                await send(message)
            return
        ctype = next((v for k, v in start.headers if k == b"content-type"), b"")
        response_start = {"type": "http.response.start", "status": start.status, "headers": start.headers}
        if not ctype.startswith(b"text/event-stream"):  # one body: complete it before answering
            try:
                body = b"".join([chunk async for chunk in stream])
            except Exception as e:
                for message in _error_message(_replica_error(e)):
                    await send(message)
                return
            await send(response_start)
            await send({"type": "http.response.body", "body": body})
            return
        await send(response_start)
        try:
            async for chunk in stream:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except Exception as e:
            await send(
                {"type": "http.response.body", "body": _sse_error(_replica_error(e)), "more_body": True}
            )
        await send({"type": "http.response.body", "body": b""})


@serve.deployment
@serve.ingress()
class BlazrIngress:
    """The HTTP entry: blazr's body limit and API key, then `Forwarder` to the replicas."""

    def __init__(self, replica: Any, config: ServerConfig, prefix_chars: int) -> None:
        self.replica = replica
        self.config = config
        self.prefix_chars = prefix_chars

    def __serve_build_asgi_app__(self) -> Any:
        app: Any = Forwarder(self.replica, self.prefix_chars)
        app = BodyLimit(app, max_bytes=self.config.max_request_bytes)
        if self.config.api_key:
            app = ApiKey(app, api_key=self.config.api_key)
        return app


# -------------------------------------------------------------------------------------- building the app


def _scaling(config: ServerConfig) -> dict[str, Any]:
    """num_replicas, or Ray's autoscaling config when --min-replicas / --max-replicas are given."""
    if config.min_replicas is None and config.max_replicas is None:
        return {"num_replicas": config.num_replicas or 1}
    low = config.min_replicas if config.min_replicas is not None else 1
    high = config.max_replicas if config.max_replicas is not None else max(low, config.num_replicas or 1)
    if low > high:
        raise BlazrError(f"--min-replicas {low} is more than --max-replicas {high}")
    initial = min(max(config.num_replicas or low, low), high)
    return {
        "autoscaling_config": {
            "min_replicas": low,
            "max_replicas": high,
            "initial_replicas": initial,
            "target_ongoing_requests": config.engine.max_num_seqs,
        }
    }


def _cluster_has_gpu() -> bool:
    return ray.is_initialized() and ray.cluster_resources().get("GPU", 0) > 0


def build_ray_app(
    config: ServerConfig,
    *,
    prefix_chars: int = DEFAULT_PREFIX_CHARS,
    imbalance_threshold: int | None = None,
) -> serve.Application:
    """The Serve application: `BlazrIngress` → `BlazrReplica` × (num_replicas | autoscaling).
    `imbalance_threshold`: how many more ongoing requests than the least-loaded replica the affinity
    replica may have before the next one is tried (default max_num_seqs // 2)."""
    on_gpu = not config.load.cpu and _cluster_has_gpu()
    cpus = config.load.num_threads or 1
    load = dataclasses.replace(config.load, num_threads=cpus)
    replica_config = config if on_gpu else dataclasses.replace(config, load=load)
    engine = config.engine
    threshold = imbalance_threshold if imbalance_threshold is not None else max(1, engine.max_num_seqs // 2)
    replica = BlazrReplica.options(
        ray_actor_options={"num_cpus": 1 if on_gpu else cpus, "num_gpus": 1 if on_gpu else 0},
        max_ongoing_requests=engine.max_num_seqs + engine.max_waiting,
        max_queued_requests=engine.max_waiting,
        graceful_shutdown_timeout_s=config.shutdown_timeout,
        health_check_period_s=5,
        request_router_config=RequestRouterConfig(
            request_router_class=PrefixAffinityRouter,
            request_router_kwargs={"imbalance_threshold": threshold},
        ),
        **_scaling(config),
    ).bind(replica_config)
    ingress = BlazrIngress.options(
        num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=INGRESS_MAX_ONGOING
    )
    return ingress.bind(replica, config, prefix_chars)


def config_from_options(args: dict[str, str]) -> tuple[ServerConfig, dict[str, int]]:
    """`serve run` key=value options → (ServerConfig, build_ray_app's keyword arguments). The keys are the
    config tree's field names (config_flags.py: `blazr serve`'s flags with underscores — model,
    num_replicas, api_key, cpu=true, max_num_seqs, block_size, served_model_names=a,b …) plus prefix_chars
    and imbalance_threshold; each value is read as its field's type. BLAZR_API_KEY is read when api_key is
    not given."""
    args = dict(args)
    extra = {k: int(args.pop(k)) for k in ("prefix_chars", "imbalance_threshold") if k in args}
    by_key = {k: leaf for leaf in config_flags.leaves(ServerConfig) for k in leaf.keys}
    unknown = sorted(set(args) - set(by_key))
    if unknown:
        raise BlazrError(f"unknown blazr option(s) {', '.join(unknown)}; known: {', '.join(sorted(by_key))}")
    try:
        values = {k: by_key[k].coerce(str(v)) for k, v in args.items()}
        return config_flags.build(ServerConfig, values), extra
    except (TypeError, ValueError) as e:
        raise BlazrError(f"blazr option(s): {e}") from None


def app_builder(args: dict[str, str]) -> serve.Application:
    """For `serve run blazr.server.ray_serve:app_builder key=value …` (see `config_from_options`); the host
    and port are Serve's own (`serve run` flags or its config file)."""
    config, extra = config_from_options(args)
    return build_ray_app(config, **extra)


# ------------------------------------------------------------------------------------------ the command


def serve_ray(config: ServerConfig) -> None:
    """`blazr serve --ray`: deploy on local Ray (or the cluster in RAY_ADDRESS), serve until SIGINT /
    SIGTERM, then shut Serve down (requests in flight get --shutdown-timeout to finish) and leave Ray."""
    if config.load.chat_template is not None and not Path(config.load.chat_template).is_file():
        raise BlazrError(f"--chat-template {config.load.chat_template}: no such file")
    scaling = _scaling(config)  # checks the bounds before anything starts
    count = scaling.get("num_replicas") or "{min_replicas}…{max_replicas}".format(
        **scaling["autoscaling_config"]
    )
    t0 = time.perf_counter()
    ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False, logging_level=logging.WARNING)
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda sig, frame: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(
            f"blazr serve --ray: Ray at {ray.get_runtime_context().gcs_address}; deploying {count} "
            f"replica(s) of {config.load.model or 'the embedded SmolLM2'}",
            file=sys.stderr,
            flush=True,
        )
        serve.start(http_options={"host": config.host, "port": config.port})
        level = config.log_level.upper() if config.log_level.upper() in _LOG_LEVELS else "WARNING"
        logging_config = {"log_level": level, "enable_access_log": level in ("INFO", "DEBUG")}
        serve.run(build_ray_app(config), name=APP_NAME, route_prefix="/", logging_config=logging_config)
        auth = "API key required on /v1/*" if config.api_key else "no API key"
        print(
            f"blazr serve --ray: http://{config.host}:{config.port} ({auth}); ready in "
            f"{time.perf_counter() - t0:.1f}s",
            file=sys.stderr,
            flush=True,
        )
        while not stop.wait(0.5):
            pass
        print("blazr serve --ray: stopping", file=sys.stderr, flush=True)
    except RuntimeError as e:  # what Serve raises when a deployment fails
        raise BlazrError(f"Ray Serve: {e}") from e
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


_LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")
