"""The MoE and MLA decode kernels (csrc/moe.c, csrc/mla.c) against their torch references, on the native
and the portable (`-march=x86-64`) builds.

- `moe_route`: the same experts as the reference (random logits: no ties) and weights to fp32 rounding, for
  softmax / sigmoid scoring, a selection bias, group-limited choice (group max, top-two sum), renormalised
  or scaled weights.
- `moe_experts`: equal, bit for bit, to composing the linear kernels per token and expert (the same calls on
  the same rows: every linear kernel computes a row the same whatever else is in the call) for every weight
  format; so with block-quantized weights a token's output alone equals its output in any batch, with float
  weights while its experts hold at most 8 tokens (from 9 they run the GEMM: the linear kernels' prefill call,
  checked here too). Against the dequantized reference only the formats' own activation rounding remains
  (checked at the linear kernels' tests; here loosely).
- `mla_cache_write` / `mla_decode`: the references to fp32 rounding, fp32 and 16-bit pools, q parts as
  strided views of one buffer, odd head counts (the kernel's tiles take two), an empty sequence, sequences
  split into many chunks (split-K) and into longer ones past 16; a sequence alone equals itself in any batch;
  out-of-range slots are errors.
- `linear_heads` (the absorbed form's per-head W_UKᵀ / W_UV): bit-equal, head by head, to the linear kernel
  on that head's weight alone, in every weight format; weights whose rows do not split per head are errors.
"""

from __future__ import annotations

import pytest
import torch

from blazr.kernels import coded, ops
from blazr.kernels.kquant import random_kquant
from blazr.kernels.quant import QuantizedWeight, quantize

KINDS = ["f32", "bf16", "q8_0", "q8_0g", "q4_0", "q4_1", "mxfp4"]


def _logits(T: int, E: int, seed: int) -> torch.Tensor:
    return torch.randn(T, E, generator=torch.Generator().manual_seed(seed))


