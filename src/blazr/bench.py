"""`blazr bench`: load-test a running OpenAI-compatible server, modelled on `vllm bench serve`.

For each concurrency level, `--num-prompts` streamed /v1/completions requests run with at most that many in
flight; every SSE chunk is timed on arrival (httpx, not the openai client, so nothing buffers). Requests ask
for `--output-len` tokens with `ignore_eos` (a vLLM extra; a server that ignores it may stop early, and
fewer tokens are accepted and counted from `usage`). Prompts are deterministic word sequences drawn from
`--seed`, about one token per word, new ones for every level (a server with a prefix cache would otherwise
answer a level's repeats of the last level's prompts from its cache); the table reports the prompt tokens the
server counted. `--shared-prefix-len N` puts the same N words before every prompt (a shared system prompt;
the warm-up requests carry it too, so the levels measure a server whose cache already holds it), and when the
server reports `usage.prompt_tokens_details.cached_tokens` the table adds the share of prompt tokens it
served from its prefix cache. When the server speculates (its /metrics has `…:spec_decode_num_draft_tokens`
and `…_num_accepted_tokens`, blazr's or vLLM's names), each level's acceptance rate — drafted tokens
accepted, from the counters' change over the level — is a column too.

Metrics (vLLM's definitions): TTFT = time to the first chunk with text; ITL = gaps between chunks;
TPOT = (E2EL − TTFT) / (output tokens − 1) per request; E2EL = request latency; throughputs divide totals
by the wall time of the level. Output: a markdown table per run, `--json FILE` for the raw numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

_WORD_TEXT = (
    "the of and to in is was for on that with as by at from his it an were are which this be or has had "
    "first one their its new after who they two her she been other when there all during into school time "
    "may years more most only over city some world would where later up such used many can state about "
    "national out known university united then made also team year three season age house music between "
    "work film under called number series group government people early life part game area history "
    "album war while second well both back through several member best south north family death until "
    "town center river public since name following last west four any each main light paper water table "
    "green small market story report study road church common market order field power point course form"
)
WORDS = tuple(_WORD_TEXT.split())  # common English words, mostly one token each with a leading space


@dataclass
class RequestResult:
    """One request as the client saw it (seconds)."""

    ok: bool = False
    error: str = ""
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, when the server sends it


@dataclass
class LevelResult:
    """The summary of one concurrency level (times in milliseconds)."""

    concurrency: int
    completed: int
    failed: int
    duration_s: float
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    total_input_tokens: int
    total_output_tokens: int
    mean_ttft_ms: float
    median_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    p99_tpot_ms: float
    mean_itl_ms: float
    median_itl_ms: float
    p99_itl_ms: float
    mean_e2el_ms: float
    median_e2el_ms: float
    p99_e2el_ms: float
    total_cached_tokens: int | None = None  # None: the server reported no cached tokens
    errors: list[str] = field(default_factory=list)
    spec_draft_tokens: float | None = None  # drafted / accepted tokens over the level (None: no speculation)
    spec_accepted_tokens: float | None = None


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8080", help="server root (default %(default)s)")
    p.add_argument("--model", default=None, help="model name (default: the first of GET /v1/models)")
    p.add_argument("--api-key", default=None, help="Bearer key (default: env BLAZR_API_KEY / OPENAI_API_KEY)")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated levels (default %(default)s)")
    p.add_argument("--num-prompts", type=int, default=32, help="requests per level (default %(default)s)")
    p.add_argument("--input-len", type=int, default=128, help="prompt length in words ≈ tokens (default 128)")
    p.add_argument(
        "--shared-prefix-len",
        type=int,
        default=0,
        help="words ≈ tokens of one shared prefix before every prompt (a system prompt; default 0)",
    )
    p.add_argument("--output-len", type=int, default=64, help="max_tokens per request (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    p.add_argument("--no-ignore-eos", action="store_true", help="let requests stop at end-of-sequence")
    p.add_argument("--seed", type=int, default=0, help="prompt seed (default 0)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured requests before the first level")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    p.add_argument("--json", default=None, metavar="FILE", help="write the results as JSON")


def make_prompts(num: int, length: int, seed: int, prefix: str = "") -> list[str]:
    """Deterministic prompts of `length` random words each, after `prefix` (shared, may be empty)."""
    rng = random.Random(seed)
    lead = f"{prefix} " if prefix else ""
    return [lead + " ".join(rng.choice(WORDS) for _ in range(length)) for _ in range(num)]


def shared_prefix(length: int, seed: int) -> str:
    """The `--shared-prefix-len` words before every prompt (its own random stream: the prompts stay)."""
    rng = random.Random(f"shared-prefix-{seed}")
    return " ".join(rng.choice(WORDS) for _ in range(length))


async def _one(client: Any, url: str, payload: dict[str, Any]) -> RequestResult:
    import httpx

    res = RequestResult()
    start = time.perf_counter()
    last = start
    try:
        async with client.stream("POST", url, json=payload) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                res.error = f"HTTP {resp.status_code}: {body[:200]}"
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = str(chunk["error"].get("message", chunk["error"]))[:200]
                    return res
                now = time.perf_counter()
                if usage := chunk.get("usage"):
                    res.prompt_tokens = int(usage.get("prompt_tokens", 0))
                    res.output_tokens = int(usage.get("completion_tokens", 0))
                    res.cached_tokens = _cached_tokens(usage)
                text = "".join(c.get("text") or "" for c in chunk.get("choices", []))
                if not text:
                    continue
                if res.ttft == 0.0:
                    res.ttft = now - start
                else:
                    res.itl.append(now - last)
                last = now
        res.latency = time.perf_counter() - start
        res.ok = True
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as e:
        res.error = f"{type(e).__name__}: {e}"[:200]
    return res


def _cached_tokens(usage: dict[str, Any]) -> int | None:
    """`usage.prompt_tokens_details.cached_tokens` (OpenAI's field), None when absent or not a number."""
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return int(cached) if isinstance(cached, int | float) and not isinstance(cached, bool) else None


def _ms(values: list[float], q: float | None = None) -> float:
    if not values:
        return 0.0
    arr = np.asarray(values) * 1000.0
    return float(arr.mean() if q is None else np.percentile(arr, q))


def summarize(concurrency: int, results: list[RequestResult], duration: float) -> LevelResult:
    done = [r for r in results if r.ok]
    ttft = [r.ttft for r in done]
    e2el = [r.latency for r in done]
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    itl = [x for r in done for x in r.itl]
    n_in = sum(r.prompt_tokens for r in done)
    n_out = sum(r.output_tokens for r in done)
    cached = [r.cached_tokens for r in done if r.cached_tokens is not None]
    duration = max(duration, 1e-9)
    return LevelResult(
        concurrency=concurrency,
        completed=len(done),
        failed=len(results) - len(done),
        duration_s=duration,
        request_throughput=len(done) / duration,
        output_throughput=n_out / duration,
        total_token_throughput=(n_in + n_out) / duration,
        total_input_tokens=n_in,
        total_output_tokens=n_out,
        mean_ttft_ms=_ms(ttft),
        median_ttft_ms=_ms(ttft, 50),
        p99_ttft_ms=_ms(ttft, 99),
        mean_tpot_ms=_ms(tpot),
        median_tpot_ms=_ms(tpot, 50),
        p99_tpot_ms=_ms(tpot, 99),
        mean_itl_ms=_ms(itl),
        median_itl_ms=_ms(itl, 50),
        p99_itl_ms=_ms(itl, 99),
        mean_e2el_ms=_ms(e2el),
        median_e2el_ms=_ms(e2el, 50),
        p99_e2el_ms=_ms(e2el, 99),
        total_cached_tokens=sum(cached) if cached else None,
        errors=sorted({r.error for r in results if not r.ok})[:5],
    )


def _payload(args: argparse.Namespace, model: str, prompt: str) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": args.output_len,
        "temperature": args.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": not args.no_ignore_eos,
    }


