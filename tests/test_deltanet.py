"""Gated DeltaNet's math and kernels against their references: the chunked (WY) delta rule against the plain
recurrence and transformers' own two forms; the C decode step and chunked prefill (every ISA build) against
their torch references (kernels/reference_deltanet.py) — grouped and tiled value heads, β scale, fresh and
continued slots, snapshots inside a prefill; a prefill equals its tokens as decode steps, rows never depend
on the batch; and gated attention's per-head RMSNorm and sigmoid gate kernels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from blazr.kernels import ops
from blazr.kernels.reference_deltanet import (
    copy_rows_reference,
    deltanet_prefill_reference,
    deltanet_step_reference,
    head_rms_norm_reference,
    mul_reference,
    sigmoid_mul_reference,
)
from blazr.model.delta_rule import delta_rule_chunked, delta_rule_sequential


def _rule_inputs(L: int, H: int, Dk: int, Dv: int, seed: int, decay: float = 2.0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(L, H, Dk, generator=g), dim=-1) * Dk**-0.5
    k = F.normalize(torch.randn(L, H, Dk, generator=g), dim=-1)
    v = torch.randn(L, H, Dv, generator=g)
    log_decay = -F.softplus(torch.randn(L, H, generator=g)) * decay
    beta = torch.rand(L, H, generator=g)
    return q, k, v, log_decay, beta, 0.3 * torch.randn(H, Dk, Dv, generator=g)


@pytest.mark.parametrize("L, C", [(1, 64), (63, 64), (64, 64), (150, 64), (150, 7), (40, 1)])
@pytest.mark.parametrize("has_init", [False, True])
def test_chunked_delta_rule_matches_the_recurrence(L: int, C: int, has_init: bool) -> None:
    q, k, v, g, beta, S0 = _rule_inputs(L, 3, 16, 24, seed=L + C)
    want, S_want = delta_rule_sequential(q, k, v, g, beta, S0 if has_init else None)
    got, S_got = delta_rule_chunked(q, k, v, g, beta, C, S0 if has_init else None)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(S_got, S_want, rtol=1e-5, atol=2e-5)


def test_chunked_delta_rule_with_strong_decay_and_split_like_a_recurrence() -> None:
    """Decays down to e^-600 per token (whole chunks' products underflow): still the recurrence; and two
    halves, the second from the first's state, equal the whole."""
    q, k, v, g, beta, _ = _rule_inputs(130, 2, 16, 16, seed=3, decay=300.0)
    want, S_want = delta_rule_sequential(q, k, v, g, beta)
    got, _ = delta_rule_chunked(q, k, v, g, beta, 64)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)
    o1, S1 = delta_rule_chunked(q[:50], k[:50], v[:50], g[:50], beta[:50], 64)
    o2, S2 = delta_rule_chunked(q[50:], k[50:], v[50:], g[50:], beta[50:], 64, S1)
    torch.testing.assert_close(torch.cat([o1, o2]), want, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(S2, S_want, rtol=1e-5, atol=2e-5)


def test_both_forms_match_transformers() -> None:
    """transformers' torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule (which L2-normalise q
    and k themselves, 4 key heads read by 8 value heads)."""
    from transformers.models.qwen3_next import modeling_qwen3_next as hf

    gen = torch.Generator().manual_seed(5)
    L, Hk, Hv, Dk, Dv = 90, 4, 8, 16, 8
    q, k = torch.randn(1, L, Hk, Dk, generator=gen), torch.randn(1, L, Hk, Dk, generator=gen)
    v = torch.randn(1, L, Hv, Dv, generator=gen)
    g, beta = -F.softplus(torch.randn(1, L, Hv, generator=gen)), torch.rand(1, L, Hv, generator=gen)
    S0 = torch.randn(1, Hv, Dk, Dv, generator=gen) * 0.2
    qn = (F.normalize(q, dim=-1, eps=0) * Dk**-0.5).repeat_interleave(2, dim=2)[0]
    kn = F.normalize(k, dim=-1, eps=0).repeat_interleave(2, dim=2)[0]
    for hf_rule in (hf.torch_chunk_gated_delta_rule, hf.torch_recurrent_gated_delta_rule):
        o_hf, S_hf = hf_rule(
            q, k, v, g, beta, initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True
        )
        for ours in (delta_rule_sequential, delta_rule_chunked):
            o, S = ours(qn, kn, v[0], g[0], beta[0], initial_state=S0[0])
            torch.testing.assert_close(o, o_hf[0], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(S, S_hf[0], rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------------ kernels

SIZES = dict(Hk=2, Hv=4, Dk=16, Dv=24, K=4)  # Dv not a multiple of 16: the vector paths' tails run too


def _layer(Hk: int, Hv: int, Dk: int, Dv: int, K: int, S: int = 8, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    C = 2 * Hk * Dk + Hv * Dv
    return dict(
        conv_weight=0.5 * torch.randn(C, K, generator=g),
        conv_state=torch.randn(S, C, K - 1, generator=g),
        dt_bias=torch.randn(Hv, generator=g),
        A_log=torch.log(1 + 4 * torch.rand(Hv, generator=g)),
        norm_weight=1 + 0.2 * torch.randn(Dv, generator=g),
        state=0.2 * torch.randn(S, Hv, Dk, Dv, generator=g),
        num_k_heads=Hk,
    )


def _rows(T: int, Hk: int, Hv: int, Dk: int, Dv: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + seed)
    return torch.randn(T, 2 * Hk * Dk + 2 * Hv * Dv, generator=g), torch.randn(T, 2 * Hv, generator=g)


def _fresh(layer: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in layer.items()}


_WEIGHTS = ("conv_weight", "conv_state", "dt_bias", "A_log", "norm_weight", "state", "num_k_heads")


def _step(fn, qkvz, ba, slots, layer, tiled=False, beta_scale=1.0):
    kw = _fresh(layer)
    y = fn(qkvz, ba, slots, *(kw[k] for k in _WEIGHTS), tiled, beta_scale, 1e-6)
    return y, kw["conv_state"], kw["state"]


def _prefill(fn, qkvz, ba, lens, slots, fresh, saves, layer, tiled=False, beta_scale=1.0, chunk=16):
    kw = _fresh(layer)
    y = fn(qkvz, ba, lens, slots, fresh, saves, *(kw[k] for k in _WEIGHTS), tiled, beta_scale, 1e-6, chunk)
    return y, kw["conv_state"], kw["state"]


def _close(got: tuple, want: tuple) -> None:
    for a, b, what in zip(got, want, ("y", "conv state", "delta-rule state"), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5, msg=lambda m, w=what: f"{w}: {m}")


@pytest.mark.parametrize("tiled, beta_scale", [(False, 1.0), (True, 2.0)])
@pytest.mark.parametrize("Hk, Hv, Dk, Dv", [(2, 4, 16, 24), (1, 1, 32, 64), (2, 2, 128, 128)])
def test_step_matches_reference(lib: ops.Kernels, tiled: bool, beta_scale: float, Hk, Hv, Dk, Dv) -> None:
    layer = _layer(Hk, Hv, Dk, Dv, 4, seed=Dv)
    qkvz, ba = _rows(3, Hk, Hv, Dk, Dv, seed=1)
    slots = torch.tensor([5, 0, 2])
    got = _step(lib.deltanet_step, qkvz, ba, slots, layer, tiled, beta_scale)
    _close(got, _step(deltanet_step_reference, qkvz, ba, slots, layer, tiled, beta_scale))


def test_step_rows_sharing_a_slot_run_in_order(lib: ops.Kernels) -> None:
    """Rows of slots [4, 4, 1, 4, 4] (a sequence's consecutive tokens, another's between): the same as one
    step per row in row order, and as the reference (sizes that split the step over the threads)."""
    layer = _layer(2, 4, 128, 128, 4, seed=8)
    qkvz, ba = _rows(5, 2, 4, 128, 128, seed=8)
    slots = torch.tensor([4, 4, 1, 4, 4])
    got = _step(lib.deltanet_step, qkvz, ba, slots, layer)
    kw = _fresh(layer)
    ys = [
        lib.deltanet_step(
            qkvz[i : i + 1], ba[i : i + 1], slots[i : i + 1], *(kw[k] for k in _WEIGHTS), False, 1.0, 1e-6
        )
        for i in range(5)
    ]
    assert (
        torch.equal(got[0], torch.cat(ys))
        and torch.equal(got[1], kw["conv_state"])
        and torch.equal(got[2], kw["state"])
    )
    _close(got, _step(deltanet_step_reference, qkvz, ba, slots, layer))


@pytest.mark.parametrize("tiled, beta_scale", [(False, 1.0), (True, 2.0)])
@pytest.mark.parametrize("chunk", [16, 64])
def test_prefill_matches_reference(lib: ops.Kernels, tiled: bool, beta_scale: float, chunk: int) -> None:
    """Three sequences — fresh, continued, a short one that reaches into its conv state — with snapshots
    inside two of them (one at an offset shorter than the conv window)."""
    layer = _layer(**SIZES, seed=3)
    lens = [70, 2, 130]
    qkvz, ba = _rows(sum(lens), 2, 4, 16, 24, seed=2)
    slots, fresh = torch.tensor([0, 3, 5]), [True, False, False]
    saves = [(0, 33, 1), (2, 64, 2), (2, 100, 4), (2, 2, 6)]
    args = (qkvz, ba, lens, slots, fresh, saves, layer, tiled, beta_scale, chunk)
    _close(_prefill(lib.deltanet_prefill, *args), _prefill(deltanet_prefill_reference, *args))


def test_prefill_is_decode_steps_in_a_row(native: ops.Kernels) -> None:
    """A continued prefill of 20 tokens (chunks of 8) equals 20 decode steps from the same states."""
    layer = _layer(**SIZES, seed=4)
    qkvz, ba = _rows(20, 2, 4, 16, 24, seed=4)
    slot = torch.tensor([3])
    y, conv, state = _prefill(native.deltanet_prefill, qkvz, ba, [20], slot, [False], [], layer, chunk=8)
    stepped = _fresh(layer)
    ys = []
    for t in range(20):
        rows = slice(t, t + 1)
        y_t, stepped["conv_state"], stepped["state"] = _step(
            native.deltanet_step, qkvz[rows], ba[rows], slot, stepped
        )
        ys.append(y_t)
    _close((y, conv, state), (torch.cat(ys), stepped["conv_state"], stepped["state"]))


def test_rows_do_not_depend_on_the_batch(native: ops.Kernels) -> None:
    """A sequence's outputs and states are the same bits alone or beside others, on 1 or 2 threads."""
    layer = _layer(**SIZES, seed=5)
    lens = [40, 9, 77]
    qkvz, ba = _rows(sum(lens), 2, 4, 16, 24, seed=5)
    slots, fresh = torch.tensor([1, 4, 6]), [True, False, True]
    together = _prefill(native.deltanet_prefill, qkvz, ba, lens, slots, fresh, [(2, 50, 0)], layer)
    alone = _prefill(
        native.deltanet_prefill, qkvz[49:], ba[49:], [77], slots[2:], [True], [(0, 50, 0)], layer
    )
    assert torch.equal(together[0][49:], alone[0])
    for t_all, t_one in zip(together[1:], alone[1:], strict=True):
        assert torch.equal(t_all[[0, 6]], t_one[[0, 6]])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one_thread = _step(native.deltanet_step, qkvz[:3], ba[:3], slots, layer)
        torch.set_num_threads(2)
        two_threads = _step(native.deltanet_step, qkvz[:3], ba[:3], slots, layer)
        single = _step(native.deltanet_step, qkvz[1:2], ba[1:2], slots[1:2], layer)
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(one_thread, two_threads, strict=True))
    assert torch.equal(one_thread[0][1], single[0][0])


def test_kernels_check_their_inputs(native: ops.Kernels) -> None:
    layer = _layer(**SIZES)
    qkvz, ba = _rows(4, 2, 4, 16, 24, seed=6)
    with pytest.raises(ValueError, match="inconsistent"):
        _step(native.deltanet_step, qkvz[:, :-1].contiguous(), ba, torch.tensor([0, 1, 2, 3]), layer)
    with pytest.raises(RuntimeError, match="out of range"):
        _step(native.deltanet_step, qkvz, ba, torch.tensor([0, 1, 2, 99]), layer)
    with pytest.raises(RuntimeError, match="invalid"):  # a snapshot offset at the sequence's end
        _prefill(native.deltanet_prefill, qkvz, ba, [4], torch.tensor([0]), [True], [(0, 4, 1)], layer)
    with pytest.raises(ops.UnsupportedInput):
        _step(native.deltanet_step, qkvz.double(), ba, torch.tensor([0, 1, 2, 3]), layer)


def test_head_rms_norm_and_sigmoid_mul(lib: ops.Kernels) -> None:
    """In place on views of a fused projection's output: q heads of a row-strided [T, H, D], one group of
    all heads' features, and the gate per element and per row; the plain product (`mul`) the same bits as
    torch's, over a gate of strided rows, one per row, and a call large enough to split over threads."""
    g = torch.Generator().manual_seed(7)
    out = torch.randn(5, 4 * 32 + 80, generator=g)
    w = torch.randn(32, generator=g)
    for view in (lambda t: t[:, :128].view(5, 4, 32), lambda t: t[:, 8:136].unsqueeze(1)):
        mine, ref = out.clone(), out.clone()
        weight = w if view(mine).shape[-1] == 32 else torch.randn(128, generator=g)
        lib.head_rms_norm(view(mine), weight, 1e-6)
        head_rms_norm_reference(view(ref), weight, 1e-6)
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-6)
    for gate in (out[:, 128:208], out[:, 3:4]):
        x = torch.randn(5, 80, generator=g)
        torch.testing.assert_close(lib.sigmoid_mul(x.clone(), gate), sigmoid_mul_reference(x.clone(), gate))
        assert torch.equal(lib.mul(x.clone(), gate), mul_reference(x.clone(), gate))
        assert not torch.equal(lib.mul(x.clone(), gate), x)
    big, y = torch.randn(64, 1024, generator=g), torch.randn(64, 3, 1024, generator=g)[:, 1]
    assert torch.equal(lib.mul(big.clone(), y), big * y)
    assert torch.equal(
        lib.mul(big.clone(), y[:1, :1].expand(64, 1)), big * y[0, 0]
    )  # one scalar for all rows


def test_copy_rows(lib: ops.Kernels) -> None:
    """Rows into the halves of wider rows and back, bit for bit, as torch's copy."""
    g = torch.Generator().manual_seed(3)
    x, e = torch.randn(5, 48, generator=g), torch.randn(5, 48, generator=g)
    wide = torch.full((5, 96), float("nan"))
    lib.copy_rows(x, wide[:, :48])
    lib.copy_rows(e, wide[:, 48:])
    assert torch.equal(wide, torch.cat([x, e], dim=-1))
    assert torch.equal(
        lib.copy_rows(wide[:, 48:], torch.empty(5, 48)), copy_rows_reference(e, torch.empty(5, 48))
    )
