"""Prefill attention: blazr's C kernel (csrc/attention_prefill.c, `ops.attention_prefill`) against what the
attention layer ran before it — the keys and values gathered from the pools and widened, then torch's CPU
flash SDPA (`F.scaled_dot_product_attention`, causal, GQA) — on one sequence's whole prompt, f16 pools (the
CPU default beside quantized and 16-bit weights), at published head shapes; alternating rounds (the machine
may be shared), medians. Also `--head`: a Q8_0 output head with x kept fp32 (`exact_x`, csrc/linear_q8xf.c)
against the int8 kernel (csrc/linear_q8.c) at 1-8 rows, cold weights.

    python benchmarks/attention_prefill.py [--threads 2] [--rounds 5] [--tokens 512 2048 8192] [--head]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.host import host_line

from blazr.kernels import ops
from blazr.kernels.quant import QuantizedWeight, quantize

# (name, query heads, kv heads, head dim)
SHAPES = [
    ("Llama-3.2-1B", 32, 8, 64),
    ("Qwen3-0.6B", 16, 8, 128),
    ("Gemma-3-270M", 4, 1, 256),
]
# (name, vocabulary, hidden): tied Q8_0 heads of published models
HEADS = [("Gemma-3-270M", 262144, 640), ("SmolLM2-135M", 49152, 576), ("Llama-3.2-1B", 128256, 2048)]


def _median_ms(fns: dict[str, Callable[[], object]], rounds: int, reps: int) -> dict[str, float]:
    """Each function's median ms per call over `rounds` alternating rounds of `reps` calls."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            times[name].append((time.perf_counter() - t) / reps * 1e3)
    return {name: statistics.median(v) for name, v in times.items()}


def _sdpa(q: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The attention layer's torch path: gathered, widened keys and values, then causal flash SDPA."""
    k, v = kp[slots].float().transpose(0, 1)[None], vp[slots].float().transpose(0, 1)[None]
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k, v, is_causal=True, enable_gqa=True)
    return o[0].transpose(0, 1)


def attention_table(tokens: list[int], rounds: int) -> None:
    print("| shape | tokens | torch SDPA ms | kernel ms | kernel GFLOP/s | × |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, H, Hkv, D in SHAPES:
        for T in tokens:
            g = torch.Generator().manual_seed(T)
            kp = torch.randn(T, Hkv, D, generator=g).half()
            vp = torch.randn(T, Hkv, D, generator=g).half()
            q = torch.randn(T, H, D, generator=g)
            slots = torch.randperm(T, generator=g)
            sdpa = partial(_sdpa, q, kp, vp, slots)
            kernel = partial(ops.attention_prefill, q, kp, vp, slots, 0, D**-0.5)
            err = float((kernel() - sdpa()).abs().max())
            assert err < 1e-4, (name, T, err)
            ms = _median_ms({"sdpa": sdpa, "kernel": kernel}, rounds, max(1, 2048 // T))
            flops = 2 * 2 * H * D * T * (T + 1) / 2
            print(
                f"| {name} ({H}/{Hkv}×{D}) | {T} | {ms['sdpa']:.1f} | {ms['kernel']:.1f} | "
                f"{flops / ms['kernel'] / 1e6:.0f} | **{ms['sdpa'] / ms['kernel']:.2f}** |",
                flush=True,
            )


class _Cycle:
    """ops.linear of x against the next of several copies of a weight (cold: together past the L3 cache)."""

    def __init__(self, x: torch.Tensor, weights: list[QuantizedWeight], exact: bool) -> None:
        self.x, self.weights, self.exact, self.i = x, weights, exact, 0

    def __call__(self) -> torch.Tensor:
        self.i = (self.i + 1) % len(self.weights)
        return ops.linear(self.x, self.weights[self.i], exact_x=self.exact)


def head_table(rounds: int) -> None:
    print("| head | rows | int8 x ms | fp32 x (exact_x) ms | × |")
    print("|---|---:|---:|---:|---:|")
    for name, V, D in HEADS:
        blocks = quantize(torch.randn(V, D) * 0.05, "q8_0").ggml_blocks()
        copies = max(1, (256 << 20) // blocks.numel() + 1)
        weights = [QuantizedWeight.from_blocks("q8_0g", blocks.clone(), V, D) for _ in range(copies)]
        for M in (1, 2, 4, 5, 8):
            x = torch.randn(M, D)
            fns = {"int8": _Cycle(x, weights, False), "exact": _Cycle(x, weights, True)}
            ms = _median_ms(fns, rounds, 4 * copies)
            ratio = ms["int8"] / ms["exact"]
            print(
                f"| {name} {V}×{D} | {M} | {ms['int8']:.2f} | {ms['exact']:.2f} | {ratio:.2f} |", flush=True
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--head", action="store_true", help="the Q8_0 head's exact_x against int8 x instead")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# {'Q8_0 output heads' if args.head else 'Prefill attention'} — {host_line()}\n")
    if args.head:
        head_table(args.rounds)
    else:
        attention_table(args.tokens, args.rounds)


if __name__ == "__main__":
    main()