async def _level(client: Any, url: str, payloads: list[dict[str, Any]], concurrency: int) -> LevelResult:
    gate = asyncio.Semaphore(concurrency)

    async def run(payload: dict[str, Any]) -> RequestResult:
        async with gate:
            return await _one(client, url, payload)

    start = time.perf_counter()
    results = await asyncio.gather(*(run(p) for p in payloads))
    return summarize(concurrency, list(results), time.perf_counter() - start)


SPEC_COUNTERS = ("spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total")


async def spec_counts(client: Any, base: str) -> tuple[float, float] | None:
    """(drafted, accepted) tokens so far from the server's /metrics (blazr:… or vllm:… names); None when it
    has no such counters (no speculation) or no /metrics."""
    try:
        resp = await client.get(f"{base}/metrics")
    except Exception:
        return None
    if resp.status_code != 200:
        return None
    found: dict[str, float] = {}
    for line in resp.text.splitlines():
        name, _, value = line.partition(" ")
        for counter in SPEC_COUNTERS:
            if name.endswith(":" + counter):
                found[counter] = found.get(counter, 0.0) + float(value)
    if len(found) != len(SPEC_COUNTERS):
        return None
    return found[SPEC_COUNTERS[0]], found[SPEC_COUNTERS[1]]


async def _discover_model(client: Any, base: str) -> str:
    resp = await client.get(f"{base}/v1/models")
    if resp.status_code != 200:
        raise RuntimeError(f"GET /v1/models: HTTP {resp.status_code}: {resp.text[:200]}")
    return str(resp.json()["data"][0]["id"])


