"""Renames for HF Qwen3 and Qwen3-MoE: Llama's names (the q/k norms under `self_attn.q_norm` / `k_norm`), and
Qwen3-MoE's sparse layers under `mlp.`: the router `mlp.gate`, the experts per expert
(`mlp.experts.N.{gate,up,down}_proj`, what `save_pretrained` writes) or as transformers' fused 3-D tensors
(`mlp.experts.gate_up_proj` [E, 2I, D], `down_proj` [E, D, I]), loaded whole."""

from __future__ import annotations

from blazr.config import ModelConfig
from blazr.loading.names import NameMap
from blazr.loading.names.llama import llama_names

L = r"layers\.(\d+)\."
M = r"model.layers.\1."


def qwen3_names(cfg: ModelConfig) -> NameMap:
    return (
        llama_names()
        .add(L + r"moe\.router\.weight", M + "mlp.gate.weight")
        .add(L + r"moe\.experts\.(gate_up_proj|down_proj)", M + r"mlp.experts.\2")
        .add(L + r"moe\.experts\.(\d+)\.(.+)", M + r"mlp.experts.\2.\3")
    )


NAME_MAPS = {"Qwen3ForCausalLM": qwen3_names, "Qwen3MoeForCausalLM": qwen3_names}
