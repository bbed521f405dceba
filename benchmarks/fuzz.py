"""Fuzz a running `blazr serve` (or one this script starts) with malformed, adversarial and valid requests
and print the counts: requests, statuses, 5xx, answers that break the contract, /health failures.

    python benchmarks/fuzz.py [--requests 5000] [--concurrency 16] [--seed 0]
                              [--url http://host:port --model NAME [--api-key KEY]]
                              [-- blazr serve flags…  (without --url: the server to start)]

Without --url it starts `blazr serve --port <free> --served-model-name fuzz` plus the flags after `--`
(default: the embedded SmolLM2) and stops it afterwards. The generator and the verdict are
tests/fuzz_requests.py (what tests/test_server_fuzz.py runs at 400 requests). Exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fuzz_requests import generate, run
from tests.server_util import ServerProcess, parse_metrics


def _settled_gauges(url: str, timeout: float = 120.0) -> str:
    """Running, waiting and KV-cache usage once the server is idle (or after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        m = parse_metrics(httpx.get(f"{url}/metrics", timeout=30).text)
        values = [m.get(f"blazr:{k}", -1) for k in ("num_requests_running", "num_requests_waiting")]
        values.append(m.get("blazr:kv_cache_usage_perc", -1))
        if values == [0, 0, 0] or time.monotonic() > deadline:
            return "running, waiting, cache usage after: " + ", ".join(f"{v:g}" for v in values)
        time.sleep(0.2)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--url", default=None)
    p.add_argument("--model", default="fuzz")
    p.add_argument("--api-key", default=None)
    p.add_argument("--vocab", type=int, default=49152, help="token ids the generator uses are below this")
    args, serve_flags = p.parse_known_args()
    serve_flags = [f for f in serve_flags if f != "--"]
    server = None
    if args.url is None:
        server = ServerProcess(
            ["--served-model-name", args.model, *serve_flags], api_key=args.api_key
        ).start()
        args.url = server.url
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
    try:
        gen = generate(random.Random(args.seed), args.model, args.vocab)
        requests = [next(gen) for _ in range(args.requests)]
        t0 = time.perf_counter()
        report = asyncio.run(run(args.url, requests, args.concurrency, headers))
        elapsed = time.perf_counter() - t0
        alive = server is None or (server.proc is not None and server.proc.poll() is None)
        gauges = _settled_gauges(args.url)
    finally:
        if server is not None:
            server.stop()
    print(f"{report.summary()}; {elapsed:.0f}s; server alive afterwards: {alive}; {gauges}")
    for failure in report.failures[:20]:
        print("  -", failure)
    clean = not report.failures and report.num_5xx == 0 and report.health_failures == 0
    return 0 if clean and alive and gauges.endswith("0, 0, 0") else 1


if __name__ == "__main__":
    sys.exit(main())
