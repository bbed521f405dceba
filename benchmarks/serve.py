"""The server benchmark (issue 18): guidellm against `blazr serve` and llama.cpp's own `llama-server`, side by
side in one run, with blazr's engine alone on the same workload for the overhead columns.

    python benchmarks/serve.py [--levels 1,4,16,32] [--requests 32] [--prompt-tokens 128]
                               [--output-tokens 64] [--slots 16] [--threads 2] [--model GGUF]
                               [--skip llama-server] [--blazr-args "..."] [--json FILE]

Workload: guidellm's synthetic text prompts of --prompt-tokens tokens (SmolLM2's tokenizer) and
--output-tokens output tokens each (`ignore_eos`), streamed /v1/chat/completions, `--requests` requests per
concurrency level (guidellm's `concurrent` profile), both servers on the same GGUF (default: the embedded
SmolLM2 Q4_1) with --slots sequences at once and --threads threads. llama-server is built once from the
llama-cpp-python sdist `make test` unpacks (vendor/llama.cpp) into benchmarks/.cache/llama-server.

Engine columns (blazr only, no HTTP): `LLM.generate` on the same number of prompts of the same token
length, max_num_seqs = --slots: one sequence's decode step time (the ITL floor) and the aggregate output
tok/s of all --requests prompts (the throughput ceiling for the 16-stream level).

Columns per level: output tok/s (guidellm's, over the level's wall time), median TTFT and ITL in ms, and
× = blazr / llama-server output tok/s. Speed is reported here, never asserted.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "benchmarks" / ".cache"
LLAMA_SERVER = CACHE / "llama-server" / "build" / "bin" / "llama-server"
TOKENIZER_DIR = CACHE / "smollm2-tokenizer"


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def embedded_gguf() -> Path:
    from blazr.detect.paths import resolve_model_path

    return Path(resolve_model_path(None))


def build_llama_server() -> Path:
    """llama-server from the vendored llama.cpp of the installed llama-cpp-python's sdist (built once)."""
    if LLAMA_SERVER.exists():
        return LLAMA_SERVER
    sources = sorted(
        glob.glob(str(ROOT / ".venv" / "llama-cpp-sdist" / "llama_cpp_python-*" / "vendor" / "llama.cpp"))
    )
    if not sources:
        raise SystemExit(
            "llama.cpp sources not found: run `make .venv/.installed-test` (it unpacks the sdist)"
        )
    build = LLAMA_SERVER.parent.parent
    _log(f"building llama-server from {sources[-1]} (once, a few minutes) …")
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF"]
    flags += ["-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DBUILD_SHARED_LIBS=OFF"]
    flags += shlex.split(os.environ.get("CMAKE_ARGS", ""))
    subprocess.run(
        ["cmake", "-S", sources[-1], "-B", str(build), *flags], check=True, stdout=subprocess.DEVNULL
    )
    jobs = str(os.cpu_count() or 2)
    subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs], check=True)
    return LLAMA_SERVER


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


def run_guidellm(url: str, args: argparse.Namespace, tok: Path, out: Path) -> list[dict[str, float]]:
    """guidellm's concurrent profile at every level; per level: output tok/s, median TTFT / ITL (ms)."""
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
        "--output", f"kind=json,path={out}",
        "--disable-console-interactive",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tempfile.gettempdir())
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
            }
        )
    return rows


def engine_reference(gguf: Path, args: argparse.Namespace) -> dict[str, float]:
    """blazr's engine without the server, in a subprocess: one sequence's decode step (ms) and the aggregate
    output tok/s of --requests prompts at --slots sequences at once."""
    code = f"""
import json, random, time, torch
torch.set_num_threads({args.threads})
from blazr import LLM
from blazr.engine.sampling import SamplingParams
llm = LLM({str(gguf)!r}, cpu=True, max_num_seqs={args.slots}, max_model_len=2048)
rng = random.Random(0)
vocab = llm.config.vocab_size
n, m = {args.requests}, {args.prompt_tokens}
prompts = [[rng.randrange(1000, vocab - 1000) for _ in range(m)] for _ in range(n)]
p = SamplingParams(max_tokens={args.output_tokens}, ignore_eos=True, temperature=0)
llm.generate(prompts[:2], SamplingParams(max_tokens=8, ignore_eos=True, temperature=0))  # warm-up
e = llm.engine
e.add_request("one", prompts[0], p)
times = []
while e.has_unfinished():
    t = time.perf_counter(); e.step(); times.append(time.perf_counter() - t)
step_ms = sorted(times[1:])[len(times[1:]) // 2] * 1000  # median decode step (the first is the prefill)
t = time.perf_counter()
outs = llm.generate(prompts, p)
wall = time.perf_counter() - t
tokens = sum(len(o.outputs[0].token_ids) for o in outs)
print(json.dumps({{"step_ms": step_ms, "aggregate_tok_s": tokens / wall}}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"engine reference failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16, 32])
    ap.add_argument("--requests", type=int, default=32, help="requests per concurrency level")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--slots", type=int, default=16, help="sequences each server runs at once")
    ap.add_argument("--threads", type=int, default=2)
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

    if "engine" not in args.skip:
        _log("blazr engine alone (LLM.generate) …")
        results["engine"] = engine_reference(gguf, args)
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
        binary = build_llama_server()
        cmd = [str(binary), "-m", str(gguf), "-np", str(args.slots), "-t", str(args.threads)]
        cmd += ["-c", str(args.slots * ctx), "--host", "127.0.0.1"]
        servers.append(("llama-server", cmd))
    for name, cmd in servers:
        port = _free_port()
        _log(f"{name}: starting …")
        server = Server(name, [*cmd, "--port", str(port)], port)
        try:
            server.wait_ready()
            _log(f"{name}: guidellm at concurrency {args.levels} …")
            results[name] = run_guidellm(server.url, args, tok, out_dir / f"{name}.json")
        finally:
            server.stop()
    print(report(results, args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def report(results: dict[str, object], args: argparse.Namespace) -> str:
    lines = [
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
    engine = results.get("engine")
    if isinstance(engine, dict):
        lines += [
            "",
            f"blazr engine alone (LLM.generate, no server): decode step {engine['step_ms']:.2f} ms "
            f"(one sequence), {engine['aggregate_tok_s']:.1f} out tok/s aggregate over {args.requests} "
            f"requests at {args.slots} at once.",
        ]
        if 1 in blazr:
            lines.append(f"Single-stream ITL / engine step: {blazr[1]['itl_ms'] / engine['step_ms']:.2f}.")
        if args.slots in blazr:
            share = blazr[args.slots]["output_tok_s"] / engine["aggregate_tok_s"]
            lines.append(f"{args.slots} streams through the server / engine aggregate: {share:.2f}.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
