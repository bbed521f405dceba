"""The prefill attention kernel's binding — causal GQA of one sequence's prompt chunk over the paged KV pools
(csrc/attention_prefill.c) — mixed into `Kernels` (bindings.py), validated here. Shapes as in `ops.py`."""

from __future__ import annotations

import torch

from blazr.kernels.calls import _F32, UnsupportedInput, _f32_ptr, _i64_ptr, _pool_ptrs, _rows_ptr

_OP_ATTENTION_PREFILL = 25  # csrc/blazr_kernels.h
MAX_HEAD_DIM = 512  # csrc/attention_prefill.c BLZ_PF_MAX_D: larger heads take the reference


class AttentionPrefillBindings:
    """`attention_prefill`; uses the `_args()` / `_run()` of the `Kernels` class it is mixed into."""

    def attention_prefill(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        kv_slots: torch.Tensor,
        ctx: int,
        scale: float,
        *,
        window: int | None = None,
        sinks: torch.Tensor | None = None,
        softcap: float | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        n, H, D = q.shape
        S, Hkv, Dk = k_pool.shape
        Dv = v_pool.shape[2]
        if Dk != D or v_pool.shape[:2] != (S, Hkv) or H % Hkv:
            raise ValueError(
                f"attention_prefill: q [n, H, {D}], k_pool [S, Hkv, {D}], v_pool [S, Hkv, Dv] with "
                f"H % Hkv == 0; found {list(q.shape)}, {list(k_pool.shape)}, {list(v_pool.shape)}"
            )
        if D > MAX_HEAD_DIM or Dv > MAX_HEAD_DIM:
            raise UnsupportedInput(f"attention_prefill: head dims {D} / {Dv} above {MAX_HEAD_DIM}")
        if ctx < 0 or kv_slots.dim() != 1 or kv_slots.numel() < ctx + n:
            raise ValueError(
                f"attention_prefill: kv_slots [≥ {ctx + n}] expected, found {list(kv_slots.shape)}"
            )
        if sinks is not None and sinks.numel() != H:
            raise ValueError(f"attention_prefill: sinks [{H}] expected, found {list(sinks.shape)}")
        if softcap is not None and not softcap > 0:
            raise ValueError(f"attention_prefill: softcap must be > 0 or None, found {softcap}")
        if out is None:
            out = torch.empty(n, H, Dv, dtype=_F32)
        elif out.shape != (n, H, Dv):
            raise ValueError(f"attention_prefill: out [{n}, {H}, {Dv}] expected, found {list(out.shape)}")
        (qp, ldq), (op, ldo) = _rows_ptr(q, "attention q"), _rows_ptr(out, "attention out")
        kp, vp, kv_type = _pool_ptrs(k_pool, v_pool)
        ip = _i64_ptr(kv_slots, "kv_slots")
        sp = _f32_ptr(sinks, "attention sinks") if sinks is not None else 0
        if q.dtype is not _F32:
            raise UnsupportedInput("attention_prefill: fp32 queries only")
        a, addr = self._args()  # type: ignore[attr-defined]
        a.op = _OP_ATTENTION_PREFILL
        a.i[0:17] = (
            qp, ldq, kp, vp, kv_type, S, ip, n, ctx, H, Hkv, D, Dv, window or 0, sp, op, ldo,
        )  # fmt: skip
        a.i[17] = torch.get_num_threads()
        a.f[0], a.f[1] = scale, softcap or 0.0
        keep = (sinks,) if sinks is not None else ()
        self._run(a, addr, "attention_prefill", q, k_pool, v_pool, kv_slots, out, *keep)  # type: ignore[attr-defined]
        return out
