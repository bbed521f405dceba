"""Helpers shared by the kernel equivalence tests (tests/test_kernels*.py, tests/test_kquant.py,
tests/block32_checks.py): the fp32 rounding constants (`U`, `gamma`), awkward random weights (`_weights`),
the linear kernels' error bounds (`_act_error_bound`, `_check_linear`) and epilogues (`EPILOGUES`,
`_epilogue`), and the values a host-tuning knob takes on a build (`_knob_values`). Moved out of
tests/test_kernels.py.

Tolerances are derived, not guessed:

- fp32 summation of n terms is within γ_n·Σ|terms| of exact (γ_n = n·u/(1 − n·u), u = 2⁻²⁴);
- the block-quantized kernels quantize x to 8 bits per block of 32 with the scale rounded to fp16:
  x̂ = fp16(dx)·q, dx = amax_block/127, so |x − x̂| ≤ dx·(½ + 2⁻¹⁶) + 127·max(2⁻¹¹·dx, 2⁻²⁵) (the 2⁻¹⁶
  covers rounding x·(127/amax) in fp32, the last term the fp16 scale), and against the dequantized fp32
  reference |Δy| ≤ Σ_blocks that bound · Σ_block |w| plus rounding;
- against `int8_dot_reference` (the same integer algorithm in exact arithmetic) only fp32 rounding remains;
- 16-bit float weights (f16, bf16) are widened exactly and x is used as given: only fp32 rounding remains.
"""

from __future__ import annotations

import gguf
import torch
import torch.nn.functional as F

from blazr.kernels import ops, tuning
from blazr.kernels.quant import BLOCK_KINDS

U = 2.0**-24  # fp32 unit roundoff
GGML = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
        "q4_1": gguf.GGMLQuantizationType.Q4_1}  # fmt: skip


# The 32-block kinds the linear kernels run: row-packed, and Q8_0 as a GGUF stores it (q8_0g).
LINEAR_BLOCK_KINDS = (*BLOCK_KINDS, "q8_0g")


def gamma(n: int) -> float:
    return n * U / (1 - n * U)


def _weights(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Random weights with the awkward blocks: all zero, constant, ties for the max |w|, wide range."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.logspace(-3, 1, n).unsqueeze(1)
    w[0, :32] = 0
    w[1, 32:64] = 0.25
    w[2, :32] = torch.tensor([1.0, -1.0] * 16)
    return w


def _act_error_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Σ_blocks (per-element bound of |x − x̂|)·Σ_block |w|: the largest |x̂·w − x·w| from 8-bit block
    activations with fp16 block scales (module docstring)."""
    M, K = x.shape
    dx = x.reshape(M, K // 32, 32).abs().amax(-1).double() / 127
    dx = dx * (0.5 + 2.0**-16) + 127 * torch.clamp(dx * 2.0**-11, min=2.0**-25)  # [M, nb]
    wabs = w.abs().double().reshape(w.shape[0], K // 32, 32).sum(-1)  # [N, nb]
    return dx @ wabs.T


def _swiglu_bound(gate: torch.Tensor, up: torch.Tensor, dg: torch.Tensor, du: torch.Tensor) -> torch.Tensor:
    """Bound on |silu(g')·u' − silu(g)·u| given |g' − g| ≤ dg, |u' − u| ≤ du (|silu'| ≤ 1.1)."""
    return 1.1 * dg * (up.abs() + du) + F.silu(gate).abs() * du


def _check_linear(
    y: torch.Tensor,
    exact: torch.Tensor,
    err: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    swiglu: bool,
) -> None:
    """y: kernel output; exact: float64 x·Wᵀ of what the kernel should compute; err: bound on |Δ| of it."""
    exact = exact + (0 if bias is None else bias.double())
    if swiglu:
        gate, up = exact.chunk(2, -1)
        dg, du = err.chunk(2, -1)
        want, tol = F.silu(gate) * up, _swiglu_bound(gate, up, dg, du) + 4 * U * (F.silu(gate) * up).abs()
    else:
        want, tol = exact, err + 2 * U * exact.abs()
        if residual is not None:
            want, tol = want + residual.double(), tol + 2 * U * (want.abs() + residual.abs())
    bad = (y.double() - want).abs() > tol + 1e-30
    assert not bad.any(), (
        f"{int(bad.sum())} outputs out of bound, worst excess {((y.double() - want).abs() - tol).max()}"
    )


EPILOGUES = ["plain", "bias+residual", "swiglu"]


def _epilogue(name: str, M: int, N: int, g: torch.Generator):
    bias = torch.randn(N, generator=g) if name != "plain" else None
    residual = torch.randn(M, N, generator=g) * 10 if name == "bias+residual" else None
    return bias, residual, name == "swiglu"


def _knob_values(lib: ops.Kernels, knob: str) -> list[int]:
    """The values of a host-tuning knob this build takes (kernels/tuning.py's candidates)."""
    values = []
    for v in next(k for k in tuning.KNOBS if k.name == knob).values:
        try:
            with lib.tuned(**{knob: v}):
                values.append(v)
        except ValueError:
            pass
    return values
