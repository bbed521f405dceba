"""Renames for HF GLM-4.5 / GLM-4.6 (`Glm4MoeForCausalLM`): Llama's names (q/k/v biases, the per-head q/k
norms under `self_attn.q_norm` / `k_norm` where the model has them), the dense first layers' `mlp.*`, and on
the MoE layers DeepSeek-V3's: the router `mlp.gate` with `e_score_correction_bias`, the experts per expert
(`mlp.experts.N.{gate,up,down}_proj`, what `save_pretrained` writes) or as transformers' fused 3-D tensors
(`mlp.experts.gate_up_proj` [E, 2I, D], `down_proj` [E, D, I]), the shared MLP `mlp.shared_experts.*`.

The MTP (next-n) blocks after the decoder — `model.layers.{N + j}.*` for N decoder layers, as GLM's
checkpoints store them, and from a GGUF the converter's `blk.{N + j}.*` seen under those names — are left
unread without a warning (detect/glm4_moe.py says why). GLM-4.5 / 4.6 ship one; up to `MAX_MTP_LAYERS` are
recognised, any further layer is reported as an unused tensor.
"""

from __future__ import annotations

from blazr.config import ModelConfig
from blazr.loading.names import NameMap
from blazr.loading.names.llama import llama_names

L = r"layers\.(\d+)\."
M = r"model.layers.\1."
MAX_MTP_LAYERS = 4


def glm4_moe_names(cfg: ModelConfig) -> NameMap:
    mtp = tuple(f"model.layers.{cfg.num_layers + j}." for j in range(MAX_MTP_LAYERS))
    return (
        llama_names()
        .add(L + r"moe\.router\.weight", M + "mlp.gate.weight")
        .add(L + r"moe\.router\.correction_bias", M + "mlp.gate.e_score_correction_bias")
        .add(L + r"moe\.experts\.(gate_up_proj|down_proj)", M + r"mlp.experts.\2")
        .add(L + r"moe\.experts\.(\d+)\.(.+)", M + r"mlp.experts.\2.\3")
        .add(L + r"moe\.shared\.(.+)", M + r"mlp.shared_experts.\2")
        .ignore(*mtp)
    )


NAME_MAPS = {"Glm4MoeForCausalLM": glm4_moe_names}
