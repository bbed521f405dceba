"""The token-choice kernels (csrc/sample.c) against their torch references and float64 arithmetic, on the
native build and the portable scalar one (`lib`), and the two builds against each other bit for bit."""

from __future__ import annotations

import pytest
import torch

from blazr.kernels import ops

V_SHAPES = [1, 7, 64, 65, 1000, 49152]


def _weights64(x: torch.Tensor, temperature: float, min_p: float) -> torch.Tensor:
    """The kept weights of one row in float64 (the kernels' formula: exp(t) for t = (x − max) / T ≥ −87,
    else 0; 0 under min-p)."""
    x = x.double().nan_to_num(nan=float("-inf"), posinf=torch.finfo(torch.float32).max)
    t = (x - x.max()) / temperature
    e = t.exp()
    return e.masked_fill((e < min_p) | (t < -87), 0.0)


def _check_draw(x: torch.Tensor, temperature: float, min_p: float, u: float, token: int) -> None:
    """`token` is where u · Σe falls in the float64 CDF (to 1e-5 of the mass) and has weight."""
    e = _weights64(x, temperature, min_p)
    cdf = e.cumsum(0)
    total = float(cdf[-1])
    target, tol = u * total, 1e-5 * total
    assert e[token] > 0, (token, float(e[token]))
    assert float(cdf[token] - e[token]) - tol <= target <= float(cdf[token]) + tol, (token, target, total)


@pytest.mark.parametrize("V", V_SHAPES)
def test_argmax_rows(lib: ops.Kernels, V: int) -> None:
    g = torch.Generator().manual_seed(V)
    x = torch.randn(6, V, generator=g)
    if V > 5:
        x[1, V // 2] = x[1, 3] = x[1].max() + 1  # a tie: the first index wins
        x[2, 0] = float("nan")  # NaN is never the maximum
        x[2, V - 1] = 50.0
    x[3] = float("-inf")  # nothing above −inf: the first index
    x[4] = float("nan")  # all NaN: 0
    x[5, -1] = float("inf")
    got = lib.argmax_rows(x)
    assert got.tolist() == ops.argmax_rows_reference(x).tolist()
    if V > 5:
        assert got[1] == 3 and got[2] == V - 1
    assert got[3] == 0 and got[4] == 0 and got[5] == V - 1


@pytest.mark.parametrize("V", V_SHAPES)
def test_sample_rows_draws_where_the_cdf_says(lib: ops.Kernels, V: int) -> None:
    """Each draw lands in the interval of the float64 CDF that holds u · Σe; the torch reference agrees
    with the same check (the two differ only at interval ends, by fp32 rounding)."""
    g = torch.Generator().manual_seed(V + 1)
    B = 24
    x = torch.randn(B, V, generator=g) * 4
    temps = torch.tensor([0.05, 0.7, 1.0, 1.7] * (B // 4))
    min_p = torch.tensor([0.0, 0.0, 0.05, 0.3, 0.0, 0.9] * (B // 6))
    u = torch.rand(B, generator=g)
    u[0], u[1] = 0.0, 1.0 - 2.0**-24  # the first kept token; the end of the CDF
    got = lib.sample_rows(x, temps, min_p, u)
    want = ops.sample_rows_reference(x, temps, min_p, u)
    for b in range(B):
        _check_draw(x[b], float(temps[b]), float(min_p[b]), float(u[b]), int(got[b]))
        _check_draw(x[b], float(temps[b]), float(min_p[b]), float(u[b]), int(want[b]))
    assert got[0] == int((_weights64(x[0], float(temps[0]), float(min_p[0])) > 0).nonzero()[0])


def test_sample_rows_frequencies_follow_the_distribution(lib: ops.Kernels) -> None:
    """u on an even grid of 2000 points: each token is drawn p · 2000 times (± 1), min-p's drops never."""
    x = torch.tensor([2.0, 0.0, -1.0, 1.0, -3.0, 0.5, -8.0])
    T, min_p, n = 0.8, 0.01, 2000
    rows = x.expand(n, -1).contiguous()
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    got = lib.sample_rows(rows, torch.full((n,), T), torch.full((n,), min_p), u.float())
    e = _weights64(x, T, min_p)
    counts = torch.bincount(got, minlength=x.numel()).double()
    assert (counts - n * e / e.sum()).abs().max() <= 1.0, counts
    assert counts[6] == 0 and e[6] == 0  # exp(−12.5) < 0.01: min-p drops it


def test_sample_rows_specials(lib: ops.Kernels) -> None:
    """NaN weighs 0; +inf logits share the draw among themselves; a row with nothing above −inf gives 0."""
    n = 400
    x = torch.randn(3, 50)
    x[0, ::2] = float("nan")
    x[1, 7] = x[1, 31] = float("inf")
    x[2] = float("-inf")
    u = (torch.arange(n) + 0.5) / n
    for row, allowed in ((0, set(range(1, 50, 2))), (1, {7, 31}), (2, {0})):
        rows = x[row].expand(n, -1).contiguous()
        got = lib.sample_rows(rows, torch.ones(n), torch.zeros(n), u)
        assert set(got.tolist()) == allowed, row


def test_sample_rows_is_the_same_on_every_build(native: ops.Kernels, generic: ops.Kernels) -> None:
    """exp and the block sums are one fixed sequence of fp32 operations: the AVX2 and scalar builds draw the
    same token for every row, and a row draws the same alone as inside a batch."""
    g = torch.Generator().manual_seed(7)
    B, V = 96, 5003
    x = torch.randn(B, V, generator=g) * 3
    temps = torch.rand(B, generator=g) * 1.5 + 0.1
    min_p = torch.rand(B, generator=g) * 0.1
    u = torch.rand(B, generator=g)
    got = native.sample_rows(x, temps, min_p, u)
    assert got.tolist() == generic.sample_rows(x, temps, min_p, u).tolist()
    for b in (0, 41, 95):
        alone = native.sample_rows(x[b : b + 1], temps[b : b + 1], min_p[b : b + 1], u[b : b + 1])
        assert int(alone) == int(got[b])


def test_sample_rows_rejects_bad_parameters(native: ops.Kernels) -> None:
    x = torch.randn(2, 10)
    one, zero = torch.ones(2), torch.zeros(2)
    for temps, min_p, u in ((zero, zero, zero), (one, zero, one), (one, one * 2, zero)):
        with pytest.raises(RuntimeError, match="sample_rows"):
            native.sample_rows(x, temps, min_p, u)
    with pytest.raises(ValueError, match="u has 1 values"):
        native.sample_rows(x, one, zero, torch.zeros(1))
