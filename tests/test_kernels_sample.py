"""The token-choice kernels (csrc/sample.c) against their torch references, float64 arithmetic and the
token-by-token sampling formulas (tests/sampling_reference.py), on the native build and the portable scalar
one (`lib`), and the two builds against each other bit for bit."""

from __future__ import annotations

import pytest
import torch

from blazr.engine.sampling import SamplingParams
from blazr.kernels import ops
from tests.sampling_reference import reference_distribution

V_SHAPES = [1, 7, 64, 65, 1000, 49152]


def _weights64(x: torch.Tensor, temperature: float, min_p: float, cutoff: bool = True) -> torch.Tensor:
    """The kept weights of one row in float64: exp(t) for t = (x − max) / T, 0 under min-p, and (the
    kernel's formula; not softmax's) 0 for t < −87."""
    x = x.double().nan_to_num(nan=float("-inf"), posinf=torch.finfo(torch.float32).max)
    t = (x - x.max()) / temperature
    e = t.exp()
    return e.masked_fill((e < min_p) | ((t < -87) & cutoff), 0.0)


def _off(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """top_k and top_p that filter nothing."""
    return torch.zeros(n, dtype=torch.int64), torch.ones(n)


def _check_draw(
    x: torch.Tensor, temperature: float, min_p: float, u: float, token: int, cutoff: bool = True
) -> None:
    """`token` is where u · Σe falls in the float64 CDF (to 1e-5 of the mass) and has weight."""
    e = _weights64(x, temperature, min_p, cutoff)
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
    off_k, off_p = torch.zeros(B, dtype=torch.int64), torch.ones(B)
    got = lib.sample_rows(x, temps, min_p, off_k, off_p, u)
    want = ops.sample_rows_reference(x, temps, min_p, off_k, off_p, u)
    for b in range(B):
        _check_draw(x[b], float(temps[b]), float(min_p[b]), float(u[b]), int(got[b]))
        _check_draw(x[b], float(temps[b]), float(min_p[b]), float(u[b]), int(want[b]), cutoff=False)
    assert got[0] == int((_weights64(x[0], float(temps[0]), float(min_p[0])) > 0).nonzero()[0])


def test_sample_rows_frequencies_follow_the_distribution(lib: ops.Kernels) -> None:
    """u on an even grid of 2000 points: each token is drawn p · 2000 times (± 1), min-p's drops never."""
    x = torch.tensor([2.0, 0.0, -1.0, 1.0, -3.0, 0.5, -8.0])
    T, min_p, n = 0.8, 0.01, 2000
    rows = x.expand(n, -1).contiguous()
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    got = lib.sample_rows(rows, torch.full((n,), T), torch.full((n,), min_p), *_off(n), u.float())
    e = _weights64(x, T, min_p)
    counts = torch.bincount(got, minlength=x.numel()).double()
    assert (counts - n * e / e.sum()).abs().max() <= 1.0, counts
    assert counts[6] == 0 and e[6] == 0  # exp(−12.5) < 0.01: min-p drops it


def test_sample_rows_specials(lib: ops.Kernels) -> None:
    """NaN weighs 0; +inf logits share the draw among themselves; a row with nothing above −inf gives 0."""
    n = 400
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(3)) * 0.1  # every kept token ≥ 1/n
    x[0, ::2] = float("nan")
    x[1, 7] = x[1, 31] = float("inf")
    x[2] = float("-inf")
    u = (torch.arange(n) + 0.5) / n
    for row, allowed in ((0, set(range(1, 50, 2))), (1, {7, 31}), (2, {0})):
        rows = x[row].expand(n, -1).contiguous()
        got = lib.sample_rows(rows, torch.ones(n), torch.zeros(n), *_off(n), u)
        assert set(got.tolist()) == allowed, row


RANKED = [
    dict(temperature=0.7, top_k=5, top_p=1.0),
    dict(temperature=1.3, top_p=0.6, top_k=0),
    dict(temperature=0.5, min_p=0.05, top_k=8, top_p=0.9),
    dict(temperature=2.0, top_k=1, top_p=1.0),
    dict(temperature=0.7, top_k=40, top_p=0.9),  # blazr's defaults
]


@pytest.mark.parametrize("kw", RANKED)
@pytest.mark.parametrize("V, scale", [(300, 2.0), (20_000, 0.05), (20_000, 6.0)])
def test_sample_rows_ranked_follows_the_reference_formulas(lib: ops.Kernels, kw: dict, V: int, scale: float):
    """Top-k / top-p rows, u on an even grid of n points: every token drawn is in the token-by-token
    reference's kept set, n · p times (± 1.5; a token of n · p < 1 may not be drawn at all); the torch
    reference (the GPU path) does the same."""
    g = torch.Generator().manual_seed(V + int(scale))
    x = torch.randn(V, generator=g) * scale
    params = SamplingParams(**kw)
    want = reference_distribution(x.tolist(), params)
    n = 1000
    rows = x.expand(n, -1).contiguous()
    args = (
        torch.full((n,), params.temperature), torch.full((n,), params.min_p),
        torch.full((n,), params.top_k, dtype=torch.int64), torch.full((n,), params.top_p),
        ((torch.arange(n, dtype=torch.float64) + 0.5) / n).float(),
    )  # fmt: skip
    for got in (lib.sample_rows(rows, *args), ops.sample_rows_reference(rows, *args)):
        counts = torch.bincount(got, minlength=V)
        assert set(got.tolist()) <= set(want)
        for i, p in want.items():
            assert abs(int(counts[i]) - n * p) <= 1.5, (i, int(counts[i]), n * p)


def test_sample_rows_is_the_same_on_every_build(native: ops.Kernels, other_build: ops.Kernels) -> None:
    """exp and every sum are one fixed sequence of fp32 operations: every build (AVX-512, AVX2, scalar) draws
    the same token for every row, plain or ranked, and a row draws the same alone as inside a batch."""
    g = torch.Generator().manual_seed(7)
    B, V = 96, 5003
    x = torch.randn(B, V, generator=g) * 3
    temps = torch.rand(B, generator=g) * 1.5 + 0.1
    min_p = torch.rand(B, generator=g) * 0.1
    top_k = torch.tensor([0, 40, 1, 0] * (B // 4))
    top_p = torch.tensor([1.0, 0.9, 1.0, 0.5] * (B // 4))
    u = torch.rand(B, generator=g)
    args = (temps, min_p, top_k, top_p, u)
    got = native.sample_rows(x, *args)
    assert got.tolist() == other_build.sample_rows(x, *args).tolist()
    for b in (0, 41, 95):
        alone = native.sample_rows(x[b : b + 1], *(t[b : b + 1] for t in args))
        assert int(alone) == int(got[b])


def test_sample_rows_rejects_bad_parameters(native: ops.Kernels) -> None:
    x = torch.randn(2, 10)
    one, zero, k = torch.ones(2), torch.zeros(2), torch.zeros(2, dtype=torch.int64)
    bad = [
        (zero, zero, k, one, zero),  # temperature 0
        (one, zero, k, one, one),  # u = 1
        (one, one * 2, k, one, zero),  # min_p > 1
        (one, zero, k - 1, one, zero),  # top_k < 0
        (one, zero, k, zero, zero),  # top_p 0
    ]
    for args in bad:
        with pytest.raises(RuntimeError, match="sample_rows"):
            native.sample_rows(x, *args)
    with pytest.raises(ValueError, match="u has 1 values"):
        native.sample_rows(x, one, zero, k, one, torch.zeros(1))
