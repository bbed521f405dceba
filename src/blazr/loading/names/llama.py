"""Renames for the Llama family (HF Llama, Qwen2, Mistral, SmolLM3; GGUF llama after its HF renames)."""

from __future__ import annotations

from blazr.loading.names import NameMap


def llama_names(prefix: str = "model.") -> NameMap:
    """HF Llama / Qwen2 / Mistral names (also GGUF llama, whose names are first mapped to HF ones)."""
    return (
        NameMap()
        .add(r"embed_tokens\.weight", prefix + "embed_tokens.weight")
        .add(r"norm\.weight", prefix + "norm.weight")
        .add(r"lm_head\.weight", "lm_head.weight")
        .add(r"layers\.(\d+)\.mixer_norm\.weight", prefix + r"layers.\1.input_layernorm.weight")
        .add(r"layers\.(\d+)\.ffn_norm\.weight", prefix + r"layers.\1.post_attention_layernorm.weight")
        .add(r"layers\.(\d+)\.attn\.(.+)", prefix + r"layers.\1.self_attn.\2")
        .add(r"layers\.(\d+)\.mlp\.(.+)", prefix + r"layers.\1.mlp.\2")
    )


NAME_MAPS = {
    arch: (lambda cfg: llama_names())
    for arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM", "SmolLM3ForCausalLM")
}
