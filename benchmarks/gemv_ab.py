"""One-row (decode) or prefill linears at 1B shapes, two kernel libraries alternated in one process.

    python benchmarks/gemv_ab.py [--base LIB.so] [--kinds q5_0 q8_0g] [--threads 2] [--rounds 7]
                                 [--set streams_q8g=1 …] [--model llama-1b] [--shapes o down]

Per kind and shape (N × K: q 1024 × 1152, k / v 256 × 1152, q|k|v 1536 × 1152, gate|up 13824 × 1152,
o 1152 × 1024, down 1152 × 6912; `--model llama-1b`: Llama-3.2-1B's, where the K-quants fit) a one-row
linear cycles through enough copies of a random weight to leave the last-level cache 3 times over (what a
decode step sees), and the GB/s of weight bytes read is printed (`--rows M`: M x rows, a prefill chunk, and
GFLOP/s):
the library of this checkout (`new`) and, with --base, another build of the kernels (e.g. the main branch's
library file) — the two called in alternating rounds on the same weights, medians over the rounds (the host
is shared: read pairs, not absolute numbers). Knobs: each library keeps its host tuning (kernels/tuning.py),
--set overrides a knob on both (a knob a library lacks is left out there). Prints the load average beside
each table; with --threads 1 the time is the thread's CPU time (time.thread_time: the time other
work holds the core is not counted), else wall time. Speed only; the outputs of the two libraries are
compared bit for bit once per shape.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path

import torch

from blazr.kernels import build, ops, tuning

SHAPES = {  # name: (N, K)
    "q": (1024, 1152),
    "k|v": (256, 1152),
    "q|k|v": (1536, 1152),
    "gate|up": (13824, 1152),
    "o": (1152, 1024),
    "down": (1152, 6912),
}
# Llama-3.2-1B (realsize.py's 1b shape; K a multiple of 256, as the K-quants need): the tied head, q|k|v, o,
# gate|up, down, and v (a Q4_K_M file's Q6_K rows: the head, v and half the layers' down)
LLAMA_1B = {
    "head": (49152, 2048),
    "q|k|v": (3072, 2048),
    "v": (512, 2048),
    "o": (2048, 2048),
    "gate|up": (16384, 2048),
    "down": (2048, 8192),
}


def _load() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", type=Path, help="another kernel library file to compare with")
    ap.add_argument("--kinds", nargs="+", default=["q5_0", "q8_0g"])
    ap.add_argument("--model", choices=("gemma3-1b", "llama-1b"), default="gemma3-1b", help="whose shapes")
    ap.add_argument("--shapes", nargs="+", help="of the model's shapes, these only")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=1, help="x rows: above 1 (prefill) GFLOP/s are printed")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--set", nargs="*", default=[], help="knob=value on both libraries")
    args = ap.parse_args()
    table = LLAMA_1B if args.model == "llama-1b" else SHAPES
    torch.set_num_threads(args.threads)
    libs = {"new": ops.kernels()}
    if args.base:
        libs["base"] = ops.Kernels(build.open_library(args.base))
        for name in libs["new"].tune_defaults:  # the same host choice on both
            with contextlib.suppress(ValueError):
                libs["base"].set_tune(name, libs["new"].get_tune(name))
    for kv in args.set:
        name, v = kv.split("=")
        for k in libs.values():
            with contextlib.suppress(ValueError):
                k.set_tune(name, int(v))
    g = torch.Generator().manual_seed(0)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    l3 = tuning._l3_bytes()
    knobs = {n: libs["new"].get_tune(n) for n in libs["new"].tune_defaults}
    print(f"threads {args.threads}, rounds {args.rounds}, knobs (new) {knobs}")
    for kind in args.kinds:
        unit = "GB/s of weight bytes" if args.rows == 1 else "GFLOP/s"
        print(f"\n{kind}: {unit}, cold, M = {args.rows} (load average before: {_load()})")
        print("| shape | N × K | " + " | ".join(libs) + (" | new / base |" if args.base else ""))
        for shape in args.shapes or list(table):
            n, kk = table[shape]
            w0 = tuning._weight(kind, n, kk, g)
            size = w0.data.numel() * w0.data.element_size()
            ws = [w0] + [tuning._weight(kind, n, kk, g) for _ in range(-(-3 * l3 // size) - 1)]
            x = torch.randn(args.rows, kk, generator=g)
            work = size if args.rows == 1 else 2 * args.rows * n * kk  # bytes read, or flops
            outs = {name: k.linear(x, w0) for name, k in libs.items()}
            if args.base:
                assert torch.equal(outs["new"], outs["base"]), f"{kind} {shape}: the libraries disagree"
            rates: dict[str, list[float]] = {name: [] for name in libs}
            for _ in range(args.rounds):
                for name, k in libs.items():
                    t0 = clock()
                    reps = 0
                    while clock() - t0 < 0.05 * max(1, args.rows // 64):
                        for w in ws:
                            k.linear(x, w)
                        reps += 1
                    rates[name].append(reps * len(ws) * work / (clock() - t0) / 1e9)
            med = {name: statistics.median(r) for name, r in rates.items()}
            row = f"| {shape} | {n} × {kk} | " + " | ".join(f"{med[name]:.1f}" for name in libs)
            print(row + (f" | {med['new'] / med['base']:.2f} |" if args.base else " |"))
        print(f"(load average after: {_load()})")


if __name__ == "__main__":
    main()
