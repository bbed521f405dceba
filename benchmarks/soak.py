"""Soak `blazr serve`: many concurrent streaming clients for several rounds, then clients that walk away.

    python benchmarks/soak.py [--clients 64] [--rounds 3] [--max-tokens 64] [--disconnects 40]
                              [-- blazr serve flags…]   (default: the embedded SmolLM2)

1. Warm-up: every client's prompt once, not streamed, all at once (greedy): the reference texts. RSS after.
2. --rounds rounds of --clients concurrent streaming clients with the same prompts: every stream must end
   with [DONE], carry no error and equal its reference text; after each round the running / waiting gauges
   and the KV-cache usage must be back to 0.
3. The other APIs: every client's prompt through the Responses API, Anthropic Messages, Ollama's /api/chat
   and /api/generate, each once whole and once streamed, all at once: every stream must end as its API
   ends one, without an error event, and equal its whole answer; /v1/embeddings and /api/embed must give
   the same vectors; the gauges back to 0 after.
   Then --disconnects clients start long streams and close the connection after a few chunks: their slots
   must be freed (gauges back to 0, the abort counter up by as many).
4. Drain: --clients streams again, and SIGTERM once tokens flow: /health must turn 503 "draining" and a new
   request get 503, every stream must still end in full (equal to its reference), and the process exit 0.
Prints a markdown table (errors, mismatches, RSS after warm-up / after the rounds / growth, gauges, time);
exit status 1 if anything fails. The server runs with a per-step budget that holds every prompt at once, so
no prompt is prefilled in chunks and greedy output does not depend on batch composition, and with a
shutdown timeout long enough for step 4's streams to finish on a slow machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.server_util import ServerProcess

WORDS = ["the", "fox", "river", "light", "stone", "winter", "garden", "city", "music", "ocean", "story",
         "bright", "quiet", "ancient", "machine", "market", "morning", "forest", "letter"]  # fmt: skip


def _prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 24))) for _ in range(n)]


async def _whole(http: httpx.AsyncClient, prompt: str, max_tokens: int) -> str:
    body = {"model": "soak", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    r = await http.post("/v1/completions", json=body)
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


async def _stream(http: httpx.AsyncClient, prompt: str, max_tokens: int) -> tuple[str, str | None]:
    """(text, problem or None)."""
    body = {"model": "soak", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    text, events = "", []
    async with http.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return "", f"status {r.status_code}"
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    if not events or events[-1] != "[DONE]":
        return text, "stream not ended with [DONE]"
    for e in events[:-1]:
        chunk: dict[str, Any] = json.loads(e)
        if "error" in chunk:
            return text, f"error event: {chunk['error']}"
        text += "".join(c["text"] for c in chunk["choices"])
    return text, None


async def _api_text(
    http: httpx.AsyncClient, api: str, prompt: str, max_tokens: int, stream: bool
) -> tuple[str, str | None]:
    """One greedy answer of `api` (responses, messages, chat, generate), whole or streamed: (its text,
    problem or None)."""
    user = [{"role": "user", "content": prompt}]
    path, body = {
        "responses": ("/v1/responses", {"input": prompt, "max_output_tokens": max_tokens, "temperature": 0}),
        "messages": ("/v1/messages", {"messages": user, "max_tokens": max_tokens, "temperature": 0}),
        "chat": ("/api/chat", {"messages": user, "options": {"num_predict": max_tokens, "temperature": 0}}),
        "generate": (
            "/api/generate",
            {"prompt": prompt, "options": {"num_predict": max_tokens, "temperature": 0}},
        ),
    }[api]
    body = {"model": "soak", **body, "stream": stream}
    if not stream:
        r = await http.post(path, json=body)
        if r.status_code != 200:
            return "", f"{api}: status {r.status_code}"
        data = r.json()
        if api == "responses":
            return "".join(
                c["text"] for o in data["output"] if o["type"] == "message" for c in o["content"]
            ), None
        if api == "messages":
            return "".join(b["text"] for b in data["content"] if b["type"] == "text"), None
        return (data["message"]["content"] if api == "chat" else data["response"]), None
    text, last = "", ""
    async with http.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            return "", f"{api} stream: status {r.status_code}"
        async for line in r.aiter_lines():
            if api in ("chat", "generate"):
                if not line:
                    continue
                data = json.loads(line)
                if "error" in data:
                    return text, f"{api}: error line {data['error']}"
                text += data["message"]["content"] if api == "chat" else data["response"]
                last = "done" if data.get("done") else ""
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                last = data["type"]
                if last == "error":
                    return text, f"{api}: error event {data}"
                if last == "response.output_text.delta":
                    text += data["delta"]
                elif last == "content_block_delta" and data["delta"]["type"] == "text_delta":
                    text += data["delta"]["text"]
    ends = {"responses": ("response.completed", "response.incomplete"), "messages": ("message_stop",)}
    if last not in ends.get(api, ("done",)):
        return text, f"{api} stream ended with {last!r}"
    return text, None


async def _apis(http: httpx.AsyncClient, prompts: list[str], max_tokens: int) -> tuple[int, int, int]:
    """Every API whole and streamed for every prompt, all at once: (answers, problems, mismatches), the
    embeddings' disagreements counted as mismatches."""
    apis = ("responses", "messages", "chat", "generate")
    jobs = [(a, q) for a in apis for q in prompts]
    whole = await asyncio.gather(*(_api_text(http, a, q, max_tokens, False) for a, q in jobs))
    streamed = await asyncio.gather(*(_api_text(http, a, q, max_tokens, True) for a, q in jobs))
    problems = sum(p is not None for _, p in whole + streamed)
    mismatches = sum(
        w[0] != s[0] for w, s in zip(whole, streamed, strict=True) if w[1] is None and s[1] is None
    )
    vectors = (await http.post("/v1/embeddings", json={"model": "soak", "input": prompts})).json()["data"]
    ollama = (await http.post("/api/embed", json={"model": "soak", "input": prompts})).json()["embeddings"]
    for v, o in zip(vectors, ollama, strict=True):
        mismatches += max(abs(x - y) for x, y in zip(v["embedding"], o, strict=True)) > 1e-5
    return len(jobs) * 2, problems, mismatches


