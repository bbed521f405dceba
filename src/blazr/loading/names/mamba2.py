"""Renames for HF `Mamba2ForCausalLM`: `backbone.` prefix, `embeddings` / `norm_f`, each block's norm beside
its `mixer` (whose parameter names blazr's `Mamba2` shares)."""

from __future__ import annotations

from blazr.config import ModelConfig
from blazr.loading.names import NameMap

L = r"layers\.(\d+)\."


def mamba2_names(cfg: ModelConfig) -> NameMap:
    return (
        NameMap()
        .add(r"embed_tokens\.weight", "backbone.embeddings.weight")
        .add(r"norm\.weight", "backbone.norm_f.weight")
        .add(r"lm_head\.weight", "lm_head.weight")
        .add(L + r"mixer_norm\.weight", r"backbone.layers.\1.norm.weight")
        .add(L + r"mamba\.(.+)", r"backbone.layers.\1.mixer.\2")
    )


NAME_MAPS = {"Mamba2ForCausalLM": mamba2_names}
