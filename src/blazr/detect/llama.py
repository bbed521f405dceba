"""Llama-family detection: Llama (incl. llama3 rope scaling, tied embeddings), Qwen2 (q/k/v bias),
Mistral (sliding window), from HF config keys (transformers v4 or v5 style) or tensor shapes alone."""

from __future__ import annotations

import logging
from collections.abc import Callable

from blazr.config import AttentionConfig, LayerConfig, MLPConfig, ModelConfig, NormConfig
from blazr.detect.checkpoint import Shapes
from blazr.detect.raw import (
    Raw,
    activation,
    guess_head_dim,
    layer_indices,
    need,
    rope_from_raw,
    shape_of,
)
from blazr.errors import CheckpointError

log = logging.getLogger("blazr.detect")


def llama_attention(
    raw: Raw, shapes: Shapes, attn: str, hidden: int, max_pos: int, window: int | None = None
) -> AttentionConfig:
    """The GQA attention under `attn` (`…layers.N.self_attn.`): heads from config.json, else from q_proj /
    k_proj rows (a per-head `q_norm` [Dh] gives the head size; else the common size that divides both,
    with a warning); rope from the config's keys; biases where the tensors hold them."""
    q = shape_of(shapes, attn + "q_proj.weight")
    k = shape_of(shapes, attn + "k_proj.weight")
    q_norm = shape_of(shapes, attn + "q_norm.weight")
    num_heads = raw.int("num_attention_heads")
    head_dim = raw.int("head_dim")
    if num_heads is None and head_dim is None and q_norm is not None and q is not None and q[0] != q_norm[0]:
        head_dim = q_norm[0]  # a per-head q/k norm (Qwen3) is one head wide
    if num_heads is None and head_dim is None:
        q_rows = need(q[0] if q else None, "num_attention_heads", f"{attn}q_proj.weight is missing")
        head_dim = guess_head_dim(q_rows, k[0] if k else None)
        log.warning(
            "num_attention_heads is not in config.json; assuming head_dim %d (%d heads)",
            head_dim,
            q_rows // head_dim,
        )
    if head_dim is None:
        head_dim = hidden // num_heads
    if num_heads is None:
        num_heads = (q[0] if q else hidden) // head_dim
    num_kv_heads = raw.int("num_key_value_heads", raw.int("num_kv_heads"))
    if num_kv_heads is None:
        num_kv_heads = k[0] // head_dim if k else num_heads
    has_bias = attn + "q_proj.bias" in shapes or bool(raw.get("attention_bias", False))
    rope = rope_from_raw(raw, int(head_dim * raw.float("partial_rotary_factor", 1.0)), max_pos)
    return AttentionConfig(
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rope=rope,
        softmax_scale=head_dim**-0.5,
        has_qkv_bias=has_bias,
        has_o_bias=attn + "o_proj.bias" in shapes,
        sliding_window=window,
    )


def llama_like(raw: Raw, shapes: Shapes, prefix: str, arch: str) -> ModelConfig:
    """Llama / Qwen2 / Mistral (HF `model.` prefix) and oxidizr GQA-only (no prefix)."""
    embed = shape_of(shapes, prefix + "embed_tokens.weight")
    if embed is None:
        raise CheckpointError(f"missing tensor {prefix}embed_tokens.weight")
    vocab, hidden = raw.int("vocab_size", embed[0]), raw.int("hidden_size", embed[1])
    indices = layer_indices(shapes, prefix + "layers.")
    num_layers = raw.int("num_hidden_layers", raw.int("num_layers", len(indices)))
    if num_layers == 0:
        raise CheckpointError(f"no {prefix}layers.N.* tensors found")
    gate = shape_of(shapes, f"{prefix}layers.0.mlp.gate_proj.weight")
    intermediate = need(
        raw.int("intermediate_size", gate[0] if gate else None),
        "intermediate_size",
        f"{prefix}layers.0.mlp.gate_proj.weight is missing",
    )
    max_pos = raw.int("max_position_embeddings", raw.int("max_seq_len", 4096))
    eps = raw.float("rms_norm_eps", 1e-5)
    window = raw.int("sliding_window") if arch == "MistralForCausalLM" else None
    if arch == "Qwen2ForCausalLM" and raw.get("use_sliding_window", False):
        window = raw.int("sliding_window")
    attention = llama_attention(raw, shapes, f"{prefix}layers.0.self_attn.", hidden, max_pos, window)
    mlp = MLPConfig(intermediate_size=intermediate, activation=activation(raw.get("hidden_act", "silu")))
    norm = NormConfig("rms", eps)
    layer = LayerConfig(mixers=(attention,), mlp=mlp, norm=norm, ffn_norm=norm)
    tied = raw.get("tie_word_embeddings")
    if tied is None:
        tied = "lm_head.weight" not in shapes
    return ModelConfig(
        architecture=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        layers=(layer,) * num_layers,
        final_norm=norm,
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(tied),
    )


BUILDERS: dict[str, Callable[[Raw, Shapes], ModelConfig]] = {
    "LlamaForCausalLM": lambda raw, shapes: llama_like(raw, shapes, "model.", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": lambda raw, shapes: llama_like(raw, shapes, "model.", "Qwen2ForCausalLM"),
    "MistralForCausalLM": lambda raw, shapes: llama_like(raw, shapes, "model.", "MistralForCausalLM"),
}
MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
# Qwen2 is the Llama layout with q/k/v biases (and no q/k norm: Qwen3 may have biases too); anything else
# with Llama names is Llama.
NAME_RULES = [
    (
        lambda shapes: (
            any(".self_attn.q_proj.bias" in n for n in shapes)
            and not any(".self_attn.q_norm." in n for n in shapes)
        ),
        "Qwen2ForCausalLM",
    )
]
