"""Kimi Delta Attention's math and kernels against their references: the delta rule with a channel-wise decay
(chunked WY form against the plain recurrence and against transformers' two KDA forms); the C decode step
and chunked prefill (csrc/kda.c, every ISA build) against their torch references (kernels/reference_kda.py) —
fresh and continued slots, snapshots inside a prefill; a prefill equals its tokens as decode steps; rows
never depend on the batch or the thread count; the kernels check their inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from blazr.kernels import ops
from blazr.kernels.reference_kda import kda_prefill_reference, kda_step_reference
from blazr.model.delta_rule import delta_rule_chunked, delta_rule_sequential
from tests.ssm_fixtures import single_thread


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


def _rule_inputs(L: int, H: int, Dk: int, Dv: int, seed: int, decay: float = 2.0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(L, H, Dk, generator=g), dim=-1) * Dk**-0.5
    k = F.normalize(torch.randn(L, H, Dk, generator=g), dim=-1)
    v = torch.randn(L, H, Dv, generator=g)
    log_decay = -F.softplus(torch.randn(L, H, Dk, generator=g)) * decay  # one per key channel
    beta = torch.rand(L, H, generator=g)
    return q, k, v, log_decay, beta, 0.3 * torch.randn(H, Dk, Dv, generator=g)


@pytest.mark.parametrize("L, C, decay", [(45, 8, 2.0), (130, 64, 2.0), (70, 16, 300.0), (9, 1, 1.0)])
def test_channel_wise_chunked_matches_the_recurrence(L: int, C: int, decay: float) -> None:
    """Across chunk borders, from a nonzero state, with decays down to e^-600 per token."""
    q, k, v, g, beta, S0 = _rule_inputs(L, 3, 8, 6, seed=L + C, decay=decay)
    want, S_want = delta_rule_sequential(q, k, v, g, beta, S0)
    got, S_got = delta_rule_chunked(q, k, v, g, beta, C, S0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(S_got, S_want, rtol=1e-5, atol=2e-5)


def test_both_forms_match_transformers() -> None:
    """transformers' chunk_kimi_delta_attention / recurrent_kimi_delta_attention (which L2-normalise q and k
    themselves)."""
    from transformers.models.kimi_linear import modeling_kimi_linear as hf

    gen = torch.Generator().manual_seed(5)
    L, H, D = 70, 2, 16  # two of transformers' 64-token chunks
    q, k, v = (torch.randn(1, L, H, D, generator=gen) for _ in range(3))
    g = -F.softplus(torch.randn(1, L, H, D, generator=gen))
    beta = torch.rand(1, L, H, generator=gen)
    S0 = torch.randn(1, H, D, D, generator=gen) * 0.2
    qn = hf.l2norm(q) * D**-0.5
    kn = hf.l2norm(k)
    for hf_rule in (hf.chunk_kimi_delta_attention, hf.recurrent_kimi_delta_attention):
        o_hf, S_hf = hf_rule(
            q, k, v, g=g, beta=beta, initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True
        )
        for ours in (delta_rule_sequential, delta_rule_chunked):
            o, S = ours(qn[0], kn[0], v[0], g[0], beta[0], initial_state=S0[0])
            torch.testing.assert_close(o, o_hf[0], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(S, S_hf[0], rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------------ kernels

H, D, K = 2, 24, 4  # D not a multiple of 16: the vector paths' tails run too


def _layer(H: int = H, D: int = D, K: int = K, S: int = 8, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    C = 3 * H * D
    return dict(
        conv_weight=0.5 * torch.randn(C, K, generator=g),
        conv_state=torch.randn(S, C, K - 1, generator=g),
        dt_bias=torch.randn(H * D, generator=g),
        A_log=torch.log(1 + 4 * torch.rand(H, generator=g)),
        norm_weight=1 + 0.2 * torch.randn(D, generator=g),
        state=0.2 * torch.randn(S, H, D, D, generator=g),
    )


def _rows(T: int, H: int = H, D: int = D, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """qkv [T, 3·H·D], f [T, H·D], b [T, H], gate [T, H·D]."""
    g = torch.Generator().manual_seed(100 + seed)
    W = H * D
    return tuple(torch.randn(T, n, generator=g) for n in (3 * W, W, H, W))


def _fresh(layer: dict) -> dict:
    return {k: v.clone() for k, v in layer.items()}


_WEIGHTS = ("conv_weight", "conv_state", "dt_bias", "A_log", "norm_weight", "state")


def _step(fn, rows, slots, layer):
    kw = _fresh(layer)
    y = fn(*rows, slots, *(kw[k] for k in _WEIGHTS), 1e-5)
    return y, kw["conv_state"], kw["state"]


def _prefill(fn, rows, lens, slots, fresh, saves, layer, chunk=16):
    kw = _fresh(layer)
    y = fn(*rows, lens, slots, fresh, saves, *(kw[k] for k in _WEIGHTS), 1e-5, chunk)
    return y, kw["conv_state"], kw["state"]


def _close(got: tuple, want: tuple) -> None:
    for a, b, what in zip(got, want, ("y", "conv state", "delta-rule state"), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5, msg=lambda m, w=what: f"{w}: {m}")


@pytest.mark.parametrize("heads, dim", [(2, 24), (1, 64), (2, 128)])
def test_step_matches_reference(lib: ops.Kernels, heads: int, dim: int) -> None:
    layer = _layer(heads, dim, seed=dim)
    rows = _rows(3, heads, dim, seed=1)
    slots = torch.tensor([5, 0, 2])
    _close(_step(lib.kda_step, rows, slots, layer), _step(kda_step_reference, rows, slots, layer))


def test_step_rows_sharing_a_slot_run_in_order(lib: ops.Kernels) -> None:
    """Rows of slots [4, 4, 1, 4, 4] (a sequence's consecutive tokens, another's between): the same as one
    step per row in row order, and as the reference (sizes that split the step over the threads)."""
    layer = _layer(2, 128, seed=8)
    rows = _rows(5, 2, 128, seed=8)
    slots = torch.tensor([4, 4, 1, 4, 4])
    got = _step(lib.kda_step, rows, slots, layer)
    kw = _fresh(layer)
    ys = [
        lib.kda_step(*(r[i : i + 1] for r in rows), slots[i : i + 1], *(kw[k] for k in _WEIGHTS), 1e-5)
        for i in range(5)
    ]
    assert (
        torch.equal(got[0], torch.cat(ys))
        and torch.equal(got[1], kw["conv_state"])
        and torch.equal(got[2], kw["state"])
    )
    _close(got, _step(kda_step_reference, rows, slots, layer))


@pytest.mark.parametrize("chunk", [16, 64])  # several chunks and cuts inside one
def test_prefill_matches_reference(lib: ops.Kernels, chunk: int) -> None:
    """Three sequences — fresh, continued, a short one that reaches into its conv state — with snapshots
    inside two of them (one at an offset shorter than the conv window)."""
    layer = _layer(seed=3)
    lens = [40, 2, 75]
    rows = _rows(sum(lens), seed=2)
    slots, fresh = torch.tensor([0, 3, 5]), [True, False, False]
    saves = [(0, 21, 1), (2, 16, 2), (2, 50, 4), (2, 2, 6)]
    args = (rows, lens, slots, fresh, saves, layer, chunk)
    _close(_prefill(lib.kda_prefill, *args), _prefill(kda_prefill_reference, *args))


def test_prefill_is_decode_steps_in_a_row(native: ops.Kernels) -> None:
    """A continued prefill of 20 tokens (chunks of 8) equals 20 decode steps from the same states."""
    layer = _layer(seed=4)
    rows = _rows(20, seed=4)
    slot = torch.tensor([3])
    y, conv, state = _prefill(native.kda_prefill, rows, [20], slot, [False], [], layer, chunk=8)
    stepped = _fresh(layer)
    ys = []
    for t in range(20):
        y_t, stepped["conv_state"], stepped["state"] = _step(
            native.kda_step, tuple(r[t : t + 1] for r in rows), slot, stepped
        )
        ys.append(y_t)
    _close((y, conv, state), (torch.cat(ys), stepped["conv_state"], stepped["state"]))


def test_rows_do_not_depend_on_the_batch(native: ops.Kernels) -> None:
    """A sequence's outputs and states are the same bits alone or beside others, on 1 or 2 threads."""
    layer = _layer(seed=5)
    lens = [40, 9, 77]
    rows = _rows(sum(lens), seed=5)
    slots, fresh = torch.tensor([1, 4, 6]), [True, False, True]
    together = _prefill(native.kda_prefill, rows, lens, slots, fresh, [(2, 50, 0)], layer)
    tail = tuple(r[49:] for r in rows)
    alone = _prefill(native.kda_prefill, tail, [77], slots[2:], [True], [(0, 50, 0)], layer)
    assert torch.equal(together[0][49:], alone[0])
    for t_all, t_one in zip(together[1:], alone[1:], strict=True):
        assert torch.equal(t_all[[0, 6]], t_one[[0, 6]])
    before = torch.get_num_threads()
    first3 = tuple(r[:3] for r in rows)
    try:
        torch.set_num_threads(1)
        one_thread = _step(native.kda_step, first3, slots, layer)
        torch.set_num_threads(2)
        two_threads = _step(native.kda_step, first3, slots, layer)
        single = _step(native.kda_step, tuple(r[1:2] for r in rows), slots[1:2], layer)
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(one_thread, two_threads, strict=True))
    assert torch.equal(one_thread[0][1], single[0][0])


