"""Capture: record a torch function that is made of kernel calls only (e.g. one decode step of the model's
own forward) into a KernelPlan, the CPU analogue of a CUDA graph, with its intermediate tensors packed into
an arena shared by every plan captured on it.

- **Strict**: while recording, a dispatch mode lets through views and allocations only. Any other torch op
  would run once at recording time and never on replay, so it raises UnsupportedInput naming the op and the
  line of code (the "why" a caller logs when it falls back to eager). A view op that had to copy (a
  `reshape` or `contiguous` of a strided tensor) counts as compute.
- **Arena**: the tensors allocated while recording (activations, kernel outputs) are intermediates. From
  the recorded calls each one's live range is known (first to last call that touches it; the function's
  outputs live to the end), so they are laid out in one buffer by first-fit over live ranges — like a CUDA
  graph's private memory pool — and the calls' pointers are rewritten into it. A decode step then needs
  the activations of about two layers, not of all of them. The arena is shared by every plan captured on
  it (only one runs at a time) and grows to the largest; the outputs are views of it, valid until the next
  run of any of its plans.

Relocation rewrites every int64 argument that points into an intermediate (pointer values are far above
any size or stride a kernel takes).
"""

from __future__ import annotations

import bisect
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from blazr.kernels import ops
from blazr.kernels.calls import KernelPlan, UnsupportedInput

_aten = torch.ops.aten
_ALLOCATIONS = {
    _aten.empty.memory_format,
    _aten.empty_like.default,
    _aten.new_empty.default,
    _aten.empty_strided.default,
    _aten.new_empty_strided.default,
}
_NO_DATA = {_aten.detach.default, _aten.alias.default, _aten.lift_fresh.default}
_ALIGN = 64


def _where() -> str:
    """The innermost two frames of blazr's model code (else of blazr) on the stack, innermost first:
    'model/rope.py:79 ← model/mla.py:150'."""
    stack = traceback.extract_stack()
    frames = [f for f in stack if "blazr" in f.filename and "capture.py" not in f.filename]
    model = [f for f in frames if "/model/" in f.filename] or frames
    names = [f"{'/'.join(f.filename.split('/')[-2:])}:{f.lineno}" for f in reversed(model[-2:])]
    return " ← ".join(names) or "?"


