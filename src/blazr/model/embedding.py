"""QuantizedEmbedding: a token embedding table kept as a GGUF stores it — a `RowTable` of ggml blocks or
16-bit floats, a view of the file's map — whose lookups dequantize only the rows they read
(`ops.embedding_rows`). A float32 copy of the table would cost 4 bytes per entry: 0.4 GB for a 1B model's
49k × 2048 table, 2 GB for a 128k × 4096 one, most of it never read.

Shapes: ids [T] → [T, D] float32.
"""

from __future__ import annotations

import torch
from torch import nn

from blazr.kernels import ops
from blazr.kernels.quant import dequantize
from blazr.kernels.row_table import RowTable


class QuantizedEmbedding(nn.Module):
    def __init__(self, table: RowTable) -> None:
        super().__init__()
        self.table = table
        self.num_embeddings, self.embedding_dim = table.num_rows, table.dim

    @property
    def weight(self) -> torch.Tensor:
        """The whole table dequantized, float32 [V, D] (the reference; never used by the forward)."""
        return dequantize(self.table.rows(torch.arange(self.num_embeddings)))

    def forward(self, ids: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """ids [T] → scale · rows [T, D] float32."""
        return ops.embedding_rows(ids, self.table, scale)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, kind={self.table.kind}"
