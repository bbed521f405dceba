"""Renames for HF `FalconH1ForCausalLM`, folding its per-weight µP multipliers into the weights at load.

transformers computes, per layer (h the normed hidden state):
    mamba: in_proj(h · ssm_in) ⊙ mup_vector → … → out_proj(·) · ssm_out
    attention: q = q_proj(h · attn_in), k = k_proj(h · attn_in) · key, v = v_proj(h · attn_in),
               o_proj(·) · attn_out
    mlp: down_proj(up_proj(x) · silu(gate_proj(x) · gate)) · down
Each product is linear in one weight, so it folds exactly: W·s for an input scale, diag(m)·W (and m·b) for
an output scale; mup_vector scales in_proj's row segments [z Di | x Di | B G·N | C G·N | dt H] by
ssm_multipliers[0..4]. (RoPE is linear, so the key multiplier folds across it.)"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from blazr.config import Mamba2Config, ModelConfig
from blazr.detect.falcon_h1 import FalconH1ModelConfig, FalconH1Multipliers
from blazr.loading.names import NameMap, Transform

L = r"layers\.(\d+)\."
M = r"model.layers.\1."


def _scaled(factor: float) -> Callable[[re.Match[str]], Transform | None]:
    """Multiply the tensor by `factor` (in float32; the loader then casts to the compute dtype)."""
    return lambda m: None if factor == 1.0 else (lambda t: t.float() * factor)


def _in_proj(cfg: ModelConfig, mult: FalconH1Multipliers) -> Callable[[re.Match[str]], Transform | None]:
    """in_proj rows × mup_vector segment; weight columns × ssm_in (the input scale; not the bias)."""

    def transform(m: re.Match[str]) -> Transform | None:
        s = cfg.layers[int(m.group(1))].mixer(Mamba2Config)
        assert s is not None
        GN = s.n_groups * s.state_size
        sizes = [s.d_inner, s.d_inner, GN, GN, s.num_heads]
        input_scale = mult.ssm_in if m.group(2) == "weight" else 1.0
        if input_scale == 1.0 and all(x == 1.0 for x in mult.ssm):
            return None

        rows = torch.cat([torch.full((n,), x) for n, x in zip(sizes, mult.ssm, strict=True)])  # float32

        def fold(t: torch.Tensor) -> torch.Tensor:
            return t.float() * (rows[:, None] * input_scale if t.dim() == 2 else rows)

        return fold

    return transform


def falcon_h1_names(cfg: ModelConfig) -> NameMap:
    mult = cfg.multipliers if isinstance(cfg, FalconH1ModelConfig) else FalconH1Multipliers()
    qkv_in, k_in = _scaled(mult.attention_in), _scaled(mult.attention_in * mult.key)
    return (
        NameMap()
        .add(r"embed_tokens\.weight", "model.embed_tokens.weight")
        .add(r"norm\.weight", "model.final_layernorm.weight")
        .add(r"lm_head\.weight", "lm_head.weight")
        .add(L + r"mixer_norm\.weight", M + "input_layernorm.weight")
        .add(L + r"ffn_norm\.weight", M + "pre_ff_layernorm.weight")
        # Mamba2
        .add(L + r"mamba\.in_proj\.(weight|bias)", M + r"mamba.in_proj.\2", _in_proj(cfg, mult))
        .add(L + r"mamba\.out_proj\.(weight|bias)", M + r"mamba.out_proj.\2", _scaled(mult.ssm_out))
        .add(L + r"mamba\.(.+)", M + r"mamba.\2")
        # attention (logical q/k/v parts of blazr's fused qkv_proj)
        .add(L + r"attn\.([qv])_proj\.weight", M + r"self_attn.\2_proj.weight", qkv_in)
        .add(L + r"attn\.k_proj\.weight", M + "self_attn.k_proj.weight", k_in)
        .add(L + r"attn\.k_proj\.bias", M + "self_attn.k_proj.bias", _scaled(mult.key))
        .add(L + r"attn\.o_proj\.(weight|bias)", M + r"self_attn.o_proj.\2", _scaled(mult.attention_out))
        .add(L + r"attn\.(.+)", M + r"self_attn.\2")
        # SwiGLU (logical gate/up parts of blazr's fused gate_up_proj)
        .add(L + r"mlp\.gate_proj\.(weight|bias)", M + r"feed_forward.gate_proj.\2", _scaled(mult.mlp_gate))
        .add(L + r"mlp\.down_proj\.(weight|bias)", M + r"feed_forward.down_proj.\2", _scaled(mult.mlp_down))
        .add(L + r"mlp\.(.+)", M + r"feed_forward.\2")
    )


NAME_MAPS = {"FalconH1ForCausalLM": falcon_h1_names}
