"""bf16 / f32 weights as stored (linear_16bit.c, linear_float.c) against the same weights coded (kinds bf16z /
f32z, csrc/linear_coded.c — what the loader runs on AVX-512 builds), side by side.

    python benchmarks/coded.py [--kinds bf16 f32] [--rows 1 2 4 8 256] [--threads 2] [--rounds 5] [--hot]

At the 1B shapes (q 2048 × 2048, gate|up 16384 × 2048, down 2048 × 8192) and each row count: rows ≤ 16
cycle through weights past 3× the last-level cache (what a decode step reads) and print weights a second
(G/s: the same weights, so the ratio is the decode speed-up; the coded rows read 0.77× / 0.88× the bytes);
more rows call one weight (a prefill) and print GFLOP/s. `--hot` adds the one-row call on one cache-resident
weight (the decode's compute rate). The two forms alternate round by round (medians); their outputs are
asserted equal, bit for bit, before any timing (f32 past 8 rows: against f32's prefill GEMM, the coded
kernel's path there). Speed only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from blazr.kernels import coded, ops

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.kquant_packed import SHAPES, cold_weights, rate  # the same harness


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", nargs="+", default=["bf16", "f32"], choices=list(coded.KIND_OF))
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4, 8, 256])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hot", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    k = ops.kernels()
    assert k is not None, "the kernel library did not load"
    g = torch.Generator().manual_seed(0)
    knobs = f"streams_f {k.get_tune('streams_f')}, streams_z {k.get_tune('streams_z')}"
    print(f"{args.threads} threads, kernels {', '.join(k.features)}, {knobs}; decode rows: G weights/s, "
          "cold; prefill rows: GFLOP/s")  # fmt: skip
    print("| kind | shape | rows | stored | coded | × |")
    print("|---|---|---:|---:|---:|---:|")
    for kind in args.kinds:
        for shape, (n, kk) in SHAPES.items():
            stored = cold_weights(kind, n, kk, g)
            made = [coded.pack(w) for w in stored]
            assert all(w is not None for w in made), (kind, shape)
            cases = [("1 (hot)", 1, 1)] if args.hot else []
            cases += [(str(m), m, len(stored) if m <= 16 else 1) for m in args.rows]
            for label, m, count in cases:
                x = torch.randn(m, kk, generator=g)
                want = k.linear(x, stored[0], prefill=m > 8)
                assert torch.equal(k.linear(x, made[0]), want), (kind, shape, m)  # type: ignore[arg-type]
                per_call = n * kk if m <= 16 else 2 * m * n * kk
                rates: dict[str, list[float]] = {"stored": [], "coded": []}
                for _ in range(args.rounds):
                    rates["stored"].append(rate(k, x, stored[:count], per_call))
                    rates["coded"].append(rate(k, x, made[:count], per_call))  # type: ignore[arg-type]
                a, b = statistics.median(rates["stored"]), statistics.median(rates["coded"])
                print(
                    f"| {kind} | {shape} {n} × {kk} | {label} | {a:.2f} | {b:.2f} | {b / a:.2f} |", flush=True
                )


if __name__ == "__main__":
    main()