async def _walk_away(http: httpx.AsyncClient, prompt: str, max_tokens: int) -> bool:
    """Start a long stream and close the connection after 3 chunks; False if it did not start."""
    body = {"model": "soak", "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    async with http.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return False
        seen = 0
        async for line in r.aiter_lines():
            seen += line.startswith("data: ")
            if seen >= 3:
                return True  # leaving the block closes the connection mid-stream
    return False


async def _drain(
    server: ServerProcess,
    http: httpx.AsyncClient,
    prompts: list[str],
    refs: list[str],
    max_tokens: int,
    rows: list[tuple[str, str]],
) -> bool:
    """SIGTERM while every client streams: draining at once, every stream in full, exit 0."""
    before = server.metrics()["blazr:generation_tokens_total"]
    tasks = [asyncio.create_task(_stream(http, q, max_tokens)) for q in prompts]

    def admitted() -> bool:  # every client's request is running or waiting, and tokens are flowing
        m = server.metrics()
        held = m["blazr:num_requests_running"] + m["blazr:num_requests_waiting"]
        return held >= len(prompts) and m["blazr:generation_tokens_total"] >= before + 2

    while not admitted():
        await asyncio.sleep(0.005)
    t0 = time.perf_counter()
    server.signal(signal.SIGTERM)
    while (await http.get("/health")).status_code == 200:
        await asyncio.sleep(0.005)
    t_health = time.perf_counter() - t0
    health = (await http.get("/health")).json()
    refused = (await http.post("/v1/completions", json={"model": "soak", "prompt": "x"})).status_code
    results = await asyncio.gather(*tasks)
    t_streams = time.perf_counter() - t0
    code = await asyncio.to_thread(server.wait_exit, 120)
    t_exit = time.perf_counter() - t0
    complete = sum(problem is None and t == r for (t, problem), r in zip(results, refs, strict=True))
    rows.append((
        f"SIGTERM with {len(prompts)} streams in flight",
        f"/health {health} after {t_health * 1000:.0f} ms, new request → {refused}; streams complete and "
        f"equal to their reference {complete}/{len(prompts)} after {t_streams:.1f}s; exit {code} after "
        f"{t_exit:.1f}s",
    ))  # fmt: skip
    return health == {"status": "draining"} and refused == 503 and complete == len(prompts) and code == 0


def _gauges(server: ServerProcess) -> tuple[float, float, float]:
    m = server.metrics()
    return m["blazr:num_requests_running"], m["blazr:num_requests_waiting"], m["blazr:kv_cache_usage_perc"]


def _settle(server: ServerProcess, timeout: float = 60.0) -> tuple[float, float, float]:
    deadline = time.monotonic() + timeout
    while True:
        g = _gauges(server)
        if g == (0, 0, 0) or time.monotonic() > deadline:
            return g
        time.sleep(0.1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--disconnects", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    args, flags = p.parse_known_args()
    flags = [f for f in flags if f != "--"]
    # a per-step budget that holds every prompt (no chunked prefill), and time for the drain to finish all
    flags = [
        "--served-model-name",
        "soak",
        "--max-num-batched-tokens",
        "4096",
        "--shutdown-timeout",
        "1800",
        *flags,
    ]
    prompts = _prompts(args.clients, args.seed)
    rows: list[tuple[str, str]] = []
    ok = True
    with ServerProcess(flags) as server:

        async def go() -> None:
            nonlocal ok
            limits = httpx.Limits(max_connections=args.clients + args.disconnects)
            async with httpx.AsyncClient(base_url=server.url, timeout=600, limits=limits) as http:
                t0 = time.perf_counter()
                refs = await asyncio.gather(*(_whole(http, q, args.max_tokens) for q in prompts))
                rows.append(("warm-up (non-streamed references)", f"{time.perf_counter() - t0:.1f}s"))
                rss0 = server.rss_bytes()
                for k in range(args.rounds):
                    t0 = time.perf_counter()
                    results = await asyncio.gather(*(_stream(http, q, args.max_tokens) for q in prompts))
                    errors = sum(problem is not None for _, problem in results)
                    mismatches = sum(
                        problem is None and t != r for (t, problem), r in zip(results, refs, strict=True)
                    )
                    gauges = _settle(server)
                    ok &= errors == 0 and mismatches == 0 and gauges == (0, 0, 0)
                    rows.append((
                        f"round {k + 1}: {args.clients} streams",
                        f"errors {errors}, != reference {mismatches}, gauges after {gauges}, "
                        f"{time.perf_counter() - t0:.1f}s",
                    ))  # fmt: skip
                rss1 = server.rss_bytes()
                growth = (rss1 - rss0) / rss0
                ok &= growth < 0.05
                rss = f"{rss0 / 2**20:.0f} → {rss1 / 2**20:.0f} MiB ({growth * 100:+.1f}%)"
                rows.append(("RSS after warm-up → after rounds", rss))
                t0 = time.perf_counter()
                answers, problems, mismatches = await _apis(http, prompts, args.max_tokens)
                gauges = _settle(server)
                ok &= problems == 0 and mismatches == 0 and gauges == (0, 0, 0)
                rows.append((
                    "Responses, Messages, Ollama chat / generate: whole + streamed; embeddings both ways",
                    f"{answers} answers, problems {problems}, stream != whole or vectors differ "
                    f"{mismatches}, gauges after {gauges}, {time.perf_counter() - t0:.1f}s",
                ))  # fmt: skip
                aborted0 = server.metrics()['blazr:request_success_total{finished_reason="abort"}']
                t0 = time.perf_counter()
                long = (await http.get("/v1/models")).json()["data"][0]["max_model_len"] - 64
                started = await asyncio.gather(
                    *(_walk_away(http, q, long) for q in prompts[: args.disconnects])
                )
                ok &= all(started)
                gauges = _settle(server)
                aborted = server.metrics()['blazr:request_success_total{finished_reason="abort"}'] - aborted0
                ok &= gauges == (0, 0, 0) and aborted == args.disconnects
                rows.append((
                    f"{args.disconnects} clients leave mid-stream",
                    f"aborted {aborted:.0f}, gauges after {gauges}, {time.perf_counter() - t0:.1f}s",
                ))  # fmt: skip
                ok &= server.proc is not None and server.proc.poll() is None
                ok &= await _drain(server, http, prompts, refs, args.max_tokens, rows)

        asyncio.run(go())
    print(f"| soak ({' '.join(flags)}) | result |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    print(f"\n{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
