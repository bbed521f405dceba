"""Batched decode of the hybrid models, blazr beside llama.cpp's parallel sequences on the same GGUF.

    python benchmarks/hybrid_peers.py --precisions "" --batched-peer BUILD/bin/llama-batched-bench \
        [--models granite-4.0-h-350m,lfm2-350m,...] [--levels 1,4,16] [--rounds 3] [--threads 2] \
        [--batched-formats F32,F16,Q8_0,Q4_0]

The peer is llama.cpp's own `llama-batched-bench` (tools/batched-bench of the llama.cpp that
llama-cpp-python's sdist vendors; `make test` unpacks it under .venv/llama-cpp-sdist): configure that tree
with CMake (`cmake -S .../vendor/llama.cpp -B BUILD -DCMAKE_BUILD_TYPE=Release`) and
`cmake --build BUILD --target llama-batched-bench -j2`. llama-cpp-python itself cannot decode several
sequences through its high-level API, and its low-level one would time Python rather than llama.cpp.

Both engines run the GGUF that llama.cpp's converter (F32, F16, Q8_0) or quantizer (Q4_0) wrote
(hybrid_peers.gguf; --batched-formats, Q8_0 by default), with --threads each:

- llama.cpp: `llama-batched-bench -m GGUF -npp P -ntg G-1 -npl 1,4,16 -c 16·(P+G) -t T -tb T
  --output-format jsonl` — per level N, N separate P-token prompts (random tokens, sequence ids 0 … N-1;
  no `-pps`, the prompt is not shared) prefilled, then G-1 decode steps of N tokens each (random tokens,
  logits for every row); S_TG = N·(G-1) / the time of those steps. One context (n_seq_max = the largest
  level) serves every level, as blazr's one engine does.
- blazr: benchmarks/run.py's `Batching` on the same GGUF (blocks kept as stored): N requests, each its own
  P-token random prompt, prefilled untimed; then the G-1 decode steps of N sequences timed (greedy argmax
  sampling and detokenization included, which llama-batched-bench does not do).

A warm-up round, then --rounds rounds with the engines' order alternating (blazr's levels rotate as
run.py's table 2); medians. Speed is reported, never asserted.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.run import Batching, log, spread

LEVELS = (1, 4, 16)


def peer_build(binary: Path) -> str:
    """The peer binary's version line and, where its CMake cache lies beside it, its SIMD build flags."""
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False)
    version = " ".join(line for line in done.stderr.splitlines() + done.stdout.splitlines() if line)
    cache = binary.resolve().parent.parent / "CMakeCache.txt"
    flags = {}
    if cache.is_file():
        for line in cache.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.split(":")[0] in ("GGML_NATIVE", "GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AMX_INT8"):
                flags[key.split(":")[0]] = value
    if flags.get("GGML_NATIVE") == "ON":  # -march=native: the explicit ISA switches are ignored
        flags = {"GGML_NATIVE": "ON (-march=native)"}
    return f"{version}; {' '.join(f'{k}={v}' for k, v in flags.items())}".strip("; ")


def run_peer(
    binary: Path, path: Path, levels: tuple[int, ...], prompt_len: int, gen: int, threads: int
) -> dict[int, float]:
    """One llama-batched-bench process: S_TG (aggregate decode tok/s) per level."""
    ctx = max(levels) * (prompt_len + gen)
    cmd = [str(binary), "-m", str(path), "-npp", str(prompt_len), "-ntg", str(gen - 1)]
    cmd += ["-npl", ",".join(map(str, levels)), "-c", str(ctx), "-t", str(threads), "-tb", str(threads)]
    done = subprocess.run([*cmd, "--output-format", "jsonl"], capture_output=True, text=True, check=False)
    rates = {}
    for line in done.stdout.splitlines():
        if line.startswith("{") and "speed_tg" in line:
            row = json.loads(line)
            rates[int(row["pl"])] = float(row["speed_tg"])
    if done.returncode != 0 or set(rates) != set(levels):
        raise SystemExit(f"llama-batched-bench on {path.name} failed:\n{done.stderr[-3000:]}")
    return rates


def measure(
    path: Path,
    binary: Path,
    vocab: int,
    levels: tuple[int, ...],
    prompt_len: int,
    gen: int,
    rounds: int,
    threads: int,
) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """(blazr's, llama.cpp's) aggregate decode tok/s per level and round, engines interleaved."""
    log(f"# loading blazr {path.name} (as stored) for batched decode")
    bench = Batching(prompt_len, gen, path, vocab=vocab)
    ours: dict[int, list[float]] = {n: [] for n in levels}
    peer: dict[int, list[float]] = {n: [] for n in levels}
    for r in range(rounds + 1):
        what = f"round {r}/{rounds}" if r else "warm-up"
        for engine in ("blazr", "llama.cpp") if r % 2 else ("llama.cpp", "blazr"):
            if engine == "llama.cpp":
                rates = run_peer(binary, path, levels, prompt_len, gen, threads)
                log(f"# {what}: llama.cpp {', '.join(f'{n}: {v:.1f}' for n, v in rates.items())} tok/s")
                for n in levels if r else ():
                    peer[n].append(rates[n])
                continue
            shift = r % len(levels)
            for n in levels[shift:] + levels[:shift]:
                rate, tokens = bench.run(n, warm_up=r == 0)
                note = "" if r == 0 or tokens == n * (gen - 1) else " (a step was not pure decode)"
                log(f"# {what}: blazr {n} sequences: {rate:.1f} tok/s{note}")
                if r:
                    ours[n].append(rate)
    del bench
    return ours, peer


def table(ours: dict[int, list[float]], peer: dict[int, list[float]]) -> str:
    """Per level: both engines' median aggregate decode tok/s, blazr's step time, ratio and spreads."""
    lines = [
        "| sequences | blazr decode tok/s | blazr ms / step | llama.cpp decode tok/s (S_TG) "
        "| blazr × llama.cpp | spread blazr / llama.cpp |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for n in ours:
        b, c = statistics.median(ours[n]), statistics.median(peer[n])
        lines.append(
            f"| {n} | {b:.1f} | {n / b * 1e3:.0f} | {c:.1f} | {b / c:.2f} "
            f"| {spread(ours[n]):.0%} / {spread(peer[n]):.0%} |"
        )
    return "\n".join(lines)


def report(
    models: list[tuple[str, Path, int]],
    binary: Path,
    levels: tuple[int, ...],
    rounds: int,
    threads: int,
    prompt_len: int = 128,
    gen: int = 32,
) -> str:
    """Per (name, GGUF kind, GGUF, prompt vocabulary): the table of both engines, headed by the peer's
    build."""
    parts = [f"- peer: {binary.name} {peer_build(binary)}", ""]
    for name, kind, path, vocab in models:
        ours, peer = measure(path, binary, vocab, levels, prompt_len, gen, rounds, threads)
        parts += [
            f"### {name} {kind} GGUF: batched decode, blazr (tensors as stored) vs llama-batched-bench",
            "",
            f"N sequences × their own {prompt_len}-token random prompt, then {gen - 1} decode steps of N "
            f"tokens timed; medians of {rounds} interleaved rounds after a warm-up; {threads} threads each.",
            "",
            table(ours, peer),
            "",
        ]
    return "\n".join(parts)
