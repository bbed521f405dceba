"""The Mamba2 kernels (csrc/mamba2.c: the decode step and the prefill scan) against their torch references
(kernels/reference_mamba2.py), on every ISA build (`lib`, tests/conftest.py): states advanced in place at
their slots, rows independent, rows sharing a slot run in order, the prefill equal to the chunked scan and
to decode steps in a row, bad inputs refused. Moved out of tests/test_kernels.py."""

from __future__ import annotations

import pytest
import torch

from blazr.kernels import ops

# ---------------------------------------------------------------- Mamba2 decode step


def _mamba2_inputs(
    H: int, P: int, G: int, N: int, K: int, B: int, S: int, bias: bool, seed: int, rows: int | None = None
) -> dict:
    """Decode-step inputs for B sequences (`rows` rows of xbc / dt_raw: B, or a prefill's total)."""
    g = torch.Generator().manual_seed(seed)
    Di, Cd = H * P, H * P + 2 * G * N
    # an in_proj output: xbc and dt_raw are column views
    zxbcdt = torch.randn(B if rows is None else rows, Di + Cd + H, generator=g)
    zxbcdt[:, Di + Cd :] *= 3  # dt reaches both clamps, and softplus' linear branch (> 20 with dt_bias 25)
    return {
        "xbc": zxbcdt[:, Di : Di + Cd],
        "dt_raw": zxbcdt[:, Di + Cd :],
        "slots": torch.randperm(S, generator=g)[:B],
        "conv_weight": torch.randn(Cd, K, generator=g) * 0.5,
        "conv_bias": torch.randn(Cd, generator=g) if bias else None,
        "conv_state": torch.randn(S, Cd, K - 1, generator=g),
        "dt_bias": torch.cat([torch.randn(H - 1, generator=g), torch.tensor([25.0])]),
        "A_log": torch.log(torch.rand(H, generator=g) * 4 + 1e-3),  # A = −exp(A_log) in (−4, 0)
        "D": torch.randn(H, generator=g),
        "ssm_state": torch.randn(S, H, P, N, generator=g),
        "n_groups": G,
        "dt_min": 1e-3,
        "dt_max": 2.0 if bias else float("inf"),
    }


