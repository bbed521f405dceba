"""The norm, RoPE and attention kernels (RMSNorm, Mamba2's gated RMSNorm and its SiLU gate, NeoX RoPE,
paged decode attention with windows, sinks, softcap and 16-bit pools, softcap, KV-cache write) against
their torch references, on every ISA build (`lib`, tests/conftest.py); fp32 rounding bounds as in
tests/kernel_checks.py. Moved out of tests/test_kernels.py."""

from __future__ import annotations

import pytest
import torch

from blazr.kernels import ops
from tests.kernel_checks import U
from tests.threads import intra_op_threads

# ---------------------------------------------------------------- norm, rope, attention


@pytest.mark.parametrize("M", [1, 5, 100])
def test_rms_norm(lib: ops.Kernels, M: int) -> None:
    x, w = torch.randn(M, 576) * 3, torch.randn(576)
    torch.testing.assert_close(
        lib.rms_norm(x, w, 1e-5), ops.rms_norm_reference(x, w, 1e-5), rtol=1e-5, atol=1e-5
    )
    out = x.clone()
    lib.rms_norm(out, w, 1e-5, out=out)  # in place
    torch.testing.assert_close(out, ops.rms_norm_reference(x, w, 1e-5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("T", "H", "Dh", "R"), [(1, 9, 64, 64), (7, 3, 64, 64), (300, 4, 80, 32)])
def test_rope_neox(lib: ops.Kernels, T: int, H: int, Dh: int, R: int) -> None:
    P = 1000
    ang = torch.arange(P).float()[:, None] * (1e4 ** (-torch.arange(R // 2).float() / (R // 2)))
    cos, sin = ang.cos(), ang.sin()
    x = torch.randn(T, H, Dh)
    pos = torch.randint(0, P, (T,))
    got = lib.rope_neox(x.clone(), pos, cos, sin, R)
    torch.testing.assert_close(
        got, ops.rope_neox_reference(x.clone(), pos, cos, sin, R), rtol=1e-5, atol=1e-5
    )
    assert torch.equal(got[..., R:], x[..., R:])
    with pytest.raises(RuntimeError, match="out of range"):
        lib.rope_neox(x.clone(), torch.full((T,), P), cos, sin, R)


def _paged_layout(lens: list[int], S: int, g: torch.Generator) -> torch.Tensor:
    """kv_indices [B, max(lens)] with each sequence's positions in distinct random slots (padding 0)."""
    perm = torch.randperm(S, generator=g)
    idx = torch.zeros(len(lens), max(lens), dtype=torch.int64)
    used = 0
    for b, L in enumerate(lens):
        idx[b, :L] = perm[used : used + L]
        used += L
    return idx


# the SIMD paths' instantiations (G ≤ 8 × D = Dv ∈ {64, 128}), their generic sizes (G = 1, D = 32 / 96;
# G = 12 / 16), the AVX2 item's groups of ≤ 64 query heads (H = 72 / 96), and the portable loop on AVX-512
# (D, Dv not multiples of 16; AVX2 runs 40 / 24 in lanes of 8)
@pytest.mark.parametrize(
    ("H", "Hkv", "D", "Dv"),
    [
        (9, 3, 64, 64), (16, 2, 128, 128), (16, 4, 64, 64), (4, 4, 32, 32), (8, 4, 96, 96), (32, 2, 64, 64),
        (72, 24, 64, 64), (96, 8, 64, 64), (6, 2, 40, 24),
    ],
)  # fmt: skip
@pytest.mark.parametrize("window", [None, 50])
def test_paged_attention_decode(
    lib: ops.Kernels, H: int, Hkv: int, D: int, Dv: int, window: int | None
) -> None:
    g = torch.Generator().manual_seed(H * D)
    lens = [1, 37, 300, 129, 16, 0]  # chunk tails of 1..63 keys; an empty sequence gives zeros
    S = 1024
    k_pool, v_pool = torch.randn(S, Hkv, D, generator=g), torch.randn(S, Hkv, Dv, generator=g)
    q = torch.randn(len(lens), H, D, generator=g) * 2
    idx = _paged_layout(lens, S, g)
    seq = torch.tensor(lens)
    want = ops.paged_attention_decode_reference(q, k_pool, v_pool, idx, seq, D**-0.5, window=window)
    got = lib.paged_attention_decode(q, k_pool, v_pool, idx, seq, D**-0.5, window=window)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # a sequence's keys are split by its own length only: alone, or on one thread, the same bits
    for b in (1, 2):
        one = lib.paged_attention_decode(
            q[b : b + 1], k_pool, v_pool, idx[b : b + 1], seq[b : b + 1], D**-0.5, window=window
        )
        assert torch.equal(one[0], got[b])
    with intra_op_threads(1):
        single = lib.paged_attention_decode(q, k_pool, v_pool, idx, seq, D**-0.5, window=window)
    assert torch.equal(single, got)


@pytest.mark.parametrize(("H", "Hkv", "D"), [(8, 2, 64), (6, 2, 40)])
@pytest.mark.parametrize("window", [None, 50])
def test_paged_attention_decode_with_sinks(lib: ops.Kernels, H: int, Hkv: int, D: int, window: int | None):
    """GPT-OSS's attention sinks: one logit per head in the softmax's denominator (some above every score,
    some far below), the SIMD and the portable paths; an empty sequence still gives zeros."""
    g = torch.Generator().manual_seed(H + D)
    lens, S = [1, 37, 300, 0], 512
    k_pool, v_pool = torch.randn(S, Hkv, D, generator=g), torch.randn(S, Hkv, D, generator=g)
    q, idx, seq = torch.randn(len(lens), H, D, generator=g) * 2, _paged_layout(lens, S, g), torch.tensor(lens)
    sinks = torch.randn(H, generator=g) * 3
    sinks[0], sinks[1] = 20.0, -30.0
    want = ops.paged_attention_decode_reference(
        q, k_pool, v_pool, idx, seq, D**-0.5, window=window, sinks=sinks
    )
    got = lib.paged_attention_decode(q, k_pool, v_pool, idx, seq, D**-0.5, window=window, sinks=sinks)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    plain = lib.paged_attention_decode(q, k_pool, v_pool, idx, seq, D**-0.5, window=window)
    assert (got - plain).abs().max() > 0.1 and torch.equal(got[3], torch.zeros(H, D))


@pytest.mark.parametrize(("H", "Hkv", "D", "Dv"), [(8, 2, 64, 64), (16, 2, 128, 128), (6, 2, 40, 24)])
@pytest.mark.parametrize("window", [None, 50])
def test_paged_attention_decode_with_softcap(
    lib: ops.Kernels, H: int, Hkv: int, D: int, Dv: int, window: int | None
):
    """Gemma 2's soft-capped scores (c · tanh(s / c) before the softmax), on the SIMD and the portable paths,
    scores well past the cap included; with sinks too; a row's bits alone or on one thread as in the batch."""
    g = torch.Generator().manual_seed(H + D + 1)
    lens, S = [1, 37, 300, 129, 0], 1024
    k_pool, v_pool = torch.randn(S, Hkv, D, generator=g), torch.randn(S, Hkv, Dv, generator=g)
    q, idx, seq = torch.randn(len(lens), H, D, generator=g) * 6, _paged_layout(lens, S, g), torch.tensor(lens)
    scale, cap = D**-0.5, 4.0  # scores ~ N(0, 36): most beyond the cap, some near 0 (tanh's two regimes)

    def attend(k: ops.Kernels | None, **kw) -> torch.Tensor:
        args = (q, k_pool, v_pool, idx, seq, scale)
        if k is None:
            return ops.paged_attention_decode_reference(*args, window=window, **kw)
        return k.paged_attention_decode(*args, window=window, **kw)

    got = attend(lib, softcap=cap)
    torch.testing.assert_close(got, attend(None, softcap=cap), rtol=1e-5, atol=1e-5)
    assert (got - attend(lib)).abs().max() > 0.1 and torch.equal(got[4], torch.zeros(H, Dv))
    sinks = torch.randn(H, generator=g) * 3
    both = attend(lib, softcap=cap, sinks=sinks)
    torch.testing.assert_close(both, attend(None, softcap=cap, sinks=sinks), rtol=1e-5, atol=1e-5)
    for b in (1, 2):
        one = lib.paged_attention_decode(
            q[b : b + 1], k_pool, v_pool, idx[b : b + 1], seq[b : b + 1], scale, window=window, softcap=cap
        )
        assert torch.equal(one[0], got[b])
    with intra_op_threads(1):
        assert torch.equal(attend(lib, softcap=cap), got)
    with pytest.raises(ValueError, match="softcap"):
        attend(lib, softcap=-1.0)


def test_softcap(lib: ops.Kernels, generic: ops.Kernels) -> None:
    """cap · tanh(x / cap) in place, within 5e-7 relative of tanh in float64 (both regimes of blz_softcap1:
    the polynomial below |x / cap| = 1/4, the exponential above; tiny, huge and signed zeros), and the same
    bits as the portable build's one-value-at-a-time loop — vector lanes and tails, any thread split."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(10_007, generator=g) * torch.logspace(-6, 3, 10_007)
    x[:6] = torch.tensor([0.0, -0.0, 1e30, -1e30, 7.5, -7.5])  # 7.5 / 30 = 1/4: the switch
    for cap in (30.0, 50.0):
        got = x.clone()
        assert lib.softcap(got, cap) is got
        want = torch.tanh(x.double() / cap) * cap
        assert ((got.double() - want).abs() <= 5e-7 * want.abs()).all()
        assert torch.equal(got.signbit(), x.signbit())  # −0 stays −0
        torch.testing.assert_close(got, ops.softcap_reference(x.clone(), cap), rtol=5e-7, atol=0.0)
        assert torch.equal(got, generic.softcap(x.clone(), cap))
        with intra_op_threads(1):
            assert torch.equal(lib.softcap(x[3:].clone(), cap), got[3:])  # other lane alignment, one thread
    with pytest.raises(ValueError, match="cap"):
        lib.softcap(x.clone(), 0.0)


def test_rope_and_attention_on_fused_qkv_views(lib: ops.Kernels) -> None:
    """The decode step's layout: q, k, v are column blocks of one qkv output [T, (H + 2·Hkv)·D]; rope
    rotates the q and k heads in place through one strided view, attention reads q through another."""
    T, H, Hkv, D, P = 3, 9, 3, 64, 700
    g = torch.Generator().manual_seed(7)
    qkv = torch.randn(T, (H + 2 * Hkv) * D, generator=g)
    ang = torch.arange(P).float()[:, None] * (1e4 ** (-torch.arange(D // 2).float() / (D // 2)))
    cos, sin, pos = ang.cos(), ang.sin(), torch.tensor([5, 600, 77])
    want = qkv.clone()
    ops.rope_neox_reference(want[:, : (H + Hkv) * D].view(T, H + Hkv, D), pos, cos, sin, D)
    lib.rope_neox(qkv[:, : (H + Hkv) * D].view(T, H + Hkv, D), pos, cos, sin, D)
    torch.testing.assert_close(qkv, want, rtol=1e-5, atol=1e-5)  # v columns untouched, q/k rotated
    lens = [40, 130, 7]
    k_pool, v_pool = torch.randn(256, Hkv, D, generator=g), torch.randn(256, Hkv, D, generator=g)
    idx, seq = _paged_layout(lens, 256, g), torch.tensor(lens)
    q = qkv[:, : H * D].view(T, H, D)
    assert not q.is_contiguous()
    got = lib.paged_attention_decode(q, k_pool, v_pool, idx, seq, 0.125)
    want_o = ops.paged_attention_decode_reference(q.contiguous(), k_pool, v_pool, idx, seq, 0.125)
    torch.testing.assert_close(got, want_o, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_paged_attention_16bit_pools(lib: ops.Kernels, dtype: torch.dtype) -> None:
    """16-bit KV pools are widened exactly, so the fp32 reference on the same 16-bit values must match."""
    g = torch.Generator().manual_seed(3)
    lens, S = [200, 33], 512
    k_pool = torch.randn(S, 2, 64, generator=g).to(dtype)
    v_pool = torch.randn(S, 2, 64, generator=g).to(dtype)
    q, idx, seq = torch.randn(2, 6, 64, generator=g), _paged_layout(lens, S, g), torch.tensor(lens)
    want = ops.paged_attention_decode_reference(q, k_pool, v_pool, idx, seq, 0.125, window=100)
    got = lib.paged_attention_decode(q, k_pool, v_pool, idx, seq, 0.125, window=100)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ops.UnsupportedInput):
        lib.paged_attention_decode(q, k_pool, v_pool.float(), idx, seq, 0.125)


def test_paged_attention_bad_slot_raises(native: ops.Kernels) -> None:
    k_pool = v_pool = torch.randn(8, 1, 16)
    idx = torch.tensor([[0, 1, 99]])
    with pytest.raises(RuntimeError, match="out of range"):
        native.paged_attention_decode(torch.randn(1, 1, 16), k_pool, v_pool, idx, torch.tensor([3]), 0.25)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_kv_write(lib: ops.Kernels, dtype: torch.dtype) -> None:
    """Keys/values taken straight from a fused qkv output land in their slots (16-bit: rounded like torch,
    including fp16 subnormals and overflow to inf; NaN stays NaN). Rows of 2·36 values: 16-wide vector
    steps and a scalar tail."""
    T, H, Hkv, D = 4, 6, 2, 36
    qkv = torch.randn(T, (H + 2 * Hkv) * D) * torch.logspace(-9, 5, (H + 2 * Hkv) * D)
    # specials in the vector steps and in the scalar tail (column 64+ of a 72-value row): ±inf, quiet and
    # signalling NaN, and exact ties of bf16 / fp16 rounding (1 + 2⁻⁸, 1 + 3·2⁻⁸, 1 + 2⁻¹¹, 1 + 3·2⁻¹¹)
    bits = [0x7F800000, 0x7FC00000, 0xFF800000, 0x7F800001, 0x3F808000, 0x3F818000, 0x3F801000, 0x3F803000]
    special = torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)
    kv0, v0 = H * D, (H + Hkv) * D
    for col in (kv0 + 40, v0 + 20, v0 + 64):
        qkv[:, col : col + 8] = special
    k, v = qkv[:, H * D : (H + Hkv) * D].view(T, Hkv, D), qkv[:, (H + Hkv) * D :].view(T, Hkv, D)
    slots = torch.tensor([9, 2, 31, 17])
    pools = [torch.zeros(40, Hkv, D, dtype=dtype) for _ in range(4)]
    lib.kv_write(k, v, slots, pools[0], pools[1])
    ops.kv_write_reference(k, v, slots, pools[2], pools[3])
    for got, want in ((pools[0], pools[2]), (pools[1], pools[3])):
        assert torch.equal(got.isnan(), want.isnan()) and want.isnan().any()
        assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))  # every other value bit for bit
    with pytest.raises(RuntimeError, match="out of range"):
        lib.kv_write(k, v, torch.tensor([0, 1, 2, 40]), pools[0], pools[1])


@pytest.mark.parametrize(("D", "group"), [(96, 96), (128, 32), (20, 5)])
@pytest.mark.parametrize("before_gate", [False, True])
def test_gated_rms_norm(lib: ops.Kernels, D: int, group: int, before_gate: bool) -> None:
    """Mamba2's gated norm against its reference, z a strided view into an in_proj-like output."""
    g = torch.Generator().manual_seed(D + group)
    y = torch.randn(5, D, generator=g) * torch.logspace(-2, 2, 5).unsqueeze(1)
    zbuf = torch.randn(5, 2 * D + 3, generator=g) * 4
    z, w = zbuf[:, D : 2 * D], torch.randn(D, generator=g)
    got = lib.gated_rms_norm(y, z, w, group, 1e-5, before_gate)
    want = ops.gated_rms_norm_reference(y, z, w, group, 1e-5, before_gate)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    rows = torch.cat(
        [lib.gated_rms_norm(y[i : i + 1], z[i : i + 1], w, group, 1e-5, before_gate) for i in range(5)]
    )
    assert torch.equal(rows, got)  # a row does not depend on the others
    with pytest.raises(ops.UnsupportedInput):  # 3-D or half precision: the dispatcher takes the reference
        lib.gated_rms_norm(y[None], z[None], w, group, 1e-5, before_gate)
    half = ops.gated_rms_norm(y.bfloat16(), z.bfloat16(), w.bfloat16(), group, 1e-5, before_gate)
    assert half.dtype == torch.bfloat16


def test_gate_silu_same_bits_in_vector_steps_and_tails(lib: ops.Kernels) -> None:
    """The gate's silu (a polynomial exp, 8 lanes at a time, the remainder one by one with the very same
    operations) gives a value the same bits wherever it lies in a row — in a vector step or in the tail of
    a 256-value chunk — and stays within a few ulp of torch's silu, extremes and NaN included."""
    D = 256 + 13  # the second chunk: one vector step (256..263), then a tail of 5 (264..268)
    vals = [0.0, -0.0, 1e-30, -3.5, 7.25, 20.0, -20.0, 87.0, -87.0, 90.0, -90.0, 1e4, -1e4, 0.3]
    z = torch.randn(2 * len(vals), D) * 6
    for i, v in enumerate(vals):
        z[2 * i, 3], z[2 * i + 1, 266] = v, v
    y = torch.ones_like(z)
    got = lib.gated_rms_norm(y, z, None, D, 1e-5, False)
    for i in range(len(vals)):
        assert got[2 * i, 3].view(torch.int32) == got[2 * i + 1, 266].view(torch.int32), vals[i]
    want = torch.nn.functional.silu(z.double())
    # below −88.3 the exp's input is clamped: silu(x) = x / (1 + e^88.3), |x|·5e-39 instead of ~0
    assert bool(((got.double() - want).abs() <= 4 * U * want.abs() + 1e-38 * z.double().abs()).all())
    z[0, 5] = float("nan")
    assert lib.gated_rms_norm(y, z, None, D, 1e-5, False)[0, 5].isnan()
