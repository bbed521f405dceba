"""`blazr serve` flags and the typed `ServerConfig` built from them.

cli.py adds the common flags (--model, --vocab, --cpu, --dtype, --quantize, --kv-cache-dtype,
--max-model-len, --cache-memory, --no-prefix-cache, --speculative, --num-speculative-tokens, --draft-model,
--log-level); this module
adds the server's own. The API key comes from --api-key, else the BLAZR_API_KEY environment variable.
--ray and the replica counts are read by server/ray_serve.py (replicas on Ray Serve).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from blazr.server.chat_format import CHANNEL_FORMATS
from blazr.server.reasoning import REASONING_PARSERS
from blazr.server.tool_parsers import TOOL_PARSERS

DEFAULT_HOST = "0.0.0.0"
DEFAULT_PORT = 8080
DEFAULT_MAX_REQUEST_BYTES = 8 << 20  # 8 MiB: a 128k-token prompt is ~1 MB of text or of token ids
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ServerConfig:
    """Everything the server needs to load its model and serve it."""

    model: str | None = None  # None: the embedded SmolLM2
    vocab: str | None = None
    cpu: bool = False
    dtype: str = "auto"
    quantize: str = "auto"
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None
    cache_memory: float | None = None  # GiB for the cache pools; None: a share of what is available
    enable_prefix_caching: bool = True
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    max_waiting: int = 256
    num_threads: int | None = None
    chat_template: str | None = None
    served_model_names: tuple[str, ...] = ()  # empty: --model as given, or the embedded model's name
    api_key: str | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    log_level: str = "warning"
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    allowed_origins: tuple[str, ...] = ()  # CORS: origins a browser page may call from ("*": any); () off
    tensor_parallel_size: int = 1  # ranks the model is split over (distributed/)
    tool_call_parser: str | None = None  # None: chosen from the chat template
    reasoning_parser: str | None = None  # None: no reasoning split
    ray: bool = False  # replicas on Ray Serve (ray_serve.py)
    num_replicas: int | None = None  # --ray: fixed replica count (default 1), or autoscaling's initial count
    min_replicas: int | None = None  # --ray: autoscaling bounds (either one given turns autoscaling on)
    max_replicas: int | None = None
    speculative: str | None = None  # speculative decoding: "ngram" or "draft" (engine/speculative.py)
    num_speculative_tokens: int = 4
    draft_model: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServerConfig:
        return cls(
            model=args.model,
            vocab=args.vocab,
            cpu=args.cpu,
            dtype=args.dtype,
            quantize=args.quantize,
            kv_cache_dtype=args.kv_cache_dtype,
            max_model_len=args.max_model_len,
            cache_memory=args.cache_memory,
            enable_prefix_caching=not args.no_prefix_cache,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_waiting=args.max_waiting,
            num_threads=args.num_threads,
            chat_template=args.chat_template,
            served_model_names=tuple(args.served_model_name or ()),
            api_key=args.api_key or os.environ.get("BLAZR_API_KEY") or None,
            host=args.host,
            port=args.port,
            log_level=str(args.log_level).lower(),
            max_request_bytes=args.max_request_bytes,
            shutdown_timeout=args.shutdown_timeout,
            allowed_origins=tuple(args.allowed_origins or ()),
            tensor_parallel_size=args.tensor_parallel_size,
            tool_call_parser=None if args.tool_call_parser == "auto" else args.tool_call_parser,
            reasoning_parser=args.reasoning_parser,
            ray=args.ray,
            num_replicas=args.num_replicas,
            min_replicas=args.min_replicas,
            max_replicas=args.max_replicas,
            speculative=args.speculative,
            num_speculative_tokens=args.num_speculative_tokens,
            draft_model=args.draft_model,
        )


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected a number of seconds ≥ 0, got {text}")
    return value


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `blazr serve` (besides the common ones cli.py adds)."""
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument(
        "--api-key",
        default=None,
        help="require `Authorization: Bearer KEY` on /v1/* (env BLAZR_API_KEY); /health, /metrics stay open",
    )
    p.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        metavar="NAME",
        help="model name(s) the API answers to; the first is reported in responses (default: --model as "
        "given, or the embedded model's name)",
    )
    p.add_argument(
        "--chat-template", default=None, metavar="FILE", help="jinja chat template overriding the model's"
    )
    p.add_argument(
        "--max-num-seqs", type=_positive, default=16, help="sequences batched together per step (default 16)"
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=_positive,
        default=512,
        help="token budget per step; longer prompts are prefilled in chunks (default 512)",
    )
    p.add_argument(
        "--max-waiting",
        type=_positive,
        default=256,
        help="requests allowed to wait for a slot; past it the server answers 503 (default 256)",
    )
    p.add_argument(
        "--max-request-bytes",
        type=_positive,
        default=DEFAULT_MAX_REQUEST_BYTES,
        help=f"largest request body accepted; larger ones get 413 (default {DEFAULT_MAX_REQUEST_BYTES})",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=_non_negative,
        default=DEFAULT_SHUTDOWN_TIMEOUT_S,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, how long requests in flight may run on before they are cancelled "
        f"(default {DEFAULT_SHUTDOWN_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--allowed-origins",
        nargs="+",
        metavar="ORIGIN",
        default=None,
        help="enable CORS for these origins (e.g. https://app.example.com, or * for any); off by default",
    )
    p.add_argument(
        "--tool-call-parser",
        choices=["auto", *TOOL_PARSERS],
        default="auto",
        help="how the model writes tool calls (default auto: from the chat template's markers; a template "
        "that renders no tools gets them described in the hermes format)",
    )
    p.add_argument(
        "--reasoning-parser",
        choices=sorted([*REASONING_PARSERS, *CHANNEL_FORMATS]),
        default=None,
        help="split the model's <think>…</think> into reasoning_content (off by default; harmony, GPT-OSS's "
        "channels, is on with its template)",
    )
    p.add_argument(
        "--num-threads",
        type=_positive,
        default=None,
        help="CPU threads of the engine (default on CPU: one per core; above 2 cores, one is left to HTTP)",
    )
    group = p.add_argument_group("replicas on Ray Serve (pip install 'blazr[ray]')")
    group.add_argument(
        "--ray",
        action="store_true",
        help="engine replicas behind one endpoint on Ray Serve (local Ray, or the cluster in RAY_ADDRESS)",
    )
    group.add_argument("--num-replicas", type=_positive, default=None, help="--ray: replicas (default 1)")
    group.add_argument(
        "--min-replicas", type=_positive, default=None, help="--ray: autoscale, at least this many replicas"
    )
    group.add_argument(
        "--max-replicas", type=_positive, default=None, help="--ray: autoscale, at most this many replicas"
    )
