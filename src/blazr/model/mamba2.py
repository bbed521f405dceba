"""Mamba2 mixer: in_proj → causal depthwise conv + SiLU over [x | B | C] → SSD scan (+ D skip) → gated RMSNorm
→ out_proj. Standard causal SSD (HF `Mamba2Mixer` / state-spaces `Mamba2`), with oxidizr's options (biases,
dt clamp, full-width or grouped gated norm) selected by `Mamba2Config`.

One step's flat layout (see `ForwardBatch`):
- no cache (reference forward): every sequence runs from zero state and nothing is stored;
- decode rows (the first Bd sequences, one token each): one batched recurrent step, the kernel op
  `mamba2_step` (conv step, dt, state update and D skip; `cache.conv` / `cache.ssm` advanced in place at
  `state_slots`; its torch reference `mamba2_step_reference` where the C kernels do not apply);
- prefill rows: per sequence, chunked SSD starting from the slot's state when `context_len > 0` (a chunked
  prefill continues) or from zeros when it is 0 (the slot may hold a previous owner's state); the final
  conv and SSM states are written back.

Parameters (HF names): in_proj [2·Di + 2·G·N + H, D] split as [z | xBC | dt]; conv1d.weight [Cd, 1, K]
(+ bias); dt_bias, A_log, D [H]; norm.weight [Di]; out_proj [D, Di].
Shapes: T tokens, D hidden, H heads, P head dim, Di = H·P, G groups, N state, K conv kernel,
Cd = Di + 2·G·N conv channels, S state slots, Bd decode rows, n tokens of one prefill sequence.
Numerics: conv + SiLU in the weights' dtype, as HF (decode accumulates its K taps in float32, then rounds);
dt = clamp(softplus(dt_raw + dt_bias), dt_min, dt_max), the scan, D skip and gated norm in float32, cast back
to the input dtype before out_proj. Two deliberate differences from HF's torch path: softplus(dt) is float32
(HF: model dtype; identical for float32 models), and the decode step clamps dt too (HF's recurrent step
ignores `time_step_limit`, so its cached decode disagrees with its own full forward when a limit is set).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from blazr.config import Mamba2Config
from blazr.kernels import ops
from blazr.model.norm import GatedRMSNorm
from blazr.model.ssd import ssd_chunked
from blazr.state.batch import ForwardBatch
from blazr.state.kv_cache import LayerCache


class Mamba2(nn.Module):
    """The Mamba2 (SSD) mixer of one layer. `forward(x [T, D], batch, cache) → [T, D]`."""

    def __init__(self, cfg: Mamba2Config, hidden_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        H, Di, Cd, K = cfg.num_heads, cfg.d_inner, cfg.conv_dim, cfg.conv_kernel
        self.in_proj = nn.Linear(hidden_size, Di + Cd + H, bias=cfg.has_in_proj_bias)
        self.conv1d = nn.Conv1d(Cd, Cd, K, groups=Cd, bias=cfg.has_conv_bias)  # weight [Cd, 1, K]
        # HF's initialisation (A = -(1..H), D = 1, dt log-spread over [1e-3, 1e-1]); loading overwrites it.
        dt_init = torch.exp(torch.linspace(math.log(1e-3), math.log(1e-1), H))
        self.dt_bias = nn.Parameter(dt_init + torch.log(-torch.expm1(-dt_init)))  # softplus⁻¹
        self.A_log = nn.Parameter(torch.log(torch.arange(1, H + 1, dtype=torch.float32)))
        self.D = nn.Parameter(torch.ones(H))
        self.norm = (
            GatedRMSNorm(Di, cfg.norm_group_size or Di, cfg.norm_eps, cfg.is_norm_before_gate)
            if cfg.has_gated_norm
            else None
        )
        self.out_proj = nn.Linear(Di, hidden_size, bias=cfg.has_out_proj_bias)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: LayerCache | None) -> torch.Tensor:
        cfg = self.cfg
        H, P, Di = cfg.num_heads, cfg.head_dim, cfg.d_inner
        T = x.shape[0]
        z, xBC, dt_raw = self.in_proj(x).split([Di, cfg.conv_dim, H], dim=-1)

        is_cached = cache is not None and batch.state_slots is not None
        nd = batch.num_decodes if is_cached else 0
        if nd:  # one token per sequence: the fused step (kernel op), D skip included
            yd = ops.mamba2_step(
                xBC[:nd], dt_raw[:nd], batch.state_slots[:nd], self.conv1d.weight[:, 0], self.conv1d.bias,
                cache.conv, self.dt_bias, self.A_log, self.D, cache.ssm, cfg.n_groups, cfg.dt_min, cfg.dt_max,
            )  # fmt: skip
        if nd and nd == T:  # decode only
            return self._output(yd.view(T, Di), z, x.dtype)
        y = x.new_empty(T, H, P, dtype=torch.float32)
        if nd:
            y[:nd] = yd
        A = -torch.exp(self.A_log.float())  # [H]
        dt = F.softplus(dt_raw.float() + self.dt_bias.float()).clamp(cfg.dt_min, cfg.dt_max)  # [T, H]
        slots, conv_states, ssm_states = [], [], []
        for b, start in enumerate(batch.query_starts[nd:], start=nd):
            rows = slice(start, start + batch.query_lens[b])
            slot = batch.state_slots[b : b + 1] if is_cached else None  # [1], stays on device
            conv0 = ssm0 = None
            if slot is not None and batch.context_lens[b] > 0:  # continue; context 0 = fresh, ignore the slot
                conv0, ssm0 = cache.conv.index_select(0, slot)[0], cache.ssm.index_select(0, slot)[0]
            ys, xs, conv1, ssm1 = self._prefill(xBC[rows], dt[rows], A, conv0, ssm0)
            y[rows] = ys + xs * self.D.float()[:, None]  # D skip with the un-scaled x
            if slot is not None:
                slots.append(slot)
                conv_states.append(conv1)
                ssm_states.append(ssm1)
        if slots:
            idx = torch.cat(slots)
            cache.conv.index_copy_(0, idx, torch.stack(conv_states).to(cache.conv.dtype))
            cache.ssm.index_copy_(0, idx, torch.stack(ssm_states).to(cache.ssm.dtype))

        return self._output(y.view(T, Di), z, x.dtype)

    def _output(self, y: torch.Tensor, z: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Gate (gated RMSNorm, or plain SiLU gating) and out_proj: y, z [T, Di] → [T, D] in `dtype`."""
        if self.norm is not None:
            y = self.norm(y, z)  # float32 [T, Di]
        else:  # the gate alone
            y = ops.gated_rms_norm(y, z, None, y.shape[-1], 0.0, False)
        return self.out_proj(y.to(dtype))

    def _conv(self, window: torch.Tensor) -> torch.Tensor:
        """window [B, Cd, K-1 + n] (context, new tokens) → SiLU(conv) [B, Cd, n] in the weights' dtype."""
        w = self.conv1d.weight
        out = F.conv1d(window.to(w.dtype), w, self.conv1d.bias, groups=self.cfg.conv_dim)
        return F.silu(out)

    def _split_xbc(self, xbc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """xbc [..., Cd] (post-conv) → x [..., H, P], B [..., G, N], C [..., G, N], float32."""
        cfg = self.cfg
        GN = cfg.n_groups * cfg.state_size
        xs, B, C = xbc.float().split([cfg.d_inner, GN, GN], dim=-1)
        lead = xbc.shape[:-1]
        return (
            xs.reshape(*lead, cfg.num_heads, cfg.head_dim),
            B.reshape(*lead, cfg.n_groups, cfg.state_size),
            C.reshape(*lead, cfg.n_groups, cfg.state_size),
        )

    def _prefill(
        self,
        xBC: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        conv_state: torch.Tensor | None,
        ssm_state: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """n tokens of one sequence: xBC [n, Cd]; dt [n, H]; conv_state [Cd, K-1] and ssm_state [H, P, N]
        to continue from (None: zeros). Returns y [n, H, P] (without D), post-conv x [n, H, P], and the
        conv [Cd, K-1] and SSM [H, P, N] states after the last token."""
        cfg = self.cfg
        K = cfg.conv_kernel
        cols = xBC.t()  # [Cd, n]
        if conv_state is None:
            window = F.pad(cols, (K - 1, 0))  # zero left context
        else:
            window = torch.cat([conv_state.to(cols.dtype), cols], dim=-1)  # [Cd, K-1 + n]
        conv_next = window[:, window.shape[1] - (K - 1) :]
        xs, B, C = self._split_xbc(self._conv(window[None])[0].t())  # [n, Cd] → x, B, C
        y, ssm_next = ssd_chunked(
            xs[None],
            dt[None],
            A,
            B[None],
            C[None],
            cfg.chunk_size,
            None if ssm_state is None else ssm_state[None],
        )
        return y[0], xs, conv_next, ssm_next[0]
