"""GLM-4.5 / GLM-4.6 (`Glm4MoeForCausalLM`, transformers' `glm4_moe`) detection: Llama's layout with
- GQA attention, q/k/v biases where `attention_bias`, a per-head q/k RMSNorm where `use_qk_norm` (the 355B
  models; not GLM-4.5-Air), and a partial rope — `partial_rotary_factor` (0.5 by default) of each head's
  features, the first ones, rotated half-split (NeoX) as transformers' `apply_rotary_pos_emb` and llama.cpp's
  glm4moe graph do, so no row permutation;
- a dense SwiGLU MLP (`intermediate_size`) in the first `first_k_dense_replace` layers, then a MoE in every
  layer: DeepSeek-V3's router (sigmoid scores, `e_score_correction_bias` for selection only, `n_group` groups
  scored by their top-2 sum of which `topk_group` are kept, top-`num_experts_per_tok`, renormalised over
  the k where `norm_topk_prob` — whatever k, as transformers —, times `routed_scaling_factor`), routed
  experts of `moe_intermediate_size` and an always-on shared MLP of `n_shared_experts` × that width.

MTP (next-n) layers: GLM checkpoints carry `num_nextn_predict_layers` multi-token-prediction blocks after the
decoder, as layers `model.layers.{num_hidden_layers + j}.` (a whole decoder layer plus `eh_proj`, `enorm`,
`hnorm`, `shared_head.*`). The model never runs them for its own tokens: detection counts only the decoder's
layers and loading leaves those tensors unread without a warning (loading/names/glm4_moe.py). They are
there for speculative decoding, which may use them later.

Without config.json: the sizes from shapes (the head size from q_norm's width, else the common size that
divides q and k rows, with a warning; the decoder layers are the ones without `eh_proj`; the dense layers
the ones without a router); what no shape carries takes transformers' `Glm4MoeConfig` defaults (top-8,
renormalised, scaling 1.0, one group, partial rotary 0.5, rope θ 10000, RMSNorm eps 1e-5), with a warning
for the routing ones.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from blazr.config import AttentionConfig, LayerConfig, MLPConfig, ModelConfig, MoEConfig, NormConfig
from blazr.detect.checkpoint import Shapes
from blazr.detect.llama import llama_attention
from blazr.detect.raw import Raw, activation, layer_indices, need
from blazr.detect.ssm_common import is_tied, require
from blazr.errors import CheckpointError

log = logging.getLogger("blazr.detect")

ARCH = "Glm4MoeForCausalLM"
PREFIX = "model.layers."
_DEFAULT_TOP_K = 8
_DEFAULT_ROTARY = 0.5  # Glm4MoeConfig's partial_rotary_factor default


def _num_layers(raw: Raw, shapes: Shapes) -> int:
    """num_hidden_layers, else the layers that are not MTP blocks (those hold `eh_proj`)."""
    found = [i for i in layer_indices(shapes, PREFIX) if f"{PREFIX}{i}.eh_proj.weight" not in shapes]
    num_layers = raw.int("num_hidden_layers", len(found))
    if not num_layers:
        raise CheckpointError(f"no {PREFIX}N.* tensors found")
    return num_layers


def _partial_rotary_factor(raw: Raw) -> float:
    """v5 `rope_parameters.partial_rotary_factor`, else v4's top-level key, else GLM's 0.5."""
    params = raw.get("rope_parameters") or {}
    value = params.get("partial_rotary_factor") if isinstance(params, dict) else None
    return float(value) if value is not None else raw.float("partial_rotary_factor", _DEFAULT_ROTARY)


def _attention(raw: Raw, shapes: Shapes, hidden: int, max_pos: int, norm: NormConfig) -> AttentionConfig:
    a = f"{PREFIX}0.self_attn."
    rotary = _partial_rotary_factor(raw)
    attention = llama_attention(
        Raw({**raw.data, "partial_rotary_factor": rotary}, raw.path), shapes, a, hidden, max_pos
    )
    has_qk_norm = raw.get("use_qk_norm")
    if has_qk_norm is None:
        has_qk_norm = a + "q_norm.weight" in shapes
    if not has_qk_norm:
        return attention
    q_norm = require(shapes, a + "q_norm.weight")
    if q_norm[0] != attention.head_dim:
        raise CheckpointError(
            f"tensor {a}q_norm.weight: expected [{attention.head_dim}] (one head), found {list(q_norm)}"
        )
    return replace(attention, qk_norm=norm)


def _dense_mlp(raw: Raw, shapes: Shapes, i: int, act: str) -> MLPConfig:
    m = f"{PREFIX}{i}.mlp."
    gate = shapes.get(m + "gate_proj.weight")
    size = need(
        raw.int("intermediate_size", gate[0] if gate else None),
        "intermediate_size",
        f"{m}gate_proj.weight is missing",
    )
    return MLPConfig(intermediate_size=size, activation=act)


def _moe(raw: Raw, shapes: Shapes, i: int, act: str) -> MoEConfig:
    m = f"{PREFIX}{i}.mlp."
    router = require(shapes, m + "gate.weight")
    num_experts = raw.int("n_routed_experts", router[0])
    if num_experts != router[0]:
        raise CheckpointError(
            f"tensor {m}gate.weight: expected {num_experts} rows (n_routed_experts), found {router[0]}"
        )
    expert = shapes.get(m + "experts.0.gate_proj.weight")
    fused = shapes.get(m + "experts.gate_up_proj")  # transformers' own names: [E, 2I, D]
    width = need(
        raw.int("moe_intermediate_size", expert[0] if expert else (fused[1] // 2 if fused else None)),
        "moe_intermediate_size",
        f"{m}experts.0.gate_proj.weight is missing",
    )
    if "n_shared_experts" in raw.data:
        num_shared = raw.int("n_shared_experts") or 0
        shared = MLPConfig(width * num_shared, act) if num_shared else None
    else:
        shared_rows = shapes.get(m + "shared_experts.gate_proj.weight")
        shared = MLPConfig(shared_rows[0], act) if shared_rows else None
    assumed = [
        k for k in ("num_experts_per_tok", "norm_topk_prob", "routed_scaling_factor") if k not in raw.data
    ]
    if assumed:
        log.warning(
            "%s not in config.json (shapes cannot tell); assuming transformers' Glm4MoeConfig defaults "
            "(top-%d, renormalised, scaled by 1.0)",
            ", ".join(assumed),
            _DEFAULT_TOP_K,
        )
    top_k = raw.int("num_experts_per_tok") or min(_DEFAULT_TOP_K, num_experts)
    num_groups, topk_groups = raw.int("n_group", 1) or 1, raw.int("topk_group", 1) or 1
    if num_experts % num_groups or top_k > topk_groups * (num_experts // num_groups):
        raise CheckpointError(
            f"{raw.path}: n_group={num_groups}, topk_group={topk_groups} cannot route top-{top_k} of "
            f"{num_experts} experts (groups must split the experts evenly and hold at least k of them)"
        )
    return MoEConfig(
        num_experts=num_experts,
        top_k=top_k,
        expert=MLPConfig(width, act),
        scoring="sigmoid",
        is_renormalized=bool(raw.get("norm_topk_prob", True)),
        routed_scaling_factor=raw.float("routed_scaling_factor", 1.0),
        num_groups=num_groups,
        topk_groups=topk_groups,
        group_score="top2_sum",
        has_correction_bias=m + "gate.e_score_correction_bias" in shapes,
        shared=shared,
    )


def _is_moe_layer(raw: Raw, shapes: Shapes, num_layers: int) -> list[bool]:
    """transformers' rule (a MoE from layer `first_k_dense_replace` on) where config.json gives it, else the
    layers that hold a router."""
    first = raw.int("first_k_dense_replace")
    if first is None:
        return [f"{PREFIX}{i}.mlp.gate.weight" in shapes for i in range(num_layers)]
    return [i >= first for i in range(num_layers)]


def build_glm4_moe(raw: Raw, shapes: Shapes) -> ModelConfig:
    vocab, hidden = require(shapes, "model.embed_tokens.weight")
    hidden = raw.int("hidden_size", hidden)
    num_layers = _num_layers(raw, shapes)
    max_pos = raw.int("max_position_embeddings", 131072)
    norm = NormConfig("rms", raw.float("rms_norm_eps", 1e-5))
    act = activation(raw.get("hidden_act", "silu"))
    attention = _attention(raw, shapes, hidden, max_pos, norm)
    is_moe = _is_moe_layer(raw, shapes, num_layers)
    moe = _moe(raw, shapes, is_moe.index(True), act) if any(is_moe) else None
    mlp = _dense_mlp(raw, shapes, is_moe.index(False), act) if not all(is_moe) else None
    layers = tuple(
        LayerConfig(mixers=(attention,), moe=moe, norm=norm, ffn_norm=norm)
        if flag
        else LayerConfig(mixers=(attention,), mlp=mlp, norm=norm, ffn_norm=norm)
        for flag in is_moe
    )
    return ModelConfig(
        architecture=ARCH,
        vocab_size=raw.int("vocab_size", vocab),
        hidden_size=hidden,
        layers=layers,
        final_norm=norm,
        max_position_embeddings=max_pos,
        tie_word_embeddings=is_tied(raw, shapes),
    )


def _is_glm4_moe(shapes: Shapes) -> bool:
    """GQA attention (`self_attn.q_proj`, not DeepSeek's MLA) beside a router with a selection bias under
    `mlp.gate` (DeepSeek-V3's; Qwen3-MoE's router has none)."""
    names = list(shapes)
    return (
        any(n.endswith(".mlp.gate.e_score_correction_bias") for n in names)
        and any(n.endswith(".self_attn.q_proj.weight") for n in names)
        and not any(".self_attn.kv_a_proj_with_mqa." in n for n in names)
    )


BUILDERS = {ARCH: build_glm4_moe}
MODEL_TYPES = {"glm4_moe": ARCH}
NAME_RULES = [(_is_glm4_moe, ARCH)]
