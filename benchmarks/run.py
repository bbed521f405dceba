"""Speed report (what `make bench` runs): blazr vs llama.cpp (llama-cpp-python) vs transformers on the CPU.

    python benchmarks/run.py [--prompt-len 512] [--batch-prompt-len 128] [--gen 64] [--rounds 5]
                             [--threads N] [--skip NAME]... [--quick]

Prints progress to stderr and a markdown report to stdout (`python benchmarks/run.py > table.md`):

Table 1 — one sequence, SmolLM2-135M-Instruct (the embedded Q4_1 GGUF), batch 1, one fixed random prompt of
--prompt-len tokens, --gen greedy tokens, the same --threads for every engine:
    prefill tok/s  = prompt_len / time to the first token
    decode tok/s   = (gen - 1) / time from the first token to the last (context ≈ prompt_len)
Matched weight precision: blazr keeping the GGUF's Q4_1 blocks vs llama.cpp on the same file; blazr's 16-bit
path (bf16 weights) vs llama.cpp on an F16 GGUF made from the same file by llama.cpp's own quantizer;
float32 rows and transformers (dequantized GGUF, float32 and bfloat16; greedy with its KV cache and the
last position's logits only, as `generate` does) for reference. "× llama.cpp" is against the llama.cpp row
of the same precision (the Q4_1 row for rows without one), "× transformers" against the best transformers
decode.

Table 2 — continuous batching, blazr Q4_1 in one engine: 1, 4, 8, 16 concurrent sequences, each its own
random prompt of --batch-prompt-len tokens and --gen greedy tokens (ignore_eos). All requests are added,
the engine steps until every sequence has its first token (prefill, not timed), then the remaining steps
are timed: aggregate decode tok/s = tokens generated in those steps / their time.

Table 3 — hybrid models (benchmarks/hybrid.py): random oxidizr-nano-shaped checkpoints (Mamba2 + MLA/MoE,
Mamba2 only) and a tiny GraniteMoeHybrid, prefill tok/s and decode ms/token versus context, MoE cost
versus number of experts. --quick shrinks its contexts (64 / 256 / 1024 instead of 128 / 512 / 4096).

Table 4 — hybrids at published shapes (benchmarks/hybrid_peers.py): granite-4.0-h-350m, mamba2-130m, a
Nemotron-H (the 4B's block pattern at 768 wide) and Falcon-H1-0.5B built with transformers (random
weights), llama.cpp on GGUFs its own converter made from the same directory (F32, F16, Q8_0, Q4_0), blazr
on the safetensors with --quantize none / bf16 / int8 / int4; 500-token prompt, 2 × --gen tokens.

Noise handling (the machine may be shared): in tables 1 and 2 every engine (concurrency level) is loaded
once and then measured in --rounds interleaved rounds, each running every engine (level) once, after one
warm-up round (in table 2 a short one: 8 tokens per level); the figure reported is the median over rounds,
and the spread over rounds, (max - min) / median, is shown with each table. A slow period thus hits all
engines alike, and ratios within one run are what to compare. The order within a round rotates from round
to round. All engines live in one process (llama.cpp's threads were
measured not to slow blazr's); each is loaded when first needed and freed after its table. Table 3 runs its
models one after another (medians of --rounds runs after a warm-up). Peers that are not installed are
listed as missing (`make bench` installs them). Speed is reported here, never asserted.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata as md
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.host import host_line

Timing = tuple[float, float]  # (seconds to the first token, seconds from the first token to the last)
Runner = Callable[[], Timing]  # one generation of --gen tokens after the prompt

SMOLLM2_VOCAB = 49152
BATCH_LEVELS = (1, 4, 8, 16)
SKIP_NAMES = ("llama.cpp", "blazr", "transformers", "batching", "hybrid", "hybrid-peers")


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def prompt_ids(n: int, vocab: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab - 100, (n,), generator=g).tolist()


def spread(values: list[float]) -> float:
    """(max - min) / median: how much the rounds disagreed."""
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0


# ---------------------------------------------------------------------------------- table 1: engines


def load_blazr(ids: list[int], gen: int, model: Path | None = None, **kw: Any) -> Runner:
    from blazr import LLM, SamplingParams

    # Every round sends the same prompt: without this its later rounds would be prefix-cache hits.
    llm = LLM(model, cpu=True, max_model_len=len(ids) + gen + 8, enable_prefix_caching=False, **kw)
    params = SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True)

    def run() -> Timing:
        t0 = time.perf_counter()
        first = None
        for _ in llm.stream_ids(ids, params):
            if first is None:
                first = time.perf_counter()
        end = time.perf_counter()
        assert first is not None
        return first - t0, end - first

    return run


def load_transformers(dtype: torch.dtype, ids: list[int], gen: int) -> Runner:
    """Greedy decoding with the model's KV cache, logits of the last position only (as `generate` does)."""
    from transformers import AutoModelForCausalLM

    from blazr.detect import default_model_path

    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype).eval()
    linear = model.get_submodule("model.layers.0.mlp.down_proj")  # transformers may warn it stays packed
    log(f"# transformers: {type(linear).__name__} weights in {linear.weight.dtype} (dequantized at load)")
    return transformers_runner(model, ids, gen)


