"""Serve-and-bench in one command: start `blazr serve` on a free loopback port, wait for /health, run
`blazr bench` against it, stop the server.

    python benchmarks/serve.py --serve "--cpu" --concurrency 1,4,16 --num-prompts 32 --input-len 128 \
        --output-len 64 --json serve.json

`--serve "ARGS"` is passed to `blazr serve` (default "--cpu"); every other flag goes to `blazr bench`
(`--base-url` is set for you).
"""

from __future__ import annotations

import argparse
import shlex
import socket
import subprocess
import sys
import time

import httpx

from blazr.bench import add_bench_arguments, run_bench


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    outer = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    outer.add_argument("--serve", default="--cpu", help='arguments for `blazr serve` (default "--cpu")')
    outer.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for /health")
    args, rest = outer.parse_known_args(argv)
    port = _free_port()
    bench_parser = argparse.ArgumentParser(prog="blazr bench")
    add_bench_arguments(bench_parser)
    bench_args = bench_parser.parse_args([*rest, "--base-url", f"http://127.0.0.1:{port}"])
    cmd = [sys.executable, "-m", "blazr", "serve", "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen([*cmd, *shlex.split(args.serve)])
    try:
        deadline = time.monotonic() + args.ready_timeout
        while True:
            if server.poll() is not None:
                print(f"error: blazr serve exited with {server.returncode}", file=sys.stderr)
                return 1
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                print("error: the server did not become ready", file=sys.stderr)
                return 1
            time.sleep(0.5)
        return run_bench(bench_args)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    sys.exit(main())
