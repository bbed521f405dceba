"""A minimal streaming client for benchmarks/serve.py: the client-side cost taken out of a server measurement.

On a 2-core machine the benchmark client shares the CPU with the server it measures. guidellm spends
~0.5 ms of CPU per streamed token (httpx, asyncio, its worker processes), and every millisecond it runs
preempts one of the engine's two barrier-synchronised threads, so the other one waits: its cost shows up
in the server's inter-token latency about 1.5x over (benchmarks/NOTES.md §36). This client does the least a
streaming client can: one blocking `http.client` connection per request, the SSE lines read as bytes, a
timestamp per content chunk, no JSON parse on the hot path; one thread per stream. Its own CPU is reported
with its figures.

Per request, as guidellm computes them: TTFT = first content chunk − request sent; ITL = (last − first
content chunk) / (chunks − 1). Per level: output tok/s over the level's wall time (content chunks; one token
each at these servers' streaming), medians of TTFT and ITL over requests, and the client's CPU in cores.
"""

from __future__ import annotations

import http.client
import json
import random
import statistics
import threading
import time
from urllib.parse import urlsplit

WORDS = (  # a word list to draw prompts from
    "the of and a to in is you that it he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did"
)


def prompts(n: int, words: int, seed: int) -> list[str]:
    """`n` prompts of `words` common English words (about one token each), new ones for each `seed`."""
    rng, vocab = random.Random(seed), WORDS.split()
    return [" ".join(rng.choice(vocab) for _ in range(words)) for _ in range(n)]


def _one(host: str, port: int, body: bytes) -> tuple[float, list[float]]:
    """POST one streamed chat completion; (sent time, content-chunk times)."""
    conn = http.client.HTTPConnection(host, port, timeout=600)
    try:
        sent = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
        stamps = []
        while line := resp.readline():
            # a content delta (never the role-only first chunk, the usage chunk or [DONE])
            if line.startswith(b"data: {") and b'"content":"' in line and b'"content":""' not in line:
                stamps.append(time.perf_counter())
        return sent, stamps
    finally:
        conn.close()


def run_level(url: str, model: str, texts: list[str], concurrency: int, max_tokens: int) -> dict[str, float]:
    """Stream every prompt of `texts` (`concurrency` at a time, `max_tokens` each, `ignore_eos`); the
    level's output tok/s, median TTFT / ITL (ms) and this client's CPU (cores)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    todo = list(enumerate(texts))
    lock = threading.Lock()
    ttft: list[float] = []
    itl: list[float] = []
    tokens = [0]
    errors: list[BaseException] = []

    def worker() -> None:
        while True:
            with lock:
                if not todo or errors:
                    return
                _, text = todo.pop()
            body = {
                "model": model,
                "messages": [{"role": "user", "content": text}],
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            }
            try:
                sent, stamps = _one(host, port, json.dumps(body).encode())
            except (OSError, RuntimeError) as e:
                with lock:
                    errors.append(e)
                return
            with lock:
                tokens[0] += len(stamps)
                if stamps:
                    ttft.append((stamps[0] - sent) * 1000)
                if len(stamps) > 1:
                    itl.append((stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1000)

    cpu, wall = time.process_time(), time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if errors:
        raise SystemExit(f"minimal client against {url}: {errors[0]}")
    return {
        "concurrency": concurrency,
        "output_tok_s": tokens[0] / wall,
        "ttft_ms": statistics.median(ttft),
        "itl_ms": statistics.median(itl),
        "client_cores": cpu / wall,
    }
