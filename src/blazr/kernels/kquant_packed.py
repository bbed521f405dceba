"""Q4_K, Q5_K and Q6_K re-laid in groups of 16 rows (kinds q4_kx, q5_kx, q6_kx): the layout, its torch
references, and when the loader takes it.

A GGUF's K-quant tensors run as stored (kinds q4_k, q5_k, q6_k: csrc/linear_k.c, one row's quants in a
register's lanes). On a kernel build with AVX-512 VNNI the loader re-lays each whole linear weight of those
kinds (on an AVX2 build Q4_K and Q5_K: `packs_on`), and each MoE expert stack (model/moe.py: csrc/moe.c
runs an expert's rows through the same linear kernels), once (`packed_kind` says which; loading/relaid.py):
the same bytes, moved so that 16 rows' quants share a register and vpdpbusd computes 16 rows' dots at once
(csrc/linear_kx.c, whose header gives the layout; here `FIELDS`). A one-row (decode) call then computes
Q4_K 1.8-2.3×, Q5_K 1.7-1.8× and Q6_K 1.5-1.6× faster (hot weights, Zen 5, 2 threads, against the stored
layout's host-tuned form), enough to read the weights at the memory's rate when
that rate is high, where the stored layout falls behind it (a 1B Q4_K_M decode +12-24 %, 4 and 16 sequences
+37 / +49 %: benchmarks/NOTES.md §56): the stored one-row kernel applies each sub-block's scale inside the
integer dot and reduces every row's lanes, ~20 cycles a row and super-block. Without VNNI (AVX2: vpmaddubsw
pairs summed in int16, csrc/linear_kx.c) Q4_K's groups compute 1.4x the stored kernel's rate hot and run
1.04-1.5x at 2-256 rows (Zen 3, NOTES §67); Q6_K's lose there, so that kind stays as stored. The outputs
are the stored kinds' bits at every row count, so packing changes speed only.

Bytes: data uint8 [N/16, 16 · row_bytes] (N a multiple of 16), row_bytes = K/256 · 144 (q4_kx), 176 (q5_kx) or
210 (q6_kx); per group, per super-block, each field of the 16 rows' ggml blocks as [units][16 rows][unit
bytes]. `pack_reference` / `unpack` move them in torch; `pack` in C from row addresses (csrc/linear_kx.c
`blz_pack_kx`, so a GGUF's rows are read once, straight from the file's map). Kept as stored: weights whose
rows do not fill whole groups of 32 (a fused gate|up's halves must each fill groups; in a stack, each
expert's rows), a kmix weight's segments other than K-quants of whole 16-row groups (its K-quant segments —
Q4_K_M's q|k beside a Q6_K v — are re-laid one by one), token tables, a kind the build's group path does not
gain on (`packs_on`; the scalar build would unpack per call), a kind whose stored layout host tuning measured
faster here (`wanted`), or with `BLAZR_KPACK=0` (for A/B measurements; `=1` packs whatever tuning chose).
"""

from __future__ import annotations

import torch

from blazr.kernels import ops, tuning
from blazr.kernels.kquant_fields import KQUANT_BYTES, QK_K
from blazr.kernels.mapped import MappedWeight
from blazr.kernels.quant import KMIX, QuantizedWeight

KX_OF = {"q4_k": "q4_kx", "q5_k": "q5_kx", "q6_k": "q6_kx"}  # stored kind → its 16-row-group kind
BASE_OF = {kx: k for k, kx in KX_OF.items()}
ROWS = 16
# Per base kind, its super-block's fields in packed order: (first byte in the ggml block, units, unit bytes)
# — csrc/linear_kx.c's KX_FIELDS, the same table (the tests compare the two packs byte for byte).
FIELDS: dict[str, tuple[tuple[int, int, int], ...]] = {
    "q4_k": ((0, 1, 2), (2, 1, 2), (4, 3, 4), (16, 32, 4)),  # d, dmin, 3 planes of the scale field, nibbles
    "q5_k": ((0, 1, 2), (2, 1, 2), (4, 3, 4), (16, 8, 4), (48, 32, 4)),  # the same, fifth bits before them
    "q6_k": ((208, 1, 2), (192, 16, 1), (0, 32, 4), (128, 16, 4)),  # d, 16 int8 scales, ql, qh
}
PROBED_AS = {"q5_k": "q4_k"}  # host tuning times q4_k and q6_k; q5_k runs q4_k's walk (csrc/linear_kx.c)
AVX2_PACKS = ("q4_k", "q5_k")  # the kinds re-laid on AVX2 builds without VNNI (csrc/linear_kx.c's AVX2 path)
PACK_MULTIPLE = 32  # rows the loader's packing needs (a SwiGLU weight's halves each fill groups of 16)


