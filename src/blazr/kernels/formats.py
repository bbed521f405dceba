"""Weight formats: every kind of weight the kernels run, with all that the rest of blazr needs to know of it —
its layout, its block geometry, its codes in the C library (csrc/blazr_kernels.h's enums), the GGML type
whose values it holds, the kind a GGUF tensor of those values runs as when kept as stored, the token-table
row code, the torch dtype of a float kind. One table: kernels/quant.py (the byte layouts and references),
the bindings, the GGUF loaders and the command line take their lists from it, and tests/test_formats.py
checks its codes against the C header, so a format added here and there is a format everywhere.

Layouts: `packed` — ggml's 32-weight blocks re-laid in 16-row groups for the kernel (csrc/linear_q.c);
`ggml` — ggml's bytes as a GGUF stores them, row after row (Q8_0 as stored, the K-quants, MXFP4, Q5_0);
`kpacked` — a GGUF's Q4_K / Q5_K / Q6_K re-laid at load in 16-row groups (csrc/linear_kx.c,
kernels/kquant_packed.py): the stored kinds' values and bits, vpdpbusd across rows at every row count;
`mixed` — a fused weight of row segments of different `ggml` kinds with one K (a 64-byte segment table, then
each part);
`coded` — bf16 / f32 weights with their top byte coded in 4 bits, lossless (csrc/linear_coded.c,
kernels/coded.py): rows of 32 bytes of tables, a few escapes, 96 (f32: 224) bytes per 64 weights;
`float` — a torch tensor of the dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Layout = Literal["packed", "ggml", "kpacked", "mixed", "coded", "float"]

# csrc/blazr_kernels.h: the packed call's linear op codes (BLZ_OP_LINEAR_*)
OP_LINEAR_Q, OP_LINEAR_F32, OP_LINEAR_BF16, OP_LINEAR_F16 = 1, 2, 3, 18
# csrc/blazr_kernels.h: element types of cache pools and float rows (BLZ_KV_F32 / BF16 / F16)
ELEMENT_CODES: dict[torch.dtype, int] = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


@dataclass(frozen=True)
class WeightFormat:
    """One weight kind. `c_kind`: blz_linear_q's kind code (BLZ_Q4_0 …), 0 for float kinds (which have linear
    ops of their own, `op`); `row_code`: blz_embedding_q's row type for a token table kept in this format
    (None: not a table format); `ggml`: the GGML type whose values it holds; `as_stored`: a GGUF tensor of
    those values, kept as stored, runs as this kind (Q8_0 → q8_0g; the K-quants and 16-bit floats as
    themselves); `block` / `block_bytes`: values and bytes per block (a float kind: 1 and its element
    size); `exact_x`: its linear kernel also runs with x kept fp32 and each weight widened exactly
    (blz_linear_q's BLZ_XF32 flag: an output head's form)."""

    kind: str
    layout: Layout
    block: int
    block_bytes: int
    c_kind: int
    op: int
    row_code: int | None = None
    ggml: str | None = None
    as_stored: bool = False
    dtype: torch.dtype | None = None
    exact_x: bool = False

    @property
    def c_name(self) -> str:
        """The C enum constant of its kind code (blazr_kernels.h)."""
        return "BLZ_" + self.kind.upper()


FORMATS: tuple[WeightFormat, ...] = (
    WeightFormat("q4_0", "packed", 32, 18, 0, OP_LINEAR_Q, row_code=0, ggml="Q4_0", as_stored=True),
    WeightFormat("q4_1", "packed", 32, 20, 1, OP_LINEAR_Q, row_code=1, ggml="Q4_1", as_stored=True),
    WeightFormat("q8_0", "packed", 32, 34, 2, OP_LINEAR_Q, row_code=2, ggml="Q8_0"),
    WeightFormat("q8_0g", "ggml", 32, 34, 9, OP_LINEAR_Q, ggml="Q8_0", as_stored=True, exact_x=True),
    WeightFormat("q4_k", "ggml", 256, 144, 3, OP_LINEAR_Q, row_code=3, ggml="Q4_K", as_stored=True),
    WeightFormat("q5_k", "ggml", 256, 176, 4, OP_LINEAR_Q, row_code=4, ggml="Q5_K", as_stored=True),
    WeightFormat("q6_k", "ggml", 256, 210, 5, OP_LINEAR_Q, row_code=5, ggml="Q6_K", as_stored=True),
    WeightFormat("kmix", "mixed", 256, 0, 6, OP_LINEAR_Q),
    WeightFormat("q4_kx", "kpacked", 256, 144, 12, OP_LINEAR_Q),
    WeightFormat("q5_kx", "kpacked", 256, 176, 14, OP_LINEAR_Q),
    WeightFormat("q6_kx", "kpacked", 256, 210, 13, OP_LINEAR_Q),
    WeightFormat("mxfp4", "ggml", 32, 17, 10, OP_LINEAR_Q, ggml="MXFP4", as_stored=True),
    WeightFormat("q5_0", "ggml", 32, 22, 11, OP_LINEAR_Q, row_code=11, ggml="Q5_0", as_stored=True),
    WeightFormat("bf16z", "coded", 64, 96, 15, OP_LINEAR_Q, row_code=15),
    WeightFormat("f32z", "coded", 64, 224, 16, OP_LINEAR_Q, row_code=16),
    WeightFormat("bf16", "float", 1, 2, 0, OP_LINEAR_BF16, row_code=8, ggml="BF16", as_stored=True,
                 dtype=torch.bfloat16),
    WeightFormat("f16", "float", 1, 2, 0, OP_LINEAR_F16, row_code=7, ggml="F16", as_stored=True,
                 dtype=torch.float16),
    WeightFormat("f32", "float", 1, 4, 0, OP_LINEAR_F32, ggml="F32", as_stored=True, dtype=torch.float32),
)  # fmt: skip
BY_KIND: dict[str, WeightFormat] = {f.kind: f for f in FORMATS}


def of(kind: str) -> WeightFormat:
    """The format of `kind` (ValueError naming the known kinds)."""
    try:
        return BY_KIND[kind]
    except KeyError:
        raise ValueError(f"unknown weight kind {kind!r} (known: {', '.join(BY_KIND)})") from None


def kinds(layout: Layout) -> tuple[str, ...]:
    """The kinds of one layout, in table order."""
    return tuple(f.kind for f in FORMATS if f.layout == layout)


def value_kind(ggml_type: str) -> str | None:
    """The kind whose values a GGML tensor type holds (its `quantize` / packed form for Q8_0), or None."""
    return next((f.kind for f in FORMATS if f.ggml == ggml_type and f.layout != "ggml"), None) or next(
        (f.kind for f in FORMATS if f.ggml == ggml_type), None
    )


def stored_kind(ggml_type: str) -> str | None:
    """The kind a GGUF tensor of `ggml_type` runs as when its bytes are kept as stored, or None."""
    return next((f.kind for f in FORMATS if f.ggml == ggml_type and f.as_stored), None)
