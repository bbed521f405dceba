"""Fresh buffers for the weights that loading builds (packed, quantized, gathered), backed by transparent
huge pages where the OS offers them on request (Linux THP in `madvise` mode, the common default).

A 1B model quantized at load writes ~1.1 GB of new pages: ~270k first-touch faults of 4 KB, which measured
as long as the quantization itself on a 2-vCPU VM (`--quantize int8`, 134M values: 0.053 s a call with 4 KB
pages, 0.034 s with 2 MB ones). The advice is given before anything touches the buffer (torch.empty leaves it
untouched), covers only whole pages inside it, and changes no value; where madvise is missing or refuses,
the buffer keeps 4 KB pages.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable

import torch

MADV_HUGEPAGE = 14  # <sys/mman.h> on Linux
MIN_BYTES = 4 << 20  # smaller buffers hold at most one whole 2 MB page: not worth a system call
PAGE = 4096


def _find_madvise() -> Callable[[int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _find_madvise()


def empty_huge(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    """`torch.empty(*shape, dtype=dtype)` on the CPU, its pages advised huge when it spans MIN_BYTES or
    more."""
    t = torch.empty(*shape, dtype=dtype)
    nbytes = t.numel() * t.element_size()
    if _MADVISE is not None and nbytes >= MIN_BYTES:
        start = -(-t.data_ptr() // PAGE) * PAGE
        end = (t.data_ptr() + nbytes) // PAGE * PAGE
        _MADVISE(start, end - start, MADV_HUGEPAGE)  # advice: a refusal (-1) leaves 4 KB pages, same values
    return t