def transformers_runner(model: torch.nn.Module, ids: list[int], gen: int) -> Runner:
    """One generation of a transformers model: the prompt, then gen − 1 greedy steps with its KV cache, the
    last position's logits only."""
    x = torch.tensor([ids])

    @torch.inference_mode()
    def run() -> Timing:
        t0 = time.perf_counter()
        out = model(input_ids=x, use_cache=True, logits_to_keep=1)
        t1 = time.perf_counter()
        past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        for _ in range(gen - 1):
            out = model(input_ids=tok, past_key_values=past, use_cache=True, logits_to_keep=1)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        return t1 - t0, time.perf_counter() - t1

    return run


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


def load_llama_cpp(path: Path, ids: list[int], gen: int, threads: int) -> Runner:
    from llama_cpp import Llama

    llm = Llama(
        model_path=str(path),
        n_threads=threads,
        n_threads_batch=threads,
        n_ctx=len(ids) + gen + 8,
        n_batch=512,
        verbose=False,
    )

    def run() -> Timing:
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        for _ in range(gen - 1):
            tok = llm.sample(temp=0.0, top_k=1)
            llm.eval([tok])
        return t1 - t0, time.perf_counter() - t1

    return run


@dataclass
class Row:
    """One engine of table 1: how to load it, and its rates per round."""

    engine: str
    weights: str
    precision: str  # rows of one precision are compared with llama.cpp's row of it ("q4" when it has none)
    load: Callable[[], Runner]
    run: Runner | None = None
    missing: str = ""
    prefill: list[float] = field(default_factory=list)
    decode: list[float] = field(default_factory=list)
    weight_bytes: int = 0  # the weight bytes a decode token reads (read_rate.py); 0: not shown

    @property
    def name(self) -> str:
        return f"{self.engine} {self.weights}"

    @property
    def prefill_tok_s(self) -> float:
        return statistics.median(self.prefill)

    @property
    def decode_tok_s(self) -> float:
        return statistics.median(self.decode)


