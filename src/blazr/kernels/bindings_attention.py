"""The attention kernels' bindings — paged decode attention and the KV-cache write (csrc/attention.c), causal
prefill attention of one sequence's chunk (csrc/attention_prefill.c) — mixed into `Kernels` (bindings.py),
validated here. Shapes as in `ops.py`."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from blazr.kernels.calls import _F32, UnsupportedInput, _f32_ptr, _i64_ptr, _pool_ptrs, _rows_ptr

_OP_PAGED_ATTENTION_DECODE, _OP_KV_WRITE, _OP_ATTENTION_PREFILL = 6, 7, 25  # csrc/blazr_kernels.h
MAX_HEAD_DIM = 512  # csrc/attention_prefill.c BLZ_PF_MAX_D: larger heads take the reference


def _check_heads(
    name: str,
    rows: str,
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    sinks: torch.Tensor | None,
    softcap: float | None,
) -> tuple[int, int, int, int, int, int]:
    """(R, H, D, S, Hkv, Dv) of q [R, H, D] against k_pool [S, Hkv, D] / v_pool [S, Hkv, Dv] (H a multiple
    of Hkv), sinks [H] or None, softcap > 0 or None; ValueError naming `name` otherwise."""
    R, H, D = q.shape
    S, Hkv, Dk = k_pool.shape
    Dv = v_pool.shape[2]
    if Dk != D or v_pool.shape[:2] != (S, Hkv) or H % Hkv:
        raise ValueError(
            f"{name}: q [{rows}, H, {D}], k_pool [S, Hkv, {D}], v_pool [S, Hkv, Dv] with H % Hkv == 0; "
            f"found {list(q.shape)}, {list(k_pool.shape)}, {list(v_pool.shape)}"
        )
    if sinks is not None and sinks.numel() != H:
        raise ValueError(f"{name}: sinks [{H}] expected, found {list(sinks.shape)}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"{name}: softcap must be > 0 or None, found {softcap}")
    return R, H, D, S, Hkv, Dv


class AttentionBindings:
    """`paged_attention_decode`, `attention_prefill` and `kv_write`; uses the `_args()` / `_run()` of the
    `Kernels` class it is mixed into."""

    def paged_attention_decode(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        kv_indices: torch.Tensor,
        seq_lens: torch.Tensor | Sequence[int],
        scale: float,
        *,
        window: int | None = None,
        out: torch.Tensor | None = None,
        sinks: torch.Tensor | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        if not isinstance(seq_lens, torch.Tensor):
            seq_lens = torch.tensor(seq_lens, dtype=torch.int64)
        B, H, D, S, Hkv, Dv = _check_heads("paged_attention_decode", "B", q, k_pool, v_pool, sinks, softcap)
        if kv_indices.dim() != 2 or kv_indices.shape[0] != B or seq_lens.numel() != B:
            raise ValueError(f"paged_attention_decode: kv_indices [{B}, Lmax] and seq_lens [{B}] expected")
        if out is None:
            out = torch.empty(B, H, Dv, dtype=_F32)
        elif out.numel() != B * H * Dv:
            raise ValueError(f"paged_attention_decode: out must have [{B}, {H}, {Dv}] elements")
        a, addr = self._args()
        a.op = _OP_PAGED_ATTENTION_DECODE
        (qp, ldq), (kp, vp, kv_type) = _rows_ptr(q, "attention q"), _pool_ptrs(k_pool, v_pool)
        ip, lp = _i64_ptr(kv_indices, "kv_indices"), _i64_ptr(seq_lens, "seq_lens")
        op, nt = _f32_ptr(out, "attention out"), torch.get_num_threads()
        sp = _f32_ptr(sinks, "attention sinks") if sinks is not None else 0
        a.i[0:18] = (
            qp, ldq, kp, vp, kv_type, S, ip, kv_indices.shape[1], lp,
            B, H, Hkv, D, Dv, window or 0, op, nt, sp,
        )  # fmt: skip
        a.f[0], a.f[1] = scale, softcap or 0.0
        keep = (sinks,) if sinks is not None else ()
        self._run(a, addr, "paged_attention_decode", q, k_pool, v_pool, kv_indices, seq_lens, out, *keep)
        return out

    def kv_write(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        slot_mapping: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
    ) -> None:
        T, Hkv, D = k.shape
        S, Dv = k_pool.shape[0], v_pool.shape[2]
        if v.shape[:2] != (T, Hkv) or k_pool.shape[1:] != (Hkv, D) or v_pool.shape[:2] != (S, Hkv):
            raise ValueError(
                f"kv_write: k [T, Hkv, D], v [T, Hkv, Dv] into pools [S, Hkv, D*]; found {list(k.shape)}, "
                f"{list(v.shape)}, {list(k_pool.shape)}, {list(v_pool.shape)}"
            )
        if slot_mapping.numel() != T:
            raise ValueError(f"kv_write: slot_mapping has {slot_mapping.numel()} slots for {T} tokens")
        (kp, ldk), (vp, ldv) = _rows_ptr(k, "kv_write k"), _rows_ptr(v, "kv_write v")
        kpool, vpool, kv_type = _pool_ptrs(k_pool, v_pool)
        a, addr = self._args()
        a.op = _OP_KV_WRITE
        a.i[0:13] = (
            kp,
            ldk,
            vp,
            ldv,
            _i64_ptr(slot_mapping, "slot_mapping"),
            T,
            Hkv,
            D,
            Dv,
            kpool,
            vpool,
            kv_type,
            S,
        )
        self._run(a, addr, "kv_write", k, v, slot_mapping, k_pool, v_pool)

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
        n, H, D, S, Hkv, Dv = _check_heads("attention_prefill", "n", q, k_pool, v_pool, sinks, softcap)
        if D > MAX_HEAD_DIM or Dv > MAX_HEAD_DIM:
            raise UnsupportedInput(f"attention_prefill: head dims {D} / {Dv} above {MAX_HEAD_DIM}")
        if ctx < 0 or kv_slots.dim() != 1 or kv_slots.numel() < ctx + n:
            raise ValueError(
                f"attention_prefill: kv_slots [≥ {ctx + n}] expected, found {list(kv_slots.shape)}"
            )
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
        a, addr = self._args()
        a.op = _OP_ATTENTION_PREFILL
        a.i[0:17] = (
            qp, ldq, kp, vp, kv_type, S, ip, n, ctx, H, Hkv, D, Dv, window or 0, sp, op, ldo,
        )  # fmt: skip
        a.i[17] = torch.get_num_threads()
        a.f[0], a.f[1] = scale, softcap or 0.0
        keep = (sinks,) if sinks is not None else ()
        self._run(a, addr, "attention_prefill", q, k_pool, v_pool, kv_slots, out, *keep)
        return out