async def bench(args: argparse.Namespace, levels: list[int]) -> tuple[str, list[LevelResult]]:
    import os

    import httpx

    base = args.base_url.rstrip("/").removesuffix("/v1")
    key = args.api_key or os.environ.get("BLAZR_API_KEY") or os.environ.get("OPENAI_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    limits = httpx.Limits(max_connections=max(levels) + 4, max_keepalive_connections=max(levels) + 4)
    timeout = httpx.Timeout(args.timeout, connect=30.0)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout) as client:
        model = args.model or await _discover_model(client, base)
        url = f"{base}/v1/completions"
        prefix = shared_prefix(args.shared_prefix_len, args.seed)
        n = args.num_prompts
        prompts = make_prompts(n * len(levels), args.input_len, args.seed, prefix)  # n new ones per level
        warm = make_prompts(args.warmup, args.input_len, args.seed + 1, prefix)
        for p in warm:
            res = await _one(client, url, _payload(args, model, p))
            if not res.ok:
                raise RuntimeError(f"warm-up request failed: {res.error}")
        results = []
        for i, c in enumerate(levels):
            payloads = [_payload(args, model, p) for p in prompts[i * n : (i + 1) * n]]
            before = await spec_counts(client, base)
            results.append(await _level(client, url, payloads, c))
            after = await spec_counts(client, base)
            if before is not None and after is not None:
                results[-1].spec_draft_tokens = after[0] - before[0]
                results[-1].spec_accepted_tokens = after[1] - before[1]
            print(f"  concurrency {c}: done in {results[-1].duration_s:.1f}s", file=sys.stderr, flush=True)
    return model, results


def cached_share(r: LevelResult) -> str:
    """Prompt tokens the server served from its prefix cache, as a percentage ("–" when not reported)."""
    if r.total_cached_tokens is None:
        return "–"
    return f"{100.0 * r.total_cached_tokens / max(1, r.total_input_tokens):.1f}%"


def acceptance(r: LevelResult) -> str:
    """Drafted tokens the server accepted over the level, as a percentage ("–" when it drafted none)."""
    if not r.spec_draft_tokens or r.spec_accepted_tokens is None:
        return "–"
    return f"{100.0 * r.spec_accepted_tokens / r.spec_draft_tokens:.1f}%"