class _Strict(TorchDispatchMode):
    """Views and allocations only; collects the allocated tensors."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ in a dynamo-disable, which imports torch._dynamo on the
        # first op (~1.8 s of a model's load); a capture never runs under torch.compile, so opt out.
        return False

    def __init__(self) -> None:
        super().__init__()
        self.allocated: list[torch.Tensor] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _ALLOCATIONS:
            out = func(*args, **kwargs)
            self.allocated.append(out)
            return out
        if func.is_view or func in _NO_DATA:
            out = func(*args, **kwargs)
            src = args[0] if args and isinstance(args[0], torch.Tensor) else None
            outs = out if isinstance(out, (tuple, list)) else (out,)
            if src is not None and any(
                isinstance(o, torch.Tensor)
                and o.untyped_storage().data_ptr() != src.untyped_storage().data_ptr()
                for o in outs
            ):
                raise UnsupportedInput(f"{func} copies its input (at {_where()}), which a plan cannot replay")
            return out
        raise UnsupportedInput(f"{func} runs in torch (at {_where()}), which a plan cannot replay")


@dataclass(frozen=True)
class _Output:
    offset: int  # bytes into the arena
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]


class Arena:
    """The buffer that the intermediates of the plans captured on it live in; grows to the largest need."""

    def __init__(self) -> None:
        self.buffer = torch.empty(0, dtype=torch.uint8)
        self._plans: list[CapturedPlan] = []

    @property
    def nbytes(self) -> int:
        return self.buffer.numel()

    def _attach(self, plan: CapturedPlan) -> None:
        if plan.nbytes > self.nbytes:
            self.buffer = torch.empty(plan.nbytes, dtype=torch.uint8)
            for p in self._plans:
                p._bind(self.buffer.data_ptr())
        self._plans.append(plan)
        plan._bind(self.buffer.data_ptr())


class CapturedPlan:
    """A KernelPlan whose intermediates live in an Arena; `run()` returns the captured function's outputs
    (views of the arena)."""

    def __init__(
        self,
        plan: KernelPlan,
        arena: Arena,
        fixups: list[tuple[int, int, int]],
        outputs: list[_Output],
        nbytes: int,
    ) -> None:
        self.plan, self.arena, self.nbytes = plan, arena, nbytes
        self._fixups = fixups  # (call, argument, byte offset into the arena)
        self._outputs = outputs

    def __len__(self) -> int:
        return len(self.plan)

    def _bind(self, base: int) -> None:
        self.plan._set_args([(k, f, base + off) for k, f, off in self._fixups])

    def run(self) -> list[torch.Tensor]:
        self.plan.run()
        buf = self.arena.buffer
        return [torch.as_strided(buf[o.offset :].view(o.dtype), o.shape, o.stride) for o in self._outputs]


def _layout(ranges: list[tuple[int, int, int]]) -> tuple[list[int], int]:
    """First-fit offsets for blocks (first call, last call, bytes) so that blocks live at the same time do
    not overlap; returns (offset of each block, total bytes)."""
    order = sorted(range(len(ranges)), key=lambda i: (ranges[i][0], -ranges[i][2]))
    offsets = [0] * len(ranges)
    live: list[int] = []  # block indices, sorted by offset
    total = 0
    for i in order:
        first, _, size = ranges[i]
        live = [j for j in live if ranges[j][1] >= first]
        live.sort(key=lambda j: offsets[j])
        at = 0
        for j in live:
            if offsets[j] - at >= size:
                break
            at = max(at, -(-(offsets[j] + ranges[j][2]) // _ALIGN) * _ALIGN)
        offsets[i] = at
        live.append(i)
        total = max(total, at + size)
    return offsets, -(-total // _ALIGN) * _ALIGN


def capture(fn: Callable[[], list[torch.Tensor]], arena: Arena) -> CapturedPlan:
    """Record `fn()` (kernel calls only, see the module docstring) into a plan on `arena`; raises
    UnsupportedInput (why) for a torch op, RuntimeError without the kernel library."""
    strict = _Strict()
    with ops.record() as plan, strict:
        outputs = fn()
    calls = plan._call_tensors()
    # Intermediates: the storages allocated while recording, with their live range over the calls.
    storages: dict[int, list[int]] = {}  # data_ptr → [first, last, nbytes]
    for t in strict.allocated:
        s = t.untyped_storage()
        if s.nbytes():
            storages.setdefault(s.data_ptr(), [len(calls), -1, s.nbytes()])
    for k, tensors in enumerate(calls):
        for t in tensors:
            r = storages.get(t.untyped_storage().data_ptr())
            if r is not None:
                r[0], r[1] = min(r[0], k), max(r[1], k)
    for t in outputs:
        r = storages.get(t.untyped_storage().data_ptr())
        if r is None:
            raise UnsupportedInput("capture: an output was not computed by the recorded calls")
        r[1] = len(calls)
    used = {p: r for p, r in storages.items() if r[1] >= 0}
    ptrs = sorted(used)
    offsets, nbytes = _layout([tuple(used[p]) for p in ptrs])  # type: ignore[misc]
    new_offset = dict(zip(ptrs, offsets, strict=True))

    fixups = []
    for k, args in enumerate(plan._calls):
        for f, v in enumerate(args.i):
            j = bisect.bisect_right(ptrs, v) - 1
            if j >= 0 and v < ptrs[j] + used[ptrs[j]][2]:
                fixups.append((k, f, new_offset[ptrs[j]] + v - ptrs[j]))
    outs = []
    for t in outputs:
        p = t.untyped_storage().data_ptr()
        offset = new_offset[p] + t.data_ptr() - p
        outs.append(_Output(offset, t.dtype, tuple(t.shape), tuple(t.stride())))
    plan._drop(set(used))  # the old intermediates are freed; the arena replaces them
    captured = CapturedPlan(plan, arena, fixups, outs, nbytes)
    arena._attach(captured)
    return captured
