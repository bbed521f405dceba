"""Mixture of experts: a `Router` that picks k experts per token, `Experts` that run them grouped by expert,
and an optional always-on shared MLP.

Routing (all in float32, from `MoEConfig`):
- scores = softmax or sigmoid of the router logits;
- choice = scores (+ `correction_bias`, used for selection only: DeepSeek-V3 / NemotronH);
- group-limited (num_groups > 1): keep the `topk_groups` groups with the best group score (the group max,
  DeepSeek-V2; the sum of the group's top two, DeepSeek-V3) and choose only inside them;
- ids = top-k of choice; weights = the un-biased scores of those ids, renormalised over the k when
  `is_renormalized`, times `routed_scaling_factor`.
Mixtral / Granite / oxidizr: softmax, renormalised. DeepSeek-V2: softmax, not renormalised, scaled.
DeepSeek-V3 / NemotronH: sigmoid + bias, top-2-sum groups, renormalised, scaled. GPT-OSS: logits with a
bias (`router.bias`), softmax renormalised over the k — transformers' softmax of the top-k logits.
GPT-OSS's experts also have biases and the clamped SwiGLU (`swiglu_oai`, model/mlp.py `gated_unit`), both
in the kernel op too.

The choice itself is the kernel op `ops.moe_route` (its reference `moe_route_reference` is the rule above).

Expert compute (`Experts.forward`): the T·k (token, expert) assignments are sorted by expert id, each expert
that received tokens runs one matmul pair on its contiguous rows, and the outputs are un-sorted and summed
over k in a fixed order (no atomics, so the result does not depend on scheduling). Cost scales with the
experts hit, never with E. Experts kept in a kernel weight format (`Experts.set_stacked`: ggml blocks or
bf16, stacked [E·N, D]) run the kernel op `ops.moe_experts`, which does the same on the quantized rows of
the chosen experts only. `MoE.forward_reference` is the plain per-token loop the tests tie it to.

Decode (a decode-only batch, float32 CPU activations): the whole layer is kernel ops, so a decode step can
be recorded (kernels/capture.py) — router logits through the f32 linear kernel, `moe_route`,
`moe_experts` (float32 experts as an f32 view of their parameters, no copy), the shared MLP, `add`.

Latent MoE (`latent_size`, Nemotron 3 Super): the router and the shared MLP read x [T, D]; the experts run on
`latent_down(x)` [T, Lt] (their up_proj [E, I, Lt], down_proj [E, Lt, I]) and their weighted sum returns
through `latent_up` [D, Lt]. Both are plain linears (quantized by --quantize, on the f32 kernel otherwise).
Expert parallel: each rank sums its own experts in the latent space and applies `latent_up` to that part
(linear, so the ranks' parts add up; its bias on rank 0 only).

Shared MLP gate (`has_shared_gate`, Qwen3-Next): shared(x) · sigmoid(shared_gate(x)), `shared_gate.weight`
[1, D] kept float (as the router), run by the f32 linear kernel and `ops.sigmoid_mul` on float32 CPU rows.

Weights: `router.weight` [E, D]; `router.bias` [E] (GPT-OSS's logit bias, float32);
`router.correction_bias` [E] (float32; keep it so at load); `experts.up_bias` [E, N], `experts.down_bias`
[E, D] (GPT-OSS: the experts' biases, float32, [gate; up] as the up weight's rows);
`experts.gate_up_proj` [E, 2I, D] (gate rows first, then up) or `experts.up_proj` [E, I, D] (ungated,
NemotronH relu²); `experts.down_proj` [E, D, I] (D: Lt for a latent MoE); `latent_down.weight` [Lt, D],
`latent_up.weight` [D, Lt] (+ biases) — or, stacked in a kernel format, `experts.w_up`
[E·N, D] (N = 2I or I) and `experts.w_down` [E·D, I]; `shared.*` an `MLP` (blazr.model.mlp).

Shapes: T tokens, D hidden, E experts, k experts per token, I expert width, G groups, Lt latent width.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from blazr.config import MLPConfig, MoEConfig
from blazr.errors import UnsupportedError
from blazr.kernels import ops
from blazr.kernels.quant import QuantizedWeight
from blazr.model.mlp import MLP, activate, gated_unit
from blazr.model.norm import make_norm
from blazr.model.qlinear import Linear
from blazr.state.batch import ForwardBatch

if TYPE_CHECKING:
    from blazr.distributed.group import TPGroup


class Router(nn.Module):
    """Top-k gate: x [T, D] → (weights [T, k] float32, ids [T, k] long)."""

    def __init__(self, cfg: MoEConfig, hidden_size: int) -> None:
        super().__init__()
        assert cfg.num_experts % cfg.num_groups == 0, "experts split evenly into groups"
        assert cfg.top_k <= cfg.topk_groups * cfg.num_experts // cfg.num_groups, "k experts fit the groups"
        self.cfg = cfg
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, hidden_size))
        if cfg.has_router_bias:  # added to the logits (GPT-OSS), float32 as the logits are
            self.bias = nn.Parameter(torch.zeros(cfg.num_experts, dtype=torch.float32), requires_grad=False)
            self.bias.keep_float32 = True
        if cfg.has_correction_bias:
            self.correction_bias = nn.Parameter(
                torch.zeros(cfg.num_experts, dtype=torch.float32), requires_grad=False
            )
            self.correction_bias.keep_float32 = True  # the loader keeps it in float32 whatever the dtype
        if cfg.input_norm is not None:  # Gemma 4: the router's input scale [D] (times D^-½)
            self.input_scale = nn.Parameter(torch.ones(hidden_size))
        if cfg.has_expert_scale:  # Gemma 4: a learned scale per expert on the chosen weights
            self.expert_scale = nn.Parameter(torch.ones(cfg.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.route(self.logits(x))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Router logits [T, E] float32. Float32 CPU rows take the f32 linear kernel's row-wise path at any T
        (`ops.linear` without `prefill`), so a token's logits — and its routing — are the same bits in a
        prefill as in a decode step (torch's GEMM rounds apart from it)."""
        if ops.cpu_f32(x) and self.weight.dtype == torch.float32:
            return ops.linear(x, QuantizedWeight("f32", self.weight, *self.weight.shape), self.logit_bias())
        return F.linear(x.float(), self.weight.float(), self.logit_bias())

    def logit_bias(self) -> torch.Tensor | None:
        """The router's bias [E] float32 (GPT-OSS), or None."""
        return self.bias if self.cfg.has_router_bias else None

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Router logits [T, E] float32 → (weights [T, k] float32, ids [T, k] long)."""
        cfg = self.cfg
        weights, ids = ops.moe_route(
            logits, self.correction_bias.float() if cfg.has_correction_bias else None,
            cfg.scoring == "sigmoid", cfg.num_groups, cfg.topk_groups, cfg.group_score != "max", cfg.top_k,
            cfg.is_renormalized, cfg.routed_scaling_factor,
        )  # fmt: skip
        if cfg.has_expert_scale:  # weights · expert_scale[ids] as kernel ops: a lookup of [E, 1] rows, × them
            T, k = ids.shape
            scale = ops.embedding(ids.reshape(-1), self.expert_scale.float().view(-1, 1))
            weights = ops.mul(weights.reshape(T * k, 1), scale).view(T, k)
        return weights, ids


class Experts(nn.Module):
    """E expert MLPs stored as stacked 3-D weights; `forward` runs only the experts that received tokens."""

    def __init__(self, cfg: MLPConfig, num_experts: int, hidden_size: int) -> None:
        super().__init__()
        if cfg.activation == "swiglu_oai" and not cfg.is_gated:
            raise UnsupportedError("swiglu_oai experts must be gated")
        self.cfg = cfg
        self.num_experts = E = num_experts
        I = cfg.intermediate_size
        if cfg.is_gated:
            self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * I, hidden_size))
        else:
            self.up_proj = nn.Parameter(torch.empty(E, I, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(E, hidden_size, I))
        if cfg.has_bias:  # GPT-OSS: per expert, [gate; up] as the weight's rows; float32 for the kernel
            self.up_bias = nn.Parameter(torch.empty(E, (2 if cfg.is_gated else 1) * I, dtype=torch.float32))
            self.down_bias = nn.Parameter(torch.empty(E, hidden_size, dtype=torch.float32))
            self.up_bias.keep_float32 = self.down_bias.keep_float32 = True
        self.w_up: QuantizedWeight | None = None  # the stacked kernel-format weights (set_stacked)
        self.w_down: QuantizedWeight | None = None

    def set_stacked(self, w_up: QuantizedWeight, w_down: QuantizedWeight) -> None:
        """Keep the experts in a kernel weight format: w_up [E·N, D] (N = 2I [gate; up] rows, or I), w_down
        [E·D, I], each expert's rows a whole slice of the data (block kinds: N and D multiples of the row
        group). The float parameters are dropped."""
        E, I, up = self.num_experts, self.cfg.intermediate_size, self._float_up()
        N, D = up.shape[1], up.shape[2]
        if (w_up.out_features, w_up.in_features, w_down.out_features, w_down.in_features) != (
            E * N,
            D,
            E * D,
            I,
        ):
            raise ValueError(f"stacked experts: expected w_up [{E * N}, {D}] and w_down [{E * D}, {I}]")
        if w_up.data.shape[0] % E or w_down.data.shape[0] % E:
            raise ValueError("stacked experts: an expert's rows do not start on a whole row group")
        self.w_up, self.w_down = w_up, w_down
        del self.down_proj
        delattr(self, "gate_up_proj" if self.cfg.is_gated else "up_proj")

    def _float_up(self) -> torch.Tensor:
        return self.gate_up_proj if self.cfg.is_gated else self.up_proj

    def stacked(self) -> tuple[QuantizedWeight, QuantizedWeight] | None:
        """(w_up, w_down) for `ops.moe_experts`: the kernel-format weights, or float32 CPU parameters viewed
        as f32 kernel weights (no copy); None for other dtypes / devices."""
        if self.w_up is not None and self.w_down is not None:
            return self.w_up, self.w_down
        up, down = self._float_up(), self.down_proj
        if up.dtype is not torch.float32 or not up.is_cpu:
            return None
        E, N, D = up.shape
        return (
            QuantizedWeight("f32", up.view(E * N, D), E * N, D),
            QuantizedWeight("f32", down.view(E * D, -1), E * D, down.shape[2]),
        )

    def expert(self, e: int, h: torch.Tensor) -> torch.Tensor:
        """Expert e on rows h [n, D] → [n, D]."""
        if self.w_up is not None:
            ids = torch.full((h.shape[0], 1), e, dtype=torch.long)
            return self.kernel(h.float(), torch.ones(h.shape[0], 1), ids).to(h.dtype)
        b_up, b_down = self._biases(e, h.dtype)
        if self.cfg.is_gated:
            gate, up = F.linear(h, self.gate_up_proj[e], b_up).chunk(2, dim=-1)
            a = gated_unit(gate, up, self.cfg)
        else:
            a = activate(F.linear(h, self.up_proj[e], b_up), self.cfg.activation)
        return F.linear(a, self.down_proj[e], b_down)

    def _biases(self, e: int, dtype: torch.dtype) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Expert e's biases (up [N], down [D]) in `dtype`, or (None, None)."""
        if not self.cfg.has_bias:
            return None, None
        return self.up_bias[e].to(dtype), self.down_bias[e].to(dtype)

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x [T, D], weights [T, k] float32, ids [T, k] (-1: none here, weight 0 — only in an expert-parallel
        shard, whose experts are float parameters) → Σ_k weight · expert(x) [T, D] (float32)."""
        if self.w_up is not None:  # the kernel format: the kernel op, prefill and decode alike
            return self.kernel(x.float().contiguous(), weights, ids)
        T, k = ids.shape
        flat_ids = ids.flatten()  # [T·k], assignment a = t·k + j; -1: another rank's expert (expert parallel)
        order = flat_ids.argsort(stable=True)  # assignments grouped by expert (the -1s first)
        counts = torch.bincount(flat_ids + 1, minlength=self.num_experts + 1).tolist()  # one host sync
        xs = x[order // k]  # [T·k, D] token rows in expert order
        ys = torch.zeros_like(xs) if counts[0] else torch.empty_like(xs)
        start = counts[0]
        for e, n in enumerate(counts[1:]):
            if n:
                ys[start : start + n] = self.expert(e, xs[start : start + n])
                start += n
        ys = ys[order.argsort()].view(T, k, x.shape[1])  # back to assignment order
        return (ys.float() * weights[..., None]).sum(dim=1)

    def kernel(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The same function as one kernel op, `ops.moe_experts`, on float32 CPU rows x [T, D] (a decode
        step records it); weights neither in a kernel format nor float32 on the CPU take `forward`."""
        stacked = self.stacked()
        if stacked is None:
            return self(x, weights, ids)
        cfg = self.cfg
        up_bias, down_bias = (self.up_bias, self.down_bias) if cfg.has_bias else (None, None)
        return ops.moe_experts(
            x, ids, weights, *stacked, self.num_experts, cfg.activation, cfg.is_gated, up_bias=up_bias,
            down_bias=down_bias, swiglu_alpha=cfg.swiglu_alpha, swiglu_limit=cfg.swiglu_limit,
        )  # fmt: skip


