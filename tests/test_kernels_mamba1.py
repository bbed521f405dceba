"""The Mamba1 kernels (csrc/mamba1.c) against their torch references on every ISA build this CPU runs
(`lib`): the dt / B / C split with and without its RMS norms (weighted, weightless), the selective scan as a
decode step and as a prefill (fresh and continued sequences; softplus past its linear threshold and far
below zero), a prefill equal to decode steps in a row and to itself in two chunks, rows independent of
their batch."""

from __future__ import annotations

import pytest
import torch

from blazr.kernels import ops

# (Di, N): N = 16 (every released Mamba1), a scalar tail (N = 20) and a state narrower than a vector
SHAPES = [(96, 16), (40, 20), (17, 4)]


@pytest.mark.parametrize("norm", ["none", "weightless", "weights"])
def test_mamba1_dt_bc(lib: ops.Kernels, norm: str) -> None:
    g = torch.Generator().manual_seed(2)
    R, N = 12, 16
    dbc = torch.randn(6, R + 2 * N, generator=g) * 3
    w = [torch.randn(n, generator=g) for n in (R, N, N)] if norm == "weights" else [None] * 3
    got = lib.mamba1_dt_bc(dbc, R, N, *w, norm != "none", 1e-6)
    want = ops.mamba1_dt_bc_reference(dbc, R, N, *w, norm != "none", 1e-6)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _inputs(Di: int, N: int, rows: int, B: int, S: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    xz = torch.randn(rows, 2 * Di, generator=g)  # in_proj's output: z is its column view
    dt_raw = torch.randn(rows, Di, generator=g) * 4
    dt_raw[:, 0] = 25.0  # softplus' linear branch
    dt_raw[:, 1] = -30.0  # e^v far below one ulp of 1
    return {
        "xc": torch.randn(rows, Di, generator=g),
        "dt_raw": dt_raw,
        "bc": torch.randn(rows, 2 * N, generator=g),
        "z": xz[:, Di:],
        "slots": torch.randperm(S, generator=g)[:B],
        "A": -torch.rand(Di, N, generator=g) * 4 - 0.05,
        "D": torch.randn(Di, generator=g),
        "ssm": torch.randn(S, Di, N, generator=g),
    }


def _run(fn, inp: dict) -> tuple[torch.Tensor, torch.Tensor]:
    a = dict(inp, ssm=inp["ssm"].clone())
    return fn(**a), a["ssm"]


@pytest.mark.parametrize(("Di", "N"), SHAPES)
def test_mamba1_scan_step(lib: ops.Kernels, Di: int, N: int) -> None:
    inp = _inputs(Di, N, 3, 3, 7, seed=Di + N)
    y, st = _run(lib.mamba1_scan_step, inp)
    y_ref, st_ref = _run(ops.mamba1_scan_step_reference, inp)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5 * float(y_ref.abs().max()))
    torch.testing.assert_close(st, st_ref, rtol=1e-5, atol=1e-6)
    others = [s for s in range(7) if s not in inp["slots"].tolist()]
    assert torch.equal(st[others], inp["ssm"][others])


def test_mamba1_scan_step_rows_sharing_a_slot_run_in_order(lib: ops.Kernels) -> None:
    """Rows of slots [4, 4, 1, 4, 4] (a sequence's consecutive tokens, another's between): the same as one
    step per row in row order, and as the reference (sizes that split the step over the threads)."""
    inp = dict(_inputs(512, 16, 5, 5, 7, seed=9), slots=torch.tensor([4, 4, 1, 4, 4]))
    y, st = _run(lib.mamba1_scan_step, inp)
    ssm, ys = inp["ssm"].clone(), []
    for i in range(5):
        row = {k: v[i : i + 1] if k in ("xc", "dt_raw", "bc", "z", "slots") else v for k, v in inp.items()}
        ys.append(lib.mamba1_scan_step(**dict(row, ssm=ssm)))
    assert torch.equal(y, torch.cat(ys)) and torch.equal(st, ssm)
    y_ref, st_ref = _run(ops.mamba1_scan_step_reference, inp)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5 * float(y_ref.abs().max()))
    torch.testing.assert_close(st, st_ref, rtol=1e-5, atol=1e-6)


def _prefill(lens: list[int], fresh: list[bool], Di: int, N: int, seed: int) -> dict:
    inp = _inputs(Di, N, sum(lens), len(lens), len(lens) + 2, seed)
    return dict(inp, query_lens=lens, fresh=fresh)


