"""The short-convolution kernels (csrc/causal_conv.c, csrc/head_norm.c) against their torch references on
every ISA build this CPU runs (`lib`): the causal depthwise conv — LFM2's gated form and Mamba1's SiLU form
— as a decode step and as a prefill (fresh and continued sequences, one shorter than the window), a prefill
equal to decode steps in a row and to itself split in chunks, rows independent of their batch, the same
bits on every ISA; and the per-head RMSNorm on the strided q / k heads of a fused qkv row."""

from __future__ import annotations

import pytest
import torch

from blazr.kernels import ops

# (C, K): a 16-wide AVX-512 step with tails, LFM2's kernel 3, Mamba's 4, the smallest kernel 2
SHAPES = [(40, 3), (64, 4), (7, 2)]


def _inputs(C: int, K: int, rows: int, B: int, S: int, gated: bool, seed: int) -> dict:
    """A fused in_proj output [rows, 3C] whose column views are gin | gout | x (LFM2's [B | C | x])."""
    g = torch.Generator().manual_seed(seed)
    bcx = torch.randn(rows, 3 * C, generator=g)
    return {
        "x": bcx[:, 2 * C :],
        "gin": bcx[:, :C] if gated else None,
        "gout": bcx[:, C : 2 * C] if gated else None,
        "slots": torch.randperm(S, generator=g)[:B],
        "weight": torch.randn(C, K, generator=g) * 0.5,
        "bias": torch.randn(C, generator=g) if not gated else None,
        "state": torch.randn(S, K - 1, C, generator=g),
        "silu": not gated,
    }


def _run(fn, inp: dict) -> tuple[torch.Tensor, torch.Tensor]:
    a = dict(inp, state=inp["state"].clone())
    return fn(**a), a["state"]


@pytest.mark.parametrize(("C", "K"), SHAPES)
@pytest.mark.parametrize("gated", [True, False])
def test_causal_conv_step(lib: ops.Kernels, C: int, K: int, gated: bool) -> None:
    inp = _inputs(C, K, 3, 3, 6, gated, seed=C + K)
    y, st = _run(lib.causal_conv_step, inp)
    y_ref, st_ref = _run(ops.causal_conv_step_reference, inp)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(st, st_ref)  # a shift of stored values: exact
    others = [s for s in range(6) if s not in inp["slots"].tolist()]
    assert torch.equal(st[others], inp["state"][others])


@pytest.mark.parametrize("gated", [True, False])
def test_causal_conv_step_rows_sharing_a_slot_run_in_order(lib: ops.Kernels, gated: bool) -> None:
    """Rows of slots [4, 4, 1, 4, 4] (a sequence's consecutive tokens, another's between): the same as one
    step per row in row order, and as the reference (sizes that split the step over the threads)."""
    inp = dict(_inputs(2048, 4, 5, 5, 6, gated, seed=9), slots=torch.tensor([4, 4, 1, 4, 4]))
    y, st = _run(lib.causal_conv_step, inp)
    state, ys = inp["state"].clone(), []
    for i in range(5):
        row = {
            k: v[i : i + 1] if k in ("x", "gin", "gout", "slots") and v is not None else v
            for k, v in inp.items()
        }
        ys.append(lib.causal_conv_step(**dict(row, state=state)))
    assert torch.equal(y, torch.cat(ys)) and torch.equal(st, state)
    y_ref, st_ref = _run(ops.causal_conv_step_reference, inp)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(st, st_ref)


def _prefill(lens: list[int], fresh: list[bool], C: int, K: int, gated: bool, seed: int) -> dict:
    inp = _inputs(C, K, sum(lens), len(lens), len(lens) + 2, gated, seed)
    return dict(inp, query_lens=lens, fresh=fresh)


@pytest.mark.parametrize(("C", "K"), SHAPES)
@pytest.mark.parametrize("gated", [True, False])
def test_causal_conv_prefill(lib: ops.Kernels, C: int, K: int, gated: bool) -> None:
    lens, fresh = [20, 1, 7, 2], [True, False, False, True]
    inp = _prefill(lens, fresh, C, K, gated, seed=C * K)
    y, st = _run(lib.causal_conv_prefill, inp)
    y_ref, st_ref = _run(ops.causal_conv_prefill_reference, inp)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(st, st_ref)
    others = [s for s in range(6) if s not in inp["slots"].tolist()]
    assert torch.equal(st[others], inp["state"][others])


