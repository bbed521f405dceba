"""Renames for HF `NemotronHForCausalLM`: `backbone.` prefix, `embeddings` / `norm_f`; every block has one
`norm` and one `mixer` — Mamba2, attention (q/k/v/o_proj), MLP (up/down_proj) or MoE (`gate.weight`,
`gate.e_score_correction_bias`, `experts.{e}.{up,down}_proj` per expert or stacked, `shared_experts.*`, a
latent MoE's `fc1_latent_proj` (blazr's `latent_down`) and `fc2_latent_proj` (`latent_up`)). A block without a
mixer in blazr (MLP / MoE) reads its norm as `ffn_norm`."""

from __future__ import annotations

from blazr.config import ModelConfig
from blazr.loading.names import NameMap

L = r"layers\.(\d+)\."
B = r"backbone.layers.\1."


def nemotron_h_names(cfg: ModelConfig) -> NameMap:
    return (
        NameMap()
        .add(r"embed_tokens\.weight", "backbone.embeddings.weight")
        .add(r"norm\.weight", "backbone.norm_f.weight")
        .add(r"lm_head\.weight", "lm_head.weight")
        .add(L + r"(?:mixer_norm|ffn_norm)\.weight", B + "norm.weight")
        .add(L + r"(?:mamba|attn|mlp)\.(.+)", B + r"mixer.\2")
        .add(L + r"moe\.router\.weight", B + "mixer.gate.weight")
        .add(L + r"moe\.router\.correction_bias", B + "mixer.gate.e_score_correction_bias")
        .add(L + r"moe\.experts\.(.+)", B + r"mixer.experts.\2")
        .add(L + r"moe\.shared\.(.+)", B + r"mixer.shared_experts.\2")
        .add(L + r"moe\.latent_down\.(.+)", B + r"mixer.fc1_latent_proj.\2")
        .add(L + r"moe\.latent_up\.(.+)", B + r"mixer.fc2_latent_proj.\2")
    )


NAME_MAPS = {"NemotronHForCausalLM": nemotron_h_names}
