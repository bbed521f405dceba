"""GGUF detection of the state-space and linear-attention families and their hybrids: a llama.cpp
architecture's `{arch}.*` metadata keys → the config.json keys of the HF model its converter read
(detect/gguf.py's `inspect_gguf` adds the keys every family shares and runs the HF builder). The Mamba2
sizes under `ssm.*` are read once (`_ssm`) and renamed to each family's config keys (`_prefixed`).

In: `key`, a `Meta` (`{arch}.key` → value, None when absent), and the block count. Out: `CONFIG_KEYS`,
architecture → its reader of HF config keys. Builds on detect/gguf_attention.py (`Meta`, `per_layer`, and
`llama_keys` for Qwen3-Next's attention).

Per architecture (keys without the `{arch}.` prefix):
- mamba2: `ssm.{inner_size, state_size, group_count, conv_kernel, time_step_rank}` (= Mamba2 heads).
- granitehybrid: as mamba2, plus per-layer `attention.head_count_kv` (0 = a Mamba2 layer), experts,
  `embedding_scale` / `residual_scale` / `logit_scale` / `attention.scale`; RoPE only where
  `rope.scaling.finetuned` (llama.cpp's switch: the hybrids are NoPE).
- nemotron_h: block kinds from per-layer `attention.head_count_kv` (attention) and `feed_forward_length`
  (ReLU² MLP), else Mamba2.
- falcon-h1: its µP multipliers are folded into the weights by the converter (so 1 here); the Mamba2 norm,
  where present, follows the gate (llama.cpp's only order).
- qwen3next, qwen35, qwen35moe: as llama, plus the DeltaNet sizes under `ssm.*`, layer kinds from
  `attention.recurrent_layers`, experts; Qwen3.5's value heads in the converter's tiled order.
- kimi-linear: KDA / MLA layers from per-layer `attention.head_count_kv`, `kda.head_dim`, MLA ranks, experts.
- lfm2 / lfm2moe, mamba (Mamba, Falcon-Mamba by `ssm.dt_b_c_rms`), jamba: see `_lfm2`, `_mamba1`, `_jamba`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from blazr.detect.gguf_attention import Meta, llama_keys, per_layer


def _ssm(key: Meta) -> dict[str, Any]:
    """Mamba2 sizes under Mamba2ForCausalLM's config keys (`_prefixed` renames them per family)."""
    heads = key("ssm.time_step_rank")
    inner = key("ssm.inner_size")
    return {
        "num_heads": heads,
        "head_dim": inner // heads if heads else None,
        "state_size": key("ssm.state_size"),
        "n_groups": key("ssm.group_count"),
        "conv_kernel": key("ssm.conv_kernel"),
    }


