"""Side-by-side speed table: blazr vs transformers vs llama.cpp (llama-cpp-python) on the embedded
SmolLM2-135M-Instruct, batch 1, same prompt, same thread count, one run of this script.

Matched weight precision: blazr keeping the GGUF's Q4_1 blocks vs llama.cpp on the same Q4_1 file; blazr's
16-bit path (bf16 weights) vs llama.cpp on an F16 GGUF made from the same file by llama.cpp's own
quantizer (`llama_model_quantize`, F16, requantize allowed); float32 rows for reference. Ratios are
against the llama.cpp row of the same precision.

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
    precision: str = ""  # rows of one precision are compared with llama.cpp's row of it


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


def bench_blazr(
    label: str, precision: str, ids: list[int], gen: int, repeats: int, model: Path | None = None, **kw
) -> Result:
    from blazr import LLM, SamplingParams

    llm = LLM(model, cpu=True, max_model_len=len(ids) + gen + 8, **kw)
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
    return Result("blazr", label, p, d, precision)


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


def f16_gguf(q4_path: Path) -> Path:
    """An F16 GGUF of the same weights, written by llama.cpp's quantizer (cached next to this script)."""
    import llama_cpp

    out = Path(__file__).parent / ".cache" / (q4_path.stem.replace("Q4_1", "") + "F16-requant.gguf")
    if not out.exists():
        out.parent.mkdir(exist_ok=True)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_F16
        params.allow_requantize = True
        rc = llama_cpp.llama_model_quantize(str(q4_path).encode(), str(out).encode(), params)
        if rc != 0:
            raise RuntimeError(f"llama_model_quantize failed ({rc})")
    return out


def bench_llama_cpp(
    path: Path, label: str, precision: str, ids: list[int], gen: int, repeats: int, threads: int
) -> Result:
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
    return Result("llama.cpp", label, p, d, precision)


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


def table(results: list[Result]) -> str:
    """Ratios against llama.cpp's row of the same precision (the Q4 row for the fp32 / transformers rows)."""
    bases = {r.precision: r for r in results if r.engine == "llama.cpp"}
    rows = [
        "| engine | weights | prefill tok/s | decode tok/s | prefill × llama.cpp | decode × llama.cpp |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        base = bases.get(r.precision) or bases.get("q4")
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
    q4 = default_model_path()
    n, reps, t = args.gen, args.repeats, args.threads
    jobs: list[tuple[str, Callable[[], Result]]] = [
        ("llama.cpp", lambda: bench_llama_cpp(q4, "Q4_1 GGUF", "q4", ids, n, reps, t)),
        ("blazr", lambda: bench_blazr("Q4_1 GGUF kept quantized", "q4", ids, n, reps)),
        ("llama.cpp", lambda: bench_llama_cpp(f16_gguf(q4), "F16 GGUF", "16", ids, n, reps, t)),
        (
            "blazr",
            lambda: bench_blazr("F16 GGUF as bf16", "16", ids, n, reps, f16_gguf(q4), quantize="bf16"),
        ),
        ("blazr", lambda: bench_blazr("float32 (dequantized GGUF)", "32", ids, n, reps, quantize="none")),
        ("transformers", lambda: bench_transformers(torch.float32, ids, n, reps)),
        ("transformers", lambda: bench_transformers(torch.bfloat16, ids, n, reps)),
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
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
