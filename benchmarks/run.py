"""Side-by-side speed table: blazr vs transformers vs llama.cpp (llama-cpp-python) on the embedded
SmolLM2-135M-Instruct, batch 1, same prompt, same thread count, one run of this script.

    prefill tok/s  — a 512-token prompt processed once (time to first token)
    decode tok/s   — tokens 2..N generated after that prompt (context ≈ 512)

Each figure is the median of --repeats runs after a warm-up. Peers that are not installed are listed as
missing (`make bench` installs them). Not part of `make test`: speed is measured here, never asserted.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class Result:
    engine: str
    weights: str
    prefill_tok_s: float
    decode_tok_s: float


def _median_rates(
    run: Callable[[], tuple[float, float]], repeats: int, prompt_len: int, gen: int
) -> tuple[float, float]:
    run()  # warm-up
    prefill, decode = [], []
    for _ in range(repeats):
        t_prefill, t_decode = run()
        prefill.append(prompt_len / t_prefill)
        decode.append((gen - 1) / t_decode)
    return statistics.median(prefill), statistics.median(decode)


def prompt_ids(n: int, vocab: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab - 100, (n,), generator=g).tolist()


# ----------------------------------------------------------------------------------------- engines


def bench_blazr(label: str, ids: list[int], gen: int, repeats: int, **llm_kwargs) -> Result:
    from blazr import LLM, SamplingParams

    llm = LLM(cpu=True, max_model_len=len(ids) + gen + 8, **llm_kwargs)
    params = SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True)

    def run() -> tuple[float, float]:
        t0 = time.perf_counter()
        first = None
        for _ in llm.stream_ids(ids, params):
            if first is None:
                first = time.perf_counter()
        end = time.perf_counter()
        return first - t0, end - first

    p, d = _median_rates(run, repeats, len(ids), gen)
    return Result("blazr", label, p, d)


def bench_transformers(dtype: torch.dtype, ids: list[int], gen: int, repeats: int) -> Result:
    from transformers import AutoModelForCausalLM

    from blazr.detect import default_model_path

    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype).eval()
    x = torch.tensor([ids])

    @torch.inference_mode()
    def run() -> tuple[float, float]:
        t0 = time.perf_counter()
        out = model(input_ids=x, use_cache=True)
        t1 = time.perf_counter()
        past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        for _ in range(gen - 1):
            out = model(input_ids=tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        return t1 - t0, time.perf_counter() - t1

    p, d = _median_rates(run, repeats, len(ids), gen)
    return Result("transformers", f"{str(dtype).removeprefix('torch.')} (dequantized GGUF)", p, d)


def bench_llama_cpp(path: Path, label: str, ids: list[int], gen: int, repeats: int, threads: int) -> Result:
    from llama_cpp import Llama

    llm = Llama(
        model_path=str(path),
        n_threads=threads,
        n_threads_batch=threads,
        n_ctx=len(ids) + gen + 8,
        n_batch=512,
        verbose=False,
    )

    def run() -> tuple[float, float]:
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        for _ in range(gen - 1):
            tok = llm.sample(temp=0.0, top_k=1)
            llm.eval([tok])
        return t1 - t0, time.perf_counter() - t1

    p, d = _median_rates(run, repeats, len(ids), gen)
    return Result("llama.cpp", label, p, d)


# ------------------------------------------------------------------------------------------ report


def machine() -> str:
    cpu = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}"


def versions() -> str:
    out = []
    for pkg in ("blazr", "torch", "transformers", "llama-cpp-python"):
        try:
            out.append(f"{pkg} {md.version(pkg)}")
        except md.PackageNotFoundError:
            out.append(f"{pkg} (not installed)")
    return ", ".join(out)


def table(results: list[Result], base: Result | None) -> str:
    rows = [
        "| engine | weights | prefill tok/s | decode tok/s | prefill × llama.cpp | decode × llama.cpp |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        rp = f"{r.prefill_tok_s / base.prefill_tok_s:.2f}" if base else "–"
        rd = f"{r.decode_tok_s / base.decode_tok_s:.2f}" if base else "–"
        rows.append(
            f"| {r.engine} | {r.weights} | {r.prefill_tok_s:.0f} | {r.decode_tok_s:.1f} | {rp} | {rd} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--skip", action="append", default=[], help="blazr | transformers | llama.cpp")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from blazr.detect import default_model_path

    ids = prompt_ids(args.prompt_len, 49152)
    results: list[Result] = []
    base = None
    jobs: list[tuple[str, Callable[[], Result]]] = [
        (
            "llama.cpp",
            lambda: bench_llama_cpp(
                default_model_path(), "Q4_1 GGUF", ids, args.gen, args.repeats, args.threads
            ),
        ),
        (
            "blazr",
            lambda: bench_blazr("float32 (dequantized GGUF)", ids, args.gen, args.repeats, dtype="float32"),
        ),
        ("transformers", lambda: bench_transformers(torch.float32, ids, args.gen, args.repeats)),
        ("transformers", lambda: bench_transformers(torch.bfloat16, ids, args.gen, args.repeats)),
    ]
    for name, job in jobs:
        if name in args.skip:
            continue
        try:
            r = job()
        except ImportError as e:
            print(f"# {name}: not installed ({e.name}); run `make bench`", file=sys.stderr)
            continue
        results.append(r)
        if r.engine == "llama.cpp" and base is None:
            base = r
        print(
            f"# {r.engine} {r.weights}: prefill {r.prefill_tok_s:.0f} tok/s, "
            f"decode {r.decode_tok_s:.1f} tok/s",
            file=sys.stderr,
            flush=True,
        )
    print(
        f"SmolLM2-135M-Instruct, batch 1, prompt {args.prompt_len} tokens, {args.gen} generated, "
        f"median of {args.repeats}"
    )
    print(f"machine: {machine()}")
    print(f"versions: {versions()}\n")
    print(table(results, base))
    return 0


if __name__ == "__main__":
    sys.exit(main())
