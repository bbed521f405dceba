"""Dense feed-forward: gated SwiGLU/GeGLU with fused gate+up projection, or ungated (relu², NemotronH).
The activation is the kernel op `ops.activation` (SwiGLU fused in the linear kernel's epilogue when the
projection runs on the kernels), so a decode step stays recordable.

Shapes: x [T, D] → [T, D]; gate_up_proj [2I, D] (or up_proj [I, D]); down_proj [D, I].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from blazr.config import Activation, MLPConfig
from blazr.kernels import ops
from blazr.kernels.reference import oai_glu_reference
from blazr.model.qlinear import Linear


def gated_unit(gate: torch.Tensor, up: torch.Tensor, cfg: MLPConfig) -> torch.Tensor:
    """act(gate) · up, or GPT-OSS's clamped SwiGLU (`swiglu_oai`, with the config's alpha and limit)."""
    if cfg.activation == "swiglu_oai":
        return oai_glu_reference(gate, up, cfg.swiglu_alpha, cfg.swiglu_limit)
    return activate(gate, cfg.activation) * up


def activate(x: torch.Tensor, kind: Activation) -> torch.Tensor:
    if kind == "silu":
        return F.silu(x)
    if kind == "gelu":
        return F.gelu(x, approximate="tanh")
    if kind == "gelu_erf":
        return F.gelu(x)
    return torch.square(F.relu(x))


class MLP(nn.Module):
    def __init__(self, cfg: MLPConfig, hidden_size: int) -> None:
        super().__init__()
        if cfg.activation == "swiglu_oai":
            raise ValueError("swiglu_oai is an expert activation (GPT-OSS): a dense MLP does not take it")
        self.cfg = cfg
        if cfg.is_gated:
            self.gate_up_proj = Linear(hidden_size, 2 * cfg.intermediate_size, bias=cfg.has_bias)
        else:
            self.up_proj = Linear(hidden_size, cfg.intermediate_size, bias=cfg.has_bias)
        self.down_proj = Linear(cfg.intermediate_size, hidden_size, bias=cfg.has_bias)

    def forward(self, x: torch.Tensor, *, decode: bool) -> torch.Tensor:
        """x [T, D] → [T, D]; `decode`: the forward's batch is decode-only (model/qlinear.py)."""
        cfg = self.cfg
        if cfg.is_gated and cfg.activation == "silu":
            h = self.gate_up_proj(x, swiglu=True, decode=decode)  # fused in the kernel's epilogue
        elif cfg.is_gated:
            h = ops.activation(self.gate_up_proj(x, decode=decode), cfg.activation, gated=True)
        else:
            h = ops.activation(self.up_proj(x, decode=decode), cfg.activation)
        return self.down_proj(h, decode=decode)
