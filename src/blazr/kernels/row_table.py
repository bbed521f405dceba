"""`RowTable`: an embedding table kept as a GGUF stores it — ggml blocks (block kinds, K-quants) or 16-bit
floats, row by row, no repack: a view of the file's map — for lookups that dequantize only the rows they read
(`ops.embedding_rows`, csrc/dequantize.c `blz_embedding_q`).

Shapes: a table [V, D] is uint8 [V, row_bytes(kind, D)].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from blazr.kernels.quant import (
    BLOCK_KINDS,
    CODED_KINDS,
    FLOAT_KINDS,
    K_KINDS,
    Q5_0,
    QuantizedWeight,
    row_bytes,
)

# Kinds a RowTable can hold: ggml's row layouts that the embedding kernel dequantizes in place, and coded rows
# (kernels/coded.py: a tied head's own bytes, decoded).
ROW_KINDS = (*BLOCK_KINDS, Q5_0, *K_KINDS, "f16", "bf16", *CODED_KINDS)


@dataclass(frozen=True, eq=False)
class RowTable:
    """An embedding table [V, D] in a GGUF's own row layout: `data` uint8 [V, row_bytes], each row D/32
    ggml blocks (block kinds), D/256 super-blocks (K-quants) or D 16-bit floats (f16 / bf16)."""

    kind: str
    data: torch.Tensor
    num_rows: int
    dim: int

    def __post_init__(self) -> None:
        if self.kind not in ROW_KINDS:
            raise ValueError(f"row table kind {self.kind!r}: expected one of {ROW_KINDS}")
        want = (self.num_rows, row_bytes(self.kind, self.dim))
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != want or not self.data.is_contiguous():
            raise ValueError(
                f"{self.kind} row table [{self.num_rows}, {self.dim}]: expected contiguous uint8 "
                f"{list(want)}, found {self.data.dtype} {list(self.data.shape)}"
            )

    def rows(self, ids: torch.Tensor) -> QuantizedWeight:
        """Rows `ids` [T] as a weight [T, D] of this kind (`dequantize` gives their float32 values)."""
        picked, t = self.data[ids], ids.numel()
        if self.kind in FLOAT_KINDS:
            return QuantizedWeight(self.kind, picked.view(FLOAT_KINDS[self.kind]), t, self.dim)
        if self.kind in CODED_KINDS:
            return QuantizedWeight(self.kind, picked, t, self.dim)
        return QuantizedWeight.from_blocks(self.kind, picked, t, self.dim)
