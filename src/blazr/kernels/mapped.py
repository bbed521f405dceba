"""MappedWeight: a linear weight whose rows stay where a checkpoint's memory map holds them.

A GGUF file stores tensors sorted by name, so the parts of a fused weight lie apart (ffn_gate and ffn_up
with ffn_norm between them). Gathering those rows into one tensor is a copy the size of the weight into
fresh memory; on the 1B Q8_0 GGUF that was 0.2 s of a 0.6 s load, nearly all of it first-touch page faults
(benchmarks/NOTES.md §34). A MappedWeight keeps the rows in place and gives the kernels a row table instead
— int64 [N], the address of each row's bytes, in any order — which q8_0g, mxfp4, q5_0, the K-quants, f16 and
bf16 read through the BLZ_ROWS flag (csrc/blazr_kernels.h). The loader uses it where a weight is a few runs of
rows (loading/stored.py MAX_MAPPED_RUNS): rows in another order, such as q / k rows un-permuted for rope,
read slower through the table than gathered.

Everything else sees an ordinary QuantizedWeight: `data` is the rows gathered into one [N, row_bytes]
tensor (or [N, K] f16 / bf16), made on first use and kept — the reference paths, dequantize, tests and any
code that slices bytes get exactly the bytes the kernels read. The bytes must stay mapped: `holder`, a view of
the map that spans every row, keeps the mapping alive as long as the weight.
"""

from __future__ import annotations

import logging

import torch

from blazr.kernels import ops
from blazr.kernels.quant import FLOAT_KINDS, GGML_BLOCK_KINDS, KQUANT_BYTES, QuantizedWeight, row_bytes

log = logging.getLogger(__name__)

MAPPED_KINDS = (*GGML_BLOCK_KINDS, *KQUANT_BYTES, "f16", "bf16")  # the kinds whose kernels take a row table


class MappedWeight(QuantizedWeight):
    """A `kind` weight [out_features, in_features] whose row n is `row_bytes(kind, in_features)` bytes at
    address rows[n], inside the mapped tensor `holder`."""

    rows: torch.Tensor
    holder: torch.Tensor

    def __init__(
        self, kind: str, rows: torch.Tensor, holder: torch.Tensor, out_features: int, in_features: int
    ) -> None:
        if kind not in MAPPED_KINDS:
            raise ValueError(f"mapped weight of kind {kind!r}: expected one of {MAPPED_KINDS}")
        step = row_bytes(kind, in_features)
        if rows.dtype != torch.int64 or tuple(rows.shape) != (out_features,) or rows.device.type != "cpu":
            raise ValueError(
                f"mapped {kind} weight: int64 CPU row addresses [{out_features}] expected, found "
                f"{rows.dtype} {list(rows.shape)}"
            )
        lo, hi = holder.data_ptr(), holder.data_ptr() + holder.numel() * holder.element_size()
        if out_features and (int(rows.min()) < lo or int(rows.max()) + step > hi):
            raise ValueError(f"mapped {kind} weight: a row lies outside the mapped tensor that holds it")
        fields = {"kind": kind, "out_features": out_features, "in_features": in_features,
                  "rows": rows.contiguous(), "holder": holder, "_gathered": None}  # fmt: skip
        for name, value in fields.items():  # a frozen dataclass: set past its __setattr__
            object.__setattr__(self, name, value)

    @property
    def data(self) -> torch.Tensor:  # type: ignore[override]
        """The rows gathered into one tensor (uint8 [N, row_bytes], f16 / bf16 [N, K]), made on first use: for
        the code that reads a weight's bytes (references, dequantize, slicing); the kernels never need it."""
        if self._gathered is None:
            log.debug("mapped %s weight [%d, %d]: rows gathered for a reader of its bytes", self.kind,
                      self.out_features, self.in_features)  # fmt: skip
            object.__setattr__(self, "_gathered", self.gather())
        return self._gathered  # type: ignore[return-value]

    def gather(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows start..stop gathered into fresh memory (uint8 [n, row_bytes], f16 / bf16 [n, K]), not kept:
        for a reader of some rows at a time (kernels/coded.py `as_bf16`), where `data` keeps all of them."""
        rows, step = self.rows[start:stop], row_bytes(self.kind, self.in_features)
        k = ops.kernels()
        if k is not None:
            raw = k.gather_rows(rows, step)
        else:
            base = self.holder.data_ptr()
            flat = self.holder.view(torch.uint8).reshape(-1)
            raw = torch.stack([flat[a - base : a - base + step] for a in rows.tolist()])
        if self.kind in FLOAT_KINDS:
            raw = raw.view(FLOAT_KINDS[self.kind]).reshape(rows.numel(), self.in_features)
        return raw

    @property
    def nbytes(self) -> int:
        return self.out_features * row_bytes(self.kind, self.in_features)

    def __repr__(self) -> str:
        return f"MappedWeight({self.kind}, [{self.out_features}, {self.in_features}])"
