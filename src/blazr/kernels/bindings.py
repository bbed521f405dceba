"""ctypes bindings of one built kernel library: `Kernels`, one method per kernel, validating shapes and
raising UnsupportedInput for dtypes / layouts the kernels do not take (the Mamba2 ones in
bindings_mamba2.py, gated DeltaNet and gated attention's in bindings_deltanet.py, Kimi Delta Attention's in
bindings_kda.py, the short conv in
bindings_conv.py, Mamba1 in bindings_mamba1.py, MoE and MLA in bindings_moe_mla.py, the load-time weight
formats in bindings_weights.py, token choice in bindings_sample.py); inside `record()` the calls go to a
`KernelPlan` (calls.py) instead of running.

Calls pass their arguments through `blz_call` in a per-thread preallocated `blz_args_t` struct (~1 µs
through ctypes, instead of ~0.3 µs per separately converted argument). Shapes as in `ops.py`.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator

import torch

from blazr.kernels import build
from blazr.kernels.bindings_attention import AttentionBindings
from blazr.kernels.bindings_conv import ConvBindings
from blazr.kernels.bindings_deltanet import DeltaNetBindings
from blazr.kernels.bindings_kda import KDABindings
from blazr.kernels.bindings_mamba1 import Mamba1Bindings
from blazr.kernels.bindings_mamba2 import Mamba2Bindings
from blazr.kernels.bindings_moe_mla import MoEMLABindings
from blazr.kernels.bindings_sample import SampleBindings, declare_sample_calls
from blazr.kernels.bindings_weights import (
    _KIND_CODES,
    WeightFormatBindings,
    declare_weight_calls,
)
from blazr.kernels.calls import (
    _F32,
    KernelPlan,
    UnsupportedInput,
    _Args,
    _check,
    _f32_ptr,
    _i64_ptr,
)
from blazr.kernels.formats import FORMATS
from blazr.kernels.quant import (
    QK,
    QuantizedWeight,
)
from blazr.kernels.reference import ACTIVATIONS, check_exact_x, linear_out_features
from blazr.kernels.row_table import RowTable

# Packed-call op codes and weight-kind codes (csrc/blazr_kernels.h).
_ROWS_FLAG = 0x100  # BLZ_ROWS: the weight pointer is a row table (kernels/mapped.py)
_GEMM_FLAG = 0x200  # BLZ_GEMM: f32 rows may take the panel GEMM (a prefill call)
_XF32_FLAG = 0x400  # BLZ_XF32: x kept fp32 against Q8_0 as stored (csrc/linear_q8xf.c)
_OP_LINEAR = {f.kind: f.op for f in FORMATS}  # the packed call's linear op of each weight kind
_OP_RMS_NORM, _OP_ROPE_NEOX = 4, 5
_OP_GATED_RMS_NORM, _OP_EMBEDDING, _OP_AXPBY, _OP_ACTIVATION = 9, 10, 11, 12
_OP_EMBEDDING_Q, _OP_SOFTCAP = 19, 24
_ROW_CODES = {f.kind: f.row_code for f in FORMATS if f.row_code is not None}  # blz_embedding_q's


# csrc's BLZ_TUNE_* knobs (blazr_kernels.h): the variants kernels/tuning.py picks per host
TUNE_KNOBS = {
    "streams_f": 0,
    "streams_q": 1,
    "streams_q8g": 2,
    "streams_k": 3,
    "k1_zmm": 4,
    "streams_b32": 5,
    "streams_z": 6,
    "streams_kx": 7,
    "k6_rows": 8,
}


class Kernels(
    AttentionBindings,
    Mamba2Bindings,
    MoEMLABindings,
    SampleBindings,
    WeightFormatBindings,
    DeltaNetBindings,
    ConvBindings,
    Mamba1Bindings,
    KDABindings,
):
    """Bindings of one built kernel library. The methods take the same arguments as the dispatching module
    functions; they raise UnsupportedInput for inputs the kernels do not take (not fp32 / int64, not
    contiguous, not on the CPU) and ValueError for inconsistent shapes.

    Calls go through `blz_call` with a per-thread preallocated argument struct (cheaper than ctypes'
    per-argument conversion); the number of OpenMP threads is torch.get_num_threads() at each call.
    Inside `with kernels.record() as plan:` calls are recorded instead of run, and `plan.run()` replays
    them all with one C call (see KernelPlan)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        self.features = build.features(lib)
        self._call = lib.blz_call
        self._call.argtypes, self._call.restype = [ctypes.c_void_p], ctypes.c_int
        lib.blz_quantize_act.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] + [
            ctypes.c_void_p
        ] * 3
        lib.blz_quantize_act.restype = ctypes.c_int
        declare_weight_calls(lib)
        declare_sample_calls(lib)
        self._call_many = lib.blz_call_many
        self._call_many.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
        self._call_many.restype = ctypes.c_int
        lib.blz_set_tune.argtypes, lib.blz_set_tune.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        lib.blz_get_tune.argtypes, lib.blz_get_tune.restype = [ctypes.c_int], ctypes.c_int
        self.tune_defaults = {knob: self.get_tune(knob) for knob in TUNE_KNOBS}  # the build's own values
        self._tls = threading.local()

    def set_tune(self, knob: str, value: int) -> int:
        """Set a host-tuning knob (TUNE_KNOBS; csrc's BLZ_TUNE_*) for every later call and return its previous
        value. Every value of a knob gives the same bits; a value this build does not have is a ValueError."""
        if knob not in TUNE_KNOBS:
            raise ValueError(f"unknown kernel tuning knob {knob!r} (known: {', '.join(TUNE_KNOBS)})")
        old = self.lib.blz_set_tune(TUNE_KNOBS[knob], int(value))
        if old < 0:
            raise ValueError(f"kernel tuning knob {knob!r}: {value} is not a value of this build")
        return old

    def get_tune(self, knob: str) -> int:
        return self.lib.blz_get_tune(TUNE_KNOBS[knob])

    @contextlib.contextmanager
    def tuned(self, **knobs: int) -> Iterator[None]:
        """Run a block with some knobs set, restoring them after (tests and tuning.py's measurements)."""
        old = {k: self.set_tune(k, v) for k, v in knobs.items()}
        try:
            yield
        finally:
            for k, v in old.items():
                self.set_tune(k, v)

    @contextlib.contextmanager
    def record(self) -> Iterator[KernelPlan]:
        """Record this thread's kernel calls (without running them) into a KernelPlan."""
        if getattr(self._tls, "plan", None) is not None:
            raise RuntimeError("kernel recording does not nest")
        plan = KernelPlan(self._call_many)
        self._tls.plan = plan
        try:
            yield plan
        finally:
            self._tls.plan = None

    def is_recording(self) -> bool:
        return getattr(self._tls, "plan", None) is not None

    @staticmethod
    def weight_code(qw: QuantizedWeight) -> int:
        """A weight's format for kernels that run linears inside (MoE experts, MLA heads): linear op · 32 +
        kind (csrc's blz_linear_by_code)."""
        return _OP_LINEAR[qw.kind] * 32 + _KIND_CODES[qw.kind]

    def _run(self, a: _Args, addr: int, name: str, *tensors: torch.Tensor | None) -> None:
        """Run the packed call, or append it to the plan being recorded (keeping its tensors alive)."""
        plan = getattr(self._tls, "plan", None)
        if plan is None:
            _check(self._call(addr), name)
        else:
            plan._add(_Args.from_buffer_copy(a), name, tensors)

    def _args(self) -> tuple[_Args, int]:
        """This thread's argument struct and its address."""
        try:
            return self._tls.args
        except AttributeError:
            a = _Args()
            self._tls.args = (a, ctypes.addressof(a))
            return self._tls.args

    def linear(
        self,
        x: torch.Tensor,
        qw: QuantizedWeight,
        bias: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
        *,
        swiglu: bool = False,
        out: torch.Tensor | None = None,
        prefill: bool = False,
        exact_x: bool = False,
    ) -> torch.Tensor:
        K, N = qw.in_features, qw.out_features
        check_exact_x(qw, exact_x)
        if x.shape[-1] != K:
            raise ValueError(f"linear: x has {x.shape[-1]} features, the weight {K}")
        xp = _f32_ptr(x, "linear x")
        M = x.numel() // K
        n_out = linear_out_features(qw, swiglu)
        if bias is not None and bias.numel() != N:
            raise ValueError(f"linear: bias has {bias.numel()} elements, expected {N}")
        if residual is not None and (swiglu or residual.numel() != M * N):
            raise ValueError(f"linear: residual must have [M, N] = [{M}, {N}] elements (and not SwiGLU)")
        if out is None:
            out = torch.empty((*x.shape[:-1], n_out), dtype=_F32)
        elif out.numel() != M * n_out:
            raise ValueError(f"linear: out has {out.numel()} elements, expected [M, N] = [{M}, {n_out}]")
        rows = getattr(qw, "rows", None)  # a MappedWeight: its row table, its bytes where the map has them
        weight = qw.data if rows is None else rows
        if not weight.is_cpu:
            raise UnsupportedInput("linear: the weight is not on the CPU")
        a, addr = self._args()
        a.op = _OP_LINEAR[qw.kind]
        bp, rp, op = (
            _f32_ptr(bias, "linear bias"),
            _f32_ptr(residual, "linear residual"),
            _f32_ptr(out, "out"),
        )
        flags = (0 if rows is None else _ROWS_FLAG) | (_GEMM_FLAG if prefill and qw.kind == "f32" else 0)
        flags |= _XF32_FLAG if exact_x else 0
        a.i[0:11] = (
            _KIND_CODES[qw.kind] | flags,
            xp,
            M,
            K,
            weight.data_ptr(),
            N,
            bp,
            rp,
            op,
            swiglu,
            torch.get_num_threads(),
        )
        holder = None if rows is None else qw.holder  # type: ignore[attr-defined]
        self._run(a, addr, f"linear[{qw.kind}]", x, weight, holder, bias, residual, out)
        return out

    def quantize_act(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The activation quantization of the block linear kernel: x [M, K] → (q int8 [M, K], d [M, K/32],
        s [M, K/32]); see `quantize_act_reference`."""
        M, K = x.shape
        if K % QK:
            raise ValueError(f"quantize_act: K = {K} is not a multiple of {QK}")
        q = torch.empty(M, K, dtype=torch.int8)
        d = torch.empty(M, K // QK, dtype=_F32)
        s = torch.empty(M, K // QK, dtype=_F32)
        rc = self.lib.blz_quantize_act(_f32_ptr(x, "x"), M, K, q.data_ptr(), d.data_ptr(), s.data_ptr())
        _check(rc, "quantize_act")
        return q, d, s

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        D = x.shape[-1]
        xp = _f32_ptr(x, "rms_norm x")
        if weight.numel() != D:
            raise ValueError(f"rms_norm: weight has {weight.numel()} elements, x {D} features")
        if out is None:
            out = torch.empty_like(x)
        elif out.numel() != x.numel():
            raise ValueError(f"rms_norm: out has {out.numel()} elements, x {x.numel()}")
        a, addr = self._args()
        a.op = _OP_RMS_NORM
        a.i[0:6] = (xp, _f32_ptr(weight, "rms_norm weight"), x.numel() // D, D, _f32_ptr(out, "rms_norm out"),
                    torch.get_num_threads())  # fmt: skip
        a.f[0] = eps
        self._run(a, addr, "rms_norm", x, weight, out)
        return out

    def gated_rms_norm(
        self,
        y: torch.Tensor,
        z: torch.Tensor,
        weight: torch.Tensor | None,
        group_size: int,
        eps: float,
        norm_before_gate: bool,
    ) -> torch.Tensor:
        if y.dim() != 2:
            raise UnsupportedInput(f"gated_rms_norm: expected y [M, D], found {list(y.shape)}")
        wn = y.shape[1] if weight is None else weight.numel()
        if z.shape != y.shape or wn != y.shape[1] or y.shape[1] % group_size:
            raise ValueError(
                f"gated_rms_norm: y {list(y.shape)}, z {list(z.shape)}, weight [{wn}], groups "
                f"of {group_size}: expected y, z [M, D], weight [D], D a multiple of the group size"
            )
        if z.dtype is not _F32 or not z.is_cpu or z.stride(1) != 1:
            raise UnsupportedInput(f"gated_rms_norm z: expected fp32 CPU rows, found {z.dtype} on {z.device}")
        M, D = y.shape
        out = torch.empty_like(y)
        a, addr = self._args()
        a.op = _OP_GATED_RMS_NORM
        a.i[0:10] = (
            _f32_ptr(y, "gated_rms_norm y"),
            z.data_ptr(),
            z.stride(0),
            _f32_ptr(weight, "gated_rms_norm weight"),
            M,
            D,
            group_size,
            int(norm_before_gate),
            out.data_ptr(),
            torch.get_num_threads(),
        )
        a.f[0] = eps
        self._run(a, addr, "gated_rms_norm", y, z, weight, out)
        return out

    def embedding(
        self, ids: torch.Tensor, table: torch.Tensor, scale: float = 1.0, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        if table.dim() != 2 or ids.dim() != 1:
            raise ValueError(f"embedding: ids [T] and table [V, D] expected, found {list(ids.shape)}, "
                             f"{list(table.shape)}")  # fmt: skip
        (T,), (V, D) = ids.shape, table.shape
        if out is None:
            out = torch.empty(T, D, dtype=_F32)
        elif out.numel() != T * D:
            raise ValueError(f"embedding: out has {out.numel()} elements, expected [{T}, {D}]")
        a, addr = self._args()
        a.op = _OP_EMBEDDING
        a.i[0:6] = (
            _i64_ptr(ids, "embedding ids"), T, _f32_ptr(table, "embedding table"), V, D,
            _f32_ptr(out, "embedding out"),
        )  # fmt: skip
        a.f[0] = scale
        self._run(a, addr, "embedding", ids, table, out)
        return out

    def embedding_rows(
        self, ids: torch.Tensor, table: RowTable, scale: float = 1.0, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        if ids.dim() != 1:
            raise ValueError(f"embedding_rows: ids [T] expected, found {list(ids.shape)}")
        T, D = ids.shape[0], table.dim
        if out is None:
            out = torch.empty(T, D, dtype=_F32)
        elif out.numel() != T * D:
            raise ValueError(f"embedding_rows: out has {out.numel()} elements, expected [{T}, {D}]")
        if not table.data.is_cpu:
            raise UnsupportedInput("embedding_rows: the table is not on the CPU")
        a, addr = self._args()
        a.op = _OP_EMBEDDING_Q
        a.i[0:7] = (
            _ROW_CODES[table.kind], _i64_ptr(ids, "embedding ids"), T, table.data.data_ptr(), table.num_rows,
            D, _f32_ptr(out, "embedding out"),
        )  # fmt: skip
        a.f[0] = scale
        self._run(a, addr, "embedding_rows", ids, table.data, out)
        return out

    def add(
        self,
        x: torch.Tensor,
        y: torch.Tensor | None,
        alpha: float = 1.0,
        beta: float = 1.0,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if y is not None and y.shape != x.shape:
            raise ValueError(f"add: x {list(x.shape)} and y {list(y.shape)} differ")
        if out is None:
            out = torch.empty_like(x)
        elif out.numel() != x.numel():
            raise ValueError(f"add: out has {out.numel()} elements, x {x.numel()}")
        a, addr = self._args()
        a.op = _OP_AXPBY
        a.i[0:4] = (_f32_ptr(x, "add x"), _f32_ptr(y, "add y"), x.numel(), _f32_ptr(out, "add out"))
        a.f[0], a.f[1] = alpha, beta
        self._run(a, addr, "add", x, y, out)
        return out

    def softcap(self, x: torch.Tensor, cap: float) -> torch.Tensor:
        if not cap > 0:
            raise ValueError(f"softcap: the cap must be > 0, found {cap}")
        a, addr = self._args()
        a.op = _OP_SOFTCAP
        a.i[0:3] = (_f32_ptr(x, "softcap x"), x.numel(), torch.get_num_threads())
        a.f[0] = cap
        self._run(a, addr, "softcap", x)
        return x

    def activation(self, x: torch.Tensor, kind: str, gated: bool) -> torch.Tensor:
        if kind not in ACTIVATIONS:
            raise ValueError(f"activation: unknown kind {kind!r}")
        if kind == "swiglu_oai":  # its alpha and limit: only moe_experts takes them
            raise UnsupportedInput("activation: swiglu_oai runs in moe_experts only")
        N = x.shape[-1]
        if gated and N % 2:
            raise ValueError(f"activation: gated needs an even width, found {N}")
        out = torch.empty((*x.shape[:-1], N // 2 if gated else N), dtype=_F32)
        a, addr = self._args()
        a.op = _OP_ACTIVATION
        xp = _f32_ptr(x, "activation x")
        a.i[0:7] = (xp, x.numel() // N, N, ACTIVATIONS.index(kind), int(gated), out.data_ptr(),
                    torch.get_num_threads())  # fmt: skip
        self._run(a, addr, "activation", x, out)
        return out

    def rope_neox(
        self, x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot_dim: int
    ) -> torch.Tensor:
        if x.dim() != 3:
            raise ValueError(f"rope_neox: expected x [T, H, Dh], found shape {list(x.shape)}")
        T, H, Dh = x.shape
        half = rot_dim // 2
        if positions.numel() != T or rot_dim % 2 or rot_dim > Dh:
            raise ValueError(f"rope_neox: positions [{T}] and an even rot_dim ≤ {Dh} expected")
        if cos.dim() != 2 or cos.shape[1] != half or cos.shape != sin.shape:
            raise ValueError(
                f"rope_neox: cos/sin must be [P, {half}], found {list(cos.shape)}, {list(sin.shape)}"
            )
        if x.dtype is not _F32 or not x.is_cpu or x.stride(2) != 1 or (H > 1 and x.stride(1) < Dh):
            raise UnsupportedInput(f"rope x: expected fp32 CPU [T, H, Dh] (rows of heads), found {x.dtype}")
        hs = x.stride(1) if H > 1 else Dh  # head stride: a head's part of a wider row (MLA's q_rope) is fine
        xp, ldx = x.data_ptr(), x.stride(0) if T > 1 else H * hs
        pp, cp, sp = (
            _i64_ptr(positions, "rope positions"),
            _f32_ptr(cos, "rope cos"),
            _f32_ptr(sin, "rope sin"),
        )
        a, addr = self._args()
        a.op = _OP_ROPE_NEOX
        a.i[0:11] = (xp, T, H, hs, ldx, pp, cp, sp, cos.shape[0], rot_dim, torch.get_num_threads())
        self._run(a, addr, "rope_neox", x, positions, cos, sin)
        return x
