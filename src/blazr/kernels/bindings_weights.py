"""The weight-format kernels' bindings, mixed into `Kernels` (bindings.py): direct calls at load time, never
recorded — ggml blocks packed into the kernels' row groups (`pack_blocks`, `pack_rows`), dequantized
(`dequantize_blocks`), and float weights quantized straight into that layout (`quantize_blocks`,
`quantize_rows`). Also the C codes of weight kinds and element types that every binding passes."""

from __future__ import annotations

import ctypes

import torch

from blazr.kernels.calls import _F32, UnsupportedInput, _check
from blazr.kernels.formats import ELEMENT_CODES, FORMATS
from blazr.kernels.hugepages import empty_huge
from blazr.kernels.quant import (
    BLOCK_BYTES,
    KQUANT_BYTES,
    MXFP4,
    Q5_0,
    Q8_0G,
    QK,
    ROW_GROUP,
    check_blocks,
    check_kquant_blocks,
    check_quantize,
    row_bytes,
)

_KIND_CODES = {f.kind: f.c_kind for f in FORMATS}  # blz_linear_q / pack / quantize kind codes


def declare_weight_calls(lib: ctypes.CDLL) -> None:
    """The ctypes signatures of the weight-format entry points."""
    lib.blz_pack_blocks.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                    ctypes.c_void_p, ctypes.c_int]  # fmt: skip
    lib.blz_pack_blocks.restype = ctypes.c_int
    lib.blz_quantize_blocks.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]  # fmt: skip
    lib.blz_quantize_blocks.restype = ctypes.c_int
    lib.blz_quantize_rows.argtypes = lib.blz_quantize_blocks.argtypes
    lib.blz_quantize_rows.restype = ctypes.c_int
    lib.blz_pack_rows.argtypes = lib.blz_pack_blocks.argtypes
    lib.blz_pack_rows.restype = ctypes.c_int
    lib.blz_dequantize_blocks.argtypes = lib.blz_pack_blocks.argtypes
    lib.blz_dequantize_blocks.restype = ctypes.c_int
    lib.blz_gather_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                    ctypes.c_int]  # fmt: skip
    lib.blz_gather_rows.restype = ctypes.c_int
    lib.blz_pack_kx.argtypes = lib.blz_pack_blocks.argtypes
    lib.blz_pack_kx.restype = ctypes.c_int
    lib.blz_pack_coded.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                                   ctypes.c_void_p, ctypes.c_int]  # fmt: skip
    lib.blz_pack_coded.restype = ctypes.c_int64