class MoE(nn.Module):
    """Routed experts (+ shared MLP): x [T, D] → [T, D].

    Expert parallel (`tp`): this rank holds experts [first, first + E / world) of the E the (replicated)
    router chooses among; an assignment to another rank's expert gets weight 0 here (and its expert runs
    there), so the ranks' outputs sum to the whole layer's (the block all-reduces them)."""

    def __init__(self, cfg: MoEConfig, hidden_size: int, tp: TPGroup | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.router = Router(cfg, hidden_size)
        world, rank = (tp.world, tp.rank) if tp is not None else (1, 0)
        self.num_local = cfg.num_experts // world
        self.first_expert = rank * self.num_local
        self.is_sharded = world > 1
        latent, bias = cfg.latent_size, cfg.has_latent_bias
        self.latent_down = Linear(hidden_size, latent, bias=bias) if latent is not None else None
        self.latent_up = Linear(latent, hidden_size, bias=bias) if latent is not None else None
        self.experts = Experts(cfg.expert, self.num_local, latent or hidden_size)
        self.shared = MLP(cfg.shared, hidden_size) if cfg.shared is not None else None
        # Qwen2-MoE / Qwen3-Next: the shared MLP's output scaled by sigmoid(shared_gate(x)), one per token
        self.shared_gate = Linear(hidden_size, 1, bias=False) if cfg.has_shared_gate else None
        # Gemma 4: the experts' RMSNorm of the un-normed input; the router's weightless one
        self.norm = make_norm(cfg.input_norm, hidden_size) if cfg.input_norm is not None else None

    def _inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the router's input, the experts' input): x itself for both, or (Gemma 4, `input_norm`) x's
        weightless RMSNorm times input_scale · D^-½, and the MoE's own RMSNorm of x."""
        if self.norm is None:
            return x, x
        assert self.cfg.input_norm is not None
        if ops.cpu_f32(x):  # kernel ops (recordable): input_scale · unit, then · D^-½
            route_in = ops.rms_norm(x, self.router.input_scale, self.cfg.input_norm.eps)
            return ops.add(route_in, None, alpha=x.shape[-1] ** -0.5, out=route_in), self.norm(x)
        xf = x.float()
        unit = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg.input_norm.eps)
        scale = self.router.input_scale.float() * x.shape[-1] ** -0.5
        return (unit * scale).to(x.dtype), self.norm(x)

    def forward(self, x: torch.Tensor, batch: ForwardBatch | None = None) -> torch.Tensor:
        decode = batch is not None and batch.is_decode_only
        if decode and ops.cpu_f32(x) and not self.is_sharded:
            return self._decode(x)
        route_in, x = self._inputs(x)
        weights, ids = self._local(*self.router(route_in))
        out = self._up(self.experts(self._down(x, decode), weights, ids).to(x.dtype), decode)
        return out + self._shared(x, decode) if self.shared is not None else out

    def _down(self, x: torch.Tensor, decode: bool) -> torch.Tensor:
        """The experts' input: x [T, D], or its latent projection [T, Lt]."""
        return x if self.latent_down is None else self.latent_down(x, decode=decode)

    def _up(self, y: torch.Tensor, decode: bool) -> torch.Tensor:
        """The experts' weighted sum [T, D], or [T, Lt] projected back to [T, D]."""
        return y if self.latent_up is None else self.latent_up(y, decode=decode)

    def _shared(self, x: torch.Tensor, decode: bool) -> torch.Tensor:
        """The shared MLP's output [T, D], gated when the config says so (kernel ops on float32 CPU rows)."""
        assert self.shared is not None
        y = self.shared(x, decode=decode)
        if self.shared_gate is not None:
            w = self.shared_gate.weight
            g = (
                ops.linear(x, QuantizedWeight("f32", w, 1, w.shape[1]))
                if ops.cpu_f32(x)
                else self.shared_gate(x, decode=decode)
            )
            ops.sigmoid_mul(y, g)
        return y

    def _local(self, weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The routing restricted to this rank's experts: ids as local indices, -1 (and weight 0) for an
        expert held by another rank."""
        if not self.is_sharded:
            return weights, ids
        local = ids - self.first_expert
        here = (local >= 0) & (local < self.num_local)
        return torch.where(here, weights, 0.0), torch.where(here, local, -1)

    def _decode(self, x: torch.Tensor) -> torch.Tensor:
        """Decode rows x [B, D] float32 on the CPU, as kernel ops only (recordable)."""
        route_in, x = self._inputs(x)
        weights, ids = self.router(route_in)
        out = self._up(self.experts.kernel(self._down(x, True), weights, ids), True)
        return ops.add(out, self._shared(x, True), out=out) if self.shared is not None else out

    def forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        """The same function as a plain loop over tokens and their k experts (for tests)."""
        route_in, x = self._inputs(x)
        weights, ids = self.router(route_in)
        h = self._down(x, False)
        out = torch.zeros(h.shape, dtype=torch.float32, device=x.device)
        for t in range(x.shape[0]):
            for j in range(ids.shape[1]):
                out[t] += weights[t, j] * self.experts.expert(int(ids[t, j]), h[t : t + 1])[0].float()
        out = self._up(out.to(x.dtype), False)
        return out + self._shared(x, False) if self.shared is not None else out
