"""The K-quants' fields (ggml's Q4_K, Q5_K, Q6_K super-blocks of 256 values, as a GGUF stores them) read as
integers and floats in torch — the reference view the kernels (csrc/linear_k.c) are tested against — and
their float32 dequantization in gguf-py's order of operations.

Shapes: N rows, nb = K/256 super-blocks a row; Q4_K 144 B, Q5_K 176 B, Q6_K 210 B a super-block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from blazr.kernels.formats import FORMATS

if TYPE_CHECKING:
    from blazr.kernels.quant import QuantizedWeight

QK_K = 256  # values per K-quant super-block
KQUANT_BYTES = {f.kind: f.block_bytes for f in FORMATS if f.layout == "ggml" and f.block == QK_K}


def _f16_field(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The f16 field at byte `at` of every super-block [n, bytes] as float32 [n, 1]."""
    return blocks[:, at : at + 2].contiguous().view(torch.float16).float()


def k4_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K's 12-byte field [n, 12] → 6-bit scales and mins, uint8 [n, 8] each. Bytes 0-3: scales
    0-3 (low 6 bits) and the top 2 bits of scales 4-7; bytes 4-7: the same for the mins; bytes 8-11: the
    low 4 bits of scales 4-7 (low nibble) and of mins 4-7 (high nibble)."""
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat((d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)), dim=-1)
    mn = torch.cat((m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)), dim=-1)
    return sc, mn


def kquant_fields(
    qw: QuantizedWeight,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """A K-quant weight's values as integers and per-super-block floats: (q [N, nb, 256] int16 in element
    order — Q6_K with its −32 applied —, scales [N, nb, S] int16 per sub-block of 256/S (S = 8, Q6_K 16),
    d [N, nb] f32, and for Q4_K / Q5_K (mins [N, nb, 8] int16, dmin [N, nb] f32) stacked as
    (mins, dmin), else None). w = d·scale·q − dmin·min."""
    n, nb = qw.out_features, qw.in_features // QK_K
    blocks = qw.data.reshape(n * nb, KQUANT_BYTES[qw.kind])
    if qw.kind == "q6_k":
        # ql: 2 halves × (low nibbles of bytes 0-63, then their high nibbles); qh: 2 halves × 4 bit pairs
        ql_shifts = torch.tensor([0, 4], dtype=torch.uint8).view(1, 1, 2, 1)
        ql = ((blocks[:, 0:128].reshape(-1, 2, 1, 64) >> ql_shifts) & 0x0F).reshape(-1, 8, 32)
        qh_shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)
        qh = ((blocks[:, 128:192].reshape(-1, 2, 1, 32) >> qh_shifts) & 3).reshape(-1, 8, 32)
        q = (ql | (qh << 4)).to(torch.int16) - 32
        sc = blocks[:, 192:208].view(torch.int8).to(torch.int16)
        d = _f16_field(blocks, 208)
        return q.reshape(n, nb, QK_K), sc.reshape(n, nb, 16), d.reshape(n, nb), None
    sc, mn = k4_scale_min(blocks[:, 4:16])
    qs = blocks[:, 16:144] if qw.kind == "q4_k" else blocks[:, 48:176]
    q = torch.stack((qs.reshape(-1, 4, 32) & 0x0F, qs.reshape(-1, 4, 32) >> 4), dim=2).reshape(-1, 8, 32)
    if qw.kind == "q5_k":
        shifts = torch.arange(8, dtype=torch.uint8).view(1, 8, 1)
        q = q | (((blocks[:, 16:48].reshape(-1, 1, 32) >> shifts) & 1) << 4)
    d, dmin = _f16_field(blocks, 0).reshape(n, nb), _f16_field(blocks, 2).reshape(n, nb)
    mins = (mn.to(torch.int16).reshape(n, nb, 8), dmin)
    return q.to(torch.int16).reshape(n, nb, QK_K), sc.to(torch.int16).reshape(n, nb, 8), d, mins


def dequantize(qw: QuantizedWeight) -> torch.Tensor:
    """A K-quant weight as float32 [N, K], in gguf.quants' float32 order: d·scale (fp32), times q, minus
    dmin·min — separate ops, no fma."""
    q, sc, d, mins = kquant_fields(qw)
    n, nb = d.shape
    S = sc.shape[-1]
    dl = (d.unsqueeze(-1) * sc.float()).unsqueeze(-1)  # [N, nb, S, 1]
    w = q.float().view(n, nb, S, QK_K // S) * dl
    if mins is not None:
        mn, dmin = mins
        w = w - (dmin.unsqueeze(-1) * mn.float()).unsqueeze(-1)
    return w.reshape(n, qw.in_features)