def test_kernels_check_their_inputs(native: ops.Kernels) -> None:
    layer = _layer()
    qkv, f, b, gate = _rows(4, seed=6)
    slots = torch.tensor([0, 1, 2, 3])
    with pytest.raises(ValueError, match="inconsistent"):
        _step(native.kda_step, (qkv[:, :-1].contiguous(), f, b, gate), slots, layer)
    with pytest.raises(RuntimeError, match="out of range"):
        _step(native.kda_step, (qkv, f, b, gate), torch.tensor([0, 1, 2, 99]), layer)
    with pytest.raises(RuntimeError, match="invalid"):  # a snapshot offset at the sequence's end
        _prefill(native.kda_prefill, (qkv, f, b, gate), [4], torch.tensor([0]), [True], [(0, 4, 1)], layer)
    with pytest.raises(ops.UnsupportedInput):
        _step(native.kda_step, (qkv.double(), f, b, gate), slots, layer)


def test_bits_equal_on_every_isa(native: ops.Kernels, other_build: ops.Kernels) -> None:
    """The step and the prefill give the same bits on every build's paths (vector lanes and scalar tails
    in the same order), so a result never depends on the host."""
    layer = _layer(seed=7)
    lens = [70, 5]
    rows = _rows(sum(lens), seed=7)
    args = (rows, lens, torch.tensor([2, 4]), [True, False], [(0, 30, 1)], layer)
    for a, b in zip(
        _prefill(native.kda_prefill, *args), _prefill(other_build.kda_prefill, *args), strict=True
    ):
        assert torch.equal(a, b)
    step = (tuple(r[:2] for r in rows), torch.tensor([0, 3]), layer)
    for a, b in zip(_step(native.kda_step, *step), _step(other_build.kda_step, *step), strict=True):
        assert torch.equal(a, b)
