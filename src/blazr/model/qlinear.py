"""QuantizedLinear: a linear layer whose weight stays in a kernel weight format (ggml Q4_0 / Q4_1 / Q8_0
blocks, bf16 or f32 — see blazr.kernels.quant), so decode streams 4.5–8.5 bits per weight instead of 32.

The C kernel runs on the quantized bytes (activations quantized to 8 bits per block of 32, as llama.cpp
does) for every token — prefill and decode alike — unless the layer holds `dense`, a 16/32-bit tensor for
the vendor's GEMM at prefill, on request only (loading/loader.py `prefill_dtype`, `BLAZR_PREFILL_DENSE`:
oneDNN's AMX bf16 tiles, at the price of a dequantized copy). With a dense tensor, the path is chosen per
forward, not per row count, so that a token's numerics never depend on what else is in its batch. Every
linear layer is called `layer(x, decode=…)`, the caller passing its batch's `is_decode_only` — the one
mechanism by which attention, MLA, MoE and the linears of one forward pick their decode paths:
- `decode=True` (a decode-only batch): the kernel;
- `decode=False` (prefill) torch's GEMM on `dense`, with rows grouped so that a row's result never depends on
  the other rows of the call. A 16-bit copy runs in fixed tiles of `DENSE_TILE` rows (the last one
  zero-padded): oneDNN picks its bf16 kernel, and its rounding, by M. A float32 copy (or a plain float
  model's own weight, `wrap_float_linears`) runs all rows in one GEMM, padded to at least
  `DENSE_MIN_ROWS`: MKL's sgemm rounds a row identically for every M ≥ 12 and differently below (measured
  on torch 2.13, AVX2, shapes 576-4096 × 768-100352), and one call runs 1.5x faster than 128-row tiles
  (60 vs 39 GFLOP/s at 500 × 768 × 3376 on a 2-core Zen 1).
An output head whose format offers it may run with x kept fp32 (`keep_head_x_fp32`; `exact_x`: Q8_0 as
stored — csrc/linear_q8xf.c widens each weight exactly): the 8-bit rounding of x moves the logits directly
(Gemma 3 270M Q4_K_M against its float model: 780 → 787 of 814 teacher-forced top-1, NOTES §54). It reads as
fast as the int8 kernel at one or two rows and costs fp32 FMAs beyond (16 products an instruction against
VNNI's 64), so `--head-precision auto` takes it only where the engine's head calls hold at most two rows.
`weight` returns the dequantized float32 weight (the reference every path is tested against).
`Linear` is the float layer the model builds (an nn.Linear called the same way, so a forward never asks
which kind of layer the loader left in a place).

Shapes: x [..., K] → [..., N]; qweight [N, K] in its kind's layout; dense [N, K].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from blazr.config import dtype_name
from blazr.kernels import formats, ops
from blazr.kernels.quant import QuantizedWeight, dequantize

DENSE_TILE = 128  # rows per 16-bit dense GEMM call: ~1.25x the cost of one whole-M call, 3x faster than fp32
DENSE_MIN_ROWS = 16  # float32 dense GEMMs run on at least this many rows (sgemm's small-M path rounds apart)


class Linear(nn.Linear):
    """A float linear layer, called as QuantizedLinear is: `layer(x, decode=…, swiglu=…)` (`decode` does not
    change a float layer's path; it is the forward's word to whichever layer the loader leaves here)."""

    def forward(self, x: torch.Tensor, swiglu: bool = False, *, decode: bool) -> torch.Tensor:
        """x [..., K] → [..., N]; with `swiglu`, silu(gate) · up of the [gate; up] halves → [..., N/2]."""
        y = F.linear(x, self.weight, self.bias)
        return ops.activation(y.contiguous(), "silu", gated=True) if swiglu else y


class QuantizedLinear(nn.Module):
    def __init__(
        self, qweight: QuantizedWeight, bias: torch.Tensor | None = None, dense: torch.Tensor | None = None
    ) -> None:
        super().__init__()
        self.qweight = qweight
        self.exact_x = False  # x kept fp32 by the kernel (`keep_head_x_fp32`: an output head)
        self.in_features, self.out_features = qweight.in_features, qweight.out_features
        self.bias = None if bias is None else nn.Parameter(bias.float().contiguous(), requires_grad=False)
        self.register_buffer("dense", dense, persistent=False)

    @property
    def kind(self) -> str:
        return self.qweight.kind

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight [N, K] float32."""
        return dequantize(self.qweight)

    def forward(self, x: torch.Tensor, swiglu: bool = False, *, decode: bool) -> torch.Tensor:
        """x [..., K] → [..., N]; with `swiglu`, silu(gate) · up of the [gate; up] halves → [..., N/2].
        `decode`: the forward's batch is decode-only (the module docstring says what it selects)."""
        if (self.dense is None or decode) and x.dtype == torch.float32 and x.is_cpu:
            kw = {"swiglu": swiglu, "prefill": not decode, "exact_x": self.exact_x}
            return ops.linear(x.contiguous(), self.qweight, self.bias, **kw)
        if self.dense is None:
            y = F.linear(x, self.weight.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
        else:
            y = self._dense_gemm(x)
        if swiglu:  # one pass in the kernel op (torch's silu · mul: three)
            y = ops.activation(y.contiguous(), "silu", gated=True)
        return y

    def _dense_gemm(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] → [..., N] through `dense`: 16-bit in tiles of DENSE_TILE rows, float32 in one call of
        at least DENSE_MIN_ROWS rows (see the module docstring); bias added after."""
        w, K = self.dense, self.in_features
        rows = x.reshape(-1, K).to(w.dtype)
        M = rows.shape[0]
        tile = max(M, DENSE_MIN_ROWS) if w.dtype == torch.float32 else DENSE_TILE
        if pad := -M % tile:
            rows = F.pad(rows, (0, 0, 0, pad))
        y = torch.cat([F.linear(t, w) for t in rows.split(tile)])[:M].to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        dense = "none" if self.dense is None else dtype_name(self.dense.dtype)
        exact = ", exact_x" if self.exact_x else ""
        return f"in={self.in_features}, out={self.out_features}, kind={self.kind}, dense={dense}{exact}"


def keep_head_x_fp32(head: nn.Module | None, exact: bool) -> bool:
    """Put an output head on fp32 x (`exact`: its format's exact_x kernel) or on 8-bit x; returns whether it
    keeps x fp32 now (False for a float head, or a format without the form). Set before any decode plan is
    recorded: the form is fixed for every row the engine computes, whatever its batch."""
    if not isinstance(head, QuantizedLinear):
        return False
    head.exact_x = exact and formats.of(head.kind).exact_x
    return head.exact_x
