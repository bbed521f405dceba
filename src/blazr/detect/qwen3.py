"""Qwen3 (`Qwen3ForCausalLM`) and Qwen3-MoE (`Qwen3MoeForCausalLM`) detection: Llama's layout with a
per-head q/k RMSNorm (`self_attn.q_norm` / `k_norm`, [Dh] each) before rope, optional q/k/v biases; Qwen3's
sliding window on the layers `layer_types` names `sliding_attention` (else, where `use_sliding_window`, on
layers from `max_window_layers` on); Qwen3-MoE's whole-model window where `use_sliding_window`.

Qwen3-MoE's feed-forward per layer: a MoE (router `mlp.gate` [E, D], softmax → top-k, renormalised over the
k where `norm_topk_prob`, no shared expert) where the layer holds a router — which is where
`decoder_sparse_step` and `mlp_only_layers` put one — else a SwiGLU MLP of `intermediate_size`.

Without config.json: the head size from q_norm's width, the rest from shapes; what no shape carries takes
transformers' defaults (rope θ 10000, RMSNorm eps 1e-6, no window) and, for the MoE, top-8 routing
renormalised (every published Qwen3-MoE's; a warning says so).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from blazr.config import LayerConfig, MLPConfig, ModelConfig, MoEConfig, NormConfig
from blazr.detect.checkpoint import Shapes
from blazr.detect.llama import llama_attention
from blazr.detect.raw import Raw, activation, layer_indices, need
from blazr.detect.ssm_common import is_tied, require
from blazr.errors import CheckpointError

log = logging.getLogger("blazr.detect")

DENSE, MOE = "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"
PREFIX = "model."
_DEFAULT_TOP_K = 8


def _windows(raw: Raw, arch: str, num_layers: int) -> list[int | None]:
    """Each layer's sliding window (None: full attention)."""
    if not raw.get("use_sliding_window", False):
        return [None] * num_layers
    window = raw.int("sliding_window")
    if arch == MOE:
        return [window] * num_layers
    kinds = raw.get("layer_types")
    if isinstance(kinds, list):
        if len(kinds) != num_layers:
            raise CheckpointError(f"{raw.path}: layer_types lists {len(kinds)} layers, expected {num_layers}")
        return [window if k == "sliding_attention" else None for k in kinds]
    first = raw.int("max_window_layers", 28)
    return [window if i >= first else None for i in range(num_layers)]


def _ffn(raw: Raw, shapes: Shapes, p: str) -> dict[str, MLPConfig | MoEConfig]:
    """The feed-forward of the layer under `p` (`model.layers.i.`): the MoE where it holds a router."""
    act = activation(raw.get("hidden_act", "silu"))
    router = shapes.get(p + "mlp.gate.weight")
    if router is None:
        gate = shapes.get(p + "mlp.gate_proj.weight")
        size = need(
            raw.int("intermediate_size", gate[0] if gate else None),
            "intermediate_size",
            f"{p}mlp.gate_proj.weight is missing",
        )
        return {"mlp": MLPConfig(intermediate_size=size, activation=act)}
    expert = shapes.get(p + "mlp.experts.0.gate_proj.weight")
    fused = shapes.get(p + "mlp.experts.gate_up_proj")  # transformers' own names: [E, 2I, D]
    width = expert[0] if expert else (fused[1] // 2 if fused else None)
    top_k = raw.int("num_experts_per_tok")
    if top_k is None:
        top_k = min(_DEFAULT_TOP_K, router[0])
        log.warning("num_experts_per_tok is not in config.json (shapes cannot tell); assuming %d", top_k)
    norm_topk = raw.get("norm_topk_prob")
    if norm_topk is None:  # a config.json without it: transformers' False; none at all: every published True
        norm_topk = not raw.data
    moe = MoEConfig(
        num_experts=raw.int("num_experts", router[0]),
        top_k=top_k,
        expert=MLPConfig(
            intermediate_size=need(
                raw.int("moe_intermediate_size", width),
                "moe_intermediate_size",
                f"{p}mlp.experts.0.gate_proj.weight is missing",
            ),
            activation=act,
        ),
        scoring="softmax",
        is_renormalized=bool(norm_topk),
    )
    if moe.num_experts != router[0]:
        raise CheckpointError(
            f"tensor {p}mlp.gate.weight: expected {moe.num_experts} rows (num_experts), found {router[0]}"
        )
    return {"moe": moe}


def build_qwen3(raw: Raw, shapes: Shapes, arch: str) -> ModelConfig:
    vocab, hidden = require(shapes, PREFIX + "embed_tokens.weight")
    hidden = raw.int("hidden_size", hidden)
    prefix = PREFIX + "layers."
    num_layers = raw.int("num_hidden_layers", len(layer_indices(shapes, prefix)))
    if not num_layers:
        raise CheckpointError(f"no {prefix}N.* tensors found")
    max_pos = raw.int("max_position_embeddings", 32768)
    norm = NormConfig("rms", raw.float("rms_norm_eps", 1e-6))
    attn = f"{prefix}0.self_attn."
    attention = replace(llama_attention(raw, shapes, attn, hidden, max_pos), qk_norm=norm)
    q_norm = require(shapes, attn + "q_norm.weight")
    if q_norm[0] != attention.head_dim:
        raise CheckpointError(
            f"tensor {attn}q_norm.weight: expected [{attention.head_dim}] (one head), found {list(q_norm)}"
        )
    layers = tuple(
        LayerConfig(
            mixers=(replace(attention, sliding_window=window),),
            norm=norm,
            ffn_norm=norm,
            **_ffn(raw, shapes, f"{prefix}{i}."),
        )
        for i, window in enumerate(_windows(raw, arch, num_layers))
    )
    return ModelConfig(
        architecture=arch,
        vocab_size=raw.int("vocab_size", vocab),
        hidden_size=hidden,
        layers=layers,
        final_norm=norm,
        max_position_embeddings=max_pos,
        tie_word_embeddings=is_tied(raw, shapes),
    )


def _arch_of(shapes: Shapes) -> str | None:
    """Qwen3 or Qwen3-MoE by tensor names: a per-head q_norm in Llama's layout (not Qwen3-Next / Qwen3.5's
    DeltaNet layers, not OLMo's post-norm blocks), a router where a layer is sparse."""
    names = list(shapes)
    if not any(n.endswith(".self_attn.q_norm.weight") for n in names):
        return None
    if any(".linear_attn." in n or n.startswith("model.language_model.") for n in names):
        return None
    if not any(n.endswith(".input_layernorm.weight") for n in names):
        return None
    return MOE if any(n.endswith(".mlp.gate.weight") for n in names) else DENSE


BUILDERS = {arch: (lambda raw, shapes, a=arch: build_qwen3(raw, shapes, a)) for arch in (DENSE, MOE)}
MODEL_TYPES = {"qwen3": DENSE, "qwen3_moe": MOE}
NAME_RULES = [(lambda shapes, a=arch: _arch_of(shapes) == a, arch) for arch in (DENSE, MOE)]