# (bias, sigmoid, groups, topk_groups, group_top2, k, renorm, scale): Mixtral / Granite; DeepSeek-V2 (group
# max, not renormalised, scaled); DeepSeek-V3 / NemotronH (sigmoid + bias, top-two-sum groups, scaled)
ROUTES = {
    "softmax-renorm": (False, False, 1, 1, False, 2, True, 1.0),
    "v2-groups": (False, False, 4, 2, False, 3, False, 1.5),
    "v3-sigmoid-bias": (True, True, 4, 2, True, 4, True, 2.5),
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_moe_route(lib: ops.Kernels, route: str) -> None:
    has_bias, *args = ROUTES[route]
    logits = _logits(33, 16, 1)
    bias = 0.3 * _logits(1, 16, 2)[0] if has_bias else None
    w, ids = lib.moe_route(logits, bias, *args)
    w_ref, ids_ref = ops.moe_route_reference(logits, bias, *args)
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(w, w_ref, rtol=1e-6, atol=1e-7)
    if args[1] > 1:  # group-limited: every choice falls inside topk_groups groups
        groups = ids // (16 // args[1])
        assert all(len(set(row)) <= args[2] for row in groups.tolist())


def test_moe_route_rejects_bad_sizes(native: ops.Kernels) -> None:
    with pytest.raises(RuntimeError, match="invalid size"):  # k > the experts in the kept groups
        native.moe_route(_logits(2, 16, 1), None, False, 4, 1, False, 5, True, 1.0)


def _experts(kind: str, E: int, D: int, I: int, gated: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    n_up = 2 * I if gated else I
    w_up = quantize(0.2 * torch.randn(E * n_up, D, generator=g), kind)
    w_down = quantize(0.2 * torch.randn(E * D, I, generator=g), kind)
    return w_up, w_down


def _routed(T: int, E: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return ops.moe_route_reference(_logits(T, E, seed), None, False, 1, 1, False, k, True, 1.0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("act, gated", [("silu", True), ("gelu", True), ("relu2", False)])
def test_moe_experts_equal_the_linear_kernels(lib: ops.Kernels, kind: str, act: str, gated: bool) -> None:
    E, D, I, T, k = 8, 64, 32, 6, 3
    w_up, w_down = _experts(kind, E, D, I, gated, seed=3)
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(4))
    weights, ids = _routed(T, E, k, seed=5)
    got = lib.moe_experts(x, ids, weights, w_up, w_down, E, act, gated)
    # each expert's linears on the tokens routed to it, in token order (one call: the rows the kernel
    # gives it — 16-bit weights take another path from 5 rows on), the k outputs summed in slot order
    ys: dict[tuple[int, int], torch.Tensor] = {}
    for e in range(E):
        slots = [(t, j) for t in range(T) for j in range(k) if int(ids[t, j]) == e]
        if not slots:
            continue
        xe, up = x[[t for t, _ in slots]], ops.stacked_slice(w_up, e, E)
        if gated and act == "silu":
            h = lib.linear(xe, up, swiglu=True)
        else:
            h = lib.activation(lib.linear(xe, up), act, gated)
        for slot, y in zip(slots, lib.linear(h, ops.stacked_slice(w_down, e, E)), strict=True):
            ys[slot] = y
    want = torch.zeros(T, D)
    for t in range(T):
        for j in range(k):
            want[t] += weights[t, j] * ys[(t, j)]
    assert torch.equal(got, want)
    ref = ops.moe_experts_reference(x, ids, weights, w_up, w_down, E, act, gated)
    tol = 1e-5 if kind == "f32" else 0.05  # bf16 / 8-bit activation rounding (see kernel_checks.py)
    assert (got - ref).abs().max() <= tol * ref.abs().max()


@pytest.mark.parametrize("kind", ["f32", "q8_0", "q4_0", "mxfp4"])
@pytest.mark.parametrize("act", ["silu", "swiglu_oai"])
def test_moe_experts_with_biases_equal_the_reference(lib: ops.Kernels, kind: str, act: str) -> None:
    """GPT-OSS's experts: biases on both projections, the clamped SwiGLU (limit 0.5: most values clamp)."""
    E, D, I, T, k = 4, 256, 256, 5, 2
    w_up, w_down = _experts(kind, E, D, I, True, seed=12)
    g = torch.Generator().manual_seed(13)
    x = torch.randn(T, D, generator=g)
    up_bias, down_bias = torch.randn(E, 2 * I, generator=g), torch.randn(E, D, generator=g)
    weights, ids = _routed(T, E, k, seed=14)
    args = (x, ids, weights, w_up, w_down, E, act, True)
    opts = dict(up_bias=up_bias, down_bias=down_bias, swiglu_alpha=1.702, swiglu_limit=0.5)
    got = lib.moe_experts(*args, **opts)
    ref = ops.moe_experts_reference(*args, **opts)
    tol = 1e-5 if kind == "f32" else 0.05
    assert (got - ref).abs().max() <= tol * ref.abs().max()
    assert (got - lib.moe_experts(*args)).abs().max() > 0.1  # the biases count


@pytest.mark.parametrize("kind", ["f32", "bf16", "q8_0", "q8_0g", "mxfp4"])
def test_moe_experts_rows_do_not_depend_on_the_batch(native: ops.Kernels, kind: str) -> None:
    E, D, I, T, k = 8, 64, 32, 9, 2
    w_up, w_down = _experts(kind, E, D, I, True, seed=6)
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(7))
    weights, ids = _routed(T, E, k, seed=8)  # 18 assignments over 8 experts: experts shared by tokens
    assert int(torch.bincount(ids.flatten(), minlength=E).max()) <= 8  # float experts: still their rows
    together = native.moe_experts(x, ids, weights, w_up, w_down, E, "silu", True)
    for t in range(T):
        alone = native.moe_experts(
            x[t : t + 1], ids[t : t + 1], weights[t : t + 1], w_up, w_down, E, "silu", True
        )
        assert torch.equal(alone[0], together[t])


@pytest.mark.parametrize("kind", ["f32", "bf16", "f32z", "bf16z"])
def test_moe_float_experts_take_the_gemm_from_nine_tokens(lib: ops.Kernels, kind: str) -> None:
    """A float expert holding 9 or more tokens runs them as one prefill call of the linear kernels (the panel
    GEMM), bit for bit; the experts with fewer keep their rows. Both agree with the reference to fp32
    rounding. Coded experts (bf16z / f32z) too: on the portable build their kernel decodes the rows into a
    scratch buffer of its own, not the one holding moe.c's routed rows."""
    E, D, I, T, k = 4, 64, 64, 16, 2  # the coded layout: K a multiple of 64
    if kind in coded.BASE_OF:
        g = torch.Generator().manual_seed(21)
        w_up, w_down = (
            coded.pack(quantize(0.05 * torch.randn(E * n, kk, generator=g), coded.BASE_OF[kind]))
            for n, kk in ((2 * I, D), (D, I))
        )
        assert w_up is not None and w_down is not None and w_up.kind == kind
    else:
        w_up, w_down = _experts(kind, E, D, I, True, seed=21)
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(22))
    weights, ids = _routed(T, E, k, seed=23)
    counts = torch.bincount(ids.flatten(), minlength=E)
    assert int(counts.max()) >= 9 and int(counts.min()) <= 8, counts  # both paths taken
    got = lib.moe_experts(x, ids, weights, w_up, w_down, E, "silu", True)
    ys: dict[tuple[int, int], torch.Tensor] = {}
    for e in range(E):
        slots = [(t, j) for t in range(T) for j in range(k) if int(ids[t, j]) == e]
        h = lib.linear(x[[t for t, _ in slots]], ops.stacked_slice(w_up, e, E), swiglu=True, prefill=True)
        ys.update(zip(slots, lib.linear(h, ops.stacked_slice(w_down, e, E), prefill=True), strict=True))
    want = torch.zeros(T, D)
    for t in range(T):
        for j in range(k):
            want[t] += weights[t, j] * ys[(t, j)]
    assert torch.equal(got, want)
    ref = ops.moe_experts_reference(x, ids, weights, w_up, w_down, E, "silu", True)
    assert (got - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_moe_experts_are_the_same_on_every_build(native: ops.Kernels, other_build: ops.Kernels) -> None:
    """Block-quantized experts: exact integer dots in every build, so the same bits."""
    w_up, w_down = _experts("q4_0", 8, 64, 32, True, seed=9)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(10))
    weights, ids = _routed(5, 8, 2, seed=11)
    args = (x, ids, weights, w_up, w_down, 8, "silu", True)
    assert torch.equal(native.moe_experts(*args), other_build.moe_experts(*args))


def test_moe_experts_bad_input(native: ops.Kernels) -> None:
    w_up, w_down = _experts("f32", 4, 32, 16, True, seed=1)
    x, weights = torch.randn(2, 32), torch.ones(2, 2)
    with pytest.raises(RuntimeError, match="out of range"):
        native.moe_experts(x, torch.tensor([[0, 4], [1, 2]]), weights, w_up, w_down, 4, "silu", True)
    with pytest.raises(ValueError, match="inconsistent"):
        native.moe_experts(x, torch.tensor([[0, 1], [1, 2]]), weights, w_up, w_down, 3, "silu", True)


# ------------------------------------------------------------------------------------------------- MLA


def _mla_inputs(B: int, H: int, L: int, R: int, S: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L + R, generator=g)  # per head [q_lat | q_rope] in one buffer: strided views
    pool = torch.randn(S, L + R, generator=g)
    return q, pool


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("H", [1, 5, 16])
def test_mla_decode(lib: ops.Kernels, dtype: torch.dtype, H: int) -> None:
    B, R, L, S = 4, 8, 64, 300
    q, pool = _mla_inputs(B, H, L, R, S, seed=H)
    pool = pool.to(dtype)
    lens = torch.tensor([1, 200, 0, 37])  # one empty sequence: zeros
    g = torch.Generator().manual_seed(2)
    idx = torch.stack([torch.randperm(S, generator=g)[:200] for _ in range(B)])  # [B, 200] slots
    q_lat, q_rope = q[..., :L], q[..., L:]
    assert not q_lat.is_contiguous()
    got = lib.mla_decode(q_lat, q_rope, pool, idx, lens, 0.2)
    want = ops.mla_decode_reference(q_lat, q_rope, pool, idx, lens, 0.2)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    assert not got[2].any()


def test_mla_decode_long_sequences_split_into_longer_chunks(native: ops.Kernels) -> None:
    """Past 16 chunks of 64 rows a sequence's chunks grow (at most 16 per sequence): 1500 and 3000 rows,
    an f16 pool, beside a short sequence, against the reference; and each alone equals it in the batch."""
    B, H, R, L, S = 3, 4, 8, 64, 3100
    q, pool = _mla_inputs(B, H, L, R, S, seed=8)
    pool = pool.half()
    lens = torch.tensor([1500, 3000, 65])
    idx = torch.stack(
        [torch.randperm(S, generator=torch.Generator().manual_seed(b))[:3000] for b in range(B)]
    )
    got = native.mla_decode(q[..., :L], q[..., L:], pool, idx, lens, 0.15)
    want = ops.mla_decode_reference(q[..., :L], q[..., L:], pool, idx, lens, 0.15)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    for b in range(B):
        qb = q[b : b + 1]
        alone = native.mla_decode(qb[..., :L], qb[..., L:], pool, idx[b : b + 1], lens[b : b + 1], 0.15)
        assert torch.equal(alone[0], got[b])


def test_mla_decode_separate_q_parts(native: ops.Kernels) -> None:
    """q_lat and q_rope in two buffers (head strides L and R), as linear_heads and a q_rope projection
    make them."""
    B, H, R, L, S = 3, 4, 8, 32, 64
    _, pool = _mla_inputs(B, H, L, R, S, seed=3)
    q_lat, q_rope = torch.randn(B, H, L), torch.randn(B, H, R)
    lens, idx = torch.tensor([5, 64, 20]), torch.arange(64).repeat(3, 1)
    got = native.mla_decode(q_lat, q_rope, pool, idx, lens, 0.3)
    want = ops.mla_decode_reference(q_lat, q_rope, pool, idx, lens, 0.3)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


def test_mla_decode_rows_do_not_depend_on_the_batch(native: ops.Kernels) -> None:
    B, H, R, L, S = 3, 6, 8, 32, 128
    q, pool = _mla_inputs(B, H, L, R, S, seed=4)
    lens, idx = torch.tensor([100, 7, 128]), torch.arange(128).flip(0).repeat(3, 1)
    together = native.mla_decode(q[..., :L], q[..., L:], pool, idx, lens, 0.25)
    for b in range(B):
        qb = q[b : b + 1]
        alone = native.mla_decode(qb[..., :L], qb[..., L:], pool, idx[b : b + 1], lens[b : b + 1], 0.25)
        assert torch.equal(alone[0], together[b])


def test_mla_decode_bad_slot(native: ops.Kernels) -> None:
    q, pool = _mla_inputs(1, 2, 32, 8, 8, seed=5)
    with pytest.raises(RuntimeError, match="out of range"):
        native.mla_decode(q[..., :32], q[..., 32:], pool, torch.tensor([[0, 9]]), torch.tensor([2]), 0.1)
    with pytest.raises(ValueError, match="inconsistent"):  # the pool's rows are not L + R wide
        native.mla_decode(
            q[..., :32], q[..., 32:], pool[:, 1:], torch.tensor([[0, 1]]), torch.tensor([2]), 0.1
        )


@pytest.mark.parametrize("kind", [*KINDS, "f16", "q6_k"])
@pytest.mark.parametrize("H", [1, 3, 16])
def test_linear_heads_equal_the_linear_kernel_per_head(lib: ops.Kernels, kind: str, H: int) -> None:
    """Each head's rows are one linear call on that head's part of the stacked weight: bit-equal to the
    linear kernel on the head's weight alone — for a batch of rows or one, x a strided part of a wider row,
    the heads spread over the threads (H ≥ threads) or in turn — and close to the dequantized reference."""
    N, K, B = 32, 256, 5
    g = torch.Generator().manual_seed(H)
    if kind == "q6_k":
        parts = [random_kquant(kind, N, K, g) for _ in range(H)]
        w = QuantizedWeight(kind, torch.cat([p.data for p in parts]), H * N, K)
    else:
        dense = 0.1 * torch.randn(H * N, K, generator=g)
        w, parts = quantize(dense, kind), [quantize(dense[h * N : (h + 1) * N], kind) for h in range(H)]
    x = torch.randn(B, H, K + 8, generator=g)[..., 8:]  # strided heads
    got = lib.linear_heads(x, w)
    assert got.shape == (B, H, N)
    for h in range(H):
        assert torch.equal(got[:, h], lib.linear(x[:, h].contiguous(), parts[h])), (kind, h)
    tol = 1e-4 if kind in ("f32", "f16", "q6_k") else 3e-2  # bf16 / 32-blocks: x rounded in the kernel
    torch.testing.assert_close(got, ops.linear_heads_reference(x, w), rtol=tol, atol=tol)
    assert torch.equal(lib.linear_heads(x[2:3], w)[0], got[2])  # one row alone: the same bits


def test_linear_heads_bad_input(native: ops.Kernels) -> None:
    x = torch.randn(2, 4, 64)
    with pytest.raises(ValueError, match="does not split into 4 heads of whole 16-row groups"):
        native.linear_heads(x, quantize(torch.randn(4 * 8, 64), "q8_0"))  # 8 rows a head: half a group
    with pytest.raises(ValueError, match="does not split into 4 heads"):
        native.linear_heads(x, quantize(torch.randn(30, 64), "f32"))
    with pytest.raises(ValueError, match="in_features"):
        native.linear_heads(x, quantize(torch.randn(4 * 16, 32), "f32"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("has_norm", [True, False])
def test_mla_cache_write(lib: ops.Kernels, dtype: torch.dtype, has_norm: bool) -> None:
    L, R, T, S, P = 64, 16, 5, 40, 100
    g = torch.Generator().manual_seed(6)
    kv = torch.randn(T, L + R + 7, generator=g)[:, : L + R]  # rows strided: a view
    norm = torch.rand(L, generator=g) + 0.5 if has_norm else None
    cos, sin = torch.randn(P, R // 2, generator=g), torch.randn(P, R // 2, generator=g)
    pos, slots = torch.tensor([0, 99, 3, 50, 7]), torch.tensor([39, 0, 5, 6, 20])
    got, want = torch.zeros(S, L + R, dtype=dtype), torch.zeros(S, L + R, dtype=dtype)
    lib.mla_cache_write(kv, norm, 1e-6, pos, cos, sin, slots, got)
    ops.mla_cache_write_reference(kv, norm, 1e-6, pos, cos, sin, slots, want)
    tol = 1e-6 if dtype is torch.float32 else 1e-2  # one 16-bit rounding apart at most
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    with pytest.raises(RuntimeError, match="out of range"):
        lib.mla_cache_write(kv, norm, 1e-6, pos, cos, sin, torch.tensor([0, 1, 2, 3, S]), got)
