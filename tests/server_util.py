"""Run `blazr serve` in a subprocess on a free loopback port and drive it, for the server tests.

`ServerProcess` starts `python -m blazr serve … --host 127.0.0.1 --port <free>`, records every /health
status it sees while waiting (so a test can check the 503-while-loading phase), and hands out official
`openai` clients (sync and async, no retries) and raw httpx calls. `check_batching_invariance(server)` is
the reusable "N concurrent greedy requests == each alone" check; it takes any running server.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import openai

from blazr.distributed.worker import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent
_METRIC = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*(?:\{[^}]*\})?)\s+(\S+)$")


def descendants(pid: int) -> set[int]:
    """The processes below `pid` (children, theirs, …), read from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → {'name{labels}': value}; comments skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _METRIC.match(line.strip())
        if m and not line.startswith("#"):
            out[m.group(1)] = float(m.group(2))
    return out


class ServerProcess:
    """A `blazr serve` subprocess. Use as a context manager, or start()/stop()."""

    def __init__(
        self,
        args: Sequence[str] = (),
        api_key: str | None = None,
        env: dict[str, str] | None = None,
        module: str = "blazr",
        new_session: bool = False,
    ):
        """`module`: what `python -m` runs (tests.faults: blazr with fault injection); `new_session`: the
        server leads its own process group, as a command at a terminal does (`interrupt` signals it all)."""
        self.port = free_port()
        self.args = list(args)
        self.api_key = api_key
        self.env = env
        self.module = module
        self.new_session = new_session
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.url}/v1"
        self.health_seen: list[int] = []
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed in stop())
            "w+", prefix="blazr-serve-", suffix=".log", delete=False
        )
        self.proc: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 240.0, want: int = 200) -> ServerProcess:
        """Start the server and wait until /health answers `want` (200: ready; 503: still loading)."""
        cmd = [
            sys.executable,
            "-m",
            self.module,
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--cpu",
        ]
        if self.api_key:
            cmd += ["--api-key", self.api_key]
        env = {k: v for k, v in os.environ.items() if k != "BLAZR_API_KEY"}
        env.update(self.env or {})
        self.proc = subprocess.Popen(
            cmd + self.args,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO_ROOT,
            start_new_session=self.new_session,
        )
        self.wait_ready(timeout, want)
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def interrupt(self) -> None:
        """Ctrl-C at a terminal: SIGINT to every process of the server's group (`new_session` servers)."""
        assert self.proc is not None and self.new_session
        os.killpg(self.proc.pid, signal.SIGINT)

    def children(self) -> list[int]:
        """The pids of the server's child processes (e.g. the tensor-parallel ranks it spawned)."""
        assert self.proc is not None
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return [int(pid) for pid in path.read_text().split()]

    def wait_exit(self, timeout: float = 60.0) -> int:
        """The exit status once the process has ended (raises if it has not within `timeout`)."""
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def rss_bytes(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def wait_ready(self, timeout: float, want: int = 200) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                status = httpx.get(f"{self.url}/health", timeout=5).status_code
            except httpx.HTTPError:
                time.sleep(0.1)
                continue
            if not self.health_seen or self.health_seen[-1] != status:
                self.health_seen.append(status)
            if status == want:
                return
            time.sleep(0.1)
        raise RuntimeError(f"server not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)

    def log_text(self) -> str:
        self._log.flush()
        return Path(self._log.name).read_text(errors="replace")

    def log_tail(self, n: int = 4000) -> str:
        self._log.flush()
        return Path(self._log.name).read_text(errors="replace")[-n:]

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------------------------------- clients

    def client(self, **kwargs: Any) -> openai.OpenAI:
        kwargs.setdefault("api_key", self.api_key or "unused")
        return openai.OpenAI(base_url=self.base_url, max_retries=0, timeout=300, **kwargs)

    def async_client(self, **kwargs: Any) -> openai.AsyncOpenAI:
        kwargs.setdefault("api_key", self.api_key or "unused")
        return openai.AsyncOpenAI(base_url=self.base_url, max_retries=0, timeout=300, **kwargs)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        headers = {**self.headers(), **kwargs.pop("headers", {})}
        return httpx.post(f"{self.url}{path}", headers=headers, timeout=300, **kwargs)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        headers = {**self.headers(), **kwargs.pop("headers", {})}
        return httpx.get(f"{self.url}{path}", headers=headers, timeout=60, **kwargs)

    def metrics(self) -> dict[str, float]:
        return parse_metrics(httpx.get(f"{self.url}/metrics", timeout=60).text)

    def wait_metric(self, name: str, predicate: Any, timeout: float = 120.0) -> dict[str, float]:
        """Poll /metrics until predicate(value of `name`) holds; returns the last scrape."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if predicate(m.get(name, float("nan"))):
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} = {m.get(name)} after {timeout:.0f}s")
            time.sleep(0.1)


# ---------------------------------------------------------------------------------- batching invariance


async def _greedy(client: openai.AsyncOpenAI, model: str, prompt: str | list[int], max_tokens: int) -> tuple:
    r = await client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        logprobs=0,
        extra_body={"return_tokens_as_token_ids": True},
    )
    c = r.choices[0]
    assert c.logprobs is not None and c.logprobs.tokens is not None
    return c.logprobs.tokens, c.text, c.finish_reason


async def _poll_running(server: ServerProcess, stop: asyncio.Event) -> float:
    peak = 0.0
    async with httpx.AsyncClient(timeout=60) as http:
        while not stop.is_set():
            m = parse_metrics((await http.get(f"{server.url}/metrics")).text)
            peak = max(peak, m.get("blazr:num_requests_running", 0.0))
            await asyncio.sleep(0.005)  # a tiny model can finish the whole batch within a few polls
    return peak


def invariance_workload(
    num: int = 16, vocab_size: int = 1000, seed: int = 0
) -> tuple[list[list[int]], list[int]]:
    """Token-id prompts of mixed lengths (3 … ~150, fine for any vocabulary of at least `vocab_size` ids)
    and mixed max_tokens (4 … 20): the default workload of `check_batching_invariance`."""
    rng = random.Random(seed)
    lengths = [3 + (i * 37) % 150 for i in range(num)]
    prompts = [[rng.randrange(1, vocab_size) for _ in range(n)] for n in lengths]
    return prompts, [4 + (i * 5) % 17 for i in range(num)]


def check_batching_invariance(
    server: ServerProcess,
    prompts: Sequence[str | list[int]] | None = None,
    max_tokens: Sequence[int] | None = None,
) -> None:
    """Greedy completions sent all at once (async client) == the same sent one at a time, token for token
    (compared as token ids). Also checks the server really batched them (the running gauge went above 1).
    Works with any running server; start it with a small --max-num-batched-tokens so that prefills are
    chunked and mixed with decodes. Without prompts, `invariance_workload()` is used."""
    if prompts is None:
        prompts, default_max = invariance_workload()
        max_tokens = default_max if max_tokens is None else max_tokens
    assert max_tokens is not None and len(prompts) == len(max_tokens)

    async def run() -> tuple[list[tuple], list[tuple], float]:
        async with server.async_client() as client:
            model = (await client.models.list()).data[0].id
            alone = [await _greedy(client, model, p, m) for p, m in zip(prompts, max_tokens, strict=True)]
            stop = asyncio.Event()
            poller = asyncio.create_task(_poll_running(server, stop))
            try:
                together = await asyncio.gather(
                    *(_greedy(client, model, p, m) for p, m in zip(prompts, max_tokens, strict=True))
                )
            finally:
                stop.set()
            return alone, list(together), await poller

    alone, together, peak = asyncio.run(run())
    for i, (a, t) in enumerate(zip(alone, together, strict=True)):
        assert a == t, f"request {i} differs when batched:\nalone:    {a}\ntogether: {t}"
    assert peak > 1, f"the requests never ran together (peak running {peak})"
