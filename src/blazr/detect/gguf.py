"""GGUF detection: `general.architecture` + `{arch}.*` metadata keys → the config.json keys of the HF model
llama.cpp's converter read, then that HF architecture's own builder over the file's tensors seen under HF
names and shapes (loading/gguf_hf.py). The tokenizer comes from the file's own vocabulary.

Per architecture (keys without the `{arch}.` prefix):
- llama: head counts, rope (base, linear / YaRN scaling, partial rotary), eps, context; a Mixtral where it
  holds experts (`expert_count`, `expert_used_count`).
- qwen2, qwen3: as llama (biases and q/k norms are in the tensors); qwen3moe: plus the experts, renormalised.
- olmo2: as llama; an OLMo 3 where `attention.sliding_window` is set (see `_olmo2`).
- smollm3: as llama (its NoPE layers, every 4th, have no key: llama.cpp's fixed step).
- phi3 (Phi-3 / Phi-4): as llama, plus `rope.scaling.original_context_length` and the sliding window
  (`attention.sliding_window`, 0: none); LongRoPE's factors are tensors, not keys (see `_longrope`).
- gemma2, gemma3: as llama, plus the sliding window and its layers, the sliding layers' rope θ, the
  soft-caps and llama.cpp's query scalar (see `_gemma`).
- gemma4: layer kinds from `attention.sliding_window_pattern`, the full layers' head size
  (`attention.key_length`) and KV heads (per-layer `attention.head_count_kv`) beside the sliding ones'
  (`attention.key_length_swa`), `attention.shared_kv_layers`, per-layer `feed_forward_length` (double-wide
  shared layers), `embedding_length_per_layer_input`, the MoE variant's `expert_*` counts; K = V where a full
  layer has no `attn_v`, and the proportional rope's share from the `rope_freqs` tensor (see `_gemma4`,
  `_gemma4_tensors`).
- granite, granitemoe (Granite 3): as llama, plus `embedding_scale` / `residual_scale` / `attention.scale` /
  `logit_scale` and the experts (shared ones: GraniteMoeShared).
- mamba2: `ssm.{inner_size, state_size, group_count, conv_kernel, time_step_rank}` (= Mamba2 heads).
- granitehybrid: as mamba2, plus per-layer `attention.head_count_kv` (0 = a Mamba2 layer), experts,
  `embedding_scale` / `residual_scale` / `logit_scale` / `attention.scale`; RoPE only where
  `rope.scaling.finetuned` (llama.cpp's switch: the hybrids are NoPE).
- nemotron_h: block kinds from per-layer `attention.head_count_kv` (attention) and `feed_forward_length`
  (ReLU² MLP), else Mamba2.
- falcon-h1: its µP multipliers are folded into the weights by the converter (so 1 here); the Mamba2 norm,
  where present, follows the gate (llama.cpp's only order).
- deepseek2: MLA ranks, experts, `expert_gating_func` (1 softmax = V2 routing, 2 sigmoid = V3),
  `expert_weights_{norm,scale}`, groups, YaRN (`rope.scaling.yarn_log_multiplier` = 0.1 · mscale_all_dim).
- glm4moe: as llama, plus DeepSeek-V3's routing, shared experts, the leading dense layers; `block_count` less
  the `nextn_predict_layers` MTP blocks (see `_glm4moe`).
- gpt-oss: as llama, plus the experts, the sliding window, YaRN not truncated (see `_gpt_oss`).
- qwen3next, qwen35, qwen35moe: as llama, plus the DeltaNet sizes under `ssm.*`, layer kinds from
  `attention.recurrent_layers`, experts; Qwen3.5's value heads in the converter's tiled order.
- kimi-linear: KDA / MLA layers from per-layer `attention.head_count_kv`, `kda.head_dim`, MLA ranks, experts.
- lfm2 / lfm2moe, mamba (Mamba, Falcon-Mamba by `ssm.dt_b_c_rms`), jamba: see `_lfm2`, `_mamba1`, `_jamba`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from blazr.detect.checkpoint import Checkpoint
from blazr.detect.raw import Raw, int_or_none, longrope_attention_factor
from blazr.errors import CheckpointError, UnsupportedError
from blazr.loading.gguf import GGUFFile
from blazr.loading.gguf_hf import GGUFView
from blazr.tokenizer import TokenizerSource

Meta = Callable[[str], Any]  # `{arch}.key` → value (None when absent)


def _per_layer(value: Any, num_layers: int) -> list[int]:
    """A per-layer metadata value (one number for every layer, or a list of them) as a list."""
    if isinstance(value, list):
        if len(value) != num_layers:
            raise CheckpointError(f"per-layer metadata lists {len(value)} values for {num_layers} layers")
        return [int(v) for v in value]
    return [int(value or 0)] * num_layers


def _rope(key: Meta, head_dim: int | None) -> dict[str, Any]:
    raw: dict[str, Any] = {"rope_theta": key("rope.freq_base")}
    scaling = key("rope.scaling.type")
    if scaling == "linear":
        raw["rope_scaling"] = {"rope_type": "linear", "factor": key("rope.scaling.factor")}
    elif scaling == "yarn":
        raw["rope_scaling"] = {
            "rope_type": "yarn",
            "factor": key("rope.scaling.factor"),
            "original_max_position_embeddings": key("rope.scaling.original_context_length"),
        }
    rope_dim = key("rope.dimension_count")
    if rope_dim and head_dim and rope_dim != head_dim:
        raw["partial_rotary_factor"] = rope_dim / head_dim
    return raw


def _llama(key: Meta, num_layers: int) -> dict[str, Any]:
    num_heads, hidden = key("attention.head_count"), key("embedding_length")
    head_dim = key("attention.key_length") or (hidden // num_heads if hidden and num_heads else None)
    return {
        "intermediate_size": key("feed_forward_length"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": key("attention.head_count_kv"),
        "head_dim": head_dim,
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        **_rope(key, head_dim),
    }


def _llama_or_mixtral(key: Meta, num_layers: int) -> dict[str, Any]:
    """llama: a Llama, or a Mixtral where the file holds experts (`expert_count`: its converter writes Mixtral
    as `llama` with a router and stacked experts per layer)."""
    raw = _llama(key, num_layers)
    if key("expert_count"):
        raw["architectures"] = ["MixtralForCausalLM"]
        raw["num_local_experts"] = key("expert_count")
        raw["num_experts_per_tok"] = key("expert_used_count")
    return raw


def _qwen3moe(key: Meta, num_layers: int) -> dict[str, Any]:
    """Qwen3-MoE: as llama, plus the experts; routing renormalised over the chosen k (llama.cpp's only
    qwen3moe routing, and every published Qwen3-MoE's `norm_topk_prob`)."""
    return {
        **_llama(key, num_layers),
        "num_experts": key("expert_count"),
        "num_experts_per_tok": key("expert_used_count"),
        "moe_intermediate_size": key("expert_feed_forward_length"),
        "norm_topk_prob": True,
    }


def _granite3(key: Meta, num_layers: int) -> dict[str, Any]:
    """Granite 3 dense / MoE: as llama, plus the µP scalars and the experts (GraniteMoeShared where
    `expert_shared_feed_forward_length` is set)."""
    raw = {
        **_llama(key, num_layers),
        "embedding_multiplier": key("embedding_scale"),
        "residual_multiplier": key("residual_scale"),
        "attention_multiplier": key("attention.scale"),
        "logits_scaling": key("logit_scale"),
        "num_local_experts": key("expert_count"),
        "num_experts_per_tok": key("expert_used_count"),
    }
    if key("expert_shared_feed_forward_length"):
        raw["architectures"] = ["GraniteMoeSharedForCausalLM"]
    return raw


def _olmo2(key: Meta, num_layers: int) -> dict[str, Any]:
    """OLMo 2, or OLMo 3 where the file has a sliding window: its layers from
    `attention.sliding_window_pattern` (true: sliding; absent: every 4th layer full, llama.cpp's default), the
    full layers' rope from
    `rope.freq_base` and the scaling keys, the sliding ones' from `rope.freq_base_swa` without scaling."""
    raw = _llama(key, num_layers)
    window = key("attention.sliding_window")
    if not window:
        return raw
    pattern = key("attention.sliding_window_pattern")
    if not isinstance(pattern, list):
        pattern = [(i + 1) % 4 != 0 for i in range(num_layers)]
    scaling = raw.pop("rope_scaling", None) or {}
    full = {"rope_type": "default", "rope_theta": raw.pop("rope_theta"), **scaling}
    sliding = {"rope_type": "default", "rope_theta": key("rope.freq_base_swa") or full["rope_theta"]}
    return {
        **raw,
        "architectures": ["Olmo3ForCausalLM"],
        "sliding_window": window,
        "layer_types": ["sliding_attention" if bool(p) else "full_attention" for p in pattern[:num_layers]],
        "rope_parameters": {"full_attention": full, "sliding_attention": sliding},
    }


def _phi3(key: Meta, num_layers: int) -> dict[str, Any]:
    """Phi-3 / Phi-4: as llama, plus the original context and the sliding window where set (the converter
    writes Phi-4's none as 0). The window is kept as transformers runs it; llama.cpp runs Phi without one
    (its phi3 loader turns it off), so the two part where a sequence outgrows the window."""
    return {
        **_llama(key, num_layers),
        "original_max_position_embeddings": key("rope.scaling.original_context_length"),
        "sliding_window": key("attention.sliding_window") or None,
    }


def _floats(gguf: GGUFFile, name: str) -> list[float]:
    """A small float32 tensor as config.json's numbers (each the shortest decimal of its float32)."""
    return [float(str(v)) for v in gguf.load(name, torch.float32).numpy().astype(np.float32)]


def _longrope(gguf: GGUFFile, key: Meta) -> dict[str, Any]:
    """LongRoPE (phi3), from the tensors the converter stores its factors in — `rope_factors_short.weight` /
    `rope_factors_long.weight`, [rope dim / 2] — and `rope.scaling.attn_factor`, passed on only where it is
    not the builder's own √(1 + ln s / ln orig) at float32 precision (it always is, as the converter
    writes it: so the config equals the safetensors one). No factors: plain rope."""
    if "rope_factors_long.weight" not in gguf.tensor_names:
        return {}
    scaling: dict[str, Any] = {
        "rope_type": "longrope",
        "short_factor": _floats(gguf, "rope_factors_short.weight"),
        "long_factor": _floats(gguf, "rope_factors_long.weight"),
    }
    stored, orig, context = (
        key("rope.scaling.attn_factor"),
        key("rope.scaling.original_context_length"),
        key("context_length"),
    )
    derived = longrope_attention_factor(context / orig, orig) if context and orig else None
    if stored is not None and (derived is None or np.float32(stored) != np.float32(derived)):
        scaling["attention_factor"] = stored
    return {"rope_scaling": scaling}


def _gemma(key: Meta, num_layers: int, arch: str) -> dict[str, Any]:
    """Gemma 2 / Gemma 3 as llama.cpp runs them: sliding layers by `attention.sliding_window_pattern` (a list,
    or every n-th layer full; absent: llama.cpp's fixed 2 / 6), none without `attention.sliding_window`
    (Gemma 3); the query scalar is the head size but for the 27B models (46 / 62 layers: hidden / heads —
    llama.cpp's rule, the file has no key for it); the sliding layers' rope θ `rope.freq_base_swa` (absent:
    Gemma 2 the global one, Gemma 3 10000 — llama.cpp's defaults) without scaling; the soft-caps where set."""
    raw = _llama(key, num_layers)
    window = key("attention.sliding_window")
    pattern = key("attention.sliding_window_pattern")
    every = 2 if arch == "gemma2" else 6
    if isinstance(pattern, int) and pattern > 0:
        every, pattern = pattern, None
    if not window:
        kinds = ["full_attention"] * num_layers
    elif isinstance(pattern, list):
        kinds = ["sliding_attention" if bool(p) else "full_attention" for p in pattern[:num_layers]]
    else:
        kinds = [
            "sliding_attention" if i % every < every - 1 else "full_attention" for i in range(num_layers)
        ]
    is_27b = num_layers == (46 if arch == "gemma2" else 62)
    hidden, heads = key("embedding_length"), key("attention.head_count")
    raw.update(
        architectures=["Gemma2ForCausalLM" if arch == "gemma2" else "Gemma3ForCausalLM"],
        layer_types=kinds,
        sliding_window=window or None,
        query_pre_attn_scalar=hidden // heads if is_27b else raw["head_dim"],
        attn_logit_softcapping=key("attn_logit_softcapping"),
        final_logit_softcapping=key("final_logit_softcapping"),
    )
    if arch == "gemma3":
        scaling = raw.pop("rope_scaling", None) or {}
        full = {"rope_type": "default", "rope_theta": raw.pop("rope_theta") or 1e6, **scaling}
        sliding = {"rope_type": "default", "rope_theta": key("rope.freq_base_swa") or 10000.0}
        raw["rope_parameters"] = {"full_attention": full, "sliding_attention": sliding}
    return raw


def _gemma4(key: Meta, num_layers: int) -> dict[str, Any]:
    """Gemma 4 as llama.cpp's converter writes it (config keys of Gemma4TextConfig, per_layer_config for the
    full layers); the tensor-borne parts come from `_gemma4_tensors`."""
    pattern = key("attention.sliding_window_pattern")
    if not isinstance(pattern, list) or len(pattern) < num_layers:
        raise CheckpointError(f"gemma4: attention.sliding_window_pattern must list {num_layers} layers")
    kinds = ["sliding_attention" if bool(p) else "full_attention" for p in pattern[:num_layers]]
    kv = _per_layer(key("attention.head_count_kv"), num_layers)
    ff = _per_layer(key("feed_forward_length"), num_layers)
    shared = int(key("attention.shared_kv_layers") or 0)
    full = [i for i, k in enumerate(kinds) if k == "full_attention"]
    sliding = [i for i, k in enumerate(kinds) if k == "sliding_attention"]
    head_full = key("attention.key_length")
    return {
        "layer_types": kinds,
        "num_attention_heads": key("attention.head_count"),
        "num_key_value_heads": kv[sliding[0]] if sliding else kv[0],
        "head_dim": key("attention.key_length_swa") or head_full,
        "per_layer_config": {str(i): {"head_dim": head_full, "num_key_value_heads": kv[i]} for i in full},
        "num_kv_shared_layers": shared,
        "intermediate_size": ff[0],
        "use_double_wide_mlp": shared > 0 and ff[-1] == 2 * ff[0],
        "hidden_size_per_layer_input": key("embedding_length_per_layer_input") or 0,
        "sliding_window": key("attention.sliding_window"),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        "final_logit_softcapping": key("final_logit_softcapping"),
        "enable_moe_block": bool(key("expert_count")),
        "num_experts": key("expert_count"),
        "top_k_experts": key("expert_used_count"),
        "moe_intermediate_size": key("expert_feed_forward_length"),
    }


def _gemma4_tensors(gguf: GGUFFile, key: Meta) -> dict[str, Any]:
    """K = V where the first full layer has no `attn_v`; the ropes — the sliding layers' default, the full
    layers' proportional from `rope_freqs` [head/2] (1: a turning pair, 1e30: a still one — the converter's
    encoding of partial_rotary_factor), default without it."""
    kinds = key("attention.sliding_window_pattern") or []
    full = next((i for i, p in enumerate(kinds) if not p), None)
    out: dict[str, Any] = {
        "attention_k_eq_v": full is not None
        and f"blk.{full}.attn_k.weight" in gguf.tensor_names
        and f"blk.{full}.attn_v.weight" not in gguf.tensor_names
    }
    full_rope: dict[str, Any] = {"rope_type": "default", "rope_theta": key("rope.freq_base") or 1e6}
    if "rope_freqs.weight" in gguf.tensor_names:
        factors = gguf.load("rope_freqs.weight", torch.float32).flatten()
        turning = int((factors == 1.0).sum())
        if not (
            torch.equal(factors[:turning], torch.ones(turning)) and bool((factors[turning:] > 1e20).all())
        ):
            raise UnsupportedError(f"{gguf.path}: rope_freqs is not a proportional rope's (1s, then 1e30s)")
        full_rope |= {"rope_type": "proportional", "partial_rotary_factor": turning / factors.numel()}
    sliding_rope = {"rope_type": "default", "rope_theta": key("rope.freq_base_swa") or 10000.0}
    out["rope_parameters"] = {"sliding_attention": sliding_rope, "full_attention": full_rope}
    return out


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
    kv = _per_layer(key("attention.head_count_kv"), num_layers)
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
    kv = _per_layer(key("attention.head_count_kv"), num_layers)
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


def _deepseek2(key: Meta, num_layers: int) -> dict[str, Any]:
    sigmoid = key("expert_gating_func") == 2
    raw: dict[str, Any] = {
        "architectures": ["DeepseekV3ForCausalLM" if sigmoid else "DeepseekV2ForCausalLM"],
        "num_attention_heads": key("attention.head_count"),
        "num_key_value_heads": key("attention.head_count"),
        "kv_lora_rank": key("attention.kv_lora_rank"),
        "q_lora_rank": key("attention.q_lora_rank"),
        "qk_rope_head_dim": key("rope.dimension_count"),
        "first_k_dense_replace": key("leading_dense_block_count"),
        "n_routed_experts": key("expert_count"),
        "num_experts_per_tok": key("expert_used_count"),
        "n_shared_experts": key("expert_shared_count"),
        "routed_scaling_factor": key("expert_weights_scale") or 1.0,
        "norm_topk_prob": bool(key("expert_weights_norm")),
        "n_group": key("expert_group_count") or 1,
        "topk_group": key("expert_group_used_count") or 1,
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        "rope_theta": key("rope.freq_base"),
    }
    if (key("expert_group_count") or 1) > 1 and not sigmoid:
        raw["topk_method"] = "group_limited_greedy"
    if key("rope.scaling.type") == "yarn":
        raw["rope_scaling"] = {
            "type": "yarn",
            "factor": key("rope.scaling.factor"),
            "original_max_position_embeddings": key("rope.scaling.original_context_length"),
            "mscale": 1.0,
            "mscale_all_dim": (key("rope.scaling.yarn_log_multiplier") or 0.0) / 0.1,
            "beta_fast": key("rope.scaling.yarn_beta_fast") or 32.0,
            "beta_slow": key("rope.scaling.yarn_beta_slow") or 1.0,
        }
    return raw


def _glm4moe(key: Meta, num_layers: int) -> dict[str, Any]:
    """GLM-4.5 / 4.6: as llama (biases and q/k norms are in the tensors; the rope over
    `rope.dimension_count` of each head), plus DeepSeek-V3's routing (`expert_gating_func` 2, sigmoid:
    llama.cpp's default for glm4moe; softmax is refused), groups, `expert_weights_{norm,scale}`, shared
    experts and the leading dense layers. `block_count` counts the `nextn_predict_layers` MTP blocks after
    the decoder: not decoder layers."""
    gating = key("expert_gating_func")
    if gating not in (None, 0, 2):
        raise UnsupportedError(
            f"glm4moe.expert_gating_func {gating}: only sigmoid routing (2) is supported for GLM-4.5"
        )
    raw = {
        **_llama(key, num_layers),
        "num_hidden_layers": num_layers - int(key("nextn_predict_layers") or 0),
        "first_k_dense_replace": key("leading_dense_block_count") or 0,
        "n_routed_experts": key("expert_count"),
        "num_experts_per_tok": key("expert_used_count"),
        "moe_intermediate_size": key("expert_feed_forward_length"),
        "n_shared_experts": key("expert_shared_count") or 0,
        "routed_scaling_factor": key("expert_weights_scale") or 1.0,
        "norm_topk_prob": bool(key("expert_weights_norm")),
        "n_group": key("expert_group_count") or 1,
        "topk_group": key("expert_group_used_count") or 1,
    }
    raw.setdefault("partial_rotary_factor", 1.0)  # _rope sets it when the rope covers part of a head
    return raw


def _gpt_oss(key: Meta, num_layers: int) -> dict[str, Any]:
    """GPT-OSS: as llama (biases and sinks are in the tensors), plus the experts and the window (llama.cpp
    slides every even layer, transformers' default `layer_types`). YaRN as the converter writes it, not
    truncated (GPT-OSS's rope; the file has no such key); the clamped SwiGLU's alpha and limit are llama.cpp's
    fixed 1.702 and 7, transformers' defaults."""
    raw = {
        **_llama(key, num_layers),
        "num_local_experts": key("expert_count"),
        "num_experts_per_tok": key("expert_used_count"),
        "intermediate_size": key("expert_feed_forward_length") or key("feed_forward_length"),
        "sliding_window": key("attention.sliding_window"),
    }
    if "rope_scaling" in raw:
        raw["rope_scaling"] |= {
            "beta_fast": key("rope.scaling.yarn_beta_fast") or 32.0,
            "beta_slow": key("rope.scaling.yarn_beta_slow") or 1.0,
            "truncate": False,
        }
    return raw


def _qwen3_next(key: Meta, num_layers: int, is_v_tiled: bool = False) -> dict[str, Any]:
    """Qwen3-Next / Qwen3.5: DeltaNet sizes under `ssm.*` (group_count = key heads, state_size = key head
    size, time_step_rank = value heads, inner_size = all value features); layer kinds from
    `attention.recurrent_layers`; Qwen3.5's value heads in the converter's tiled order (`is_v_tiled`, passed
    on as `blazr_v_heads_tiled`, which detect/qwen3_next.py reads); expert routing renormalised (llama.cpp's
    only Qwen3-Next routing)."""
    heads, inner = key("ssm.time_step_rank"), key("ssm.inner_size")
    recurrent = key("attention.recurrent_layers")
    raw = {
        **_llama(key, num_layers),
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
    raw.setdefault("partial_rotary_factor", 1.0)  # _rope sets it when the rope covers part of a head
    return raw


def _kimi_linear(key: Meta, num_layers: int) -> dict[str, Any]:
    """Kimi-Linear: layer kinds from the per-layer `attention.head_count_kv` (0 = a KDA layer), the KDA head
    size under `kda.head_dim` (its heads from the tensors), MLA ranks, experts and their routing (sigmoid,
    renormalised: what llama.cpp's kimi-linear runs; groups as written)."""
    kv = _per_layer(key("attention.head_count_kv"), num_layers)
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
    kv = _per_layer(key("attention.head_count_kv"), num_layers)
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
    kv = _per_layer(key("attention.head_count_kv"), num_layers)
    return {
        "layers_block_type": ["attention" if n else "mamba" for n in kv],
        "num_attention_heads": key("attention.head_count"),
        "num_key_value_heads": max(kv) or None,
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        "num_experts": key("expert_count"),
        "num_experts_per_tok": key("expert_used_count"),
    }


# llama.cpp architecture → its metadata as the HF config keys (every name loading/gguf_hf.ARCHES knows)
_CONFIG_KEYS: dict[str, Callable[[Meta, int], dict[str, Any]]] = {
    "llama": _llama_or_mixtral,
    "qwen2": _llama,
    "qwen3": _llama,
    "qwen3moe": _qwen3moe,
    "olmo2": _olmo2,
    "granite": _granite3,
    "granitemoe": _granite3,
    "smollm3": _llama,  # NoPE every 4th layer: llama.cpp's fixed step, the builder's default
    "phi3": _phi3,
    "gemma2": partial(_gemma, arch="gemma2"),
    "gemma3": partial(_gemma, arch="gemma3"),
    "gemma4": _gemma4,
    "mamba2": _mamba2,
    "granitehybrid": _granite,
    "nemotron_h": _nemotron_h,
    "nemotron_h_moe": _nemotron_h,
    "falcon-h1": _falcon_h1,
    "deepseek2": _deepseek2,
    "glm4moe": _glm4moe,
    "gpt-oss": _gpt_oss,
    "qwen3next": _qwen3_next,
    "qwen35": partial(_qwen3_next, is_v_tiled=True),
    "qwen35moe": partial(_qwen3_next, is_v_tiled=True),
    "kimi-linear": _kimi_linear,
    "lfm2": _lfm2,
    "lfm2moe": _lfm2,
    "mamba": _mamba1,
    "jamba": _jamba,
}
# config values llama.cpp stores as tensors, read from the file (architecture → its reader)
_TENSOR_KEYS: dict[str, Callable[[GGUFFile, Meta], dict[str, Any]]] = {
    "phi3": _longrope,
    "gemma4": _gemma4_tensors,
}


def inspect_gguf(path: Path, gguf: GGUFFile, vocab_name: str | None) -> Checkpoint:
    from blazr.detect import BUILDERS  # the HF builders (this module is imported by blazr.detect)

    meta = gguf.metadata
    arch = str(meta.get("general.architecture"))

    def key(k: str) -> Any:
        value = meta.get(f"{arch}.{k}")
        # GGUF floats are float32: the shortest decimal that is the same float32 gives back config.json's
        # number (1e-05, not 9.999999747378752e-06)
        return float(str(np.float32(value))) if isinstance(value, float) else value

    num_layers = int(key("block_count") or 0)
    heads, kv = key("attention.head_count"), key("attention.head_count_kv")
    q_heads = _per_layer(heads, num_layers)
    kv_heads = _per_layer(heads if kv is None else kv, num_layers)
    view = GGUFView(gguf, q_heads, kv_heads)  # rejects an architecture it cannot name
    shapes = {n: view.shape(n) for n in view.names}
    specific = _CONFIG_KEYS[arch](key, num_layers)
    if arch in _TENSOR_KEYS:
        specific.update(_TENSOR_KEYS[arch](gguf, key))
    context = key("context_length")
    raw: dict[str, Any] = {
        "architectures": [view.hf_architecture],
        "hidden_size": key("embedding_length"),
        "num_hidden_layers": num_layers,
        "max_position_embeddings": context if context and context < 1 << 20 else None,  # 2^20: "unset"
        "vocab_size": key("vocab_size") or len(meta.get("tokenizer.ggml.tokens", []) or []) or None,
        "tie_word_embeddings": "output.weight" not in gguf.tensor_names,
        **specific,
    }
    raw = {k: v for k, v in raw.items() if v is not None}
    hf_arch = raw["architectures"][0]
    cfg = BUILDERS[hf_arch](Raw(raw, gguf.path), shapes)
    tok = TokenizerSource(
        vocab_name=vocab_name,
        gguf_metadata=meta,
        vocab_size=cfg.vocab_size,
        bos_token_id=int_or_none(meta.get("tokenizer.ggml.bos_token_id")),
        add_bos_token=meta.get("tokenizer.ggml.add_bos_token"),
    )
    name = meta.get("general.name") or gguf.path.stem
    return Checkpoint(path, "gguf", gguf.paths, cfg, tok, torch.float32, str(name), gguf)
