"""The prefill attention kernel (csrc/attention_prefill.c: one sequence's chunk, causal over the paged pools)
against its torch reference on every ISA build — GQA group sizes that do and do not divide the vector
width, head dims off the vector width, fp32 / bf16 / f16 pools, cached context, sliding windows, sinks and
soft-capping —; a row's result the same bits whole or chunked, and on every build; slots outside the pools
refused; and a model's prefill through it equal to its torch path."""

from __future__ import annotations

import itertools

import pytest
import torch

from blazr.kernels import ops

SHAPES = [(8, 2, 64, 64), (6, 2, 40, 24), (32, 8, 64, 64), (4, 4, 128, 128), (16, 1, 32, 48), (48, 2, 16, 16)]


def _pools(S: int, Hkv: int, D: int, Dv: int, dtype: torch.dtype, g: torch.Generator):
    k = (torch.randn(S, Hkv, D, generator=g) * 2).to(dtype)
    v = torch.randn(S, Hkv, Dv, generator=g).to(dtype)
    return k, v


@pytest.mark.parametrize(("H", "Hkv", "D", "Dv"), SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_the_reference(
    lib: ops.Kernels, H: int, Hkv: int, D: int, Dv: int, dtype: torch.dtype
) -> None:
    g = torch.Generator().manual_seed(H * 100 + D)
    for n, ctx, window, sinks, softcap in [
        (37, 0, None, False, None),
        (19, 45, None, False, None),
        (50, 30, 17, False, None),
        (33, 5, None, True, 4.0),
        (1, 70, 40, True, None),
    ]:
        S = ctx + n + 11
        kp, vp = _pools(S, Hkv, D, Dv, dtype, g)
        slots = torch.randperm(S, generator=g)[: ctx + n]
        q = torch.randn(n, H, D, generator=g)
        sk = torch.randn(H, generator=g) if sinks else None
        kw = {"window": window, "sinks": sk, "softcap": softcap}
        want = ops.attention_prefill_reference(q, kp, vp, slots, ctx, D**-0.5, **kw)
        got = lib.attention_prefill(q, kp, vp, slots, ctx, D**-0.5, **kw)
        err = float((got - want).abs().max())
        assert err <= 2e-5 * (1 + float(want.abs().max())), (n, ctx, window, err)


@pytest.mark.parametrize(("H", "Hkv"), [(8, 2), (6, 2), (3, 1)])
@pytest.mark.parametrize("window", [None, 21, 45])
def test_rows_are_the_same_whole_or_chunked(lib: ops.Kernels, H: int, Hkv: int, window: int | None) -> None:
    """A prompt's rows take the same bits in one chunk, in chunks of any size (their earlier keys cached),
    and one at a time — so chunked prefill and prefix-cache hits give the whole prefill's attention."""
    g = torch.Generator().manual_seed(5)
    N, D = 90, 64
    kp, vp = _pools(N + 3, Hkv, D, D, torch.float16, g)
    slots = torch.randperm(N + 3, generator=g)[:N]
    q = torch.randn(N, H, D, generator=g)
    whole = lib.attention_prefill(q, kp, vp, slots, 0, 0.125, window=window)
    for cuts in ([0, 33, 90], [0, 1, 2, 17, 64, 90], [*range(0, 91, 7), 90]):
        parts = [
            lib.attention_prefill(q[a:b], kp, vp, slots, a, 0.125, window=window)
            for a, b in itertools.pairwise(cuts)
            if b > a
        ]
        assert torch.equal(torch.cat(parts), whole), cuts


def test_same_bits_on_every_build(native: ops.Kernels, other_build: ops.Kernels) -> None:
    """Each query row is one vector lane running the same operations in every build (AVX-512, AVX2,
    scalar): the same bits, windows, sinks and soft-capping included."""
    g = torch.Generator().manual_seed(9)
    kp, vp = _pools(120, 2, 64, 64, torch.bfloat16, g)
    slots = torch.randperm(120, generator=g)
    q = torch.randn(50, 8, 64, generator=g)
    for kw in ({}, {"window": 13}, {"sinks": torch.randn(8, generator=g), "softcap": 3.0}):
        want = native.attention_prefill(q, kp, vp, slots, 60, 0.125, **kw)
        assert torch.equal(other_build.attention_prefill(q, kp, vp, slots, 60, 0.125, **kw), want), kw


def test_threads_do_not_change_the_bits(native: ops.Kernels) -> None:
    g = torch.Generator().manual_seed(3)
    kp, vp = _pools(300, 4, 64, 64, torch.float32, g)
    slots, q = torch.arange(300), torch.randn(300, 16, 64, generator=g)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.attention_prefill(q, kp, vp, slots, 0, 0.125)
        torch.set_num_threads(2)
        assert torch.equal(native.attention_prefill(q, kp, vp, slots, 0, 0.125), one)
    finally:
        torch.set_num_threads(before)


def test_strided_query_and_output_views(native: ops.Kernels) -> None:
    """q read from a fused qkv output and written into a wider buffer's rows, as the attention layer does."""
    g = torch.Generator().manual_seed(4)
    kp, vp = _pools(40, 2, 32, 32, torch.float32, g)
    slots = torch.arange(40)
    qkv = torch.randn(40, 8 * 32 + 2 * 2 * 32, generator=g)
    q = qkv[:, : 8 * 32].view(40, 8, 32)
    out = torch.zeros(50, 8, 32)
    native.attention_prefill(q[10:], kp, vp, slots, 10, 0.2, out=out[10:40])
    torch.testing.assert_close(out[10:40], ops.attention_prefill_reference(q[10:], kp, vp, slots, 10, 0.2))
    assert not out[:10].any() and not out[40:].any()


def test_bad_inputs(native: ops.Kernels) -> None:
    kp, vp = _pools(10, 2, 16, 16, torch.float32, torch.Generator().manual_seed(0))
    q = torch.randn(4, 4, 16)
    with pytest.raises(RuntimeError, match="attention_prefill failed"):
        native.attention_prefill(q, kp, vp, torch.tensor([0, 1, 2, 10]), 0, 0.25)  # slot 10 of 10
    with pytest.raises(ValueError, match=r"kv_slots \[≥ 6\]"):
        native.attention_prefill(q, kp, vp, torch.arange(5), 2, 0.25)
    with pytest.raises(ValueError, match="H % Hkv == 0"):
        native.attention_prefill(torch.randn(4, 3, 16), kp, vp, torch.arange(4), 0, 0.25)


def test_no_further_from_float64_than_torch(native: ops.Kernels) -> None:
    """Against attention in float64, the kernel's mean error is at most torch's flash SDPA's on the same fp32
    inputs, at Gemma 3's head dim 256 and Llama's 64. (Each dot summed in one FMA chain over all 256 dims,
    and the values over all keys in one chain, it was 1.7x SDPA's.)"""
    g = torch.Generator().manual_seed(0)
    for H, Hkv, D, T in ((4, 1, 256, 224), (32, 8, 64, 300)):
        q, k = torch.randn(T, H, D, generator=g) * 3, torch.randn(T, Hkv, D, generator=g) * 3
        v = torch.randn(T, Hkv, D, generator=g)
        kk, vv = k.double().repeat_interleave(H // Hkv, 1), v.double().repeat_interleave(H // Hkv, 1)
        s = torch.einsum("ihd,jhd->hij", q.double(), kk) * D**-0.5
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        exact = torch.einsum("hij,jhd->ihd", s.softmax(-1), vv)
        ours = native.attention_prefill(q, k, v, torch.arange(T), 0, D**-0.5)
        qt, kt, vt = (t.transpose(0, 1)[None] for t in (q, k, v))
        sdpa = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)
        err, err_sdpa = (
            (ours.double() - exact).abs().mean(),
            (sdpa[0].transpose(0, 1).double() - exact).abs().mean(),
        )
        assert err <= err_sdpa, (D, float(err), float(err_sdpa))
