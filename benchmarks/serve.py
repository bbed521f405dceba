"""The server benchmark (issue 18): guidellm against `blazr serve` and llama.cpp's own `llama-server`, side by
side in one run, with blazr's engine alone on the same workload for the overhead columns.

    python benchmarks/serve.py [--levels 1,4,16,32] [--requests 32] [--prompt-tokens 128]
                               [--output-tokens 64] [--slots 16] [--threads 2] [--model GGUF]
                               [--rounds 3] [--skip llama-server] [--blazr-args "..."] [--json FILE]

Workload: guidellm's synthetic text prompts of --prompt-tokens tokens (SmolLM2's tokenizer) and
--output-tokens output tokens each (`ignore_eos`), streamed /v1/chat/completions, `--requests` requests per
concurrency level (guidellm's `concurrent` profile), both servers on the same GGUF (default: the embedded
SmolLM2 Q4_1) with --slots sequences at once and --threads threads. llama-server is built once from the
llama-cpp-python sdist `make test` unpacks (vendor/llama.cpp) into benchmarks/.cache/llama-server
(benchmarks/llama_tools.py).

Engine columns (no HTTP; `EngineAlone`, measured every round between the sweeps): one sequence's prefill
and decode step — the step as guidellm counts ITL, the mean over a request's tokens after its first — for
blazr's `LLM` and llama-cpp-python (each server's floor), and blazr's `LLM.generate` on --requests prompts
of the same token length at --slots at once (the throughput ceiling for the --slots level).

Columns per level: output tok/s (guidellm's, over the level's wall time), median TTFT and ITL in ms, and
× = blazr / llama-server output tok/s. guidellm's own CPU (it and its worker processes, in cores) is
reported, and after each guidellm sweep benchmarks/stream_client.py, a client of ~1% CPU, runs the same
workload at concurrency 1 and --slots: on a 2-core machine the two tables differ by what the client's CPU
takes from the server (NOTES §36). Both servers stay up; each round runs guidellm's sweep against one,
then the other (the order alternating), and the median over --rounds is reported: the machine may be shared,
and a slow period then hits both. Speed is reported here, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from blazr.distributed.worker import free_port

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import llama_tools, stream_client  # noqa: E402

CACHE = ROOT / "benchmarks" / ".cache"
TOKENIZER_DIR = CACHE / "smollm2-tokenizer"


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def embedded_gguf() -> Path:
    from blazr.detect.paths import resolve_model_path

    return Path(resolve_model_path(None))


def tokenizer_dir(gguf: Path) -> Path:
    """A HuggingFace tokenizer directory for guidellm's synthetic prompts, made from the GGUF (once)."""
    target = TOKENIZER_DIR if gguf == embedded_gguf() else CACHE / f"tokenizer-{gguf.stem}"
    if (target / "tokenizer.json").exists():
        return target
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(target))
    return target


