"""The token-choice kernels' bindings (csrc/sample.c), mixed into `Kernels` (bindings.py): greedy
`argmax_rows` and the temperature / min-p / top-k / top-p draw `sample_rows`, run directly (after the
forward, never recorded into a plan). Shapes: logits [B, V] fp32, rows contiguous; per-row parameters [B]
(fp32; top_k int64)."""

from __future__ import annotations

import ctypes

import torch

from blazr.kernels.calls import _check, _f32_ptr, _i64_ptr

_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


def declare_sample_calls(lib: ctypes.CDLL) -> None:
    """The ctypes signatures of the token-choice entry points."""
    lib.blz_argmax_rows.argtypes = [_P, _I64, _I64, _P, _INT]
    lib.blz_argmax_rows.restype = _INT
    lib.blz_sample_rows.argtypes = [_P, _I64, _I64, _P, _P, _P, _P, _P, _P, _INT]
    lib.blz_sample_rows.restype = _INT


def _rows(logits: torch.Tensor, what: str) -> tuple[int, int, int]:
    """(pointer, B, V) of a [B, V] fp32 CPU tensor with contiguous rows (UnsupportedInput otherwise)."""
    if logits.dim() != 2 or logits.shape[1] == 0:
        raise ValueError(f"{what}: expected logits [B, V] with V > 0, found {list(logits.shape)}")
    return _f32_ptr(logits, what), logits.shape[0], logits.shape[1]


class SampleBindings:
    """`argmax_rows` and `sample_rows`; uses the `lib` of the Kernels it is mixed into."""

    lib: ctypes.CDLL

    def argmax_rows(self, logits: torch.Tensor) -> torch.Tensor:
        ptr, B, V = _rows(logits, "argmax_rows logits")
        out = torch.empty(B, dtype=torch.int64)
        _check(self.lib.blz_argmax_rows(ptr, B, V, out.data_ptr(), torch.get_num_threads()), "argmax_rows")
        return out

    def sample_rows(
        self,
        logits: torch.Tensor,
        temperature: torch.Tensor,
        min_p: torch.Tensor,
        top_k: torch.Tensor,
        top_p: torch.Tensor,
        u: torch.Tensor,
    ) -> torch.Tensor:
        ptr, B, V = _rows(logits, "sample_rows logits")
        params = (
            ("temperature", temperature),
            ("min_p", min_p),
            ("top_k", top_k),
            ("top_p", top_p),
            ("u", u),
        )
        for name, t in params:
            if t.numel() != B:
                raise ValueError(f"sample_rows: {name} has {t.numel()} values for {B} rows")
        out = torch.empty(B, dtype=torch.int64)
        rc = self.lib.blz_sample_rows(
            ptr, B, V, _f32_ptr(temperature, "sample_rows temperature"), _f32_ptr(min_p, "sample_rows min_p"),
            _i64_ptr(top_k, "sample_rows top_k"), _f32_ptr(top_p, "sample_rows top_p"),
            _f32_ptr(u, "sample_rows u"), out.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        _check(rc, "sample_rows")
        return out
