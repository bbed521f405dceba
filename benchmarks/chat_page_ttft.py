"""The chat page's time to first token as the browser sees it, beside a plain HTTP client's on one server.

    python benchmarks/chat_page_ttft.py [--runs 5] [--max-tokens 32] [-- blazr serve flags…]
                                        (default: the embedded SmolLM2)

Starts `blazr serve` on a free port, opens the page at / in headless Chromium (tests/browser.py) and sends
the same short prompt --runs times in a fresh conversation each (so each prefill is the same and the
prefix cache serves it from the second on); the page measures with performance.now() from just before its
fetch to the first streamed token and shows it on the answer (`.stats[data-ttft-ms]`). Each page run is
followed by the same request with httpx streaming, timed the same way (request sent → first content
delta), so both see the same load; one request before them all takes the server's first-request costs.
Prints a markdown table: median and min/max of both, and the page's decode tok/s. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.browser import ChatPage, chrome
from tests.server_util import ServerProcess

PROMPT = "Name three colours."


def client_ttft_ms(url: str, max_tokens: int) -> float:
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choices = json.loads(line[6:])["choices"]
                if choices and choices[0]["delta"].get("content"):
                    ttft = (time.perf_counter() - t0) * 1000
                    r.close()
                    return ttft
    raise RuntimeError("the stream had no content")


def interleaved_runs(url: str, runs: int, max_tokens: int) -> tuple[list[tuple[float, float]], list[float]]:
    """--runs (page TTFT, page tok/s) and --runs client TTFTs, alternated so that both see the same load."""
    client_ttft_ms(url, max_tokens)  # the server's first request pays one-time costs: not measured
    driver = chrome()
    try:
        page = ChatPage(driver, url)
        page.wait_ready()
        page.set_field("max-tokens", str(max_tokens))
        page_out, client_out = [], []
        for _ in range(runs):
            page.el("#new-chat").click()
            page.wait(lambda d: not page.messages())
            page.send(PROMPT)
            stats = page.stats(page.wait_answer())
            page_out.append((float(stats["ttftMs"]), float(stats["tokPerS"] or "nan")))
            client_out.append(client_ttft_ms(url, max_tokens))
        return page_out, client_out
    finally:
        driver.quit()


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ms ({min(values):.0f}–{max(values):.0f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=32)
    args, serve_args = ap.parse_known_args()
    serve_args = [a for a in serve_args if a != "--"]
    with ServerProcess(["--served-model-name", "chat", *serve_args]) as server:
        page, client = interleaved_runs(server.url, args.runs, args.max_tokens)
    print(f"| {args.runs} runs, `{PROMPT}`, max_tokens {args.max_tokens} | TTFT median (min–max) | tok/s |")
    print("|---|---|---|")
    print(f"| chat page (browser, performance.now) | {spread([t for t, _ in page])} | "
          f"{statistics.median(s for _, s in page):.1f} |")  # fmt: skip
    print(f"| httpx stream (same server) | {spread(client)} | |")


if __name__ == "__main__":
    main()
