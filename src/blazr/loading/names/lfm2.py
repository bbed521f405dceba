"""Renames for HF `Lfm2ForCausalLM` / `Lfm2MoeForCausalLM`: the short conv under `conv.` (its leaves as
blazr's), attention under `self_attn.` with `out_proj` and the q / k norms `q_layernorm` / `k_layernorm`, the
SwiGLU `feed_forward.w1` (gate) / `w3` (up) / `w2` (down), norms `operator_norm` / `ffn_norm` and the final
`embedding_norm`; LFM2-MoE's router `feed_forward.gate`, its `expert_bias` (blazr's correction bias) and
per-expert `feed_forward.experts.N.w{1,3,2}` (or, as transformers holds them, fused 3-D `gate_up_proj` /
`down_proj`)."""

from __future__ import annotations

from blazr.config import ModelConfig
from blazr.loading.names import NameMap

L = r"layers\.(\d+)\."
M = r"model.layers.\1."
_W = {"gate": "w1", "up": "w3", "down": "w2"}


def lfm2_names(cfg: ModelConfig) -> NameMap:
    names = (
        NameMap()
        .add(r"embed_tokens\.weight", "model.embed_tokens.weight")
        .add(r"norm\.weight", "model.embedding_norm.weight")
        .add(r"lm_head\.weight", "lm_head.weight")
        .add(L + r"mixer_norm\.weight", M + "operator_norm.weight")
        .add(L + r"ffn_norm\.weight", M + "ffn_norm.weight")
        .add(L + r"conv\.(.+)", M + r"conv.\2")
        .add(L + r"attn\.o_proj\.(.+)", M + r"self_attn.out_proj.\2")
        .add(L + r"attn\.q_norm\.weight", M + "self_attn.q_layernorm.weight")
        .add(L + r"attn\.k_norm\.weight", M + "self_attn.k_layernorm.weight")
        .add(L + r"attn\.(.+)", M + r"self_attn.\2")
        .add(L + r"moe\.router\.weight", M + "feed_forward.gate.weight")
        .add(L + r"moe\.router\.correction_bias", M + "feed_forward.expert_bias")
        .add(L + r"moe\.experts\.(gate_up_proj|down_proj)", M + r"feed_forward.experts.\2")
    )
    for part, w in _W.items():
        names.add(L + rf"mlp\.{part}_proj\.weight", M + f"feed_forward.{w}.weight")
        names.add(
            L + rf"moe\.experts\.(\d+)\.{part}_proj\.weight", M + rf"feed_forward.experts.\2.{w}.weight"
        )
    return names


NAME_MAPS = {"Lfm2ForCausalLM": lfm2_names, "Lfm2MoeForCausalLM": lfm2_names}
