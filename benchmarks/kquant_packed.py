"""The lever measured for K-quant decode: Q4_K / Q6_K re-laid in 16-row groups (benchmarks/probes/
kquant_packed.c, a prototype outside the library) against the library's one-row K-quant linear as stored.

    python benchmarks/kquant_packed.py [--kinds q4_k q6_k] [--rounds 7] [--prefetch 4608]

Compiles the prototype with the library's flags (-O3 -march=native -fopenmp; it needs AVX-512 VNNI), then per
kind, thread count (1, 2) and regime — `hot`: one 2048 × 2048 weight called again and again (L2/L3-resident:
the kernel's compute rate), `cold`: 8192 × 2048 weights cycled past 3× the last-level cache (what a decode
step sees) — prints GB/s of weight bytes for both, alternated round by round, medians. One activation row,
quantized by the library (blz_quantize_q8k); the prototype's outputs are asserted equal to blz_linear_k's,
bit for bit, before any timing. With one thread the time is the thread's CPU time. Speed only.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from blazr.kernels import ops, tuning

SRC = Path(__file__).resolve().parent / "probes" / "kquant_packed.c"
ROW_BYTES = {"q4_k": 144, "q6_k": 210}  # per 256-value super-block


def _compile(prefetch: int) -> ctypes.CDLL:
    out = Path(tempfile.mkdtemp()) / "kquant_packed.so"
    subprocess.run(["cc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", f"-DPFD={prefetch}", "-o",
                    str(out), str(SRC)], check=True)  # fmt: skip
    lib = ctypes.CDLL(str(out))
    p, i = ctypes.c_void_p, ctypes.c_int64
    for f in ("kp_pack", "kp6_pack"):
        getattr(lib, f).argtypes = [p, i, i, p]
    for f in ("kp_gemv", "kp6_gemv"):
        getattr(lib, f).argtypes = [p, i, i, p, p, p, p, ctypes.c_int]
    return lib


def _q8k(k: ops.Kernels, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, kk = x.shape
    q, d = torch.empty(m, kk, dtype=torch.int8), torch.empty(m, kk // 256)
    bs = torch.empty(m, kk // 16, dtype=torch.int16)
    fn = k.lib.blz_quantize_q8k
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 3
    assert fn(x.data_ptr(), m, kk, q.data_ptr(), d.data_ptr(), bs.data_ptr()) == 0
    return q, d, bs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", nargs="+", default=["q4_k", "q6_k"], choices=list(ROW_BYTES))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--prefetch", type=int, default=4608)
    args = ap.parse_args()
    k = ops.kernels()
    assert k is not None, "the kernel library did not load"
    proto = _compile(args.prefetch)
    g = torch.Generator().manual_seed(0)
    l3 = tuning._l3_bytes()
    print("| kind | threads | regime | N × K | library GB/s | packed GB/s | × |")
    print("|---|---:|---|---|---:|---:|---:|")
    for kind in args.kinds:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for regime, (n, kk) in (("hot", (2048, 2048)), ("cold", (8192, 2048))):
                count = 1 if regime == "hot" else -(-3 * l3 // (n * kk // 256 * ROW_BYTES[kind]))
                lib_r, pk_r = _case(k, proto, kind, n, kk, count, threads, args.rounds, g)
                cells = f"{lib_r:.1f} | {pk_r:.1f} | {pk_r / lib_r:.2f}"
                print(f"| {kind} | {threads} | {regime} | {n} × {kk} | {cells} |", flush=True)


def _case(
    k: ops.Kernels,
    proto: ctypes.CDLL,
    kind: str,
    n: int,
    kk: int,
    count: int,
    threads: int,
    rounds: int,
    g: torch.Generator,
) -> tuple[float, float]:
    """Median GB/s of the library and of the prototype over `count` weights of one shape, after asserting
    their outputs equal."""
    pack, gemv = (proto.kp_pack, proto.kp_gemv) if kind == "q4_k" else (proto.kp6_pack, proto.kp6_gemv)
    nbytes = n * kk // 256 * ROW_BYTES[kind]
    ws = [tuning._weight(kind, n, kk, g) for _ in range(count)]
    bufs, addrs = [], []
    for w in ws:
        buf = torch.empty(nbytes + 64, dtype=torch.uint8)
        addr = buf.data_ptr() + (-buf.data_ptr()) % 64  # 64-byte aligned loads of the Q4_K chunks
        pack(w.data.data_ptr(), n, kk // 256, addr)
        bufs.append(buf)
        addrs.append(addr)
    x = torch.randn(1, kk, generator=g)
    q, d, bs = _q8k(k, x)
    out = torch.empty(1, n)
    calls = {
        "library": [functools.partial(k.linear, x, w) for w in ws],
        "packed": [functools.partial(gemv, a, n, kk // 256, q.data_ptr(), d.data_ptr(), bs.data_ptr(),
                                     out.data_ptr(), threads) for a in addrs],
    }  # fmt: skip
    calls["packed"][0]()
    assert torch.equal(out, k.linear(x, ws[0])), f"{kind}: the prototype's dots differ from blz_linear_k's"
    clock = time.thread_time if threads == 1 else time.perf_counter
    rates: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fns in calls.items():
            t0, reps = clock(), 0
            while clock() - t0 < 0.05:
                for fn in fns:
                    fn()
                reps += 1
            rates[name].append(reps * count * nbytes / (clock() - t0) / 1e9)
    return statistics.median(rates["library"]), statistics.median(rates["packed"])


if __name__ == "__main__":
    main()
