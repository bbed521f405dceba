"""GGUF detection of the attention-only families, dense and MoE: a llama.cpp architecture's `{arch}.*`
metadata keys → the config.json keys of the HF model its converter read, plus the config values llama.cpp
stores as tensors (detect/gguf.py's `inspect_gguf` adds the keys every family shares and runs the HF builder).

In: `key`, a `Meta` (`{arch}.key` → value, None when absent), the block count, and for `TENSOR_KEYS` the
`GGUFFile`. Out: `CONFIG_KEYS` and `TENSOR_KEYS`, architecture → its reader of HF config keys. `Meta`,
`per_layer` and `llama_keys` (the llama keys most families extend) serve detect/gguf_hybrid.py too.

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
- deepseek2: MLA ranks, experts, `expert_gating_func` (1 softmax = V2 routing, 2 sigmoid = V3),
  `expert_weights_{norm,scale}`, groups, YaRN (`rope.scaling.yarn_log_multiplier` = 0.1 · mscale_all_dim).
- glm4moe: as llama, plus DeepSeek-V3's routing, shared experts, the leading dense layers; `block_count` less
  the `nextn_predict_layers` MTP blocks (see `_glm4moe`).
- gpt-oss: as llama, plus the experts, the sliding window, YaRN not truncated (see `_gpt_oss`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch

from blazr.detect.raw import longrope_attention_factor
from blazr.errors import CheckpointError, UnsupportedError
from blazr.loading.gguf import GGUFFile

Meta = Callable[[str], Any]  # `{arch}.key` → value (None when absent)


def per_layer(value: Any, num_layers: int) -> list[int]:
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


def llama_keys(key: Meta, num_layers: int) -> dict[str, Any]:
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
    raw = llama_keys(key, num_layers)
    if key("expert_count"):
        raw["architectures"] = ["MixtralForCausalLM"]
        raw["num_local_experts"] = key("expert_count")
        raw["num_experts_per_tok"] = key("expert_used_count")
    return raw


def _qwen3moe(key: Meta, num_layers: int) -> dict[str, Any]:
    """Qwen3-MoE: as llama, plus the experts; routing renormalised over the chosen k (llama.cpp's only
    qwen3moe routing, and every published Qwen3-MoE's `norm_topk_prob`)."""
    return {
        **llama_keys(key, num_layers),
        "num_experts": key("expert_count"),
        "num_experts_per_tok": key("expert_used_count"),
        "moe_intermediate_size": key("expert_feed_forward_length"),
        "norm_topk_prob": True,
    }


def _granite3(key: Meta, num_layers: int) -> dict[str, Any]:
    """Granite 3 dense / MoE: as llama, plus the µP scalars and the experts (GraniteMoeShared where
    `expert_shared_feed_forward_length` is set)."""
    raw = {
        **llama_keys(key, num_layers),
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
    raw = llama_keys(key, num_layers)
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
        **llama_keys(key, num_layers),
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
    raw = llama_keys(key, num_layers)
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
    kv = per_layer(key("attention.head_count_kv"), num_layers)
    ff = per_layer(key("feed_forward_length"), num_layers)
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
        **llama_keys(key, num_layers),
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
        **llama_keys(key, num_layers),
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


# llama.cpp architecture → its metadata as the HF config keys
CONFIG_KEYS: dict[str, Callable[[Meta, int], dict[str, Any]]] = {
    "llama": _llama_or_mixtral,
    "qwen2": llama_keys,
    "qwen3": llama_keys,
    "qwen3moe": _qwen3moe,
    "olmo2": _olmo2,
    "granite": _granite3,
    "granitemoe": _granite3,
    "smollm3": llama_keys,  # NoPE every 4th layer: llama.cpp's fixed step, the builder's default
    "phi3": _phi3,
    "gemma2": partial(_gemma, arch="gemma2"),
    "gemma3": partial(_gemma, arch="gemma3"),
    "gemma4": _gemma4,
    "deepseek2": _deepseek2,
    "glm4moe": _glm4moe,
    "gpt-oss": _gpt_oss,
}
# config values llama.cpp stores as tensors, read from the file (architecture → its reader)
TENSOR_KEYS: dict[str, Callable[[GGUFFile, Meta], dict[str, Any]]] = {
    "phi3": _longrope,
    "gemma4": _gemma4_tensors,
}