def _rows_out(op: str, kind: str, rows: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """Check the arguments of a kernel that reads a weight's rows by address; its packed output [G, 16 ·
    row_bytes] (uninitialised)."""
    if kind not in (*BLOCK_BYTES, Q8_0G) or in_features <= 0 or in_features % QK:
        raise ValueError(f"{op}: kind {kind!r} with in_features {in_features}: a block kind and a positive "
                         f"multiple of {QK} expected")  # fmt: skip
    if rows.dtype != torch.int64 or rows.dim() != 1 or rows.numel() != out_features or not rows.is_cpu:
        raise ValueError(f"{op}: int64 CPU row addresses [{out_features}] expected, found {rows.dtype} "
                         f"{list(rows.shape)}")  # fmt: skip
    return _blocks_out(kind, out_features, in_features)


def _blocks_out(kind: str, out_features: int, in_features: int) -> torch.Tensor:
    """The uninitialised bytes of a `kind` weight [N, K]: row-packed [G, 16 · row_bytes], or q8_0g's ggml
    rows [N, row_bytes]."""
    if kind == Q8_0G:
        return empty_huge(out_features, row_bytes(kind, in_features), dtype=torch.uint8)
    groups = -(-out_features // ROW_GROUP)
    return empty_huge(groups, ROW_GROUP * row_bytes(kind, in_features), dtype=torch.uint8)


class WeightFormatBindings:
    """`pack_blocks`, `pack_rows`, `pack_kx`, `gather_rows`, `dequantize_blocks`, `quantize_blocks`,
    `quantize_rows`; uses the `lib` of the Kernels it is mixed into."""

    lib: ctypes.CDLL

    def pack_blocks(
        self, kind: str, blocks: torch.Tensor, out_features: int, in_features: int
    ) -> torch.Tensor:
        """`quant.pack_blocks` in C (a direct call, never recorded): ggml-ordered blocks of a block kind
        (N · row_bytes uint8 CPU bytes, any shape) → uint8 [G, 16 · row_bytes], as
        `pack_blocks_reference`."""
        check_blocks(kind, blocks, out_features, in_features)
        if not blocks.is_cpu:
            raise UnsupportedInput("pack_blocks: the blocks are not on the CPU")
        src = blocks.contiguous()
        g = -(-out_features // ROW_GROUP)
        out = empty_huge(g, ROW_GROUP * in_features // QK * BLOCK_BYTES[kind], dtype=torch.uint8)
        rc = self.lib.blz_pack_blocks(_KIND_CODES[kind], src.data_ptr(), out_features, in_features,
                                      out.data_ptr(), torch.get_num_threads())  # fmt: skip
        _check(rc, "pack_blocks")
        return out

    def pack_rows(self, kind: str, rows: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
        """`pack_blocks` of a weight whose rows lie anywhere: `rows` int64 [N] holds the address of each row's
        ggml blocks (row_bytes each; the caller keeps that memory alive for the call) → uint8
        [G, 16 · row_bytes], as `pack_blocks_reference` of the gathered rows."""
        out, rows = _rows_out("pack_rows", kind, rows, out_features, in_features), rows.contiguous()
        rc = self.lib.blz_pack_rows(_KIND_CODES[kind], rows.data_ptr(), out_features, in_features,
                                    out.data_ptr(), torch.get_num_threads())  # fmt: skip
        _check(rc, "pack_rows")
        return out

    def pack_kx(self, kind: str, rows: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
        """A q4_k / q5_k / q6_k weight's ggml rows, `rows` int64 [N] their addresses (the caller keeps that
        memory alive for the call), re-laid in 16-row groups → uint8 [N/16, 16 · row_bytes], as
        kernels/kquant_packed.py's `pack_reference` of the gathered rows (csrc/linear_kx.c `blz_pack_kx`)."""
        bad_shape = out_features % ROW_GROUP or in_features <= 0 or in_features % 256
        if kind not in KQUANT_BYTES or bad_shape:
            raise ValueError(f"pack_kx: kind {kind!r} [{out_features}, {in_features}]: a K-quant with N a "
                             f"multiple of {ROW_GROUP} and K of 256 expected")  # fmt: skip
        if rows.dtype != torch.int64 or rows.dim() != 1 or rows.numel() != out_features or not rows.is_cpu:
            raise ValueError(f"pack_kx: int64 CPU row addresses [{out_features}] expected, found "
                             f"{rows.dtype} {list(rows.shape)}")  # fmt: skip
        rows = rows.contiguous()
        groups, size = out_features // ROW_GROUP, ROW_GROUP * row_bytes(kind, in_features)
        out = empty_huge(groups, size, dtype=torch.uint8)
        rc = self.lib.blz_pack_kx(_KIND_CODES[kind], rows.data_ptr(), out_features, in_features,
                                  out.data_ptr(), torch.get_num_threads())  # fmt: skip
        _check(rc, "pack_kx")
        return out

    def pack_coded(self, w: torch.Tensor) -> torch.Tensor | None:
        """A bf16 or f32 weight [N, K] (CPU) with its top byte coded (kernels/coded.py, csrc/linear_coded.c
        `blz_pack_coded`) → uint8 [N, row_bytes(K)], `pack_reference`'s bytes; None when a row has more rare
        top bytes than its escape slots hold."""
        from blazr.kernels.coded import codable_shape
        from blazr.kernels.coded import row_bytes as coded_row_bytes

        if (
            w.dtype not in (torch.bfloat16, _F32)
            or w.dim() != 2
            or not w.is_cpu
            or not codable_shape(w.shape[1])
        ):
            raise ValueError(f"pack_coded: a CPU bf16 / f32 weight [N, K], K a multiple of 64 below 65536 "
                             f"expected; found {w.dtype} {list(w.shape)}")  # fmt: skip
        w, f32 = w.contiguous(), int(w.dtype == _F32)
        n, k = w.shape
        out = empty_huge(n, coded_row_bytes(k, "f32z" if f32 else "bf16z"), dtype=torch.uint8)
        over = self.lib.blz_pack_coded(w.data_ptr(), n, k, f32, out.data_ptr(), torch.get_num_threads())
        _check(min(int(over), 0), "pack_coded")
        return out if over == 0 else None

    def gather_rows(self, rows: torch.Tensor, row_bytes: int) -> torch.Tensor:
        """Rows of `row_bytes` bytes each from the addresses `rows` (int64 [N]; the caller keeps that memory
        alive for the call) → uint8 [N, row_bytes], in order (OpenMP over rows)."""
        if rows.dtype != torch.int64 or rows.dim() != 1 or not rows.is_cpu or row_bytes <= 0:
            raise ValueError(f"gather_rows: int64 CPU row addresses [N] and row_bytes > 0 expected, found "
                             f"{rows.dtype} {list(rows.shape)}, {row_bytes}")  # fmt: skip
        rows = rows.contiguous()
        out = empty_huge(rows.numel(), row_bytes, dtype=torch.uint8)
        rc = self.lib.blz_gather_rows(rows.data_ptr(), rows.numel(), row_bytes, out.data_ptr(),
                                      torch.get_num_threads())  # fmt: skip
        _check(rc, "gather_rows")
        return out

    def dequantize_blocks(
        self, kind: str, blocks: torch.Tensor, out_features: int, in_features: int
    ) -> torch.Tensor:
        """ggml-ordered blocks of a block kind (N · row_bytes uint8 CPU bytes, any shape) → float32 [N, K],
        as loading/gguf.py's torch dequantizers and `gguf.quants.dequantize`; also the K-quant kinds
        (K/256 super-blocks a row), mxfp4 and q5_0."""
        if kind in KQUANT_BYTES:
            check_kquant_blocks(kind, blocks, out_features, in_features)
        elif kind in (MXFP4, Q5_0):
            want = out_features * row_bytes(kind, in_features)
            if blocks.dtype != torch.uint8 or blocks.numel() != want:
                shape = f"[{out_features}, {in_features}]"
                raise ValueError(f"{kind} blocks of a {shape} weight: expected {want} uint8 bytes, found "
                                 f"{blocks.numel()} {blocks.dtype}")  # fmt: skip
        else:
            check_blocks(kind, blocks, out_features, in_features)
        if not blocks.is_cpu:
            raise UnsupportedInput("dequantize_blocks: the blocks are not on the CPU")
        src = blocks.contiguous()
        out = empty_huge(out_features, in_features, dtype=_F32)
        rc = self.lib.blz_dequantize_blocks(_KIND_CODES[kind], src.data_ptr(), out_features, in_features,
                                            out.data_ptr(), torch.get_num_threads())  # fmt: skip
        _check(rc, "dequantize_blocks")
        return out

    def quantize_blocks(self, kind: str, w: torch.Tensor) -> torch.Tensor:
        """`quant_reference.quantize_reference` in C (a direct call, never recorded): a float weight [N, K]
        (f32, bf16 or f16 on the CPU) → the row-packed bytes of block kind `kind`, uint8 [G, 16 · row_bytes]
        (q8_0g: ggml's rows [N, row_bytes])."""
        check_quantize(kind, w)
        if not w.is_cpu or w.dtype not in ELEMENT_CODES:
            raise UnsupportedInput(f"quantize_blocks: a CPU f32 / bf16 / f16 weight expected, found "
                                   f"{w.dtype} on {w.device}")  # fmt: skip
        src = w.detach().contiguous()
        n, k = src.shape
        out = _blocks_out(kind, n, k)
        rc = self.lib.blz_quantize_blocks(_KIND_CODES[kind], src.data_ptr(), ELEMENT_CODES[src.dtype], n, k,
                                          out.data_ptr(), torch.get_num_threads())  # fmt: skip
        _check(rc, "quantize_blocks")
        return out

    def quantize_rows(
        self, kind: str, rows: torch.Tensor, dtype: torch.dtype, out_features: int, in_features: int
    ) -> torch.Tensor:
        """`quantize_blocks` of a weight whose rows lie anywhere: `rows` int64 [N] holds the address of each
        row's K values of `dtype` (f32 / bf16 / f16, aligned to it; the caller keeps that memory alive for
        the call) → uint8 [G, 16 · row_bytes] (q8_0g: [N, row_bytes])."""
        out, rows = _rows_out("quantize_rows", kind, rows, out_features, in_features), rows.contiguous()
        if dtype not in ELEMENT_CODES:
            raise UnsupportedInput(f"quantize_rows: f32 / bf16 / f16 rows expected, found {dtype}")
        code, n, k = ELEMENT_CODES[dtype], out_features, in_features
        rc = self.lib.blz_quantize_rows(_KIND_CODES[kind], rows.data_ptr(), code, n, k, out.data_ptr(),
                                        torch.get_num_threads())  # fmt: skip
        _check(rc, "quantize_rows")
        return out
