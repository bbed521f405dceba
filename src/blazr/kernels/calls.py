"""How kernel calls travel: the C struct `blz_args_t` one call's arguments are packed in (`_Args`), the
checks that turn a tensor into a pointer argument (or raise UnsupportedInput for a dtype / layout the
kernels do not take), and `KernelPlan` — calls recorded by `Kernels.record()`, replayed in order by one C
call, `blz_call_many`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

from blazr.kernels.formats import ELEMENT_CODES

_F32 = torch.float32
_ERRORS = {-1: "invalid size or kind", -2: "index out of range", -3: "out of memory"}


class _Args(ctypes.Structure):
    """blz_args_t: one kernel's arguments, packed (see blz_call in csrc/common.c)."""

    _fields_ = [("op", ctypes.c_int64), ("i", ctypes.c_int64 * 24), ("f", ctypes.c_double * 2)]


def _check(rc: int, name: str) -> None:
    if rc != 0:
        raise RuntimeError(f"kernel {name} failed: {_ERRORS.get(rc, f'error {rc}')}")


class UnsupportedInput(ValueError):
    """An input the C kernels do not take (dtype, device, layout); the dispatchers use the reference."""


def _f32_ptr(t: torch.Tensor | None, what: str) -> int:
    """data_ptr of a contiguous fp32 CPU tensor (0 for None), else UnsupportedInput."""
    if t is None:
        return 0
    if t.dtype is not _F32 or not t.is_cpu or not t.is_contiguous():
        raise UnsupportedInput(
            f"{what}: expected a contiguous fp32 CPU tensor, found {t.dtype} on {t.device}"
        )
    return t.data_ptr()


def _rows_ptr(t: torch.Tensor, what: str) -> tuple[int, int]:
    """(data_ptr, row stride) of an fp32 CPU tensor [R, A, B] whose rows may be strided (a view into a
    wider buffer, e.g. q or k inside a fused qkv output) but whose [A, B] part is contiguous."""
    if t.dtype is not _F32 or not t.is_cpu or t.stride(2) != 1 or t.stride(1) != t.shape[2]:
        raise UnsupportedInput(f"{what}: expected fp32 CPU [R, A, B] with contiguous rows, found {t.dtype}")
    return t.data_ptr(), t.stride(0)


# Element types of the KV pools the kernels read and write (BLZ_KV_* in csrc/blazr_kernels.h).


def _pool_ptrs(k_pool: torch.Tensor, v_pool: torch.Tensor) -> tuple[int, int, int]:
    """(k ptr, v ptr, element type code) of contiguous CPU KV pools of one dtype: fp32, bf16 or fp16."""
    dt = k_pool.dtype
    if dt not in ELEMENT_CODES or v_pool.dtype is not dt:
        raise UnsupportedInput(f"KV pools: expected both fp32, bf16 or fp16, found {dt} and {v_pool.dtype}")
    for t in (k_pool, v_pool):
        if not t.is_cpu or not t.is_contiguous():
            raise UnsupportedInput("KV pools: expected contiguous CPU tensors")
    return k_pool.data_ptr(), v_pool.data_ptr(), ELEMENT_CODES[dt]


def _i64_ptr(t: torch.Tensor, what: str) -> int:
    if t.dtype is not torch.int64 or not t.is_cpu or not t.is_contiguous():
        raise UnsupportedInput(
            f"{what}: expected a contiguous int64 CPU tensor, found {t.dtype} on {t.device}"
        )
    return t.data_ptr()


class KernelPlan:
    """Kernel calls recorded by `Kernels.record()`, replayed in order by one C call (`blz_call_many`).

    Like a CUDA graph it captures data pointers and sizes, not values: every tensor a recorded call
    touches must stay allocated, in place and the same shape (the plan keeps references so they cannot
    be freed), while their contents may change between runs — new activations, positions, slot mappings,
    sequence lengths, block tables (sized for the longest context). Only kernel calls are recorded; a
    torch op inside `record()` runs once, at recording time, and is not replayed. The OpenMP thread
    count is the one at recording time."""

    def __init__(self, call_many: Callable[[int, int, int], int]) -> None:
        self._call_many = call_many  # the library's blz_call_many
        self._calls: list[_Args] = []
        self._names: list[str] = []
        self._tensors: list[tuple[torch.Tensor, ...]] = []  # what each call touches, kept alive
        self._array: ctypes.Array | None = None

    def _add(self, args: _Args, name: str, tensors: tuple[torch.Tensor | None, ...]) -> None:
        self._calls.append(args)
        self._names.append(name)
        self._tensors.append(tuple(t for t in tensors if t is not None))
        self._array = None

    def _call_tensors(self) -> list[tuple[torch.Tensor, ...]]:
        """The tensors each recorded call reads or writes (for capture.py's live ranges)."""
        return self._tensors

    def _set_args(self, values: list[tuple[int, int, int]]) -> None:
        """Set integer argument `f` of call `k` to `v` for each (k, f, v) (capture.py's relocation)."""
        for k, f, v in values:
            self._calls[k].i[f] = v
        self._array = None

    def _drop(self, storages: set[int]) -> None:
        """Stop keeping the tensors on these storages (by data_ptr) alive: capture.py moved them."""
        self._tensors = [
            tuple(t for t in ts if t.untyped_storage().data_ptr() not in storages) for ts in self._tensors
        ]

    def __len__(self) -> int:
        return len(self._calls)

    def run(self) -> None:
        """Run every recorded call in order; raises on the first failure, naming the call."""
        if self._array is None:
            self._array = (_Args * len(self._calls))(*self._calls)
        failed = ctypes.c_int64(-1)
        rc = self._call_many(ctypes.addressof(self._array), len(self._calls), ctypes.addressof(failed))
        if rc != 0:
            _check(rc, f"{self._names[failed.value]} (plan call {failed.value})")
