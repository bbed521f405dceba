"""The bindings of the MoE kernels (router top-k, chosen experts) and the MLA decode kernels (latent cache
write, absorbed decode attention), mixed into `Kernels` (bindings.py). Shapes as in `ops.py`."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from blazr.kernels.calls import _F32, UnsupportedInput, _f32_ptr, _i64_ptr
from blazr.kernels.formats import ELEMENT_CODES
from blazr.kernels.quant import QuantizedWeight
from blazr.kernels.reference import ACTIVATIONS
from blazr.kernels.reference_moe_mla import head_stride

_OP_MOE_ROUTE, _OP_MOE_EXPERTS, _OP_MLA_CACHE_WRITE, _OP_MLA_DECODE = 14, 15, 16, 17  # blazr_kernels.h
_OP_LINEAR_HEADS = 20


def _heads_ptr(t: torch.Tensor, what: str) -> tuple[int, int, int]:
    """(data_ptr, row stride, head stride) of fp32 CPU heads [B, H, D] whose D features are contiguous (a
    view of each head's part of a fused projection output)."""
    if t.dtype is not _F32 or not t.is_cpu or t.dim() != 3 or t.stride(2) != 1:
        raise UnsupportedInput(
            f"{what}: expected fp32 CPU [B, H, D] with contiguous features, found {t.dtype}"
        )
    return t.data_ptr(), t.stride(0), t.stride(1)


def _pool_ptr(pool: torch.Tensor, what: str) -> tuple[int, int]:
    if pool.dtype not in ELEMENT_CODES or not pool.is_cpu or not pool.is_contiguous() or pool.dim() != 2:
        raise UnsupportedInput(f"{what}: expected a contiguous CPU [S, W] fp32 / bf16 / fp16 pool")
    return pool.data_ptr(), ELEMENT_CODES[pool.dtype]


class MoEMLABindings:
    """`moe_route`, `moe_experts`, `mla_cache_write`, `mla_decode`, `linear_heads`; uses the `_args()` /
    `_run()` / `weight_code()` of the Kernels it is mixed into."""

    def moe_route(
        self,
        logits: torch.Tensor,
        bias: torch.Tensor | None,
        sigmoid: bool,
        num_groups: int,
        topk_groups: int,
        group_top2: bool,
        top_k: int,
        renorm: bool,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        T, E = logits.shape
        if bias is not None and bias.numel() != E:
            raise ValueError(f"moe_route: bias has {bias.numel()} elements for {E} experts")
        weights = torch.empty(T, top_k, dtype=_F32)
        ids = torch.empty(T, top_k, dtype=torch.int64)
        a, addr = self._args()
        a.op = _OP_MOE_ROUTE
        a.i[0:12] = (
            _f32_ptr(logits, "moe_route logits"), T, E, _f32_ptr(bias, "moe_route bias"), int(sigmoid),
            num_groups, topk_groups, int(group_top2), top_k, int(renorm), weights.data_ptr(), ids.data_ptr(),
        )  # fmt: skip
        a.f[0] = scale
        self._run(a, addr, "moe_route", logits, bias, weights, ids)
        return weights, ids

    def moe_experts(
        self,
        x: torch.Tensor,
        ids: torch.Tensor,
        weights: torch.Tensor,
        w_up: QuantizedWeight,
        w_down: QuantizedWeight,
        num_experts: int,
        activation: str,
        gated: bool,
        *,
        up_bias: torch.Tensor | None = None,
        down_bias: torch.Tensor | None = None,
        swiglu_alpha: float = 1.702,
        swiglu_limit: float = 7.0,
    ) -> torch.Tensor:
        T, D = x.shape
        E, k = num_experts, ids.shape[1]
        I = w_down.in_features
        n_up = 2 * I if gated else I
        if (
            ids.shape != (T, k)
            or weights.shape != (T, k)
            or (w_up.out_features, w_up.in_features) != (E * n_up, D)
            or w_down.out_features != E * D
            or w_up.data.shape[0] % E
            or w_down.data.shape[0] % E
        ):
            raise ValueError(
                f"moe_experts: x {list(x.shape)}, ids {list(ids.shape)}, weights {list(weights.shape)}, "
                f"w_up [{w_up.out_features}, {w_up.in_features}], w_down [{w_down.out_features}, {I}] for "
                f"{E} stacked experts (gated={gated}) are inconsistent"
            )
        if not (w_up.data.is_cpu and w_down.data.is_cpu):
            raise UnsupportedInput("moe_experts: the expert weights are not on the CPU")
        if (up_bias is not None and up_bias.shape != (E, n_up)) or (
            down_bias is not None and down_bias.shape != (E, D)
        ):
            raise ValueError(f"moe_experts: biases [{E}, {n_up}] and [{E}, {D}] expected")
        if activation == "swiglu_oai" and not gated:
            raise ValueError("moe_experts: swiglu_oai is a gated activation")
        out = torch.empty(T, D, dtype=_F32)
        a, addr = self._args()
        a.op = _OP_MOE_EXPERTS
        a.i[0:20] = (
            _f32_ptr(x, "moe_experts x"), T, D, _i64_ptr(ids, "moe_experts ids"),
            _f32_ptr(weights, "moe_experts weights"), k, E, self.weight_code(w_up), w_up.data.data_ptr(),
            w_up.nbytes // E, self.weight_code(w_down), w_down.data.data_ptr(), w_down.nbytes // E, I,
            ACTIVATIONS.index(activation), int(gated), out.data_ptr(), torch.get_num_threads(),
            _f32_ptr(up_bias, "moe_experts up bias"), _f32_ptr(down_bias, "moe_experts down bias"),
        )  # fmt: skip
        a.f[0], a.f[1] = swiglu_alpha, swiglu_limit
        biases = tuple(b for b in (up_bias, down_bias) if b is not None)
        self._run(a, addr, "moe_experts", x, ids, weights, w_up.data, w_down.data, out, *biases)
        return out

    def mla_cache_write(
        self,
        kv: torch.Tensor,
        norm_weight: torch.Tensor | None,
        eps: float,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slots: torch.Tensor,
        pool: torch.Tensor,
    ) -> None:
        T, W = kv.shape
        R = 2 * cos.shape[1]
        L = W - R
        if pool.shape[-1] != W or positions.numel() != T or slots.numel() != T or cos.shape != sin.shape:
            raise ValueError(
                f"mla_cache_write: kv {list(kv.shape)}, pool {list(pool.shape)}, {positions.numel()} "
                f"positions, {slots.numel()} slots, cos {list(cos.shape)} are inconsistent"
            )
        if norm_weight is not None and norm_weight.numel() != L:
            raise ValueError(f"mla_cache_write: norm weight has {norm_weight.numel()} elements, c_kv {L}")
        if kv.dtype is not _F32 or not kv.is_cpu or kv.stride(1) != 1:
            raise UnsupportedInput("mla_cache_write: kv must be fp32 CPU rows")
        pp, kv_type = _pool_ptr(pool, "mla_cache_write pool")
        a, addr = self._args()
        a.op = _OP_MLA_CACHE_WRITE
        a.i[0:14] = (
            kv.data_ptr(), kv.stride(0), T, L, R, _f32_ptr(norm_weight, "mla_cache_write norm"),
            _i64_ptr(positions, "mla_cache_write positions"), _f32_ptr(cos, "cos"), _f32_ptr(sin, "sin"),
            cos.shape[0], _i64_ptr(slots, "mla_cache_write slots"), pp, kv_type, pool.shape[0],
        )  # fmt: skip
        a.f[0] = eps
        self._run(a, addr, "mla_cache_write", kv, norm_weight, positions, cos, sin, slots, pool)

    def mla_decode(
        self,
        q_lat: torch.Tensor,
        q_rope: torch.Tensor,
        pool: torch.Tensor,
        kv_indices: torch.Tensor,
        seq_lens: torch.Tensor | Sequence[int],
        scale: float,
    ) -> torch.Tensor:
        if not isinstance(seq_lens, torch.Tensor):
            seq_lens = torch.tensor(seq_lens, dtype=torch.int64)
        B, H, L = q_lat.shape
        R = q_rope.shape[2]
        S, W = pool.shape
        if (
            q_rope.shape[:2] != (B, H)
            or W != L + R
            or kv_indices.dim() != 2
            or kv_indices.shape[0] != B
            or seq_lens.numel() != B
        ):
            raise ValueError(
                f"mla_decode: q_lat {list(q_lat.shape)}, q_rope {list(q_rope.shape)}, pool "
                f"{list(pool.shape)}, kv_indices {list(kv_indices.shape)}, {seq_lens.numel()} seq_lens are "
                "inconsistent"
            )
        (ql, ldl, hsl), (qr, ldr, hsr) = _heads_ptr(q_lat, "q_lat"), _heads_ptr(q_rope, "q_rope")
        pp, kv_type = _pool_ptr(pool, "mla_decode pool")
        out = torch.empty(B, H, L, dtype=_F32)
        a, addr = self._args()
        a.op = _OP_MLA_DECODE
        a.i[0:18] = (
            ql, ldl, hsl, qr, ldr, hsr, pp, kv_type, S, _i64_ptr(kv_indices, "kv_indices"),
            kv_indices.shape[1], _i64_ptr(seq_lens, "seq_lens"), B, H, R, L, out.data_ptr(),
            torch.get_num_threads(),
        )  # fmt: skip
        a.f[0] = scale
        self._run(a, addr, "mla_decode", q_lat, q_rope, pool, kv_indices, seq_lens, out)
        return out

    def linear_heads(self, x: torch.Tensor, w: QuantizedWeight) -> torch.Tensor:
        B, H, K = x.shape
        stride = head_stride(w, H)  # ValueError for a weight whose heads do not split
        if w.in_features != K:
            raise ValueError(f"linear_heads: x {list(x.shape)} for a weight of in_features {w.in_features}")
        if not w.data.is_cpu:
            raise UnsupportedInput("linear_heads: the weight is not on the CPU")
        N = w.out_features // H
        xp, ldx, hsx = _heads_ptr(x, "linear_heads x")
        out = torch.empty(B, H, N, dtype=_F32)
        a, addr = self._args()
        a.op = _OP_LINEAR_HEADS
        a.i[0:14] = (
            xp, ldx, hsx, B, H, K, self.weight_code(w), w.data.data_ptr(), stride, N, out.data_ptr(),
            H * N, N, torch.get_num_threads(),
        )  # fmt: skip
        self._run(a, addr, "linear_heads", x, w.data, out)
        return out
