"""Reload after sleep (issue 46 item 3): how long a model put to sleep by `--sleep-idle-seconds` takes to
answer again — the time from the request to its first streamed token — against the first load of the
process and against the same request with the model loaded.

For each case a `blazr serve --model M --sleep-idle-seconds S` runs on the CPU (its own quantization cache
directory, empty at start, so the first `--quantize int8` load really quantizes); one streamed request
(1 token) loads it, another runs on the loaded model, then `--rounds` times: wait for the log's "sleeping",
note the RSS, send the request, note the time to its first token and the load time the server reports.

    PYTHONPATH=src python benchmarks/multi_model.py [--dir benchmarks/.cache/1b] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from tests.server_util import ServerProcess  # noqa: E402

CASES = (  # (label, file, extra flags)
    ("1B Q4_K_M (as stored)", "1b-q4_k_m.gguf", []),
    ("1B F16 (as stored)", "1b-f16.gguf", []),
    ("1B F16 --quantize int8", "1b-f16.gguf", ["--quantize", "int8"]),
)
PROMPT = "The capital of France is"


def first_token_s(server: ServerProcess, model: str) -> float:
    """Seconds from sending a streamed completion to its first token."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{server.base_url}/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and '"text"' in line:
                return time.perf_counter() - t0
    raise RuntimeError("no token streamed")


def card(server: ServerProcess, model: str) -> dict:
    return server.get(f"/v1/models/{model}").json()


def wait_asleep(server: ServerProcess, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while server.log_text().count("sleeping (idle") < count:
        if time.monotonic() > deadline:
            raise RuntimeError("the model never went to sleep:\n" + server.log_tail())
        time.sleep(0.05)


def run_case(path: Path, extra: list[str], rounds: int, idle_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="blazr-quant-") as cache:
        args = ["--model", str(path), "--sleep-idle-seconds", str(idle_s), "--max-model-len", "2048", *extra]
        with ServerProcess(args, env={"BLAZR_QUANT_CACHE": cache}) as server:
            model = server.client().models.list().data[0].id
            cold = first_token_s(server, model)
            cold_load = card(server, model)["status"]["load_seconds"]
            warm = first_token_s(server, model)
            loaded_rss = server.rss_bytes()
            reloads, loads, asleep_rss = [], [], []
            for i in range(rounds):
                wait_asleep(server, i + 1)
                asleep_rss.append(server.rss_bytes())
                reloads.append(first_token_s(server, model))
                loads.append(card(server, model)["status"]["load_seconds"])
    return {
        "cold_first_token_s": cold,
        "cold_load_s": cold_load,
        "warm_first_token_s": warm,
        "reload_first_token_s": reloads,
        "reload_load_s": loads,
        "loaded_rss_mib": loaded_rss >> 20,
        "asleep_rss_mib": [r >> 20 for r in asleep_rss],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", default=str(ROOT / "benchmarks" / ".cache" / "1b"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--idle", type=float, default=2.0, help="--sleep-idle-seconds")
    p.add_argument("--only", default="", help="run the cases whose label contains this")
    args = p.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs", flush=True)
    print("| model | first load: to 1st token (load) | loaded: to 1st token | after sleep: to 1st token "
          "(load), median of rounds | RSS loaded → asleep |")  # fmt: skip
    print("|---|---|---|---|---|")
    results = {}
    for label, name, extra in CASES:
        if args.only not in label:
            continue
        r = run_case(Path(args.dir) / name, extra, args.rounds, args.idle)
        results[label] = r
        print(
            f"| {label} | {r['cold_first_token_s']:.2f} s ({r['cold_load_s']:.2f} s) | "
            f"{r['warm_first_token_s']:.3f} s | {statistics.median(r['reload_first_token_s']):.2f} s "
            f"({statistics.median(r['reload_load_s']):.2f} s) | {r['loaded_rss_mib']} → "
            f"{max(r['asleep_rss_mib'])} MiB |",
            flush=True,
        )
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