def format_table(results: list[LevelResult]) -> str:
    """A markdown table: one row per concurrency level (a `cached` column when the server reports it, an
    `accepted` one when it speculates)."""
    has_cached = any(r.total_cached_tokens is not None for r in results)
    has_spec = any(r.spec_draft_tokens is not None for r in results)
    head = (
        "| concurrency | ok/failed | duration s | req/s | out tok/s | total tok/s | TTFT mean ms "
        "| TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | TPOT mean ms | E2EL mean ms |"
        + (" cached |" if has_cached else "")
        + (" accepted |" if has_spec else "")
    )
    sep = "|" + "---:|" * (13 + has_cached + has_spec)
    rows = [
        f"| {r.concurrency} | {r.completed}/{r.failed} | {r.duration_s:.1f} | {r.request_throughput:.2f} "
        f"| {r.output_throughput:.1f} | {r.total_token_throughput:.1f} | {r.mean_ttft_ms:.0f} "
        f"| {r.median_ttft_ms:.0f} | {r.p99_ttft_ms:.0f} | {r.median_itl_ms:.1f} | {r.p99_itl_ms:.1f} "
        f"| {r.mean_tpot_ms:.1f} | {r.mean_e2el_ms:.0f} |"
        + (f" {cached_share(r)} |" if has_cached else "")
        + (f" {acceptance(r)} |" if has_spec else "")
        for r in results
    ]
    return "\n".join([head, sep, *rows])


def run_bench(args: argparse.Namespace) -> int:
    """`blazr bench`: prints the table; exit 1 when a level completed no request."""
    try:
        levels = [int(x) for x in str(args.concurrency).split(",") if x.strip()]
    except ValueError:
        print(
            f"error: --concurrency must be comma-separated integers, got {args.concurrency!r}",
            file=sys.stderr,
        )
        return 2
    if not levels or min(levels) < 1 or args.num_prompts < 1 or args.output_len < 1 or args.input_len < 1:
        print(
            "error: --concurrency, --num-prompts, --input-len and --output-len must be ≥ 1", file=sys.stderr
        )
        return 2
    if args.shared_prefix_len < 0:
        print(f"error: --shared-prefix-len must be ≥ 0, got {args.shared_prefix_len}", file=sys.stderr)
        return 2
    shared = f" after {args.shared_prefix_len} shared words" if args.shared_prefix_len else ""
    print(
        f"blazr bench: {args.base_url}, {args.num_prompts} prompts × {args.input_len} words in{shared}, "
        f"{args.output_len} tokens out{'' if args.no_ignore_eos else ' (ignore_eos)'}, "
        f"concurrency {','.join(map(str, levels))}, seed {args.seed}",
        file=sys.stderr,
        flush=True,
    )
    try:
        import httpx  # noqa: F401
    except ImportError:
        print("error: blazr bench needs httpx (pip install httpx)", file=sys.stderr)
        return 1
    try:
        model, results = asyncio.run(bench(args, levels))
    except Exception as e:  # unreachable server, bad key: one line, no traceback
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    mean_in = sum(r.total_input_tokens for r in results) / max(1, sum(r.completed for r in results))
    print(f"model {model}; mean prompt {mean_in:.0f} tokens (server count)\n")
    print(format_table(results))
    for r in results:
        for err in r.errors:
            print(f"concurrency {r.concurrency}: error: {err}", file=sys.stderr)
    if args.json:
        doc = {
            "base_url": args.base_url,
            "model": model,
            "num_prompts": args.num_prompts,
            "input_len": args.input_len,
            "shared_prefix_len": args.shared_prefix_len,
            "output_len": args.output_len,
            "temperature": args.temperature,
            "ignore_eos": not args.no_ignore_eos,
            "seed": args.seed,
            "results": [asdict(r) for r in results],
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
    return 0 if all(r.completed for r in results) else 1