def single_rows(ids: list[int], gen: int, threads: int) -> list[Row]:
    from blazr.detect import default_model_path

    q4 = default_model_path()
    f32, bf16 = torch.float32, torch.bfloat16
    return [
        Row("llama.cpp", "Q4_1 GGUF", "q4", lambda: load_llama_cpp(q4, ids, gen, threads)),
        Row("blazr", "Q4_1 GGUF kept quantized", "q4", lambda: load_blazr(ids, gen)),
        Row("llama.cpp", "F16 GGUF", "16", lambda: load_llama_cpp(f16_gguf(q4), ids, gen, threads)),
        Row("blazr", "F16 GGUF as bf16", "16", lambda: load_blazr(ids, gen, f16_gguf(q4), quantize="bf16")),
        Row("blazr", "float32 (dequantized GGUF)", "32", lambda: load_blazr(ids, gen, quantize="none")),
        Row("transformers", "float32 (dequantized GGUF)", "", lambda: load_transformers(f32, ids, gen)),
        Row("transformers", "bfloat16 (dequantized GGUF)", "", lambda: load_transformers(bf16, ids, gen)),
    ]


def measure_single(rows: list[Row], rounds: int, prompt_len: int, gen: int) -> list[Row]:
    """A warm-up round (loading each engine before its first run), then `rounds` interleaved rounds.

    Returns the rows measured (not those whose peer is missing)."""
    for r in range(rounds + 1):
        live = [row for row in rows if not row.missing]
        shift = r % len(live) if live else 0
        for row in live[shift:] + live[:shift]:
            if row.run is None:
                log(f"# loading {row.name}")
                t0 = time.perf_counter()
                try:
                    row.run = row.load()
                except ImportError as e:
                    row.missing = e.name or str(e)
                    log(f"# {row.engine}: not installed ({row.missing}); run `make bench`")
                    continue
                log(f"# loaded in {time.perf_counter() - t0:.1f} s")
            t_prefill, t_decode = row.run()
            p, d = prompt_len / t_prefill, (gen - 1) / t_decode
            if r:
                row.prefill.append(p)
                row.decode.append(d)
            what = f"round {r}/{rounds}" if r else "warm-up"
            log(f"# {what}: {row.name}: prefill {p:.0f} tok/s, decode {d:.1f} tok/s")
    for row in rows:
        row.run = None  # frees the engine
    gc.collect()
    return [row for row in rows if row.prefill]


def single_table(rows: list[Row]) -> str:
    """Ratios against llama.cpp's row of the same precision (the Q4 row for the fp32 / transformers rows) and
    against the best transformers decode."""
    bases = {r.precision: r for r in rows if r.engine == "llama.cpp"}
    hf = max((r.decode_tok_s for r in rows if r.engine == "transformers"), default=None)
    gbs = any(r.weight_bytes for r in rows)  # a column of decode as GB/s of weights read
    lines = [
        "| engine | weights | prefill tok/s | decode tok/s | prefill × llama.cpp | decode × llama.cpp "
        "| decode × transformers |" + (" decode GB/s of weights |" if gbs else ""),
        "|---|---|---:|---:|---:|---:|---:|" + ("---:|" if gbs else ""),
    ]
    for r in rows:
        base = bases.get(r.precision) or bases.get("q4")
        rp = f"{r.prefill_tok_s / base.prefill_tok_s:.2f}" if base else "–"
        rd = f"{r.decode_tok_s / base.decode_tok_s:.2f}" if base else "–"
        rt = f"{r.decode_tok_s / hf:.2f}" if hf else "–"
        rates = f"{r.prefill_tok_s:.0f} | {r.decode_tok_s:.1f}"
        gb = f" {r.weight_bytes * r.decode_tok_s / 1e9:.1f} |" if r.weight_bytes else " – |"
        rate = gb if gbs else ""
        lines.append(f"| {r.engine} | {r.weights} | {rates} | {rp} | {rd} | {rt} |" + rate)
    return "\n".join(lines)


def spread_note(rows: list[Row]) -> str:
    if not rows or len(rows[0].decode) < 2:
        return ""
    parts = [
        f"{r.engine} {r.weights.split(' (')[0]} {spread(r.prefill):.0%} / {spread(r.decode):.0%}"
        for r in rows
    ]
    return "Spread over rounds, (max − min) / median, prefill / decode: " + "; ".join(parts) + "."


# -------------------------------------------------------------------------- table 2: continuous batching