def _mamba2_run(fn, inp: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a = dict(inp, conv_state=inp["conv_state"].clone(), ssm_state=inp["ssm_state"].clone())
    return fn(**a), a["conv_state"], a["ssm_state"]


# (H, P, G, N, K): AVX2's 16-wide state steps with a scalar tail (N = 20), groups, kernel widths 2-4
MAMBA2_SHAPES = [(4, 16, 1, 64, 4), (6, 8, 2, 20, 3), (3, 4, 3, 128, 2)]


@pytest.mark.parametrize(("H", "P", "G", "N", "K"), MAMBA2_SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_mamba2_step(lib: ops.Kernels, H: int, P: int, G: int, N: int, K: int, bias: bool) -> None:
    """The fused decode step against its torch reference: output, both states in place at their slots,
    every other slot untouched."""
    inp = _mamba2_inputs(H, P, G, N, K, B=3, S=7, bias=bias, seed=H * N + K)
    y, conv, ssm = _mamba2_run(lib.mamba2_step, inp)
    y_ref, conv_ref, ssm_ref = _mamba2_run(ops.mamba2_step_reference, inp)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5 * float(y_ref.abs().max()))
    torch.testing.assert_close(ssm, ssm_ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(conv, conv_ref)  # a shift of stored values: exact
    others = [s for s in range(7) if s not in inp["slots"].tolist()]
    assert torch.equal(ssm[others], inp["ssm_state"][others])


def test_mamba2_step_rows_are_independent(lib: ops.Kernels) -> None:
    """A sequence's step is the same bits alone or in a batch, and twice in a row continues its state."""
    inp = _mamba2_inputs(8, 16, 2, 64, 4, B=5, S=9, bias=True, seed=1)
    y, conv, ssm = _mamba2_run(lib.mamba2_step, inp)
    for b in range(5):
        one = dict(
            inp, xbc=inp["xbc"][b : b + 1], dt_raw=inp["dt_raw"][b : b + 1], slots=inp["slots"][b : b + 1]
        )
        y1, conv1, ssm1 = _mamba2_run(lib.mamba2_step, one)
        s = int(inp["slots"][b])
        assert torch.equal(y1[0], y[b]) and torch.equal(ssm1[s], ssm[s]) and torch.equal(conv1[s], conv[s])
    y2, _, _ = _mamba2_run(lib.mamba2_step, dict(inp, conv_state=conv, ssm_state=ssm))
    y2_ref, _, _ = _mamba2_run(ops.mamba2_step_reference, dict(inp, conv_state=conv, ssm_state=ssm))
    torch.testing.assert_close(y2, y2_ref, rtol=1e-5, atol=1e-5 * float(y2_ref.abs().max()))


def test_mamba2_step_rows_sharing_a_slot_run_in_order(lib: ops.Kernels) -> None:
    """Rows 0-2 of one slot, row 3 of another, row 4 of the first again: the same bits as one step per row
    in row order (a sequence's consecutive tokens as rows: speculative verification), and as the
    reference."""
    inp = _mamba2_inputs(8, 16, 2, 64, 4, B=5, S=9, bias=True, seed=2)
    inp["slots"] = torch.tensor([4, 4, 4, 7, 4])
    y, conv, ssm = _mamba2_run(lib.mamba2_step, inp)
    conv1, ssm1, ys = inp["conv_state"].clone(), inp["ssm_state"].clone(), []
    for b in range(5):
        one = dict(
            inp, xbc=inp["xbc"][b : b + 1], dt_raw=inp["dt_raw"][b : b + 1], slots=inp["slots"][b : b + 1]
        )
        ys.append(lib.mamba2_step(**dict(one, conv_state=conv1, ssm_state=ssm1)))
    assert torch.equal(y, torch.cat(ys)) and torch.equal(conv, conv1) and torch.equal(ssm, ssm1)
    y_ref, conv_ref, ssm_ref = _mamba2_run(ops.mamba2_step_reference, inp)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5 * float(y_ref.abs().max()))
    torch.testing.assert_close(ssm, ssm_ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(conv, conv_ref)


def test_mamba2_step_checks_inputs(native: ops.Kernels) -> None:
    inp = _mamba2_inputs(4, 16, 1, 64, 4, B=2, S=3, bias=False, seed=0)
    with pytest.raises(RuntimeError, match="out of range"):
        native.mamba2_step(**dict(inp, slots=torch.tensor([0, 3])))
    with pytest.raises(ValueError, match="inconsistent"):
        native.mamba2_step(**dict(inp, n_groups=2))
    with pytest.raises(ops.UnsupportedInput):  # not views of one buffer: the dispatcher takes the reference
        native.mamba2_step(**dict(inp, xbc=inp["xbc"].clone()))


def _prefill_inputs(lens: list[int], fresh: list[bool], H: int, P: int, G: int, N: int, K: int, seed: int):
    """Inputs of mamba2_prefill for sequences of `lens` rows, slots and states as for the decode step."""
    inp = _mamba2_inputs(H, P, G, N, K, B=len(lens), S=len(lens) + 3, bias=True, seed=seed, rows=sum(lens))
    return dict(inp, query_lens=lens, fresh=fresh)


@pytest.mark.parametrize(("H", "P", "G", "N", "K"), MAMBA2_SHAPES)
def test_mamba2_prefill_matches_the_chunked_scan(
    lib: ops.Kernels, H: int, P: int, G: int, N: int, K: int
) -> None:
    """The scan kernel against its reference, the chunked SSD (300 rows: two 256-token chunks), for fresh
    and continued sequences, one shorter than the conv window: output, both states at their slots, every
    other slot untouched."""
    lens, fresh = [300, 1, 7, 2], [True, False, False, True]
    inp = _prefill_inputs(lens, fresh, H, P, G, N, K, seed=H * N + K)
    y, conv, ssm = _mamba2_run(lib.mamba2_prefill, inp)
    y_ref, conv_ref, ssm_ref = _mamba2_run(ops.mamba2_prefill_reference, inp)
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4 * float(y_ref.abs().max()))
    torch.testing.assert_close(ssm, ssm_ref, rtol=1e-4, atol=1e-4 * float(ssm_ref.abs().max()))
    assert torch.equal(conv, conv_ref)  # stored inputs (or the old state's tail): exact
    others = [s for s in range(len(lens) + 3) if s not in inp["slots"].tolist()]
    assert torch.equal(ssm[others], inp["ssm_state"][others]) and torch.equal(
        conv[others], inp["conv_state"][others]
    )


# (H, P, G, N, K, lens): N = 20 runs head_step per token; N a multiple of 16 the tiled scan (csrc/mamba2.c
# head_scan: 16-token tiles, state pieces of 64 columns on AVX2 / 128 on AVX-512, a last piece of fewer
# chunks: N = 48, 192) — tiles whole, cut short, and a sequence shorter than one
SCAN_SHAPES = [(6, 8, 2, 20, 4, [9, 5, 12]), (3, 8, 1, 128, 4, [37, 16, 3]), (2, 4, 2, 48, 3, [17, 9, 33]),
               (2, 4, 1, 192, 4, [21, 2, 16])]  # fmt: skip


@pytest.mark.parametrize(("H", "P", "G", "N", "K", "lens"), SCAN_SHAPES)
def test_mamba2_prefill_is_decode_steps_in_a_row(
    lib: ops.Kernels, H: int, P: int, G: int, N: int, K: int, lens: list[int]
) -> None:
    """n prefill rows give the same bits as n decode steps (and so does splitting a prefill in two chunks);
    a sequence's results do not depend on the others in its call."""
    inp = _prefill_inputs(lens, [False, True, False], H, P, G, N, K, seed=3)
    y, conv, ssm = _mamba2_run(lib.mamba2_prefill, inp)
    steps = dict(inp, conv_state=inp["conv_state"].clone(), ssm_state=inp["ssm_state"].clone())
    steps["conv_state"][inp["slots"][1]] = 0  # the fresh sequence starts from zeros
    steps["ssm_state"][inp["slots"][1]] = 0
    start = 0
    for b, n in enumerate(lens):
        slot = inp["slots"][b : b + 1]
        for t in range(start, start + n):
            one = {k: v for k, v in steps.items() if k not in ("query_lens", "fresh")}
            one.update(xbc=inp["xbc"][t : t + 1], dt_raw=inp["dt_raw"][t : t + 1], slots=slot)
            assert torch.equal(lib.mamba2_step(**one)[0], y[t])
        alone, conv1, ssm1 = _mamba2_run(
            lib.mamba2_prefill,
            dict(inp, xbc=inp["xbc"][start : start + n], dt_raw=inp["dt_raw"][start : start + n],
                 query_lens=[n], slots=slot, fresh=inp["fresh"][b : b + 1]),
        )  # fmt: skip
        assert torch.equal(alone, y[start : start + n])
        s = int(slot)
        assert torch.equal(ssm1[s], ssm[s]) and torch.equal(conv1[s], conv[s])
        start += n
    assert torch.equal(steps["ssm_state"], ssm) and torch.equal(steps["conv_state"], conv)
    half = dict(inp, xbc=inp["xbc"][:4], dt_raw=inp["dt_raw"][:4], query_lens=[4], slots=inp["slots"][:1])
    y1, conv1, ssm1 = _mamba2_run(lib.mamba2_prefill, dict(half, fresh=[False]))
    n0 = lens[0]  # the first sequence in two chunks: 4 rows, then the rest
    rest = dict(half, xbc=inp["xbc"][4:n0], dt_raw=inp["dt_raw"][4:n0], query_lens=[n0 - 4], fresh=[False])
    y2, conv2, ssm2 = _mamba2_run(lib.mamba2_prefill, dict(rest, conv_state=conv1, ssm_state=ssm1))
    s0 = int(inp["slots"][0])
    assert torch.equal(torch.cat([y1, y2]), y[:n0])
    assert torch.equal(ssm2[s0], ssm[s0]) and torch.equal(conv2[s0], conv[s0])


def test_mamba2_prefill_checks_inputs(native: ops.Kernels) -> None:
    inp = _prefill_inputs([3, 2], [True, True], 4, 16, 1, 64, 4, seed=0)
    with pytest.raises(RuntimeError, match="out of range"):
        native.mamba2_prefill(**dict(inp, slots=torch.tensor([0, 5])))
    with pytest.raises(RuntimeError):  # two sequences in one slot would race
        native.mamba2_prefill(**dict(inp, slots=torch.tensor([1, 1])))
    with pytest.raises(ValueError, match="inconsistent"):
        native.mamba2_prefill(**dict(inp, query_lens=[3, 3]))
    with pytest.raises(ops.UnsupportedInput):
        native.mamba2_prefill(**dict(inp, xbc=inp["xbc"].clone()))