def _prefixed(ssm: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """`_ssm`'s sizes under one family's config keys."""
    return {names[k]: v for k, v in ssm.items()}


_GRANITE_SSM = {
    "num_heads": "mamba_n_heads",
    "head_dim": "mamba_d_head",
    "state_size": "mamba_d_state",
    "n_groups": "mamba_n_groups",
    "conv_kernel": "mamba_d_conv",
}
_NEMOTRON_SSM = {
    "num_heads": "mamba_num_heads",
    "head_dim": "mamba_head_dim",
    "state_size": "ssm_state_size",
    "n_groups": "n_groups",
    "conv_kernel": "conv_kernel",
}


def _mamba2(key: Meta, num_layers: int) -> dict[str, Any]:
    return {**_ssm(key), "layer_norm_epsilon": key("attention.layer_norm_rms_epsilon")}


def _granite(key: Meta, num_layers: int) -> dict[str, Any]:
    kv = per_layer(key("attention.head_count_kv"), num_layers)
    return {
        **_prefixed(_ssm(key), _GRANITE_SSM),
        "layer_types": ["attention" if n else "mamba" for n in kv],
        "num_attention_heads": key("attention.head_count"),
        "num_key_value_heads": max(kv) or None,
        "num_local_experts": key("expert_count") or 0,
        "num_experts_per_tok": key("expert_used_count"),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        "embedding_multiplier": key("embedding_scale"),
        "residual_multiplier": key("residual_scale"),
        "logits_scaling": key("logit_scale"),
        "attention_multiplier": key("attention.scale"),
        "position_embedding_type": "rope" if key("rope.scaling.finetuned") else "nope",
        "rope_theta": key("rope.freq_base"),
    }


def _nemotron_h(key: Meta, num_layers: int) -> dict[str, Any]:
    """Block kinds come from the tensors each block holds (the HF builder's rule without a pattern): some
    converter versions write every `feed_forward_length` as 0."""
    kv = per_layer(key("attention.head_count_kv"), num_layers)
    return {
        **_prefixed(_ssm(key), _NEMOTRON_SSM),
        "num_attention_heads": key("attention.head_count"),
        "num_key_value_heads": max(kv) or None,
        "head_dim": key("attention.key_length"),
        "layer_norm_epsilon": key("attention.layer_norm_epsilon"),
        "n_routed_experts": key("expert_count"),
        "num_experts_per_tok": key("expert_used_count"),
        "norm_topk_prob": key("expert_weights_norm"),
        "routed_scaling_factor": key("expert_weights_scale"),
        "n_group": key("expert_group_count"),
        "topk_group": key("expert_group_used_count"),
        "moe_latent_size": key("moe_latent_size"),
    }


def _falcon_h1(key: Meta, num_layers: int) -> dict[str, Any]:
    """Whether the Mamba2 norm exists, the builder reads from the tensors (`ssm_norm` present or not)."""
    return {
        **_prefixed(_ssm(key), _GRANITE_SSM),
        "mamba_d_ssm": key("ssm.inner_size"),
        "mamba_norm_before_gate": False,
        "num_attention_heads": key("attention.head_count"),
        "num_key_value_heads": key("attention.head_count_kv"),
        "head_dim": key("attention.key_length"),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        "rope_theta": key("rope.freq_base"),
    }


def _qwen3_next(key: Meta, num_layers: int, is_v_tiled: bool = False) -> dict[str, Any]:
    """Qwen3-Next / Qwen3.5: DeltaNet sizes under `ssm.*` (group_count = key heads, state_size = key head
    size, time_step_rank = value heads, inner_size = all value features); layer kinds from
    `attention.recurrent_layers`; Qwen3.5's value heads in the converter's tiled order (`is_v_tiled`, passed
    on as `blazr_v_heads_tiled`, which detect/qwen3_next.py reads); expert routing renormalised (llama.cpp's
    only Qwen3-Next routing)."""
    heads, inner = key("ssm.time_step_rank"), key("ssm.inner_size")
    recurrent = key("attention.recurrent_layers")
    raw = {
        **llama_keys(key, num_layers),
        "linear_num_key_heads": key("ssm.group_count"),
        "linear_key_head_dim": key("ssm.state_size"),
        "linear_num_value_heads": heads,
        "linear_value_head_dim": inner // heads if heads and inner else None,
        "linear_conv_kernel_dim": key("ssm.conv_kernel"),
        "full_attention_interval": key("full_attention_interval"),
        "num_experts": key("expert_count"),
        "num_experts_per_tok": key("expert_used_count"),
        "moe_intermediate_size": key("expert_feed_forward_length"),
        "shared_expert_intermediate_size": key("expert_shared_feed_forward_length"),
        "norm_topk_prob": True,
        "blazr_v_heads_tiled": is_v_tiled,
    }
    if isinstance(recurrent, list):
        raw["layer_types"] = ["linear_attention" if r else "full_attention" for r in recurrent[:num_layers]]
    raw.setdefault("partial_rotary_factor", 1.0)  # llama_keys sets it when the rope covers part of a head
    return raw


def _kimi_linear(key: Meta, num_layers: int) -> dict[str, Any]:
    """Kimi-Linear: layer kinds from the per-layer `attention.head_count_kv` (0 = a KDA layer), the KDA head
    size under `kda.head_dim` (its heads from the tensors), MLA ranks, experts and their routing (sigmoid,
    renormalised: what llama.cpp's kimi-linear runs; groups as written)."""
    kv = per_layer(key("attention.head_count_kv"), num_layers)
    return {
        "layer_types": ["full_attention" if n else "linear_attention" for n in kv],
        "linear_head_dim": key("kda.head_dim"),
        "linear_conv_kernel_dim": key("ssm.conv_kernel"),
        "num_attention_heads": key("attention.head_count"),
        "kv_lora_rank": key("attention.kv_lora_rank"),
        "q_lora_rank": key("attention.q_lora_rank"),
        "qk_rope_head_dim": key("rope.dimension_count"),
        "num_experts": key("expert_count"),
        "num_experts_per_token": key("expert_used_count"),
        "routed_scaling_factor": key("expert_weights_scale") or 1.0,
        "moe_renormalize": True,
        "num_expert_group": key("expert_group_count") or 1,
        "topk_group": key("expert_group_used_count") or 1,
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
    }


def _lfm2(key: Meta, num_layers: int) -> dict[str, Any]:
    """LFM2 / LFM2-MoE: layer kinds from the per-layer `attention.head_count_kv` (0 = a short-conv layer).
    llama.cpp always renormalises LFM2-MoE's chosen weights, and scales them by `expert_weights_scale` (1
    when absent, as the converter writes it)."""
    kv = per_layer(key("attention.head_count_kv"), num_layers)
    return {
        "layer_types": ["full_attention" if n else "conv" for n in kv],
        "num_attention_heads": key("attention.head_count"),
        "num_key_value_heads": max(kv) or None,
        "norm_eps": key("attention.layer_norm_rms_epsilon"),
        "conv_L_cache": key("shortconv.l_cache"),
        "rope_theta": key("rope.freq_base"),
        "num_experts": key("expert_count"),
        "num_experts_per_tok": key("expert_used_count"),
        "num_dense_layers": key("leading_dense_block_count"),
        "moe_intermediate_size": key("expert_feed_forward_length"),
        "routed_scaling_factor": key("expert_weights_scale") or 1.0,
        "norm_topk_prob": True,
    }


def _mamba1(key: Meta, num_layers: int) -> dict[str, Any]:
    """Mamba (and Falcon-Mamba where `ssm.dt_b_c_rms`: its weightless dt / B / C norms take transformers'
    `mixer_rms_eps` default, 1e-6; llama.cpp uses the block norm's eps there). Sizes come from the tensors."""
    falcon = bool(key("ssm.dt_b_c_rms"))
    return {
        "architectures": ["FalconMambaForCausalLM" if falcon else "MambaForCausalLM"],
        "layer_norm_epsilon": key("attention.layer_norm_rms_epsilon"),
    }


def _jamba(key: Meta, num_layers: int) -> dict[str, Any]:
    """Jamba: attention where the per-layer `attention.head_count_kv` is non-zero; MoE where the layer holds a
    router (the builder's rule without the period keys)."""
    kv = per_layer(key("attention.head_count_kv"), num_layers)
    return {
        "layers_block_type": ["attention" if n else "mamba" for n in kv],
        "num_attention_heads": key("attention.head_count"),
        "num_key_value_heads": max(kv) or None,
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        "num_experts": key("expert_count"),
        "num_experts_per_tok": key("expert_used_count"),
    }


# llama.cpp architecture → its metadata as the HF config keys
CONFIG_KEYS: dict[str, Callable[[Meta, int], dict[str, Any]]] = {
    "mamba2": _mamba2,
    "granitehybrid": _granite,
    "nemotron_h": _nemotron_h,
    "nemotron_h_moe": _nemotron_h,
    "falcon-h1": _falcon_h1,
    "qwen3next": _qwen3_next,
    "qwen35": partial(_qwen3_next, is_v_tiled=True),
    "qwen35moe": partial(_qwen3_next, is_v_tiled=True),
    "kimi-linear": _kimi_linear,
    "lfm2": _lfm2,
    "lfm2moe": _lfm2,
    "mamba": _mamba1,
    "jamba": _jamba,
}
