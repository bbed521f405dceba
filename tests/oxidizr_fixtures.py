"""Tiny random oxidizr checkpoints written exactly as the trainer saves them (spec §1-§3): one safetensors
file named `{name}_{seq}_{params}_f32_final.safetensors`, tensors under oxidizr names, and optionally the
trainer's config.json (which omits n_groups, rope_theta and kv_heads)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file


@dataclass(frozen=True)
class OxSizes:
    hidden: int = 64
    vocab: int = 512
    heads: int = 2  # MLA / GQA query heads (head_dim = hidden / heads)
    kv_heads: int = 1  # GQA
    kv_latent: int = 32
    q_latent: int = 32
    d_rope: int = 8
    experts: int = 4
    experts_per_tok: int = 2
    intermediate: int = 128
    mamba_heads: int = 8
    mamba_head_dim: int = 16  # d_inner = 128 = 2 × hidden
    state: int = 16
    groups: int = 1
    conv_kernel: int = 4
    chunk: int = 16
    max_seq_len: int = 256
    layers: tuple[str, ...] = field(default=("Mamba2", "Mamba2", "Mamba2", "MlaWithMoe"))


NANO_START = OxSizes(
    hidden=128,
    heads=4,
    kv_latent=64,
    q_latent=64,
    experts=2,
    experts_per_tok=1,
    intermediate=256,
    mamba_heads=16,
    mamba_head_dim=16,
    state=32,
    chunk=32,
    layers=("Mamba2", "Mamba2", "Mamba2", "MlaWithMoe"),
)
NANO = OxSizes(layers=("Mamba2",) * 3 + ("MlaWithMoe",) + ("Mamba2",) * 3 + ("MlaWithMoe",))
GQA_ONLY = OxSizes(hidden=128, heads=2, kv_heads=1, intermediate=256, layers=("Standard", "Standard"))


def _rand(g: torch.Generator, *shape: int, std: float = 0.1) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * std


def oxidizr_tensors(s: OxSizes, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    H, hd = s.hidden, s.hidden // s.heads
    t: dict[str, torch.Tensor] = {
        "embed_tokens.weight": _rand(g, s.vocab, H, std=1.0),
        "norm.weight": 1 + _rand(g, H),
        "lm_head.weight": _rand(g, s.vocab, H, std=0.2),
    }
    for i, kind in enumerate(s.layers):
        p = f"layers.{i}."
        if kind == "Mamba2":
            di = s.mamba_heads * s.mamba_head_dim
            cd = di + 2 * s.groups * s.state
            m = p + "mamba2.mixer."
            t[p + "mamba2.norm.weight"] = 1 + _rand(g, H)
            t[p + "mamba2.norm.bias"] = _rand(g, H)
            t[m + "in_proj.weight"] = _rand(g, di + cd + s.mamba_heads, H, std=0.2)
            t[m + "in_proj.bias"] = _rand(g, di + cd + s.mamba_heads)
            t[m + "conv1d.weight"] = _rand(g, cd, 1, s.conv_kernel, std=0.3)
            t[m + "conv1d.bias"] = _rand(g, cd)
            dt = torch.empty(s.mamba_heads).uniform_(0.001, 0.1, generator=g)
            t[m + "dt_bias"] = dt + torch.log(-torch.expm1(-dt))
            t[m + "A_log"] = torch.log(torch.empty(s.mamba_heads).uniform_(1, 16, generator=g))
            t[m + "D"] = 1 + _rand(g, s.mamba_heads)
            t[m + "norm.weight"] = 1 + _rand(g, di)
            t[m + "out_proj.weight"] = _rand(g, H, di, std=0.2)
            t[m + "out_proj.bias"] = _rand(g, H)
            continue
        t[p + "input_layernorm.weight"] = 1 + _rand(g, H)
        t[p + "post_attention_layernorm.weight"] = 1 + _rand(g, H)
        a = p + "self_attn."
        if kind == "Standard":
            t[a + "q_proj.weight"] = _rand(g, H, H, std=0.2)
            t[a + "k_proj.weight"] = _rand(g, s.kv_heads * hd, H, std=0.2)
            t[a + "v_proj.weight"] = _rand(g, s.kv_heads * hd, H, std=0.2)
            t[a + "o_proj.weight"] = _rand(g, H, H, std=0.2)
        else:
            t[a + "w_dkv.weight"] = _rand(g, s.kv_latent, H, std=0.2)
            t[a + "w_dq.weight"] = _rand(g, s.q_latent, H, std=0.2)
            t[a + "w_uq.weight"] = _rand(g, s.heads * hd, s.q_latent, std=0.2)
            t[a + "w_uk.weight"] = _rand(g, s.heads * hd, s.kv_latent, std=0.2)
            t[a + "w_uv.weight"] = _rand(g, s.heads * hd, s.kv_latent, std=0.2)
            t[a + "w_qr.weight"] = _rand(g, s.heads * s.d_rope, H, std=0.2)
            t[a + "w_kr.weight"] = _rand(g, s.d_rope, H, std=0.2)
            t[a + "o_proj.weight"] = _rand(g, H, H, std=0.2)
        mlps = []
        if kind == "MlaWithMoe":
            t[p + "moe.router.gate.weight"] = _rand(g, s.experts, H, std=0.5)
            mlps = [f"{p}moe.experts.{e}." for e in range(s.experts)] + [p + "moe.shared_expert."]
        else:
            mlps = [p + "mlp."]
        for q in mlps:
            t[q + "gate_proj.weight"] = _rand(g, s.intermediate, H, std=0.2)
            t[q + "up_proj.weight"] = _rand(g, s.intermediate, H, std=0.2)
            t[q + "down_proj.weight"] = _rand(g, H, s.intermediate, std=0.2)
    return t


def trainer_config(s: OxSizes) -> dict:
    """config.json as oxidizr's BlazrConfig writes it (spec §2.3): no n_groups, rope_theta or kv_heads."""
    cfg = {
        "hidden_size": s.hidden,
        "num_layers": len(s.layers),
        "vocab_size": s.vocab,
        "num_attention_heads": s.heads,
        "intermediate_size": s.intermediate,
        "rms_norm_eps": 1e-5,
        "max_seq_len": s.max_seq_len,
    }
    if "Mamba2" in s.layers:
        cfg |= {
            "mamba2_num_heads": s.mamba_heads,
            "mamba2_head_dim": s.mamba_head_dim,
            "mamba2_state_size": s.state,
            "mamba2_chunk_size": s.chunk,
            "mamba2_expand": s.mamba_heads * s.mamba_head_dim // s.hidden,
            "mamba2_conv_kernel": s.conv_kernel,
            "mamba_layers": [i for i, k in enumerate(s.layers) if k == "Mamba2"],
        }
    if any(k.startswith("Mla") for k in s.layers):
        cfg |= {
            "kv_latent_dim": s.kv_latent,
            "q_latent_dim": s.q_latent,
            "d_rope": s.d_rope,
            "num_experts": s.experts,
            "experts_per_tok": s.experts_per_tok,
            "shared_expert_enabled": True,
        }
    return cfg


def write_oxidizr(path: Path, s: OxSizes, with_config: bool = True, seed: int = 0) -> Path:
    """Write the checkpoint into directory `path`; returns the safetensors file."""
    path.mkdir(parents=True, exist_ok=True)
    tensors = oxidizr_tensors(s, seed)
    params = sum(v.numel() for v in tensors.values())
    f = path / f"tiny_{s.max_seq_len}_{math.ceil(params / 1e6)}m_f32_final.safetensors"
    save_file(tensors, f)
    if with_config:
        (path / "config.json").write_text(json.dumps(trainer_config(s), indent=2))
    return f