@pytest.mark.parametrize(("Di", "N"), SHAPES)
def test_mamba1_scan_prefill(lib: ops.Kernels, Di: int, N: int) -> None:
    lens, fresh = [40, 1, 6], [True, False, True]
    inp = _prefill(lens, fresh, Di, N, seed=Di * N)
    y, st = _run(lib.mamba1_scan_prefill, inp)
    y_ref, st_ref = _run(ops.mamba1_scan_prefill_reference, inp)
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4 * float(y_ref.abs().max()))
    torch.testing.assert_close(st, st_ref, rtol=1e-4, atol=1e-4 * float(st_ref.abs().max()))
    others = [s for s in range(5) if s not in inp["slots"].tolist()]
    assert torch.equal(st[others], inp["ssm"][others])


def test_the_log_depth_scan_is_the_reference_scan() -> None:
    """The fallback of `ops.mamba1_scan_prefill` where no C kernel runs (a GPU): the Hillis–Steele scan,
    against the reference's step per token — sequences longer than one scan chunk (the state carried
    across), of one row, fresh and continued; other slots untouched."""
    from blazr.kernels import parallel_scan

    lens, fresh = [parallel_scan.CHUNK + 45, 1, 6, 2 * parallel_scan.CHUNK], [True, False, False, True]
    inp = _prefill(lens, fresh, 48, 16, seed=3)
    y, st = _run(parallel_scan.mamba1_scan_prefill_parallel, inp)
    y_ref, st_ref = _run(ops.mamba1_scan_prefill_reference, inp)
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4 * float(y_ref.abs().max()))
    torch.testing.assert_close(st, st_ref, rtol=1e-4, atol=1e-4 * float(st_ref.abs().max()))
    others = [s for s in range(len(lens) + 2) if s not in inp["slots"].tolist()]
    assert torch.equal(st[others], inp["ssm"][others])
    g = torch.Generator().manual_seed(1)
    a, b, h0 = torch.rand(37, 3, 2, generator=g), torch.randn(37, 3, 2, generator=g), torch.randn(3, 2)
    h, want = h0, []
    for t in range(37):  # 37 rows: passes of 1, 2, 4, …, 32, the last one partial
        h = a[t] * h + b[t]
        want.append(h)
    torch.testing.assert_close(parallel_scan.linear_scan(a, b, h0), torch.stack(want))


def test_mamba1_scan_prefill_is_decode_steps_in_a_row(lib: ops.Kernels) -> None:
    """n prefill rows are the bits of n decode steps and of the prefill in two chunks; a sequence's rows do
    not depend on the others in its call."""
    lens, fresh = [9, 3, 11], [False, True, False]
    inp = _prefill(lens, fresh, 80, 16, seed=5)
    y, st = _run(lib.mamba1_scan_prefill, inp)
    steps = inp["ssm"].clone()
    steps[inp["slots"][1]] = 0
    rows = ("xc", "dt_raw", "bc", "z")
    start = 0
    for b, n in enumerate(lens):
        slot = inp["slots"][b : b + 1]
        for t in range(start, start + n):
            one = {k: inp[k][t : t + 1] for k in rows}
            assert torch.equal(
                lib.mamba1_scan_step(**one, slots=slot, A=inp["A"], D=inp["D"], ssm=steps)[0], y[t]
            )
        sub = {k: inp[k][start : start + n] for k in rows}
        alone, st1 = _run(
            lib.mamba1_scan_prefill, dict(inp, **sub, query_lens=[n], slots=slot, fresh=fresh[b : b + 1])
        )
        assert torch.equal(alone, y[start : start + n]) and torch.equal(st1[slot], st[slot])
        start += n
    assert torch.equal(steps, st)
    one = dict(inp, slots=inp["slots"][:1], fresh=[False])
    y1, st1 = _run(lib.mamba1_scan_prefill, dict(one, **{k: inp[k][:4] for k in rows}, query_lens=[4]))
    y2, st2 = _run(
        lib.mamba1_scan_prefill, dict(one, **{k: inp[k][4:9] for k in rows}, query_lens=[5], ssm=st1)
    )
    s0 = inp["slots"][0]
    assert torch.equal(torch.cat([y1, y2]), y[:9]) and torch.equal(st2[s0], st[s0])


def test_mamba1_scan_checks_inputs(native: ops.Kernels) -> None:
    inp = _inputs(16, 16, 2, 2, 3, seed=0)
    with pytest.raises(RuntimeError, match="out of range"):
        native.mamba1_scan_step(**dict(inp, slots=torch.tensor([0, 3])))
    with pytest.raises(ValueError, match="inconsistent"):
        native.mamba1_scan_step(**dict(inp, A=torch.zeros(16, 8)))
    with pytest.raises(ops.UnsupportedInput):  # a strided xc: the dispatcher takes the reference
        native.mamba1_scan_step(**dict(inp, xc=torch.randn(2, 32)[:, :16]))
