"""Q4_K / Q6_K as stored (kinds q4_k / q6_k, csrc/linear_k.c) against the same weights re-laid in 16-row
groups (q4_kx / q6_kx, csrc/linear_kx.c — what the loader runs on AVX-512 VNNI builds), side by side.

    python benchmarks/kquant_packed.py [--kinds q4_k q6_k] [--rows 1 4 16 512] [--threads 2] [--rounds 5]

At the 1B shapes (q 2048 × 2048, gate|up 16384 × 2048, down 2048 × 8192) and each row count: rows ≤ 16
cycle through weights past 3× the last-level cache (what a decode step reads) and print GB/s of weight
bytes; more rows call one weight (a prefill) and print GFLOP/s. `--hot` adds the one-row call on one
cache-resident weight (the kernel's compute rate). The two layouts alternate round by round (medians); their
outputs are asserted equal, bit for bit, before any timing. Speed only.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from blazr.kernels import kquant_packed, ops, tuning
from blazr.kernels.quant import QuantizedWeight

SHAPES = {"q": (2048, 2048), "gate|up": (16384, 2048), "down": (2048, 8192)}  # N × K


def rate(k: ops.Kernels, x: torch.Tensor, ws: list[QuantizedWeight], per_call: float) -> float:
    """Units of `per_call` (bytes, weights or flops of one call) per second over 0.1 s of calls cycling `ws`
    (more than 8 rows: a prefill call, which f32 weights run on the panel GEMM)."""
    t0, reps = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.1:
        for w in ws:
            k.linear(x, w, prefill=x.shape[0] > 8)
        reps += 1
    return reps * len(ws) * per_call / (time.perf_counter() - t0) / 1e9


def cold_weights(kind: str, n: int, kk: int, g: torch.Generator) -> list[QuantizedWeight]:
    """Random weights [n, kk] of `kind`, enough copies to pass 3× the last-level cache (a decode step's
    reads)."""
    ws = [tuning._weight(kind, n, kk, g)]
    return ws + [
        tuning._weight(kind, n, kk, g) for _ in range(-(-3 * tuning._l3_bytes() // ws[0].nbytes) - 1)
    ]


def setup(
    doc: str, kinds: list[str], choices: list[str], rows: list[int]
) -> tuple[argparse.Namespace, ops.Kernels, torch.Generator]:
    """The command line of the stored-against-re-laid kernel benchmarks (this file, benchmarks/coded.py) —
    --kinds, --rows, --threads, --rounds, --hot — parsed, the threads set; the library and a seeded
    generator."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--kinds", nargs="+", default=kinds, choices=choices)
    ap.add_argument("--rows", nargs="+", type=int, default=rows)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hot", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    k = ops.kernels()
    assert k is not None, "the kernel library did not load"
    return args, k, torch.Generator().manual_seed(0)


def cases(args: argparse.Namespace, cold: int) -> list[tuple[str, int, int]]:
    """(label, x rows, weights cycled) of each measured call: `--hot`'s one row on one weight, then each
    --rows count — over the `cold` weights up to 16 rows (a decode step's reads), one weight past them."""
    hot = [("1 (hot)", 1, 1)] if args.hot else []
    return hot + [(str(m), m, cold if m <= 16 else 1) for m in args.rows]


def medians(
    k: ops.Kernels,
    x: torch.Tensor,
    a: list[QuantizedWeight],
    b: list[QuantizedWeight],
    per_call: float,
    rounds: int,
) -> tuple[float, float]:
    """The rates of the two forms `a` and `b` (`rate`), alternating round by round: their medians."""
    ra, rb = [], []
    for _ in range(rounds):
        ra.append(rate(k, x, a, per_call))
        rb.append(rate(k, x, b, per_call))
    return statistics.median(ra), statistics.median(rb)


def main() -> None:
    args, k, g = setup(__doc__, ["q4_k", "q6_k"], list(kquant_packed.KX_OF), [1, 4, 16, 512])
    print(f"{args.threads} threads, kernels {', '.join(k.features)}; decode rows: GB/s of weight bytes "
          "(cold), prefill rows: GFLOP/s")  # fmt: skip
    print("| kind | shape | rows | stored | 16-row groups | × |")
    print("|---|---|---:|---:|---:|---:|")
    for kind in args.kinds:
        for shape, (n, kk) in SHAPES.items():
            stored = cold_weights(kind, n, kk, g)
            size = stored[0].nbytes
            packed = [kquant_packed.pack(w) for w in stored]
            for label, m, count in cases(args, len(stored)):
                x = torch.randn(m, kk, generator=g)
                assert torch.equal(k.linear(x, stored[0]), k.linear(x, packed[0])), (kind, shape, m)
                per_call = size if m <= 16 else 2 * m * n * kk
                a, b = medians(k, x, stored[:count], packed[:count], per_call, args.rounds)
                cells = f"{a:.1f} | {b:.1f} | {b / a:.2f}"
                print(f"| {kind} | {shape} {n} × {kk} | {label} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