class Batching:
    """blazr Q4_1 in one engine, driven step by step: aggregate decode tok/s of n concurrent sequences."""

    def __init__(
        self, prompt_len: int, gen: int, model: Path | None = None, vocab: int = SMOLLM2_VOCAB, **kw: Any
    ) -> None:
        from blazr import LLM, SamplingParams

        self.llm = LLM(
            model,
            cpu=True,
            max_num_seqs=max(BATCH_LEVELS),
            max_num_batched_tokens=2048,
            max_model_len=prompt_len + gen + 8,
            **kw,
        )
        self.prompts = [prompt_ids(prompt_len, vocab, seed=1 + i) for i in range(max(BATCH_LEVELS))]
        self.params = SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True)
        self.warm = SamplingParams(temperature=0, max_tokens=min(gen, 8), ignore_eos=True)
        self.count = 0

    def run(self, n: int, warm_up: bool = False) -> tuple[float, int]:
        """(aggregate decode tok/s, tokens counted): prefill untimed, then the remaining steps timed."""
        eng = self.llm.engine
        for i in range(n):
            self.count += 1
            eng.add_request(f"bench-{self.count}", self.prompts[i], self.warm if warm_up else self.params)
        while any(not s.output_ids for req in eng.requests.values() for s in req.seqs):
            eng.step()
        t0 = time.perf_counter()
        tokens = 0
        while eng.has_unfinished():
            tokens += sum(len(out.token_ids) for out in eng.step())
        return tokens / (time.perf_counter() - t0), tokens


def measure_batching(
    prompt_len: int, gen: int, rounds: int, model: Path | None = None, **kw: Any
) -> dict[int, list[float]]:
    """Aggregate decode tok/s per batch level, interleaved rounds; the embedded SmolLM2 unless `model`
    (then `kw`: vocab for the prompts, and LLM options such as quantize)."""
    log(f"# loading blazr {model or 'Q4_1 GGUF'} {kw} for continuous batching")
    bench = Batching(prompt_len, gen, model, **kw)
    for n in BATCH_LEVELS:  # warm-up: records the decode plan of each batch size
        bench.run(n, warm_up=True)
    rates: dict[int, list[float]] = {n: [] for n in BATCH_LEVELS}
    for r in range(rounds):
        shift = r % len(BATCH_LEVELS)
        for n in BATCH_LEVELS[shift:] + BATCH_LEVELS[:shift]:
            rate, tokens = bench.run(n)
            expected = n * (gen - 1)
            note = "" if tokens == expected else f" (expected {expected}: some decode ran during prefill)"
            log(f"# round {r + 1}/{rounds}: {n} sequences: {rate:.1f} tok/s, {tokens} tokens{note}")
            rates[n].append(rate)
    del bench
    gc.collect()
    return rates


