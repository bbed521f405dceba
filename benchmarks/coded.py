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

import sys
from pathlib import Path

import torch

from blazr.kernels import coded

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.kquant_packed import SHAPES, cases, cold_weights, medians, setup  # the same harness


def main() -> None:
    args, k, g = setup(__doc__, ["bf16", "f32"], list(coded.KIND_OF), [1, 2, 4, 8, 256])
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
            for label, m, count in cases(args, len(stored)):
                x = torch.randn(m, kk, generator=g)
                want = k.linear(x, stored[0], prefill=m > 8)
                assert torch.equal(k.linear(x, made[0]), want), (kind, shape, m)  # type: ignore[arg-type]
                per_call = n * kk if m <= 16 else 2 * m * n * kk
                a, b = medians(k, x, stored[:count], made[:count], per_call, args.rounds)  # type: ignore[arg-type]
                print(
                    f"| {kind} | {shape} {n} × {kk} | {label} | {a:.2f} | {b:.2f} | {b / a:.2f} |", flush=True
                )


if __name__ == "__main__":
    main()