class Server:
    """A server process on a free loopback port, ready once GET /health answers 200."""

    def __init__(self, name: str, cmd: list[str], port: int) -> None:
        self.name, self.port = name, port
        self.url = f"http://127.0.0.1:{port}"
        fd, self.log = tempfile.mkstemp(prefix=f"{name}-", suffix=".log")
        self.proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT)
        os.close(fd)

    def wait_ready(self, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited with {self.proc.returncode}; log: {self.log}")
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"{self.name} did not become ready; log: {self.log}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def run_guidellm(
    url: str, args: argparse.Namespace, tok: Path, out: Path, seed: int
) -> list[dict[str, float]]:
    """guidellm's concurrent profile at every level; per level: output tok/s, median TTFT / ITL (ms).
    `seed` picks the synthetic prompts: new ones every round, so that no server answers a round from a
    prompt cache of the last (llama-server keeps each slot's last prompt: its TTFT fell to 28 ms)."""
    profile = json.dumps({"kind": "concurrent", "streams": list(args.levels)})
    data = f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},output_tokens={args.output_tokens}"
    cmd = [
        str(Path(sys.executable).parent / "guidellm"),
        "run",
        "--backend", f"kind=openai_http,target={url}",
        "--profile", profile,
        "--constraint", f"kind=max_requests,count={args.requests}",
        "--data", data,
        "--tokenizer", f"kind=huggingface_auto,model={tok}",
        "--seed", f"kind=static,value={seed}",
        "--output", f"kind=json,path={out}",
        "--disable-console-interactive",
    ]  # fmt: skip
    cpu, wall = _children_cpu(), time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tempfile.gettempdir())
    cores = (_children_cpu() - cpu) / (time.perf_counter() - wall)
    if done.returncode != 0 or not out.exists():
        raise SystemExit(
            f"guidellm failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    rows = []
    for bench in json.loads(out.read_text())["benchmarks"]:
        m = bench["metrics"]
        totals = m["request_totals"]
        rows.append(
            {
                "concurrency": bench["config"]["strategy"]["streams"],
                "completed": totals["successful"],
                "errored": totals["errored"],
                "output_tok_s": m["output_tokens_per_second"]["successful"]["mean"],
                "ttft_ms": m["time_to_first_token_ms"]["successful"]["median"],
                "itl_ms": m["inter_token_latency_ms"]["successful"]["median"],
                "client_cores": cores,  # guidellm's CPU over its whole sweep (its worker processes too)
            }
        )
    return rows


def _children_cpu() -> float:
    """CPU seconds of this process's finished children (and theirs, once reaped)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_minimal_client(url: str, args: argparse.Namespace, seed: int) -> list[dict[str, float]]:
    """benchmarks/stream_client.py at concurrency 1 and --slots: --requests new prompts per level."""
    model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    rows = []
    for i, level in enumerate(sorted({1, args.slots})):
        texts = stream_client.prompts(args.requests, args.prompt_tokens, seed=seed * 10 + i)
        rows.append(stream_client.run_level(url, model, texts, level, args.output_tokens))
    return rows


class EngineAlone:
    """An engine without its server, in a subprocess kept up for the whole run and measured once per round,
    between the servers' sweeps (the machine may be shared: a slow period then hits every column).

    `ask("single")`: --prompt-tokens random token ids, then --output-tokens tokens, one sequence at a time,
    3 times: the prefill (ms; median) and the decode step measured as guidellm measures ITL — the mean of a
    request's steps after its first token — median over the 3. `ask("aggregate")` (blazr only): --requests
    prompts, --slots at once (`LLM.generate`), output tok/s."""

    def __init__(self, name: str, code: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def ask(self, command: str) -> dict[str, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{self.name} alone exited with {self.proc.wait()}")
        return json.loads(line)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


_SINGLE = """
def single(run_one):
    pre, step = [], []
    for _ in range(3):
        times = run_one()  # per token: seconds from the previous one (the first: from the start)
        pre.append(times[0] * 1000)
        step.append(sum(times[1:]) / (len(times) - 1) * 1000)
    return {"prefill_ms": statistics.median(pre), "step_ms": statistics.median(step)}
"""


def blazr_alone(gguf: Path, args: argparse.Namespace) -> EngineAlone:
    """blazr's engine (`LLM`) on the server's GGUF, sampling as guidellm's requests do."""
    code = f"""
import json, random, statistics, sys, time, torch
torch.set_num_threads({args.threads})
from blazr import LLM
from blazr.engine.sampling import SamplingParams
llm = LLM({str(gguf)!r}, cpu=True, max_num_seqs={args.slots}, max_model_len=2048)
rng = random.Random(0)
vocab = llm.config.vocab_size
def prompts(n):
    return [[rng.randrange(1000, vocab - 1000) for _ in range({args.prompt_tokens})] for _ in range(n)]
# what the servers get from guidellm: no sampling fields, so OpenAI's defaults (temperature 1, no filters)
p = SamplingParams(max_tokens={args.output_tokens}, ignore_eos=True, temperature=1.0, top_p=1.0, top_k=0)
llm.generate(prompts(2), SamplingParams(max_tokens=8, ignore_eos=True, temperature=0))  # warm-up
e = llm.engine
def run_one():
    e.add_request(f"one{{time.monotonic_ns()}}", prompts(1)[0], p)
    times = []
    while e.has_unfinished():
        t = time.perf_counter(); e.step(); times.append(time.perf_counter() - t)
    return times
{_SINGLE}
for command in sys.stdin:
    if command.strip() == "single":
        print(json.dumps(single(run_one)), flush=True)
    else:
        t = time.perf_counter()
        outs = llm.generate(prompts({args.requests}), p)
        wall = time.perf_counter() - t
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        print(json.dumps({{"aggregate_tok_s": tokens / wall}}), flush=True)
"""
    return EngineAlone("blazr's engine", code)


def llama_cpp_alone(gguf: Path, args: argparse.Namespace) -> EngineAlone:
    """llama.cpp without its server (llama-cpp-python): llama-server's floors, for its own ratios."""
    code = f"""
import json, random, statistics, sys, time
from llama_cpp import Llama
llm = Llama(model_path={str(gguf)!r}, n_threads={args.threads}, n_threads_batch={args.threads},
            n_ctx={args.prompt_tokens + args.output_tokens + 16}, n_batch=512, verbose=False)
rng = random.Random(0)
def run_one():
    ids = [rng.randrange(1000, llm.n_vocab() - 1000) for _ in range({args.prompt_tokens})]
    llm.reset()
    t = time.perf_counter(); llm.eval(ids); times = [time.perf_counter() - t]
    for _ in range({args.output_tokens} - 1):
        t = time.perf_counter()
        llm.eval([llm.sample(temp=0.0, top_k=1)])
        times.append(time.perf_counter() - t)
    return times
{_SINGLE}
for command in sys.stdin:
    print(json.dumps(single(run_one)), flush=True)
"""
    return EngineAlone("llama.cpp", code)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16, 32])
    ap.add_argument("--requests", type=int, default=32, help="requests per concurrency level")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--slots", type=int, default=16, help="sequences each server runs at once")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="sweeps per server, alternating; medians")
    ap.add_argument("--model", type=Path, default=None, help="a GGUF both servers load (default: embedded)")
    ap.add_argument("--skip", action="append", default=[], choices=["llama-server", "engine", "blazr"])
    ap.add_argument("--blazr-args", default="", help="extra arguments for `blazr serve`")
    ap.add_argument("--json", type=Path, default=None, help="write the raw results here")
    args = ap.parse_args(argv)
    gguf = args.model or embedded_gguf()
    tok = tokenizer_dir(gguf)
    ctx = args.prompt_tokens + args.output_tokens + 64
    results: dict[str, object] = {"model": gguf.name, "args": {k: str(v) for k, v in vars(args).items()}}
    out_dir = Path(tempfile.mkdtemp(prefix="blazr-serve-bench-"))

    servers: list[tuple[str, list[str]]] = []
    if "blazr" not in args.skip:
        cmd = [sys.executable, "-m", "blazr", "serve", "--model", str(gguf), "--cpu", "--host", "127.0.0.1"]
        cmd += [
            "--max-num-seqs",
            str(args.slots),
            "--num-threads",
            str(args.threads),
            "--max-model-len",
            "2048",
        ]
        servers.append(("blazr", [*cmd, *shlex.split(args.blazr_args)]))
    if "llama-server" not in args.skip:
        binary = llama_tools.build("llama-server")
        cmd = [str(binary), "-m", str(gguf), "-np", str(args.slots), "-t", str(args.threads)]
        cmd += ["-c", str(args.slots * ctx), "--host", "127.0.0.1"]
        servers.append(("llama-server", cmd))
    running: list[Server] = []
    alone: dict[str, EngineAlone] = {}
    try:
        if "engine" not in args.skip:
            _log("the engines alone: loading …")
            alone["engine"] = blazr_alone(gguf, args)
            if "llama-server" not in args.skip:
                alone["llama_cpp_engine"] = llama_cpp_alone(gguf, args)
        for name, cmd in servers:  # both up at once (an idle server costs nothing), measured in turns
            _log(f"{name}: starting …")
            port = free_port()
            running.append(Server(name, [*cmd, "--port", str(port)], port))
            running[-1].wait_ready()
        rounds: dict[str, list[list[dict[str, float]]]] = {s.name: [] for s in running}
        minimal: dict[str, list[list[dict[str, float]]]] = {s.name: [] for s in running}
        engines: dict[str, list[dict[str, float]]] = {name: [] for name in alone}
        for r in range(args.rounds):
            order = running if r % 2 == 0 else running[::-1]
            for name, worker in alone.items():
                _log(f"round {r + 1}/{args.rounds}: {worker.name} alone …")
                one = worker.ask("single")
                engines[name].append({**one, **(worker.ask("aggregate") if name == "engine" else {})})
            for server in order:
                _log(f"round {r + 1}/{args.rounds}: {server.name}, guidellm at concurrency {args.levels} …")
                out = out_dir / f"{server.name}-{r}.json"
                rounds[server.name].append(run_guidellm(server.url, args, tok, out, seed=1000 + r))
                _log(
                    f"round {r + 1}/{args.rounds}: {server.name}, the minimal client at 1 and {args.slots} …"
                )
                minimal[server.name].append(run_minimal_client(server.url, args, seed=2000 + r))
    finally:
        for server in running:
            server.stop()
        for worker in alone.values():
            worker.stop()
    for name, runs in engines.items():
        results[name] = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
    for name, runs in rounds.items():
        results[name] = [_median_row([run[i] for run in runs]) for i in range(len(runs[0]))]
        results[f"{name}_rounds"] = runs
        results[f"{name}_minimal"] = [
            _median_row([run[i] for run in minimal[name]]) for i in range(len(minimal[name][0]))
        ]
    print(report(results, args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _median_row(rows: list[dict[str, float]]) -> dict[str, float]:
    """One level over rounds: the median of each figure (failures summed)."""
    out = {k: statistics.median(r[k] for r in rows) for k in ("output_tok_s", "ttft_ms", "itl_ms")}
    out["client_cores"] = statistics.median(r["client_cores"] for r in rows)
    out["concurrency"] = rows[0]["concurrency"]
    out["completed"] = sum(r.get("completed", 0) for r in rows)
    out["errored"] = sum(r.get("errored", 0) for r in rows)
    return out


def report(results: dict[str, object], args: argparse.Namespace) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.host import host_line

    lines = [
        f"machine: {host_line()}",
        "",
        f"guidellm, {results['model']}, {args.prompt_tokens}-token prompts, {args.output_tokens} output "
        f"tokens, {args.requests} requests per level, {args.slots} slots, {args.threads} threads",
        "",
        "| concurrency | blazr out tok/s | llama-server out tok/s | × | blazr TTFT / ITL (median ms) "
        "| llama-server TTFT / ITL |",
        "|---|---|---|---|---|---|",
    ]
    blazr = {r["concurrency"]: r for r in results.get("blazr", [])}  # type: ignore[union-attr]
    peer = {r["concurrency"]: r for r in results.get("llama-server", [])}  # type: ignore[union-attr]
    for level in args.levels:
        b, p = blazr.get(level), peer.get(level)
        ratio = f"{b['output_tok_s'] / p['output_tok_s']:.2f}" if b and p else "–"

        def cols(r: dict | None) -> tuple[str, str]:
            if r is None:
                return "–", "–"
            failed = f" ({r['errored']} failed)" if r["errored"] else ""
            return f"{r['output_tok_s']:.1f}{failed}", f"{r['ttft_ms']:.0f} / {r['itl_ms']:.1f}"

        (bt, bl), (pt, pl) = cols(b), cols(p)
        lines.append(f"| {level} | {bt} | {pt} | {ratio} | {bl} | {pl} |")
    lines.append(
        "\nguidellm's own CPU over a sweep (cores, median of rounds): "
        + ", ".join(
            f"{name} {rows[0]['client_cores']:.2f}"
            for name, rows in (
                ("against blazr", list(blazr.values())),
                ("against llama-server", list(peer.values())),
            )
            if rows
        )
    )
    mb = {r["concurrency"]: r for r in results.get("blazr_minimal", [])}  # type: ignore[union-attr]
    mp = {r["concurrency"]: r for r in results.get("llama-server_minimal", [])}  # type: ignore[union-attr]
    if mb or mp:
        lines += [
            "",
            "The same servers and workload through benchmarks/stream_client.py (one blocking connection per "
            "stream, no JSON parse per token), after each guidellm sweep:",
            "",
            "| concurrency | blazr out tok/s | llama-server out tok/s | × | blazr TTFT / ITL (median ms) "
            "| llama-server TTFT / ITL | client CPU (cores) |",
            "|---|---|---|---|---|---|---|",
        ]
        for level in sorted(set(mb) | set(mp)):
            b, p = mb.get(level), mp.get(level)
            ratio = f"{b['output_tok_s'] / p['output_tok_s']:.2f}" if b and p else "–"
            bt, bl = (
                (f"{b['output_tok_s']:.1f}", f"{b['ttft_ms']:.0f} / {b['itl_ms']:.2f}") if b else ("–", "–")
            )
            pt, pl = (
                (f"{p['output_tok_s']:.1f}", f"{p['ttft_ms']:.0f} / {p['itl_ms']:.2f}") if p else ("–", "–")
            )
            cores = " / ".join(f"{r['client_cores']:.2f}" for r in (b, p) if r)
            lines.append(f"| {level} | {bt} | {pt} | {ratio} | {bl} | {pl} | {cores} |")
    engine, peer_engine = results.get("engine"), results.get("llama_cpp_engine")
    if isinstance(engine, dict):
        lines += [
            "",
            "| engine alone (no server) | prefill of one prompt (ms) | decode step (ms) "
            "| ITL through its server / step: guidellm, minimal client | TTFT at 1 / prefill |",
            "|---|---|---|---|---|",
        ]
        for name, ref, served, light in [
            ("blazr", engine, blazr, mb),
            ("llama.cpp", peer_engine, peer, mp),
        ]:
            if not isinstance(ref, dict):
                continue
            itl = ", ".join(
                f"{r[1]['itl_ms'] / ref['step_ms']:.2f}" if r.get(1) else "–" for r in (served, light)
            )
            one = served.get(1)
            ttft = f"{one['ttft_ms'] / ref['prefill_ms']:.2f}" if one else "–"
            lines.append(f"| {name} | {ref['prefill_ms']:.0f} | {ref['step_ms']:.2f} | {itl} | {ttft} |")
        lines.append(
            f"\nblazr's engine alone on all {args.requests} requests ({args.slots} at once, LLM.generate): "
            f"{engine['aggregate_tok_s']:.1f} out tok/s"
            + (
                f"; through the server at {args.slots} streams: "
                f"{blazr[args.slots]['output_tok_s'] / engine['aggregate_tok_s']:.2f} of it (guidellm)"
                + (
                    f", {mb[args.slots]['output_tok_s'] / engine['aggregate_tok_s']:.2f} (minimal client)."
                    if args.slots in mb
                    else "."
                )
                if args.slots in blazr
                else "."
            )
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