def _check(base: str, blocks: torch.Tensor, n: int, k: int) -> None:
    if base not in FIELDS or n % ROWS or k <= 0 or k % QK_K:
        raise ValueError(f"kquant_packed: kind {base!r} [{n}, {k}]: a K-quant with N a multiple of {ROWS} "
                         f"and K of {QK_K} expected")  # fmt: skip
    if blocks.dtype != torch.uint8 or blocks.numel() != n * (k // QK_K) * KQUANT_BYTES[base]:
        raise ValueError(f"kquant_packed: {base} blocks of [{n}, {k}]: expected "
                         f"{n * (k // QK_K) * KQUANT_BYTES[base]} uint8 bytes, found {blocks.numel()} "
                         f"{blocks.dtype}")  # fmt: skip


def pack_reference(base: str, blocks: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """ggml rows of `base` (uint8, N · row_bytes bytes) → uint8 [N/16, 16 · row_bytes] in the group layout."""
    _check(base, blocks, n, k)
    g, nb, bb = n // ROWS, k // QK_K, KQUANT_BYTES[base]
    src = blocks.reshape(g, ROWS, nb, bb)
    parts = [
        src[..., s : s + units * size].reshape(g, ROWS, nb, units, size).permute(0, 2, 3, 1, 4)
        for s, units, size in FIELDS[base]
    ]
    parts = [p.reshape(g, nb, -1) for p in parts]
    return torch.cat(parts, dim=-1).reshape(g, ROWS * nb * bb)


def unpack(kind: str, data: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The inverse of `pack_reference`: a q4_kx / q5_kx / q6_kx weight's bytes → ggml rows uint8
    [N, row_bytes]."""
    base = BASE_OF[kind]
    g, nb, bb = n // ROWS, k // QK_K, KQUANT_BYTES[base]
    src = data.reshape(g, nb, ROWS * bb)
    out = torch.empty(g, ROWS, nb, bb, dtype=torch.uint8)
    at = 0
    for s, units, size in FIELDS[base]:
        part = src[..., at : at + units * ROWS * size].reshape(g, nb, units, ROWS, size)
        out[..., s : s + units * size] = part.permute(0, 3, 1, 2, 4).reshape(g, ROWS, nb, units * size)
        at += units * ROWS * size
    return out.reshape(n, nb * bb)


def pack(qw: QuantizedWeight) -> QuantizedWeight:
    """A K-quant weight (N a multiple of 16; a MappedWeight too, read through its row table) re-laid in
    16-row groups (q4_k → q4_kx …): by the C kernel from its rows' addresses when the library is loaded and
    the bytes are on the CPU, else `pack_reference`. A kmix weight: its segments that `_packs` each re-laid
    (a kmix again, csrc/linear_mix.c running it segment by segment)."""
    if qw.kind == KMIX:
        return QuantizedWeight.from_parts([pack(p) if _packs(p) else p for p in qw.parts()])
    n, k = qw.out_features, qw.in_features
    mapped = isinstance(qw, MappedWeight)
    lib = ops.kernels() if mapped or qw.data.is_cpu else None
    if lib is None:
        _check(qw.kind, qw.data, n, k)
        data = pack_reference(qw.kind, qw.data, n, k)
    elif mapped:
        data = lib.pack_kx(qw.kind, qw.rows, n, k)
    else:
        _check(qw.kind, qw.data, n, k)
        rows = qw.data.data_ptr() + qw.data.shape[1] * torch.arange(n, dtype=torch.int64)
        data = lib.pack_kx(qw.kind, rows, n, k)
    return QuantizedWeight(KX_OF[qw.kind], data, n, k)


def packed_kind(qw: QuantizedWeight, num_stacked: int = 1) -> str | None:
    """The kind the loader re-lays `qw` into — a K-quant (as a view of the file, a gathered copy or a row
    table) on the CPU, whose kind this host packs (`wanted`) and which fills whole groups of PACK_MULTIPLE
    rows, each of its `num_stacked` weights stacked one after another (MoE experts: [E·N, K], each expert's
    N rows then whole groups of the stack, so an expert still starts at e · N · row_bytes) — or None."""
    if qw.kind == KMIX:  # fused parts of different kinds (Q4_K_M's q|k beside a Q6_K v): each K-quant part
        return KMIX if num_stacked == 1 and any(_packs(p) for p in qw.parts()) else None
    rows = qw.out_features // num_stacked
    if qw.kind not in KX_OF or qw.out_features % num_stacked or rows % PACK_MULTIPLE or not wanted(qw.kind):
        return None
    if not isinstance(qw, MappedWeight) and not qw.data.is_cpu:
        return None
    return KX_OF[qw.kind]


def layout(qw: QuantizedWeight, num_stacked: int = 1) -> tuple[str, ...]:
    """The kinds of `qw`'s parts as the loader would re-lay them on this host now (one part unless kmix) —
    what a cached re-laid copy must hold to be used: host tuning may since have changed its choice."""
    if qw.kind == KMIX:
        return tuple(KX_OF[p.kind] if _packs(p) else p.kind for p in qw.parts())
    return (packed_kind(qw, num_stacked) or qw.kind,)


def _packs(part: QuantizedWeight) -> bool:
    """Whether a kmix weight's segment is re-laid: a K-quant of whole 16-row groups whose kind this host packs
    (the segments' dots are computed apart, so a SwiGLU's halves need no more than that)."""
    return part.kind in KX_OF and part.out_features % ROWS == 0 and wanted(part.kind)


def wanted(kind: str) -> bool:
    """Whether the loader re-lays stored K-quant `kind` in groups on this host: never where the library has
    no group path for it that gains (`packs_on`; the scalar build would unpack per call); else `BLAZR_KPACK`
    (0 / 1) when set, else host tuning's choice (kernels/tuning.py `kpack_q4_k` / `kpack_q6_k`, q5_k following
    q4_k's walk; the groups unless the stored layout read faster there), else yes."""
    lib = ops.kernels()
    if lib is None or not packs_on(kind, lib.features):
        return False
    return tuning.takes("BLAZR_KPACK", f"kpack_{PROBED_AS.get(kind, kind)}", "groups", default="groups")


def packs_on(kind: str, features: list[str]) -> bool:
    """Whether a library with SIMD `features` may run stored K-quant `kind` in groups: every kind with the
    VNNI path; on AVX2 without it Q4_K and Q5_K (`AVX2_PACKS`), whose groups run their vpmaddubsw dots in
    int16 runs, where Q6_K's do not gain on its stored kernel."""
    return "avx512_vnni" in features or ("avx2" in features and kind in AVX2_PACKS)
