"""Fresh buffers for the weights that loading builds (packed, quantized, gathered), backed by transparent
huge pages on request: `BLAZR_HUGEPAGES=1` (Linux THP in `madvise` mode, the common default).

Off by default. A 1B model quantized at load writes ~1.1 GB of new pages; on a warm host 2 MB pages fault in
faster than 4 KB ones (`--quantize int8`, 134M values: 0.034 s a call against 0.053), but a huge page comes
from memory nothing has touched since boot, and on a VM each first touch of that memory faults on the host
too: on the 2-vCPU test VM a fresh 700 MB buffer filled at 0.75 GB/s advised huge against 5.9 GB/s with
4 KB pages, and whole loads took 2× longer (1B Q4_0 GGUF 0.70-0.88 s against 0.37; `--quantize int8`
1.45-2.46 s against 0.76) for a decode at most 3 % faster (Q4_0 38.6 against 37.5 tok/s; int8 the same;
benchmarks/NOTES.md §40). The advice is given before anything touches the buffer (torch.empty leaves it
untouched), covers only whole pages inside it, and changes no value; where madvise is missing or refuses,
the buffer keeps 4 KB pages.
"""

from __future__ import annotations

import ctypes
import os
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
    """`torch.empty(*shape, dtype=dtype)` on the CPU; with BLAZR_HUGEPAGES=1 its pages advised huge when it
    spans MIN_BYTES or more."""
    t = torch.empty(*shape, dtype=dtype)
    nbytes = t.numel() * t.element_size()
    if _MADVISE is not None and nbytes >= MIN_BYTES and os.environ.get("BLAZR_HUGEPAGES") == "1":
        start = -(-t.data_ptr() // PAGE) * PAGE
        end = (t.data_ptr() + nbytes) // PAGE * PAGE
        _MADVISE(start, end - start, MADV_HUGEPAGE)  # advice: a refusal (-1) leaves 4 KB pages, same values
    return t