def batching_table(rates: dict[int, list[float]]) -> str:
    one = statistics.median(rates[1])
    lines = [
        "| sequences | aggregate decode tok/s | ms / decode step | × one sequence | spread over rounds |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n, values in rates.items():
        agg = statistics.median(values)
        noise = f"{spread(values):.0%}" if len(values) > 1 else "–"
        lines.append(f"| {n} | {agg:.1f} | {n / agg * 1e3:.1f} | {agg / one:.2f} | {noise} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- header


def versions() -> str:
    out = [f"python {platform.python_version()}"]
    for pkg in ("blazr", "torch", "transformers", "llama-cpp-python"):
        try:
            out.append(f"{pkg} {md.version(pkg)}")
        except md.PackageNotFoundError:
            out.append(f"{pkg} (not installed)")
    try:
        repo = Path(__file__).resolve().parents[1]
        git = ["git", "-C", str(repo)]
        rev = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        )
        out[1] += f" (git {rev.stdout.strip()}{', modified' if dirty.stdout.strip() else ''})"
    except (OSError, subprocess.CalledProcessError):
        pass
    return ", ".join(out)


# --------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-len", type=int, default=512, help="table 1 prompt length (default 512)")
    ap.add_argument("--batch-prompt-len", type=int, default=128, help="table 2 prompt length (default 128)")
    ap.add_argument("--gen", type=int, default=64, help="tokens generated per sequence (default 64)")
    ap.add_argument("--rounds", type=int, default=5, help="measured rounds; medians reported (default 5)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=SKIP_NAMES,
        help="leave out table 1's rows of an engine (llama.cpp, blazr, transformers), or table 2 (batching), "
        "3 (hybrid) or 4 (hybrid-peers); may be repeated",
    )
    ap.add_argument("--quick", action="store_true", help="table 3 at shorter contexts")
    args = ap.parse_args(argv)
    if args.gen < 2 or args.rounds < 1:
        ap.error("--gen must be ≥ 2 and --rounds ≥ 1")
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    n, rounds = args.gen, args.rounds
    how = f"median of {rounds} interleaved round{'s' if rounds > 1 else ''} after a warm-up round"
    report = [
        "# blazr speed report",
        "",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- machine: {host_line()}",
        f"- versions: {versions()}",
        f"- threads: {args.threads} for every engine",
    ]

    ids = prompt_ids(args.prompt_len, SMOLLM2_VOCAB)
    rows = [r for r in single_rows(ids, n, args.threads) if r.engine not in args.skip]
    if rows:
        t0 = time.perf_counter()
        measured = measure_single(rows, rounds, args.prompt_len, n)
        log(f"# table 1 done in {time.perf_counter() - t0:.0f} s")
        report += [
            "",
            "## 1. One sequence: SmolLM2-135M-Instruct, batch 1",
            "",
            f"Prompt {args.prompt_len} random tokens, {n} greedy tokens generated; {how}.",
            "",
            single_table(measured),
            "",
            "× llama.cpp: against llama.cpp's row of the same precision (Q4_1 for the float32 and "
            "transformers rows); × transformers: against the best transformers decode.",
        ]
        if note := spread_note(measured):
            report += ["", note]
        missing = sorted({r.engine for r in rows if r.missing})
        if missing:
            report += ["", f"Not installed (run `make bench`): {', '.join(missing)}."]

    if "batching" not in args.skip:
        t0 = time.perf_counter()
        rates = measure_batching(args.batch_prompt_len, n, rounds)
        log(f"# table 2 done in {time.perf_counter() - t0:.0f} s")
        report += [
            "",
            "## 2. Continuous batching: blazr, SmolLM2-135M-Instruct Q4_1",
            "",
            f"Each sequence: its own random prompt of {args.batch_prompt_len} tokens, {n} greedy tokens "
            f"(ignore_eos); decode steps only (timed after every sequence has its first token); {how}.",
            "",
            batching_table(rates),
        ]

    if "hybrid" not in args.skip:
        import hybrid  # benchmarks/hybrid.py: this script's folder is first on the import path

        contexts = hybrid.QUICK_CONTEXTS if args.quick else hybrid.CONTEXTS
        t0 = time.perf_counter()
        report += ["", "## 3. Hybrid models (random weights)", "", hybrid.report(rounds, "float32", contexts)]
        log(f"# table 3 done in {time.perf_counter() - t0:.0f} s")

    if "hybrid-peers" not in args.skip:
        import hybrid_peers  # benchmarks/hybrid_peers.py

        t0 = time.perf_counter()
        models, precisions = list(hybrid_peers.MODELS), list(hybrid_peers.PRECISIONS)
        tables = hybrid_peers.report(models, precisions, 500, 2 * n, rounds, args.threads)
        report += ["", "## 4. Hybrid models at published shapes vs llama.cpp (random weights)", "", tables]
        log(f"# table 4 done in {time.perf_counter() - t0:.0f} s")

    print("\n".join(report))
    log(f"# done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