@pytest.mark.parametrize("gated", [True, False])
def test_causal_conv_prefill_is_decode_steps_in_a_row(lib: ops.Kernels, gated: bool) -> None:
    """n prefill rows are the bits of n decode steps and of the prefill in two chunks; a sequence's rows do
    not depend on the others in its call; the same bits on every ISA build as on this host's."""
    lens, fresh = [9, 2, 12], [False, True, False]
    inp = _prefill(lens, fresh, 40, 4, gated, seed=3)
    y, st = _run(lib.causal_conv_prefill, inp)
    steps = inp["state"].clone()
    steps[inp["slots"][1]] = 0
    start = 0
    for b, n in enumerate(lens):
        slot = inp["slots"][b : b + 1]
        for t in range(start, start + n):
            rows = {k: None if inp[k] is None else inp[k][t : t + 1] for k in ("x", "gin", "gout")}
            one = dict(
                rows, slots=slot, weight=inp["weight"], bias=inp["bias"], state=steps, silu=inp["silu"]
            )
            assert torch.equal(lib.causal_conv_step(**one)[0], y[t])
        sub = {k: None if inp[k] is None else inp[k][start : start + n] for k in ("x", "gin", "gout")}
        alone, st1 = _run(
            lib.causal_conv_prefill, dict(inp, **sub, query_lens=[n], slots=slot, fresh=fresh[b : b + 1])
        )
        assert torch.equal(alone, y[start : start + n]) and torch.equal(st1[slot], st[slot])
        start += n
    assert torch.equal(steps, st)
    head = {k: None if inp[k] is None else inp[k][:4] for k in ("x", "gin", "gout")}
    tail = {k: None if inp[k] is None else inp[k][4:9] for k in ("x", "gin", "gout")}
    one = dict(inp, slots=inp["slots"][:1], fresh=[False])
    y1, st1 = _run(lib.causal_conv_prefill, dict(one, **head, query_lens=[4]))
    y2, st2 = _run(lib.causal_conv_prefill, dict(one, **tail, query_lens=[5], state=st1))
    assert torch.equal(torch.cat([y1, y2]), y[:9]) and torch.equal(st2[inp["slots"][0]], st[inp["slots"][0]])


def test_causal_conv_bits_equal_on_every_isa(native: ops.Kernels, other_build: ops.Kernels) -> None:
    for gated in (True, False):
        inp = _prefill([13, 3], [True, False], 40, 4, gated, seed=9)
        y, st = _run(native.causal_conv_prefill, inp)
        y2, st2 = _run(other_build.causal_conv_prefill, inp)
        assert torch.equal(y, y2) and torch.equal(st, st2)


def test_causal_conv_checks_inputs(native: ops.Kernels) -> None:
    inp = _inputs(16, 3, 2, 2, 3, True, seed=0)
    with pytest.raises(RuntimeError, match="out of range"):
        native.causal_conv_step(**dict(inp, slots=torch.tensor([0, 3])))
    prefill = dict(inp, query_lens=[1, 1], fresh=[False, False], slots=torch.tensor([1, 1]))
    with pytest.raises(RuntimeError):  # two sequences of a prefill in one slot: refused (a decode step's rows
        native.causal_conv_prefill(**prefill)  # that share a slot run in order instead)
    with pytest.raises(ValueError, match="inconsistent"):
        native.causal_conv_step(**dict(inp, weight=torch.zeros(16, 4)))
    with pytest.raises(ops.UnsupportedInput):  # gin and x of different row strides
        native.causal_conv_step(**dict(inp, gin=inp["gin"].clone()))


def test_head_rms_norm_on_a_fused_qkv_row(lib: ops.Kernels) -> None:
    """LFM2's attention norms its q and k heads in place inside the fused qkv output (strided rows), each with
    its own weight; the v heads after them untouched."""
    g = torch.Generator().manual_seed(1)
    T, H, Hkv, Dh = 5, 4, 2, 24
    qkv = torch.randn(T, (H + 2 * Hkv) * Dh, generator=g)
    w1, w2 = torch.randn(Dh, generator=g), torch.randn(Dh, generator=g)
    got, want = qkv.clone(), qkv.clone()
    for out, norm in ((got, lib.head_rms_norm), (want, ops.head_rms_norm_reference)):
        norm(out[:, : H * Dh].view(T, H, Dh), w1, 1e-5)
        norm(out[:, H * Dh : (H + Hkv) * Dh].view(T, Hkv, Dh), w2, 1e-5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(got[:, (H + Hkv) * Dh :], qkv[:, (H + Hkv) * Dh :])
